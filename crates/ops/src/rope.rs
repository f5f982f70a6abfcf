//! Rotary position embedding as one op.
//!
//! RoPE turns each pair `(x[i], x[i + h])` of a head (`h = hd/2`) by its position's angle:
//! `y = x·cos + rotate_half(x)·sin` with `rotate_half([a, b]) = [−b, a]`. It is linear in `x`,
//! so its backward is its transpose, which is RoPE again with `−swap_halves(sin)` for `sin`:
//! `dx[i] = dy[i]·cos[i] + dy[i+h]·sin[i+h]` and `dx[i+h] = dy[i+h]·cos[i+h] − dy[i]·sin[i]`.
//! The op keeps nothing for backward but the tables. burn's composition (two narrows, a
//! negation, a concatenation, two products and a sum) records a graph node for each, and its
//! backward sends each half back through a zero-padded full-size tensor. On the CPU both give
//! the same bits: every element is the same two products and one sum, and negations are exact.
//!
//! Backends: [`FusedRope::rope`] defaults to the composition on the backend's own tensor
//! ops (bf16 on the CPU); `Flex` runs f32 in one pass (below); `CubeBackend` (CUDA, wgpu)
//! runs lab-kernels' one-pass kernel in f32 arithmetic for every storage type, so its bf16
//! rounds once where the composition rounds three times, and Fusion passes it through as a
//! custom op (`cube/rope.rs`); `Autodiff<B>` records the one node (`autodiff.rs`), whose
//! backward is [`FusedRope::rope_transposed`]: by default RoPE with the table
//! `−swap_halves(sin)` built from tensor ops, on the GPUs the same kernel reading `sin` so.
//!
//! Shapes: `x [B, H, T, hd]` (any non-negative strides), `cos, sin [T, hd]` in `x`'s dtype.

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::{backend::Backend, ops::FloatTensor, DType, Tensor, TensorPrimitive};
use rayon::prelude::*;

use crate::flex_tensor::f32_tensor;

/// A backend that can rotate by RoPE's tables.
pub trait FusedRope: Backend {
    /// `x·cos + rotate_half(x)·sin`, differentiable on autodiff backends.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composed::<Self>(x, cos, sin)
    }

    /// RoPE's transpose, its backward: [`FusedRope::rope`] of `dy` by `cos` and
    /// `−swap_halves(sin)` (see the module docs). The GPU kernel reads `sin` that way itself.
    fn rope_transposed(
        dy: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::rope(dy, cos, backward_sin::<Self>(sin))
    }
}

/// [`rope_tensor_ops`] on raw primitives.
fn composed<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let table = |t| Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t));
    let x = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(x));
    rope_tensor_ops(x, table(cos), table(sin))
        .into_primitive()
        .tensor()
}

/// The table RoPE's backward turns by: `−swap_halves(sin)` of a `[T, hd]` table.
fn backward_sin<B: Backend>(sin: FloatTensor<B>) -> FloatTensor<B> {
    let sin = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(sin));
    let half = sin.dims()[1] / 2;
    let (a, b) = (sin.clone().narrow(1, 0, half), sin.narrow(1, half, half));
    Tensor::cat(vec![b, a], 1).neg().into_primitive().tensor()
}

/// RoPE through the backend's own tensor ops: the reference the fused versions match bit
/// for bit, and the path of backends without a kernel.
pub fn rope_tensor_ops<B: Backend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
) -> Tensor<B, 4> {
    let hd = x.dims()[3];
    let (a, b) = (
        x.clone().narrow(3, 0, hd / 2),
        x.clone().narrow(3, hd / 2, hd / 2),
    );
    let rotated = Tensor::cat(vec![b.neg(), a], 3);
    x * cos.unsqueeze::<4>() + rotated * sin.unsqueeze::<4>()
}

/// RoPE of `x [B, H, T, hd]` by the tables `cos, sin [T, hd]` (see the module docs).
pub fn rope<B: FusedRope>(x: Tensor<B, 4>, cos: Tensor<B, 2>, sin: Tensor<B, 2>) -> Tensor<B, 4> {
    let [_, _, t, hd] = x.dims();
    assert!(hd % 2 == 0, "rope: head_dim {hd} is odd");
    assert_eq!(cos.dims(), [t, hd], "rope: cos table is not [{t}, {hd}]");
    assert_eq!(sin.dims(), [t, hd], "rope: sin table is not [{t}, {hd}]");
    let y = B::rope(
        x.into_primitive().tensor(),
        cos.into_primitive().tensor(),
        sin.into_primitive().tensor(),
    );
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

impl FusedRope for Flex {
    fn rope(x: FlexTensor, cos: FlexTensor, sin: FlexTensor) -> FlexTensor {
        // A gradient may arrive with strided rows (k's, through the score matmul's
        // transpose): one contiguous copy is cheaper than composing seven ops.
        let x = if x.dtype() == DType::F32 && View::<4>::of(&x).is_none() {
            x.to_contiguous()
        } else {
            x
        };
        match (View::<4>::of(&x), View::<2>::of(&cos), View::<2>::of(&sin)) {
            (Some(x), Some(cos), Some(sin)) if !x.is_empty() => rope_f32(&x, &cos, &sin),
            _ => composed::<Flex>(x, cos, sin),
        }
    }
}

/// A read-only f32 view of a Flex tensor of `D` dimensions whose rows (the last dimension)
/// are contiguous; other strides non-negative.
struct View<'a, const D: usize> {
    data: &'a [f32],
    offset: usize,
    shape: [usize; D],
    strides: [usize; D],
}

impl<'a, const D: usize> View<'a, D> {
    fn of(t: &'a FlexTensor) -> Option<Self> {
        let layout = t.layout();
        let (shape, strides) = (layout.shape(), layout.strides());
        let rows_contiguous = shape.num_dims() == D && (strides[D - 1] == 1 || shape[D - 1] == 1);
        if t.dtype() != DType::F32 || !layout.has_positive_strides() || !rows_contiguous {
            return None;
        }
        Some(Self {
            data: t.storage::<f32>(),
            offset: layout.start_offset(),
            shape: std::array::from_fn(|i| shape[i]),
            strides: std::array::from_fn(|i| strides[i] as usize),
        })
    }

    fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// The row at `lead` (its last index 0).
    fn row(&self, lead: [usize; D]) -> &'a [f32] {
        let start = self.offset
            + lead
                .iter()
                .zip(&self.strides)
                .map(|(i, s)| i * s)
                .sum::<usize>();
        &self.data[start..start + self.shape[D - 1]]
    }
}

/// One pass, one thread per (batch, head): each output element is `x·cos + r·sin` in that
/// order, as the composition computes it (Rust never fuses it into an FMA).
fn rope_f32(x: &View<4>, cos: &View<2>, sin: &View<2>) -> FlexTensor {
    let [b, h, t, hd] = x.shape;
    let mut out = vec![0f32; b * h * t * hd];
    out.par_chunks_mut(t * hd)
        .enumerate()
        .for_each(|(bh, head)| {
            let (bi, hi) = (bh / h, bh % h);
            for (ti, y) in head.chunks_mut(hd).enumerate() {
                let (x, c, s) = (x.row([bi, hi, ti, 0]), cos.row([ti, 0]), sin.row([ti, 0]));
                rotate_row(y, x, c, s);
            }
        });
    f32_tensor(out, [b, h, t, hd])
}

/// `y = x·c + rotate_half(x)·s` for one head row.
fn rotate_row(y: &mut [f32], x: &[f32], c: &[f32], s: &[f32]) {
    let half = x.len() / 2;
    let (x_a, x_b) = x.split_at(half);
    let (y_a, y_b) = y.split_at_mut(half);
    for i in 0..half {
        y_a[i] = x_a[i] * c[i] + -x_b[i] * s[i];
        y_b[i] = x_b[i] * c[half + i] + x_a[i] * s[half + i];
    }
}
