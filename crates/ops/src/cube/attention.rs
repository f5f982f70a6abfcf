//! Fused attention on `CubeBackend` (lab-kernels' flash attention) and through Fusion.

use burn::tensor::{DType, Shape};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::attention;

use super::{custom_op, like};
use crate::attention::{AttentionForward, AttentionGrads, FusedAttention};

impl<R, F, I, BT> FusedAttention for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn has_fused_attention() -> bool {
        true
    }

    fn fused_attention_forward(
        q: Self::FloatTensorPrimitive,
        k: Self::FloatTensorPrimitive,
        v: Self::FloatTensorPrimitive,
        scale: f32,
    ) -> AttentionForward<Self> {
        let f = attention::forward(q, k, v, scale);
        (f.out, f.lse)
    }

    fn fused_attention_backward(
        q: Self::FloatTensorPrimitive,
        k: Self::FloatTensorPrimitive,
        v: Self::FloatTensorPrimitive,
        out: Self::FloatTensorPrimitive,
        lse: Self::FloatTensorPrimitive,
        d_out: Self::FloatTensorPrimitive,
        scale: f32,
    ) -> AttentionGrads<Self> {
        let g = attention::backward(q, k, v, out, lse, d_out, scale);
        (g.q, g.k, g.v)
    }
}

impl<B: FusionBackend + FusedAttention> FusedAttention for Fusion<B> {
    fn has_fused_attention() -> bool {
        B::has_fused_attention()
    }

    fn fused_attention_forward(
        q: Self::FloatTensorPrimitive,
        k: Self::FloatTensorPrimitive,
        v: Self::FloatTensorPrimitive,
        scale: f32,
    ) -> AttentionForward<Self> {
        // The log-sum-exp is one fp32 value per query row.
        let lse = (DType::F32, Shape::new([q.shape[0], q.shape[1], q.shape[2]]));
        let outputs = [like(&q), lse];
        let name = "lab_fused_attention_forward";
        let [out, lse] = custom_op::<B, 2>(name, vec![q, k, v], outputs, move |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            let (out, lse) = B::fused_attention_forward(get(0), get(1), get(2), scale);
            vec![out, lse]
        });
        (out, lse)
    }

    fn fused_attention_backward(
        q: Self::FloatTensorPrimitive,
        k: Self::FloatTensorPrimitive,
        v: Self::FloatTensorPrimitive,
        out: Self::FloatTensorPrimitive,
        lse: Self::FloatTensorPrimitive,
        d_out: Self::FloatTensorPrimitive,
        scale: f32,
    ) -> AttentionGrads<Self> {
        let outputs = [like(&q), like(&k), like(&v)];
        let inputs = vec![q, k, v, out, lse, d_out];
        let name = "lab_fused_attention_backward";
        let [dq, dk, dv] = custom_op::<B, 3>(name, inputs, outputs, move |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            let (q, k, v) = (get(0), get(1), get(2));
            let (out, lse, d_out) = (get(3), get(4), get(5));
            let (dq, dk, dv) = B::fused_attention_backward(q, k, v, out, lse, d_out, scale);
            vec![dq, dk, dv]
        });
        (dq, dk, dv)
    }
}
