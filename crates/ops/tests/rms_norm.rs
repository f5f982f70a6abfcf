//! RMSNorm as one op against an fp64 host reference (output and both gradients; the
//! reference's gradients are checked by central differences below), against burn's
//! composition (the same forward bits; gradients within rounding, since the op sums `x`'s
//! gradient in another order), and under selective checkpointing. With the `wgpu` feature,
//! the GPU path too (lab-kernels' kernels through Fusion; lavapipe in CI).

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{backend::AutodiffBackend, FloatDType, Tensor, TensorData};
use lab_ops::{cast_to, rms_norm, rms_norm_to, FusedRmsNorm};
use proptest::prelude::*;

use crate::common;
use common::{bits, block_input, floats, weight};

type B = Autodiff<Flex>;

const EPS: f64 = 1e-5;

struct Case {
    shape: [usize; 2],
    x: Vec<f32>,
    gain: Vec<f32>,
    /// The upstream gradient.
    dy: Vec<f32>,
}

/// Rows at scales from 1e-3 to 1e2 (the norm must not care) and, with `zero_row`, a row of
/// zeros (where eps alone sets the scale).
fn case(shape: [usize; 2], seed: u64, zero_row: bool) -> Case {
    let [rows, cols] = shape;
    let mut x = floats(rows * cols, seed, 1.0);
    for (i, row) in x.chunks_mut(cols).enumerate() {
        let scale = 10f32.powi(i as i32 % 6 - 3);
        row.iter_mut().for_each(|v| *v *= scale);
        if zero_row && i == rows / 2 {
            row.fill(0.0);
        }
    }
    let gain = floats(cols, seed + 1, 0.5)
        .iter()
        .map(|g| 1.0 + g)
        .collect();
    Case {
        shape,
        x,
        gain,
        dy: floats(rows * cols, seed + 2, 1.0),
    }
}

/// fp64 values and, per element, the size of the terms that make it (what rounding scales
/// with: a difference of large terms can be small).
struct Reference {
    y: Vec<f64>,
    dx: Vec<f64>,
    dg: Vec<f64>,
    y_size: Vec<f64>,
    dx_size: Vec<f64>,
    dg_size: Vec<f64>,
}

/// With `r = sqrt(mean(x²) + eps)`, `q = x/r`, `gy = dy·g`: `y = q·g`, `dg = Σ_rows dy·q`,
/// `dx = (gy − q·mean(gy·q))/r`.
fn reference(c: &Case) -> Reference {
    let cols = c.shape[1];
    let x: Vec<f64> = c.x.iter().map(|&v| v as f64).collect();
    let dy: Vec<f64> = c.dy.iter().map(|&v| v as f64).collect();
    let g: Vec<f64> = c.gain.iter().map(|&v| v as f64).collect();
    let n = cols as f64;
    let mut out = Reference {
        y: vec![],
        dx: vec![],
        dg: vec![0.0; cols],
        y_size: vec![],
        dx_size: vec![],
        dg_size: vec![0.0; cols],
    };
    for (x, dy) in x.chunks(cols).zip(dy.chunks(cols)) {
        let r = (x.iter().map(|v| v * v).sum::<f64>() / n + EPS).sqrt();
        let q: Vec<f64> = x.iter().map(|v| v / r).collect();
        let gy: Vec<f64> = dy.iter().zip(&g).map(|(d, g)| d * g).collect();
        let along = gy.iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() / n;
        let along_size = gy.iter().zip(&q).map(|(a, b)| (a * b).abs()).sum::<f64>() / n;
        for j in 0..cols {
            out.y.push(q[j] * g[j]);
            out.y_size.push((q[j] * g[j]).abs());
            out.dx.push((gy[j] - q[j] * along) / r);
            out.dx_size
                .push((gy[j].abs() + q[j].abs() * along_size) / r);
            out.dg[j] += dy[j] * q[j];
            out.dg_size[j] += (dy[j] * q[j]).abs();
        }
    }
    out
}

/// Each element within `tol` of its terms' size (plus an absolute floor of `tol · 1e-30` so
/// exact zeros compare); NaN fails.
fn assert_within(name: &str, got: &[f32], want: &[f64], size: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(size).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (s + 1e-30),
            "{name}[{i}]: {g} vs {w} (terms of size {s}, tolerance {tol})"
        );
    }
}

type Norm<A> = fn(Tensor<A, 2>, Tensor<A, 1>) -> Tensor<A, 2>;

fn op<A: AutodiffBackend + FusedRmsNorm>(x: Tensor<A, 2>, gain: Tensor<A, 1>) -> Tensor<A, 2> {
    rms_norm(x, gain, EPS)
}

/// burn's composition, as the model wrote it before the op.
fn composition<A: AutodiffBackend>(x: Tensor<A, 2>, gain: Tensor<A, 1>) -> Tensor<A, 2> {
    let rms = (x.clone().square().mean_dim(1) + EPS).sqrt();
    x / rms * gain.unsqueeze::<2>()
}

/// `(y, dx, dg)` through `norm` on the autodiff backend `A`.
fn through<A: AutodiffBackend>(c: &Case, norm: Norm<A>) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let device = Default::default();
    let x =
        Tensor::<A, 2>::from_data(TensorData::new(c.x.clone(), c.shape), &device).require_grad();
    let gain = Tensor::<A, 1>::from_data(TensorData::new(c.gain.clone(), [c.shape[1]]), &device)
        .require_grad();
    let dy = Tensor::<A, 2>::from_data(TensorData::new(c.dy.clone(), c.shape), &device);
    let y = norm(x.clone(), gain.clone());
    let grads = (y.clone() * dy).sum().backward();
    let f32s = |d: TensorData| d.convert::<f32>().to_vec::<f32>().unwrap();
    (
        f32s(y.into_data()),
        f32s(x.grad(&grads).unwrap().into_data()),
        f32s(gain.grad(&grads).unwrap().into_data()),
    )
}

/// `x`'s gradient under a skip connection, built as a block is: `z = x + norm(x) ⊙ dy`, then
/// `Σ z ⊙ s`. Backward reaches the residual add before the norm (it comes after the norm in
/// the graph), so `s` is registered for `x` when the norm's node runs. The node hands it to
/// the op, which adds it as it writes `dx` (the GPUs in the kernel): the bits of the norm's
/// gradient alone (for the same upstream `s ⊙ dy`) plus `s` in f32, which is what autodiff's
/// own add gives. The node must have found the gradient: the count of folded gradients grows.
fn skip_adds_as_autodiff_would<A: AutodiffBackend + FusedRmsNorm>(c: &Case) {
    let device = Default::default();
    let n = c.x.len();
    let tensor =
        |v: &[f32]| Tensor::<A, 2>::from_data(TensorData::new(v.to_vec(), c.shape), &device);
    let gain = Tensor::<A, 1>::from_data(TensorData::new(c.gain.clone(), [c.shape[1]]), &device);
    let skip = floats(n, 77, 1.0);
    let grad_of_x = |with_skip: bool| {
        let x = tensor(&c.x).require_grad();
        let branch = op(x.clone(), gain.clone()) * tensor(&c.dy);
        let z = if with_skip {
            x.clone() + branch
        } else {
            branch
        };
        let grads = (z * tensor(&skip)).sum().backward();
        x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap()
    };
    let alone = grad_of_x(false);
    let folded = lab_ops::gradients_folded_on_this_thread();
    let with_skip = grad_of_x(true);
    assert_eq!(
        lab_ops::gradients_folded_on_this_thread(),
        folded + 1,
        "the norm's node did not find the skip connection's gradient"
    );
    let want: Vec<f32> = alone.iter().zip(&skip).map(|(a, s)| a + s).collect();
    assert_eq!(bits(&with_skip), bits(&want), "{:?}", c.shape);
}

#[test]
fn a_skip_connections_gradient_is_added_with_autodiffs_bits() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        skip_adds_as_autodiff_would::<B>(&case(shape, 60 + k as u64, true));
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn gpu_a_skip_connections_gradient_is_added_with_autodiffs_bits() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        skip_adds_as_autodiff_would::<Autodiff<common::Gpu>>(&case(shape, 70 + k as u64, true));
    }
}

/// One element, odd widths, the model's widths (128, 768) and many rows.
const SHAPES: [[usize; 2]; 5] = [[1, 1], [3, 7], [6, 128], [4, 768], [200, 33]];

/// fp32: a mean of d squares and a few roundings after it, each about 2⁻²⁴ relative to the
/// terms' size; 1e-5 leaves room for the d-term sums (d ≤ 768 here).
const F32_TOL: f64 = 1e-5;

fn check_reference<A: AutodiffBackend + FusedRmsNorm>(c: &Case) {
    let want = reference(c);
    let (y, dx, dg) = through::<A>(c, op::<A>);
    let at = format!("{:?}", c.shape);
    assert_within(&format!("y {at}"), &y, &want.y, &want.y_size, F32_TOL);
    assert_within(&format!("dx {at}"), &dx, &want.dx, &want.dx_size, F32_TOL);
    assert_within(&format!("dg {at}"), &dg, &want.dg, &want.dg_size, F32_TOL);
}

#[test]
fn fp32_matches_the_fp64_reference() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        check_reference::<B>(&case(shape, k as u64, shape[0] > 2));
    }
}

/// The reference's gradients are the derivative of its output: central differences of
/// `Σ y·dy` in fp64 agree to 1e-6 relative.
#[test]
fn the_reference_gradients_are_the_outputs_derivative() {
    let c = case([3, 5], 7, false);
    let want = reference(&c);
    let loss = |x: &[f32], gain: &[f32]| {
        let c = Case {
            shape: c.shape,
            x: x.to_vec(),
            gain: gain.to_vec(),
            dy: c.dy.clone(),
        };
        let r = reference(&c);
        r.y.iter()
            .zip(&c.dy)
            .map(|(y, d)| y * *d as f64)
            .sum::<f64>()
    };
    // Steps in f32 are exact in fp64; a relative step keeps each row's scale.
    let slope = |v: &[f32], i: usize, f: &dyn Fn(&[f32]) -> f64| {
        let h = (v[i].abs() * 1e-5).max(1e-8);
        let (mut up, mut down) = (v.to_vec(), v.to_vec());
        up[i] += h;
        down[i] -= h;
        (f(&up) - f(&down)) / (up[i] as f64 - down[i] as f64)
    };
    for i in 0..c.x.len() {
        let fd = slope(&c.x, i, &|x| loss(x, &c.gain));
        assert!(
            (fd - want.dx[i]).abs() <= 1e-6 * (1.0 + want.dx[i].abs()),
            "dx[{i}]: {fd} vs {}",
            want.dx[i]
        );
    }
    for j in 0..c.gain.len() {
        let fd = slope(&c.gain, j, &|g| loss(&c.x, g));
        assert!(
            (fd - want.dg[j]).abs() <= 1e-6 * (1.0 + want.dg[j].abs()),
            "dg[{j}]: {fd} vs {}",
            want.dg[j]
        );
    }
}

/// The forward is the composition's, bit for bit (evaluation and generation are unchanged);
/// the gradients agree with burn's chain rule through six nodes within fp32 rounding.
#[test]
fn same_forward_bits_and_close_gradients_as_the_composition() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        let c = case(shape, 20 + k as u64, shape[0] > 2);
        let want = reference(&c);
        let fused = through::<B>(&c, op::<B>);
        let composed = through::<B>(&c, composition::<B>);
        let at = format!("{shape:?}");
        assert_eq!(bits(&fused.0), bits(&composed.0), "y {at}");
        let composed_dx: Vec<f64> = composed.1.iter().map(|&v| v as f64).collect();
        let composed_dg: Vec<f64> = composed.2.iter().map(|&v| v as f64).collect();
        assert_within(
            &format!("dx {at}"),
            &fused.1,
            &composed_dx,
            &want.dx_size,
            2.0 * F32_TOL,
        );
        assert_within(
            &format!("dg {at}"),
            &fused.2,
            &composed_dg,
            &want.dg_size,
            2.0 * F32_TOL,
        );
    }
}

/// A norm of a residual sum between projections, with the skip connection around it, as a
/// block runs it: `r + norm(r)·W₂` for `r = x·W₁ + x·W₃`, squared and summed, and the weights'
/// and gain's gradients. The sum is memory-bound, so under selective
/// checkpointing the norm's input is itself recomputed, as the residual stream is. The norm
/// writes `dtype`, which `W₂` is cast to (bf16 training's block).
fn block<A: AutodiffBackend + FusedRmsNorm>(dtype: FloatDType) -> Vec<Vec<f32>> {
    let device = Default::default();
    let x = block_input::<A>();
    let (w1, w2, w3) = (
        weight::<A>(2, [8, 12]),
        weight(3, [12, 12]),
        weight(5, [8, 12]),
    );
    let gain = Tensor::<A, 1>::from_data(TensorData::new(floats(12, 4, 1.0), [12]), &device)
        .require_grad();
    let residual = x.clone().matmul(w1.clone()) + x.matmul(w3.clone());
    let branch = rms_norm_to(residual.clone(), gain.clone(), EPS, dtype);
    let branch = branch.matmul(cast_to(w2.clone(), dtype));
    // The residual add around the branch, in fp32 as the block's: the norm's node folds its
    // gradient into the norm's `dx`.
    let y = residual + cast_to(branch, FloatDType::F32);
    let grads = (y.clone() * y).sum().backward();
    let data = |d: TensorData| d.to_vec::<f32>().unwrap();
    vec![
        data(w1.grad(&grads).unwrap().into_data()),
        data(w2.grad(&grads).unwrap().into_data()),
        data(w3.grad(&grads).unwrap().into_data()),
        data(gain.grad(&grads).unwrap().into_data()),
    ]
}

/// Under selective checkpointing (burn's balanced strategy, which recomputes memory-bound
/// ops' outputs from their inputs, the norm's among them) every gradient has the same bits as
/// without it, in fp32 and with the norm writing bf16.
#[test]
fn selective_checkpointing_gives_the_same_gradients() {
    for dtype in [FloatDType::F32, FloatDType::BF16] {
        same_gradients_under_selective_checkpointing::<B, Autodiff<Flex, BalancedCheckpointing>>(
            dtype,
        );
    }
}

/// The GPU path, f16 standing in for bf16 on lavapipe (CUDA runs both).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn gpu_selective_checkpointing_gives_the_same_gradients() {
    use common::Gpu;
    let dtypes: &[FloatDType] = if cfg!(feature = "wgpu") {
        &[FloatDType::F32, FloatDType::F16]
    } else {
        &[FloatDType::F32, FloatDType::F16, FloatDType::BF16]
    };
    for &dtype in dtypes {
        same_gradients_under_selective_checkpointing::<
            Autodiff<Gpu>,
            Autodiff<Gpu, BalancedCheckpointing>,
        >(dtype);
    }
}

/// [`block`]'s gradients on `Plain` and on `Selective`, its checkpointing twin: the same bits,
/// and under both the norm's node folds the skip connection's gradient into its own.
fn same_gradients_under_selective_checkpointing<Plain, Selective>(dtype: FloatDType)
where
    Plain: AutodiffBackend + FusedRmsNorm,
    Selective: AutodiffBackend + FusedRmsNorm,
{
    let folded = lab_ops::gradients_folded_on_this_thread;
    let before = folded();
    let plain = block::<Plain>(dtype);
    let between = folded();
    let selective = block::<Selective>(dtype);
    assert!(
        between > before && folded() > between,
        "the skip connection's gradient was not folded ({dtype:?})"
    );
    for (p, s) in plain.iter().zip(&selective) {
        assert_eq!(
            bits(p),
            bits(s),
            "selective checkpointing changed a gradient ({dtype:?})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any shape and row scales: output and gradients within fp32 rounding of fp64.
    #[test]
    fn matches_the_reference_for_any_shape(
        rows in 1usize..12, cols in 1usize..300, seed in 0u64..1000, zero_row: bool,
    ) {
        check_reference::<B>(&case([rows, cols], seed, zero_row));
    }
}

/// The GPU path (lab-kernels' RMSNorm kernels as Fusion custom ops under the op's one-node
/// backward), through Fusion as the trainer runs it, on the GPU device (wgpu, lavapipe in CI;
/// CUDA when built with only `--features cuda`).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn gpu_fp32_matches_the_fp64_reference() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        check_reference::<Autodiff<common::Gpu>>(&case(shape, 30 + k as u64, true));
    }
}

/// `rms_norm_to(…, dtype)` is `cast_to(rms_norm(…), dtype)` as one op: the same bits for the
/// output and both gradients (the f32 result rounded once either way; `dy` widened exactly,
/// as the cast's backward widens it).
fn fused_cast_has_the_bits_of_casting_after<A: AutodiffBackend + FusedRmsNorm>(dtype: FloatDType) {
    let c = case([37, 129], 5, true);
    let device = Default::default();
    let run = |fused: bool| {
        let x = Tensor::<A, 2>::from_data(TensorData::new(c.x.clone(), c.shape), &device)
            .require_grad();
        let gain =
            Tensor::<A, 1>::from_data(TensorData::new(c.gain.clone(), [c.shape[1]]), &device)
                .require_grad();
        let y = if fused {
            rms_norm_to(x.clone(), gain.clone(), EPS, dtype)
        } else {
            cast_to(rms_norm(x.clone(), gain.clone(), EPS), dtype)
        };
        assert_eq!(y.dtype(), dtype.into());
        let dy = Tensor::<A, 2>::from_data(TensorData::new(c.dy.clone(), c.shape), &device);
        let grads = (y.clone() * dy.cast(dtype)).sum().backward();
        let f32s = |d: TensorData| bits(&d.convert::<f32>().to_vec::<f32>().unwrap());
        [
            f32s(y.into_data()),
            f32s(x.grad(&grads).unwrap().into_data()),
            f32s(gain.grad(&grads).unwrap().into_data()),
        ]
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn the_cast_to_bf16_as_part_of_the_op_has_the_bits_of_the_cast_after_it() {
    fused_cast_has_the_bits_of_casting_after::<B>(FloatDType::BF16);
}

/// The GPU path: the kernels write the output in the half type (f16 on wgpu, where lavapipe
/// has no bf16; bf16 in a CUDA build) and read `dy` in it, where the composition runs the norm
/// in fp32 and the backend's cast after it.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn gpu_the_cast_to_half_as_part_of_the_op_has_the_bits_of_the_cast_after_it() {
    let half = if cfg!(feature = "wgpu") {
        FloatDType::F16
    } else {
        FloatDType::BF16
    };
    fused_cast_has_the_bits_of_casting_after::<Autodiff<common::Gpu>>(half);
}
