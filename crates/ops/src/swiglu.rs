//! SwiGLU's gating as one op: `y = silu(g) ⊙ u` with `silu(g) = g·σ(g)`.
//!
//! burn's composition (a sigmoid, two products) records a graph node for each, and autodiff
//! keeps four `[N, d_ff]` tensors for backward: `g`, `σ(g)`, `silu(g)` and `u`. The op keeps
//! `g` and `u` and recomputes `σ(g)` in backward, where the chain rule gives
//! `du = dy·silu(g)` and `dg = (dy·u)·σ(g) + ((dy·u)·g)·σ(g)·(1 − σ(g))`,
//! the two terms burn's autodiff sums for the product and the sigmoid, computed in the same
//! order, so they give the same bits.
//!
//! Backends: [`FusedSwiglu`] defaults to the same formulas on the backend's own tensor ops
//! (bf16 on the CPU, and the GPUs, where burn's Fusion fuses the elementwise chain);
//! `Flex` runs f32 in one pass each way (below); `Autodiff<B>` records the one node
//! (`autodiff.rs`).

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::{backend::Backend, ops::FloatTensor, DType, Tensor};
use rayon::prelude::*;

use crate::flex_tensor::{contiguous, f32_tensor};
use crate::generic::{float, prim};

/// `(dg, du)`: SwiGLU's gradients.
pub type SwigluGrads<B> = (FloatTensor<B>, FloatTensor<B>);

/// A backend that can gate by SwiGLU.
pub trait FusedSwiglu: Backend {
    /// `silu(g) ⊙ u`, differentiable on autodiff backends.
    fn swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        composed::<Self>(g, u)
    }

    /// `(dg, du)` for the upstream gradient `dy` (see the module docs).
    fn swiglu_backward(
        g: FloatTensor<Self>,
        u: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> SwigluGrads<Self> {
        composed_backward::<Self>(g, u, dy)
    }
}

/// The forward on the backend's tensor ops: burn's `silu(g) * u`.
fn composed<B: Backend>(g: FloatTensor<B>, u: FloatTensor<B>) -> FloatTensor<B> {
    prim(burn::tensor::activation::silu(float::<B, 2>(g)) * float::<B, 2>(u))
}

/// The backward on the backend's tensor ops, in burn autodiff's order.
fn composed_backward<B: Backend>(
    g: FloatTensor<B>,
    u: FloatTensor<B>,
    dy: FloatTensor<B>,
) -> SwigluGrads<B> {
    let (g, u, dy) = (float::<B, 2>(g), float::<B, 2>(u), float::<B, 2>(dy));
    let s = burn::tensor::activation::sigmoid(g.clone());
    let d_silu = dy.clone() * u;
    let through_sigmoid = B::sigmoid_backward(prim(s.clone()), prim(d_silu.clone() * g.clone()));
    let dg = d_silu * s.clone() + float::<B, 2>(through_sigmoid);
    let du = dy * (g * s);
    (prim(dg), prim(du))
}

/// SwiGLU's gating `silu(gate) ⊙ up` of `[N, d_ff]` tensors (see the module docs).
pub fn swiglu<B: FusedSwiglu>(gate: Tensor<B, 2>, up: Tensor<B, 2>) -> Tensor<B, 2> {
    assert_eq!(gate.dims(), up.dims(), "swiglu: gate and up shapes differ");
    float(B::swiglu(prim(gate), prim(up)))
}

impl FusedSwiglu for Flex {
    fn swiglu(g: FlexTensor, u: FlexTensor) -> FlexTensor {
        let Some(shape) = f32_shape(&[&g, &u]) else {
            return composed::<Flex>(g, u);
        };
        let (g, u) = (contiguous(g), contiguous(u));
        let (g, u) = (slice(&g), slice(&u));
        let mut y = vec![0f32; g.len()];
        par_chunks(&mut y, |at, y| {
            for (i, y) in y.iter_mut().enumerate() {
                let (g, u) = (g[at + i], u[at + i]);
                *y = g * sigmoid(g) * u;
            }
        });
        f32_tensor(y, shape)
    }

    fn swiglu_backward(g: FlexTensor, u: FlexTensor, dy: FlexTensor) -> SwigluGrads<Flex> {
        let Some(shape) = f32_shape(&[&g, &u, &dy]) else {
            return composed_backward::<Flex>(g, u, dy);
        };
        let (g, u, dy) = (contiguous(g), contiguous(u), contiguous(dy));
        let (g, u, dy) = (slice(&g), slice(&u), slice(&dy));
        let mut dg = vec![0f32; g.len()];
        let mut du = vec![0f32; g.len()];
        par_chunk_pairs(&mut dg, &mut du, |at, dg, du| {
            for i in 0..dg.len() {
                let (g, u, dy) = (g[at + i], u[at + i], dy[at + i]);
                let s = sigmoid(g);
                let d_silu = dy * u;
                // Flex's sigmoid_backward: grad · s · (1 − s), left to right.
                dg[i] = d_silu * s + d_silu * g * s * (1.0 - s);
                du[i] = dy * (g * s);
            }
        });
        (f32_tensor(dg, shape), f32_tensor(du, shape))
    }
}

/// The common `[N, d_ff]` shape when every tensor is a 2-D f32 one of it: the kernels' case
/// (anything else composes tensor ops, which broadcast or fail as burn's do).
fn f32_shape(tensors: &[&FlexTensor]) -> Option<[usize; 2]> {
    let shape = tensors[0].layout().shape();
    let same = tensors
        .iter()
        .all(|t| t.dtype() == DType::F32 && t.layout().shape() == shape);
    (same && shape.num_dims() == 2).then(|| [shape[0], shape[1]])
}

/// Flex's sigmoid, branch for branch, so the kernel's bits are the composition's.
fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("a contiguous f32 tensor")
}

/// Elements per parallel task: big enough to amortise rayon, small enough to share.
const CHUNK: usize = 1 << 14;

/// `f(offset, chunk)` over `out` in parallel chunks of [`CHUNK`] elements.
fn par_chunks(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(k, chunk)| f(k * CHUNK, chunk));
}

/// [`par_chunks`] over two outputs of one length, chunk by chunk.
fn par_chunk_pairs(a: &mut [f32], b: &mut [f32], f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync) {
    a.par_chunks_mut(CHUNK)
        .zip(b.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(k, (a, b))| f(k * CHUNK, a, b));
}
