//! RoPE as one op against an fp64 host reference (forward, and the gradient derived by hand
//! below) and against burn's composition of tensor ops, which it must match bit for bit on
//! the CPU in fp32 (the CPU kernel) and in bf16 (the generic path), gradients included. With
//! the `wgpu` feature, the GPU kernel too, through Fusion and without it (lavapipe in CI).

use burn::backend::{Autodiff, Flex};
use burn::tensor::{backend::AutodiffBackend, FloatDType, Tensor, TensorData};
use lab_ops::{rope, rope_tensor_ops, FusedRope};
use proptest::prelude::*;

use crate::common;
use common::{assert_close, bits, floats};

type B = Autodiff<Flex>;

/// RoPE's tables as the model builds them: position t, frequency i mod hd/2.
fn tables(t: usize, hd: usize) -> (Vec<f32>, Vec<f32>) {
    let angle =
        |p: usize, i: usize| p as f64 * 1e4f64.powf(-2.0 * (i % (hd / 2)) as f64 / hd as f64);
    let all = |f: fn(f64) -> f64| {
        (0..t)
            .flat_map(|p| (0..hd).map(move |i| f(angle(p, i)) as f32))
            .collect()
    };
    (all(f64::cos), all(f64::sin))
}

struct Case {
    shape: [usize; 4],
    x: Vec<f32>,
    /// The upstream gradient.
    g: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

fn case(shape: [usize; 4], seed: u64) -> Case {
    let n = shape.iter().product();
    let (cos, sin) = tables(shape[2], shape[3]);
    Case {
        shape,
        x: floats(n, seed, 1.0),
        g: floats(n, seed + 1, 1.0),
        cos,
        sin,
    }
}

/// [`case`] with random `cos` and `sin` tables (halves with unequal angles) instead of the
/// model's.
fn with_random_tables(shape: [usize; 4], seed: u64) -> Case {
    let [_, _, t, hd] = shape;
    Case {
        cos: floats(t * hd, seed + 10, 1.0),
        sin: floats(t * hd, seed + 20, 1.0),
        ..case(shape, seed)
    }
}

/// fp64: `y` and `dx` for the upstream gradient `g`, from the definition. With h = hd/2,
/// `y[i] = x[i]·c[i] − x[i+h]·s[i]` and `y[i+h] = x[i+h]·c[i+h] + x[i]·s[i+h]`, so
/// `dx[i] = g[i]·c[i] + g[i+h]·s[i+h]` and `dx[i+h] = −g[i]·s[i] + g[i+h]·c[i+h]`.
fn reference(c: &Case) -> (Vec<f64>, Vec<f64>) {
    let [_, _, t, hd] = c.shape;
    let h = hd / 2;
    let (mut y, mut dx) = (vec![0.0; c.x.len()], vec![0.0; c.x.len()]);
    for (row, base) in (0..c.x.len()).step_by(hd).enumerate() {
        let p = row % t;
        let at = |v: &[f32], i: usize| v[base + i] as f64;
        let tab = |v: &[f32], i: usize| v[p * hd + i] as f64;
        for i in 0..h {
            let (cs, sn) = (
                (tab(&c.cos, i), tab(&c.cos, i + h)),
                (tab(&c.sin, i), tab(&c.sin, i + h)),
            );
            y[base + i] = at(&c.x, i) * cs.0 - at(&c.x, i + h) * sn.0;
            y[base + i + h] = at(&c.x, i + h) * cs.1 + at(&c.x, i) * sn.1;
            dx[base + i] = at(&c.g, i) * cs.0 + at(&c.g, i + h) * sn.1;
            dx[base + i + h] = -at(&c.g, i) * sn.0 + at(&c.g, i + h) * cs.1;
        }
    }
    (y, dx)
}

/// `(y, dx)` through `op` on the autodiff backend `A` in `dtype`; `transposed` feeds `x` as a
/// `[B, T, H, hd]` tensor with its middle axes swapped, the strided view the model passes.
fn through<A: AutodiffBackend>(
    c: &Case,
    dtype: FloatDType,
    transposed: bool,
    op: fn(Tensor<A, 4>, Tensor<A, 2>, Tensor<A, 2>) -> Tensor<A, 4>,
) -> (Vec<f32>, Vec<f32>) {
    let device = Default::default();
    let [b, h, t, hd] = c.shape;
    let leaf = if transposed {
        // The same logical x, stored as [B, T, H, hd].
        let mut stored = vec![0f32; c.x.len()];
        for (i, v) in c.x.iter().enumerate() {
            let (bi, hi, ti, di) = (i / (h * t * hd), i / (t * hd) % h, i / hd % t, i % hd);
            stored[((bi * t + ti) * h + hi) * hd + di] = *v;
        }
        let x = Tensor::<A, 4>::from_data(TensorData::new(stored, [b, t, h, hd]), &device);
        x.cast(dtype).require_grad()
    } else {
        let x = Tensor::<A, 4>::from_data(TensorData::new(c.x.clone(), c.shape), &device);
        x.cast(dtype).require_grad()
    };
    let x = if transposed {
        leaf.clone().swap_dims(1, 2)
    } else {
        leaf.clone()
    };
    let table = |v: &Vec<f32>| {
        Tensor::<A, 2>::from_data(TensorData::new(v.clone(), [t, hd]), &device).cast(dtype)
    };
    let g = Tensor::<A, 4>::from_data(TensorData::new(c.g.clone(), c.shape), &device).cast(dtype);
    let y = op(x, table(&c.cos), table(&c.sin));
    let grads = (y.clone() * g).sum().backward();
    let dx = leaf.grad(&grads).unwrap();
    let dx = if transposed { dx.swap_dims(1, 2) } else { dx };
    let f32s = |d: TensorData| d.convert::<f32>().to_vec::<f32>().unwrap();
    (f32s(y.into_data()), f32s(dx.into_data()))
}

/// Head widths down to 2, batch and heads of 1 and odd counts; contiguous and strided `x`.
const SHAPES: [[usize; 4]; 5] = [
    [1, 1, 1, 2],
    [2, 3, 5, 6],
    [1, 4, 7, 8],
    [3, 2, 9, 64],
    [2, 5, 3, 30],
];

/// `rope` on the autodiff backend `A` in `dtype` against the fp64 reference, output and
/// gradient.
fn check_reference<A: AutodiffBackend + FusedRope>(
    c: &Case,
    dtype: FloatDType,
    transposed: bool,
    tol: f64,
) {
    let (y_ref, dx_ref) = reference(c);
    let (y, dx) = through::<A>(c, dtype, transposed, rope);
    let at = format!("{:?} {dtype:?} transposed {transposed}", c.shape);
    assert_close(&format!("y {at}"), &y, &y_ref, tol);
    assert_close(&format!("dx {at}"), &dx, &dx_ref, tol);
}

/// fp32: each element is two products and a sum, each rounded once, so 1e-6 relative to
/// |y| + 1 covers it (inputs and tables are at most 1 in magnitude).
#[test]
fn fp32_matches_the_fp64_reference_forward_and_backward() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        for transposed in [false, true] {
            check_reference::<B>(&case(shape, k as u64), FloatDType::F32, transposed, 1e-6);
        }
    }
}

/// bf16 (mixed precision's compute dtype): 8 bits of mantissa, rounded after each of the
/// three operations, so 2⁻⁸ · 3 ≈ 1.2e-2 relative to |y| + 1.
#[test]
fn bf16_matches_the_fp64_reference() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        check_reference::<B>(&case(shape, 10 + k as u64), FloatDType::BF16, true, 1.2e-2);
    }
}

/// The op changes no bit of training: output and gradient equal burn's composition's,
/// in fp32 (the Flex kernel) and bf16 (the generic path with the op's own backward).
#[test]
fn same_bits_as_the_composition() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        let c = case(shape, 20 + k as u64);
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            for transposed in [false, true] {
                let fused = through::<B>(&c, dtype, transposed, rope);
                let composed = through::<B>(&c, dtype, transposed, rope_tensor_ops);
                assert_eq!(bits(&fused.0), bits(&composed.0), "y {shape:?} {dtype:?}");
                assert_eq!(bits(&fused.1), bits(&composed.1), "dx {shape:?} {dtype:?}");
            }
        }
    }
}

/// The backward is RoPE's transpose for any tables, not only the model's (whose two halves
/// share their angles): random `cos` and `sin` against the fp64 reference.
#[test]
fn the_gradient_is_the_transpose_for_any_tables() {
    for (k, shape) in SHAPES.into_iter().enumerate() {
        let c = with_random_tables(shape, 30 + k as u64);
        for transposed in [false, true] {
            check_reference::<B>(&c, FloatDType::F32, transposed, 1e-6);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any shape, any position offset into longer tables (as decoding after a KV cache
    /// narrows them): the kernel's bits are the composition's.
    #[test]
    fn kernel_bits_equal_the_composition_for_any_shape(
        b in 1usize..3, h in 1usize..5, t in 1usize..9, half in 1usize..20, offset in 0usize..5,
        seed in 0u64..1000,
    ) {
        let device = Default::default();
        let hd = 2 * half;
        let x = Tensor::<Flex, 4>::from_data(TensorData::new(floats(b * h * t * hd, seed, 1.0), [b, h, t, hd]), &device);
        let (cos, sin) = tables(t + offset, hd);
        let table = |v: Vec<f32>| {
            Tensor::<Flex, 2>::from_data(TensorData::new(v, [t + offset, hd]), &device).narrow(0, offset, t)
        };
        let (cos, sin) = (table(cos), table(sin));
        let fused: Vec<f32> = rope(x.clone(), cos.clone(), sin.clone()).into_data().to_vec().unwrap();
        let composed: Vec<f32> = rope_tensor_ops(x.clone(), cos.clone(), sin.clone()).into_data().to_vec().unwrap();
        prop_assert_eq!(bits(&fused), bits(&composed));
        // Rows strided too (the last two axes of a [B, H, hd, T] tensor swapped), as k's
        // gradient arrives through the score matmul's transpose.
        let strided = x.swap_dims(2, 3).into_data();
        let strided = Tensor::<Flex, 4>::from_data(strided, &device).swap_dims(2, 3);
        let fused: Vec<f32> = rope(strided.clone(), cos.clone(), sin.clone()).into_data().to_vec().unwrap();
        let composed: Vec<f32> = rope_tensor_ops(strided, cos, sin).into_data().to_vec().unwrap();
        prop_assert_eq!(bits(&fused), bits(&composed));
    }
}

/// The GPU kernel (lab-kernels' `rope`) wired into `CubeBackend` and through Fusion (what
/// `burn::backend::Wgpu` and `Cuda` are), forward and backward, on the GPU device (wgpu,
/// lavapipe in CI; CUDA when built with only `--features cuda`).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use super::*;
    use burn::tensor::{backend::Backend, f16, DType};
    use common::Gpu;

    /// The backend inside Fusion.
    trait Unfused {
        type Inner;
    }
    impl<B: burn_fusion::FusionBackend> Unfused for burn_fusion::Fusion<B> {
        type Inner = B;
    }

    type ThroughFusion = Autodiff<Gpu>;
    type Plain = Autodiff<<Gpu as Unfused>::Inner>;

    /// fp32 on both backends, the model's tables and random ones (the backward's tables are
    /// `−swap_halves(sin)`, exercised only by the gradient): within 1e-6 of |y| + 1 as on the
    /// CPU (the GPU may fuse a product and the sum into one rounding, which is closer still).
    #[test]
    fn fp32_matches_the_fp64_reference_forward_and_backward() {
        for (k, shape) in SHAPES.into_iter().enumerate() {
            let random_tables = with_random_tables(shape, 60 + k as u64);
            for c in [&case(shape, 90 + k as u64), &random_tables] {
                for transposed in [false, true] {
                    check_reference::<ThroughFusion>(c, FloatDType::F32, transposed, 1e-6);
                    check_reference::<Plain>(c, FloatDType::F32, transposed, 1e-6);
                }
            }
        }
    }

    /// `c`'s values as f16 stores them, so the reference sees what the GPU sees.
    fn rounded_to_f16(c: Case) -> Case {
        let round = |v: Vec<f32>| v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect();
        Case {
            shape: c.shape,
            x: round(c.x),
            g: round(c.g),
            cos: round(c.cos),
            sin: round(c.sin),
        }
    }

    /// Half of f16's spacing at `w`: the most one correct rounding of `w` can be off by.
    fn half_f16_ulp(w: f64) -> f64 {
        let exponent = w.abs().log2().floor().max(-14.0);
        0.5 * 2f64.powf(exponent - 10.0)
    }

    /// In f16 every output element is rounded once, from f32 arithmetic: within half an f16
    /// spacing of the exact value (plus f32's own error, under 3e-7 for terms up to 1), in
    /// both directions. This assumes the device rounds f32 to f16 to nearest, as lavapipe and
    /// CUDA do (Vulkan leaves it to the device: one that truncates may be a whole spacing off). The composition rounds each product and the sum, and misses this
    /// bound (it did on these shapes when `CubeBackend` still composed).
    #[test]
    fn f16_is_rounded_once() {
        assert!(
            <Gpu as Backend>::supports_dtype(&Default::default(), DType::F16),
            "this GPU device has no f16 (lavapipe and CUDA have it)"
        );
        for (k, shape) in SHAPES.into_iter().enumerate() {
            let c = rounded_to_f16(case(shape, 100 + k as u64));
            let (y_ref, dx_ref) = reference(&c);
            let (y, dx) = through::<ThroughFusion>(&c, FloatDType::F16, true, rope);
            for (name, got, want) in [("y", &y, &y_ref), ("dx", &dx, &dx_ref)] {
                for (i, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
                    let bound = half_f16_ulp(w) + 3e-7;
                    assert!(
                        (g as f64 - w).abs() <= bound,
                        "{name} {shape:?}[{i}]: {g} vs {w} (bound {bound:.3e})"
                    );
                }
            }
        }
    }
}
