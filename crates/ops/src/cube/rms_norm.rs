//! RMSNorm on `CubeBackend` (lab-kernels' kernels) and through Fusion.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::rms_norm::supports;

use super::{custom_op, like};
use crate::rms_norm::{composed, composed_backward};
use crate::{FusedRmsNorm, RmsNormGrads};

impl<R, F, I, BT> FusedRmsNorm for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rms_norm(
        x: Self::FloatTensorPrimitive,
        gain: Self::FloatTensorPrimitive,
        eps: f64,
    ) -> Self::FloatTensorPrimitive {
        if kernels_take(&[x.dtype, gain.dtype]) {
            lab_kernels::rms_norm::forward(x, gain, eps)
        } else {
            composed::<Self>(x, gain, eps)
        }
    }

    fn rms_norm_backward(
        x: Self::FloatTensorPrimitive,
        gain: Self::FloatTensorPrimitive,
        eps: f64,
        dy: Self::FloatTensorPrimitive,
    ) -> RmsNormGrads<Self> {
        if kernels_take(&[x.dtype, gain.dtype, dy.dtype]) {
            lab_kernels::rms_norm::backward(x, gain, eps, dy)
        } else {
            composed_backward::<Self>(x, gain, eps, dy)
        }
    }
}

/// Whether the kernels take these operands: f32, f16 or bf16, else the composition runs.
/// Operands of mixed dtypes are a bug in the caller: the GPU backends' binary ops read the
/// right-hand operand as the left's dtype, so the composition would misread them too (the
/// model never mixes them: the residual stream and the gains are fp32 in both precisions).
fn kernels_take(dtypes: &[burn::tensor::DType]) -> bool {
    assert!(
        dtypes.iter().all(|&d| d == dtypes[0]),
        "rms_norm: operands of one dtype expected, got {dtypes:?}"
    );
    supports(dtypes[0])
}

impl<B: FusionBackend + FusedRmsNorm> FusedRmsNorm for Fusion<B> {
    fn rms_norm(
        x: Self::FloatTensorPrimitive,
        gain: Self::FloatTensorPrimitive,
        eps: f64,
    ) -> Self::FloatTensorPrimitive {
        if !kernels_take(&[x.dtype, gain.dtype]) {
            return composed::<Self>(x, gain, eps);
        }
        let y = like(&x);
        let [y] = custom_op::<B, 1>("lab_rms_norm", vec![x, gain], [y], move |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            vec![B::rms_norm(get(0), get(1), eps)]
        });
        y
    }

    fn rms_norm_backward(
        x: Self::FloatTensorPrimitive,
        gain: Self::FloatTensorPrimitive,
        eps: f64,
        dy: Self::FloatTensorPrimitive,
    ) -> RmsNormGrads<Self> {
        if !kernels_take(&[x.dtype, gain.dtype, dy.dtype]) {
            return composed_backward::<Self>(x, gain, eps, dy);
        }
        let outputs = [like(&x), like(&gain)];
        let [dx, dg] = custom_op::<B, 2>(
            "lab_rms_norm_backward",
            vec![x, gain, dy],
            outputs,
            move |h, t| {
                let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
                let (x, gain, dy) = (get(0), get(1), get(2));
                let (dx, dg) = B::rms_norm_backward(x, gain, eps, dy);
                vec![dx, dg]
            },
        );
        (dx, dg)
    }
}
