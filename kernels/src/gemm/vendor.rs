//! The runtimes' vendor BLAS, behind one trait the projection op calls.

use burn_cubecl::{tensor::CubeTensor, CubeRuntime};

/// A cubecl runtime whose vendor BLAS can take a matrix product.
pub trait VendorMatmul: CubeRuntime {
    /// Whether this runtime has a vendor BLAS at all.
    const HAS_VENDOR_BLAS: bool = false;

    /// `a [M, K] · b [K, N]`, contiguous, on the vendor's BLAS; `None` where it does not take
    /// this product (no library, another dtype, a layout [`super::plan`] refuses): the
    /// caller then runs the backend's matmul.
    fn vendor_matmul(a: &CubeTensor<Self>, b: &CubeTensor<Self>) -> Option<CubeTensor<Self>> {
        let _ = (a, b);
        None
    }
}

/// wgpu: no vendor BLAS (lavapipe, the CI's device, has none either).
#[cfg(feature = "wgpu")]
impl VendorMatmul for cubecl::wgpu::WgpuRuntime {}

/// CUDA: cuBLASLt, for f16 and bf16 (`super::cublaslt`).
#[cfg(feature = "cuda")]
impl VendorMatmul for cubecl::cuda::CudaRuntime {
    const HAS_VENDOR_BLAS: bool = true;

    fn vendor_matmul(a: &CubeTensor<Self>, b: &CubeTensor<Self>) -> Option<CubeTensor<Self>> {
        super::cublaslt::matmul(a, b)
    }
}
