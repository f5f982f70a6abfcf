//! SwiGLU's kernels on the fused gate-up product against an fp64 host reference on the GPU
//! device (wgpu, lavapipe in CI; CUDA in a build with only `--features cuda`).
//!
//! `h [N, 2f]` holds the gate in its first `f` columns and the up projection in the rest.
//! Outputs are poisoned with NaN before each launch, so an element a kernel forgot to write
//! fails. Inputs come contiguous, transposed (strided rows, as a gradient through a matmul's
//! transpose arrives) and padded (rows further apart than their width, as CUDA pads a
//! product's output); counts straddle the 256-unit cubes. The gate spans ±8: both tails of the
//! sigmoid.
//!
//! Tolerances, per element, relative to the terms' magnitudes (`|y|` forward; for `dg` the two
//! summands `|dy·u·σ|` and `|dy·u·g·σ|`, since `1 − σ` cancels when `σ ≈ 1`; `|du|` for `du`):
//! - f32: 2^-17. A few products in f32 (2^-24 each) and the device's `exp`, which Vulkan allows
//!   `3 + 2|x|` ulps (19 at |x| = 8).
//! - f16 storage (f32 arithmetic inside): that plus the output's rounding, 2^-11 of the value
//!   (2^-24 at least, f16's subnormal spacing). Inputs are rounded to f16 before the reference
//!   sees them.
//! - bf16 storage (CUDA builds only): the same with 2^-8 (f32's smallest normal at least).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::DType;
use lab_kernels::{swiglu, vectors};
use proptest::prelude::*;

use crate::common;
use common::{download, poisoned, values, Input};

#[derive(Clone, Copy, Debug)]
struct Case {
    /// `[N, f]`: `h` is `[N, 2f]`.
    shape: [usize; 2],
    h: Input,
    dy: Input,
}

/// `(h, dy)`, rounded to `dtype`: the gate (`h`'s first half of each row) ×8, the rest N(0, 1).
fn inputs([n, f]: [usize; 2], seed: u64, dtype: DType) -> (Vec<f32>, Vec<f32>) {
    let h = values(n * 2 * f, seed, dtype)
        .into_iter()
        .enumerate()
        .map(|(i, v)| match i % (2 * f) < f {
            true => common::rounded(v * 8.0, dtype),
            false => v,
        })
        .collect();
    (h, values(n * f, seed + 1, dtype))
}

/// One output element: its fp64 value and the magnitude its rounding scales with.
type Exact = (f64, f64);

/// fp64 `(y, dh)` of `h` and `dy`, each element with its terms' magnitude.
fn reference([n, f]: [usize; 2], h: &[f32], dy: &[f32]) -> (Vec<Exact>, Vec<Exact>) {
    let (mut y, mut dh) = (Vec::new(), vec![(0.0, 0.0); n * 2 * f]);
    for r in 0..n {
        for j in 0..f {
            let g = h[r * 2 * f + j] as f64;
            let u = h[r * 2 * f + f + j] as f64;
            let dy = dy[r * f + j] as f64;
            let s = 1.0 / (1.0 + (-g).exp());
            y.push((g * s * u, (g * s * u).abs()));
            let (through_u, through_sigmoid) = (dy * u * s, dy * u * g * s * (1.0 - s));
            let terms = through_u.abs() + (dy * u * g * s).abs();
            dh[r * 2 * f + j] = (through_u + through_sigmoid, terms);
            dh[r * 2 * f + f + j] = (dy * g * s, (dy * g * s).abs());
        }
    }
    (y, dh)
}

/// How far the kernel's element may be from the exact value (see the module docs).
fn bound(dtype: DType, (value, terms): Exact) -> f64 {
    let arithmetic = terms / (1u64 << 17) as f64;
    match dtype {
        DType::F32 => arithmetic,
        DType::BF16 => arithmetic + (value.abs() / 256.0).max(f32::MIN_POSITIVE as f64),
        _ => arithmetic + (value.abs() / 2048.0).max(1.0 / (1u64 << 24) as f64),
    }
}

fn assert_within(what: &str, got: &[f32], want: &[Exact], dtype: DType) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (err, bound) = ((*g as f64 - w.0).abs(), bound(dtype, *w));
        assert!(
            err <= bound,
            "{what}[{i}]: got {g}, want {} (error {err:.3e} > {bound:.3e})",
            w.0
        );
    }
}

/// Forward and backward of case `c` in `dtype` against the reference.
fn check(c: Case, dtype: DType, seed: u64) {
    let [n, f] = c.shape;
    let (h, dy) = inputs(c.shape, seed, dtype);
    let (y_want, dh_want) = reference(c.shape, &h, &dy);
    let upload_h = || c.h.upload(&h, [n, 2 * f], dtype);
    let y = download(swiglu::swiglu_into(upload_h(), poisoned(&[n, f], dtype)));
    let dh = download(swiglu::swiglu_backward_into(
        upload_h(),
        c.dy.upload(&dy, [n, f], dtype),
        poisoned(&[n, 2 * f], dtype),
    ));
    assert_within(&format!("y {c:?} {dtype:?}"), &y, &y_want, dtype);
    assert_within(&format!("dh {c:?} {dtype:?}"), &dh, &dh_want, dtype);
}

const fn case(shape: [usize; 2], h: Input, dy: Input) -> Case {
    Case { shape, h, dy }
}

const CASES: [Case; 9] = [
    case([1, 1], Input::Contiguous, Input::Contiguous),
    // Rows of whole vectors: the kernels read and write several columns a unit.
    case([65, 24], Input::Contiguous, Input::Contiguous),
    case([9, 40], Input::Offset, Input::Offset),
    case([3, 5], Input::Transposed, Input::Contiguous),
    case([7, 64], Input::Contiguous, Input::Transposed),
    case([33, 100], Input::Padded, Input::Padded),
    case([300, 17], Input::Transposed, Input::Transposed),
    // More than one cube of 256 units along a row.
    case([2, 1000], Input::Contiguous, Input::Padded),
    case([128, 2], Input::Padded, Input::Contiguous),
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

/// Where every row is whole vectors of the device's widest access, the kernels take them:
/// the cases above then test the vector path, not only one element a unit.
#[test]
fn rows_of_whole_vectors_are_read_as_vectors() {
    let (n, f) = (65, 24);
    let (h, dy) = inputs([n, f], 1, DType::F32);
    let h = Input::Offset.upload(&h, [n, 2 * f], DType::F32);
    let dy = Input::Contiguous.upload(&dy, [n, f], DType::F32);
    let widest = common::widest_f32_vector(&h);
    let (y, dh) = (
        poisoned(&[n, f], DType::F32),
        poisoned(&[n, 2 * f], DType::F32),
    );
    assert_eq!(vectors::row_vector_size(&[&h, &dy, &y, &dh], f), widest);
    // A transposed input or a width of part of a vector takes one element a unit.
    let hh = Input::Transposed.upload(&vec![0.0; 2 * n * f], [n, 2 * f], DType::F32);
    assert_eq!(vectors::row_vector_size(&[&hh, &dy], f), 1);
    assert_eq!(vectors::row_vector_size(&[&dy], widest + 1), 1);
}

/// The allocating launches give the allocated outputs' shapes, contiguous.
#[test]
fn outputs_are_new_contiguous_tensors() {
    let (n, f) = (5, 6);
    let (h, dy) = inputs([n, f], 3, DType::F32);
    let y = swiglu::swiglu(Input::Transposed.upload(&h, [n, 2 * f], DType::F32));
    let dh = swiglu::swiglu_backward(
        Input::Padded.upload(&h, [n, 2 * f], DType::F32),
        Input::Contiguous.upload(&dy, [n, f], DType::F32),
    );
    assert_eq!(y.meta.shape().as_slice(), [n, f]);
    assert_eq!(dh.meta.shape().as_slice(), [n, 2 * f]);
    assert!(y.is_contiguous() && dh.is_contiguous());
    let (y_want, dh_want) = reference([n, f], &h, &dy);
    assert_within("y", &download(y), &y_want, DType::F32);
    assert_within("dh", &download(dh), &dh_want, DType::F32);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Any shape and layout, f32.
    #[test]
    fn any_shape_matches_the_reference(
        n in 1usize..40, f in 1usize..70, h in Input::any(), dy in Input::any(), seed in 0u64..1000,
    ) {
        check(case([n, f], h, dy), DType::F32, seed);
    }
}
