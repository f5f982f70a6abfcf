//! SwiGLU's gating on the gate and up projections computed as one product, as cubecl kernels.
//!
//! The feed-forward computes `h = x · [W_gate | W_up]`, `[N, 2f]`: columns `0..f` are the
//! gate `g`, columns `f..2f` the up projection `u`. One product instead of two is one launch
//! less forward, and in backward `dx = dh · [W_gate | W_up]ᵀ` is one product where two were
//! summed. For that, backward must hand back one `[N, 2f]` gradient, not two tensors to join:
//! - [`swiglu`]: `y[n, j] = silu(g)·u = g·σ(g)·u`, `[N, f]`.
//! - [`swiglu_backward`]: from `dy [N, f]`, `dh[n, j] = dg = (dy·u)·σ(g) + ((dy·u)·g)·σ(g)·(1 − σ(g))`
//!   and `dh[n, f + j] = du = dy·(g·σ(g))`, written into one `[N, 2f]` tensor.
//!
//! One unit owns a vector of columns `j ..` of one row (8 bf16 on CUDA where every tensor's
//! rows allow it, else one column: [`row_vector_size`]): it reads those of `g` and `u` (and
//! `dy`) and writes those of `y` (both halves of `dh`). Inputs are read through their strides;
//! outputs are new contiguous tensors. Arithmetic is f32 whatever the storage type (f32, f16,
//! bf16): one rounding per output element.

use burn::tensor::{DType, Shape};
use burn_cubecl::{ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use crate::vectors::row_vector_size;

/// Units per cube.
pub(crate) const UNITS: u32 = 256;

#[cube(launch)]
pub(crate) fn swiglu_kernel<F: Float, A: Float, N: Size>(
    h: &Tensor<Vector<F, N>>,
    out: &mut Tensor<Vector<F, N>>,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (f, width) = (out.shape(1), out.vector_size());
    let vectors = f / width;
    if ABSOLUTE_POS < out.shape(0) * vectors {
        let (row, j) = (ABSOLUTE_POS / vectors, (ABSOLUTE_POS % vectors) * width);
        let (g, u) = gate_and_up::<F, A, N>(h, row, j, f);
        out[at(out, row, j)] = Vector::cast_from(g * sigmoid::<A, N>(g) * u);
    }
}

#[cube(launch)]
pub(crate) fn swiglu_backward_kernel<F: Float, A: Float, N: Size>(
    h: &Tensor<Vector<F, N>>,
    dy: &Tensor<Vector<F, N>>,
    dh: &mut Tensor<Vector<F, N>>,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (f, width) = (dy.shape(1), dy.vector_size());
    let vectors = f / width;
    if ABSOLUTE_POS < dy.shape(0) * vectors {
        let (row, j) = (ABSOLUTE_POS / vectors, (ABSOLUTE_POS % vectors) * width);
        let (g, u) = gate_and_up::<F, A, N>(h, row, j, f);
        let dy = Vector::<A, N>::cast_from(dy[at(dy, row, j)]);
        let s = sigmoid::<A, N>(g);
        let d_silu = dy * u;
        let one = Vector::<A, N>::new(A::new(1.0));
        dh[at(dh, row, j)] = Vector::cast_from(d_silu * s + d_silu * g * s * (one - s));
        dh[at(dh, row, j + f)] = Vector::cast_from(dy * (g * s));
    }
}

/// The vector of `t` that holds element `(row, j)`: strides count elements, a vector
/// tensor is indexed in vectors (a row's columns are unit stride wherever a vector is wider
/// than one: [`row_vector_size`]).
#[cube]
fn at<E: Scalar, N: Size>(t: &Tensor<Vector<E, N>>, row: usize, j: usize) -> usize {
    (row * t.stride(0) + j * t.stride(1)) / t.vector_size()
}

/// Row `row`'s gate and up values at columns `j ..` of `h = [g | u]` (`f` columns each),
/// widened.
#[cube]
fn gate_and_up<F: Float, A: Float, N: Size>(
    h: &Tensor<Vector<F, N>>,
    row: usize,
    j: usize,
    f: usize,
) -> (Vector<A, N>, Vector<A, N>) {
    (
        Vector::cast_from(h[at(h, row, j)]),
        Vector::cast_from(h[at(h, row, j + f)]),
    )
}

/// `σ(x) = 1 / (1 + e^−x)`: 0 (not NaN) where `e^−x` overflows.
#[cube]
fn sigmoid<A: Float, N: Size>(x: Vector<A, N>) -> Vector<A, N> {
    let one = Vector::<A, N>::new(A::new(1.0));
    // `0 − x`, not `−x`: cubecl-cpp writes no unary minus for its vector types.
    one / (one + (Vector::<A, N>::new(A::new(0.0)) - x).exp())
}

/// `[N, f]` of `h [N, 2f]`, checked.
fn gate_dims<R: CubeRuntime>(h: &CubeTensor<R>) -> [usize; 2] {
    let s = h.meta.shape();
    assert_eq!(s.num_dims(), 2, "swiglu: h is [N, 2f]");
    assert!(
        s[1].is_multiple_of(2),
        "swiglu: h has {} columns, not 2f",
        s[1]
    );
    // The arithmetic is f32: wider storage would lose precision silently.
    assert!(
        matches!(h.dtype, DType::F32 | DType::F16 | DType::BF16),
        "swiglu: h is {:?}; the kernels compute in f32 for f32, f16 and bf16",
        h.dtype
    );
    [s[0], s[1] / 2]
}

fn empty_like<R: CubeRuntime>(h: &CubeTensor<R>, shape: [usize; 2]) -> CubeTensor<R> {
    let (client, device) = (h.client.clone(), h.device.clone());
    empty_device_contiguous_dtype(client, device, Shape::from(shape.to_vec()), h.dtype)
}

/// `silu(g) ⊙ u` of the fused `h = [g | u]` (`[N, 2f]`, any strides): a new contiguous `[N, f]`.
pub fn swiglu<R: CubeRuntime>(h: CubeTensor<R>) -> CubeTensor<R> {
    let out = empty_like(&h, gate_dims(&h));
    swiglu_into(h, out)
}

/// SwiGLU's backward: `dh = [dg | du]` (`[N, 2f]`, new and contiguous) for the output's
/// gradient `dy [N, f]` (any strides, `h`'s dtype).
pub fn swiglu_backward<R: CubeRuntime>(h: CubeTensor<R>, dy: CubeTensor<R>) -> CubeTensor<R> {
    let [n, f] = gate_dims(&h);
    let dh = empty_like(&h, [n, 2 * f]);
    swiglu_backward_into(h, dy, dh)
}

/// [`swiglu`] into an output the caller allocated (tests poison it to see unwritten
/// elements): `[N, f]` in `h`'s dtype, any non-overlapping strides.
pub fn swiglu_into<R: CubeRuntime>(h: CubeTensor<R>, out: CubeTensor<R>) -> CubeTensor<R> {
    let [n, f] = gate_dims(&h);
    check_output("output", &out, [n, f], h.dtype);
    let client = h.client.clone();
    let (cube_dim, types) = (CubeDim::new_1d(UNITS), [h.dtype.into(), DType::F32.into()]);
    if n * f > 0 {
        let width = row_vector_size(&[&h, &out], f);
        swiglu_kernel::launch::<R>(
            &client,
            cubecl::calculate_cube_count_elemwise(&client, n * f / width, cube_dim),
            cube_dim,
            width,
            h.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            types,
        );
    }
    out
}

/// [`swiglu_backward`] into a `[N, 2f]` gradient the caller allocated, as [`swiglu_into`].
pub fn swiglu_backward_into<R: CubeRuntime>(
    h: CubeTensor<R>,
    dy: CubeTensor<R>,
    dh: CubeTensor<R>,
) -> CubeTensor<R> {
    let [n, f] = gate_dims(&h);
    assert_eq!(
        dy.meta.shape().as_slice(),
        [n, f],
        "swiglu: dy is not [{n}, {f}]"
    );
    assert_eq!(dy.dtype, h.dtype, "swiglu: dy is not h's dtype");
    check_output("gradient", &dh, [n, 2 * f], h.dtype);
    let client = h.client.clone();
    let (cube_dim, types) = (CubeDim::new_1d(UNITS), [h.dtype.into(), DType::F32.into()]);
    if n * f > 0 {
        let width = row_vector_size(&[&h, &dy, &dh], f);
        swiglu_backward_kernel::launch::<R>(
            &client,
            cubecl::calculate_cube_count_elemwise(&client, n * f / width, cube_dim),
            cube_dim,
            width,
            h.into_tensor_arg(),
            dy.into_tensor_arg(),
            dh.clone().into_tensor_arg(),
            types,
        );
    }
    dh
}

fn check_output<R: CubeRuntime>(name: &str, t: &CubeTensor<R>, shape: [usize; 2], dtype: DType) {
    assert_eq!(t.meta.shape().as_slice(), shape, "swiglu: {name} shape");
    assert_eq!(t.dtype, dtype, "swiglu: {name} dtype");
    // (An empty tensor's strides may be 0, which burn counts as overlapping.)
    assert!(
        shape.contains(&0) || t.is_nonoverlapping(),
        "swiglu: the {name} overlaps itself, strides {:?}",
        t.meta.strides()
    );
}
