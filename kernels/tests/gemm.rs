//! The vendor BLAS's products on cubecl's tensors against fp64: cuBLASLt on CUDA at f16 and
//! bf16, operands contiguous, transposed views (as the projection's backward passes them),
//! rows padded with NaN, or views that start inside a wider buffer (as the LM head's row
//! chunks and the joined products' halves are), shapes that are not multiples of a tile. A
//! runtime without a vendor BLAS (wgpu, lavapipe in CI) must decline every product, and CUDA
//! must decline f32 (cuBLASLt would run it as TF32).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::DType;
use lab_kernels::gemm::VendorMatmul;

use crate::common;
use common::{assert_close, download, values, Input, Prim, Runtime};

/// `rows × cols` values in `dtype`, on the device in layout `input`; the host copy row-major.
fn operand(rows: usize, cols: usize, seed: u64, dtype: DType, input: Input) -> (Vec<f32>, Prim) {
    let v = values(rows * cols, seed, dtype);
    let device = input.upload(&v, [rows, cols], dtype);
    (v, device)
}

fn product(a: &[f32], b: &[f32], [m, k, n]: [usize; 3]) -> Vec<f64> {
    (0..m * n)
        .map(|o| {
            (0..k)
                .map(|l| a[o / n * k + l] as f64 * b[l * n + o % n] as f64)
                .sum()
        })
        .collect()
}

const INPUTS: [Input; 4] = [
    Input::Contiguous,
    Input::Transposed,
    Input::Padded,
    Input::Offset,
];

#[test]
fn vendor_products_match_fp64_or_are_declined() {
    let dtypes: &[(DType, f64)] = if Runtime::HAS_VENDOR_BLAS {
        // Inputs are exact in their dtype; the error is the f32 sum's and one rounding of C.
        &[(DType::F16, 2e-3), (DType::BF16, 1e-2)]
    } else {
        &[(DType::F16, 0.0)]
    };
    let shapes = [
        [1, 1, 1],
        [5, 7, 3],
        [33, 96, 17],
        [130, 768, 256],
        [64, 256, 768],
    ];
    for &(dtype, tol) in dtypes {
        for (s, dims @ [m, k, n]) in shapes.into_iter().enumerate() {
            for (a_in, b_in) in INPUTS.iter().flat_map(|&a| INPUTS.map(|b| (a, b))) {
                let (a, a_dev) = operand(m, k, 10 * s as u64, dtype, a_in);
                let (b, b_dev) = operand(k, n, 10 * s as u64 + 1, dtype, b_in);
                let what = format!("{dtype:?} {dims:?} inputs {a_in:?} {b_in:?}");
                match (
                    Runtime::vendor_matmul(&a_dev, &b_dev),
                    Runtime::HAS_VENDOR_BLAS,
                ) {
                    (Some(c), true) => {
                        assert_eq!(c.dtype, dtype, "{what}");
                        assert_eq!(c.meta.shape().to_vec(), vec![m, n], "{what}");
                        assert_close(&what, &download(c), &product(&a, &b, dims), tol);
                    }
                    (None, false) => {}
                    (Some(_), false) => panic!("{what}: a product without a vendor BLAS"),
                    (None, true) => panic!("{what}: declined by the vendor BLAS"),
                }
            }
        }
    }
}

#[test]
fn f32_products_stay_with_cubecl() {
    let (_, a) = operand(4, 8, 1, DType::F32, Input::Contiguous);
    let (_, b) = operand(8, 3, 2, DType::F32, Input::Contiguous);
    assert!(Runtime::vendor_matmul(&a, &b).is_none());
}

/// cuBLASLt runs on cubecl's stream, with no host wait around a product: each product's input
/// is written into a fresh tensor by a long cubecl matmul, and a cubecl kernel reads the
/// product right behind it; nothing is read back until the end. A product on another stream,
/// or ahead of its input, would start while that matmul still runs and read another
/// iteration's values (the pool reuses memory), a factor of 2 away from the expected ones.
#[cfg(not(feature = "wgpu"))]
#[test]
fn products_are_ordered_with_cubecl_kernels_on_one_stream() {
    use burn::tensor::{Tensor, TensorPrimitive};
    use common::{upload, B};
    let tensor = |t: Prim| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t));
    let dims @ [m, k, n] = [1024, 1024, 1024];
    // `a` is the first k columns of `x` [m, 16k]; `x · select` (select = [I; 0]) gives it back
    // exactly (one nonzero term per sum), after ~34 GFLOP of cubecl's matmul.
    let wide = 16 * k;
    let x = values(m * wide, 1, DType::F16);
    let a: Vec<f32> = (0..m * k).map(|o| x[o / k * wide + o % k]).collect();
    let select: Vec<f32> = (0..wide * k)
        .map(|o| if o / k == o % k { 1.0 } else { 0.0 })
        .collect();
    let x = upload(&x, &[m, wide], DType::F16);
    let select = tensor(upload(&select, &[wide, k], DType::F16));
    let (b, b_dev) = operand(k, n, 2, DType::F16, Input::Contiguous);
    let exact = product(&a, &b, dims);
    let outs: Vec<(f64, Prim)> = (0..12)
        .map(|i| {
            // Powers of two: the scaled product is the product scaled, rounding included.
            let s = (1 << (i % 4)) as f32;
            let a_scaled = tensor(x.clone()).mul_scalar(s).matmul(select.clone());
            let c = Runtime::vendor_matmul(&a_scaled.into_primitive().tensor(), &b_dev)
                .expect("f16 runs on cuBLASLt");
            (
                s as f64 / 2.0,
                tensor(c).mul_scalar(0.5).into_primitive().tensor(),
            )
        })
        .collect();
    for (i, (s, c)) in outs.into_iter().enumerate() {
        let expected: Vec<f64> = exact.iter().map(|x| x * s).collect();
        assert_close(
            &format!("product {i} (×{s})"),
            &download(c),
            &expected,
            2e-3,
        );
    }
}
