//! SwiGLU's gating as one op: `y = silu(g) ⊙ u` with `silu(g) = g·σ(g)`, where the gate
//! `g` and the up projection `u` come as one tensor `h = [g | u]`, `[N, 2f]`: the
//! feed-forward computes both with one product, `x · [W_gate | W_up]`, and its backward wants
//! one `[N, 2f]` gradient `dh = [dg | du]`, so that `dx = dh · [W_gate | W_up]ᵀ` is one
//! product too, not two summed.
//!
//! burn's composition (a sigmoid, two products) records a graph node for each, and autodiff
//! keeps four `[N, d_ff]` tensors for backward: `g`, `σ(g)`, `silu(g)` and `u`. The op keeps
//! `h` and recomputes `σ(g)` in backward, where the chain rule gives
//! `du = dy·silu(g)` and `dg = (dy·u)·σ(g) + ((dy·u)·g)·σ(g)·(1 − σ(g))`,
//! the two terms burn's autodiff sums for the product and the sigmoid, computed in the same
//! order, so they give the same bits.
//!
//! Backends: [`FusedSwiglu`] defaults to the same formulas on the backend's own tensor ops
//! (bf16 on the CPU), the halves as views and the gradient joined by a concatenation; `Flex`
//! runs f32 in one pass each way (below); the GPUs run lab-kernels' two kernels
//! (`cube/swiglu.rs`); `Autodiff<B>` records the one node (`autodiff.rs`).

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::{backend::Backend, ops::FloatTensor, DType, Tensor};
use rayon::prelude::*;

use crate::flex_tensor::{contiguous, f32_tensor};
use crate::generic::{float, prim};

/// A backend that can gate by SwiGLU.
pub trait FusedSwiglu: Backend {
    /// `silu(g) ⊙ u` of `h = [g | u]` (`[N, 2f]` → `[N, f]`), differentiable on autodiff
    /// backends.
    fn swiglu(h: FloatTensor<Self>) -> FloatTensor<Self> {
        composed::<Self>(h)
    }

    /// `dh = [dg | du]`, `[N, 2f]`, for the upstream gradient `dy [N, f]` (see the module
    /// docs).
    fn swiglu_backward(h: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        composed_backward::<Self>(h, dy)
    }
}

/// The gate and the up projection of `h = [g | u]`, as views.
fn halves<B: Backend>(h: FloatTensor<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let h = float::<B, 2>(h);
    let f = h.dims()[1] / 2;
    (h.clone().narrow(1, 0, f), h.narrow(1, f, f))
}

/// The forward on the backend's tensor ops: burn's `silu(g) * u`.
fn composed<B: Backend>(h: FloatTensor<B>) -> FloatTensor<B> {
    let (g, u) = halves::<B>(h);
    prim(burn::tensor::activation::silu(g) * u)
}

/// The backward on the backend's tensor ops, in burn autodiff's order.
fn composed_backward<B: Backend>(h: FloatTensor<B>, dy: FloatTensor<B>) -> FloatTensor<B> {
    let ((g, u), dy) = (halves::<B>(h), float::<B, 2>(dy));
    let s = burn::tensor::activation::sigmoid(g.clone());
    let d_silu = dy.clone() * u;
    let through_sigmoid = B::sigmoid_backward(prim(s.clone()), prim(d_silu.clone() * g.clone()));
    let dg = d_silu * s.clone() + float::<B, 2>(through_sigmoid);
    let du = dy * (g * s);
    prim(Tensor::cat(vec![dg, du], 1))
}

/// SwiGLU's gating `silu(g) ⊙ u` of the fused gate and up projections `h = [g | u]`,
/// `[N, 2·d_ff]` → `[N, d_ff]` (see the module docs).
pub fn swiglu<B: FusedSwiglu>(h: Tensor<B, 2>) -> Tensor<B, 2> {
    let [_, width] = h.dims();
    assert!(
        width.is_multiple_of(2),
        "swiglu: h has {width} columns, not the gate's and the up projection's 2·d_ff"
    );
    float(B::swiglu(prim(h)))
}

impl FusedSwiglu for Flex {
    fn swiglu(h: FlexTensor) -> FlexTensor {
        let Some([n, f]) = gate_shape(&h) else {
            return composed::<Flex>(h);
        };
        let h = contiguous(h);
        let h = slice(&h);
        let mut y = vec![0f32; n * f];
        par_rows(&mut y, f, |r, y| {
            let (g, u) = h[r * 2 * f..][..2 * f].split_at(f);
            for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
                *y = g * sigmoid(g) * u;
            }
        });
        f32_tensor(y, [n, f])
    }

    fn swiglu_backward(h: FlexTensor, dy: FlexTensor) -> FlexTensor {
        let (Some([n, f]), true) = (gate_shape(&h), is_f32_of(&dy, &h)) else {
            return composed_backward::<Flex>(h, dy);
        };
        let (h, dy) = (contiguous(h), contiguous(dy));
        let (h, dy) = (slice(&h), slice(&dy));
        let mut dh = vec![0f32; n * 2 * f];
        par_rows(&mut dh, 2 * f, |r, dh| {
            let (g, u) = h[r * 2 * f..][..2 * f].split_at(f);
            let dy = &dy[r * f..][..f];
            let (dg, du) = dh.split_at_mut(f);
            for j in 0..f {
                let (g, u, dy) = (g[j], u[j], dy[j]);
                let s = sigmoid(g);
                let d_silu = dy * u;
                // Flex's sigmoid_backward: grad · s · (1 − s), left to right.
                dg[j] = d_silu * s + d_silu * g * s * (1.0 - s);
                du[j] = dy * (g * s);
            }
        });
        f32_tensor(dh, [n, 2 * f])
    }
}

/// `[N, f]` when `h` is a 2-D f32 `[N, 2f]` tensor: the kernels' case (anything else composes
/// tensor ops, which fail as burn's do).
fn gate_shape(h: &FlexTensor) -> Option<[usize; 2]> {
    let shape = h.layout().shape();
    let fits = h.dtype() == DType::F32 && shape.num_dims() == 2 && shape[1].is_multiple_of(2);
    fits.then(|| [shape[0], shape[1] / 2])
}

/// Whether `dy` is the f32 `[N, f]` gradient of the output of `h`'s gating.
fn is_f32_of(dy: &FlexTensor, h: &FlexTensor) -> bool {
    let (s, hs) = (dy.layout().shape(), h.layout().shape());
    dy.dtype() == DType::F32 && s.num_dims() == 2 && s[0] == hs[0] && 2 * s[1] == hs[1]
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

/// `f(row, out_row)` over `out`'s rows of `width` elements, in parallel chunks of whole rows
/// (about [`CHUNK`] elements each).
fn par_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let width = width.max(1); // (no rows to walk when it is 0)
    let rows = (CHUNK / width).max(1);
    out.par_chunks_mut(rows * width)
        .enumerate()
        .for_each(|(k, chunk)| {
            for (i, row) in chunk.chunks_mut(width).enumerate() {
                f(k * rows + i, row);
            }
        });
}
