//! The attention's kernels as CUDA C++, run on a CPU emulation of the CUDA they use
//! (`crate::cuda_emulation`, driver `kernels/cuda-emu/attention.cpp`) against an fp64
//! reference: the only check without a GPU of the tensor-core kernels and of the f32 kernels'
//! rows shared by shuffles. The attention kernels' CUDA C++ for NVRTC's check
//! (`scripts/cuda-source-check.sh`) comes from here too, through `crate::cuda_source`.

use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use burn::tensor::DType;
use cubecl::prelude::*;

use super::{block_rows, tensor_cores, Tiling, Variant};
use crate::cuda_emulation::{emulate_all, Emulation, STORAGES};
use crate::cuda_source::{cuda_cpp_in, settings, tensor, Client};
use tensor_cores::RowWork;

/// The tensor-core forward, `dQ` and `dK/dV` at `dtype` and head width `hd`: `grad_kv`, or
/// above hd 64 `grad_kv_values` and `grad_kv_keys` ([`KvGrads`]), compiled in `mode`
/// (`Unchecked` as they are launched). Each kernel is built as its launch builds it: settings,
/// client, one argument per tensor, `()` for the scale, then the comptime arguments.
#[rustfmt::skip]
pub(crate) fn tensor_core_kernels(client: &Client, dtype: DType, hd: usize, rows: RowWork, blocks: usize, stages: usize, mode: ExecutionMode) -> Vec<(&'static str, String)> {
    use tensor_cores::{forward_kernel, grad_kv_kernel, grad_q_kernel, KvGrads, PLANES};
    let (s, c, t) = (settings(CubeDim::new_2d(32, PLANES as u32)), client, tensor);
    let types = [dtype.into(), DType::F32.into()];
    let (forward, grad_q) = match rows {
        RowWork::Registers => {
            use tensor_cores::registers::{forward_kernel, grad_q_kernel};
            let forward = forward_kernel::ForwardKernel::new(
                s.clone(), c.clone(), t(), t(), t(), t(), t(), (), hd, PLANES, blocks, stages, types);
            let grad_q = grad_q_kernel::GradQKernel::new(
                s.clone(), c.clone(), t(), t(), t(), t(), t(), t(), t(), (), hd, PLANES, blocks, stages, types);
            (cuda_cpp_in(&forward, mode), cuda_cpp_in(&grad_q, mode))
        }
        RowWork::Bounce => {
            let forward = forward_kernel::ForwardKernel::new(
                s.clone(), c.clone(), t(), t(), t(), t(), t(), (), hd, PLANES, blocks, stages, types);
            let grad_q = grad_q_kernel::GradQKernel::new(
                s.clone(), c.clone(), t(), t(), t(), t(), t(), t(), t(), (), hd, PLANES, blocks, stages, types);
            (cuda_cpp_in(&forward, mode), cuda_cpp_in(&grad_q, mode))
        }
    };
    let grad_kv = |part| match rows {
        RowWork::Registers => cuda_cpp_in(&tensor_cores::registers::grad_kv_kernel::GradKvKernel::new(
            s.clone(), c.clone(), t(), t(), t(), t(), t(), t(), t(), t(), (), hd, PLANES, part, stages, types), mode),
        RowWork::Bounce => cuda_cpp_in(&grad_kv_kernel::GradKvKernel::new(
            s.clone(), c.clone(), t(), t(), t(), t(), t(), t(), t(), t(), (), hd, PLANES, part, stages, types), mode),
    };
    let mut kernels = vec![("forward", forward), ("grad_q", grad_q)];
    for &part in KvGrads::launches(hd) {
        let name = match part {
            KvGrads::Both => "grad_kv",
            KvGrads::Values => "grad_kv_values",
            KvGrads::Keys => "grad_kv_keys",
        };
        kernels.push((name, grad_kv(part)));
    }
    kernels
}

/// The f32-arithmetic forward, `dQ` and `dK/dV` at `dtype` and head width `hd`, laid out as
/// a launch of `variant` would lay them out ([`Tiling::of`]: units per row, loops unrolled),
/// compiled in `mode` (`Unchecked` as CUDA launches them), and the rows' `D` (checked).
#[rustfmt::skip]
pub(crate) fn unit_kernels(client: &Client, dtype: DType, hd: usize, variant: Variant, mode: ExecutionMode) -> [(&'static str, String); 4] {
    use super::{forward_kernel, grad_kv_kernel, grad_q_kernel};
    let (c, t) = (client, tensor);
    let types = [dtype.into(), DType::F32.into()];
    let tiling = |rows| Tiling::of(variant, rows, hd);
    let at = |rows| settings(tiling(rows).cube_dim());
    let forward = forward_kernel::ForwardKernel::new(
        at(2), c.clone(), t(), t(), t(), t(), t(), (), tiling(2), types);
    let grad_q = grad_q_kernel::GradQKernel::new(
        at(3), c.clone(), t(), t(), t(), t(), t(), t(), t(), (), tiling(3), types);
    let grad_kv = grad_kv_kernel::GradKvKernel::new(
        at(4), c.clone(), t(), t(), t(), t(), t(), t(), t(), t(), (), tiling(4), types);
    [("forward", cuda_cpp_in(&forward, mode)), ("grad_q", cuda_cpp_in(&grad_q, mode)), ("grad_kv", cuda_cpp_in(&grad_kv, mode)),
     ("delta", delta_kernel(client, dtype, hd, variant.unroll, ExecutionMode::Checked))]
}

/// `D = dO·O`, which both backward variants (the f32-arithmetic kernels and the tensor
/// cores') read, and `lse` in base 2 (the tensor cores' register kernels), at `dtype` and head
/// width `hd`, compiled in `mode` (`Checked` as it is launched).
#[rustfmt::skip]
pub(crate) fn delta_kernel(client: &Client, dtype: DType, hd: usize, unroll: bool, mode: ExecutionMode) -> String {
    let types = [dtype.into(), DType::F32.into()];
    let t = tensor;
    cuda_cpp_in(&super::delta_kernel::DeltaKernel::new(
        settings(CubeDim::new_1d(super::DELTA_UNITS)), client.clone(), t(), t(), t(), t(), t(), hd, unroll, types), mode)
}

/// The tensor-core forward, `dQ` and `dK/dV` as cubecl writes them for CUDA, run on the CPU
/// emulation against an fp64 reference at f16 and bf16 and head widths 16, 48 and 64, and bf16
/// at 96 and 128 (`dK` and `dV` launched apart), on one row, one tile, a partial tile and several
/// tiles with GQA groups of 1 to 3, contiguous and in the model's layout (heads swapped, read
/// and written at their strides), and with an attention sink, within the kernel tests'
/// tolerances (f16 4e-3, bf16 3e-2); and the bounce kernels the same at bf16 hd 64 and 128,
/// the register forward and `dQ` at bf16 hd 64 at one block of query rows a plane, and the
/// register kernels at bf16 hd 64 with one stage of tiles (the default two copy the next tile
/// by `cp.async`, which the emulation lands at the unit's next `sync_storage`, NaN until then).
/// Unwritten outputs are NaN and fail. The kernels are
/// compiled in cubecl's `Validate` mode, so an indexed access past the end of a tensor, which
/// their unchecked launch would not catch, fails too. (`Validate` does not check a `cp.async`
/// copy's source; the one-stage run reads the same rows with indexed loads.)
#[test]
fn tensor_core_kernels_match_fp64_on_the_cuda_emulation() {
    let client = &WgpuRuntime::client(&WgpuDevice::default());
    // A family's kernels at one storage type and width, on a grid of its query rows a cube.
    let emulation = |(suffix, storage, dtype), hd, rows: RowWork, blocks, stages| Emulation {
        kernels: tensor_core_kernels(
            client,
            dtype,
            hd,
            rows,
            blocks,
            stages,
            ExecutionMode::Validate,
        ),
        driver: "attention.cpp",
        storage,
        suffix,
        label: format!("hd {hd}"),
        defines: [
            format!("-DHEAD_DIM={hd}"),
            format!("-DQUERY_ROWS={}", 16 * tensor_cores::PLANES * blocks),
        ]
        .into_iter()
        // The register kernels read `lse` in base 2, as the `D` kernel writes it for them.
        .chain((rows == RowWork::Registers).then(|| "-DLSE_LOG2".into()))
        .collect(),
    };
    let registers = STORAGES.into_iter().flat_map(|storage| {
        // bf16 also at the 7B's and MedGemma's 128, where `dK` and `dV` take a launch each
        // and the accumulators go through the bounce rows in halves, and at 96, whose
        // bounce rows are whole and wider than a tile's 64 columns and whose tile rows are
        // not whole loader passes.
        let wide: &[usize] = if storage.2 == DType::BF16 {
            &[96, 128]
        } else {
            &[]
        };
        [16, 48, 64].iter().chain(wide).map(move |&hd| {
            let rows = RowWork::Registers;
            emulation(
                storage,
                hd,
                rows,
                rows.default_query_blocks(hd),
                rows.default_tile_stages(),
            )
        })
    });
    let bf16 = STORAGES[1];
    // The bounce kernels (`LAB_ATTENTION_ROWS=bounce`) at bf16 hd 64 (`dK/dV` in one walk)
    // and 128 (apart, accumulators through the bounce rows in halves); the register forward
    // and `dQ` at bf16 hd 64 at one block of query rows a plane
    // (`LAB_ATTENTION_QUERY_BLOCKS=1`), and the register kernels loading one tile at a time
    // (`LAB_ATTENTION_STAGES=1`).
    let others = [
        emulation(bf16, 64, RowWork::Bounce, 1, 1),
        emulation(bf16, 128, RowWork::Bounce, 1, 1),
        emulation(bf16, 64, RowWork::Registers, 1, 2),
        emulation(bf16, 64, RowWork::Registers, 2, 1),
    ];
    emulate_all(registers.chain(others).collect());
}

/// The f32-arithmetic forward, `dQ` and `dK/dV` as CUDA runs them by default: unrolled, rows
/// shared among 2 or 4 units that add their partial products by warp shuffles
/// ([`super::row_lanes`]; lavapipe, CI's GPU, has no shuffles for them). bf16 at head widths
/// 64 (1 unit a row in the forward, 2 in `dQ` and `dK/dV`) and 128 (2, 4, 4), and at 64 with
/// the loops rolled (`LAB_ATTENTION_UNROLL=0`) and with a unit a row and no shuffles
/// (`LAB_ATTENTION_SHUFFLE=0`); the cases and tolerances as above. The
/// emulation's shuffle waits for all 32 lanes of the warp, so one called from a branch that
/// some rows skip ends the run as a hang, as it is undefined on a GPU.
#[test]
fn unit_kernels_sharing_rows_match_fp64_on_the_cuda_emulation() {
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let mut emulations = Vec::new();
    // (head width, loops unrolled, rows shared by shuffles, the report's name)
    let variants = [
        (64, true, true, "unit-lanes"),
        (128, true, true, "unit-lanes"),
        (64, false, true, "unit-rolled"),
        (64, true, false, "unit-rows"),
    ];
    for (hd, unroll, shuffles, name) in variants {
        let (suffix, storage, dtype) = STORAGES[1];
        let variant = Variant {
            unroll,
            tensor_cores: false,
            shuffles,
        };
        let block = block_rows(hd);
        let cube = |rows| {
            let d = Tiling::of(variant, rows, hd).cube_dim();
            format!("{},{},{}", d.x, d.y, d.z)
        };
        emulations.push(Emulation {
            driver: "attention.cpp",
            kernels: unit_kernels(&client, dtype, hd, variant, ExecutionMode::Validate)[..3]
                .to_vec(),
            storage,
            suffix,
            label: format!("hd {hd}"),
            defines: vec![
                format!("-DHEAD_DIM={hd}"),
                format!("-DKERNELS={name}"),
                format!("-DROWS={block}"),
                format!("-DFORWARD_CUBE={}", cube(2)),
                format!("-DGRAD_Q_CUBE={}", cube(3)),
                format!("-DGRAD_KV_CUBE={}", cube(4)),
            ],
        });
    }
    emulate_all(emulations);
}
