//! The sum of squares on a GPU backend through Fusion, as the trainer's norms call it (wgpu,
//! lavapipe in CI; CUDA when built with only `--features cuda`): parameters of one and two
//! dimensions and an f16 one in one call, against the fp64 sum of the same values, and the
//! CPU's tensor-op form on the same f32 tensors.
//!
//! Tolerances, relative to the sum. Every term is positive, so each f32 rounding is relative
//! to the running sum, at most the total (the kernels' bound is worked out in lab-kernels'
//! `tests/square_sums.rs`):
//! - against fp64, 1.5e-6: here each unit squares and adds one element, its cube sums a tree of
//!   8 levels, and the last cube adds 3 of the 708 partials per unit and another tree: 21
//!   roundings of 2⁻²⁴, 1.25e-6.
//! - against the CPU, 1.5e-4: Flex sums the 70,000-element row in 8 accumulators × its SIMD
//!   lanes, ~1,100 terms each with AVX2 and ~2,200 with SSE (2,200 · 2⁻²⁴ = 1.3e-4).
//!
//! The smallest tensor (192 elements) is 1e-3 of the sum: one left out or counted twice fails.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::backend::Flex;
use burn::tensor::{
    backend::Backend, DType, ElementConversion, Tensor, TensorData, TensorPrimitive,
};
use lab_ops::SumOfSquares;

use crate::common;
use common::{floats, Gpu};

/// `(shape, values)` of each tensor: a norm gain, matrices, and a long row.
fn parameters() -> Vec<(Vec<usize>, Vec<f32>)> {
    [vec![192], vec![192, 512], vec![64, 193], vec![1, 70_000]]
        .into_iter()
        .enumerate()
        .map(|(k, shape)| {
            let n = shape.iter().product();
            (shape, floats(n, 7 + k as u64, 1.0))
        })
        .collect()
}

fn put<B: Backend>(shape: &[usize], values: &[f32], dtype: DType) -> B::FloatTensorPrimitive {
    let data = TensorData::new(values.to_vec(), shape.to_vec());
    let device = Default::default();
    match *shape {
        [_] => Tensor::<B, 1>::from_data(data, (&device, dtype))
            .into_primitive()
            .tensor(),
        [_, _] => Tensor::<B, 2>::from_data(data, (&device, dtype))
            .into_primitive()
            .tensor(),
        _ => unreachable!("1 or 2 dims"),
    }
}

fn sum<B: SumOfSquares>(xs: Vec<B::FloatTensorPrimitive>) -> f64 {
    let total = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::sum_of_squares(xs)));
    assert_eq!(total.dims(), [1]);
    assert_eq!(total.dtype(), DType::F32);
    total.into_scalar().elem::<f64>()
}

#[test]
fn mixed_shapes_and_dtypes_through_fusion_match_the_fp64_sum() {
    let params = parameters();
    // The second matrix as f16: what the GPU squares is its f16 rounding.
    let dtype = |k: usize| if k == 2 { DType::F16 } else { DType::F32 };
    let stored = |k: usize, v: &[f32]| -> Vec<f64> {
        let round = |x: f32| match dtype(k) {
            DType::F16 => burn::tensor::f16::from_f32(x).to_f32(),
            _ => x,
        };
        v.iter().map(|&x| round(x) as f64).collect()
    };
    let want: f64 = (0..)
        .zip(&params)
        .flat_map(|(k, (_, v))| stored(k, v))
        .map(|x| x * x)
        .sum();
    let xs = (0..)
        .zip(&params)
        .map(|(k, (s, v))| put::<Gpu>(s, v, dtype(k)))
        .collect();
    let got = sum::<Gpu>(xs);
    assert!((got - want).abs() <= 1.5e-6 * want, "{got} vs {want}");
}

#[test]
fn f32_parameters_match_the_cpus_tensor_op_form() {
    let params = parameters();
    let gpu = sum::<Gpu>(
        params
            .iter()
            .map(|(s, v)| put::<Gpu>(s, v, DType::F32))
            .collect(),
    );
    let cpu = sum::<Flex>(
        params
            .iter()
            .map(|(s, v)| put::<Flex>(s, v, DType::F32))
            .collect(),
    );
    assert!((gpu - cpu).abs() <= 1.5e-4 * cpu, "{gpu} vs {cpu}");
}

/// A dtype the kernels do not take (f64) among f32 tensors: the whole call takes burn's tensor
/// ops instead (each tensor's squares summed in f32), still one f32 total. Without that
/// fallback the kernels refuse f64 and the call panics. Tolerance: burn's reductions are not
/// lab's fixed tree; 1e-4 of the sum is 10 × the 1.3e-5 they were seen to lose on a real
/// step's gradients, and 100 × below the smallest tensor's share.
#[test]
fn a_dtype_the_kernels_do_not_take_falls_back_to_tensor_ops() {
    let device = Default::default();
    assert!(
        Gpu::supports_dtype(&device, DType::F64),
        "this device has no f64: the test needs one"
    );
    let params = parameters();
    let want: f64 = params
        .iter()
        .flat_map(|(_, v)| v)
        .map(|&x| (x as f64).powi(2))
        .sum();
    let dtype = |k: usize| if k == 1 { DType::F64 } else { DType::F32 };
    let xs = (0..)
        .zip(&params)
        .map(|(k, (s, v))| put::<Gpu>(s, v, dtype(k)))
        .collect();
    let got = sum::<Gpu>(xs);
    assert!((got - want).abs() <= 1e-4 * want, "{got} vs {want}");
}
