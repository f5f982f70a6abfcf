//! SwiGLU's gating on `CubeBackend` (lab-kernels' two kernels on the fused gate-up product)
//! and through Fusion.

use burn::tensor::Shape;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::{custom_op, like};
use crate::FusedSwiglu;

impl<R, F, I, BT> FusedSwiglu for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn swiglu(h: Self::FloatTensorPrimitive) -> Self::FloatTensorPrimitive {
        lab_kernels::swiglu::swiglu(h)
    }

    fn swiglu_backward(
        h: Self::FloatTensorPrimitive,
        dy: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        lab_kernels::swiglu::swiglu_backward(h, dy)
    }
}

impl<B: FusionBackend + FusedSwiglu> FusedSwiglu for Fusion<B> {
    fn swiglu(h: Self::FloatTensorPrimitive) -> Self::FloatTensorPrimitive {
        let (dtype, shape) = like(&h);
        let y = (dtype, Shape::from(vec![shape[0], shape[1] / 2]));
        let [y] = custom_op::<B, 1>("lab_swiglu", vec![h], [y], |handles, t| {
            vec![B::swiglu(handles.get_float_tensor::<B>(&t[0]))]
        });
        y
    }

    fn swiglu_backward(
        h: Self::FloatTensorPrimitive,
        dy: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        let dh = like(&h);
        let [dh] = custom_op::<B, 1>("lab_swiglu_backward", vec![h, dy], [dh], |handles, t| {
            let mut get = |i: usize| handles.get_float_tensor::<B>(&t[i]);
            vec![B::swiglu_backward(get(0), get(1))]
        });
        dh
    }
}
