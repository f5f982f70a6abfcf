//! AdamW on `CubeBackend` (lab-kernels' one-pass kernel) and through Fusion.

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::adamw::{self, Constants};

use super::{custom_op, like};
use crate::adamw::{AdamWStep, AdamWUpdated, FusedAdamW, MomentPair};

/// The step's scalars rounded to f32, as burn's scalar ops round them in the tensor-op form.
fn constants(s: &AdamWStep) -> Constants {
    let betas = [s.beta1, s.beta2];
    Constants::new(s.clip_scale, betas, s.eps, s.lr, s.weight_decay, s.t)
}

impl<R, F, I, BT> FusedAdamW for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn adamw_update(
        param: Self::FloatTensorPrimitive,
        grad: Self::FloatTensorPrimitive,
        moments: Option<MomentPair<Self>>,
        step: &AdamWStep,
    ) -> AdamWUpdated<Self> {
        let u = adamw::update(param, grad, moments, &constants(step));
        (u.param, u.m, u.v)
    }
}

impl<B: FusionBackend + FusedAdamW> FusedAdamW for Fusion<B> {
    fn adamw_update(
        param: Self::FloatTensorPrimitive,
        grad: Self::FloatTensorPrimitive,
        moments: Option<MomentPair<Self>>,
        step: &AdamWStep,
    ) -> AdamWUpdated<Self> {
        let shaped = like(&param);
        let outputs = [shaped.clone(), shaped.clone(), shaped];
        let mut inputs = vec![param, grad];
        inputs.extend(moments.map(|(m, v)| [m, v]).into_iter().flatten());
        let step = *step;
        let [p, m, v] = custom_op::<B, 3>("lab_adamw", inputs, outputs, move |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            let (param, grad) = (get(0), get(1));
            let moments = (t.len() == 4).then(|| (get(2), get(3)));
            let (p, m, v) = B::adamw_update(param, grad, moments, &step);
            vec![p, m, v]
        });
        (p, m, v)
    }
}
