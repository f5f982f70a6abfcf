//! The joined q|k|v product's heads on `CubeBackend`: gradients added into their columns in
//! place by lab-kernels' kernels; and through Fusion, as custom ops.

use burn::tensor::DType;
use burn_cubecl::{
    tensor::CubeTensor, BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement,
};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::{accumulate, rope};

use super::{custom_op, like};
use crate::heads::{add_heads_tensor_ops, heads_view};
use crate::{FusedHeads, HeadColumns};

impl<R, F, I, BT> FusedHeads for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn add_heads_into(acc: CubeTensor<R>, at: HeadColumns, value: CubeTensor<R>) -> CubeTensor<R> {
        let Some(first) = first_head(&acc, at) else {
            return add_heads_tensor_ops::<Self>(acc, at, value);
        };
        let acc = writable(acc);
        accumulate::add_into(value, as_heads::<R, F, I, BT>(&acc, at), first);
        acc
    }

    fn add_rope_transposed_into(
        acc: CubeTensor<R>,
        at: HeadColumns,
        dy: CubeTensor<R>,
        cos: CubeTensor<R>,
        sin: CubeTensor<R>,
    ) -> CubeTensor<R> {
        let Some(first) = first_head(&acc, at) else {
            let rotated = rope::rope_transposed(dy, cos, sin);
            return add_heads_tensor_ops::<Self>(acc, at, rotated);
        };
        let acc = writable(acc);
        rope::rope_transposed_added_into(dy, cos, sin, as_heads::<R, F, I, BT>(&acc, at), first);
        acc
    }
}

/// The first of the heads `at` among `acc`'s, where `acc`'s columns are whole heads and the
/// kernels take its dtype; `None` otherwise (never the model's).
fn first_head<R: CubeRuntime>(acc: &CubeTensor<R>, at: HeadColumns) -> Option<usize> {
    let hd = at.head_dim;
    let whole_heads =
        hd > 0 && at.first.is_multiple_of(hd) && acc.meta.shape()[1].is_multiple_of(hd);
    let kernels_add = matches!(acc.dtype, DType::F32 | DType::F16 | DType::BF16);
    (whole_heads && kernels_add).then_some(at.first / hd)
}

/// `acc` where the kernels may write it in place: contiguous, and its buffer its own (the
/// model's is both); otherwise a copy that is. The copy is cubecl's into a flat buffer: burn's
/// own `copy` allocates as a new tensor, with its rows padded on CUDA (to a multiple of 512
/// bytes, or under 512 to a power of two of at least 16), which the kernels' view of the
/// heads cannot take.
fn writable<R: CubeRuntime>(acc: CubeTensor<R>) -> CubeTensor<R> {
    if acc.is_contiguous() && acc.can_mut() {
        return acc;
    }
    let (client, device, dtype) = (acc.client.clone(), acc.device.clone(), acc.dtype);
    let flat =
        burn_cubecl::cubecl::std::tensor::into_contiguous(&client, acc.binding(), dtype.into());
    CubeTensor::new(client, flat.handle, *flat.metadata, device, dtype)
}

/// The whole of the contiguous `acc [B·T, W]` as heads, `[B, W / hd, T, hd]`: a view sharing
/// its buffer (what the kernels write through).
fn as_heads<R, F, I, BT>(acc: &CubeTensor<R>, at: HeadColumns) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [rows, width] = [acc.meta.shape()[0], acc.meta.shape()[1]];
    let all = HeadColumns {
        first: 0,
        heads: width / at.head_dim,
        ..at
    };
    let view = heads_view::<CubeBackend<R, F, I, BT>>(acc.clone(), all);
    let t = rows / at.batch;
    assert_eq!(
        &view.meta.strides()[..],
        [t * width, at.head_dim, width, 1],
        "heads: the gradient seen as heads is not laid out as the kernels expect"
    );
    // `acc`'s buffer was its own (`writable`): a view shares it, a copy would not.
    assert!(
        !acc.can_mut(),
        "heads: the gradient seen as heads is a copy, not a view"
    );
    view
}

/// Fusion records the adds as custom ops, the gradient so far in and out: when it is the
/// tensor's last use (as backward hands it over), the inner backend gets its buffer alone
/// and adds in place.
impl<B: FusionBackend + FusedHeads> FusedHeads for Fusion<B> {
    fn add_heads_into(
        acc: Self::FloatTensorPrimitive,
        at: HeadColumns,
        value: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        let out = like(&acc);
        let [out] = custom_op::<B, 1>(
            "lab_add_heads_into",
            vec![acc, value],
            [out],
            move |h, t| {
                let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
                vec![B::add_heads_into(get(0), at, get(1))]
            },
        );
        out
    }

    fn add_rope_transposed_into(
        acc: Self::FloatTensorPrimitive,
        at: HeadColumns,
        dy: Self::FloatTensorPrimitive,
        cos: Self::FloatTensorPrimitive,
        sin: Self::FloatTensorPrimitive,
    ) -> Self::FloatTensorPrimitive {
        let out = like(&acc);
        let inputs = vec![acc, dy, cos, sin];
        let [out] = custom_op::<B, 1>(
            "lab_add_rope_transposed_into",
            inputs,
            [out],
            move |h, t| {
                let mut get = |i: usize| h.get_float_tensor::<B>(&t[i]);
                vec![B::add_rope_transposed_into(
                    get(0),
                    at,
                    get(1),
                    get(2),
                    get(3),
                )]
            },
        );
        out
    }
}
