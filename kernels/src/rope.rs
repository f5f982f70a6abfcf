//! Rotary position embedding in one pass, as a cubecl kernel.
//!
//! With `h = hd/2`, each pair `(x[i], x[i + h])` of a head row at position `t` becomes
//! `y[i] = x[i]·cos[t, i] − x[i+h]·sin[t, i]` and `y[i+h] = x[i+h]·cos[t, i+h] +
//! x[i]·sin[t, i+h]`. One unit owns one pair, or a vector of consecutive pairs where every
//! tensor's rows allow it (16 bytes: 8 bf16 on CUDA): for each pair it reads two elements of
//! `x` and four of the tables and writes two of the output. burn's composition of the same
//! (two narrows, a negation, a concatenation, two products and a sum) reads and writes
//! `x`-sized tensors about six times.
//!
//! RoPE's backward is its transpose: RoPE again with `−swap_halves(sin)` for `sin`,
//! `dx[i] = dy[i]·cos[t, i] + dy[i+h]·sin[t, i+h]` and `dx[i+h] = dy[i+h]·cos[t, i+h] −
//! dy[i]·sin[t, i]`. The same kernel reads `sin` that way when launched as [`rope_transposed`]
//! (a comptime flag), so backward needs no table of its own: building `−swap_halves(sin)`
//! took three more launches (two slice writes and a negation) for each of q and k per layer.
//! The negations are exact, so both ways give the same bits.
//!
//! `x [B, H, T, hd]` is read through its strides, so the model's `[B, T, H, hd]` projections
//! with their middle axes swapped, and gradients with strided rows, need no copy; the tables
//! `cos, sin [T, hd]` too (a narrowed window of longer tables, as decoding after a KV cache
//! passes). The output takes `x`'s layout ([`crate::layout`]): for the model's swapped view, a
//! tensor whose middle axes swapped back are contiguous again, so the attention reads it and
//! the gradient leaves through the projections with no copy. Arithmetic is f32 whatever the storage type (f32, f16,
//! bf16): one rounding per output element, where the composition in bf16 rounds three times.

use burn::tensor::DType;
use burn_cubecl::{tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use crate::{layout::empty_in_layout_of, vectors::row_vector_size};

/// Units per cube.
pub(crate) const UNITS: u32 = 256;

/// Each unit turns `N` consecutive pairs (one where a tensor's rows do not allow more:
/// [`row_vector_size`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_kernel<F: Float, A: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    cos: &Tensor<Vector<F, N>>,
    sin: &Tensor<Vector<F, N>>,
    out: &mut Tensor<Vector<F, N>>,
    out_head: usize,
    #[comptime] transposed: bool,
    #[comptime] adding: bool,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (heads, seq, half) = (x.shape(1), x.shape(2), x.shape(3) / 2);
    let width = x.vector_size();
    let vectors = half / width;
    let unit = ABSOLUTE_POS;
    if unit < x.shape(0) * heads * seq * vectors {
        // The unit's (batch, head, position, first index in the first half).
        let (row, i) = (unit / vectors, (unit % vectors) * width);
        let (bh, t) = (row / seq, row % seq);
        let (b, h) = (bh / heads, bh % heads);
        let at_a = b * x.stride(0) + h * x.stride(1) + t * x.stride(2) + i * x.stride(3);
        let at_b = at_a + half * x.stride(3);
        let xa = Vector::<A, N>::cast_from(x[at_a / width]);
        let xb = Vector::<A, N>::cast_from(x[at_b / width]);
        // The sines these pairs turn by: `sin`'s, or `−swap_halves(sin)`'s (negated by a
        // product with −1, exact, signed zeros too).
        let mut sa = entry::<F, A, N>(sin, t, i);
        let mut sb = entry::<F, A, N>(sin, t, i + half);
        if transposed {
            let minus_one = Vector::<A, N>::new(A::new(-1.0));
            let first = sa;
            sa = sb * minus_one;
            sb = first * minus_one;
        }
        let ya = xa * entry::<F, A, N>(cos, t, i) - xb * sa;
        let yb = xb * entry::<F, A, N>(cos, t, i + half) + xa * sb;
        let o = b * out.stride(0) + (out_head + h) * out.stride(1) + t * out.stride(2) + i;
        let (oa, ob) = (o / width, (o + half) / width);
        if adding {
            out[oa] = Vector::cast_from(Vector::<A, N>::cast_from(out[oa]) + ya);
            out[ob] = Vector::cast_from(Vector::<A, N>::cast_from(out[ob]) + yb);
        } else {
            out[oa] = Vector::cast_from(ya);
            out[ob] = Vector::cast_from(yb);
        }
    }
}

/// A table's entries `[t, j ..]`, widened.
#[cube]
fn entry<F: Float, A: Float, N: Size>(
    table: &Tensor<Vector<F, N>>,
    t: usize,
    j: usize,
) -> Vector<A, N> {
    let at = t * table.stride(0) + j * table.stride(1);
    Vector::cast_from(table[at / table.vector_size()])
}

/// `[B, H, T, hd]` of `x`, checked against the tables' `[T, hd]` and dtype.
fn dims<R: CubeRuntime>(x: &CubeTensor<R>, cos: &CubeTensor<R>, sin: &CubeTensor<R>) -> [usize; 4] {
    let s = x.meta.shape();
    assert_eq!(s.num_dims(), 4, "rope: x is [B, H, T, hd]");
    let [b, h, t, hd] = [s[0], s[1], s[2], s[3]];
    assert!(hd % 2 == 0, "rope: head_dim {hd} is odd");
    // The arithmetic is f32: wider storage would lose precision silently.
    assert!(
        matches!(x.dtype, DType::F32 | DType::F16 | DType::BF16),
        "rope: x is {:?}; the kernel computes in f32 for f32, f16 and bf16",
        x.dtype
    );
    for (name, table) in [("cos", cos), ("sin", sin)] {
        let ts = table.meta.shape();
        assert_eq!(ts.as_slice(), [t, hd], "rope: {name} is not [{t}, {hd}]");
        assert_eq!(table.dtype, x.dtype, "rope: {name} is not x's dtype");
    }
    [b, h, t, hd]
}

/// RoPE of `x [B, H, T, hd]` (any strides) by `cos, sin [T, hd]` in `x`'s dtype (any
/// strides): a new tensor in `x`'s layout (see the module docs).
pub fn rope<R: CubeRuntime>(
    x: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
) -> CubeTensor<R> {
    let out = output_for(&x, &cos, &sin);
    launch(x, cos, sin, (out, 0), Rotation::Forward)
}

/// RoPE's transpose (its backward) of `dy [B, H, T, hd]` by the forward's tables: [`rope`]
/// by `cos` and `−swap_halves(sin)`, without building that table.
pub fn rope_transposed<R: CubeRuntime>(
    dy: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
) -> CubeTensor<R> {
    let out = output_for(&dy, &cos, &sin);
    launch(dy, cos, sin, (out, 0), Rotation::Transposed)
}

/// A new tensor shaped, typed and laid out as `x`, checked against the tables.
fn output_for<R: CubeRuntime>(
    x: &CubeTensor<R>,
    cos: &CubeTensor<R>,
    sin: &CubeTensor<R>,
) -> CubeTensor<R> {
    dims(x, cos, sin);
    empty_in_layout_of(x, x.dtype)
}

/// [`rope`] into an output the caller allocated (tests poison it to see unwritten
/// elements): shaped and typed as `x`, in any layout whose head rows have unit stride.
pub fn rope_into<R: CubeRuntime>(
    x: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
    out: CubeTensor<R>,
) -> CubeTensor<R> {
    launch(x, cos, sin, (out, 0), Rotation::Forward)
}

/// [`rope_transposed`] into an output the caller allocated, as [`rope_into`].
pub fn rope_transposed_into<R: CubeRuntime>(
    dy: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
    out: CubeTensor<R>,
) -> CubeTensor<R> {
    launch(dy, cos, sin, (out, 0), Rotation::Transposed)
}

/// `out[:, first + h] += ` [`rope_transposed`]`(dy)[:, h]`, in place: the sum in f32, rounded
/// once to `out`'s dtype. `out [B, H_out, T, hd]` is typed as `dy`, alike but in its heads
/// (`first + H ≤ H_out`), in any layout whose head rows have unit stride: the model's q and k
/// gradients go straight into their heads of the joined q|k|v product's gradient (that
/// whole gradient seen as heads, lab-ops' `rope_heads`), where a copy would follow. (Heads
/// picked by `first`, not by a view starting inside the buffer, which is a copy wherever
/// that start is not aligned for binding.) `out` must not share memory with `dy`.
pub fn rope_transposed_added_into<R: CubeRuntime>(
    dy: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
    out: CubeTensor<R>,
    first: usize,
) -> CubeTensor<R> {
    launch(dy, cos, sin, (out, first), Rotation::TransposedAdded)
}

/// Which rotation a launch computes, and whether it adds to the output.
#[derive(Clone, Copy, PartialEq)]
enum Rotation {
    Forward,
    Transposed,
    TransposedAdded,
}

fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
    (out, out_head): (CubeTensor<R>, usize),
    rotation: Rotation,
) -> CubeTensor<R> {
    let [b, h, t, hd] = dims(&x, &cos, &sin);
    let outer = out.meta.shape();
    // Only the adding transpose writes into some heads of a wider output.
    let heads_fit = match rotation {
        Rotation::TransposedAdded => out_head + h <= outer[1],
        _ => outer[1] == h,
    };
    assert!(
        outer.num_dims() == 4 && [outer[0], outer[2], outer[3]] == [b, t, hd] && heads_fit,
        "rope: the output {outer:?} does not hold [{b}, {h}, {t}, {hd}] from head {out_head}"
    );
    assert_eq!(out.dtype, x.dtype, "rope: output dtype");
    let pairs = b * h * t * hd / 2;
    if pairs == 0 {
        return out;
    }
    // (An empty tensor's strides may be 0, which burn counts as overlapping.)
    assert!(
        out.is_nonoverlapping() && out.meta.strides()[3] == 1,
        "rope: the output is non-overlapping with unit-stride head rows, not strides {:?}",
        out.meta.strides()
    );
    let client = x.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    let types = [x.dtype.into(), DType::F32.into()];
    let width = row_vector_size(&[&x, &cos, &sin, &out], hd / 2);
    rope_kernel::launch::<R>(
        &client,
        cubecl::calculate_cube_count_elemwise(&client, pairs / width, cube_dim),
        cube_dim,
        width,
        x.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        out_head,
        rotation != Rotation::Forward,
        rotation == Rotation::TransposedAdded,
        types,
    );
    out
}
