//! The RMSNorm kernels against an fp64 host reference on the GPU device (wgpu, lavapipe in
//! CI; CUDA in a build with only `--features cuda`).
//!
//! Outputs are poisoned with NaN before each launch, so an element the kernels forgot to write
//! fails. Shapes are not multiples of the kernels' widths (128 units a row, 256 columns a
//! cube, 64 rows a block of `dg`'s first stage); `x` and `dy` also come transposed (strided
//! rows, as a gradient through a matmul's transpose arrives), and the gain as a window of a
//! longer vector. Rows run from 1e-3 to 1e2 in scale, and one row is zeros, where `eps` alone
//! sets `r`.
//!
//! Tolerances, relative to the largest reference magnitude in each row of `y` and `dx` (rows
//! differ in scale) and in `dg`:
//! - f32: 2e-5. Each output is a few f32 roundings (2⁻²⁴ each) after sums of at most a few
//!   hundred terms in f32, summed in a tree (rows) or in blocks (`dg`).
//! - f16 storage (f32 arithmetic inside): that plus the output's own rounding, 2⁻¹¹: 6e-4.
//! - bf16 storage (CUDA builds only): with bf16's rounding, 2⁻⁸: 5e-3.
//!
//! Inputs are rounded to the storage type before the reference sees them.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::{backend::Backend, DType, Tensor, TensorPrimitive};
use lab_kernels::rms_norm;
use proptest::prelude::*;

use crate::common;
use common::{assert_close_to_peak, device, download, poisoned, upload, values, Prim, B};

const EPS: f64 = 1e-5;

#[derive(Clone, Copy, Debug)]
struct Case {
    shape: [usize; 2],
    /// `x` and `dy` stored `[d, N]` and read through a transposed view.
    transposed: bool,
    /// The gain is entries `offset .. offset + d` of a longer vector.
    offset: usize,
}

struct Inputs {
    x: Vec<f32>,
    gain: Vec<f32>,
    dy: Vec<f32>,
}

/// Row `i` scaled by `10^(i mod 6 − 3)`, the middle row zeros; gains near 1.
fn inputs(c: &Case, seed: u64, dtype: DType) -> Inputs {
    let [n, d] = c.shape;
    let mut x = values(n * d, seed, DType::F32);
    for (i, row) in x.chunks_mut(d.max(1)).enumerate() {
        let scale = 10f32.powi(i as i32 % 6 - 3);
        row.iter_mut()
            .for_each(|v| *v = common::rounded(*v * scale, dtype));
        if i == n / 2 && n > 2 {
            row.fill(0.0);
        }
    }
    let gain = values(d, seed + 1, DType::F32)
        .iter()
        .map(|g| common::rounded(1.0 + g / 4.0, dtype))
        .collect();
    Inputs {
        x,
        gain,
        dy: values(n * d, seed + 2, dtype),
    }
}

/// fp64 `(y, dx, dg)`, with `r = sqrt(mean(x²) + eps)`, `q = x/r`, `gy = dy·g`.
fn reference(d: usize, i: &Inputs) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut dx, mut dg) = (vec![], vec![], vec![0.0; d]);
    let g: Vec<f64> = i.gain.iter().map(|&v| v as f64).collect();
    for (x, dy) in i.x.chunks(d).zip(i.dy.chunks(d)) {
        let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let r = (x.iter().map(|v| v * v).sum::<f64>() / d as f64 + EPS).sqrt();
        let along = (0..d).map(|j| dy[j] as f64 * g[j] * x[j] / r).sum::<f64>() / d as f64;
        for j in 0..d {
            let q = x[j] / r;
            y.push(q * g[j]);
            dx.push((dy[j] as f64 * g[j] - q * along) / r);
            dg[j] += dy[j] as f64 * q;
        }
    }
    (y, dx, dg)
}

/// `[N, d]` values on the device, as a transposed view when the case says so.
fn upload_rows(c: &Case, v: &[f32], dtype: DType) -> Prim {
    let [n, d] = c.shape;
    if !c.transposed {
        return upload(v, &[n, d], dtype);
    }
    let stored: Vec<f32> = (0..d * n).map(|k| v[(k % n) * d + k / n]).collect();
    let t = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(upload(&stored, &[d, n], dtype)));
    t.transpose().into_primitive().tensor()
}

fn upload_gain(c: &Case, gain: &[f32], dtype: DType) -> Prim {
    let mut longer = vec![f32::NAN; c.offset];
    longer.extend_from_slice(gain);
    longer.push(f32::NAN);
    let t = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(upload(
        &longer,
        &[longer.len()],
        dtype,
    )));
    t.narrow(0, c.offset, gain.len()).into_primitive().tensor()
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 6e-4,
        _ => 5e-3,
    }
}

/// The kernels' `(y, dx, dg)` for the case, into poisoned outputs.
fn run(c: &Case, i: &Inputs, dtype: DType) -> [Vec<f32>; 3] {
    let [n, d] = c.shape;
    let gain = || upload_gain(c, &i.gain, dtype);
    let x = || upload_rows(c, &i.x, dtype);
    let y = rms_norm::forward_into(x(), gain(), EPS, poisoned(&[n, d], dtype));
    let outputs = (poisoned(&[n, d], dtype), poisoned(&[d], dtype));
    let dy = upload_rows(c, &i.dy, dtype);
    let (dx, dg) = rms_norm::backward_into(x(), gain(), EPS, dy, outputs);
    [download(y), download(dx), download(dg)]
}

fn check(c: Case, dtype: DType, seed: u64) {
    let i = inputs(&c, seed, dtype);
    let [y, dx, dg] = run(&c, &i, dtype);
    let (want_y, want_dx, want_dg) = reference(c.shape[1], &i);
    let (tol, d) = (tolerance(dtype), c.shape[1]);
    // Row by row: rows differ in scale by 1e5, and `dx` scales with 1/r.
    for (k, (got, want)) in [(y, want_y), (dx, want_dx)].iter().enumerate() {
        for (r, (g, w)) in got.chunks(d).zip(want.chunks(d)).enumerate() {
            let name = format!("{} row {r} {c:?} {dtype:?}", ["y", "dx"][k]);
            assert_close_to_peak(&name, g, w, tol);
        }
    }
    assert_close_to_peak(&format!("dg {c:?} {dtype:?}"), &dg, &want_dg, tol);
}

const fn case(shape: [usize; 2], transposed: bool, offset: usize) -> Case {
    Case {
        shape,
        transposed,
        offset,
    }
}

const CASES: [Case; 5] = [
    case([1, 1], false, 0),
    case([3, 7], true, 2),
    case([6, 300], false, 1),
    case([130, 33], true, 0),
    case([70, 129], false, 3),
];

#[test]
fn f32_matches_the_fp64_reference() {
    for (k, c) in CASES.into_iter().enumerate() {
        check(c, DType::F32, 10 * k as u64);
    }
}

#[test]
fn f16_matches_the_fp64_reference() {
    assert!(
        B::supports_dtype(&device(), DType::F16),
        "this wgpu device has no f16 (lavapipe has it)"
    );
    for (k, c) in CASES.into_iter().enumerate() {
        check(c, DType::F16, 10 * k as u64 + 5);
    }
}

#[cfg(not(feature = "wgpu"))]
#[test]
fn bf16_matches_the_fp64_reference() {
    for (k, c) in CASES.into_iter().enumerate() {
        check(c, DType::BF16, 10 * k as u64 + 7);
    }
}

/// Every sum runs in a fixed order: the same inputs give the same bits.
#[test]
fn results_repeat_bit_for_bit() {
    let c = case([130, 33], true, 1);
    let i = inputs(&c, 3, DType::F32);
    let bits = |v: [Vec<f32>; 3]| v.map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(bits(run(&c, &i, DType::F32)), bits(run(&c, &i, DType::F32)));
}

/// No rows: `y` and `dx` are empty, and `dg`, a sum over no rows, is zeros.
#[test]
fn no_rows_gives_empty_outputs_and_a_zero_gain_gradient() {
    let c = case([0, 5], false, 0);
    let i = inputs(&c, 1, DType::F32);
    let [y, dx, dg] = run(&c, &i, DType::F32);
    assert!(y.is_empty() && dx.is_empty());
    assert_eq!(dg, [0.0; 5]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]
    /// Random shapes and layouts in f32.
    #[test]
    fn any_shape_and_layout_matches_the_reference(
        n in 1usize..150, d in 1usize..300, transposed: bool, offset in 0usize..3,
        seed in 0u64..1000,
    ) {
        check(case([n, d], transposed, offset), DType::F32, seed);
    }
}
