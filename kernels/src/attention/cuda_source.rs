//! The attention kernels (and, for NVRTC's check only, RMSNorm's) as CUDA C++, written on a
//! machine without a GPU:
//! - run on a CPU emulation of the CUDA they use (`kernels/cuda-emu`: threads, barriers, warp
//!   shuffles, wmma tiles, a shared-memory race detector) against an fp64 reference, built
//!   with the host's C++ compiler (`$CXX`, default `c++`), here in the tests: the tensor-core
//!   kernels' only check without a GPU;
//! - compiled by NVRTC, with `ptxas -v`'s registers and spills, by
//!   `scripts/cuda-source-check.sh` through [`writes_the_cuda_sources`].
//!
//! Each kernel is defined as a launch would define it, through a wgpu client (lavapipe), and
//! compiled by cubecl's CUDA C++ compiler, as `cubecl-cuda` does before it calls NVRTC. The
//! definition sees wgpu's device properties, not a CUDA device's; the kernels here do not
//! branch on them.

use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use burn::tensor::DType;
use cubecl::prelude::*;
use cubecl::Compiler as _;
use cubecl_cpp::cuda::{mma::CudaWmmaCompiler, CudaDialect};
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};

use super::{block_rows, tensor_cores, unrolled_rows};
use std::path::{Path, PathBuf};
use std::process::Command;

type Client = ComputeClient<WgpuRuntime>;

/// A kernel's CUDA C++, as `cubecl-cuda` hands it to NVRTC on an A100 or H100 with CUDA 13
/// (32-bit indices, checked mode, the options below).
fn cuda_cpp(kernel: &impl CubeKernel) -> String {
    let address =
        cubecl::ir::StorageType::Scalar(cubecl::ir::ElemType::UInt(cubecl::ir::UIntKind::U32));
    CppCompiler::<CudaDialect<CudaWmmaCompiler>>::default()
        .compile(
            kernel.define(),
            &compilation_options(),
            ExecutionMode::Checked,
            address,
        )
        .expect("cubecl's CUDA compiler rejected a kernel")
        .to_string()
}

/// What `cubecl-cuda` (runtime.rs) sets for sm_80 and newer with CUDA ≥ 12.8: the kernel's
/// info as a `__grid_constant__` argument, fast math. (sm_90 adds clusters and `elect_sync`,
/// which these kernels do not use.)
fn compilation_options() -> CompilationOptions {
    CompilationOptions {
        warp_size: 32,
        supports_features: CppSupportedFeatures {
            grid_constants: true,
            fast_math: true,
            fast_tanh: true,
            ..Default::default()
        },
    }
}

/// A tensor argument, as a launch registers one that is not written in place.
fn tensor() -> TensorCompilationArg {
    TensorCompilationArg { inplace: None }
}

fn settings(cube_dim: CubeDim) -> KernelSettings {
    KernelSettings::default().cube_dim(cube_dim)
}

/// The tensor-core forward, `dQ` and `dK/dV` at `dtype` and head width `hd`. Each kernel is
/// built as its launch builds it: settings, client, one argument per tensor, `()` for the
/// scale, then the comptime arguments.
#[rustfmt::skip]
fn tensor_core_kernels(client: &Client, dtype: DType, hd: usize) -> [(&'static str, String); 3] {
    use tensor_cores::{forward_kernel, grad_kv_kernel, grad_q_kernel, PLANES};
    let (s, c, t) = (settings(CubeDim::new_2d(32, PLANES as u32)), client, tensor);
    let types = [dtype.into(), DType::F32.into()];
    let forward = forward_kernel::ForwardKernel::new(
        s.clone(), c.clone(), t(), t(), t(), t(), t(), (), hd, PLANES, types);
    let grad_q = grad_q_kernel::GradQKernel::new(
        s.clone(), c.clone(), t(), t(), t(), t(), t(), t(), t(), (), hd, PLANES, types);
    let grad_kv = grad_kv_kernel::GradKvKernel::new(
        s, c.clone(), t(), t(), t(), t(), t(), t(), t(), t(), (), hd, PLANES, types);
    [("forward", cuda_cpp(&forward)), ("grad_q", cuda_cpp(&grad_q)), ("grad_kv", cuda_cpp(&grad_kv))]
}

/// The f32-arithmetic forward, `dQ` and `dK/dV` at `dtype` and head width `hd`, with the
/// loops `unroll`ed as a launch would ([`unrolled_rows`]).
#[rustfmt::skip]
fn unit_kernels(client: &Client, dtype: DType, hd: usize, unroll: bool) -> [(&'static str, String); 3] {
    use super::{forward_kernel, grad_kv_kernel, grad_q_kernel};
    let block = block_rows(hd);
    let (s, c, t) = (settings(CubeDim::new_1d(block as u32)), client, tensor);
    let types = [dtype.into(), DType::F32.into()];
    let unrolled = |rows| unrolled_rows(unroll, rows, hd);
    let forward = forward_kernel::ForwardKernel::new(
        s.clone(), c.clone(), t(), t(), t(), t(), t(), (), hd, block, unrolled(2), types);
    let grad_q = grad_q_kernel::GradQKernel::new(
        s.clone(), c.clone(), t(), t(), t(), t(), t(), t(), t(), (), hd, block, unrolled(3), types);
    let grad_kv = grad_kv_kernel::GradKvKernel::new(
        s, c.clone(), t(), t(), t(), t(), t(), t(), t(), t(), (), hd, block, unrolled(4), types);
    [("forward", cuda_cpp(&forward)), ("grad_q", cuda_cpp(&grad_q)), ("grad_kv", cuda_cpp(&grad_kv))]
}

/// RMSNorm's kernels as bf16 training runs them (`x` and the gain f32, `y` and `dy` bf16) at
/// `d` columns: the backward keeps `d / 128` column sums a unit in registers.
#[rustfmt::skip]
fn rms_norm_kernels(client: &Client, d: usize) -> [(&'static str, String); 3] {
    use crate::rms_norm::{
        backward_blocks_kernel, forward_kernel, gain_sums_kernel, ROW_UNITS, SUM_COLUMNS, SUM_LANES,
    };
    let (c, t) = (client, tensor);
    let rows = settings(CubeDim::new_1d(ROW_UNITS as u32));
    let types = [DType::F32.into(), DType::BF16.into(), DType::F32.into()];
    let forward = forward_kernel::ForwardKernel::new(
        rows.clone(), c.clone(), t(), t(), t(), (), (), ROW_UNITS, types);
    let blocks = backward_blocks_kernel::BackwardBlocksKernel::new(
        rows, c.clone(), t(), t(), t(), t(), t(), (), (), (), ROW_UNITS, d.div_ceil(ROW_UNITS),
        types);
    let lanes = settings(CubeDim::new_2d(SUM_COLUMNS as u32, SUM_LANES as u32));
    let sums = gain_sums_kernel::GainSumsKernel::new(
        lanes, c.clone(), t(), t(), SUM_COLUMNS, SUM_LANES, [DType::F32.into(), DType::F32.into()]);
    [("forward", cuda_cpp(&forward)), ("backward_blocks", cuda_cpp(&blocks)), ("gain_sums", cuda_cpp(&sums))]
}

/// Writes `NAME.cu` files into `LAB_CUDA_SOURCE_DIR`: the tensor-core kernels at f16 and
/// bf16, head widths 16, 48 and 64, the f32-arithmetic kernels at bf16 and x1-50m's head
/// width 64, rolled and unrolled, and RMSNorm's at x1-50m's width (768), the 7B's (4096)
/// and MedGemma-27B's (5376).
#[test]
#[ignore = "writes files for scripts/cuda-source-check.sh"]
fn writes_the_cuda_sources() {
    let dir = std::env::var("LAB_CUDA_SOURCE_DIR")
        .expect("LAB_CUDA_SOURCE_DIR: set it to the folder for the .cu files");
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let mut sources = Vec::new();
    for (name, dtype) in [("f16", DType::F16), ("bf16", DType::BF16)] {
        for hd in [16, 48, 64] {
            for (kernel, cpp) in tensor_core_kernels(&client, dtype, hd) {
                sources.push((format!("mma-{kernel}-{name}-hd{hd}"), cpp));
            }
        }
    }
    for (variant, unroll) in [("rolled", false), ("unrolled", true)] {
        for (kernel, cpp) in unit_kernels(&client, DType::BF16, 64, unroll) {
            sources.push((format!("unit-{kernel}-bf16-hd64-{variant}"), cpp));
        }
    }
    for d in [768, 4096, 5376] {
        for (kernel, cpp) in rms_norm_kernels(&client, d) {
            sources.push((format!("rmsnorm-{kernel}-bf16-d{d}"), cpp));
        }
    }
    for (name, cpp) in &sources {
        assert!(
            cpp.contains("extern \"C\" __global__"),
            "{name}: no kernel entry in {cpp}"
        );
        std::fs::write(format!("{dir}/{name}.cu"), cpp).expect("LAB_CUDA_SOURCE_DIR: writable");
    }
}

/// The emulation's sources: `include/emu.h` (CUDA on threads) and the attention driver.
fn emulation_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda-emu")
}

/// `cpp` as the driver includes it: its `info_st` named after `kernel` (three kernels share
/// one translation unit), and its shared arrays as the emulation's (`emu::Shared`, whose
/// writes other threads see only after a barrier) at the same offsets.
fn for_emulation(cpp: &str, kernel: &str) -> String {
    let info = format!("info_{kernel}");
    cpp.lines()
        .filter(|line| !line.starts_with("extern __shared__"))
        .map(|line| shared_array(line).unwrap_or_else(|| line.replace("info_st", &info)))
        .collect::<Vec<_>>()
        .join("\n")
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

/// Builds and runs the driver for one storage type and head width in `dir`; its output.
fn emulate(dir: &Path, storage: &str, suffix: &str, hd: usize) -> String {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let emu = emulation_dir();
    let binary = dir.join("attention");
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-w", "-pthread"])
        .arg(format!("-I{}", emu.join("include").display()))
        .arg(format!("-I{}", dir.display()))
        .args([format!("-DSTORAGE={storage}"), format!("-DSUFFIX={suffix}")])
        .arg(format!("-DHEAD_DIM={hd}"))
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
    let run = Command::new(&binary).output().expect("the emulation runs");
    let report = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{suffix} hd {hd}: off the fp64 reference or a shared-memory race:\n{report}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    report
}

/// The tensor-core forward, `dQ` and `dK/dV` as cubecl writes them for CUDA, run on the CPU
/// emulation against an fp64 reference at f16 and bf16 and head widths 16, 48 and 64, on one
/// row, one tile, a partial tile and several tiles with GQA groups of 1 to 3, contiguous and in
/// the model's layout (heads swapped, read and written at their strides), within the kernel
/// tests' tolerances (f16 4e-3, bf16 3e-2). Unwritten outputs are NaN and fail.
#[test]
fn tensor_core_kernels_match_fp64_on_the_cuda_emulation() {
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let root = std::env::temp_dir().join(format!("lab-cuda-emu-{}", std::process::id()));
    let mut drivers = Vec::new();
    for (suffix, storage, dtype) in [
        ("f16", "__half", DType::F16),
        ("bf16", "__nv_bfloat16", DType::BF16),
    ] {
        for hd in [16, 48, 64] {
            let dir = root.join(format!("{suffix}-hd{hd}"));
            std::fs::create_dir_all(&dir).expect("a temporary folder");
            for (kernel, cpp) in tensor_core_kernels(&client, dtype, hd) {
                std::fs::write(
                    dir.join(format!("{kernel}.cu")),
                    for_emulation(&cpp, kernel),
                )
                .expect("a temporary file");
            }
            drivers.push((dir, storage, suffix, hd));
        }
    }
    // Six C++ builds and runs of ~15 s each: one thread apiece, so that they use every core.
    let reports: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = drivers
            .iter()
            .map(|(dir, storage, suffix, hd)| s.spawn(move || emulate(dir, storage, suffix, *hd)))
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
