//! The custom backward: `Autodiff<B>` records one graph node for the whole loss.
//!
//! When a gradient is wanted, the forward computes the gradients too, for an upstream
//! gradient of 1 (`lm_head_loss_with_grads`: each chunk's logits once, not again in
//! backward, as Liger's fused linear cross-entropy does). The node saves those two gradients,
//! `[N, d]` and `[d, V]`, nothing of size `[N, V]`; backward only scales them by the upstream
//! gradient (exact when it is a power of two, as `loss / grad_accum` is for the presets).

use std::marker::PhantomData;

use burn::backend::autodiff::{
    checkpoint::{
        base::Checkpointer, retro_forward::RetroForward, state::BackwardStates,
        strategy::CheckpointStrategy,
    },
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
    Autodiff, NodeId,
};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::TensorMetadata;

use crate::{FusedAttention, FusedLoss, FusedRmsNorm, FusedRope, FusedSwiglu};

#[derive(Debug)]
struct LmHeadLossBackward;

/// Saved for backward: d loss/d hidden [N, d] and d loss/d weight [d, V] for an upstream
/// gradient of 1.
type SavedState<B> = (FloatTensor<B>, FloatTensor<B>);

impl<B: FusedLoss> Backward<B, 2> for LmHeadLossBackward {
    type State = SavedState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (grad_hidden, grad_weight) = ops.state;
        let grad_loss = grads.consume::<B>(&ops.node); // [1]
        let scale = B::float_reshape(grad_loss, [1, 1].into());
        let grad_hidden = scaled::<B>(grad_hidden, scale.clone());
        let grad_weight = scaled::<B>(grad_weight, scale);
        let [hidden_node, weight_node] = ops.parents;
        if let Some(node) = hidden_node {
            grads.register::<B>(node.id, grad_hidden);
        }
        if let Some(node) = weight_node {
            grads.register::<B>(node.id, grad_weight);
        }
    }
}

/// `grad · scale`, the fp32 scale first cast to the gradient's dtype (bf16 under mixed
/// precision): burn's binary ops read the right operand as the left one's dtype.
fn scaled<B: FusedLoss>(grad: FloatTensor<B>, scale: FloatTensor<B>) -> FloatTensor<B> {
    let dtype = grad.dtype();
    let scale = if scale.dtype() == dtype {
        scale
    } else {
        B::float_cast(scale, dtype.into())
    };
    B::float_mul(grad, scale)
}

impl<B: FusedLoss, C: CheckpointStrategy> FusedLoss for Autodiff<B, C> {
    fn loss_chunk_rows(rows: usize, vocab: usize) -> usize {
        B::loss_chunk_rows(rows, vocab)
    }

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
                let (loss, grad_hidden, grad_weight) = B::lm_head_loss_with_grads(
                    hidden.primitive,
                    weight.primitive,
                    targets,
                    chunk_rows,
                );
                prep.finish((grad_hidden, grad_weight), loss)
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

/// Fused attention's node: saves the inputs, the output and the per-row log-sum-exp (no
/// `T × T` tensor); backward is the kernel's.
#[derive(Debug)]
struct FusedAttentionBackward {
    scale: f32,
}

/// q, k, v, out, lse.
type AttentionState<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
);

impl<B: FusedAttention> Backward<B, 3> for FusedAttentionBackward {
    type State = AttentionState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (q, k, v, out, lse) = ops.state;
        let d_out = grads.consume::<B>(&ops.node);
        let (dq, dk, dv) = B::fused_attention_backward(q, k, v, out, lse, d_out, self.scale);
        register_each::<B, 3>(grads, ops.parents.map(|p| p.map(|n| n.id)), [dq, dk, dv]);
    }
}

impl<B: FusedAttention, C: CheckpointStrategy> FusedAttention for Autodiff<B, C> {
    fn has_fused_attention() -> bool {
        B::has_fused_attention()
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let parents = [q.node.clone(), k.node.clone(), v.node.clone()];
        let node = FusedAttentionBackward { scale };
        match node.prepare::<C>(parents).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (q, k, v) = (q.primitive, k.primitive, v.primitive);
                let (out, lse) = B::fused_attention_forward(q.clone(), k.clone(), v.clone(), scale);
                prep.finish((q, k, v, out.clone(), lse), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_attention(
                q.primitive,
                k.primitive,
                v.primitive,
                scale,
            )),
        }
    }
}

/// RoPE's node: keeps the tables; backward is RoPE's transpose (see `rope.rs`).
#[derive(Debug)]
struct RopeBackward;

impl<B: FusedRope> Backward<B, 1> for RopeBackward {
    /// cos, sin.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (cos, sin) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(x)] = ops.parents {
            let dx = B::rope(dy, cos, crate::rope::backward_sin::<B>(sin));
            grads.register::<B>(x.id, dx);
        }
    }
}

impl<B: FusedRope, C: CheckpointStrategy> FusedRope for Autodiff<B, C> {
    /// The tables get no gradient: they are made from positions, never trained.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (cos, sin) = (cos.primitive, sin.primitive);
        // The state is the tables, not activations: nothing to recompute.
        match RopeBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let y = B::rope(x.primitive, cos.clone(), sin.clone());
                prep.finish((cos, sin), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rope(x.primitive, cos, sin)),
        }
    }
}

/// SwiGLU's node: keeps its inputs `g` and `u` (as checkpoints, so selective checkpointing
/// may recompute them), recomputes `σ(g)` in backward (see `swiglu.rs`).
#[derive(Debug)]
struct SwigluBackward;

/// Recomputes the op's output when a later node needs it and it was not kept.
#[derive(Debug, Clone)]
struct RetroSwiglu<B> {
    g: NodeId,
    u: NodeId,
    _backend: PhantomData<B>,
}

impl<B: FusedSwiglu> RetroForward for RetroSwiglu<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let g = states.get_state::<FloatTensor<B>>(&self.g);
        let u = states.get_state::<FloatTensor<B>>(&self.u);
        states.save(out_node, B::swiglu(g, u))
    }
}

impl<B: FusedSwiglu> Backward<B, 2> for SwigluBackward {
    /// The nodes of g and u.
    type State = (NodeId, NodeId);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, cp: &mut Checkpointer) {
        let (g, u) = ops.state;
        let (g, u) = (cp.retrieve_node_output(g), cp.retrieve_node_output(u));
        let dy = grads.consume::<B>(&ops.node);
        let (dg, du) = B::swiglu_backward(g, u, dy);
        register_each::<B, 2>(grads, ops.parents.map(|p| p.map(|n| n.id)), [dg, du]);
    }
}

impl<B: FusedSwiglu, C: CheckpointStrategy> FusedSwiglu for Autodiff<B, C> {
    fn swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        let retro = RetroSwiglu::<B> {
            g: g.node.id,
            u: u.node.id,
            _backend: PhantomData,
        };
        match SwigluBackward
            .prepare::<C>([g.node.clone(), u.node.clone()])
            .memory_bound()
            .retro_forward(retro)
            .parents([&g, &u])
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&g), prep.checkpoint(&u));
                prep.finish(state, B::swiglu(g.primitive, u.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::swiglu(g.primitive, u.primitive)),
        }
    }
}

/// RMSNorm's node: keeps its input and gain (as checkpoints, so selective checkpointing may
/// recompute the input), recomputes the per-row rms in backward (see `rms_norm.rs`).
#[derive(Debug)]
struct RmsNormBackward {
    eps: f64,
}

/// Recomputes the op's output when a later node needs it and it was not kept.
#[derive(Debug, Clone)]
struct RetroRmsNorm<B> {
    x: NodeId,
    gain: NodeId,
    eps: f64,
    _backend: PhantomData<B>,
}

impl<B: FusedRmsNorm> RetroForward for RetroRmsNorm<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let x = states.get_state::<FloatTensor<B>>(&self.x);
        let gain = states.get_state::<FloatTensor<B>>(&self.gain);
        states.save(out_node, B::rms_norm(x, gain, self.eps))
    }
}

impl<B: FusedRmsNorm> Backward<B, 2> for RmsNormBackward {
    /// The nodes of x and the gain.
    type State = (NodeId, NodeId);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, cp: &mut Checkpointer) {
        let (x, gain) = ops.state;
        let (x, gain) = (cp.retrieve_node_output(x), cp.retrieve_node_output(gain));
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dgain) = B::rms_norm_backward(x, gain, self.eps, dy);
        register_each::<B, 2>(grads, ops.parents.map(|p| p.map(|n| n.id)), [dx, dgain]);
    }
}

impl<B: FusedRmsNorm, C: CheckpointStrategy> FusedRmsNorm for Autodiff<B, C> {
    fn rms_norm(x: FloatTensor<Self>, gain: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        let retro = RetroRmsNorm::<B> {
            x: x.node.id,
            gain: gain.node.id,
            eps,
            _backend: PhantomData,
        };
        match (RmsNormBackward { eps })
            .prepare::<C>([x.node.clone(), gain.node.clone()])
            .memory_bound()
            .retro_forward(retro)
            .parents([&x, &gain])
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&x), prep.checkpoint(&gain));
                prep.finish(state, B::rms_norm(x.primitive, gain.primitive, eps))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rms_norm(x.primitive, gain.primitive, eps)),
        }
    }
}

/// Hands each tracked parent its gradient (untracked parents, `None`, get none).
fn register_each<B: burn::tensor::backend::Backend, const N: usize>(
    grads: &mut Gradients,
    parents: [Option<NodeId>; N],
    values: [FloatTensor<B>; N],
) {
    for (parent, grad) in parents.into_iter().zip(values) {
        if let Some(id) = parent {
            grads.register::<B>(id, grad);
        }
    }
}
