//! SwiGLU's gating as one op: `y = silu(g) ⊙ u` with `silu(g) = g·σ(g)`.
//!
//! burn's composition (a sigmoid, two products) records a graph node for each, and autodiff
//! keeps five `[N, d_ff]` tensors for backward: `g` twice over (for the sigmoid's product and
//! the outer one), `σ(g)`, `silu(g)` and `u`. The op keeps `g` and `u` and recomputes `σ(g)`
//! in backward, where the chain rule gives
//! `du = dy·silu(g)` and `dg = (dy·u)·σ(g) + ((dy·u)·g)·σ(g)·(1 − σ(g))`,
//! the two terms burn's autodiff sums for the product and the sigmoid, computed in the same
//! order, so they give the same bits.
//!
//! Backends: [`FusedSwiglu`] defaults to the same formulas on the backend's own tensor ops
//! (bf16 on the CPU, and the GPUs, where burn's Fusion fuses the elementwise chain);
//! `Flex` runs f32 in one pass each way (below); `Autodiff<B>` records the one node
//! (`autodiff.rs`).

use burn::backend::flex::{Flex, FlexTensor, Layout};
use burn::tensor::{backend::Backend, ops::FloatTensor, Bytes, DType, Tensor, TensorPrimitive};
use rayon::prelude::*;

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

fn float<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn prim<B: Backend>(t: Tensor<B, 2>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// The forward on the backend's tensor ops: burn's `silu(g) * u`.
fn composed<B: Backend>(g: FloatTensor<B>, u: FloatTensor<B>) -> FloatTensor<B> {
    prim(burn::tensor::activation::silu(float::<B>(g)) * float::<B>(u))
}

/// The backward on the backend's tensor ops, in burn autodiff's order.
fn composed_backward<B: Backend>(
    g: FloatTensor<B>,
    u: FloatTensor<B>,
    dy: FloatTensor<B>,
) -> SwigluGrads<B> {
    let (g, u, dy) = (float::<B>(g), float::<B>(u), float::<B>(dy));
    let s = burn::tensor::activation::sigmoid(g.clone());
    let d_silu = dy.clone() * u;
    let through_sigmoid = B::sigmoid_backward(prim(s.clone()), prim(d_silu.clone() * g.clone()));
    let dg = d_silu * s.clone() + float::<B>(through_sigmoid);
    let du = dy * (g * s);
    (prim(dg), prim(du))
}

/// SwiGLU's gating `silu(gate) ⊙ up` of `[N, d_ff]` tensors (see the module docs).
pub fn swiglu<B: FusedSwiglu>(gate: Tensor<B, 2>, up: Tensor<B, 2>) -> Tensor<B, 2> {
    assert_eq!(gate.dims(), up.dims(), "swiglu: gate and up shapes differ");
    let y = B::swiglu(gate.into_primitive().tensor(), up.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

impl FusedSwiglu for Flex {
    fn swiglu(g: FlexTensor, u: FlexTensor) -> FlexTensor {
        if g.dtype() != DType::F32 {
            return composed::<Flex>(g, u);
        }
        let shape = g.layout().shape().clone();
        let (g, u) = (contiguous(g), contiguous(u));
        let (g, u) = (slice(&g), slice(&u));
        let mut y = vec![0f32; g.len()];
        par_rows(&mut y, |at, y| {
            for (i, y) in y.iter_mut().enumerate() {
                let (g, u) = (g[at + i], u[at + i]);
                *y = g * sigmoid(g) * u;
            }
        });
        f32_tensor(y, shape)
    }

    fn swiglu_backward(g: FlexTensor, u: FlexTensor, dy: FlexTensor) -> SwigluGrads<Flex> {
        if g.dtype() != DType::F32 {
            return composed_backward::<Flex>(g, u, dy);
        }
        let shape = g.layout().shape().clone();
        let (g, u, dy) = (contiguous(g), contiguous(u), contiguous(dy));
        let (g, u, dy) = (slice(&g), slice(&u), slice(&dy));
        let mut dg = vec![0f32; g.len()];
        let mut du = vec![0f32; g.len()];
        par_rows_pair(&mut dg, &mut du, |at, dg, du| {
            for i in 0..dg.len() {
                let (g, u, dy) = (g[at + i], u[at + i], dy[at + i]);
                let s = sigmoid(g);
                let d_silu = dy * u;
                // Flex's sigmoid_backward: grad · s · (1 − s), left to right.
                dg[i] = d_silu * s + d_silu * g * s * (1.0 - s);
                du[i] = dy * (g * s);
            }
        });
        (f32_tensor(dg, shape.clone()), f32_tensor(du, shape))
    }
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

fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("a contiguous f32 tensor")
}

/// Elements per parallel task: big enough to amortise rayon, small enough to share.
const CHUNK: usize = 1 << 14;

/// `f(offset, chunk)` over `out` in parallel chunks.
fn par_rows(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(k, chunk)| f(k * CHUNK, chunk));
}

/// [`par_rows`] over two outputs of one length, chunk by chunk.
fn par_rows_pair(a: &mut [f32], b: &mut [f32], f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync) {
    a.par_chunks_mut(CHUNK)
        .zip(b.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(k, (a, b))| f(k * CHUNK, a, b));
}

fn f32_tensor(data: Vec<f32>, shape: burn::tensor::Shape) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(data),
        Layout::contiguous(shape),
        DType::F32,
    )
}
