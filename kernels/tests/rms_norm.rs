//! The RMSNorm kernels against an fp64 host reference on the GPU device (wgpu, lavapipe in
//! CI; CUDA in a build with only `--features cuda`).
//!
//! Outputs are poisoned with NaN before each launch, so an element the kernels forgot to write
//! fails. Shapes are not multiples of the kernels' widths (128 units a row, 16 rows a cube of
//! the backward, 8 columns and 32 lanes a cube of `dg`'s sums); one has more rows than a grid
//! axis holds (65,535 cubes), another more blocks of the backward's rows (blocks of one row),
//! and two are wide (4,096 columns on 128 units a cube, MedGemma-27B's 5,376 on 256); `x` and
//! `dy` also come transposed (strided rows, as a gradient through a
//! matmul's transpose arrives). x1-50m's 768 columns and 300 take the forward's vectors (4
//! columns a unit on lavapipe). Rows run from 1e-3 to 1e2 in scale, and one row is zeros,
//! where `eps` alone sets `r`. With the skip connection's gradient added in the same pass,
//! `dx` is checked against the add after the norm's backward, bit for bit in f32, and against
//! the fp64 reference in f16.
//!
//! Tolerances, per element, relative to the size of the terms that make it (`|y|`;
//! `(|gy| + |q|·mean|gy·q|)/r` for `dx`, whose two terms can cancel; `Σ|dy·q|` for `dg`):
//! - f32: 2e-5. Each output is a few f32 roundings (2⁻²⁴ each) after f32 sums: of at most 300
//!   terms in a tree (rows), or for `dg` of 16 rows a block and then, in each of 32 lanes, up
//!   to 2,048 blocks, then a tree of the lanes, whose roundings add up as a random walk (the
//!   worst case, ~2,070 · 2⁻²⁴ = 1.2e-4, does not occur).
//! - f16 storage (f32 arithmetic inside): that plus the output's own rounding, 2⁻¹¹: 6e-4;
//!   and 2⁻²⁴ absolute, f16's subnormal step, for outputs under f16's smallest normal.
//! - bf16 storage (CUDA builds only): with bf16's rounding, 2⁻⁸: 5e-3.
//!
//! Inputs are rounded to the storage type before the reference sees them. With the output in
//! another dtype than `x` (bf16 training: `x` fp32, `y` and `dy` bf16; f16 stands in on
//! lavapipe), `y` takes its own dtype's tolerance and `dx`, `dg` that of `x`.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::DType;
use lab_kernels::{rms_norm, vectors};
use proptest::prelude::*;

use crate::common;
use common::{download, matrix as case, poisoned, upload, values, Input, Matrix};

const EPS: f64 = 1e-5;

/// `x` and `dy` as `[N, d]`, transposed or not (stored `[d, N]`, read through a view).
type Case = Matrix;

struct Inputs {
    x: Vec<f32>,
    gain: Vec<f32>,
    dy: Vec<f32>,
}

/// Row `i` scaled by `10^(i mod 6 − 3)`, the middle row zeros; gains near 1; `dy` rounded
/// to the output's dtype `out`.
fn inputs(c: &Case, seed: u64, dtype: DType, out: DType) -> Inputs {
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
        dy: values(n * d, seed + 2, out),
    }
}

/// An fp64 output and, per element, the size of the terms that make it (what rounding
/// scales with: a difference of large terms can be small).
struct Exact {
    value: Vec<f64>,
    size: Vec<f64>,
}

/// fp64 `[y, dx, dg]`, with `r = sqrt(mean(x²) + eps)`, `q = x/r`, `gy = dy·g`.
fn reference(d: usize, i: &Inputs) -> [Exact; 3] {
    let new = |n| Exact {
        value: vec![0.0; n],
        size: vec![0.0; n],
    };
    let n = i.x.len();
    let [mut y, mut dx, mut dg] = [new(n), new(n), new(d)];
    let g: Vec<f64> = i.gain.iter().map(|&v| v as f64).collect();
    for (row, (x, dy)) in i.x.chunks(d).zip(i.dy.chunks(d)).enumerate() {
        let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let r = (x.iter().map(|v| v * v).sum::<f64>() / d as f64 + EPS).sqrt();
        let gy: Vec<f64> = (0..d).map(|j| dy[j] as f64 * g[j]).collect();
        let along = (0..d).map(|j| gy[j] * x[j] / r).sum::<f64>() / d as f64;
        let along_size = (0..d).map(|j| (gy[j] * x[j] / r).abs()).sum::<f64>() / d as f64;
        for j in 0..d {
            let (q, at) = (x[j] / r, row * d + j);
            y.value[at] = q * g[j];
            y.size[at] = (q * g[j]).abs();
            dx.value[at] = (gy[j] - q * along) / r;
            dx.size[at] = (gy[j].abs() + q.abs() * along_size) / r;
            dg.value[j] += dy[j] as f64 * q;
            dg.size[j] += (dy[j] as f64 * q).abs();
        }
    }
    [y, dx, dg]
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 6e-4,
        _ => 5e-3,
    }
}

/// The absolute step of `dtype`'s subnormals, which bounds the rounding of an output too
/// small for the relative tolerance: 2⁻²⁴ for f16 (a `y` of 1e-5, where `x` is one of the
/// rare elements near 0, is one), none that matters for f32 and bf16.
fn subnormal_step(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1.0 / (1u64 << 24) as f64,
        _ => 0.0,
    }
}

/// The kernels' `(y, dx, dg)` for the case, into poisoned outputs: `x`, `gain`, `dx`, `dg` in
/// `dtype`, `y` and `dy` in `out`.
fn run(c: &Case, i: &Inputs, dtype: DType, out: DType) -> [Vec<f32>; 3] {
    run_in_blocks_of(rms_norm::BLOCK_ROWS, c, i, dtype, out)
}

/// [`run`] with the backward's cubes taking `block_rows` rows each.
fn run_in_blocks_of(
    block_rows: usize,
    c: &Case,
    i: &Inputs,
    dtype: DType,
    out: DType,
) -> [Vec<f32>; 3] {
    let [n, d] = c.shape;
    let gain = || upload(&i.gain, &[d], dtype);
    let x = || c.upload(&i.x, dtype);
    let y = rms_norm::forward_into(x(), gain(), EPS, poisoned(&[n, d], out));
    let outputs = (poisoned(&[n, d], dtype), poisoned(&[d], dtype));
    let dy = c.upload(&i.dy, out);
    let (dx, dg) = rms_norm::backward_in_blocks_of(block_rows, x(), gain(), EPS, dy, None, outputs);
    [download(y), download(dx), download(dg)]
}

fn check(c: Case, dtype: DType, seed: u64) {
    check_to(c, dtype, dtype, seed);
}

/// As [`check`], with the output and `dy` in `out`.
fn check_to(c: Case, dtype: DType, out: DType, seed: u64) {
    check_in_blocks_of(rms_norm::BLOCK_ROWS, c, dtype, out, seed);
}

/// As [`check_to`], with the backward's cubes taking `block_rows` rows each.
fn check_in_blocks_of(block_rows: usize, c: Case, dtype: DType, out: DType, seed: u64) {
    let i = inputs(&c, seed, dtype, out);
    let got = run_in_blocks_of(block_rows, &c, &i, dtype, out);
    let tols = [out, dtype, dtype].map(|t| (tolerance(t), subnormal_step(t)));
    for ((name, tol), (got, want)) in ["y", "dx", "dg"]
        .iter()
        .zip(tols)
        .zip(got.iter().zip(reference(c.shape[1], &i)))
    {
        assert_eq!(got.len(), want.value.len(), "{name}: length");
        for (k, ((&g, w), size)) in got.iter().zip(&want.value).zip(&want.size).enumerate() {
            let (err, bound) = ((g as f64 - w).abs(), tol.0 * (size + 1e-30) + tol.1);
            assert!(
                err <= bound,
                "{name}[{k}] {c:?} {dtype:?}: got {g}, want {w} (error {err:.3e} > {bound:.3e})"
            );
        }
    }
}

const CASES: [Case; 6] = [
    case([1, 1], false),
    case([3, 7], true),
    case([6, 300], false),
    // x1-50m's width: 192 vectors of 4 over 128 units, some taking two.
    case([40, 768], false),
    case([130, 33], true),
    case([70, 129], false),
];

#[test]
fn f32_matches_the_fp64_reference() {
    for (k, c) in CASES.into_iter().enumerate() {
        check(c, DType::F32, 10 * k as u64);
    }
}

#[test]
fn f16_matches_the_fp64_reference() {
    common::assert_device_has_f16();
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

/// bf16 training's layout, f16 standing in: `x` and the gain f32, the output and `dy` f16.
#[test]
fn an_output_in_another_dtype_matches_the_fp64_reference() {
    for (k, c) in CASES.into_iter().enumerate() {
        check_to(c, DType::F32, DType::F16, 10 * k as u64 + 9);
    }
}

fn bits(v: [Vec<f32>; 3]) -> [Vec<u32>; 3] {
    v.map(|v| v.iter().map(|x| x.to_bits()).collect())
}

/// Every sum runs in a fixed order: the same inputs give the same bits.
#[test]
fn results_repeat_bit_for_bit() {
    let c = case([130, 33], true);
    let i = inputs(&c, 3, DType::F32, DType::F32);
    let f32 = DType::F32;
    assert_eq!(bits(run(&c, &i, f32, f32)), bits(run(&c, &i, f32, f32)));
}

/// The output in `half` is the f32 output cast to `half`, bit for bit (one rounding of the
/// same f32 value); backward from a `half` `dy` is backward from that `dy` widened to f32
/// (exact).
fn check_fused_cast_bits(half: DType) {
    let c = case([70, 129], false);
    let i = inputs(&c, 5, DType::F32, half);
    let fused = run(&c, &i, DType::F32, half);
    let [y32, dx32, dg32] = run(&c, &i, DType::F32, DType::F32);
    // `upload` casts on the device: the f32 values, then the backend's cast.
    let y32_cast = download(upload(&y32, &c.shape, half));
    assert_eq!(bits(fused), bits([y32_cast, dx32, dg32]));
}

#[test]
fn an_output_in_another_dtype_has_the_bits_of_casting_the_f32_output() {
    check_fused_cast_bits(DType::F16);
}

/// bf16, the training precision (CUDA builds only: lavapipe has no bf16).
#[cfg(not(feature = "wgpu"))]
#[test]
fn a_bf16_output_has_the_bits_of_casting_the_f32_output() {
    check_fused_cast_bits(DType::BF16);
}

/// The forward reads rows of whole vectors a vector a unit (the cases of 300 and 768
/// columns), and a transposed `x` one element a unit (the transposed cases).
#[test]
fn rows_of_whole_vectors_are_read_as_vectors() {
    let x = upload(&vec![1.0; 40 * 768], &[40, 768], DType::F32);
    let gain = upload(&vec![1.0; 768], &[768], DType::F32);
    let widest = common::widest_f32_vector(&x);
    assert_eq!(vectors::row_vector_size(&[&x, &gain], 768), widest);
    let transposed = Input::Transposed.upload(&vec![1.0; 40 * 768], [40, 768], DType::F32);
    assert_eq!(vectors::row_vector_size(&[&transposed, &gain], 768), 1);
}

/// No rows: `y` and `dx` are empty, and `dg`, a sum over no rows, is zeros.
#[test]
fn no_rows_gives_empty_outputs_and_a_zero_gain_gradient() {
    let c = case([0, 5], false);
    let i = inputs(&c, 1, DType::F32, DType::F32);
    let [y, dx, dg] = run(&c, &i, DType::F32, DType::F32);
    assert!(y.is_empty() && dx.is_empty());
    assert_eq!(dg, [0.0; 5]);
}

/// More rows than one grid axis holds: rows spill onto the grid's y axis.
#[test]
fn more_rows_than_a_grid_axis_holds() {
    check(case([65_537, 3], false), DType::F32, 11);
}

/// More blocks of the backward's rows than one grid axis holds: blocks of one row (65,537 of
/// 16 rows would take lavapipe half a minute) spill onto the grid's y axis, and `dg` sums
/// 65,537 blocks, 2,048 or 2,049 a lane.
#[test]
fn more_row_blocks_than_a_grid_axis_holds() {
    let (c, f32) = (case([65_537, 2], true), DType::F32);
    check_in_blocks_of(1, c, f32, f32, 13);
}

/// Every lane of `dg`'s sums busy over several cubes of columns: 300 blocks of one row, 33
/// columns (five cubes of 8, the last partial).
#[test]
fn many_blocks_over_several_column_cubes() {
    let (c, f32) = (case([300, 33], false), DType::F32);
    check_in_blocks_of(1, c, f32, f32, 17);
}

/// Wide rows: the 7B's 4,096 columns, the widest on 128 units (32 column sums a unit kept in
/// registers), and MedGemma-27B's 5,376 on 256 units (21 a unit); the model's widths otherwise
/// only compile, in `scripts/cuda-source-check.sh`. In f32: an f16 output would put the rows scaled
/// by 1e-3 among f16's subnormals, whose absolute steps (2⁻²⁴) the relative tolerance does not
/// allow for.
#[test]
fn wide_rows_match_the_reference() {
    assert_eq!(rms_norm::backward_units(4_096), 128);
    assert_eq!(rms_norm::backward_units(5_376), 256);
    for (d, seed) in [(4_096, 19), (5_376, 23)] {
        check(case([19, d], false), DType::F32, seed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]
    /// Random shapes, layouts and rows a backward cube in f32.
    #[test]
    fn any_shape_and_layout_matches_the_reference(
        n in 1usize..150, d in 1usize..300, transposed: bool, seed in 0u64..1000,
        block_rows in 1usize..40,
    ) {
        let f32 = DType::F32;
        check_in_blocks_of(block_rows, case([n, d], transposed), f32, f32, seed);
    }
}

/// `dx` with `skip` added in the kernel, and `dg`, for `x` and `dy` of case `c` in `dtype` and
/// `skip` laid out as `layout`.
fn run_adding(c: &Case, i: &Inputs, skip: &[f32], layout: Input, dtype: DType) -> [Vec<f32>; 2] {
    run_adding_to(c, i, skip, layout, dtype, dtype)
}

/// [`run_adding`] with `dy` in `out` (bf16 training's layout: `x` f32, `dy` in the compute
/// dtype).
fn run_adding_to(
    c: &Case,
    i: &Inputs,
    skip: &[f32],
    layout: Input,
    dtype: DType,
    out: DType,
) -> [Vec<f32>; 2] {
    let [_, d] = c.shape;
    let skip = layout.upload(skip, c.shape, dtype);
    let dy = c.upload(&i.dy, out);
    let (dx, dg) = rms_norm::backward(
        c.upload(&i.x, dtype),
        upload(&i.gain, &[d], dtype),
        EPS,
        dy,
        Some(skip),
    );
    [download(dx), download(dg)]
}

/// In f32 the sum in the kernel rounds once, as the add after the norm's backward does: the
/// same bits, whatever the skip gradient's layout; `dg` is the plain backward's.
#[test]
fn adding_the_skip_gradient_has_the_bits_of_the_add_after() {
    let f32 = DType::F32;
    for (k, (c, layout, out)) in [
        (case([70, 129], false), Input::Contiguous, f32),
        (case([130, 33], true), Input::Transposed, f32),
        (case([6, 300], false), Input::Padded, f32),
        (case([9, 70], false), Input::Offset, f32),
        // bf16 training's dtypes, f16 standing in: `dy` in the compute dtype.
        (case([70, 129], false), Input::Contiguous, DType::F16),
    ]
    .into_iter()
    .enumerate()
    {
        let i = inputs(&c, 20 + k as u64, f32, out);
        let skip = values(c.shape[0] * c.shape[1], 30 + k as u64, f32);
        let [_, dx, dg] = run(&c, &i, f32, out);
        let added: Vec<f32> = dx.iter().zip(&skip).map(|(a, b)| a + b).collect();
        let [fused_dx, fused_dg] = run_adding_to(&c, &i, &skip, layout, f32, out);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused_dx), bits(&added), "dx, {c:?} skip {layout:?}");
        assert_eq!(bits(&fused_dg), bits(&dg), "dg, {c:?}");
    }
}

/// In f16 storage the sum is rounded once to f16: within f16's tolerance of the fp64 `dx`
/// plus the skip gradient, relative to the terms' sizes and the skip gradient's own.
#[test]
fn adding_the_skip_gradient_in_f16_matches_the_fp64_reference() {
    common::assert_device_has_f16();
    let f16 = DType::F16;
    for (k, c) in CASES.into_iter().enumerate() {
        let i = inputs(&c, 40 + k as u64, f16, f16);
        let skip = values(c.shape[0] * c.shape[1], 50 + k as u64, f16);
        let [dx, _] = run_adding(&c, &i, &skip, Input::Contiguous, f16);
        let [_, want, _] = reference(c.shape[1], &i);
        for (j, (got, (w, size))) in dx.iter().zip(want.value.iter().zip(&want.size)).enumerate() {
            let s = skip[j] as f64;
            let (err, bound) = (
                (*got as f64 - (w + s)).abs(),
                tolerance(f16) * (size + s.abs()),
            );
            assert!(
                err <= bound,
                "dx[{j}] {c:?}: got {got}, want {} ({err:.3e} > {bound:.3e})",
                w + s
            );
        }
    }
}
