//! lab-kernels: cubecl GPU kernels for lab's fused ops.
//!
//! The same `#[cube]` source compiles for CUDA (NVRTC) and for wgpu (WGSL, SPIR-V), so the
//! kernels' correctness is tested in CI on Mesa's software Vulkan device (lavapipe) and only
//! their speed and bf16 need a GPU. Everything here sits behind the `cube` feature (turned on
//! by `wgpu` or `cuda`): the default CPU build compiles none of it.
//!
//! Today: causal GQA flash attention, forward and backward ([`attention`]), the row-wise halves of
//! the fused LM-head cross-entropy ([`lm_head`]), RoPE in one pass ([`rope`]; its backward may add
//! into the joined q|k|v product's gradient), RMSNorm forward and backward ([`rms_norm`]), SwiGLU's
//! gating on the fused gate and up projections, forward and backward ([`swiglu`]), two or three
//! matrices side by side in one launch ([`join`]), a gradient added into a view of a wider one
//! ([`accumulate`]), the embedding's backward ([`embedding`]), one AdamW update of a parameter in
//! one pass ([`adamw`]), the sum of squares of many tensors under the gradient norm
//! ([`square_sums`]); and matrix products on the vendor's BLAS where the runtime has one (cuBLASLt
//! on CUDA, [`gemm`]).

#[cfg(feature = "cube")]
pub mod accumulate;
#[cfg(feature = "cube")]
pub mod adamw;
#[cfg(feature = "cube")]
pub mod attention;
#[cfg(all(test, feature = "cuda-source"))]
mod cuda_emulation;
#[cfg(all(test, feature = "cuda-source"))]
mod cuda_source;
#[cfg(feature = "cube")]
pub mod embedding;
// The BLAS call's plan is host arithmetic, built and tested without a GPU runtime.
pub mod gemm;
#[cfg(feature = "cube")]
pub mod join;
#[cfg(feature = "cube")]
pub mod layout;
#[cfg(feature = "cube")]
pub mod lm_head;
#[cfg(feature = "cube")]
pub mod rms_norm;
#[cfg(feature = "cube")]
pub mod rope;
#[cfg(feature = "cube")]
mod rows;
#[cfg(feature = "cube")]
pub mod square_sums;
#[cfg(feature = "cube")]
pub mod swiglu;
#[cfg(feature = "cube")]
pub mod vectors;
