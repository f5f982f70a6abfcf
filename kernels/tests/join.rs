//! The join kernel against the host's `[a | b]` and `[a | b | c]`, bit for bit (a copy), on
//! the GPU device
//! (wgpu, lavapipe in CI; CUDA in a build with only `--features cuda`). The output is poisoned
//! with NaN, so an element the kernel forgot fails; inputs come contiguous, transposed (strided
//! rows) and padded, in f32 and f16; counts straddle the 256-unit cubes. The padding kernel
//! (`[a | 0]`) is checked the same way, its zeros included.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::DType;
use lab_kernels::join;
use proptest::prelude::*;

use crate::common;
use common::{download, poisoned, values, Input};

/// The parts (row-major `[k, n_i]`) side by side on the host.
fn joined(parts: &[&[f32]], k: usize) -> Vec<f32> {
    let widths: Vec<usize> = parts.iter().map(|p| p.len() / k.max(1)).collect();
    (0..k)
        .flat_map(|r| {
            let rows = parts.iter().zip(&widths);
            rows.flat_map(move |(p, &n)| p[r * n..][..n].iter().copied())
        })
        .collect()
}

fn check(k: usize, widths: &[usize], layouts: &[Input], dtype: DType, seed: u64) {
    let parts: Vec<Vec<f32>> = widths
        .iter()
        .enumerate()
        .map(|(i, &n)| values(k * n, seed + i as u64, dtype))
        .collect();
    let uploaded = parts
        .iter()
        .zip(widths.iter().zip(layouts))
        .map(|(p, (&n, layout))| layout.upload(p, [k, n], dtype))
        .collect();
    let width = widths.iter().sum();
    let got = download(join::join_columns_into(
        uploaded,
        poisoned(&[k, width], dtype),
    ));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let refs: Vec<&[f32]> = parts.iter().map(|p| &p[..]).collect();
    let want = joined(&refs, k);
    assert_eq!(
        bits(&got),
        bits(&want),
        "{k}×{widths:?} {layouts:?} {dtype:?}"
    );
}

const CASES: [(usize, &[usize], &[Input]); 9] = [
    (1, &[1, 1], &[Input::Contiguous, Input::Contiguous]),
    (5, &[20, 31], &[Input::Offset, Input::Offset]),
    (3, &[5, 2], &[Input::Transposed, Input::Contiguous]),
    (7, &[64, 64], &[Input::Contiguous, Input::Padded]),
    (33, &[100, 9], &[Input::Padded, Input::Transposed]),
    // More than one cube of 256 units along a row.
    (2, &[300, 500], &[Input::Contiguous, Input::Contiguous]),
    // Three parts: the attention's q, k and v weights.
    (
        1,
        &[1, 1, 1],
        &[Input::Contiguous, Input::Contiguous, Input::Contiguous],
    ),
    (
        6,
        &[48, 16, 16],
        &[Input::Contiguous, Input::Transposed, Input::Offset],
    ),
    (
        33,
        &[7, 100, 2],
        &[Input::Padded, Input::Contiguous, Input::Transposed],
    ),
];

#[test]
fn f32_and_f16_are_the_hosts_join() {
    common::assert_device_has_f16();
    for (n, (k, widths, layouts)) in CASES.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            check(k, widths, layouts, dtype, n as u64);
        }
    }
}

/// The allocating launch gives a new contiguous `[K, N_a + N_b]`.
#[test]
fn the_join_is_a_new_contiguous_tensor() {
    let (a, b) = (values(12, 1, DType::F32), values(8, 2, DType::F32));
    let out = join::join_columns(vec![
        Input::Transposed.upload(&a, [4, 3], DType::F32),
        Input::Padded.upload(&b, [4, 2], DType::F32),
    ]);
    assert_eq!(out.meta.shape().as_slice(), [4, 5]);
    assert!(out.is_contiguous());
    assert_eq!(download(out), joined(&[&a, &b], 4));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn any_shape_is_the_hosts_join(
        k in 1usize..20, widths in proptest::collection::vec(1usize..40, 2..=3),
        layouts in proptest::collection::vec(Input::any(), 3), seed in 0u64..1000,
    ) {
        check(k, &widths, &layouts[..widths.len()], DType::F32, seed);
    }
}

/// `[a | 0]` of row-major `a [k, n_a]`, `width` columns, on the host.
fn padded_with_zeros(a: &[f32], k: usize, width: usize) -> Vec<f32> {
    joined(&[a, &vec![0.0; k * (width - a.len() / k.max(1))]], k)
}

fn check_pad([k, n_a, width]: [usize; 3], layout: Input, dtype: DType, seed: u64) {
    let a = values(k * n_a, seed, dtype);
    let got = download(join::pad_columns_into(
        layout.upload(&a, [k, n_a], dtype),
        poisoned(&[k, width], dtype),
    ));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let want = padded_with_zeros(&a, k, width);
    assert_eq!(
        bits(&got),
        bits(&want),
        "{k}×{n_a} → {width} {layout:?} {dtype:?}"
    );
}

/// x1-50m's head pads 50,257 words to 50,304; here the same kind of gap at small sizes, none,
/// and rows wider than a cube.
#[test]
fn padding_f32_and_f16_is_the_hosts() {
    common::assert_device_has_f16();
    let cases = [
        ([1, 1, 1], Input::Contiguous),
        ([3, 5, 64], Input::Transposed),
        ([7, 57, 64], Input::Padded),
        ([2, 300, 320], Input::Contiguous),
        ([4, 50, 64], Input::Offset),
    ];
    for (n, (dims, layout)) in cases.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            check_pad(dims, layout, dtype, n as u64);
        }
    }
}

/// The allocating launch gives a new contiguous `[K, width]`.
#[test]
fn the_padding_is_a_new_contiguous_tensor() {
    let a = values(12, 1, DType::F32);
    let out = join::pad_columns(Input::Transposed.upload(&a, [4, 3], DType::F32), 5);
    assert_eq!(out.meta.shape().as_slice(), [4, 5]);
    assert!(out.is_contiguous());
    assert_eq!(download(out), padded_with_zeros(&a, 4, 5));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn any_shape_pads_as_the_host(
        k in 1usize..20, n_a in 1usize..40, pad in 0usize..70, a in Input::any(),
        seed in 0u64..1000,
    ) {
        check_pad([k, n_a, n_a + pad], a, DType::F32, seed);
    }
}

/// x1-50m's head is 768 × 50,304 after padding, ~151K cubes of 256 units: more than a grid
/// axis holds (65,535), so the cubes spill onto its y axis. Here just past that count.
#[test]
fn padding_past_65535_cubes_writes_every_element() {
    let (k, n_a, width) = (257, 65_500, 65_600);
    assert!(k * width > 65_535 * 256);
    check_pad([k, n_a, width], Input::Contiguous, DType::F32, 7);
}
