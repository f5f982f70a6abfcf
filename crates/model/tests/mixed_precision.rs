//! bf16 mixed precision on the CPU backend: the forward really computes in bf16 (its loss is
//! not the fp32 loss bit for bit), stays within bf16's rounding of the fp32 reference, and
//! hands fp32 gradients to the fp32 parameters.
//!
//! Tolerances, in bf16's unit roundoff u = 2⁻⁹ ≈ 2e-3 (8 significant bits). Every matmul
//! rounds its inputs and its output once (products accumulate in fp32); independent roundings
//! add in quadrature. The loss is a mean over 48 positions, so its rounding mostly averages
//! out: within 2u of the fp32 loss (measured 0.05u). A parameter's gradient meets the
//! roundings of up to 8 matmuls on the way forward and as many on the way back (about
//! √16 · u = 4u): within 8u in L2 relative to the fp32 gradient and 12u for the worst element
//! against the largest one (measured 3.0–5.4u and 3.6–6.5u). The init is 0.05, near the
//! recipes' 0.02: much larger weights make attention so sharp that rounding flips which key
//! wins, and the comparison measures chaos rather than precision.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::tensor::{DType, Int, Tensor};
use lab_config::Precision;
use lab_model::Llama;

use crate::common;

type B = Autodiff<Flex>;

const U: f32 = 1.0 / 512.0;

fn ids(batch: usize, t: usize, salt: usize) -> Tensor<B, 2, Int> {
    common::ids::<B>(batch, t, salt)
}

/// The loss and the gradients of a few parameters, each with its dtype.
struct Pass {
    loss: f32,
    grads: Vec<(&'static str, DType, Vec<f32>)>,
}

fn pass(model: &Llama<B>) -> Pass {
    let loss = model.loss(ids(2, 24, 0), ids(2, 24, 1));
    let value = loss.clone().into_scalar();
    let grads = loss.backward();
    let block = &model.blocks[1];
    let params: [(&'static str, &Param<Tensor<B, 2>>); 5] = [
        ("embed", &model.embed),
        ("wq", &block.attn.wq.weight),
        ("wv", &block.attn.wv.weight),
        ("ffn.down", &block.ffn.down.weight),
        ("lm_head", &model.lm_head.as_ref().unwrap().weight),
    ];
    let grads = params
        .into_iter()
        .map(|(name, p)| {
            let g = p
                .grad(&grads)
                .unwrap_or_else(|| panic!("{name}: no gradient"));
            let dtype = g.dtype();
            (
                name,
                dtype,
                g.into_data().convert::<f32>().to_vec().unwrap(),
            )
        })
        .collect();
    Pass { loss: value, grads }
}

#[test]
fn bf16_computes_in_bf16_within_its_rounding_and_returns_fp32_gradients() {
    let device = Default::default();
    let fp32 = Llama::<B>::new(&common::small_config(24, 0.05), 3, &device);
    let bf16 = fp32.clone().with_precision(Precision::Bf16);
    assert_eq!(bf16.compute_dtype(), burn::tensor::FloatDType::BF16);

    let want = pass(&fp32);
    let got = pass(&bf16);

    assert_ne!(
        got.loss.to_bits(),
        want.loss.to_bits(),
        "the bf16 forward gave the fp32 loss bit for bit: it did not compute in bf16"
    );
    let loss_tol = 2.0 * U * want.loss.abs();
    assert!(
        (got.loss - want.loss).abs() <= loss_tol,
        "loss: bf16 {} against fp32 {} (tolerance {loss_tol:.2e})",
        got.loss,
        want.loss
    );

    for ((name, dtype, g), (_, _, w)) in got.grads.iter().zip(&want.grads) {
        assert_eq!(*dtype, DType::F32, "{name}: the master weight's gradient");
        let (max, l2) = relative_errors(g, w);
        assert!(
            max <= 12.0 * U && l2 <= 8.0 * U,
            "{name}: errors {:.1}u (largest) and {:.1}u (L2) against fp32; bounds 12u and 8u",
            max / U,
            l2 / U
        );
    }

    // The weights themselves never leave fp32: what the optimizer and checkpoints see.
    bf16.visit(&mut DtypeCheck);
}

/// `(max |g − w| / max |w|, ‖g − w‖ / ‖w‖)`; NaN anywhere counts as infinitely wrong.
fn relative_errors(g: &[f32], w: &[f32]) -> (f32, f32) {
    assert_eq!(g.len(), w.len());
    let largest = w.iter().fold(0f32, |a, x| a.max(x.abs()));
    assert!(largest > 0.0, "an all-zero reference gradient");
    let diff: Vec<f32> = g.iter().zip(w).map(|(a, b)| (a - b).abs()).collect();
    if diff.iter().any(|d| d.is_nan()) {
        return (f32::INFINITY, f32::INFINITY);
    }
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| x * x).sum::<f32>().sqrt();
    let max = diff.iter().fold(0f32, |a, d| a.max(*d));
    (
        max / largest,
        norm(&mut diff.iter().copied()) / norm(&mut w.iter().copied()),
    )
}

struct DtypeCheck;

impl burn::module::ModuleVisitor<B> for DtypeCheck {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        assert_eq!(param.val().dtype(), DType::F32, "parameter {:?}", param.id);
    }
}
