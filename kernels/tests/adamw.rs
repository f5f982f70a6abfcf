//! The one-pass AdamW kernel against an fp64 host reference of the update, on the GPU device
//! the build has (wgpu: lavapipe in CI; CUDA in a build with only `--features cuda`).
//!
//! Outputs are poisoned with NaN before each launch, so an element the kernel forgot to
//! write fails the comparison. Sizes include 1, non-multiples of the cube's 256 units, and
//! one past 65,535 cubes (65,537 of them: x1-50m's embedding, 38.6M elements, needs a
//! two-dimensional grid). Matrix gradients also come as views at their own strides (padded
//! rows, a transpose), which the kernel reads without a copy. One step has ε = 0.1, comparable to `sqrt(v̂)`, where a misplaced ε
//! shows (at 1e-8 it is below the tolerance).
//!
//! Tolerance: every quantity is a handful of f32 operations, each rounded once (2^-24
//! relative), on constants rounded to f32 once. `v` is made of about seven such roundings
//! (the clipped gradient's counts twice, being squared), `m` of fewer. An error is relative
//! to the terms a result is summed from, not to the result, which can cancel: `m = β1·m +
//! (1−β1)·g` has terms of either sign. So `m` agrees to 8 · 2^-24 of the sum of its terms'
//! magnitudes and `v` to 12 · 2^-24 (its count, 8 at first order, with a margin), and the parameter, whose update adds a square root, two divisions and
//! the moments' errors, to 16 · 2^-24 of `|p| + lr · (|update| + the update that m's error
//! alone would make)`. A wrong constant or a missed term is off by far more.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::DType;
use lab_kernels::adamw::{self, Constants, Updated};
use proptest::prelude::*;

use crate::common;
use common::{download, poisoned, upload, values, Input, Prim};

/// The update's inputs in f64.
#[derive(Clone, Copy, Debug)]
struct Step {
    clip_scale: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    lr: f64,
    weight_decay: f64,
    t: i32,
}

impl Step {
    fn constants(&self) -> Constants {
        let betas = [self.beta1, self.beta2];
        Constants::new(
            self.clip_scale,
            betas,
            self.eps,
            self.lr,
            self.weight_decay,
            self.t as u64,
        )
    }
}

/// fp64 AdamW, element by element, and the scale of each result's rounding error.
struct Reference {
    p: f64,
    m: f64,
    v: f64,
    /// `|β1·m| + |(1−β1)·g|`, `β2·v + (1−β2)·g²` and `|p| + lr·(|update| + m's error term)`.
    m_scale: f64,
    v_scale: f64,
    p_scale: f64,
}

fn reference(s: &Step, p: f32, g: f32, m: f32, v: f32) -> Reference {
    let g = g as f64 * s.clip_scale;
    let (m_old, v_old) = (m as f64, v as f64);
    let m = s.beta1 * m_old + (1.0 - s.beta1) * g;
    let v = s.beta2 * v_old + (1.0 - s.beta2) * g * g;
    let m_scale = (s.beta1 * m_old).abs() + ((1.0 - s.beta1) * g).abs();
    let bias1 = 1.0 - s.beta1.powi(s.t);
    let bias2 = 1.0 - s.beta2.powi(s.t);
    let denominator = (v / bias2).sqrt() + s.eps;
    let update = (m / bias1) / denominator;
    let p_new = p as f64 * (1.0 - s.lr * s.weight_decay) - s.lr * update;
    let p_scale = (p as f64).abs() + s.lr * (update.abs() + m_scale / bias1 / denominator);
    Reference {
        p: p_new,
        m,
        v,
        m_scale,
        v_scale: v,
        p_scale,
    }
}

/// How the gradient of a flat parameter reaches the kernel (the optimizer flattens the
/// parameter and its moments, not the gradient).
#[derive(Clone, Copy, Debug)]
enum Shaped {
    /// `[n]`, as the norms' gains.
    Flat(usize),
    /// In its weight's shape, in one of `Input`'s layouts: a weight's gradient that is a view
    /// into a wider one (padded rows), or through a transpose.
    Matrix([usize; 2], Input),
}

impl Shaped {
    fn len(self) -> usize {
        match self {
            Shaped::Flat(n) => n,
            Shaped::Matrix([rows, cols], _) => rows * cols,
        }
    }

    /// `g` (row-major) on the device as the gradient arrives.
    fn upload_grad(self, g: &[f32]) -> Prim {
        match self {
            Shaped::Flat(n) => upload(g, &[n], DType::F32),
            Shaped::Matrix(shape, input) => input.upload(g, shape, DType::F32),
        }
    }
}

/// Runs one update of `n` elements (from zero moments when `first`) and compares it with
/// the reference element by element.
fn check(n: usize, s: Step, first: bool, seed: u64) {
    check_shaped(Shaped::Flat(n), s, first, seed);
}

/// [`check`] with the gradient shaped and laid out as `shaped` says.
fn check_shaped(shaped: Shaped, s: Step, first: bool, seed: u64) {
    let n = shaped.len();
    let p = values(n, seed, DType::F32);
    let g = values(n, seed + 1, DType::F32);
    // A second moment is non-negative: squares of other values.
    let (m, v): (Vec<f32>, Vec<f32>) = if first {
        (vec![0.0; n], vec![0.0; n])
    } else {
        let v = values(n, seed + 3, DType::F32)
            .iter()
            .map(|x| x * x * 0.1)
            .collect();
        (values(n, seed + 2, DType::F32), v)
    };
    let dev = |x: &[f32]| upload(x, &[n], DType::F32);
    let moments = (!first).then(|| (dev(&m), dev(&v)));
    let out = Updated {
        param: poisoned(&[n], DType::F32),
        m: poisoned(&[n], DType::F32),
        v: poisoned(&[n], DType::F32),
    };
    let grad = shaped.upload_grad(&g);
    let out = adamw::update_into(dev(&p), grad, moments, &s.constants(), out);
    let (got_p, got_m, got_v) = (download(out.param), download(out.m), download(out.v));
    let ulp = f64::from(f32::EPSILON) / 2.0;
    for i in 0..n {
        let r = reference(&s, p[i], g[i], m[i], v[i]);
        let ctx = || format!("{shaped:?}, element {i}, {s:?}, first {first}");
        let close = |got: f32, want: f64, scale: f64| (got as f64 - want).abs() <= scale;
        let (gm, gv, gp) = (got_m[i], got_v[i], got_p[i]);
        assert!(
            close(gm, r.m, 8.0 * ulp * r.m_scale),
            "m: {gm} vs {}; {}",
            r.m,
            ctx()
        );
        assert!(
            close(gv, r.v, 12.0 * ulp * r.v_scale),
            "v: {gv} vs {}; {}",
            r.v,
            ctx()
        );
        assert!(
            close(gp, r.p, 16.0 * ulp * r.p_scale),
            "p: {gp} vs {}; {}",
            r.p,
            ctx()
        );
    }
}

const STEP: Step = Step {
    clip_scale: 0.37,
    beta1: 0.9,
    beta2: 0.95,
    eps: 1e-8,
    lr: 3e-4,
    weight_decay: 0.1,
    t: 7,
};

#[test]
fn first_and_later_updates_match_the_fp64_reference() {
    for (seed, n) in [1, 255, 256, 257, 1000, 4099].into_iter().enumerate() {
        check(n, Step { t: 1, ..STEP }, true, seed as u64 * 10);
        check(n, STEP, false, seed as u64 * 10 + 5);
    }
}

#[test]
fn a_parameter_past_65535_cubes_is_updated_whole() {
    check((1 << 24) + 5, STEP, false, 99);
}

#[test]
fn a_large_epsilon_matches_too() {
    check(2000, Step { eps: 0.1, ..STEP }, false, 11);
}

#[test]
fn no_decay_and_no_clipping_match_too() {
    let plain = Step {
        clip_scale: 1.0,
        weight_decay: 0.0,
        t: 1000,
        ..STEP
    };
    check(3001, plain, false, 7);
}

/// A weight's gradient read at its strides: views into a wider gradient (padded rows, and at an
/// offset, as the feed-forward's up half of one product's) and a transposed one.
#[test]
fn a_strided_matrix_gradient_is_read_at_its_strides() {
    for (seed, input) in [
        Input::Contiguous,
        Input::Padded,
        Input::Transposed,
        Input::Offset,
    ]
    .into_iter()
    .enumerate()
    {
        for shape in [[1, 1], [3, 257], [64, 40]] {
            let shaped = Shaped::Matrix(shape, input);
            check_shaped(shaped, Step { t: 1, ..STEP }, true, seed as u64 * 20);
            check_shaped(shaped, STEP, false, seed as u64 * 20 + 5);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn random_sizes_and_steps_match_the_reference(
        n in 1usize..3000,
        t in 1i32..5000,
        lr in 1e-6f64..1e-2,
        clip in 0.01f64..1.0,
        first in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let s = Step { t: if first { 1 } else { t }, lr, clip_scale: clip, ..STEP };
        check(n, s, first, seed);
    }

    #[test]
    fn random_matrix_gradients_in_any_layout_match_the_reference(
        rows in 1usize..70,
        cols in 1usize..70,
        input in Input::any(),
        first in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let s = if first { Step { t: 1, ..STEP } } else { STEP };
        check_shaped(Shaped::Matrix([rows, cols], input), s, first, seed);
    }
}
