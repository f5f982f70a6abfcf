//! Small helpers the Flex kernels share for reading and making tensors.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};

/// `t` itself when its elements are one contiguous run, else a contiguous copy.
pub(crate) fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.layout().contiguous_offsets().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

/// A contiguous f32 tensor of `shape` holding `data`.
pub(crate) fn f32_tensor<const D: usize>(data: Vec<f32>, shape: [usize; D]) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(data),
        Layout::contiguous(Shape::from(shape.to_vec())),
        DType::F32,
    )
}
