//! `accumulate::add_into` against the host's f32 sum rounded to the storage type, bit for bit,
//! on the GPU device (wgpu, lavapipe in CI; CUDA in a build with only `--features cuda`): the
//! value and the output each in any of the test layouts (contiguous, heads swapped, rows
//! strided, padded), counts straddling the 256-unit cubes, into the heads of an output with
//! more of them, whose other heads keep their bits; and into a `[B·T, W]` tensor seen as heads,
//! as the joined q|k|v product's gradient receives v's.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::{DType, Tensor, TensorPrimitive};
use lab_kernels::accumulate;
use proptest::prelude::*;

use crate::common;
use common::{download, upload, values, Layout, B};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `value [b, h, t, hd]` added into heads `first..first + h` of an output with `extra` more.
fn check(
    shape @ [b, h, t, hd]: [usize; 4],
    [value_layout, out_layout]: [Layout; 2],
    (first, extra): (usize, usize),
    dtype: DType,
    seed: u64,
) {
    let wide = [b, h + extra, t, hd];
    let value = values(shape.iter().product(), seed, dtype);
    let held = values(wide.iter().product(), seed + 1, dtype);
    let got = download(accumulate::add_into(
        value_layout.upload(&value, shape, dtype),
        out_layout.upload(&held, wide, dtype),
        first,
    ));
    let head = t * hd;
    let want: Vec<f32> = (0..held.len())
        .map(|i| {
            let (hi, bi) = (i / head % (h + extra), i / (head * (h + extra)));
            match hi.checked_sub(first).filter(|&j| j < h) {
                Some(j) => common::rounded(held[i] + value[(bi * h + j) * head + i % head], dtype),
                None => held[i],
            }
        })
        .collect();
    let what =
        format!("{shape:?} {value_layout:?} into {out_layout:?} from head {first} {dtype:?}");
    assert_eq!(bits(&got), bits(&want), "{what}");
}

/// A value's shape, the value's and the output's layouts, and `(first, extra)`: the output's
/// heads from which the value's go, and how many more it has.
type Case = ([usize; 4], [Layout; 2], (usize, usize));

const CASES: [Case; 6] = [
    (
        [1, 1, 1, 1],
        [Layout::Contiguous, Layout::Contiguous],
        (0, 0),
    ),
    (
        [2, 3, 5, 6],
        [Layout::Contiguous, Layout::HeadsSwapped],
        (0, 0),
    ),
    ([1, 4, 7, 8], [Layout::RowsStrided, Layout::Padded], (1, 2)),
    (
        [3, 2, 9, 64],
        [Layout::HeadsSwapped, Layout::HeadsSwapped],
        (3, 3),
    ),
    // More than one cube of 256 units.
    (
        [2, 3, 33, 10],
        [Layout::Padded, Layout::RowsStrided],
        (0, 1),
    ),
    (
        [2, 1, 40, 8],
        [Layout::HeadsSwapped, Layout::Contiguous],
        (2, 2),
    ),
];

#[test]
fn f32_and_f16_are_the_hosts_sum() {
    common::assert_device_has_f16();
    for (k, (shape, layouts, heads)) in CASES.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            check(shape, layouts, heads, dtype, 10 * k as u64);
        }
    }
}

#[cfg(not(feature = "wgpu"))]
#[test]
fn bf16_is_the_hosts_sum() {
    for (k, (shape, layouts, heads)) in CASES.into_iter().enumerate() {
        check(shape, layouts, heads, DType::BF16, 10 * k as u64 + 5);
    }
}

/// Into a `[B·T, W]` tensor seen as heads `[B, W / hd, T, hd]` (a view of the whole, no
/// offset), as the joined q|k|v product's gradient receives v's: its heads' columns get the
/// sum, every other element keeps its bits.
#[test]
fn heads_of_wider_rows_change_only_their_columns() {
    let ([b, t, width], [first_head, heads, hd]) = ([2, 5, 24], [3, 2, 4]);
    let dtype = DType::F32;
    let (acc, value) = (
        values(b * t * width, 1, dtype),
        values(b * heads * t * hd, 2, dtype),
    );
    let whole = upload(&acc, &[b * t, width], dtype);
    let as_heads = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(whole.clone()))
        .reshape([b, t, width / hd, hd])
        .swap_dims(1, 2)
        .into_primitive()
        .tensor();
    accumulate::add_into(
        upload(&value, &[b, heads, t, hd], dtype),
        as_heads,
        first_head,
    );
    let got = download(whole);
    let columns = first_head * hd..(first_head + heads) * hd;
    let want: Vec<f32> = (0..acc.len())
        .map(|i| {
            let (row, col) = (i / width, i % width);
            if !columns.contains(&col) {
                return acc[i];
            }
            let (h, d) = ((col - columns.start) / hd, (col - columns.start) % hd);
            let (bi, ti) = (row / t, row % t);
            acc[i] + value[((bi * heads + h) * t + ti) * hd + d]
        })
        .collect();
    assert_eq!(bits(&got), bits(&want));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn any_shape_and_layouts_are_the_hosts_sum(
        b in 1usize..3, h in 1usize..4, t in 1usize..12, hd in 1usize..12,
        heads in (0usize..3).prop_flat_map(|extra| (0..=extra, Just(extra))),
        value in 0usize..4, out in 0usize..4, seed in 0u64..1000,
    ) {
        check([b, h, t, hd], [Layout::ALL[value], Layout::ALL[out]], heads, DType::F32, seed);
    }
}

/// No elements: nothing launches, and the output comes back as it went in.
#[test]
fn an_empty_value_adds_nothing() {
    let out = upload(&[], &[2, 3, 0, 4], DType::F32);
    let got = accumulate::add_into(upload(&[], &[2, 1, 0, 4], DType::F32), out, 1);
    assert_eq!(got.meta.shape().as_slice(), [2, 3, 0, 4]);
}

/// Heads past the output's are refused, not written out of bounds.
#[test]
#[should_panic(expected = "does not fit out")]
fn heads_past_the_outputs_are_refused() {
    let value = upload(
        &values(2 * 2 * 3 * 4, 1, DType::F32),
        &[2, 2, 3, 4],
        DType::F32,
    );
    let out = upload(
        &values(2 * 3 * 3 * 4, 2, DType::F32),
        &[2, 3, 3, 4],
        DType::F32,
    );
    accumulate::add_into(value, out, 2);
}
