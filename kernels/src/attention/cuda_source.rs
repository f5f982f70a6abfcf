//! The attention kernels as CUDA C++, written on a machine without a GPU, so that NVRTC can
//! compile them and `ptxas -v` report their registers and spills before a GPU host runs
//! them. `scripts/cuda-source-check.sh` runs this and compiles what it writes.
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
use cubecl_cpp::shared::{CompilationOptions, CppCompiler};

use super::{block_rows, tensor_cores, unrolled_rows};

type Client = ComputeClient<WgpuRuntime>;

/// A kernel's CUDA C++, as `cubecl-cuda` hands it to NVRTC (32-bit indices, checked mode).
fn cuda_cpp(kernel: &impl CubeKernel) -> String {
    let address =
        cubecl::ir::StorageType::Scalar(cubecl::ir::ElemType::UInt(cubecl::ir::UIntKind::U32));
    CppCompiler::<CudaDialect<CudaWmmaCompiler>>::default()
        .compile(
            kernel.define(),
            &CompilationOptions::default(),
            ExecutionMode::Checked,
            address,
        )
        .expect("cubecl's CUDA compiler rejected an attention kernel")
        .to_string()
}

/// A tensor argument, as a launch registers one that is not written in place.
fn tensor() -> TensorCompilationArg {
    TensorCompilationArg { inplace: None }
}

fn settings(cube_dim: CubeDim) -> KernelSettings {
    KernelSettings::default().cube_dim(cube_dim)
}

/// The tensor-core forward, `dQ` and `dK/dV` at `dtype` and head width `hd`.
fn tensor_core_kernels(client: &Client, dtype: DType, hd: usize) -> [(&'static str, String); 3] {
    use tensor_cores::{forward_kernel, grad_kv_kernel, grad_q_kernel, PLANES};
    let (c, s, t) = (
        client.clone(),
        settings(CubeDim::new_2d(32, PLANES as u32)),
        tensor,
    );
    let types = [dtype.into(), DType::F32.into()];
    let forward = forward_kernel::ForwardKernel::new(
        s.clone(),
        c.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        (),
        hd,
        PLANES,
        types,
    );
    let grad_q = grad_q_kernel::GradQKernel::new(
        s.clone(),
        c.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        (),
        hd,
        PLANES,
        types,
    );
    let grad_kv = grad_kv_kernel::GradKvKernel::new(
        s,
        c,
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        (),
        hd,
        PLANES,
        types,
    );
    [
        ("forward", cuda_cpp(&forward)),
        ("grad_q", cuda_cpp(&grad_q)),
        ("grad_kv", cuda_cpp(&grad_kv)),
    ]
}

/// The f32-arithmetic forward, `dQ` and `dK/dV` at `dtype` and head width `hd`, with the
/// loops `unroll`ed as a launch would ([`unrolled_rows`]).
fn unit_kernels(
    client: &Client,
    dtype: DType,
    hd: usize,
    unroll: bool,
) -> [(&'static str, String); 3] {
    use super::{forward_kernel, grad_kv_kernel, grad_q_kernel};
    let block = block_rows(hd);
    let (c, s, t) = (
        client.clone(),
        settings(CubeDim::new_1d(block as u32)),
        tensor,
    );
    let types = [dtype.into(), DType::F32.into()];
    let unrolled = |rows| unrolled_rows(unroll, rows, hd);
    let forward = forward_kernel::ForwardKernel::new(
        s.clone(),
        c.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        (),
        hd,
        block,
        unrolled(2),
        types,
    );
    let grad_q = grad_q_kernel::GradQKernel::new(
        s.clone(),
        c.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        (),
        hd,
        block,
        unrolled(3),
        types,
    );
    let grad_kv = grad_kv_kernel::GradKvKernel::new(
        s,
        c,
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        (),
        hd,
        block,
        unrolled(4),
        types,
    );
    [
        ("forward", cuda_cpp(&forward)),
        ("grad_q", cuda_cpp(&grad_q)),
        ("grad_kv", cuda_cpp(&grad_kv)),
    ]
}

/// Writes `NAME.cu` files into `LAB_CUDA_SOURCE_DIR`: the tensor-core kernels at f16 and
/// bf16, head widths 16, 48 and 64, and the f32-arithmetic kernels at bf16 and x1-50m's head
/// width 64, rolled and unrolled.
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
    for (name, cpp) in &sources {
        assert!(
            cpp.contains("extern \"C\" __global__"),
            "{name}: no kernel entry in {cpp}"
        );
        std::fs::write(format!("{dir}/{name}.cu"), cpp).expect("LAB_CUDA_SOURCE_DIR: writable");
    }
}
