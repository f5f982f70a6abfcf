//! The embedding-backward kernel on the GPU device (wgpu, lavapipe in CI; CUDA in a build with
//! only `--features cuda`), against two references:
//! - the host, summing each row's positions in ascending order in the storage dtype, each
//!   addition rounded once (f32: IEEE; f16: the exact f32 sum of two f16 values rounded to
//!   f16): the kernel must give the same bits, as it claims;
//! - burn's own kernel on the same device (`embedding_backward`: `select_add` on zeros), which
//!   the trainer ran before: the same bits again, so the switch changes no training run.
//!
//! Outputs are poisoned with NaN, so an element the kernel forgot to write shows. Cases cross
//! the kernel's seams: ids on both sides of a slice boundary (512 rows), a frequent id, widths
//! that leave a cube's units idle (d = 300 with 256 units a cube), position counts that end
//! inside a tile of ids (256), no positions at all, and `dy` read through transposed strides.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::{ops::ModuleOps, DType, Int, Tensor, TensorData, TensorPrimitive};
use lab_kernels::embedding::{embedding_grad_into, ROWS_PER_SLICE};
use proptest::prelude::*;

use crate::common;
use common::{device, download, poisoned, rounded, upload, values, Prim, B};

#[derive(Clone, Debug)]
struct Case {
    vocab: usize,
    d: usize,
    ids: Vec<i32>,
    /// `dy` stored `[d, N]` and passed as its transpose.
    transposed: bool,
}

/// Ids that cross slice boundaries and repeat: `vocab`-wide, one id in three the same.
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<i32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let id = if i % 3 == 0 {
                vocab / 2
            } else {
                (s >> 33) as usize % vocab
            };
            id as i32
        })
        .collect()
}

fn upload_ids(ids: &[i32]) -> Prim {
    let t = Tensor::<B, 1, Int>::from_data(TensorData::new(ids.to_vec(), [ids.len()]), &device());
    t.into_primitive()
}

/// `dy [N, d]` on the device, contiguous or as the transpose of a `[d, N]` tensor.
fn upload_dy(dy: &[f32], [n, d]: [usize; 2], transposed: bool, dtype: DType) -> Prim {
    if !transposed {
        return upload(dy, &[n, d], dtype);
    }
    let stored: Vec<f32> = (0..d * n).map(|k| dy[(k % n) * d + k / n]).collect();
    let t = upload(&stored, &[d, n], dtype);
    let t = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)).transpose();
    let t = t.into_primitive().tensor();
    assert!(!t.is_contiguous(), "the case reads dy through its strides");
    t
}

/// Each row's positions summed in ascending order, in `dtype`, from zero.
fn host_grad(c: &Case, dy: &[f32], dtype: DType) -> Vec<f32> {
    let mut grad = vec![0f32; c.vocab * c.d];
    for (i, &id) in c.ids.iter().enumerate() {
        let row = &mut grad[id as usize * c.d..][..c.d];
        for (g, x) in row.iter_mut().zip(&dy[i * c.d..][..c.d]) {
            *g = rounded(*g + x, dtype);
        }
    }
    grad
}

/// burn's embedding backward on the same device: what the trainer ran before this kernel.
fn burns_grad(c: &Case, dy: &[f32], dtype: DType) -> Vec<f32> {
    let n = c.ids.len();
    let weights = upload(&vec![0.0; c.vocab * c.d], &[c.vocab, c.d], dtype);
    let dy = upload(dy, &[1, n, c.d], dtype);
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(c.ids.clone(), [1, n]), &device());
    download(B::embedding_backward(weights, dy, ids.into_primitive()))
}

fn check(c: &Case, dtype: DType, seed: u64) {
    let n = c.ids.len();
    let dy = values(n * c.d, seed, dtype);
    let grad = poisoned(&[c.vocab, c.d], dtype);
    let dy_dev = upload_dy(&dy, [n, c.d], c.transposed, dtype);
    let got = download(embedding_grad_into(
        dy_dev,
        upload_ids(&c.ids),
        grad,
        [n, c.d],
    ));
    let want = host_grad(c, &dy, dtype);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want), "{dtype:?} {c:?}: host's order");
    if n == 0 {
        return; // burn cannot shape an empty `[1, 0, d]` gradient to ask its kernel
    }
    assert_eq!(
        bits(&got),
        bits(&burns_grad(c, &dy, dtype)),
        "{dtype:?} {c:?}: burn's kernel"
    );
}

fn cases() -> Vec<Case> {
    let slice = ROWS_PER_SLICE as i32;
    vec![
        // Three slices; ids at both sides of each boundary, and repeated.
        Case {
            vocab: 1300,
            d: 8,
            ids: vec![
                0,
                slice - 1,
                slice,
                2 * slice - 1,
                2 * slice,
                1299,
                slice,
                0,
                slice - 1,
            ],
            transposed: false,
        },
        // A width past one cube (256 units): the second cube's units mostly idle.
        Case {
            vocab: 700,
            d: 300,
            ids: ids(300, 700, 1),
            transposed: false,
        },
        // Positions ending inside a tile of 256 ids, dy through transposed strides.
        Case {
            vocab: 97,
            d: 5,
            ids: ids(517, 97, 2),
            transposed: true,
        },
        // No positions: a zero table.
        Case {
            vocab: 33,
            d: 4,
            ids: vec![],
            transposed: false,
        },
    ]
}

#[test]
fn f32_sums_each_row_in_order_as_burns_kernel_does() {
    for (i, c) in cases().iter().enumerate() {
        check(c, DType::F32, i as u64 + 1);
    }
}

#[test]
fn f16_sums_each_row_in_order_as_burns_kernel_does() {
    common::assert_device_has_f16();
    for (i, c) in cases().iter().enumerate() {
        check(c, DType::F16, i as u64 + 11);
    }
}

#[cfg(not(feature = "wgpu"))]
#[test]
fn bf16_sums_each_row_in_order_as_burns_kernel_does() {
    for (i, c) in cases().iter().enumerate() {
        check(c, DType::BF16, i as u64 + 21);
    }
}

#[test]
fn the_sums_are_close_to_fp64() {
    // The in-order f32 sums of the kernel, against exact ones: x1-50m's frequent ids sum
    // thousands of positions, so the order's rounding is bounded here, not only repeated.
    let c = Case {
        vocab: 600,
        d: 3,
        ids: ids(4000, 600, 5),
        transposed: false,
    };
    let n = c.ids.len();
    let dy = values(n * c.d, 9, DType::F32);
    let got = download(embedding_grad_into(
        upload(&dy, &[n, c.d], DType::F32),
        upload_ids(&c.ids),
        poisoned(&[c.vocab, c.d], DType::F32),
        [n, c.d],
    ));
    let mut want = vec![0f64; c.vocab * c.d];
    for (i, &id) in c.ids.iter().enumerate() {
        for j in 0..c.d {
            want[id as usize * c.d + j] += dy[i * c.d + j] as f64;
        }
    }
    // ~1,330 terms of N(0, 1) in the frequent row: its sum's rounding stays below 1e-4 of
    // the largest sum.
    common::assert_close("grad", &got, &want, 1e-4);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn random_tables_match_burns_kernel_bit_for_bit(
        vocab in 1usize..1200,
        d in 1usize..40,
        n in 0usize..600,
        seed in 0u64..1000,
        transposed in any::<bool>(),
    ) {
        let c = Case { vocab, d, ids: ids(n, vocab, seed), transposed: transposed && n > 1 && d > 1 };
        check(&c, DType::F32, seed);
    }
}
