//! The projections' matrix product `x · w` as one op, so that a GPU can run it, forward and
//! backward, on its vendor's BLAS (cuBLASLt on CUDA: lab-kernels' `gemm`); and
//! [`project_joined`], two weights' products as one (the feed-forward's gate and up).
//!
//! The backward is the matmul's: `dx = dy · wᵀ` and `dw = xᵀ · dy`, each again a product of
//! this op, the transposes as views (a BLAS reads them with op T, no copy). What the node
//! keeps is what burn's matmul node keeps: `x` when `w` wants a gradient, `w` when `x` does.
//!
//! Backends: [`FusedProjection::project`] defaults to the backend's matmul, and
//! [`FusedProjection::projects_on_op`] to `false`, in which case `Autodiff` and Fusion record
//! burn's own matmul: unless `LAB_MATMUL` asks for the op (lab-kernels' `gemm::Choice`),
//! every backend runs exactly the graph [`project`] ran before this op existed. `Autodiff<B>` records
//! the op's node (`autodiff.rs`, with the other ops' nodes), `CubeBackend` takes the vendor's
//! BLAS where its runtime has one, and Fusion passes the op through as a custom op
//! (`cube/projection.rs`).
//!
//! [`project_joined`] always records lab's node (`JoinedProjectionBackward`): burn's
//! concatenation and matmul would keep the joined copy of the weights until backward. Its node
//! keeps `x` and the weights instead, and joins them again in backward; the join is
//! [`FusedProjection::join_columns`], one launch on the GPUs for two or three weights
//! (lab-kernels' `join`).

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

    /// `[a | b]` or `[a | b | c]`: matrices `[K, N_i]` side by side, a new `[K, Σ N_i]`.
    fn join_columns(parts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        Self::float_cat(parts, 1)
    }

    /// `x · [a | b]` or `x · [a | b | c]`: the weights' products as one (see
    /// [`project_joined`]).
    fn project_joined(x: FloatTensor<Self>, weights: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        Self::project(x, Self::join_columns(weights))
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

/// `x [N, d_in] · [a | b | …]` with the weights `[d_in, n_i]` side by side: one product
/// `[N, Σ n_i]` where each weight's would read `x` again, differentiable on autodiff backends.
/// The joined copy of the weights lives only while a product runs: autodiff keeps the weights
/// (parameters, alive anyway) and joins them again in backward for `dx = dy · [a | b | …]ᵀ`,
/// one product where several were summed; `dW = xᵀ · dy` is one product too, its column
/// blocks the weights' gradients (views). Two or three weights: the feed-forward's gate and
/// up, the attention's q, k and v.
pub fn project_joined<B: FusedProjection>(
    x: Tensor<B, 2>,
    weights: Vec<Tensor<B, 2>>,
) -> Tensor<B, 2> {
    let [_, d_in] = x.dims();
    let n = weights.len();
    assert!(
        (2..=3).contains(&n),
        "project_joined: two or three weights, got {n}"
    );
    for (i, w) in weights.iter().enumerate() {
        let [w_in, _] = w.dims();
        assert_eq!(
            d_in, w_in,
            "project_joined: x has {d_in} columns, weight {i} {w_in} rows"
        );
    }
    let weights = weights
        .into_iter()
        .map(|w| w.into_primitive().tensor())
        .collect();
    let y = B::project_joined(x.into_primitive().tensor(), weights);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

impl FusedProjection for Flex {}
