//! RoPE on `CubeBackend` (lab-kernels' one-pass kernel) and through Fusion.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{
    stream::{Operation, OperationStreams},
    Fusion, FusionBackend,
};
use burn_ir::{CustomOpIr, OperationIr, TensorIr};

use super::Handles;
use crate::FusedRope;

impl<R, F, I, BT> FusedRope for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rope(
        x: Self::FloatTensorPrimitive,
        cos: Self::FloatTensorPrimitive,
        sin: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        lab_kernels::rope::rope(x, cos, sin)
    }
}

/// RoPE as a Fusion operation: inputs x, cos, sin; output y.
#[derive(Clone, Debug)]
struct RopeOp<B> {
    desc: CustomOpIr,
    _backend: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + FusedRope> Operation<B::FusionRuntime> for RopeOp<B> {
    fn execute(&self, h: &mut Handles<B>) {
        let ([x, cos, sin], [y]) = self.desc.as_fixed();
        let out = B::rope(
            h.get_float_tensor::<B>(x),
            h.get_float_tensor::<B>(cos),
            h.get_float_tensor::<B>(sin),
        );
        h.register_float_tensor::<B>(&y.id, out);
    }
}

impl<B: FusionBackend + FusedRope> FusedRope for Fusion<B> {
    fn rope(
        x: Self::FloatTensorPrimitive,
        cos: Self::FloatTensorPrimitive,
        sin: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        let client = x.client.clone();
        let streams = OperationStreams::with_inputs([&x, &cos, &sin]);
        let y = TensorIr::uninit(client.create_empty_handle(), x.shape.clone(), x.dtype);
        let inputs = [x.into_ir(), cos.into_ir(), sin.into_ir()];
        let desc = CustomOpIr::new("lab_rope", &inputs, &[y]);
        let op = RopeOp::<B> {
            desc: desc.clone(),
            _backend: Default::default(),
        };
        let [y] = client
            .register(streams, OperationIr::Custom(desc), op)
            .try_into()
            .expect("one output");
        y
    }
}
