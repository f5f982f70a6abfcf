//! The attention's kernels as CUDA C++, run on a CPU emulation of the CUDA they use
//! (`kernels/cuda-emu`: threads, barriers, warp shuffles, wmma tiles, a shared-memory race
//! detector) against an fp64 reference, built with the host's C++ compiler (`$CXX`, default
//! `c++`): the only check without a GPU of the tensor-core kernels and of the f32 kernels'
//! rows shared by shuffles. The attention kernels' CUDA C++ for NVRTC's check
//! (`scripts/cuda-source-check.sh`) comes from here too, through `crate::cuda_source`.

use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use burn::tensor::DType;
use cubecl::prelude::*;

use super::{block_rows, tensor_cores, Tiling, Variant};
use crate::cuda_source::{cuda_cpp, cuda_cpp_in, settings, tensor, Client};
use std::path::{Path, PathBuf};
use std::process::Command;
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
    use super::{delta_kernel, forward_kernel, grad_kv_kernel, grad_q_kernel};
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
    // `D = dO·O`, which both backward variants (these and the tensor cores') read, and `lse`
    // in base 2 (the tensor cores' register kernels).
    let delta = delta_kernel::DeltaKernel::new(
        settings(CubeDim::new_1d(64)), c.clone(), t(), t(), t(), t(), t(), hd, variant.unroll, types);
    [("forward", cuda_cpp_in(&forward, mode)), ("grad_q", cuda_cpp_in(&grad_q, mode)), ("grad_kv", cuda_cpp_in(&grad_kv, mode)), ("delta", cuda_cpp(&delta))]
}

/// The emulation's sources: `include/emu.h` (CUDA on threads) and the attention driver.
fn emulation_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda-emu")
}

/// `cpp` as the driver includes it: its `info_st` and its entry named after `kernel`
/// (`info_grad_q`, `grad_q_kernel`: the kernels share one translation unit, and the two
/// `dK/dV` launches of wide heads are one kernel), and its shared arrays as the emulation's
/// (`emu::Shared`, whose writes other threads see only after a barrier) at the same offsets.
fn for_emulation(cpp: &str, kernel: &str) -> String {
    let info = format!("info_{kernel}");
    let lines = without_register_products(cpp)
        .into_iter()
        .filter(|line| !line.starts_with("extern __shared__"))
        .map(|line| {
            shared_array(line)
                .or_else(|| entry_renamed(line, kernel))
                .or_else(|| shared_recast(line))
                .unwrap_or_else(|| line.replace("info_st", &info))
        });
    vector_types_once(lines).join("\n")
}

/// `cpp`'s lines less cubecl's inline-PTX definitions of `ldmatrix` and `mma.sync`
/// (`inline __device__ void` on the line before `__ldmatrix_…(` or `__mma_m16n8k…(`, to the
/// line `}`): the emulation defines them (include/emu.h).
fn without_register_products(cpp: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut in_definition = false;
    for line in cpp.lines() {
        if in_definition {
            in_definition = line.trim() != "}";
            continue;
        }
        let defines = line.starts_with("__ldmatrix_") || line.starts_with("__mma_m16n8k");
        if defines && line.ends_with('{') && out.last() == Some(&"inline __device__ void") {
            out.pop();
            in_definition = true;
            continue;
        }
        out.push(line);
    }
    out
}

/// The vector types cubecl defines in every kernel's source (`struct __align__(16)
/// __nv_bfloat16_8 {` to `};`) guarded, so that the kernels can share the driver's translation
/// unit.
fn vector_types_once(lines: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_type = false;
    for line in lines {
        if let Some(name) = line
            .strip_prefix("struct __align__(")
            .and_then(|rest| rest.split_once(") "))
            .and_then(|(_, rest)| rest.strip_suffix(" {"))
        {
            out.push(format!("#ifndef LAB_EMU_{name}\n#define LAB_EMU_{name}"));
            in_type = true;
        }
        let ends_type = in_type && line == "};";
        out.push(line);
        if ends_type {
            out.push("#endif".into());
            in_type = false;
        }
    }
    out
}

/// ` T *_tmp_N = reinterpret_cast< T*>(shared_memory_M);` (a vector access to a shared array)
/// as `emu::Shared<T> _tmp_N = emu::recast<T>(shared_memory_M);`; `None` for any other line.
fn shared_recast(line: &str) -> Option<String> {
    let (ty, rest) = line.trim_start().split_once(" *_tmp_")?;
    let (number, rest) = rest.split_once(" = reinterpret_cast<")?;
    let array = rest.split_once(">(shared_memory_")?.1.strip_suffix(");")?;
    Some(format!(
        "emu::Shared<{ty}> _tmp_{number} = emu::recast<{ty}>(shared_memory_{array});"
    ))
}

/// The entry's first line, `extern "C" __global__ void … NAME (`, with `NAME` (what follows
/// the last `)` or space before ` (`) as `{kernel}_kernel`; `None` for any other line. (A line
/// in another shape leaves the name, and the driver's build fails on the missing entry.)
fn entry_renamed(line: &str, kernel: &str) -> Option<String> {
    if !line.starts_with("extern \"C\" __global__") {
        return None;
    }
    let head = line.strip_suffix(" (")?;
    let name_at = head.rfind([')', ' '])? + 1;
    Some(format!("{}{kernel}_kernel (", &head[..name_at]))
}

/// `T *shared_memory_N = reinterpret_cast<T*>(&dynamic_shared_mem[OFFSET]);` as
/// `emu::Shared<T> shared_memory_N{OFFSET};`; `None` for any other line.
fn shared_array(line: &str) -> Option<String> {
    let (ty, rest) = line.split_once(" *shared_memory_")?;
    let (number, rest) = rest.split_once(" = reinterpret_cast<")?;
    let offset = rest
        .split_once("&dynamic_shared_mem[")?
        .1
        .split_once(']')?
        .0;
    Some(format!(
        "emu::Shared<{ty}> shared_memory_{number}{{{offset}}};"
    ))
}

/// One build of the driver: a set of kernels (`kernels`, as [`tensor_core_kernels`] or
/// [`unit_kernels`] write them) at one storage type and head width, in a folder of its own.
struct Emulation {
    kernels: Vec<(&'static str, String)>,
    storage: &'static str,
    suffix: &'static str,
    hd: usize,
    /// How the driver launches them, as `-D` definitions (none: the tensor cores' cubes).
    defines: Vec<String>,
}

/// Seconds an emulation may run before it counts as hung: a hang is a bug, slowness is not,
/// so this is far above the slowest seen (a few minutes on CI's 2 cores, beside the other
/// lavapipe test runs; one OS thread per CUDA thread is slow when the cores are shared).
const EMULATION_LIMIT_S: u32 = 1200;

/// The storage types the kernels are emulated at: (suffix, C++ type, dtype).
const STORAGES: [(&str, &str, DType); 2] = [
    ("f16", "__half", DType::F16),
    ("bf16", "__nv_bfloat16", DType::BF16),
];

impl Emulation {
    /// Writes the kernels into `dir`, builds the driver there and runs it; its output.
    fn run(&self, dir: &Path) -> String {
        std::fs::create_dir_all(dir).expect("a temporary folder");
        for (kernel, cpp) in &self.kernels {
            std::fs::write(dir.join(format!("{kernel}.cu")), for_emulation(cpp, kernel))
                .expect("a temporary file");
        }
        let (suffix, hd) = (self.suffix, self.hd);
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let emu = emulation_dir();
        let binary = dir.join("attention");
        let built = Command::new(&cxx)
            .args(["-std=c++20", "-O1", "-w", "-pthread"])
            .arg(format!("-I{}", emu.join("include").display()))
            .arg(format!("-I{}", dir.display()))
            .args([
                format!("-DSTORAGE={}", self.storage),
                format!("-DSUFFIX={suffix}"),
            ])
            .arg(format!("-DHEAD_DIM={hd}"))
            .args(&self.defines)
            .arg(emu.join("attention.cpp"))
            .arg("-o")
            .arg(&binary)
            .output()
            .unwrap_or_else(|e| panic!("{cxx}: {e} (a C++20 compiler is needed; set CXX)"));
        assert!(
            built.status.success(),
            "{cxx} failed on the {suffix} hd {hd} emulation:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        // A shuffle or barrier that some thread never reaches hangs the emulation: coreutils'
        // `timeout` turns that into a failure (exit 124) instead of a stuck test run.
        let run = Command::new("timeout")
            .arg(EMULATION_LIMIT_S.to_string())
            .arg(&binary)
            .output()
            .expect("the emulation runs (under coreutils' timeout)");
        let report = String::from_utf8_lossy(&run.stdout).into_owned();
        assert!(
            run.status.code() != Some(124),
            "{suffix} hd {hd}: the emulation hung for {EMULATION_LIMIT_S} s: a warp shuffle or \
             barrier that not every thread reaches (called in a branch that differs between \
             rows?):\n{report}"
        );
        assert!(
            run.status.success(),
            "{suffix} hd {hd}: off the fp64 reference or a shared-memory race:\n{report}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        // Kernels compiled in `Validate` mode print each access past the end of a tensor
        // (cubecl's `[VALIDATION kernel]: Encountered OOB …`), which `launch_unchecked`
        // would not catch.
        assert!(
            !report.contains("Encountered OOB"),
            "{suffix} hd {hd}: an access out of bounds:\n{report}"
        );
        report
    }
}

/// Runs every emulation, one thread apiece (each a C++ build and run of ~15 s, so that they
/// use every core), and prints their reports.
fn emulate_all(emulations: Vec<Emulation>) {
    let root = std::env::temp_dir().join(format!(
        "lab-cuda-emu-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let reports: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = emulations
            .iter()
            .enumerate()
            .map(|(n, e)| {
                let dir = root.join(format!("{n}-{}-hd{}", e.suffix, e.hd));
                s.spawn(move || e.run(&dir))
            })
            .collect();
        runs.into_iter()
            .map(|run| {
                run.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    for report in reports {
        print!("{report}");
    }
    std::fs::remove_dir_all(&root).ok();
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
        storage,
        suffix,
        hd,
        defines: [format!(
            "-DQUERY_ROWS={}",
            16 * tensor_cores::PLANES * blocks
        )]
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
/// the loops rolled (`LAB_ATTENTION_UNROLL=0`); the cases and tolerances as above, less the
/// two largest and the sink (`FEWER_CASES`: each shuffle is a barrier of the emulated warp).
/// The emulation's shuffle waits for all 32 lanes of the warp, so one called from a branch
/// that some rows skip hangs here, as it is undefined on a GPU.
#[test]
fn unit_kernels_sharing_rows_match_fp64_on_the_cuda_emulation() {
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let mut emulations = Vec::new();
    for (hd, unroll) in [(64, true), (128, true), (64, false)] {
        let (suffix, storage, dtype) = STORAGES[1];
        let variant = Variant {
            unroll,
            tensor_cores: false,
            shuffles: true,
        };
        let block = block_rows(hd);
        let cube = |rows| {
            let d = Tiling::of(variant, rows, hd).cube_dim();
            format!("{},{},{}", d.x, d.y, d.z)
        };
        emulations.push(Emulation {
            kernels: unit_kernels(&client, dtype, hd, variant, ExecutionMode::Validate)[..3]
                .to_vec(),
            storage,
            suffix,
            hd,
            defines: vec![
                format!("-DKERNELS=unit-{}", if unroll { "lanes" } else { "rolled" }),
                "-DFEWER_CASES".into(),
                format!("-DROWS={block}"),
                format!("-DFORWARD_CUBE={}", cube(2)),
                format!("-DGRAD_Q_CUBE={}", cube(3)),
                format!("-DGRAD_KV_CUBE={}", cube(4)),
            ],
        });
    }
    emulate_all(emulations);
}
