//! Tensors read and written through their strides, so that a view needs no copy.
//!
//! The model's attention projections come out as `[B, T, H, hd]` and are read as
//! `[B, H, T, hd]` through a swap of the middle axes; the attention's output goes back the
//! same way before the output projection. A kernel that reads its inputs at their strides
//! and writes its outputs in the layout of its inputs turns both swaps into metadata: burn
//! would otherwise copy each view into a contiguous tensor (`into_contiguous`, or a reshape
//! that cannot keep the strides), before and after every attention call, forward and backward.

use burn::tensor::{DType, Shape};
use burn_cubecl::{
    kernel::into_contiguous,
    ops::{numeric::empty_device_contiguous_dtype, permute},
    tensor::CubeTensor,
    CubeRuntime,
};
use cubecl::prelude::*;

/// `t` itself where its last axis has unit stride (rows the kernels can read element by
/// element at their strides); a contiguous copy otherwise.
pub fn unit_stride_rows<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let last_is_unit = t.meta.strides().last().is_none_or(|&s| s == 1)
        || t.meta.shape().as_slice().last() == Some(&1);
    if last_is_unit {
        t
    } else {
        into_contiguous(t)
    }
}

/// `t` as a kernel that walks its elements in row-major order reads it: where `t` is a
/// matrix, at its own strides (`true`: read it through [`row_major_at`]); otherwise
/// contiguous, copied if it is not. A gradient that is a view into a wider one (the
/// feed-forward's gate and up halves of one product's) then costs no copy.
pub fn matrix_at_its_strides<R: CubeRuntime>(t: CubeTensor<R>) -> (CubeTensor<R>, bool) {
    if t.is_contiguous() {
        (t, false)
    } else if t.meta.shape().num_dims() == 2 {
        (t, true)
    } else {
        (into_contiguous(t), false)
    }
}

/// Where the `i`-th element in row-major order lies in `t`'s buffer: `i` itself where `t` is
/// contiguous, the row and column at `t`'s strides where it is a matrix read at them
/// (`matrix`, from [`matrix_at_its_strides`]).
#[cube]
pub fn row_major_at<F: CubePrimitive>(t: &Tensor<F>, i: usize, #[comptime] matrix: bool) -> usize {
    if matrix {
        let cols = t.shape(1);
        (i / cols) * t.stride(0) + (i % cols) * t.stride(1)
    } else {
        i
    }
}

/// A new tensor of `like`'s shape and of `dtype`, its axes in memory in the order of
/// `like`'s strides (the largest outermost; the last axis innermost, with unit stride): a
/// `[B, H, T, hd]` view of a `[B, T, H, hd]` tensor gets an output that is the same kind of
/// view, so swapping its middle axes back gives a contiguous tensor. Contiguous where `like`
/// is, or where `like`'s last axis is not its innermost.
pub fn empty_in_layout_of<R: CubeRuntime>(like: &CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    let shape = like.meta.shape().as_slice().to_vec();
    let order = memory_order(like.meta.strides(), &shape);
    let stored: Vec<usize> = order.iter().map(|&axis| shape[axis]).collect();
    let new = empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(stored),
        dtype,
    );
    if order.iter().enumerate().all(|(i, &axis)| i == axis) {
        return new;
    }
    permute(new, &inverse(&order))
}

/// The axes from outermost to innermost in memory: by decreasing stride, ties (size-1 axes,
/// broadcast axes) kept in axis order. The identity unless the last axis comes last.
fn memory_order(strides: &[usize], shape: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shape.len()).collect();
    // A size-1 axis has no stride worth following: it sorts as if contiguous.
    let stride = |axis: usize| match shape[axis] {
        1 => shape[axis + 1..].iter().product(),
        _ => strides[axis],
    };
    order.sort_by_key(|&axis| std::cmp::Reverse(stride(axis)));
    match order.last() {
        Some(&innermost) if innermost == shape.len() - 1 => order,
        _ => (0..shape.len()).collect(),
    }
}

/// The permutation that undoes `order`: `inverse[order[i]] = i`.
fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; order.len()];
    for (i, &axis) in order.iter().enumerate() {
        inv[axis] = i;
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contiguous_tensor_keeps_its_order() {
        assert_eq!(memory_order(&[24, 12, 4, 1], &[2, 2, 3, 4]), [0, 1, 2, 3]);
    }

    #[test]
    fn the_middle_axes_swapped_are_found() {
        // [B=2, T=3, H=4, hd=5] stored, read as [B, H, T, hd].
        assert_eq!(memory_order(&[60, 5, 20, 1], &[2, 4, 3, 5]), [0, 2, 1, 3]);
        assert_eq!(inverse(&[0, 2, 1, 3]), [0, 2, 1, 3]);
        assert_eq!(inverse(&[2, 0, 1]), [1, 2, 0]);
    }

    #[test]
    fn a_last_axis_that_is_not_innermost_gives_the_contiguous_order() {
        // A transposed matrix: its rows are strided.
        assert_eq!(memory_order(&[1, 3], &[3, 2]), [0, 1]);
    }

    #[test]
    fn size_one_axes_do_not_reorder() {
        // [B=1, H=1, T=3, hd=4] swapped from [1, 3, 1, 4]: strides of size-1 axes are noise.
        assert_eq!(memory_order(&[12, 4, 4, 1], &[1, 1, 3, 4]), [0, 1, 2, 3]);
        // A broadcast axis (stride 0) of size 1.
        assert_eq!(memory_order(&[0, 4, 1], &[1, 3, 4]), [0, 1, 2]);
    }
}
