//! The RoPE kernel against an fp64 host reference on the GPU device (wgpu, lavapipe in CI; CUDA
//! in a build with only `--features cuda`).
//!
//! Outputs are poisoned with NaN before each launch, so an element the kernel forgot to
//! write fails the comparison. Inputs come in the layouts the model passes: contiguous,
//! `[B, T, H, hd]` with its middle axes swapped (q, k and v as projected), rows strided (a
//! gradient through the score matmul's transpose), and tables narrowed out of longer ones
//! (positions after a KV cache). Head widths go down to 2; counts are odd; the tables are
//! random (not only the model's, whose halves share angles). Each case also runs the
//! transpose (RoPE's backward, `rope_transposed`), whose reference turns by `−swap_halves(sin)`.
//!
//! Tolerances, per element, from the terms' sizes `|x[i]·c| + |x[i+h]·s|` (inputs have a
//! standard deviation of 2, so the two products can be large and cancel):
//! - f32: 2^-22 of the terms. Two products and a sum in f32, each rounded once, are within
//!   3 · 2^-24 of them (a fused multiply-add only rounds less).
//! - f16 storage (f32 arithmetic inside): that plus the output's own rounding, 2^-11 of |y|
//!   (2^-24 at least, f16's subnormal spacing). Inputs are rounded to f16 before the reference
//!   sees them.
//! - bf16 storage (CUDA builds only): the same with bf16's rounding, 2^-8 of |y| (f32's
//!   smallest normal at least, looser than bf16's subnormal spacing).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::{DType, Tensor, TensorPrimitive};
use lab_kernels::{rope, vectors};
use proptest::prelude::*;

use crate::common;
use common::{download, upload, values, Layout, Prim, B};

#[derive(Clone, Copy, Debug)]
struct Case {
    shape: [usize; 4],
    layout: Layout,
    /// Where the kernel writes the output: [`output_layout`] of `layout`, as [`rope::rope`]
    /// allocates it, or another layout of unit-stride rows.
    out: Layout,
    /// The tables are rows `offset .. offset + T` of `[offset + T + 2, hd]` ones.
    offset: usize,
}

/// `values` scaled to a standard deviation of 2, then rounded to `dtype` so the reference sees what
/// the GPU sees.
fn inputs(n: usize, seed: u64, dtype: DType) -> Vec<f32> {
    values(n, seed, dtype)
        .into_iter()
        .map(|v| common::rounded(v * 2.0, dtype))
        .collect()
}

/// fp64 `(y, terms)` for `x` (logical `[B, H, T, hd]`, row-major) and `[T, hd]` tables:
/// `terms` is each element's sum of the two products' magnitudes, which scales its rounding.
fn reference(shape: [usize; 4], x: &[f32], cos: &[f32], sin: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let [_, _, t, hd] = shape;
    let h = hd / 2;
    let (mut y, mut terms) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    for (row, base) in (0..x.len()).step_by(hd).enumerate() {
        let p = row % t;
        let (xv, c, s) = (
            |i: usize| x[base + i] as f64,
            |i: usize| cos[p * hd + i] as f64,
            |i: usize| sin[p * hd + i] as f64,
        );
        for i in 0..h {
            y[base + i] = xv(i) * c(i) - xv(i + h) * s(i);
            y[base + i + h] = xv(i + h) * c(i + h) + xv(i) * s(i + h);
            terms[base + i] = (xv(i) * c(i)).abs() + (xv(i + h) * s(i)).abs();
            terms[base + i + h] = (xv(i + h) * c(i + h)).abs() + (xv(i) * s(i + h)).abs();
        }
    }
    (y, terms)
}

/// How far the kernel's element may be from the exact `y` (see the module docs).
fn bound(dtype: DType, y: f64, terms: f64) -> f64 {
    let arithmetic = terms / (1u64 << 22) as f64;
    match dtype {
        DType::F32 => arithmetic,
        DType::BF16 => arithmetic + (y.abs() / 256.0).max(f32::MIN_POSITIVE as f64),
        _ => arithmetic + (y.abs() / 2048.0).max(1.0 / (1u64 << 24) as f64),
    }
}

/// Logical `[B, H, T, hd]` values in the case's layout on the device.
fn upload_x(c: &Case, x: &[f32], dtype: DType) -> Prim {
    c.layout.upload(x, c.shape, dtype)
}

/// Where [`rope::rope`] puts the output for an input in `layout`: the same layout where its
/// order of axes ends in the head width and it has no gaps, contiguous otherwise.
const fn output_layout(layout: Layout) -> Layout {
    match layout {
        Layout::RowsStrided | Layout::Padded => Layout::Contiguous,
        layout => layout,
    }
}

/// Rows `offset .. offset + t` of a longer `[rows, hd]` table on the device (a view).
fn upload_table(
    all: &[f32],
    rows: usize,
    hd: usize,
    offset: usize,
    t: usize,
    dtype: DType,
) -> Prim {
    let whole =
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(upload(all, &[rows, hd], dtype)));
    whole.narrow(0, offset, t).into_primitive().tensor()
}

/// `−swap_halves(sin)` of `[rows, hd]` host values: the table RoPE's transpose turns by.
fn backward_table(sin: &[f32], hd: usize) -> Vec<f32> {
    let half = hd / 2;
    let at = |k: usize| k - k % hd + (k % hd + half) % hd;
    (0..sin.len()).map(|k| -sin[at(k)]).collect()
}

/// The kernel's output for case `c`: RoPE, or its transpose (`transposed`), by the tables'
/// windows of `cos_all, sin_all`.
fn launch(
    c: &Case,
    x: &[f32],
    [cos_all, sin_all]: [&[f32]; 2],
    dtype: DType,
    transposed: bool,
) -> Vec<f32> {
    let [_, _, t, hd] = c.shape;
    let rows = cos_all.len() / hd;
    let run = if transposed {
        rope::rope_transposed_into
    } else {
        rope::rope_into
    };
    download(run(
        upload_x(c, x, dtype),
        upload_table(cos_all, rows, hd, c.offset, t, dtype),
        upload_table(sin_all, rows, hd, c.offset, t, dtype),
        c.out.poisoned(c.shape, dtype),
    ))
}

/// RoPE and its transpose against the fp64 reference (the transpose's is RoPE's by
/// `−swap_halves(sin)`).
fn check(c: Case, dtype: DType, seed: u64) {
    let [_, _, t, hd] = c.shape;
    let n = c.shape.iter().product();
    let rows = c.offset + t + 2;
    let x = inputs(n, seed, dtype);
    let (cos_all, sin_all) = (
        inputs(rows * hd, seed + 1, dtype),
        inputs(rows * hd, seed + 2, dtype),
    );
    let window = |all: &[f32]| all[c.offset * hd..(c.offset + t) * hd].to_vec();
    for transposed in [false, true] {
        let sin = match transposed {
            true => backward_table(&window(&sin_all), hd),
            false => window(&sin_all),
        };
        let (want, terms) = reference(c.shape, &x, &window(&cos_all), &sin);
        let got = launch(&c, &x, [&cos_all, &sin_all], dtype, transposed);
        for (i, ((g, w), terms)) in got.iter().zip(&want).zip(&terms).enumerate() {
            let (err, bound) = ((*g as f64 - w).abs(), bound(dtype, *w, *terms));
            assert!(
                err <= bound,
                "{c:?} {dtype:?} transposed {transposed} y[{i}]: got {g}, want {w} (error {err:.3e} > {bound:.3e})"
            );
        }
    }
}

/// The transpose reads `sin` as `−swap_halves(sin)` with exact negations: the same bits as
/// RoPE by that table, which backward used to build.
#[test]
fn the_transpose_has_the_bits_of_rope_by_the_backward_table() {
    for (k, c) in CASES.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            let [_, _, t, hd] = c.shape;
            let rows = c.offset + t + 2;
            let seed = 20 * k as u64;
            let x = inputs(c.shape.iter().product(), seed, dtype);
            let cos = inputs(rows * hd, seed + 1, dtype);
            let sin = inputs(rows * hd, seed + 2, dtype);
            let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let transposed = launch(&c, &x, [&cos, &sin], dtype, true);
            let by_table = launch(&c, &x, [&cos, &backward_table(&sin, hd)], dtype, false);
            assert_eq!(bits(transposed), bits(by_table), "{c:?} {dtype:?}");
        }
    }
}

/// `rope_transposed_added_into` adds the transpose into heads `1..1 + H` of a wider output
/// (`H + 2` heads, in the case's output layout): there, what the output held plus the
/// transpose, within the transpose's bound (the terms grown by the held value, for the add's
/// rounding) of the fp64 reference; the other heads keep their bits.
#[test]
fn the_added_transpose_adds_into_its_heads_of_a_wider_output() {
    for (k, c) in CASES.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            check_added(c, (1, 2), dtype, 30 * k as u64);
        }
    }
}

/// The adding transpose of case `c` into heads `first..first + H` of an output with `extra`
/// heads more, checked as the test above says.
fn check_added(c: Case, (first, extra): (usize, usize), dtype: DType, seed: u64) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let [b, h, t, hd] = c.shape;
    let wide = [b, h + extra, t, hd];
    let rows = c.offset + t + 2;
    let dy = inputs(c.shape.iter().product(), seed, dtype);
    let (cos, sin) = (
        inputs(rows * hd, seed + 1, dtype),
        inputs(rows * hd, seed + 2, dtype),
    );
    let held = inputs(wide.iter().product(), seed + 3, dtype);
    let table = |all: &[f32]| upload_table(all, rows, hd, c.offset, t, dtype);
    let got = download(rope::rope_transposed_added_into(
        upload_x(&c, &dy, dtype),
        table(&cos),
        table(&sin),
        c.out.upload(&held, wide, dtype),
        first,
    ));
    let window = |all: &[f32]| all[c.offset * hd..(c.offset + t) * hd].to_vec();
    let backward_sin = backward_table(&window(&sin), hd);
    let (y, terms) = reference(c.shape, &dy, &window(&cos), &backward_sin);
    let what = format!("{c:?} from head {first} of {} {dtype:?}", h + extra);
    let head_len = t * hd;
    for (i, (g, was)) in got.iter().zip(&held).enumerate() {
        let (head, row) = (i / head_len % (h + extra), i / ((h + extra) * head_len));
        if !(first..first + h).contains(&head) {
            assert_eq!(
                bits(&[*g]),
                bits(&[*was]),
                "{what}: element {i} of head {head}"
            );
            continue;
        }
        let j = (row * h + head - first) * head_len + i % head_len;
        let want = *was as f64 + y[j];
        let bound = bound(dtype, want, terms[j] + was.abs() as f64);
        let err = (*g as f64 - want).abs();
        assert!(
            err <= bound,
            "{what}: element {i}: got {g}, want {want} (error {err:.3e} > {bound:.3e})"
        );
    }
}

const fn case(shape: [usize; 4], layout: Layout, offset: usize) -> Case {
    case_into(shape, layout, output_layout(layout), offset)
}

/// A case whose output the test allocates in `out`.
const fn case_into(shape: [usize; 4], layout: Layout, out: Layout, offset: usize) -> Case {
    Case {
        shape,
        layout,
        out,
        offset,
    }
}

/// At head width 64 (x1-50m's) the kernel turns vectors of pairs, the tables and the
/// heads-swapped `x` read as vectors: the case of width 64 above tests that path. A half of 15
/// columns takes one pair a unit.
#[test]
fn head_rows_of_whole_vectors_are_read_as_vectors() {
    let c = case([3, 2, 9, 64], Layout::HeadsSwapped, 0);
    let x = upload_x(&c, &vec![1.0; 3 * 2 * 9 * 64], DType::F32);
    let table = upload_table(&vec![1.0; 11 * 64], 11, 64, 0, 9, DType::F32);
    let widest = common::widest_f32_vector(&x);
    assert_eq!(vectors::row_vector_size(&[&x, &table, &table], 32), widest);
    let odd = upload_x(
        &case([2, 5, 33, 30], Layout::Contiguous, 0),
        &[1.0; 9900],
        DType::F32,
    );
    assert_eq!(vectors::row_vector_size(&[&odd], 15), 1);
}

const CASES: [Case; 9] = [
    case([1, 1, 1, 2], Layout::Contiguous, 0),
    case([2, 3, 5, 6], Layout::HeadsSwapped, 3),
    case([1, 4, 7, 8], Layout::RowsStrided, 1),
    case([3, 2, 9, 64], Layout::HeadsSwapped, 0),
    case([2, 5, 33, 30], Layout::Contiguous, 7),
    case([1, 3, 300, 16], Layout::RowsStrided, 2),
    case([2, 3, 4, 10], Layout::Padded, 1),
    // Outputs in a layout other than the input's: each tensor at its own strides.
    case_into([2, 3, 5, 6], Layout::Contiguous, Layout::HeadsSwapped, 0),
    case_into([2, 4, 3, 8], Layout::HeadsSwapped, Layout::Padded, 2),
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

/// The output of [`rope::rope`] and [`rope::rope_transposed`] takes `x`'s layout where its
/// rows have unit stride: the model's swapped heads come out as the same view, so swapping
/// the axes back is free.
#[test]
fn the_output_takes_the_inputs_layout() {
    for c in CASES {
        let [_, _, t, hd] = c.shape;
        let (cos, sin) = (inputs(t * hd, 1, DType::F32), inputs(t * hd, 2, DType::F32));
        let x = inputs(c.shape.iter().product(), 3, DType::F32);
        for run in [rope::rope, rope::rope_transposed] {
            let y = run(
                upload_x(&c, &x, DType::F32),
                upload(&cos, &[t, hd], DType::F32),
                upload(&sin, &[t, hd], DType::F32),
            );
            assert!(
                output_layout(c.layout).holds(&y),
                "{c:?}: strides {:?}",
                y.meta.strides()
            );
        }
    }
}

/// An empty batch, or no positions, launches nothing and returns the (empty) output, in
/// either direction. (An empty tensor's strides may be 0, which burn counts as overlapping:
/// the output's check comes after the early return.)
#[test]
fn an_empty_input_gives_an_empty_output() {
    for (shape, layout) in [
        ([0, 2, 3, 4], Layout::Contiguous),
        ([2, 3, 0, 4], Layout::Contiguous),
        ([2, 3, 0, 4], Layout::HeadsSwapped),
    ] {
        let c = case(shape, layout, 0);
        let t = shape[2];
        let table = |seed| upload(&inputs(t * 4, seed, DType::F32), &[t, 4], DType::F32);
        for run in [rope::rope, rope::rope_transposed] {
            let y = run(upload_x(&c, &[], DType::F32), table(1), table(2));
            assert_eq!(y.meta.shape().as_slice(), shape);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// The adding transpose into random heads of a wider output, random shapes and layouts,
    /// in f32.
    #[test]
    fn the_added_transpose_adds_into_any_heads(
        b in 1usize..3, h in 1usize..4, t in 1usize..12, half in 1usize..8,
        heads in (0usize..3).prop_flat_map(|extra| (0..=extra, Just(extra))),
        layout in 0usize..4, out in 0usize..3, seed in 0u64..1000,
    ) {
        let out = [Layout::Contiguous, Layout::HeadsSwapped, Layout::Padded][out];
        let c = case_into([b, h, t, 2 * half], Layout::ALL[layout], out, 1);
        check_added(c, heads, DType::F32, seed);
    }

    /// Random shapes, input and output layouts and table windows in f32.
    #[test]
    fn any_shape_and_layout_matches_the_reference(
        b in 1usize..3, h in 1usize..5, t in 1usize..20, half in 1usize..20,
        offset in 0usize..5, layout in 0usize..4, out in 0usize..3, seed in 0u64..1000,
    ) {
        let out = [Layout::Contiguous, Layout::HeadsSwapped, Layout::Padded][out];
        let c = case_into([b, h, t, 2 * half], Layout::ALL[layout], out, offset);
        check(c, DType::F32, seed);
    }
}
