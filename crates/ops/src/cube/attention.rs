//! Fused attention on `CubeBackend` (lab-kernels' flash attention) and through Fusion.

use burn::tensor::{DType, Shape};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{
    stream::{Operation, OperationStreams},
    Fusion, FusionBackend,
};
use burn_ir::{CustomOpIr, OperationIr, TensorIr};
use lab_kernels::attention;

use super::Handles;
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

/// The forward as a Fusion operation: inputs q, k, v; outputs out, lse.
#[derive(Clone, Debug)]
struct ForwardOp<B> {
    desc: CustomOpIr,
    scale: f32,
    _backend: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + FusedAttention> Operation<B::FusionRuntime> for ForwardOp<B> {
    fn execute(&self, h: &mut Handles<B>) {
        let ([q, k, v], [out, lse]) = self.desc.as_fixed();
        let (o, l) = B::fused_attention_forward(
            h.get_float_tensor::<B>(q),
            h.get_float_tensor::<B>(k),
            h.get_float_tensor::<B>(v),
            self.scale,
        );
        h.register_float_tensor::<B>(&out.id, o);
        h.register_float_tensor::<B>(&lse.id, l);
    }
}

/// The backward as a Fusion operation: inputs q, k, v, out, lse, d_out; outputs dq, dk, dv.
#[derive(Clone, Debug)]
struct BackwardOp<B> {
    desc: CustomOpIr,
    scale: f32,
    _backend: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + FusedAttention> Operation<B::FusionRuntime> for BackwardOp<B> {
    fn execute(&self, h: &mut Handles<B>) {
        let ([q, k, v, out, lse, d_out], [dq, dk, dv]) = self.desc.as_fixed();
        let get = |h: &mut Handles<B>, t| h.get_float_tensor::<B>(t);
        let (q, k, v) = (get(h, q), get(h, k), get(h, v));
        let (out, lse, d_out) = (get(h, out), get(h, lse), get(h, d_out));
        let (gq, gk, gv) = B::fused_attention_backward(q, k, v, out, lse, d_out, self.scale);
        h.register_float_tensor::<B>(&dq.id, gq);
        h.register_float_tensor::<B>(&dk.id, gk);
        h.register_float_tensor::<B>(&dv.id, gv);
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
        let client = q.client.clone();
        let streams = OperationStreams::with_inputs([&q, &k, &v]);
        let lse_shape = Shape::new([q.shape[0], q.shape[1], q.shape[2]]);
        let out = TensorIr::uninit(client.create_empty_handle(), q.shape.clone(), q.dtype);
        let lse = TensorIr::uninit(client.create_empty_handle(), lse_shape, DType::F32);
        let inputs = [q.into_ir(), k.into_ir(), v.into_ir()];
        let desc = CustomOpIr::new("lab_fused_attention_forward", &inputs, &[out, lse]);
        let op = ForwardOp::<B> {
            desc: desc.clone(),
            scale,
            _backend: Default::default(),
        };
        let [out, lse] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .expect("two outputs");
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
        let client = q.client.clone();
        let streams = OperationStreams::with_inputs([&q, &k, &v, &out, &lse, &d_out]);
        let like = |t: &Self::FloatTensorPrimitive| {
            TensorIr::uninit(client.create_empty_handle(), t.shape.clone(), t.dtype)
        };
        let grads = [like(&q), like(&k), like(&v)];
        let inputs = [q, k, v, out, lse, d_out].map(|t| t.into_ir());
        let desc = CustomOpIr::new("lab_fused_attention_backward", &inputs, &grads);
        let op = BackwardOp::<B> {
            desc: desc.clone(),
            scale,
            _backend: Default::default(),
        };
        let [dq, dk, dv] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .expect("three outputs");
        (dq, dk, dv)
    }
}
