//! The LM-head loss's row kernels against an fp64 host reference on the GPU device (wgpu,
//! lavapipe in CI; CUDA in a build with only `--features cuda`).
//!
//! Each chunk's kernels write rows `offset .. offset + c` of `[N]` outputs poisoned with NaN:
//! the rows inside must match the reference and the rows outside must stay NaN. Vocabularies
//! include ones smaller than the cube's 256 units (units that see no column), not multiples
//! of it, and logits large enough (|x| up to ~150) that an unshifted `exp` would overflow f32.
//! Some logits are padded views (rows further apart than their length, as CUDA lays out a
//! matmul's output) whose padding holds NaN: reading it poisons the row, writing it shows.
//!
//! Tolerances:
//! - log-sum-exp and loss (f32 arithmetic for every storage type): 1e-5 of the largest
//!   reference magnitude, at least 1. Each unit sums at most ~20 terms and the cube combines
//!   256 pairs in 8 levels: a few f32 roundings each.
//! - gradient, `(p − onehot) · grad_loss / N`, whose entries are at most `grad_loss / N` in
//!   magnitude: 1e-5 in f32 and 1e-3 in f16 of that bound. Not of the largest entry: where the
//!   target's `p` is near 1 every entry is small, and the target's `p − 1` cancels, so `p`'s
//!   own f32 error (a few ulps of 1, more with lavapipe's `exp`) is all of it; a proptest case
//!   found 3e-7 of error on entries of 1.6e-5. The f16 gradient is stored in f16, which rounds
//!   every entry by up to 2^-11 ≈ 4.9e-4 of itself; 8e-3 in bf16 (CUDA builds only), whose
//!   rounding is up to 2^-8 ≈ 3.9e-3.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::{DType, Int, Tensor, TensorData};
use lab_kernels::{lm_head, vectors};
use proptest::prelude::*;

use crate::common;
use common::{
    assert_close, assert_close_to_scale, assert_padding_untouched, device, download, padded,
    poisoned, rounded, upload, values, Prim, B,
};

#[derive(Clone, Copy, Debug)]
struct Case {
    /// Rows in this chunk.
    rows: usize,
    vocab: usize,
    /// Rows in the whole call (the `[N]` outputs); the chunk starts at `offset`.
    total: usize,
    offset: usize,
    /// Logits are N(0, 1) × `spread`.
    spread: f32,
    /// NaN columns after each row's `vocab` (0: a contiguous `[rows, vocab]` tensor).
    pad: usize,
}

fn targets(c: &Case, seed: u64) -> Vec<i32> {
    (0..c.total)
        .map(|i| ((i as u64 * 7919 + seed * 104_729) % c.vocab as u64) as i32)
        .collect()
}

fn upload_ids(ids: &[i32]) -> Prim {
    let n = ids.len();
    Tensor::<B, 1, Int>::from_data(TensorData::new(ids.to_vec(), [n]), &device()).into_primitive()
}

/// Per chunk row: (lse, loss, gradient row) in fp64.
fn reference(
    c: &Case,
    logits: &[f32],
    ids: &[i32],
    grad_loss: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut lse, mut loss, mut grad) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..c.rows {
        let row: Vec<f64> = logits[r * c.vocab..(r + 1) * c.vocab]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let t = ids[c.offset + r] as usize;
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let l = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        lse.push(l);
        loss.push(l - row[t]);
        for (j, x) in row.iter().enumerate() {
            let onehot = if j == t { 1.0 } else { 0.0 };
            grad.push(((x - l).exp() - onehot) * grad_loss / c.total as f64);
        }
    }
    (lse, loss, grad)
}

/// The chunk's rows of `got`, after checking every row outside it is still NaN.
fn chunk_rows(name: &str, got: Vec<f32>, c: &Case) -> Vec<f32> {
    for (i, x) in got.iter().enumerate() {
        let inside = (c.offset..c.offset + c.rows).contains(&i);
        assert!(
            inside || x.is_nan(),
            "{name}[{i}] outside the chunk was written: {x}"
        );
    }
    got[c.offset..c.offset + c.rows].to_vec()
}

/// The chunk's logits on the device: `[rows, vocab]`, or a view of `[rows, vocab + pad]`
/// whose padding is NaN. Returns (the logits, the whole buffer).
fn upload_logits(c: &Case, logits: &[f32], dtype: DType) -> (Prim, Prim) {
    let (view, whole) = padded(logits, [c.rows, c.vocab], c.pad, dtype);
    // The case tests what it says: a padded case really has strided rows.
    assert_eq!(view.is_contiguous(), c.pad == 0, "{c:?}");
    (view, whole)
}

fn check(c: Case, dtype: DType, seed: u64) {
    let grad_tol = match dtype {
        DType::F32 => 1e-5,
        DType::BF16 => 8e-3,
        _ => 1e-3,
    };
    let logits: Vec<f32> = values(c.rows * c.vocab, seed, DType::F32)
        .into_iter()
        .map(|x| rounded(x * c.spread, dtype))
        .collect();
    let ids = targets(&c, seed);
    let grad_loss = 0.75;
    let (want_lse, want_loss, want_grad) = reference(&c, &logits, &ids, grad_loss);

    let (logits_dev, whole) = upload_logits(&c, &logits, dtype);
    let ids_dev = upload_ids(&ids);
    let lse = poisoned(&[c.total], DType::F32);
    let loss = poisoned(&[c.total], DType::F32);
    lm_head::row_loss(logits_dev.clone(), ids_dev.clone(), &lse, &loss, c.offset);
    let got_lse = chunk_rows("lse", download(lse.clone()), &c);
    let got_loss = chunk_rows("loss", download(loss), &c);
    assert_close("lse", &got_lse, &want_lse, 1e-5);
    assert_close("loss", &got_loss, &want_loss, 1e-5);

    let scale = upload(&[grad_loss as f32], &[1], DType::F32);
    let inv_rows = 1.0 / c.total as f32;
    lm_head::softmax_grad_in_place(&logits_dev, ids_dev, lse, scale, inv_rows, c.offset);
    let bound = grad_loss / c.total as f64; // |p − onehot| ≤ 1
    assert_close_to_scale("grad", &download(logits_dev), &want_grad, grad_tol, bound);
    assert_padding_untouched(whole, c.vocab);
}

/// 257 columns of rows 304 apart: a row's last vector (of 4 on lavapipe, 8 on CUDA) reaches
/// into the padding.
const LAST_VECTOR_IN_PADDING: Case = Case {
    rows: 3,
    vocab: 257,
    total: 3,
    offset: 0,
    spread: 2.0,
    pad: 47,
};

const CASES: [Case; 8] = [
    // A chunk in the middle of the rows; vocabulary not a multiple of 256.
    Case {
        rows: 3,
        vocab: 1000,
        total: 7,
        offset: 2,
        spread: 1.0,
        pad: 0,
    },
    // Fewer columns than units: most units see nothing.
    Case {
        rows: 4,
        vocab: 50,
        total: 10,
        offset: 6,
        spread: 3.0,
        pad: 0,
    },
    Case {
        rows: 1,
        vocab: 3,
        total: 1,
        offset: 0,
        spread: 1.0,
        pad: 0,
    },
    Case {
        rows: 5,
        vocab: 257,
        total: 5,
        offset: 0,
        spread: 1.0,
        pad: 0,
    },
    // Logits up to ~150: exp without the running max overflows f32.
    Case {
        rows: 2,
        vocab: 5000,
        total: 3,
        offset: 1,
        spread: 40.0,
        pad: 0,
    },
    // Padded rows, NaN in the padding: 128 columns, and 47 as the loss pads 50,257 words to
    // 50,304 (views from `leading_columns`, whatever the cut's alignment).
    Case {
        rows: 3,
        vocab: 300,
        total: 5,
        offset: 1,
        spread: 1.0,
        pad: 128,
    },
    LAST_VECTOR_IN_PADDING,
    Case {
        rows: 4,
        vocab: 40,
        total: 4,
        offset: 0,
        spread: 3.0,
        pad: 128,
    },
];

#[test]
fn f32_rows_match_the_fp64_reference() {
    for (i, c) in CASES.into_iter().enumerate() {
        check(c, DType::F32, i as u64 + 1);
    }
}

#[test]
fn f16_rows_match_the_fp64_reference() {
    common::assert_device_has_f16();
    for (i, c) in CASES.into_iter().enumerate() {
        check(c, DType::F16, i as u64 + 11);
    }
}

#[cfg(not(feature = "wgpu"))]
#[test]
fn bf16_rows_match_the_fp64_reference() {
    for (i, c) in CASES.into_iter().enumerate() {
        check(c, DType::BF16, i as u64 + 21);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn random_chunks_match_the_fp64_reference(
        rows in 1usize..6,
        vocab in 1usize..700,
        before in 0usize..4,
        after in 0usize..4,
        seed in 0u64..1000,
        pad in prop_oneof![Just(0usize), 1usize..130],
    ) {
        let total = before + rows + after;
        let c = Case { rows, vocab, total, offset: before, spread: 2.0, pad };
        check(c, DType::F32, seed);
    }
}

/// The padded cases above are read in the device's widest vectors, the last of each row
/// reaching into the NaN padding (257 columns of rows 304 apart): the cases test that the
/// kernels leave those lanes out, and write them back as they were.
#[test]
fn padded_rows_are_read_in_vectors_past_their_last_column() {
    let (view, _) = padded(&vec![0.0; 3 * 257], [3, 257], 47, DType::F32);
    let widest = common::widest_f32_vector(&view);
    assert!(
        widest > 1 && 257 % widest != 0,
        "a last vector part padding"
    );
    assert_eq!(vectors::padded_row_vector_size(&[&view], 257), widest);
    // Contiguous rows of 257: the last vector would run into the next row.
    let contiguous = upload(&vec![0.0; 3 * 257], &[3, 257], DType::F32);
    assert_eq!(vectors::padded_row_vector_size(&[&contiguous], 257), 1);
}

/// Padding that holds a finite logit, far above the row's: read, it would take over the
/// row's `lse`; written, it would change. Both kernels leave it out and keep its value (NaN
/// padding cannot show a write that puts NaN back).
#[test]
fn padding_with_a_large_logit_is_neither_counted_nor_changed() {
    let c = LAST_VECTOR_IN_PADDING;
    let width = c.vocab + c.pad;
    let logits = values(c.rows * c.vocab, 5, DType::F32);
    let ids = targets(&c, 5);
    let (want_lse, _, want_grad) = reference(&c, &logits, &ids, 1.0);
    let mut full = vec![1000.0; c.rows * width];
    for r in 0..c.rows {
        full[r * width..][..c.vocab].copy_from_slice(&logits[r * c.vocab..][..c.vocab]);
    }
    let whole = upload(&full, &[c.rows, width], DType::F32);
    let view = lm_head::leading_columns(&whole, c.vocab);
    let (ids, lse) = (upload_ids(&ids), poisoned(&[c.total], DType::F32));
    let loss = poisoned(&[c.total], DType::F32);
    lm_head::row_loss(view.clone(), ids.clone(), &lse, &loss, 0);
    assert_close("lse", &download(lse.clone()), &want_lse, 1e-5);
    let scale = upload(&[1.0], &[1], DType::F32);
    lm_head::softmax_grad_in_place(&view, ids, lse, scale, 1.0 / c.total as f32, 0);
    assert_close_to_scale("grad", &download(view), &want_grad, 1e-5, 1.0 / 3.0);
    for (i, x) in download(whole).iter().enumerate() {
        assert!(i % width < c.vocab || *x == 1000.0, "padding [{i}] is {x}");
    }
}

/// An id past the vocabulary (in a row's last vector, among its padding, or past the row)
/// finds no logit: the loss is `lse` less the lowest f32, which rounds to f32's largest, the
/// same on every run.
#[test]
fn an_id_past_the_vocabulary_gives_the_largest_loss() {
    let (rows, vocab) = (2, 257);
    let logits = values(rows * vocab, 1, DType::F32);
    let (view, _) = padded(&logits, [rows, vocab], 47, DType::F32);
    let (lse, loss) = (poisoned(&[rows], DType::F32), poisoned(&[rows], DType::F32));
    lm_head::row_loss(view, upload_ids(&[260, 5000]), &lse, &loss, 0);
    assert_eq!(download(loss), [f32::MAX, f32::MAX]);
    assert!(download(lse).iter().all(|l| l.is_finite()));
}

#[test]
fn more_rows_than_one_grid_axis_holds() {
    // 65,536 rows: one past wgpu's 65,535 cubes per axis, so the rows spill into a second.
    let c = Case {
        rows: 65_536,
        vocab: 3,
        total: 65_536,
        offset: 0,
        spread: 1.0,
        pad: 0,
    };
    check(c, DType::F32, 7);
}

#[test]
fn add_widened_sums_padded_views_through_their_own_strides() {
    // The accumulator and the addend padded differently, as an f32 and an f16 matrix of the
    // same shape are on CUDA.
    let (rows, cols) = (7, 30);
    let acc_host = values(rows * cols, 8, DType::F32);
    let x_host = values(rows * cols, 9, DType::F16);
    let (acc, acc_whole) = padded(&acc_host, [rows, cols], 64, DType::F32);
    let (x, _) = padded(&x_host, [rows, cols], 128, DType::F16);
    assert!(
        !acc.is_contiguous() && !x.is_contiguous(),
        "both are padded views"
    );
    lm_head::add_widened(&acc, x);
    let want: Vec<f32> = acc_host.iter().zip(&x_host).map(|(a, x)| a + x).collect();
    assert_eq!(download(acc), want);
    assert_padding_untouched(acc_whole, cols);
}

/// Rows of 30 columns, 64 apart: 4 a vector on every device here, the last vector of a row
/// reaching two columns into the padding, which holds a finite value (NaN plus anything is
/// NaN again). The sums are the host's bits and the padding keeps its value.
#[test]
fn add_widened_leaves_the_accumulators_padding_as_it_was() {
    let (rows, cols, width) = (5, 30, 64);
    let acc_host = values(rows * cols, 3, DType::F32);
    let x_host = values(rows * cols, 4, DType::F16);
    let mut full = vec![1000.0; rows * width];
    for r in 0..rows {
        full[r * width..][..cols].copy_from_slice(&acc_host[r * cols..][..cols]);
    }
    let acc_whole = upload(&full, &[rows, width], DType::F32);
    let acc = lm_head::leading_columns(&acc_whole, cols);
    let (x, _) = padded(&x_host, [rows, cols], 2, DType::F16);
    let widest = common::widest_f32_vector(&acc);
    assert!(widest > 2, "a vector that reaches into the padding");
    assert_eq!(vectors::padded_row_vector_size(&[&acc, &x], cols), widest);
    lm_head::add_widened(&acc, x);
    let want: Vec<f32> = acc_host.iter().zip(&x_host).map(|(a, x)| a + x).collect();
    assert_eq!(download(acc), want);
    for (i, v) in download(acc_whole).iter().enumerate() {
        assert!(i % width < cols || *v == 1000.0, "padding [{i}] is {v}");
    }
}

#[test]
fn add_widened_sums_an_f16_tensor_into_the_f32_accumulator_in_place() {
    // 1,000 elements: more than one cube of 256, not a multiple of it.
    let (shape, n) = ([40, 25], 1000);
    let acc_host = values(n, 5, DType::F32);
    let x_host = values(n, 6, DType::F16);
    let acc = upload(&acc_host, &shape, DType::F32);
    lm_head::add_widened(&acc, upload(&x_host, &shape, DType::F16));
    lm_head::add_widened(&acc, upload(&x_host, &shape, DType::F16));
    // f16 → f32 is exact, so the GPU does exactly these two f32 additions.
    let want: Vec<f32> = acc_host
        .iter()
        .zip(&x_host)
        .map(|(a, x)| a + x + x)
        .collect();
    assert_eq!(download(acc), want);
}
