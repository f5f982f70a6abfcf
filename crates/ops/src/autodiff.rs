//! The custom backward: `Autodiff<B>` records one graph node for the whole loss.
//!
//! Forward runs the inner backend's fused forward on the raw primitives (no autodiff
//! bookkeeping inside). The node's saved state is the two inputs (already alive: they are
//! the model's activations and a parameter), the targets and the per-row log-sum-exp `[N]`:
//! nothing of size `[N, V]`. Backward calls the inner backend's fused backward, which
//! recomputes each chunk's logits.

use burn::backend::autodiff::{
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff,
};
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::FusedLoss;

#[derive(Debug)]
struct LmHeadLossBackward;

/// Saved for backward: hidden [N, d], weight [d, V], targets [N], lse [N], chunk rows.
type SavedState<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    IntTensor<B>,
    FloatTensor<B>,
    usize,
);

impl<B: FusedLoss> Backward<B, 2> for LmHeadLossBackward {
    type State = SavedState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (hidden, weight, targets, lse, chunk_rows) = ops.state;
        let grad_loss = grads.consume::<B>(&ops.node); // [1]
        let [hidden_node, weight_node] = ops.parents;
        let (grad_hidden, grad_weight) =
            B::lm_head_loss_backward(hidden, weight, targets, lse, grad_loss, chunk_rows);
        if let Some(node) = hidden_node {
            grads.register::<B>(node.id, grad_hidden);
        }
        if let Some(node) = weight_node {
            grads.register::<B>(node.id, grad_weight);
        }
    }
}

impl<B: FusedLoss, C: CheckpointStrategy> FusedLoss for Autodiff<B, C> {
    fn lm_head_loss(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> FloatTensor<Self> {
        // compute_bound: the checkpointing strategy must never try to re-run this op.
        match LmHeadLossBackward
            .prepare::<C>([hidden.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (loss, lse) = B::lm_head_loss_forward(
                    hidden.primitive.clone(),
                    weight.primitive.clone(),
                    targets.clone(),
                    chunk_rows,
                );
                let state = (hidden.primitive, weight.primitive, targets, lse, chunk_rows);
                prep.finish(state, loss)
            }
            // Neither input needs a gradient (e.g. eval under autodiff): plain forward.
            OpsKind::UnTracked(prep) => prep.finish(B::lm_head_loss(
                hidden.primitive,
                weight.primitive,
                targets,
                chunk_rows,
            )),
        }
    }
}
