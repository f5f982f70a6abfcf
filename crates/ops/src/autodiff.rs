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
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{FloatDType, Shape, Slice, TensorMetadata};

use crate::{
    FusedAttention, FusedEmbedding, FusedHeads, FusedLoss, FusedProjection, FusedRmsNorm,
    FusedRope, FusedSwiglu, HeadColumns,
};

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
        let parents = ops.parents.map(|p| p.map(|n| n.id));
        register_each::<B, 2>(grads, parents, [grad_hidden, grad_weight]);
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
            let dx = B::rope_transposed(dy, cos, sin);
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

/// SwiGLU's node (`swiglu.rs`): keeps its input `h = [g | u]` as a checkpoint (so selective
/// checkpointing may recompute it) and recomputes `σ(g)` in backward.
#[derive(Debug)]
struct SwigluBackward;

impl<B: FusedSwiglu> Backward<B, 1> for SwigluBackward {
    /// The node of `h`.
    type State = NodeId;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, cp: &mut Checkpointer) {
        let h = cp.retrieve_node_output(ops.state);
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(parent)] = ops.parents {
            grads.register::<B>(parent.id, B::swiglu_backward(h, dy));
        }
    }
}

/// Recomputes SwiGLU's output from `h` when a later node needs it and it was not kept.
#[derive(Debug, Clone)]
struct RetroSwiglu<B> {
    h: NodeId,
    _backend: PhantomData<B>,
}

impl<B: FusedSwiglu> RetroForward for RetroSwiglu<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let h = states.get_state::<FloatTensor<B>>(&self.h);
        states.save(out_node, B::swiglu(h))
    }
}

/// RMSNorm's node (`rms_norm.rs`): keeps its input `x` and the gain as checkpoints (so
/// selective checkpointing may recompute them) and recomputes the rows' rms in backward.
#[derive(Debug, Clone, Copy)]
struct RmsNormBackward {
    eps: f64,
    /// The output's dtype.
    dtype: FloatDType,
}

impl<B: FusedRmsNorm> Backward<B, 2> for RmsNormBackward {
    /// The nodes of `x` and the gain.
    type State = (NodeId, NodeId);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, cp: &mut Checkpointer) {
        let (x, gain) = ops.state;
        let (x, gain): (FloatTensor<B>, FloatTensor<B>) =
            (cp.retrieve_node_output(x), cp.retrieve_node_output(gain));
        let dy = grads.consume::<B>(&ops.node);
        // What already reached `x` (the residual stream: the skip connection's gradient,
        // registered by the residual add around the block, which backward reaches first) is
        // added by the op's backward as it writes `dx`, not by `register` in another pass.
        let skip = ops.parents[0]
            .as_ref()
            .and_then(|node| take_gradient::<B>(grads, &x, |key| key.node = node.clone()));
        let (dx, dgain) = B::rms_norm_backward(x, gain, self.eps, dy, skip);
        register_each::<B, 2>(grads, ops.parents.map(|p| p.map(|n| n.id)), [dx, dgain]);
    }
}

/// What backward has registered so far for a parent's tensor, taken out of `Gradients` for
/// an op to add to (and register again). `Gradients` finds a gradient by a tensor's node: a
/// throwaway tensor (`like`'s primitive) carries it, `set_node` gives it the parent's.
fn take_gradient<B: Backend>(
    grads: &mut Gradients,
    like: &FloatTensor<B>,
    set_node: impl FnOnce(&mut FloatTensor<Autodiff<B>>),
) -> Option<FloatTensor<B>> {
    let mut key = FloatTensor::<Autodiff<B>>::new(like.clone());
    set_node(&mut key);
    let taken = grads.remove::<B>(&key);
    if taken.is_some() {
        GRADIENTS_FOLDED.with(|n| n.set(n.get() + 1));
    }
    taken
}

thread_local! {
    static GRADIENTS_FOLDED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many times a backward on this thread (RMSNorm's, the joined q|k|v product's heads')
/// found a gradient already registered for its input and handed it to the op. The lookup
/// goes through burn's `Gradients` by node: tests check that it still finds the skip
/// connection's gradient and the other heads'.
#[doc(hidden)]
pub fn gradients_folded_on_this_thread() -> usize {
    GRADIENTS_FOLDED.with(|n| n.get())
}

/// Recomputes RMSNorm's output from its input and gain when a later node needs it and it was
/// not kept.
#[derive(Debug, Clone)]
struct RetroRmsNorm<B> {
    inputs: (NodeId, NodeId),
    op: RmsNormBackward,
    _backend: PhantomData<B>,
}

impl<B: FusedRmsNorm> RetroForward for RetroRmsNorm<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let x = states.get_state::<FloatTensor<B>>(&self.inputs.0);
        let gain = states.get_state::<FloatTensor<B>>(&self.inputs.1);
        states.save(out_node, B::rms_norm(x, gain, self.op.eps, self.op.dtype))
    }
}

impl<B: FusedSwiglu, C: CheckpointStrategy> FusedSwiglu for Autodiff<B, C> {
    fn swiglu(h: FloatTensor<Self>) -> FloatTensor<Self> {
        let retro = RetroSwiglu::<B> {
            h: h.node.id,
            _backend: PhantomData,
        };
        match SwigluBackward
            .prepare::<C>([h.node.clone()])
            .memory_bound()
            .retro_forward(retro)
            .parents([&h])
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = prep.checkpoint(&h);
                prep.finish(state, B::swiglu(h.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::swiglu(h.primitive)),
        }
    }
}

impl<B: FusedRmsNorm, C: CheckpointStrategy> FusedRmsNorm for Autodiff<B, C> {
    fn rms_norm(
        x: FloatTensor<Self>,
        gain: FloatTensor<Self>,
        eps: f64,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let op = RmsNormBackward { eps, dtype };
        let retro = RetroRmsNorm::<B> {
            inputs: (x.node.id, gain.node.id),
            op,
            _backend: PhantomData,
        };
        match op
            .prepare::<C>([x.node.clone(), gain.node.clone()])
            .memory_bound()
            .retro_forward(retro)
            .parents([&x, &gain])
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&x), prep.checkpoint(&gain));
                prep.finish(state, B::rms_norm(x.primitive, gain.primitive, eps, dtype))
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::rms_norm(x.primitive, gain.primitive, eps, dtype))
            }
        }
    }
}

/// The embedding's node: keeps the table's handle (for its shape) and the ids, as burn's
/// own node does; backward is the inner backend's [`FusedEmbedding::embed_grad`].
#[derive(Debug)]
struct EmbedBackward;

impl<B: FusedEmbedding> Backward<B, 1> for EmbedBackward {
    type State = (FloatTensor<B>, IntTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (weights, ids) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(table)] = ops.parents {
            grads.register::<B>(table.id, B::embed_grad(weights, dy, ids));
        }
    }
}

impl<B: FusedEmbedding, C: CheckpointStrategy> FusedEmbedding for Autodiff<B, C> {
    fn embed(weights: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        match EmbedBackward
            .prepare::<C>([weights.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let rows = B::embed(weights.primitive.clone(), ids.clone());
                prep.finish((weights.primitive, ids), rows)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::embed(weights.primitive, ids)),
        }
    }
}

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

/// The node of `x · [a | b | …]` ([`FusedProjection::project_joined`]) with `P − 1` weights:
/// keeps `x` and the weights themselves (alive anyway as parameters), never their joined copy,
/// which backward makes again for `dx`. `dW = xᵀ · dy` is one product, whose column blocks
/// (views) are the weights' gradients.
#[derive(Debug)]
struct JoinedProjectionBackward<const P: usize> {
    /// Each weight's columns, in order: where `dW` splits.
    widths: Vec<usize>,
}

impl<B: FusedProjection, const P: usize> Backward<B, P> for JoinedProjectionBackward<P> {
    /// `x` if a weight wants a gradient; the weights if `x` does.
    type State = (Option<NodeId>, Option<Vec<NodeId>>);

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, cp: &mut Checkpointer) {
        let (x, weights) = ops.state;
        let parents = ops.parents.map(|p| p.map(|n| n.id));
        let (x_node, weight_nodes) = (parents[0], &parents[1..]);
        let dy = grads.consume::<B>(&ops.node);
        if let (Some(id), Some(weights)) = (x_node, weights) {
            let weights = weights.into_iter().map(|w| cp.retrieve_node_output(w));
            let joined = B::join_columns(weights.collect());
            grads.register::<B>(id, B::project(dy.clone(), B::float_transpose(joined)));
        }
        // `x` is kept exactly when a weight is tracked (`joined_projection_node`).
        if let Some(x) = x {
            let x = cp.retrieve_node_output::<FloatTensor<B>>(x);
            let dw = B::project(B::float_transpose(x), dy);
            let rows = dw.shape()[0];
            let mut from = 0;
            for (node, width) in weight_nodes.iter().zip(&self.widths) {
                if let Some(id) = node {
                    let slices = [
                        Slice::new(0, Some(rows as isize), 1),
                        Slice::new(from as isize, Some((from + width) as isize), 1),
                    ];
                    grads.register::<B>(*id, B::float_slice(dw.clone(), &slices));
                }
                from += width;
            }
        }
    }
}

/// `x · [a | b | …]` through [`JoinedProjectionBackward`], `P − 1` weights.
fn joined_projection_node<B: FusedProjection, C: CheckpointStrategy, const P: usize>(
    x: FloatTensor<Autodiff<B, C>>,
    weights: Vec<FloatTensor<Autodiff<B, C>>>,
) -> FloatTensor<Autodiff<B, C>> {
    assert_eq!(weights.len() + 1, P, "joined_projection_node: {P} parents");
    let weights_tracked = weights.iter().any(|w| w.is_tracked());
    let x_tracked = x.is_tracked();
    let widths = weights.iter().map(|w| w.primitive.shape()[1]).collect();
    let nodes = std::array::from_fn(|i| match i {
        0 => x.node.clone(),
        i => weights[i - 1].node.clone(),
    });
    let inner =
        |ws: Vec<FloatTensor<Autodiff<B, C>>>| ws.into_iter().map(|w| w.primitive).collect();
    match (JoinedProjectionBackward::<P> { widths })
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let x_kept = weights_tracked.then(|| prep.checkpoint(&x));
            let kept = x_tracked.then(|| weights.iter().map(|w| prep.checkpoint(w)).collect());
            let y = B::project_joined(x.primitive, inner(weights));
            prep.finish((x_kept, kept), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::project_joined(x.primitive, inner(weights))),
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

    /// Always lab's node: burn's concatenation and matmul would keep the joined copy. Two
    /// weights (the feed-forward's gate and up) or three (the attention's q, k and v).
    fn project_joined(x: FloatTensor<Self>, weights: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        match weights.len() {
            2 => joined_projection_node::<B, C, 3>(x, weights),
            3 => joined_projection_node::<B, C, 4>(x, weights),
            n => panic!("project_joined: two or three weights under autodiff, got {n}"),
        }
    }
}

/// A group of heads of the joined q|k|v product `y` (`heads.rs`): rotated by RoPE where it
/// keeps the tables (q, k), copied where it keeps nothing (v). Backward adds its gradient (for
/// q and k RoPE's transpose of it) into `y`'s gradient, in place.
#[derive(Debug)]
struct HeadsBackward {
    at: HeadColumns,
    /// `y`'s columns.
    width: usize,
}

impl<B: FusedHeads> Backward<B, 1> for HeadsBackward {
    /// cos and sin, for the rotated heads.
    type State = Option<(FloatTensor<B>, FloatTensor<B>)>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(y)] = ops.parents {
            let acc = gradient_so_far::<B>(grads, &dy, self.at.batch, self.width, |key| {
                key.node = y.clone()
            });
            let acc = match ops.state {
                Some((cos, sin)) => B::add_rope_transposed_into(acc, self.at, dy, cos, sin),
                None => B::add_heads_into(acc, self.at, dy),
            };
            grads.register::<B>(y.id, acc);
        }
    }
}

/// The gradient the other groups of heads registered for `y [B·T, width]` so far, or zeros of
/// its shape (`dy [B, heads, T, hd]`'s dtype and device) for the first group to run.
fn gradient_so_far<B: Backend>(
    grads: &mut Gradients,
    dy: &FloatTensor<B>,
    batch: usize,
    width: usize,
    set_node: impl FnOnce(&mut FloatTensor<Autodiff<B>>),
) -> FloatTensor<B> {
    take_gradient::<B>(grads, dy, set_node).unwrap_or_else(|| {
        let rows = batch * dy.shape()[2];
        B::float_zeros(
            Shape::new([rows, width]),
            &B::float_device(dy),
            dy.dtype().into(),
        )
    })
}

/// The heads `at` of `y` through [`HeadsBackward`]: rotated by the tables where given, copied
/// otherwise. The tables get no gradient (they are made from positions, never trained), and
/// are all the node keeps: nothing to recompute.
fn heads_node<B: FusedHeads, C: CheckpointStrategy>(
    y: FloatTensor<Autodiff<B, C>>,
    at: HeadColumns,
    tables: Option<(FloatTensor<B>, FloatTensor<B>)>,
) -> FloatTensor<Autodiff<B, C>> {
    let width = y.primitive.shape()[1];
    let forward = |y, tables| match tables {
        Some((cos, sin)) => B::rope_heads(y, at, cos, sin),
        None => B::heads(y, at),
    };
    match (HeadsBackward { at, width })
        .prepare::<C>([y.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let out = forward(y.primitive, tables.clone());
            prep.finish(tables, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(y.primitive, tables)),
    }
}

impl<B: FusedHeads, C: CheckpointStrategy> FusedHeads for Autodiff<B, C> {
    fn rope_heads(
        y: FloatTensor<Self>,
        at: HeadColumns,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        heads_node::<B, C>(y, at, Some((cos.primitive, sin.primitive)))
    }

    fn heads(y: FloatTensor<Self>, at: HeadColumns) -> FloatTensor<Self> {
        heads_node::<B, C>(y, at, None)
    }
}

/// Hands each tracked parent its gradient (untracked parents, `None`, get none).
fn register_each<B: Backend, const N: usize>(
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
