//! The token embedding as an op whose backward a backend may replace.
//!
//! The forward is burn's own lookup. The backward, the table's gradient `grad[v] = Σ dy[i]`
//! over the positions `i` whose id is `v`, is burn's `embedding_backward` unless the backend
//! has better: on `CubeBackend` (CUDA, wgpu) lab-kernels' kernel, which gives the same bits
//! with a hundred times the units (`kernels/src/embedding.rs`), and Fusion passes it through as
//! a custom op (`cube/embedding.rs`). `Autodiff<B>` records one node that keeps the table's
//! handle (for its shape) and the ids, as burn's own node does (`autodiff.rs`), so the CPU's
//! gradients are burn's, bit for bit.

use burn::backend::Flex;
use burn::tensor::{
    backend::Backend,
    ops::{FloatTensor, IntTensor},
    Int, Tensor, TensorPrimitive,
};

/// A backend whose embedding's backward may be its own.
pub trait FusedEmbedding: Backend {
    /// Rows `ids [B, T]` of the table `weights [V, d]`: `[B, T, d]`, differentiable w.r.t. the
    /// table on autodiff backends.
    fn embed(weights: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        Self::embedding(weights, ids)
    }

    /// The gradient `[V, d]` of the table `weights` (read for its shape) from `dy [B, T, d]`,
    /// the gradient of the rows at `ids [B, T]`.
    fn embed_grad(
        weights: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        ids: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::embedding_backward(weights, dy, ids)
    }
}

impl FusedEmbedding for Flex {}

/// Rows `ids [B, T]` of `weights [V, d]` as `[B, T, d]`: burn's `module::embedding`, with
/// the backend's own backward.
pub fn embedding<B: FusedEmbedding>(weights: Tensor<B, 2>, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
    let rows = B::embed(weights.into_primitive().tensor(), ids.into_primitive());
    Tensor::from_primitive(TensorPrimitive::Float(rows))
}
