//! The projection op on `CubeBackend` (the runtime's vendor BLAS where it has one and
//! `LAB_MATMUL=cublaslt`) and through Fusion, as a custom op; and the joined product's
//! weights side by side in one launch (lab-kernels' `join`), where burn's concatenation takes
//! one launch an input.

use burn::tensor::{ops::FloatTensorOps, Shape};
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::gemm::{counted_vendor_matmul, Choice, VendorMatmul};

use super::custom_op;
use crate::FusedProjection;

impl<R, F, I, BT> FusedProjection for CubeBackend<R, F, I, BT>
where
    R: VendorMatmul,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn projects_on_op() -> bool {
        Choice::current().uses_op()
    }

    fn project(
        a: Self::FloatTensorPrimitive,
        b: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        let vendor = R::HAS_VENDOR_BLAS && Choice::current() == Choice::Vendor;
        match vendor.then(|| counted_vendor_matmul(&a, &b)).flatten() {
            Some(product) => product,
            None => Self::float_matmul(a, b),
        }
    }

    /// One launch (two or three parts, as `project_joined` takes).
    fn join_columns(parts: Vec<Self::FloatTensorPrimitive>) -> Self::FloatTensorPrimitive {
        lab_kernels::join::join_columns(parts)
    }
}

impl<B: FusionBackend + FusedProjection> FusedProjection for Fusion<B> {
    fn projects_on_op() -> bool {
        B::projects_on_op()
    }

    fn project(
        a: Self::FloatTensorPrimitive,
        b: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        if !B::projects_on_op() {
            return Self::float_matmul(a, b);
        }
        let out = (a.dtype, Shape::new([a.shape[0], b.shape[1]]));
        let [y] = custom_op::<B, 1>("lab_project", vec![a, b], [out], |h, t| {
            let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
            vec![B::project(get(0), get(1))]
        });
        y
    }

    fn join_columns(parts: Vec<Self::FloatTensorPrimitive>) -> Self::FloatTensorPrimitive {
        let width = parts.iter().map(|p| p.shape[1]).sum::<usize>();
        let out = (parts[0].dtype, Shape::new([parts[0].shape[0], width]));
        let [joined] = custom_op::<B, 1>("lab_join_columns", parts, [out], |h, t| {
            vec![B::join_columns(
                t.iter().map(|p| h.get_float_tensor::<B>(p)).collect(),
            )]
        });
        joined
    }
}
