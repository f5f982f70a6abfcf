//! RMSNorm as one op: `y = x / r ⊙ g`, `r = sqrt(mean(x²) + eps)` per row of `x: [N, d]`.
//!
//! burn's composition (a square, a mean, `+ eps`, a sqrt, a division, a product) records a
//! node for each, and autodiff keeps `x` and `x / r` (`[N, d]`, fp32 in the residual stream) plus
//! per-row values. The op keeps `x` (and the gain, a parameter kept anyway) and recomputes
//! `r` in backward, one pass over `x`. With `q = x / r` and `gy = dy ⊙ g`:
//!
//! `dg = Σ_rows dy ⊙ q` and `dx = (gy − q · mean(gy ⊙ q)) / r`,
//!
//! the derivative of the whole norm at once, in place of the chain rule through six nodes.
//! On the CPU the forward is burn's composition itself, so evaluation and generation keep
//! their bits there.
//! Training's bits change: `x`'s gradient sums in another order (see BENCHMARKS.md).
//!
//! Backends: [`FusedRmsNorm`] defaults to these formulas on the backend's own tensor ops;
//! the GPU backends run lab-kernels' kernels instead (a pass over the rows each way and one
//! over the columns for `dg`; their sums run in another order than the composition's);
//! `Autodiff<B>` records the one node (`autodiff.rs`).
//!
//! The output may be stored in another dtype than `x` ([`rms_norm_to`]): under bf16 the
//! residual stream is fp32 and the projections read bf16, so the cast between them is part of
//! the op (one kernel on the GPUs, with the same bits as the cast after it), and its backward
//! takes `dy` in that dtype.
//!
//! In training the norm's input is the residual stream, whose gradient also arrives by the
//! skip connection around the block. autodiff's node adds that gradient as the norm's backward
//! writes `dx` (`skip` of [`FusedRmsNorm::rms_norm_backward`]), where burn would add it in a pass
//! of its own.

use burn::tensor::{backend::Backend, ops::FloatTensor, FloatDType, Tensor};

use crate::cast_to;
use crate::generic::{float, prim};

/// `(dx, dg)`: RMSNorm's gradients.
pub type RmsNormGrads<B> = (FloatTensor<B>, FloatTensor<B>);

/// A backend that can normalise by the root mean square.
pub trait FusedRmsNorm: Backend {
    /// `x / sqrt(mean(x², row) + eps) ⊙ gain` for `x: [N, d]`, `gain: [d]`, stored as
    /// `dtype`, differentiable on autodiff backends.
    fn rms_norm(
        x: FloatTensor<Self>,
        gain: FloatTensor<Self>,
        eps: f64,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        composed_to::<Self>(x, gain, eps, dtype)
    }

    /// `(dx, dg)` for the upstream gradient `dy` (of the forward's output dtype), typed as
    /// `x` and `gain` (see the module docs).
    ///
    /// With `skip` (shaped and typed as `x`), `dx + skip` in place of `dx`. `skip` is the
    /// gradient that already reached `x` by the residual stream's skip connection; autodiff
    /// would add it in a pass of its own (read both, write the sum). The default is that add;
    /// the GPU backends add it as they write `dx`, in f32 and rounded once: the add's bits
    /// where `x` is f32 (the residual stream is, in both precisions); an f16 or bf16 `x` would
    /// round once where the add rounds twice.
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        gain: FloatTensor<Self>,
        eps: f64,
        dy: FloatTensor<Self>,
        skip: Option<FloatTensor<Self>>,
    ) -> RmsNormGrads<Self> {
        let (dx, dg) = composed_backward::<Self>(x, gain, eps, dy);
        (plus_skip::<Self>(dx, skip), dg)
    }
}

/// `dx + skip` in autodiff's own order (the new gradient, then the one registered before
/// it), or `dx` where there is no skip.
pub(crate) fn plus_skip<B: Backend>(
    dx: FloatTensor<B>,
    skip: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    match skip {
        Some(skip) => B::float_add(dx, skip),
        None => dx,
    }
}

/// The forward as the backend's own tensor ops, in `x`'s dtype.
fn composed<B: Backend>(x: FloatTensor<B>, gain: FloatTensor<B>, eps: f64) -> FloatTensor<B> {
    let (x, gain) = (float::<B, 2>(x), float::<B, 1>(gain));
    prim(x.clone() / rms(x, eps) * gain.unsqueeze::<2>())
}

/// [`composed`] cast to `dtype` (no cast where it is `x`'s): the default, and the GPU
/// backends' path for a dtype their kernels do not take (f64).
pub(crate) fn composed_to<B: Backend>(
    x: FloatTensor<B>,
    gain: FloatTensor<B>,
    eps: f64,
    dtype: FloatDType,
) -> FloatTensor<B> {
    prim(cast_to(float::<B, 2>(composed::<B>(x, gain, eps)), dtype))
}

/// The backward as the backend's own tensor ops (see [`composed`]); `dy` is first widened to
/// `x`'s dtype, as the backward of a cast after the norm would.
pub(crate) fn composed_backward<B: Backend>(
    x: FloatTensor<B>,
    gain: FloatTensor<B>,
    eps: f64,
    dy: FloatTensor<B>,
) -> RmsNormGrads<B> {
    let (x, gain, dy) = (float::<B, 2>(x), float::<B, 1>(gain), float::<B, 2>(dy));
    let dy = cast_to(dy, x.dtype().into());
    let r = rms(x.clone(), eps);
    let q = x / r.clone();
    let dg = (dy.clone() * q.clone()).sum_dim(0).squeeze_dim::<1>(0);
    let gy = dy * gain.unsqueeze::<2>();
    let along = (gy.clone() * q.clone()).mean_dim(1);
    let dx = (gy - q * along) / r;
    (prim(dx), prim(dg))
}

/// `sqrt(mean(x², row) + eps)`, `[N, 1]`: the composition's own expression.
fn rms<B: Backend>(x: Tensor<B, 2>, eps: f64) -> Tensor<B, 2> {
    (x.square().mean_dim(1) + eps).sqrt()
}

/// RMSNorm of the rows of `x: [N, d]` with the gain `gain: [d]` (see the module docs).
pub fn rms_norm<B: FusedRmsNorm>(x: Tensor<B, 2>, gain: Tensor<B, 1>, eps: f64) -> Tensor<B, 2> {
    let dtype = x.dtype().into();
    rms_norm_to(x, gain, eps, dtype)
}

/// [`rms_norm`] stored as `dtype`: `cast_to(rms_norm(x, gain, eps), dtype)` as one op.
pub fn rms_norm_to<B: FusedRmsNorm>(
    x: Tensor<B, 2>,
    gain: Tensor<B, 1>,
    eps: f64,
    dtype: FloatDType,
) -> Tensor<B, 2> {
    assert_eq!(
        x.dims()[1],
        gain.dims()[0],
        "rms_norm: x's width differs from the gain's length"
    );
    float(B::rms_norm(prim(x), prim(gain), eps, dtype))
}

impl FusedRmsNorm for burn::backend::flex::Flex {}
