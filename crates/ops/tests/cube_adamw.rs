//! AdamW on a GPU backend through Fusion, as the trainer calls it (wgpu, lavapipe in CI;
//! CUDA when built with only `--features cuda`), against the CPU's update (Flex's one-pass
//! loop, bit-identical to burn's tensor ops there) over three consecutive updates: the first
//! from zero moments, the next two from the moments the GPU returned.
//!
//! Tolerances, as a fraction of the largest magnitude of what is compared: 1e-5 for the
//! moments (a few f32 roundings an update, which the GPU may contract into fused
//! multiply-adds); 1e-4 for the parameter's change from its starting value, which is what
//! the update computes (comparing the parameter itself would hide an update that is wrong
//! but small next to the weight). lr is 1e-2 so the change is large enough to see.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::backend::Flex;
use burn::tensor::{backend::Backend, ops::FloatTensor, Tensor, TensorData, TensorPrimitive};
use lab_ops::{AdamWStep, FusedAdamW};

use crate::common;
use common::{floats, Gpu};

fn put<B: Backend>(x: &[f32]) -> FloatTensor<B> {
    let data = TensorData::new(x.to_vec(), [x.len()]);
    Tensor::<B, 1>::from_data(data, &Default::default())
        .into_primitive()
        .tensor()
}

fn get<B: Backend>(x: FloatTensor<B>) -> Vec<f32> {
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x))
        .into_data()
        .to_vec()
        .unwrap()
}

/// How an update's gradient reaches the op.
#[derive(Clone, Copy, Debug)]
enum Grad {
    /// `[n]`, contiguous.
    Flat,
    /// A `[n / cols, cols]` matrix that is the right half of a wider one, a view at its
    /// strides, as the feed-forward's up weight's gradient is of the joined gate and up
    /// product's. The left half holds NaN, which must not leak into the update.
    RightHalf { cols: usize },
}

fn grad<B: Backend>(g: &[f32], how: Grad) -> FloatTensor<B> {
    let Grad::RightHalf { cols } = how else {
        return put::<B>(g);
    };
    let rows = g.len() / cols;
    let mut whole = vec![f32::NAN; rows * 2 * cols];
    for r in 0..rows {
        whole[(2 * r + 1) * cols..][..cols].copy_from_slice(&g[r * cols..][..cols]);
    }
    let data = TensorData::new(whole, [rows, 2 * cols]);
    Tensor::<B, 2>::from_data(data, &Default::default())
        .slice([0..rows, cols..2 * cols])
        .into_primitive()
        .tensor()
}

/// Three updates of a parameter of `n` elements on backend `B`, its gradients as `how` says:
/// `(p, m, v)` after each.
fn three_updates<B: FusedAdamW>(n: usize, how: Grad) -> Vec<[Vec<f32>; 3]> {
    let mut p = put::<B>(&floats(n, 1, 1.0));
    let mut moments = None;
    let mut after = vec![];
    for t in 1..=3u64 {
        let step = AdamWStep {
            clip_scale: 0.5,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            lr: 1e-2,
            weight_decay: 0.1,
            t,
        };
        let g = grad::<B>(&floats(n, 10 + t, 1.0), how);
        let (np, m, v) = B::adamw_update(p, g, moments, &step);
        after.push([
            get::<B>(np.clone()),
            get::<B>(m.clone()),
            get::<B>(v.clone()),
        ]);
        (p, moments) = (np, Some((m, v)));
    }
    after
}

fn assert_within(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let scale = want.iter().fold(0f64, |a, &x| a.max(x.abs() as f64));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - *w as f64).abs();
        assert!(
            err <= tol * scale,
            "{what}[{i}]: {g} vs {w} (scale {scale})"
        );
    }
}

/// The GPU's three updates, its gradients as `how` says, against the CPU's from flat ones.
fn check(n: usize, how: Grad) {
    let start = floats(n, 1, 1.0);
    let change = |p: &[f32]| -> Vec<f32> { p.iter().zip(&start).map(|(a, b)| a - b).collect() };
    let (gpu, cpu) = (
        three_updates::<Gpu>(n, how),
        three_updates::<Flex>(n, Grad::Flat),
    );
    for (t, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        let ctx = |x: &str| format!("{how:?}, update {}: {x}", t + 1);
        assert_within(&ctx("p − p0"), &change(&g[0]), &change(&c[0]), 1e-4);
        assert_within(&ctx("m"), &g[1], &c[1], 1e-5);
        assert_within(&ctx("v"), &g[2], &c[2], 1e-5);
    }
}

#[test]
fn three_updates_through_fusion_match_the_cpu() {
    check(1000, Grad::Flat);
}

/// A gradient that is half of a wider one reaches the kernel as a view (128 columns: its
/// offset, 512 bytes, is aligned on every device, CUDA's 512 bytes included, so burn's slice
/// does not copy it) or as burn's copy (50 columns).
#[test]
fn a_gradient_that_is_half_of_a_wider_one_updates_as_a_flat_one() {
    for cols in [128, 50] {
        check(20 * cols, Grad::RightHalf { cols });
    }
}
