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
