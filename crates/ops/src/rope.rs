//! Rotary position embedding as one op.
//!
//! RoPE turns each pair `(x[i], x[i + hd/2])` of a head by its position's angle:
//! `y = x·cos + rotate_half(x)·sin` with `rotate_half([a, b]) = [−b, a]`. It is linear in
//! `x` and the turn is orthogonal, so its backward is the turn by the opposite angle:
//! `dx = rope(dy, cos, −sin)` (both halves of a head share their angles). The op keeps
//! nothing for backward but the tables. burn's composition (two narrows, a negation, a
//! concatenation, two products and a sum) records five graph nodes whose backward sends each
//! half back through a zero-padded full-size tensor. Both give the same bits: every output
//! element is the same two products and one sum, and negations are exact.
//!
//! Backends: [`FusedRope::rope`] defaults to the composition on the backend's own tensor
//! ops (the GPUs today, and bf16 on the CPU); `Flex` runs f32 in one pass (below);
//! `Autodiff<B>` records the one node (`autodiff.rs`).
//!
//! Shapes: `x [B, H, T, hd]` (any positive strides), `cos, sin [T, hd]` in `x`'s dtype.

use burn::backend::flex::{Flex, FlexTensor, Layout};
use burn::tensor::{
    backend::Backend, ops::FloatTensor, Bytes, DType, Shape, Tensor, TensorPrimitive,
};
use rayon::prelude::*;

/// A backend that can rotate by RoPE's tables.
pub trait FusedRope: Backend {
    /// `x·cos + rotate_half(x)·sin`, differentiable on autodiff backends.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let float = |t| Tensor::<Self, 4>::from_primitive(TensorPrimitive::Float(t));
        let table = |t| Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(t));
        rope_tensor_ops(float(x), table(cos), table(sin))
            .into_primitive()
            .tensor()
    }
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
        match (View::<4>::of(&x), View::<2>::of(&cos), View::<2>::of(&sin)) {
            (Some(x), Some(cos), Some(sin)) => rope_f32(&x, &cos, &sin),
            _ => {
                let float = |t| Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t));
                let table = |t| Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(t));
                rope_tensor_ops(float(x), table(cos), table(sin))
                    .into_primitive()
                    .tensor()
            }
        }
    }
}

/// A read-only strided f32 view of a Flex tensor of `D` dimensions.
struct View<'a, const D: usize> {
    data: &'a [f32],
    offset: usize,
    shape: [usize; D],
    strides: [usize; D],
}

impl<'a, const D: usize> View<'a, D> {
    fn of(t: &'a FlexTensor) -> Option<Self> {
        let layout = t.layout();
        if t.dtype() != DType::F32 || !layout.has_positive_strides() {
            return None;
        }
        let (shape, strides) = (layout.shape(), layout.strides());
        if shape.num_dims() != D {
            return None;
        }
        Some(Self {
            data: t.storage::<f32>(),
            offset: layout.start_offset(),
            shape: std::array::from_fn(|i| shape[i]),
            strides: std::array::from_fn(|i| strides[i] as usize),
        })
    }

    fn at(&self, index: [usize; D]) -> f32 {
        let at: usize = index.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
        self.data[self.offset + at]
    }

    /// The innermost row at `lead` (the other indices) as a slice, when it is contiguous.
    fn row(&self, lead: [usize; D]) -> Option<&'a [f32]> {
        let n = self.shape[D - 1];
        (self.strides[D - 1] == 1 || n == 1).then(|| {
            let start = self.offset
                + lead
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            &self.data[start..start + n]
        })
    }
}

/// One pass, one thread per (batch, head): each output element is `x·cos + r·sin` in that
/// order, as the composition computes it (Rust never fuses it into an FMA).
fn rope_f32(x: &View<4>, cos: &View<2>, sin: &View<2>) -> FlexTensor {
    let [b, h, t, hd] = x.shape;
    // NaN, not zero: an element the loop missed would show in every test.
    let mut out = vec![f32::NAN; b * h * t * hd];
    out.par_chunks_mut(t * hd)
        .enumerate()
        .for_each(|(bh, head)| {
            let (bi, hi) = (bh / h, bh % h);
            for (ti, y) in head.chunks_mut(hd).enumerate() {
                let rows = (x.row([bi, hi, ti, 0]), cos.row([ti, 0]), sin.row([ti, 0]));
                match rows {
                    (Some(x), Some(c), Some(s)) => rotate_row(y, x, c, s),
                    _ => {
                        let x: Vec<f32> = (0..hd).map(|i| x.at([bi, hi, ti, i])).collect();
                        let c: Vec<f32> = (0..hd).map(|i| cos.at([ti, i])).collect();
                        let s: Vec<f32> = (0..hd).map(|i| sin.at([ti, i])).collect();
                        rotate_row(y, &x, &c, &s)
                    }
                }
            }
        });
    FlexTensor::new(
        Bytes::from_elems(out),
        Layout::contiguous(Shape::from(vec![b, h, t, hd])),
        DType::F32,
    )
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
