//! SwiGLU's gating as one op, on the gate and up projections side by side in one tensor
//! `h = [g | u]`, against an fp64 host reference (forward and both halves of the gradient,
//! derived by hand below) and against burn's composition `silu(g) * u` of `h`'s halves, which it must match
//! bit for bit on the CPU in fp32 (the Flex kernel) and bf16 (the generic path), gradients
//! included, with and without selective checkpointing. With the `wgpu` feature, the GPU
//! path too (lavapipe in CI).

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{activation::silu, backend::AutodiffBackend, FloatDType, Tensor, TensorData};
use lab_ops::{swiglu, FusedSwiglu};
use proptest::prelude::*;

use crate::common;
use common::{assert_close, bits, block_input, floats, weight};

type B = Autodiff<Flex>;

struct Case {
    shape: [usize; 2],
    /// The gate spans ±8: both branches of the sigmoid and its saturated tails.
    g: Vec<f32>,
    u: Vec<f32>,
    /// The upstream gradient.
    dy: Vec<f32>,
}

fn case(shape: [usize; 2], seed: u64) -> Case {
    let n = shape[0] * shape[1];
    Case {
        shape,
        g: floats(n, seed, 8.0),
        u: floats(n, seed + 1, 1.0),
        dy: floats(n, seed + 2, 1.0),
    }
}

/// fp64 `(y, dg, du)`: with `σ = σ(g)`, `y = g·σ·u`, `dg = dy·u·σ·(1 + g·(1 − σ))` and
/// `du = dy·g·σ`.
fn reference(c: &Case) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut dg, mut du) = (vec![], vec![], vec![]);
    for ((&g, &u), &dy) in c.g.iter().zip(&c.u).zip(&c.dy) {
        let (g, u, dy) = (g as f64, u as f64, dy as f64);
        let s = 1.0 / (1.0 + (-g).exp());
        y.push(g * s * u);
        dg.push(dy * u * s * (1.0 + g * (1.0 - s)));
        du.push(dy * g * s);
    }
    (y, dg, du)
}

type Gate<A> = fn(Tensor<A, 2>) -> Tensor<A, 2>;

fn composition<A: AutodiffBackend>(h: Tensor<A, 2>) -> Tensor<A, 2> {
    let f = h.dims()[1] / 2;
    silu(h.clone().narrow(1, 0, f)) * h.narrow(1, f, f)
}

/// `[g | u]` of the case, row by row: `[rows, 2·cols]`.
fn joined(c: &Case) -> Vec<f32> {
    let cols = c.shape[1];
    let rows = c.g.chunks(cols).zip(c.u.chunks(cols));
    rows.flat_map(|(g, u)| g.iter().chain(u).copied()).collect()
}

/// `(y, dg, du)` through `op` on the autodiff backend `A` in `dtype`. With `transposed`, `h`
/// arrives as the transpose of a stored `[2·cols, rows]` tensor (a strided view).
fn through<A: AutodiffBackend>(
    c: &Case,
    dtype: FloatDType,
    transposed: bool,
    op: Gate<A>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let device = Default::default();
    let [rows, cols] = c.shape;
    let h = Tensor::<A, 2>::from_data(TensorData::new(joined(c), [rows, 2 * cols]), &device);
    let h_leaf = match transposed {
        true => Tensor::<A, 2>::from_data(h.transpose().into_data(), &device),
        false => h,
    }
    .cast(dtype)
    .require_grad();
    let h = if transposed {
        h_leaf.clone().transpose()
    } else {
        h_leaf.clone()
    };
    let dy = Tensor::<A, 2>::from_data(TensorData::new(c.dy.clone(), c.shape), &device).cast(dtype);
    let y = op(h);
    let grads = (y.clone() * dy).sum().backward();
    let dh = h_leaf.grad(&grads).unwrap();
    let dh = if transposed { dh.transpose() } else { dh };
    assert_eq!(dh.dims(), [rows, 2 * cols]);
    let (dg, du) = (dh.clone().narrow(1, 0, cols), dh.narrow(1, cols, cols));
    let f32s = |d: TensorData| d.convert::<f32>().to_vec::<f32>().unwrap();
    (
        f32s(y.into_data()),
        f32s(dg.into_data()),
        f32s(du.into_data()),
    )
}

/// Single elements, odd widths, and more than the CPU kernel's 16,384-element chunk (16,500).
const SHAPES: [[usize; 2]; 4] = [[1, 1], [3, 7], [16, 64], [5, 3_300]];

fn check_reference<A: AutodiffBackend + FusedSwiglu>(c: &Case, dtype: FloatDType, tol: f64) {
    let (y_ref, dg_ref, du_ref) = reference(c);
    for transposed in [false, true] {
        let (y, dg, du) = through::<A>(c, dtype, transposed, swiglu);
        let at = format!("{:?} {dtype:?} transposed {transposed}", c.shape);
        assert_close(&format!("y {at}"), &y, &y_ref, tol);
        assert_close(&format!("dg {at}"), &dg, &dg_ref, tol);
        assert_close(&format!("du {at}"), &du, &du_ref, tol);
    }
}

/// fp32: a handful of roundings of terms up to ~8 (|g| ≤ 8, |u|, |dy| ≤ 1) and f32's `exp`
/// (within an ulp or two): 2e-6 relative to |value| + 1.
#[test]
fn fp32_matches_the_fp64_reference() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        check_reference::<B>(&case(shape, k as u64), FloatDType::F32, 2e-6);
    }
}

/// bf16 (mixed precision's compute dtype, 8-bit mantissa, 2⁻⁹ per rounding): inputs rounded
/// to bf16 and up to six roundings of terms of at most ~3 in `dg`: 3e-2 relative to
/// |value| + 1.
#[test]
fn bf16_matches_the_fp64_reference() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        check_reference::<B>(&case(shape, 10 + k as u64), FloatDType::BF16, 3e-2);
    }
}

fn assert_same_bits<A: AutodiffBackend + FusedSwiglu>(c: &Case, dtype: FloatDType) {
    for transposed in [false, true] {
        let fused = through::<A>(c, dtype, transposed, swiglu);
        let composed = through::<A>(c, dtype, transposed, composition);
        let at = format!("{:?} {dtype:?} transposed {transposed}", c.shape);
        assert_eq!(bits(&fused.0), bits(&composed.0), "y {at}");
        assert_eq!(bits(&fused.1), bits(&composed.1), "dg {at}");
        assert_eq!(bits(&fused.2), bits(&composed.2), "du {at}");
    }
}

/// The op changes no bit of training on the CPU: output and gradients equal burn's
/// composition's in fp32 (the Flex kernels) and bf16 (the generic path, whose forward is the
/// composition itself: there only the gradients are a check).
#[test]
fn same_bits_as_the_composition() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        let c = case(shape, 20 + k as u64);
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            assert_same_bits::<B>(&c, dtype);
        }
    }
}

/// A projection, the gating and a projection back, as the model's feed-forward runs them:
/// `(x·[W_g | W_u] gated)·W_d` summed, and the three weights' gradients.
fn feed_forward<A: AutodiffBackend>(gate: Gate<A>) -> Vec<Vec<f32>> {
    let x = block_input::<A>();
    let (w_g, w_u, w_d) = (
        weight::<A>(2, [8, 12]),
        weight(3, [8, 12]),
        weight(4, [12, 8]),
    );
    let w_gu = Tensor::cat(vec![w_g.clone(), w_u.clone()], 1);
    let y = gate(x.matmul(w_gu)).matmul(w_d.clone());
    let grads = y.sum().backward();
    [w_g, w_u, w_d]
        .iter()
        .map(|w| w.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap())
        .collect()
}

/// Under selective checkpointing (burn's balanced strategy, which recomputes memory-bound
/// ops' outputs from their inputs) the weights' gradients have the same bits as without it.
#[test]
fn selective_checkpointing_gives_the_same_gradients() {
    type Selective = Autodiff<Flex, BalancedCheckpointing>;
    fn with<A: AutodiffBackend + FusedSwiglu>() -> Vec<Vec<f32>> {
        feed_forward::<A>(swiglu)
    }
    let plain = with::<B>();
    let selective = with::<Selective>();
    let composed = feed_forward::<B>(composition);
    for ((p, s), c) in plain.iter().zip(&selective).zip(&composed) {
        assert_eq!(
            bits(p),
            bits(s),
            "selective checkpointing changed a gradient"
        );
        assert_eq!(
            bits(p),
            bits(c),
            "the op's gradients differ from the composition's"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    /// Any shape: the fp32 kernels' bits are the composition's, output and gradients.
    #[test]
    fn kernel_bits_equal_the_composition_for_any_shape(
        rows in 1usize..9, cols in 1usize..300, seed in 0u64..1000,
    ) {
        let c = case([rows, cols], seed);
        for transposed in [false, true] {
            let fused = through::<B>(&c, FloatDType::F32, transposed, swiglu);
            let composed = through::<B>(&c, FloatDType::F32, transposed, composition);
            prop_assert_eq!(bits(&fused.0), bits(&composed.0));
            prop_assert_eq!(bits(&fused.1), bits(&composed.1));
            prop_assert_eq!(bits(&fused.2), bits(&composed.2));
        }
    }
}

/// The GPU path (lab-kernels' two kernels under the op's one-node backward), through Fusion
/// as the trainer runs it, on the GPU device (wgpu, lavapipe in CI; CUDA when built with only
/// `--features cuda`).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn gpu_fp32_matches_the_fp64_reference() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        check_reference::<Autodiff<common::Gpu>>(
            &case(shape, 30 + k as u64),
            FloatDType::F32,
            2e-6,
        );
    }
}
