//! The embedding's backward on `CubeBackend` (lab-kernels' kernel) and through Fusion.

use burn::tensor::{
    ops::{FloatTensor, FloatTensorOps, IntTensor, IntTensorOps, ModuleOps},
    DType, Shape,
};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::embedding::embedding_grad;

use super::{custom_op, like};
use crate::FusedEmbedding;

impl<R, F, I, BT> FusedEmbedding for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn embed_grad(
        weights: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        ids: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        // The kernel computes in its storage type: f64 stays with burn's.
        if !matches!(dy.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Self::embedding_backward(weights, dy, ids);
        }
        let vocab = weights.meta.shape()[0];
        let d = dy.meta.shape()[2];
        let n = ids.meta.shape().num_elements();
        let dy = Self::float_reshape(dy, Shape::new([n, d]));
        let ids = Self::int_reshape(ids, Shape::new([n]));
        embedding_grad(dy, ids, vocab)
    }
}

impl<B: FusionBackend + FusedEmbedding> FusedEmbedding for Fusion<B> {
    fn embed_grad(
        weights: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        ids: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let (dtype, _) = like(&dy);
        let out = (dtype, weights.shape.clone());
        let [grad] = custom_op::<B, 1>(
            "lab_embedding_grad",
            vec![weights, dy, ids],
            [out],
            |h, t| {
                let weights = h.get_float_tensor::<B>(&t[0]);
                let dy = h.get_float_tensor::<B>(&t[1]);
                let ids = h.get_int_tensor::<B>(&t[2]);
                vec![B::embed_grad(weights, dy, ids)]
            },
        );
        grad
    }
}
