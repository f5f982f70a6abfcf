//! The runtimes' vendor BLAS, behind one trait the projection op calls.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

/// The products the vendor BLAS ran and those it declined (the backend's matmul ran them)
/// since the process started, counted by [`counted_vendor_matmul`]: so that a timing taken
/// with `LAB_MATMUL=cublaslt` says what it timed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VendorCounts {
    pub ran: u64,
    pub declined: u64,
}

static RAN: AtomicU64 = AtomicU64::new(0);
static DECLINED: AtomicU64 = AtomicU64::new(0);

/// This process's [`VendorCounts`] so far.
pub fn vendor_counts() -> VendorCounts {
    VendorCounts {
        ran: RAN.load(Relaxed),
        declined: DECLINED.load(Relaxed),
    }
}

/// [`VendorMatmul::vendor_matmul`], counted in [`vendor_counts`].
pub fn counted_vendor_matmul<R: VendorMatmul>(
    a: &CubeTensor<R>,
    b: &CubeTensor<R>,
) -> Option<CubeTensor<R>> {
    let product = R::vendor_matmul(a, b);
    let count = if product.is_some() { &RAN } else { &DECLINED };
    count.fetch_add(1, Relaxed);
    product
}
