//! Backend-generic chunked forward and backward, built from burn's ordinary tensor ops.
//!
//! Notation: N rows (tokens), d model width, V vocabulary, c = rows in the current chunk.
//! Per chunk the forward does one `[c, d] @ [d, V]` matmul (2·c·d·V FLOPs) and a few
//! elementwise passes over `[c, V]`; backward does that matmul again plus two more of the same
//! size. Every `[c, V]` temporary dies before the next chunk starts.

//!
//! Mixed precision: `hidden` and `weight` may be bf16 (any dtype, the same for both). The
//! matmuls then run in that dtype; each chunk's logits are widened to fp32 before the softmax,
//! and the weight gradient is summed over chunks in fp32, then returned in the weight's dtype.

use burn::tensor::{
    backend::Backend,
    ops::{FloatTensor, IntTensor},
    FloatDType, IndexingUpdateOp, Int, Tensor, TensorPrimitive,
};

use crate::cast_to;

pub(crate) fn float<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

pub(crate) fn prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// Row ranges `[start, end)` of at most `chunk_rows` rows covering `0..n`.
pub(crate) fn chunks(n: usize, chunk_rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(chunk_rows)
        .map(move |s| (s, (s + chunk_rows).min(n)))
}

/// Per row: `(logsumexp(logits[i]), logits[i, target[i]])`, both `[N]`, a chunk of rows at a
/// time.
pub(crate) fn lse_and_picked<B: Backend>(
    hidden: &Tensor<B, 2>,
    weight: &Tensor<B, 2>,
    targets: &Tensor<B, 1, Int>,
    chunk_rows: usize,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let n = hidden.dims()[0];
    let mut lse_parts = Vec::new(); // per chunk [c, 1]
    let mut picked_parts = Vec::new(); // per chunk [c, 1]: logits[i, target[i]]
    for (s, e) in chunks(n, chunk_rows) {
        let c = e - s;
        let logits = hidden.clone().slice(s..e).matmul(weight.clone()); // [c, V]
        let logits = cast_to(logits, FloatDType::F32);
        let max = logits.clone().max_dim(1); // [c, 1], shift so exp never overflows
        let sum = (logits.clone() - max.clone()).exp().sum_dim(1); // [c, 1]
        lse_parts.push(sum.log() + max);
        let t = targets.clone().slice(s..e).reshape([c, 1]);
        picked_parts.push(logits.gather(1, t));
    }
    (
        Tensor::cat(lse_parts, 0).reshape([n]),
        Tensor::cat(picked_parts, 0).reshape([n]),
    )
}

pub(crate) fn forward<B: Backend>(
    hidden: FloatTensor<B>,
    weight: FloatTensor<B>,
    targets: IntTensor<B>,
    chunk_rows: usize,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let (lse, picked) = lse_and_picked(&float(hidden), &float(weight), &targets, chunk_rows);
    let loss = (lse.clone() - picked).mean(); // [1]
    (prim(loss), prim(lse))
}

pub(crate) fn backward<B: Backend>(
    hidden: FloatTensor<B>,
    weight: FloatTensor<B>,
    targets: IntTensor<B>,
    lse: FloatTensor<B>,
    grad_loss: FloatTensor<B>,
    chunk_rows: usize,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let hidden: Tensor<B, 2> = float(hidden);
    let weight: Tensor<B, 2> = float(weight);
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let lse: Tensor<B, 1> = float(lse);
    let [n, _d] = hidden.dims();
    let device = hidden.device();
    let dtype: FloatDType = hidden.dtype().into();

    // d loss / d logits[i, j] = (softmax[i, j] - [j == target[i]]) * grad_loss / N.
    // The scale stays a device tensor: no host round trip on GPU backends.
    let scale = float::<B, 1>(grad_loss).reshape([1, 1]) / (n as f64); // [1, 1]
    let weight_t = weight.clone().transpose(); // [V, d] view

    let mut grad_hidden_parts = Vec::new(); // per chunk [c, d]
    let mut grad_weight: Option<Tensor<B, 2>> = None; // [d, V], summed over chunks in order
    for (s, e) in chunks(n, chunk_rows) {
        let c = e - s;
        let h = hidden.clone().slice(s..e); // [c, d]
        let logits = cast_to(h.clone().matmul(weight.clone()), FloatDType::F32); // [c, V], recomputed
        let lse_c = lse.clone().slice(s..e).reshape([c, 1]);
        let softmax = (logits - lse_c).exp(); // [c, V]
        let t = targets.clone().slice(s..e).reshape([c, 1]);
        let minus_one = Tensor::<B, 2>::full([c, 1], -1.0, &device);
        let g = softmax.scatter(1, t, minus_one, IndexingUpdateOp::Add) * scale.clone(); // [c, V]
        let g = cast_to(g, dtype);
        grad_hidden_parts.push(g.clone().matmul(weight_t.clone())); // [c, d]
        let gw = cast_to(h.transpose().matmul(g), FloatDType::F32); // [d, V]
        grad_weight = Some(match grad_weight {
            None => gw,
            Some(acc) => acc + gw,
        });
    }
    let grad_hidden = Tensor::cat(grad_hidden_parts, 0);
    let grad_weight = cast_to(grad_weight.expect("at least one chunk"), dtype);
    (prim(grad_hidden), prim(grad_weight))
}
