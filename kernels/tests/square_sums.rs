//! The sum-of-squares kernels against an fp64 host sum, on the GPU device (wgpu, lavapipe in
//! CI; CUDA in a build with only `--features cuda`).
//!
//! The partial sums' buffer and the output are poisoned with NaN, so a slot no cube wrote (or
//! one the last launch read past) fails. Sizes include 1, non-multiples of the cube's 256
//! units, an empty tensor, and one with more elements than 1,024 cubes × 256 units (so each
//! unit sums two or three elements); one tensor comes as a transposed view and one as a view
//! with padded rows (as a weight's gradient that is part of a wider one), both read at their
//! strides.
//!
//! Tolerance: every term is positive, so each f32 addition's rounding is relative to the
//! running sum, which is at most the total. A unit adds `k` squares, then a tree of 8 levels;
//! the last cube adds `⌈count/256⌉` partials per unit and another tree of 8: the total is off
//! by at most `(k + ⌈count/256⌉ + 17)·2⁻²⁴` of itself (one more for the square's own rounding).
//! Inputs are rounded to the storage type before the reference sees them; f16 elements are
//! squared in f32, so f16 storage adds nothing. A missing tensor or element is off by far more.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::DType;
use lab_kernels::square_sums::{self, cubes_for, partials_len};
use proptest::prelude::*;

use crate::common;
use common::{download, poisoned, values, Input as Layout, Prim};

/// One input: its shape, and how it lies on the device.
#[derive(Clone, Copy, Debug)]
struct Input {
    shape: [usize; 2],
    layout: Layout,
}

const fn input(shape: [usize; 2], layout: Layout) -> Input {
    Input { shape, layout }
}

impl Input {
    fn upload(&self, data: &[f32], dtype: DType) -> Prim {
        self.layout.upload(data, self.shape, dtype)
    }
}

/// x1-50m's kinds of parameter at small sizes, and the edges: one element, an empty tensor,
/// a transposed view, a padded one and one at an offset (a sum of squares ignores order, so it
/// is these two that catch a view read as if contiguous: it would read their NaN), and
/// 2 × 1,024 × 256 + 256 elements (over 1,024 cubes of 256 units every
/// unit sums two, and cube 0's three).
const INPUTS: [Input; 8] = [
    input([1, 1], Layout::Contiguous),
    input([7, 37], Layout::Contiguous),
    input([0, 5], Layout::Contiguous),
    input([300, 33], Layout::Transposed),
    input([61, 40], Layout::Padded),
    input([9, 70], Layout::Offset),
    input([1, 257], Layout::Contiguous),
    input([2 * 1024 + 1, 256], Layout::Contiguous),
];

/// Each input's values (rounded to `dtype`), seeded by `seed`.
fn host_values(inputs: &[Input], seed: u64, dtype: DType) -> Vec<Vec<f32>> {
    let n = |i: &Input| i.shape[0] * i.shape[1];
    (0..)
        .zip(inputs)
        .map(|(k, i)| values(n(i), seed + k, dtype))
        .collect()
}

/// The kernels' sum over `inputs`, into a NaN-poisoned partials buffer of exactly the slots
/// they need (one at least) and a poisoned output.
fn run(inputs: &[Input], host: &[Vec<f32>], dtype: DType) -> f32 {
    let xs: Vec<Prim> = inputs
        .iter()
        .zip(host)
        .map(|(i, v)| i.upload(v, dtype))
        .collect();
    let count = partials_len(host.iter().map(Vec::len));
    let partials = poisoned(&[count.max(1)], DType::F32);
    let out = poisoned(&[1], DType::F32);
    download(square_sums::sum_of_squares_into(xs, partials, out))[0]
}

fn check(inputs: &[Input], seed: u64, dtype: DType) {
    let host = host_values(inputs, seed, dtype);
    let got = run(inputs, &host, dtype) as f64;
    let want: f64 = host.iter().flatten().map(|&x| (x as f64).powi(2)).sum();
    let count = partials_len(host.iter().map(Vec::len));
    let longest = host
        .iter()
        .map(|v| v.len().div_ceil(256 * cubes_for(v.len()).max(1)));
    let k = longest.max().unwrap_or(0);
    let tol = (k + count.div_ceil(256) + 18) as f64 * 2f64.powi(-24);
    assert!(
        (got - want).abs() <= tol * want,
        "{dtype:?} {inputs:?}: {got} vs {want} (tolerance {tol:e} of it)"
    );
}

#[test]
fn f32_matches_the_fp64_sum() {
    check(&INPUTS, 1, DType::F32);
}

#[test]
fn f16_matches_the_fp64_sum() {
    common::assert_device_has_f16();
    check(&INPUTS, 2, DType::F16);
}

#[cfg(not(feature = "wgpu"))]
#[test]
fn bf16_matches_the_fp64_sum() {
    check(&INPUTS, 3, DType::BF16);
}

/// Every slot has one writer and every sum a fixed order: the same inputs give the same bits
/// (lavapipe runs cubes in a steady order, so this guards the order of the sums more than a
/// race).
#[test]
fn results_repeat_bit_for_bit() {
    let host = host_values(&INPUTS, 4, DType::F32);
    let sums = [0, 1].map(|_| run(&INPUTS, &host, DType::F32).to_bits());
    assert_eq!(sums[0], sums[1]);
}

/// Only empty tensors: the sum over nothing is zero, written over the poisoned output.
#[test]
fn empty_tensors_sum_to_zero() {
    let inputs = [
        input([0, 3], Layout::Contiguous),
        input([4, 0], Layout::Transposed),
        input([0, 3], Layout::Transposed),
    ];
    let host = host_values(&inputs, 5, DType::F32);
    assert_eq!(run(&inputs, &host, DType::F32), 0.0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Any number of tensors of any sizes and layouts, in any order: the same sum as the
    /// host's.
    #[test]
    fn any_set_of_tensors_matches_the_fp64_sum(
        shapes in prop::collection::vec(((0usize..70), (1usize..90), Layout::any()), 1..6),
        seed in 0u64..1000,
    ) {
        let inputs: Vec<Input> = shapes.iter().map(|&(r, c, l)| input([r, c], l)).collect();
        check(&inputs, seed, DType::F32);
    }
}
