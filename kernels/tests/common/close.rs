//! The comparison against an fp64 reference that lab-kernels' and lab-ops' tests share, and
//! the GPU tests' tolerance for f32 through cubecl's products (lab-ops' and lab-model's test
//! commons include this file by path).

/// Every element within `tol` × the largest reference magnitude, or × `floor` if that is
/// larger; NaN fails.
pub fn assert_close_from(name: &str, got: &[f32], want: &[f64], tol: f64, floor: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let scale = want.iter().fold(floor, |a, x| a.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= tol * scale,
            "{name}[{i}]: got {g}, want {w} (error {err:.3e} > {:.3e})",
            tol * scale
        );
    }
}

/// The tolerance for an f32 result that passes through cubecl's products, at `tol` where they
/// compute in f32. On CUDA cubecl runs an f32 product on tensor cores as TF32 wherever its
/// autotune finds that faster (cubek-matmul's `adjust_dtypes`): each input keeps 10 of its 23
/// mantissa bits, so each term of a dot product is off by up to 2⁻¹⁰ of itself, and the sum by
/// up to that of its terms' magnitudes, under 2·10⁻³ of the largest result for the tests'
/// normal inputs and sums of up to 64 terms. 10⁻² leaves room for a product of products (the
/// attention's backward); a dropped or misplaced term is off by far more. lavapipe has no
/// tensor cores and computes in f32: `tol`.
pub fn f32_products(tol: f64) -> f64 {
    if cfg!(feature = "wgpu") {
        tol
    } else {
        tol.max(1e-2)
    }
}
