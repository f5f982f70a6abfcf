//! One AdamW update of one flat parameter, as a backend op.
//!
//! Written with burn's tensor ops, every line of the update is its own op and its own fresh
//! `[n]` tensor: about a dozen passes over memory per parameter and a dozen allocations of
//! its size. On the CPU that is most of the optimizer's time (the tiny config's 13.65M
//! parameters: ~60 ms of a ~540 ms step at 2 threads), so [`FusedAdamW`] lets a backend do
//! the whole update in one pass. The default is the tensor-op form (any backend gets it by an
//! empty `impl`); `Flex` overrides it with one loop over the four buffers (`adamw_flex.rs`)
//! that rounds every intermediate exactly as the tensor ops do, so results stay bit-identical;
//! the GPU backends run lab-kernels' one-pass kernel (`cube/adamw.rs`), which may round
//! differently (the GPU compilers contract `a·b + c` into fused multiply-adds).

use burn::tensor::{
    backend::Backend, ops::FloatTensor, Shape, Tensor, TensorMetadata, TensorPrimitive,
};

/// The numbers of one update of one parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// Global-norm clipping factor the gradient is multiplied by first (1 when not clipped).
    pub clip_scale: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub lr: f64,
    /// This parameter's decoupled weight decay (0 for the norm gains).
    pub weight_decay: f64,
    /// This parameter's update count including this one (`t` of the bias correction, from 1).
    pub t: u64,
}

impl AdamWStep {
    /// `(1 - β1ᵗ, 1 - β2ᵗ)`.
    pub fn bias_corrections(&self) -> (f64, f64) {
        (
            1.0 - self.beta1.powi(self.t as i32),
            1.0 - self.beta2.powi(self.t as i32),
        )
    }
}

/// The moments `(m, v)` of one parameter, flat.
pub type MomentPair<B> = (FloatTensor<B>, FloatTensor<B>);

/// One update's results: the new `(param, m, v)`.
pub type AdamWUpdated<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

/// A backend that can apply one AdamW update to a flat parameter.
pub trait FusedAdamW: Backend {
    /// `g ← s·g; m ← β1·m + (1-β1)·g; v ← β2·v + (1-β2)·g²;
    /// p ← p·(1 - lr·wd) - lr · (m / (1-β1ᵗ)) / (sqrt(v / (1-β2ᵗ)) + ε)`.
    ///
    /// `param` and the moments are `[n]`; `grad` holds the same `n` elements in the parameter's
    /// own shape, at any strides (a backend may read a view into a wider gradient without
    /// copying it, as the GPU kernel reads a matrix). `moments` is `None` on a parameter's
    /// first update (they start at zero). Returns the new `(param, m, v)`.
    fn adamw_update(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<MomentPair<Self>>,
        step: &AdamWStep,
    ) -> AdamWUpdated<Self> {
        tensor_ops_update::<Self>(param, grad, moments, step)
    }
}

/// The update as burn tensor ops, one op per line of the formula: the reference that the
/// CPU's fused form equals bit for bit (the GPU kernel follows its order of operations, but
/// the GPU compilers may contract `a·b + c` into one rounding).
pub fn tensor_ops_update<B: Backend>(
    param: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<MomentPair<B>>,
    s: &AdamWStep,
) -> AdamWUpdated<B> {
    let wrap = |x| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x));
    let n = param.shape().num_elements();
    let g = wrap(B::float_reshape(grad, Shape::new([n]))) * s.clip_scale;
    let (m, v) = match moments {
        Some((m, v)) => (
            wrap(m) * s.beta1 + g.clone() * (1.0 - s.beta1),
            wrap(v) * s.beta2 + g.square() * (1.0 - s.beta2),
        ),
        // First update: the moments start at zero.
        None => (g.clone() * (1.0 - s.beta1), g.square() * (1.0 - s.beta2)),
    };
    let (bias1, bias2) = s.bias_corrections();
    let update = (m.clone() / bias1) / ((v.clone() / bias2).sqrt() + s.eps);
    let p = wrap(param) * (1.0 - s.lr * s.weight_decay) - update * s.lr;
    let unwrap = |t: Tensor<B, 1>| t.into_primitive().tensor();
    (unwrap(p), unwrap(m), unwrap(v))
}
