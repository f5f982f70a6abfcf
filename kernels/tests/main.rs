//! The kernels' tests as one binary, each file a module: the backends' generic code is compiled and
//! linked once instead of once per file (on 2 cores that was most of CI's time).

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod accumulate;
mod adamw;
mod attention;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod common;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod embedding;
mod gemm;
mod join;
mod lm_head;
mod rms_norm;
mod rope;
mod square_sums;
mod swiglu;
