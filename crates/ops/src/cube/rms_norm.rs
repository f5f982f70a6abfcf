//! RMSNorm on `CubeBackend` (lab-kernels' kernels) and through Fusion.

use burn::tensor::{DType, FloatDType};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::rms_norm::supports;

use super::{custom_op, like};
use crate::rms_norm::{composed_backward, composed_to, plus_skip};
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
        dtype: FloatDType,
    ) -> Self::FloatTensorPrimitive {
        if supports(one_dtype(&[x.dtype, gain.dtype])) && supports(dtype.into()) {
            lab_kernels::rms_norm::forward(x, gain, eps, dtype.into())
        } else {
            composed_to::<Self>(x, gain, eps, dtype)
        }
    }

    fn rms_norm_backward(
        x: Self::FloatTensorPrimitive,
        gain: Self::FloatTensorPrimitive,
        eps: f64,
        dy: Self::FloatTensorPrimitive,
        skip: Option<Self::FloatTensorPrimitive>,
    ) -> RmsNormGrads<Self> {
        let dtype = one_dtype(&[x.dtype, gain.dtype]);
        if !(supports(dtype) && supports(dy.dtype)) {
            let (dx, dg) = composed_backward::<Self>(x, gain, eps, dy);
            return (plus_skip::<Self>(dx, skip), dg);
        }
        // A skip gradient the kernel cannot take (never the model's) is added after it.
        let (in_kernel, after) = match skip {
            Some(s) if s.dtype != dtype || s.meta.shape() != x.meta.shape() => (None, Some(s)),
            skip => (skip, None),
        };
        let (dx, dg) = lab_kernels::rms_norm::backward(x, gain, eps, dy, in_kernel);
        (plus_skip::<Self>(dx, after), dg)
    }
}

/// `x`'s and the gain's one dtype. Mixed dtypes are a bug in the caller: the GPU backends'
/// binary ops read the right-hand operand as the left's dtype, so the composition would
/// misread them too (the model never mixes them: the residual stream and the gains are fp32 in
/// both precisions). The output, and so `dy`, may be of another dtype.
fn one_dtype(dtypes: &[DType]) -> DType {
    assert!(
        dtypes.iter().all(|&d| d == dtypes[0]),
        "rms_norm: operands of one dtype expected, got {dtypes:?}"
    );
    dtypes[0]
}

/// Fusion records the op; the inner backend picks the kernels or the composition when it runs.
impl<B: FusionBackend + FusedRmsNorm> FusedRmsNorm for Fusion<B> {
    fn rms_norm(
        x: Self::FloatTensorPrimitive,
        gain: Self::FloatTensorPrimitive,
        eps: f64,
        dtype: FloatDType,
    ) -> Self::FloatTensorPrimitive {
        one_dtype(&[x.dtype, gain.dtype]);
        let y = (dtype.into(), x.shape.clone());
        let [y] = custom_op::<B, 1>("lab_rms_norm", vec![x, gain], [y], move |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            vec![B::rms_norm(get(0), get(1), eps, dtype)]
        });
        y
    }

    fn rms_norm_backward(
        x: Self::FloatTensorPrimitive,
        gain: Self::FloatTensorPrimitive,
        eps: f64,
        dy: Self::FloatTensorPrimitive,
        skip: Option<Self::FloatTensorPrimitive>,
    ) -> RmsNormGrads<Self> {
        one_dtype(&[x.dtype, gain.dtype]);
        let outputs = [like(&x), like(&gain)];
        let mut inputs = vec![x, gain, dy];
        inputs.extend(skip);
        let [dx, dg] = custom_op::<B, 2>("lab_rms_norm_backward", inputs, outputs, move |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            let (x, gain, dy) = (get(0), get(1), get(2));
            let skip = (t.len() == 4).then(|| get(3));
            let (dx, dg) = B::rms_norm_backward(x, gain, eps, dy, skip);
            vec![dx, dg]
        });
        (dx, dg)
    }
}
