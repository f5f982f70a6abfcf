//! Matrices side by side in one launch: `[a | b]` or `[a | b | c]`, `[K, N_a + N_b (+ N_c)]`,
//! from `a [K, N_a]`, `b [K, N_b]` (and `c [K, N_c]`) at their own strides.
//!
//! The feed-forward runs its gate and up projections as one product of their weights joined
//! this way, and the attention its q, k and v projections (three parts), forward and again in
//! backward. burn's concatenation writes each input with its own launch
//! (`SliceAssignKernel`); here one unit copies one output element, from the part its column
//! falls in. A copy: the same bits in any dtype. [`pad_columns`] is the same kernel with zeros
//! after `a`.

use burn::tensor::Shape;
use burn_cubecl::{ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

/// Units per cube.
pub(crate) const UNITS: u32 = 256;

/// `out = [a | 0]` (`parts` 1: `b` and `c` are stand-in bindings, never read), `[a | b]`
/// (`parts` 2: `c` a stand-in) or `[a | b | c]` (`parts` 3).
#[cube(launch)]
pub(crate) fn join_columns_kernel<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    c: &Tensor<F>,
    out: &mut Tensor<F>,
    #[comptime] parts: u32,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, width) = (out.shape(0), out.shape(1));
    let (at_b, at_c) = (a.shape(1), a.shape(1) + b.shape(1));
    let i = ABSOLUTE_POS;
    if i < rows * width {
        let (r, col) = (i / width, i % width);
        let o = r * out.stride(0) + col * out.stride(1);
        if col < at_b {
            out[o] = a[r * a.stride(0) + col * a.stride(1)];
        } else if parts == 1 {
            out[o] = F::new(0.0);
        } else if parts == 2 || col < at_c {
            out[o] = b[r * b.stride(0) + (col - at_b) * b.stride(1)];
        } else {
            out[o] = c[r * c.stride(0) + (col - at_c) * c.stride(1)];
        }
    }
}

/// `[a | b]` or `[a | b | c]` of `parts` `[K, N_i]` (any strides, one dtype): a new contiguous
/// `[K, Σ N_i]`.
pub fn join_columns<R: CubeRuntime>(parts: Vec<CubeTensor<R>>) -> CubeTensor<R> {
    let [rows, width] = joined_dims(&parts);
    let out = empty_like(&parts[0], [rows, width]);
    join_columns_into(parts, out)
}

/// [`join_columns`] into an output the caller allocated (tests poison it to see unwritten
/// elements): `[K, Σ N_i]` in the parts' dtype, any non-overlapping strides.
pub fn join_columns_into<R: CubeRuntime>(
    parts: Vec<CubeTensor<R>>,
    out: CubeTensor<R>,
) -> CubeTensor<R> {
    let [rows, width] = joined_dims(&parts);
    assert_eq!(
        out.meta.shape().as_slice(),
        [rows, width],
        "join_columns: output shape"
    );
    launch(parts, out)
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
    launch(vec![a], out)
}

fn empty_like<R: CubeRuntime>(a: &CubeTensor<R>, shape: [usize; 2]) -> CubeTensor<R> {
    let (client, device) = (a.client.clone(), a.device.clone());
    empty_device_contiguous_dtype(client, device, Shape::from(shape.to_vec()), a.dtype)
}

/// One launch of the kernel into `out` (shaped by the caller): the parts side by side, or
/// `[a | 0]` for one part.
fn launch<R: CubeRuntime>(parts: Vec<CubeTensor<R>>, out: CubeTensor<R>) -> CubeTensor<R> {
    let a = parts[0].clone();
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
    let count = parts.len() as u32;
    // `a` stands in for the bindings of absent parts (read-only more than once, which every
    // runtime allows).
    let mut parts = parts.into_iter();
    let mut next = || parts.next().unwrap_or_else(|| a.clone()).into_tensor_arg();
    let (a_arg, b_arg, c_arg) = (next(), next(), next());
    let client = a.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    join_columns_kernel::launch::<R>(
        &client,
        cubecl::calculate_cube_count_elemwise(&client, elements, cube_dim),
        cube_dim,
        a_arg,
        b_arg,
        c_arg,
        out.clone().into_tensor_arg(),
        count,
        a.dtype.into(),
    );
    out
}

/// `[K, Σ N_i]` of two or three parts, checked.
fn joined_dims<R: CubeRuntime>(parts: &[CubeTensor<R>]) -> [usize; 2] {
    assert!(
        (2..=3).contains(&parts.len()),
        "join_columns: two or three parts, got {}",
        parts.len()
    );
    let rows = parts[0].meta.shape().as_slice().first().copied();
    let mut width = 0;
    for (i, p) in parts.iter().enumerate() {
        let s = p.meta.shape();
        assert!(
            s.num_dims() == 2 && Some(s[0]) == rows,
            "join_columns: part {i} is {s:?}, not [K, N] with the first part's K"
        );
        assert_eq!(
            p.dtype, parts[0].dtype,
            "join_columns: part {i} differs in dtype"
        );
        // A buffer of no bytes cannot be bound on every runtime.
        assert!(
            s[0] == 0 || s[1] > 0,
            "join_columns: part {i} has no columns"
        );
        width += s[1];
    }
    [rows.unwrap_or(0), width]
}
