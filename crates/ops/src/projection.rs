//! The projections' matrix product `x · w` as one op, so that a GPU can run it, forward and
//! backward, on its vendor's BLAS (cuBLASLt on CUDA: lab-kernels' `gemm`).
//!
//! The backward is the matmul's: `dx = dy · wᵀ` and `dw = xᵀ · dy`, each again a product of
//! this op, the transposes as views (a BLAS reads them with op T, no copy). What the node
//! keeps is what burn's matmul node keeps: `x` when `w` wants a gradient, `w` when `x` does.
//!
//! Backends: [`FusedProjection::project`] defaults to the backend's matmul, and
//! [`FusedProjection::projects_on_op`] to `false`, in which case `Autodiff` and Fusion record
//! burn's own matmul: unless `LAB_MATMUL` asks for the op (lab-kernels' `gemm::Choice`),
//! every backend runs exactly the graph it ran before this op existed. `Autodiff<B>` records
//! the op's node (`autodiff.rs`, with the other ops' nodes), `CubeBackend` takes the vendor's
//! BLAS where its runtime has one, and Fusion passes the op through as a custom op
//! (`cube/projection.rs`).

use burn::backend::flex::Flex;
use burn::tensor::{backend::Backend, ops::FloatTensor, Tensor, TensorPrimitive};

/// A backend whose projections may run as lab's op.
pub trait FusedProjection: Backend {
    /// Whether [`FusedProjection::project`] records lab's op (its autodiff node, its Fusion
    /// custom op) rather than the backend's matmul.
    fn projects_on_op() -> bool {
        false
    }

    /// `a [M, K] · b [K, N]`; either may be a transposed view.
    fn project(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(a, b)
    }
}

/// `x [N, d_in] · w [d_in, d_out]`, differentiable on autodiff backends.
pub fn project<B: FusedProjection>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    let [_, d_in] = x.dims();
    let [w_in, _] = w.dims();
    assert_eq!(d_in, w_in, "project: x has {d_in} columns, w {w_in} rows");
    let y = B::project(x.into_primitive().tensor(), w.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

impl FusedProjection for Flex {}
