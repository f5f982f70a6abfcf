//! Causal grouped-query attention as one fused op, where a backend has a kernel for it.
//!
//! The model's own attention (lab-model `attention.rs`) is built from burn's tensor ops and
//! materialises the `[B, heads, T, T]` scores, which autodiff keeps for backward. On the GPU
//! that traffic would eat most of the step, so a backend with a flash kernel (lab-kernels:
//! cubecl, for CUDA and wgpu) says so through [`FusedAttention::has_fused_attention`] and the
//! model calls [`fused_attention`] instead. `Autodiff<B>` records the call as one graph node
//! whose backward is the kernel's backward (see `autodiff.rs`); Fusion passes it through as
//! a custom operation (`cube.rs`). Backends without a kernel (Flex, the CPU default) keep
//! the tensor-op attention, bit for bit as before.
//!
//! Shapes: `q [B, H, T, hd]`, `k, v [B, KV, T, hd]` with `KV` dividing `H`; query head `h`
//! reads key/value head `h / (H / KV)`. Causal: query `i` sees keys `0..=i`. Output
//! `[B, H, T, hd]`; the forward also returns the per-row log-sum-exp `[B, H, T]` (f32) that
//! the backward rebuilds the probabilities from.

use burn::tensor::{backend::Backend, ops::FloatTensor, Tensor, TensorPrimitive};

/// The forward's `(output, log-sum-exp)`.
pub type AttentionForward<B> = (FloatTensor<B>, FloatTensor<B>);
/// The backward's `(d q, d k, d v)`.
pub type AttentionGrads<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

/// A backend that may have a fused causal GQA attention kernel.
pub trait FusedAttention: Backend {
    /// Whether this backend has the kernel. Callers check this first, then call
    /// [`FusedAttention::fused_attention`]; the other methods panic where it is false. The
    /// `_forward`/`_backward` halves belong to the backends that own a kernel (CubeBackend,
    /// Fusion over it): `Autodiff` implements only `fused_attention`, as a graph node that
    /// calls its inner backend's halves.
    fn has_fused_attention() -> bool {
        false
    }

    /// `softmax(scale · q kᵀ, causal) v`, differentiable on autodiff backends.
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        Self::fused_attention_forward(q, k, v, scale).0
    }

    /// The forward with its per-row log-sum-exp.
    fn fused_attention_forward(
        _q: FloatTensor<Self>,
        _k: FloatTensor<Self>,
        _v: FloatTensor<Self>,
        _scale: f32,
    ) -> AttentionForward<Self> {
        no_kernel::<Self>()
    }

    /// Gradients for the upstream gradient `d_out`, from the forward's output and lse.
    #[allow(clippy::too_many_arguments)]
    fn fused_attention_backward(
        _q: FloatTensor<Self>,
        _k: FloatTensor<Self>,
        _v: FloatTensor<Self>,
        _out: FloatTensor<Self>,
        _lse: FloatTensor<Self>,
        _d_out: FloatTensor<Self>,
        _scale: f32,
    ) -> AttentionGrads<Self> {
        no_kernel::<Self>()
    }
}

fn no_kernel<B>() -> ! {
    panic!(
        "{} has no fused attention kernel (check has_fused_attention first)",
        std::any::type_name::<B>()
    )
}

impl FusedAttention for burn::backend::Flex {}

/// The signature the model calls through: [`fused_attention`] for a given backend.
pub type AttentionFn<B> = fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, f32) -> Tensor<B, 4>;

/// `B`'s fused attention, where it has one.
pub fn fused_attention_fn<B: FusedAttention>() -> Option<AttentionFn<B>> {
    B::has_fused_attention().then_some(fused_attention::<B> as AttentionFn<B>)
}

/// Causal GQA attention through the backend's kernel (see the module docs for shapes).
pub fn fused_attention<B: FusedAttention>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    scale: f32,
) -> Tensor<B, 4> {
    let out = B::fused_attention(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
        scale,
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
