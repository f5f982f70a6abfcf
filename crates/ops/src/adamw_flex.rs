//! AdamW on `Flex` in one pass over the parameter, its gradient and its moments.
//!
//! Bit-identical to [`tensor_ops_update`] on Flex: Flex's scalar ops turn each f64 scalar into
//! f32 with `as` and apply one IEEE f32 operation per element; this loop does the same
//! operations on the same f32 constants in the same order (Rust never contracts `a * b + c`
//! into an FMA on its own, and `sqrt` is correctly rounded everywhere). Elements are
//! independent, so splitting them over threads changes nothing.
//!
//! The parameter and moments are updated in place when the tensor owns its buffer (it does
//! after backward has dropped the graph); a shared buffer is copied first (Flex's
//! copy-on-write), so a caller's other handle never sees the update. A gradient that is a
//! strided view (the gate's and up's halves of the joined product's) is copied contiguous
//! first.

use std::ops::Range;

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use crate::adamw::{tensor_ops_update, AdamWStep, AdamWUpdated, FusedAdamW, MomentPair};
use crate::flex_tensor::contiguous;

/// Elements per task: large enough that scheduling is noise, small enough to spread 1-D
/// gains and small projections over both threads.
const CHUNK: usize = 1 << 15;

impl FusedAdamW for Flex {
    fn adamw_update(
        param: FlexTensor,
        grad: FlexTensor,
        moments: Option<MomentPair<Flex>>,
        step: &AdamWStep,
    ) -> AdamWUpdated<Flex> {
        let mut inputs = vec![&param, &grad];
        if let Some((m, v)) = &moments {
            inputs.extend([m, v]);
        }
        if inputs.iter().any(|t| t.dtype() != DType::F32) {
            return tensor_ops_update::<Flex>(param, grad, moments, step);
        }
        let (mut param, grad) = (contiguous(param), contiguous(grad));
        let n = elements(&param).len();
        assert_eq!(elements(&grad).len(), n, "adamw_update: gradient size");
        let first = moments.is_none();
        let (mut m, mut v) = match moments {
            Some((m, v)) => (contiguous(m), contiguous(v)),
            None => {
                let zeros = || FlexTensor::zeros(Shape::new([n]), DType::F32);
                (zeros(), zeros())
            }
        };
        let k = Constants::of(step);
        let g = &grad.storage::<f32>()[elements(&grad)];
        let (rp, rm, rv) = (elements(&param), elements(&m), elements(&v));
        let p_buf = &mut param.storage_mut::<f32>()[rp];
        let m_buf = &mut m.storage_mut::<f32>()[rm];
        let v_buf = &mut v.storage_mut::<f32>()[rv];
        assert!(
            m_buf.len() == n && v_buf.len() == n,
            "adamw_update: moment size"
        );
        p_buf
            .par_chunks_mut(CHUNK)
            .zip(m_buf.par_chunks_mut(CHUNK))
            .zip(v_buf.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|(((p, m), v), g)| k.update(p, m, v, g, first));
        (param, m, v)
    }
}

/// The step's scalars as f32, converted exactly as Flex converts a scalar operand.
struct Constants {
    clip_scale: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias1: f32,
    bias2: f32,
    eps: f32,
    keep: f32,
    lr: f32,
}

impl Constants {
    fn of(s: &AdamWStep) -> Self {
        let (bias1, bias2) = s.bias_corrections();
        Self {
            clip_scale: s.clip_scale as f32,
            beta1: s.beta1 as f32,
            one_minus_beta1: (1.0 - s.beta1) as f32,
            beta2: s.beta2 as f32,
            one_minus_beta2: (1.0 - s.beta2) as f32,
            bias1: bias1 as f32,
            bias2: bias2 as f32,
            eps: s.eps as f32,
            keep: (1.0 - s.lr * s.weight_decay) as f32,
            lr: s.lr as f32,
        }
    }

    /// One slice of the update, operation for operation as `tensor_ops_update`.
    fn update(&self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], first: bool) {
        for i in 0..p.len() {
            let gi = g[i] * self.clip_scale;
            let (mi, vi) = if first {
                (gi * self.one_minus_beta1, (gi * gi) * self.one_minus_beta2)
            } else {
                (
                    m[i] * self.beta1 + gi * self.one_minus_beta1,
                    v[i] * self.beta2 + (gi * gi) * self.one_minus_beta2,
                )
            };
            let update = (mi / self.bias1) / ((vi / self.bias2).sqrt() + self.eps);
            p[i] = p[i] * self.keep - update * self.lr;
            m[i] = mi;
            v[i] = vi;
        }
    }
}

/// Where a contiguous tensor's elements lie in its buffer.
fn elements(t: &FlexTensor) -> Range<usize> {
    let (start, end) = t
        .layout()
        .contiguous_offsets()
        .expect("made contiguous above");
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, Tensor, TensorPrimitive};
    use proptest::prelude::*;

    fn random(n: usize, seed: u64, scale: f64) -> FlexTensor {
        <Flex as burn::tensor::backend::Backend>::seed(&Default::default(), seed);
        let t =
            Tensor::<Flex, 1>::random([n], Distribution::Normal(0.0, scale), &Default::default());
        t.into_primitive().tensor()
    }

    fn bits(t: FlexTensor) -> Vec<u32> {
        Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(t))
            .into_data()
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any size (across chunk borders), first update or later, clipped or not, decayed or
        /// not: the fused pass equals the tensor ops bit for bit.
        #[test]
        fn fused_equals_tensor_ops_bitwise(
            n in 1usize..(3 * CHUNK + 7),
            seed in 0u64..1000,
            first in any::<bool>(),
            // Small counts, where the bias corrections differ from 1.
            t in 1u64..200,
            clip_scale in prop_oneof![Just(1.0), 0.01f64..1.0],
            weight_decay in prop_oneof![Just(0.0), 0.0f64..0.3],
            lr in 1e-6f64..1e-2,
        ) {
            let step = AdamWStep {
                clip_scale, beta1: 0.9, beta2: 0.95, eps: 1e-8, lr, weight_decay,
                t: if first { 1 } else { t },
            };
            let p = random(n, seed, 0.02);
            let g = random(n, seed + 1, 1e-3);
            let moments = (!first).then(|| {
                let v = Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(random(n, seed + 3, 1e-3)));
                (random(n, seed + 2, 1e-3), v.square().into_primitive().tensor())
            });
            let p_before = bits(p.clone());
            let want = tensor_ops_update::<Flex>(p.clone(), g.clone(), moments.clone(), &step);
            let got = <Flex as FusedAdamW>::adamw_update(p.clone(), g, moments, &step);
            prop_assert_eq!(bits(got.0), bits(want.0));
            prop_assert_eq!(bits(got.1), bits(want.1));
            prop_assert_eq!(bits(got.2), bits(want.2));
            // Another handle on the old parameter still reads the old values (copy-on-write).
            prop_assert_eq!(bits(p), p_before);
        }
    }

    /// A later update, clipped and decayed.
    const STEP: AdamWStep = AdamWStep {
        clip_scale: 0.5,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        lr: 1e-3,
        weight_decay: 0.1,
        t: 3,
    };

    fn assert_same_bits(got: AdamWUpdated<Flex>, want: AdamWUpdated<Flex>) {
        assert_eq!(bits(got.0), bits(want.0), "parameter");
        assert_eq!(bits(got.1), bits(want.1), "m");
        assert_eq!(bits(got.2), bits(want.2), "v");
    }

    /// Views that start inside their buffer (what `narrow` gives) are read and written at
    /// their own offset.
    #[test]
    fn views_at_an_offset_update_their_own_elements() {
        let view = |seed, scale| {
            Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(random(40, seed, scale)))
                .abs()
                .narrow(0, 5, 30)
                .into_primitive()
                .tensor()
        };
        let (p, g, m, v) = (view(1, 0.02), view(2, 1e-3), view(3, 1e-3), view(4, 1e-6));
        let want =
            tensor_ops_update::<Flex>(p.clone(), g.clone(), Some((m.clone(), v.clone())), &STEP);
        let got = <Flex as FusedAdamW>::adamw_update(p, g, Some((m, v)), &STEP);
        assert_same_bits(got, want);
    }

    /// The gradient in its parameter's shape, as a view into a wider one (the right half of
    /// a `[12, 2·7]` product's gradient): the same bits as its flat copy, in the fused pass
    /// and in the tensor-op form.
    #[test]
    fn a_matrix_gradient_at_its_strides_updates_as_its_flat_copy() {
        let (rows, cols) = (12, 7);
        let wide = Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(random(
            rows * 2 * cols,
            5,
            1e-3,
        )))
        .reshape([rows, 2 * cols]);
        let half = wide.slice([0..rows, cols..2 * cols]);
        let flat = half
            .clone()
            .reshape([rows * cols])
            .into_primitive()
            .tensor();
        let g = half.into_primitive().tensor();
        let n = rows * cols;
        let (p, m) = (random(n, 1, 0.02), random(n, 3, 1e-3));
        let v = Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(random(n, 4, 1e-3)))
            .square()
            .into_primitive()
            .tensor();
        let moments = Some((m, v));
        let want = tensor_ops_update::<Flex>(p.clone(), flat, moments.clone(), &STEP);
        let ops = tensor_ops_update::<Flex>(p.clone(), g.clone(), moments.clone(), &STEP);
        let got = <Flex as FusedAdamW>::adamw_update(p, g, moments, &STEP);
        assert_same_bits(got, want.clone());
        assert_same_bits(ops, want);
    }
}
