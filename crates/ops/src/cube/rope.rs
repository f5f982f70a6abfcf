//! RoPE on `CubeBackend` (lab-kernels' one-pass kernel) and through Fusion.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::{custom_op, like};
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

    fn rope_transposed(
        dy: Self::FloatTensorPrimitive,
        cos: Self::FloatTensorPrimitive,
        sin: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        lab_kernels::rope::rope_transposed(dy, cos, sin)
    }
}

impl<B: FusionBackend + FusedRope> FusedRope for Fusion<B> {
    fn rope(
        x: Self::FloatTensorPrimitive,
        cos: Self::FloatTensorPrimitive,
        sin: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        let y = like(&x);
        let [y] = custom_op::<B, 1>("lab_rope", vec![x, cos, sin], [y], |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            vec![B::rope(get(0), get(1), get(2))]
        });
        y
    }

    fn rope_transposed(
        dy: Self::FloatTensorPrimitive,
        cos: Self::FloatTensorPrimitive,
        sin: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        let dx = like(&dy);
        let inputs = vec![dy, cos, sin];
        let [dx] = custom_op::<B, 1>("lab_rope_transposed", inputs, [dx], |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            vec![B::rope_transposed(get(0), get(1), get(2))]
        });
        dx
    }
}
