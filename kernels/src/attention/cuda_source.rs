//! The attention's tensor-core kernels as CUDA C++, run on a CPU emulation of the CUDA they
//! use (`kernels/cuda-emu`: threads, barriers, warp shuffles, wmma tiles, a shared-memory race
//! detector) against an fp64 reference, built with the host's C++ compiler (`$CXX`, default
//! `c++`): the tensor-core kernels' only check without a GPU. The attention kernels' CUDA C++
//! for NVRTC's check (`scripts/cuda-source-check.sh`) comes from here too, through
//! `crate::cuda_source`.

use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use burn::tensor::DType;
use cubecl::prelude::*;

use super::{block_rows, tensor_cores, unrolled_rows};
use crate::cuda_source::{cuda_cpp, settings, tensor, Client};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The tensor-core forward, `dQ` and `dK/dV` at `dtype` and head width `hd`. Each kernel is
/// built as its launch builds it: settings, client, one argument per tensor, `()` for the
/// scale, then the comptime arguments.
#[rustfmt::skip]
pub(crate) fn tensor_core_kernels(client: &Client, dtype: DType, hd: usize) -> [(&'static str, String); 3] {
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
/// loops `unroll`ed as a launch would ([`unrolled_rows`]), and the rows' `D`.
#[rustfmt::skip]
pub(crate) fn unit_kernels(client: &Client, dtype: DType, hd: usize, unroll: bool) -> [(&'static str, String); 4] {
    use super::{delta_kernel, forward_kernel, grad_kv_kernel, grad_q_kernel};
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
    // `D = dO·O`, which both backward variants (these and the tensor cores') read.
    let delta = delta_kernel::DeltaKernel::new(
        settings(CubeDim::new_1d(64)), c.clone(), t(), t(), t(), hd, unroll, types);
    [("forward", cuda_cpp(&forward)), ("grad_q", cuda_cpp(&grad_q)), ("grad_kv", cuda_cpp(&grad_kv)), ("delta", cuda_cpp(&delta))]
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
