//! The GPU backends' fused ops: lab-kernels' cubecl kernels on `CubeBackend` (CUDA, wgpu),
//! and the same passed through burn's Fusion (what `burn::backend::Cuda` and `Wgpu` are) as
//! custom operations, the pattern burn-vision uses for its own kernels.

use burn_fusion::{FusionBackend, FusionRuntime};
use burn_ir::HandleContainer;

mod attention;
mod loss;
mod rope;

/// The tensors a Fusion custom operation reads and registers, by id.
type Handles<B> =
    HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// SwiGLU on the GPUs: the composition of the backend's own tensor ops (Fusion fuses the
/// elementwise chain), with the one-node backward of `Autodiff` that keeps only its inputs.
impl<R, F, I, BT> crate::FusedSwiglu for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::BoolElement,
{
}

impl<B: FusionBackend> crate::FusedSwiglu for burn_fusion::Fusion<B> {}

/// RMSNorm on the GPUs, likewise: the backend's tensor ops under `Autodiff`'s one node, which
/// keeps only the input.
impl<R, F, I, BT> crate::FusedRmsNorm for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::BoolElement,
{
}

impl<B: FusionBackend> crate::FusedRmsNorm for burn_fusion::Fusion<B> {}
