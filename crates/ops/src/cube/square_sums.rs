//! The sum of squares on `CubeBackend` (lab-kernels' kernels: one launch per non-empty tensor
//! and one more; burn's tensor ops for a dtype they do not take) and through Fusion.

use burn::tensor::{DType, Shape};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::square_sums;

use super::custom_op;
use crate::square_sums::{tensor_ops_sum_of_squares, SumOfSquares};

impl<R, F, I, BT> SumOfSquares for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn sum_of_squares(xs: Vec<Self::FloatTensorPrimitive>) -> Self::FloatTensorPrimitive {
        if xs.iter().all(|x| square_sums::supports(x.dtype)) {
            square_sums::sum_of_squares(xs)
        } else {
            tensor_ops_sum_of_squares::<Self>(xs)
        }
    }
}

impl<B: FusionBackend + SumOfSquares> SumOfSquares for Fusion<B> {
    fn sum_of_squares(xs: Vec<Self::FloatTensorPrimitive>) -> Self::FloatTensorPrimitive {
        assert!(!xs.is_empty(), "sum_of_squares: no tensors");
        let total = (DType::F32, Shape::new([1]));
        let [sum] = custom_op::<B, 1>("lab_sum_of_squares", xs, [total], |h, t| {
            let xs = t.iter().map(|t| h.get_float_tensor::<B>(t)).collect();
            vec![B::sum_of_squares(xs)]
        });
        sum
    }
}
