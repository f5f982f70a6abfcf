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
//! every backend runs exactly the graph it ran before this op existed. `CubeBackend` takes
//! the vendor's BLAS where its runtime has one, and Fusion passes the op through as a custom
//! op (`cube/mod.rs`).

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::backend::flex::Flex;
use burn::tensor::{
    backend::Backend,
    ops::{FloatTensor, FloatTensorOps},
    Tensor, TensorPrimitive,
};

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

/// The op's node: gradients by the inner backend's own [`FusedProjection::project`].
#[derive(Debug)]
struct ProjectionBackward;

impl<B: FusedProjection> Backward<B, 2> for ProjectionBackward {
    /// `a` if `b` wants a gradient, `b` if `a` does.
    type State = (Option<NodeId>, Option<NodeId>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, cp: &mut Checkpointer) {
        let (a, b) = ops.state;
        let [a_node, b_node] = ops.parents.map(|p| p.map(|n| n.id));
        let dy = grads.consume::<B>(&ops.node);
        if let (Some(id), Some(b)) = (a_node, b) {
            let b = cp.retrieve_node_output::<FloatTensor<B>>(b);
            grads.register::<B>(id, B::project(dy.clone(), B::float_transpose(b)));
        }
        if let (Some(id), Some(a)) = (b_node, a) {
            let a = cp.retrieve_node_output::<FloatTensor<B>>(a);
            grads.register::<B>(id, B::project(B::float_transpose(a), dy));
        }
    }
}

/// `a · b` through lab's node whatever [`FusedProjection::projects_on_op`] says: the op's
/// autodiff half, public so that it can be checked on any backend.
pub fn projection_node<B: FusedProjection, C: CheckpointStrategy>(
    a: FloatTensor<Autodiff<B, C>>,
    b: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let (a_tracked, b_tracked) = (a.is_tracked(), b.is_tracked());
    match ProjectionBackward
        .prepare::<C>([a.node.clone(), b.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let a_kept = b_tracked.then(|| prep.checkpoint(&a));
            let b_kept = a_tracked.then(|| prep.checkpoint(&b));
            prep.finish((a_kept, b_kept), B::project(a.primitive, b.primitive))
        }
        OpsKind::UnTracked(prep) => prep.finish(B::project(a.primitive, b.primitive)),
    }
}

impl<B: FusedProjection, C: CheckpointStrategy> FusedProjection for Autodiff<B, C> {
    fn projects_on_op() -> bool {
        B::projects_on_op()
    }

    fn project(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        if B::projects_on_op() {
            projection_node::<B, C>(a, b)
        } else {
            <Self as FloatTensorOps<Self>>::float_matmul(a, b)
        }
    }
}
