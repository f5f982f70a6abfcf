//! `out[:, first + h] += value[:, h]` in place, for `value [d0, n, d2, d3]` and `out [d0, m,
//! d2, d3]` (`first + n ≤ m`) each at its own strides: the sum in f32 whatever the storage
//! type (f32, f16, bf16), rounded once to `out`'s.
//!
//! The attention's v gradient goes this way into its heads of the joined q|k|v product's
//! gradient (`out` that whole gradient seen as heads, lab-ops' `heads`), where burn would add
//! into a copy of the columns and write them back (two launches). The heads are picked by
//! `first`, not by a view that starts inside the buffer: such a view is a copy wherever its
//! start is not aligned for binding. One unit adds one element, walking `value` in row-major
//! order.

use burn::tensor::DType;
use burn_cubecl::{tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

/// Units per cube.
pub(crate) const UNITS: u32 = 256;

#[cube(launch)]
pub(crate) fn add_into_kernel<F: Float, A: Float>(
    value: &Tensor<F>,
    out: &mut Tensor<F>,
    first: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (d1, d2, d3) = (value.shape(1), value.shape(2), value.shape(3));
    let i = ABSOLUTE_POS;
    if i < value.shape(0) * d1 * d2 * d3 {
        let (i3, rest) = (i % d3, i / d3);
        let (i2, rest) = (rest % d2, rest / d2);
        let (i1, i0) = (rest % d1, rest / d1);
        let v = i0 * value.stride(0)
            + i1 * value.stride(1)
            + i2 * value.stride(2)
            + i3 * value.stride(3);
        let o = i0 * out.stride(0)
            + (first + i1) * out.stride(1)
            + i2 * out.stride(2)
            + i3 * out.stride(3);
        out[o] = F::cast_from(A::cast_from(out[o]) + A::cast_from(value[v]));
    }
}

/// `out[:, first..first + n] += value` (see the module docs); returns `out`. Both are 4-D of
/// one dtype (f32, f16 or bf16), alike but in their second axis; `out` must not overlap itself
/// nor share memory with `value`.
pub fn add_into<R: CubeRuntime>(
    value: CubeTensor<R>,
    out: CubeTensor<R>,
    first: usize,
) -> CubeTensor<R> {
    let (shape, outer) = (value.meta.shape().clone(), out.meta.shape());
    assert!(
        shape.num_dims() == 4
            && outer.num_dims() == 4
            && [0, 2, 3].iter().all(|&a| shape[a] == outer[a])
            && first + shape[1] <= outer[1],
        "add_into: value {shape:?} does not fit out {outer:?} from index {first} of its axis 1"
    );
    assert_eq!(
        out.dtype, value.dtype,
        "add_into: out's dtype is not value's"
    );
    assert!(
        matches!(out.dtype, DType::F32 | DType::F16 | DType::BF16),
        "add_into: {:?}; the kernel adds in f32 for f32, f16 and bf16",
        out.dtype
    );
    let elements = shape.num_elements();
    if elements == 0 {
        return out;
    }
    assert!(
        out.is_nonoverlapping(),
        "add_into: out overlaps itself, strides {:?}",
        out.meta.strides()
    );
    let client = value.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    let types = [value.dtype.into(), DType::F32.into()];
    add_into_kernel::launch::<R>(
        &client,
        cubecl::calculate_cube_count_elemwise(&client, elements, cube_dim),
        cube_dim,
        value.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        first,
        types,
    );
    out
}
