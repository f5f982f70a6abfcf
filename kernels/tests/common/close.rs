//! The comparison against an fp64 reference that lab-kernels' and lab-ops' tests share
//! (lab-ops' test common includes this file by path).

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
