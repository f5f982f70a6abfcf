//! The attention's q, k and v out of one joined product `y = x · [W_q | W_k | W_v]`
//! (`[B·T, W]`, lab-ops' [`crate::project_joined`]): each group of heads is a column block of
//! `y` seen as `[B, heads, T, head_dim]`.
//!
//! burn would slice the blocks out, and each slice's backward writes its gradient into a new
//! zero tensor of `y`'s full shape, three of which are then summed. Here each block is one
//! op whose backward adds its gradient into the gradient the other blocks already gave `y`,
//! in place: the first block to run backward starts from zeros, the others take that tensor
//! out of burn's `Gradients` (as RMSNorm's backward takes the skip connection's) and add
//! theirs into its columns. q and k pass through RoPE on the way ([`rope_heads`]): their
//! backward adds RoPE's transpose of the gradient (one launch on the GPUs, lab-kernels'
//! `rope_transposed_added_into`). v ([`heads`]) is a contiguous copy in forward, so that the
//! attention keeps `v` for backward and not the whole of `y`; its gradient is added into its
//! columns in one launch on the GPUs (lab-kernels' `accumulate`).
//!
//! Backends: [`FusedHeads`]' methods default to burn's tensor ops (a slice, an add and a
//! slice assignment for each add into columns; the CPU's path); `CubeBackend` (CUDA, wgpu) adds
//! in place with lab-kernels' kernels, and Fusion passes those through as custom ops
//! (`cube/heads.rs`); `Autodiff<B>` records the two forward ops as nodes (`autodiff.rs`).

use burn::backend::flex::Flex;
use burn::tensor::{
    backend::Backend, ops::FloatTensor, Shape, Slice, Tensor, TensorMetadata, TensorPrimitive,
};

use crate::FusedRope;

/// Where a group of heads lies in the joined product `y [B·T, W]`: the columns `first ..
/// first + heads·head_dim`, seen as `[batch, heads, T, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadColumns {
    /// The group's first column in `y`.
    pub first: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Sequences in `y`'s rows (`T = rows / batch`).
    pub batch: usize,
}

impl HeadColumns {
    /// The group's columns in `y`.
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// A backend that can read heads out of the joined product and add their gradients back.
pub trait FusedHeads: FusedRope {
    /// RoPE of the heads `at` in `y` (tables `[T, head_dim]`), a new tensor.
    fn rope_heads(
        y: FloatTensor<Self>,
        at: HeadColumns,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::rope(heads_view::<Self>(y, at), cos, sin)
    }

    /// The heads `at` in `y`, a new tensor laid out `[B, T, heads, head_dim]` (as a product's
    /// output split into heads).
    fn heads(y: FloatTensor<Self>, at: HeadColumns) -> FloatTensor<Self> {
        heads_copy::<Self>(y, at)
    }

    /// `acc [B·T, W]` with `value [B, heads, T, head_dim]` (any layout) added into the heads
    /// `at`; in place where the backend can.
    fn add_heads_into(
        acc: FloatTensor<Self>,
        at: HeadColumns,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        add_heads_tensor_ops::<Self>(acc, at, value)
    }

    /// `acc` with RoPE's transpose of `dy` (its backward) added into the heads `at`.
    fn add_rope_transposed_into(
        acc: FloatTensor<Self>,
        at: HeadColumns,
        dy: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::add_heads_into(acc, at, Self::rope_transposed(dy, cos, sin))
    }
}

/// RoPE of the heads `at` of the joined product `y` by `cos, sin [T, head_dim]`:
/// `[batch, heads, T, head_dim]`, differentiable on autodiff backends (see the module docs).
pub fn rope_heads<B: FusedHeads>(
    y: Tensor<B, 2>,
    at: HeadColumns,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
) -> Tensor<B, 4> {
    check(&y, at);
    let t = y.dims()[0] / at.batch;
    assert_eq!(
        cos.dims(),
        [t, at.head_dim],
        "rope_heads: cos is not [{t}, {}]",
        at.head_dim
    );
    assert_eq!(
        sin.dims(),
        [t, at.head_dim],
        "rope_heads: sin is not [{t}, {}]",
        at.head_dim
    );
    let prim = |t: Tensor<B, 2>| t.into_primitive().tensor();
    let out = B::rope_heads(prim(y), at, prim(cos), prim(sin));
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The heads `at` of the joined product `y`, `[batch, heads, T, head_dim]`, as a new tensor
/// (see the module docs), differentiable on autodiff backends.
pub fn heads<B: FusedHeads>(y: Tensor<B, 2>, at: HeadColumns) -> Tensor<B, 4> {
    check(&y, at);
    let out = B::heads(y.into_primitive().tensor(), at);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn check<B: Backend>(y: &Tensor<B, 2>, at: HeadColumns) {
    let [rows, width] = y.dims();
    assert!(
        at.batch > 0 && rows % at.batch == 0,
        "heads: {rows} rows are not {} sequences",
        at.batch
    );
    assert!(
        at.first + at.width() <= width,
        "heads: columns {}..{} lie outside y's {width}",
        at.first,
        at.first + at.width()
    );
}

/// The heads `at` of `y [B·T, W]` as a `[batch, heads, T, head_dim]` view (no copy where the
/// backend's slices and reshapes are views, as the GPU backends' are).
pub(crate) fn heads_view<B: Backend>(y: FloatTensor<B>, at: HeadColumns) -> FloatTensor<B> {
    let rows = y.shape()[0];
    split_heads::<B>(B::float_slice(y, &columns(rows, at)), rows, at)
}

/// [`FusedHeads::heads`] by tensor ops: the column block flattened (a copy: it is strided)
/// and split into heads again.
fn heads_copy<B: Backend>(y: FloatTensor<B>, at: HeadColumns) -> FloatTensor<B> {
    let rows = y.shape()[0];
    let block = B::float_slice(y, &columns(rows, at));
    let flat = B::float_reshape(block, Shape::new([rows * at.width()]));
    split_heads::<B>(flat, rows, at)
}

/// The heads `at`'s columns of `rows` rows (`[rows, width]`, or flat) as `[batch, heads, T,
/// head_dim]`.
fn split_heads<B: Backend>(block: FloatTensor<B>, rows: usize, at: HeadColumns) -> FloatTensor<B> {
    let split = Shape::new([at.batch, rows / at.batch, at.heads, at.head_dim]);
    B::float_swap_dims(B::float_reshape(block, split), 1, 2)
}

/// [`FusedHeads::add_heads_into`] by tensor ops: the columns plus `value` as rows, assigned
/// back.
pub(crate) fn add_heads_tensor_ops<B: Backend>(
    acc: FloatTensor<B>,
    at: HeadColumns,
    value: FloatTensor<B>,
) -> FloatTensor<B> {
    let rows = acc.shape()[0];
    let cols = columns(rows, at);
    let value_rows = B::float_reshape(
        B::float_swap_dims(value, 1, 2),
        Shape::new([rows, at.width()]),
    );
    let sum = B::float_add(B::float_slice(acc.clone(), &cols), value_rows);
    B::float_slice_assign(acc, &cols, sum)
}

/// All rows and the columns of the heads `at`.
fn columns(rows: usize, at: HeadColumns) -> [Slice; 2] {
    [
        Slice::new(0, Some(rows as isize), 1),
        Slice::new(at.first as isize, Some((at.first + at.width()) as isize), 1),
    ]
}

impl FusedHeads for Flex {}
