//! Two matrices side by side in one launch: `[a | b]`, `[K, N_a + N_b]`, from `a [K, N_a]` and
//! `b [K, N_b]` at their own strides.
//!
//! The feed-forward runs its gate and up projections as one product of their weights joined
//! this way, forward and again in backward. burn's concatenation writes each input with its
//! own launch (`SliceAssignKernel`); here one unit copies one output element, from `a` or `b`
//! by its column. A copy: the same bits in any dtype. [`pad_columns`] is the same kernel with
//! zeros for `b`.

use burn::tensor::Shape;
use burn_cubecl::{ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

/// Units per cube.
pub(crate) const UNITS: u32 = 256;

/// `out = [a | b]`, or `[a | 0]` where `zeros_for_b` (then `b` is a stand-in binding, never
/// read).
#[cube(launch)]
pub(crate) fn join_columns_kernel<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    out: &mut Tensor<F>,
    #[comptime] zeros_for_b: bool,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, width, split) = (out.shape(0), out.shape(1), a.shape(1));
    let i = ABSOLUTE_POS;
    if i < rows * width {
        let (r, c) = (i / width, i % width);
        let o = r * out.stride(0) + c * out.stride(1);
        if c < split {
            out[o] = a[r * a.stride(0) + c * a.stride(1)];
        } else if zeros_for_b {
            out[o] = F::new(0.0);
        } else {
            out[o] = b[r * b.stride(0) + (c - split) * b.stride(1)];
        }
    }
}

/// `[a | b]` of `a [K, N_a]` and `b [K, N_b]` (any strides, one dtype): a new contiguous
/// `[K, N_a + N_b]`.
pub fn join_columns<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>) -> CubeTensor<R> {
    let [rows, width] = joined_dims(&a, &b);
    let out = empty_like(&a, [rows, width]);
    join_columns_into(a, b, out)
}

/// [`join_columns`] into an output the caller allocated (tests poison it to see unwritten
/// elements): `[K, N_a + N_b]` in the inputs' dtype, any non-overlapping strides.
pub fn join_columns_into<R: CubeRuntime>(
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    out: CubeTensor<R>,
) -> CubeTensor<R> {
    let [rows, width] = joined_dims(&a, &b);
    assert_eq!(
        out.meta.shape().as_slice(),
        [rows, width],
        "join_columns: output shape"
    );
    launch(a, Some(b), out)
}

/// `[a | 0]`: `a [K, N_a]` (any strides) followed by zero columns up to `width ≥ N_a`, as a
/// new contiguous `[K, width]` in `a`'s dtype. The LM-head loss pads its weight this way to
/// an aligned vocabulary: one launch, where burn's concatenation with a tensor of zeros takes
/// four (fill, cast, one copy per input).
pub fn pad_columns<R: CubeRuntime>(a: CubeTensor<R>, width: usize) -> CubeTensor<R> {
    let out = empty_like(&a, [a.meta.shape()[0], width]);
    pad_columns_into(a, out)
}

/// [`pad_columns`] into an output the caller allocated (tests poison it to see unwritten
/// elements): `[K, width]` in `a`'s dtype, `width ≥ N_a`, any non-overlapping strides.
pub fn pad_columns_into<R: CubeRuntime>(a: CubeTensor<R>, out: CubeTensor<R>) -> CubeTensor<R> {
    let (sa, so) = (a.meta.shape(), out.meta.shape());
    assert!(
        sa.num_dims() == 2 && so.num_dims() == 2 && sa[0] == so[0] && sa[1] <= so[1],
        "pad_columns: a {sa:?} does not fit the output {so:?} as its leading columns"
    );
    // A buffer of no bytes cannot be bound on every runtime.
    assert!(
        sa[0] == 0 || sa[1] > 0,
        "pad_columns: a has no columns: nothing to pad"
    );
    launch(a, None, out)
}

fn empty_like<R: CubeRuntime>(a: &CubeTensor<R>, shape: [usize; 2]) -> CubeTensor<R> {
    let (client, device) = (a.client.clone(), a.device.clone());
    empty_device_contiguous_dtype(client, device, Shape::from(shape.to_vec()), a.dtype)
}

/// One launch of the kernel into `out` (shaped by the caller): `[a | b]`, or `[a | 0]`
/// without `b`.
fn launch<R: CubeRuntime>(
    a: CubeTensor<R>,
    b: Option<CubeTensor<R>>,
    out: CubeTensor<R>,
) -> CubeTensor<R> {
    assert_eq!(out.dtype, a.dtype, "join_columns: output dtype");
    let elements = out.meta.shape().num_elements();
    if elements == 0 {
        return out;
    }
    assert!(
        out.is_nonoverlapping(),
        "join_columns: the output overlaps itself, strides {:?}",
        out.meta.strides()
    );
    let zeros_for_b = b.is_none();
    // Without `b`, `a` stands in for its binding (read-only twice, which every runtime allows).
    let b = b.unwrap_or_else(|| a.clone());
    let client = a.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    let dtype = a.dtype;
    join_columns_kernel::launch::<R>(
        &client,
        cubecl::calculate_cube_count_elemwise(&client, elements, cube_dim),
        cube_dim,
        a.into_tensor_arg(),
        b.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        zeros_for_b,
        dtype.into(),
    );
    out
}

/// `[K, N_a + N_b]`, checked.
fn joined_dims<R: CubeRuntime>(a: &CubeTensor<R>, b: &CubeTensor<R>) -> [usize; 2] {
    let (sa, sb) = (a.meta.shape(), b.meta.shape());
    assert!(
        sa.num_dims() == 2 && sb.num_dims() == 2 && sa[0] == sb[0],
        "join_columns: a {sa:?} and b {sb:?} are not [K, N_a] and [K, N_b]"
    );
    assert_eq!(a.dtype, b.dtype, "join_columns: a and b differ in dtype");
    [sa[0], sa[1] + sb[1]]
}
