//! `Σ x²` over many tensors as one backend op: the sum of squares under the global gradient
//! norm (and the weight norm), kept on the device and read back once.
//!
//! The default is the tensor-op form the trainer always used (any backend gets it by an empty
//! `impl`; the CPU keeps its bits). On the GPU backends each parameter's share is a cast, a
//! square, two or three reduction passes and an addition, each its own launch: ~360 of an
//! x1-50m step's ~909. There lab-kernels' two kernels do it in one launch per non-empty tensor
//! and one more (`cube/square_sums.rs`).

use burn::tensor::{
    backend::Backend, ops::FloatTensor, FloatDType, Shape, Tensor, TensorMetadata, TensorPrimitive,
};

use crate::cast_to;

/// A backend that can sum the squares of many tensors at once.
pub trait SumOfSquares: Backend {
    /// `Σ x²` over every element of every tensor of `xs` (at least one; any float dtypes),
    /// squared and summed in f32, as an f32 tensor of shape `[1]` on their device.
    fn sum_of_squares(xs: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        tensor_ops_sum_of_squares::<Self>(xs)
    }
}

impl SumOfSquares for burn::backend::flex::Flex {}

/// The tensor-op form: each tensor's `Σ x²` in f32, added to the running total in order.
pub fn tensor_ops_sum_of_squares<B: Backend>(xs: Vec<FloatTensor<B>>) -> FloatTensor<B> {
    let total = xs
        .into_iter()
        .map(squares::<B>)
        .reduce(|total, sq| total + sq)
        .expect("sum_of_squares: no tensors");
    total.into_primitive().tensor()
}

/// `Σ x²` of one tensor as `[1]`, in f32 (ZeRO-1 in bf16 holds other ranks' linear weights as
/// bf16 copies): row sums along the last dimension, then their sum. Row sums first give the
/// same bits whatever the thread count or timing: Flex sums a tensor of 4M+ elements (an
/// embedding's gradient is 50257 × d) in parallel chunks combined in the order threads finish;
/// a row and a column of row sums are each summed by one thread.
fn squares<B: Backend>(x: FloatTensor<B>) -> Tensor<B, 1> {
    let shape = x.shape();
    if shape.num_dims() == 1 {
        let x = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x));
        return cast_to(x, FloatDType::F32).square().sum_dim(0).sum();
    }
    let last = shape[shape.num_dims() - 1];
    let rows = shape.num_elements().checked_div(last).unwrap_or(0);
    let x = B::float_reshape(x, Shape::new([rows, last]));
    let x = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(x));
    cast_to(x, FloatDType::F32).square().sum_dim(1).sum()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tensor};
    use proptest::prelude::*;

    use super::*;

    /// A 1-D, a 2-D and a 3-D tensor, as a model's parameters come.
    type Ranks = (Tensor<Flex, 1>, Tensor<Flex, 2>, Tensor<Flex, 3>);

    /// The form the trainer used before this op, on tensors of their own rank (cast to f32
    /// first): what the CPU's norms must keep, bit for bit.
    fn per_rank_form(xs: &[Ranks]) -> f32 {
        let f32 = FloatDType::F32;
        let mut total: Option<Tensor<Flex, 1>> = None;
        let mut add = |sq: Tensor<Flex, 1>| {
            total = Some(match total.take() {
                Some(t) => t + sq,
                None => sq,
            })
        };
        for (a, b, c) in xs {
            add(cast_to(a.clone(), f32).square().sum_dim(0).sum());
            add(cast_to(b.clone(), f32).square().sum_dim(1).sum());
            add(cast_to(c.clone(), f32).square().sum_dim(2).sum());
        }
        total.unwrap().into_scalar()
    }

    fn op_form(xs: &[Ranks]) -> f32 {
        let flat = xs
            .iter()
            .flat_map(|(a, b, c)| {
                [
                    a.clone().into_primitive().tensor(),
                    b.clone().into_primitive().tensor(),
                    c.clone().into_primitive().tensor(),
                ]
            })
            .collect();
        let sum = Flex::sum_of_squares(flat);
        Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(sum)).into_scalar()
    }

    fn normal<const D: usize>(shape: [usize; D]) -> Tensor<Flex, D> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
    }

    /// One tensor of 4.6M elements, past the size Flex sums in parallel chunks.
    #[test]
    fn flex_keeps_the_per_rank_forms_bits_on_a_large_tensor() {
        let xs = [(normal([3]), normal([5, 7]), normal([2, 2100, 1100]))];
        assert_eq!(op_form(&xs).to_bits(), per_rank_form(&xs).to_bits());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Flex's default keeps the bits of the per-rank form: matrices read through a
        /// transposed view, 3-D tensors in bf16 (ZeRO-1's copies are bf16), any sizes.
        #[test]
        fn flex_keeps_the_per_rank_forms_bits(
            n in 1usize..3000,
            rows in 1usize..1100,
            cols in 1usize..4000,
            depth in 1usize..4,
            count in 1usize..3,
            transposed in any::<bool>(),
            bf16 in any::<bool>(),
        ) {
            let xs: Vec<Ranks> = (0..count)
                .map(|_| {
                    let b = match transposed {
                        true => normal([cols, rows]).transpose(),
                        false => normal([rows, cols]),
                    };
                    let c = normal([depth, rows, cols / 4 + 1]);
                    let c = if bf16 { c.cast(FloatDType::BF16) } else { c };
                    (normal([n]), b, c)
                })
                .collect();
            prop_assert_eq!(op_form(&xs).to_bits(), per_rank_form(&xs).to_bits());
        }
    }
}
