//! The row-wise halves of the fused LM-head cross-entropy, as cubecl kernels.
//!
//! The loss walks the rows of `hidden [N, d]` a chunk at a time; per chunk the caller runs
//! the matmul `logits = hidden[s..e] @ weight` (`[c, Vp]` over a vocabulary padded with zero
//! columns to aligned rows, tensor cores on a GPU) and these kernels, given the `[c, V]` view
//! of its first columns ([`leading_columns`]), do everything that is one row at a time:
//! - [`row_loss`]: per row, `lse = logsumexp(logits)` and `loss = lse − logits[target]`,
//!   written at the chunk's offset into `[N]` outputs (no per-chunk tensors to concatenate);
//! - [`softmax_grad_in_place`]: overwrites the logits with `d loss/d logits =
//!   (softmax − onehot(target)) · grad_loss / N`, one pass, no `[c, V]` temporary;
//! - [`add_widened`]: `acc += x` elementwise, `acc` f32 and `x` any float type, in place:
//!   the weight gradient summed over chunks in fp32 without a widened copy of each chunk's.
//!
//! Arithmetic is f32 whatever the logits' storage (f32, f16, bf16): as PyTorch's autocast,
//! the softmax and the loss run in fp32. One cube of [`ROW_UNITS`] units owns a row; each unit
//! strides over the vocabulary keeping its own running max and sum (online softmax), then the
//! cube combines the units' pairs in shared memory, in a fixed order (deterministic).
//!
//! The row kernels read the logits in vectors of 16 bytes (8 bf16) where the rows allow it
//! ([`padded_row_vector_size`]): GPT-2's 50,257 columns are not whole vectors, so a row's last
//! vector reaches into the padding of the 50,304-column product, whose lanes are left out of
//! the sums and written back unchanged. A vector raises the running max at most once, then
//! takes one `exp` a lane, all independent.

use burn::tensor::DType;
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use crate::{
    rows::{cube_row, row_grid},
    vectors::padded_row_vector_size,
};

/// Units per row: within every target's workgroup limit (lavapipe and CUDA allow 1,024), and
/// a 50K-word row is streamed in about 25 strides of 8 columns a unit.
pub const ROW_UNITS: usize = 256;

/// Units per cube of [`add_widened`]: one a vector of the weight gradient.
pub(crate) const ADD_UNITS: u32 = 256;

// The tree in `combine_units` halves the cube's width down to one unit.
const _: () = assert!(ROW_UNITS.is_power_of_two());

#[cube(launch)]
pub(crate) fn row_loss_kernel<F: Float, I: Numeric, A: Float, N: Size>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    lse: &mut Tensor<A>,
    loss: &mut Tensor<A>,
    row_offset: usize,
    #[comptime] units: usize,
    #[define(F, I, A)] _dtypes: [StorageType; 3],
) {
    let (rows, vocab) = (logits.shape(0), logits.shape(1));
    let width = logits.vector_size();
    let r = cube_row();
    let u = UNIT_POS_X as usize;
    // The target's logit, kept by the unit whose vector holds it, read by unit 0 after the
    // barriers in `combine_units`. An id past the row's columns finds none and leaves the
    // lowest value: a loss of ~3.4e38, deterministic, where it read another row's logit.
    let mut target_logit = SharedMemory::<A>::new(1usize);
    // The whole cube shares `r`, so leaving here skips no barrier another unit waits at.
    if r < rows {
        if u == 0 {
            target_logit[0] = A::min_value();
        }
        sync_cube();
        let row = row_offset + r;
        let t = usize::cast_from(targets[row]);
        // Strided: CUDA pads each row of a matmul's output to 512 bytes.
        let (base, col) = (r * logits.stride(0), logits.stride(1));
        // This unit's running max and sum over its vectors u, u + units, … of the row.
        let mut m = A::min_value();
        let mut s = A::new(0.0);
        let mut j = u * width;
        while j < vocab {
            let xs = widened::<F, A, N>(logits[(base + j * col) / width], j, vocab);
            let mut top = m;
            #[unroll]
            for k in 0..width {
                if j + k == t {
                    target_logit[0] = xs[k];
                }
                top = max(top, xs[k]);
            }
            // Rescaled only when the vector raises the max; then one exp a lane, all
            // independent.
            if top > m {
                s *= (m - top).exp();
                m = top;
            }
            let e = (xs - Vector::new(m)).exp();
            #[unroll]
            for k in 0..width {
                s += e[k];
            }
            j += units * width;
        }
        let (m, s) = combine_units::<A>(m, s, units);
        if u == 0 {
            let row_lse = m + s.ln();
            lse[row] = row_lse;
            loss[row] = row_lse - target_logit[0];
        }
    }
}

/// The vector of columns `j ..` of a row of `vocab` columns in f32, the lanes past the last
/// column (the row's padding) as the lowest value, whose `exp(x − max)` is 0.
#[cube]
fn widened<F: Float, A: Float, N: Size>(xs: Vector<F, N>, j: usize, vocab: usize) -> Vector<A, N> {
    let mut wide = Vector::<A, N>::cast_from(xs);
    #[unroll]
    for k in 0..xs.vector_size() {
        if j + k >= vocab {
            wide[k] = A::min_value();
        }
    }
    wide
}

/// The cube's max and sum of `exp(x − max)` from every unit's pair, in a tree over shared
/// memory (the same order on every run). Unit 0 returns the result.
#[cube]
fn combine_units<A: Float>(m: A, s: A, #[comptime] units: usize) -> (A, A) {
    let u = UNIT_POS_X as usize;
    let mut maxes = SharedMemory::<A>::new(units);
    let mut sums = SharedMemory::<A>::new(units);
    maxes[u] = m;
    sums[u] = s;
    sync_cube();
    // Halving from the cube's width (`units`, a power of two: every launch passes ROW_UNITS)
    // as a runtime value: cubecl cannot mutate a comptime one.
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if u < stride {
            let (ma, mb) = (maxes[u], maxes[u + stride]);
            let mut top = ma;
            if mb > top {
                top = mb;
            }
            // A unit that saw no column holds (lowest, 0): its term is 0 · exp(…) = 0.
            sums[u] = sums[u] * (ma - top).exp() + sums[u + stride] * (mb - top).exp();
            maxes[u] = top;
        }
        sync_cube();
        stride /= 2;
    }
    (maxes[0], sums[0])
}

#[cube(launch)]
pub(crate) fn softmax_grad_kernel<F: Float, I: Numeric, A: Float, N: Size>(
    logits: &mut Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    lse: &Tensor<A>,
    grad_loss: &Tensor<A>,
    inv_rows: f32,
    row_offset: usize,
    #[comptime] units: usize,
    #[define(F, I, A)] _dtypes: [StorageType; 3],
) {
    let (rows, vocab) = (logits.shape(0), logits.shape(1));
    let width = logits.vector_size();
    let r = cube_row();
    if r < rows {
        let row = row_offset + r;
        let (base, col) = (r * logits.stride(0), logits.stride(1));
        let t = usize::cast_from(targets[row]);
        let row_lse = lse[row];
        let scale = grad_loss[0] * A::cast_from(inv_rows);
        let mut j = UNIT_POS_X as usize * width;
        while j < vocab {
            let at = (base + j * col) / width;
            // Lanes past the row's last column are its padding: written back as they were.
            let mut xs = logits[at];
            let mut g = (widened::<F, A, N>(xs, j, vocab) - Vector::new(row_lse)).exp();
            #[unroll]
            for k in 0..width {
                if j + k == t {
                    g[k] -= A::new(1.0);
                }
                if j + k < vocab {
                    xs[k] = F::cast_from(g[k] * scale);
                }
            }
            logits[at] = xs;
            j += units * width;
        }
    }
}

/// One unit per vector of a row of the 2-D `acc` (one element where a row's layout does not
/// allow more); each tensor read through its own strides (an f32 and a bf16 matrix are padded
/// differently on CUDA). Where the columns are not whole vectors, a row's last vector may
/// reach into its padding ([`padded_row_vector_size`]): those lanes of `acc` are written back
/// as they were. (The loss sums its weight gradient at the padded width, 50,304 columns:
/// whole vectors.)
#[cube(launch)]
pub(crate) fn add_widened_kernel<F: Float, A: Float, N: Size>(
    acc: &mut Tensor<Vector<A, N>>,
    x: &Tensor<Vector<F, N>>,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (rows, cols) = (acc.shape(0), acc.shape(1));
    let width = acc.vector_size();
    let vectors = cols.div_ceil(width);
    let i = ABSOLUTE_POS;
    if i < rows * vectors {
        let (r, c) = (i / vectors, (i % vectors) * width);
        let a = (r * acc.stride(0) + c * acc.stride(1)) / width;
        let mut sum = acc[a];
        let widened = Vector::<A, N>::cast_from(x[(r * x.stride(0) + c * x.stride(1)) / width]);
        #[unroll]
        for k in 0..width {
            if c + k < cols {
                sum[k] += widened[k];
            }
        }
        acc[a] = sum;
    }
}

fn shape2(t: &CubeTensor<impl CubeRuntime>, what: &str) -> [usize; 2] {
    let s = t.meta.shape();
    assert_eq!(s.num_dims(), 2, "{what}: expected a 2-D tensor");
    [s[0], s[1]]
}

/// The first `cols` columns of the 2-D `t`, as a view of the same memory: the rows keep their
/// stride, so the view's rows are padded by what is left out. (burn's `slice` copies a cut
/// whose end is not on the memory's alignment, as `[.., ..50257]` of a padded row is not.)
pub fn leading_columns<R: CubeRuntime>(t: &CubeTensor<R>, cols: usize) -> CubeTensor<R> {
    let [_, all] = shape2(t, "leading_columns");
    assert!(cols <= all, "leading_columns: {cols} of {all} columns");
    let mut view = t.clone();
    view.meta.shape_mut()[1] = cols;
    view
}

/// Panics unless no two elements of the 2-D `t` share memory (no broadcast, no overlapping
/// rows): many units write it in place.
fn assert_distinct<R: CubeRuntime>(t: &CubeTensor<R>, what: &str) {
    let [rows, cols] = shape2(t, what);
    let strides = t.meta.strides();
    let columns_apart = cols <= 1 || strides[1] >= 1;
    let rows_apart = rows <= 1 || strides[0] >= cols * strides[1];
    assert!(
        columns_apart && rows_apart,
        "{what}: elements overlap (strides {strides:?})"
    );
}

fn check_rows<R: CubeRuntime>(
    targets: &CubeTensor<R>,
    per_row: &[&CubeTensor<R>],
    chunk_rows: usize,
    row_offset: usize,
) {
    let n = targets.meta.shape().num_elements();
    assert!(
        row_offset + chunk_rows <= n,
        "lm_head: rows {row_offset}..{} past the {n} targets",
        row_offset + chunk_rows
    );
    for t in per_row {
        assert_eq!(
            t.meta.shape().num_elements(),
            n,
            "lm_head: a per-row [N] tensor"
        );
        assert_eq!(t.dtype, DType::F32, "lm_head: per-row statistics are f32");
    }
}

/// Rows `row_offset ..` of `lse [N]` and `loss [N]` (both f32, contiguous) from the chunk
/// `logits [c, V]` (any strides) and `targets [N]` (ids in `0..V`).
pub fn row_loss<R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: CubeTensor<R>,
    lse: &CubeTensor<R>,
    loss: &CubeTensor<R>,
    row_offset: usize,
) {
    let [rows, vocab] = shape2(&logits, "row_loss logits");
    check_rows(&targets, &[lse, loss], rows, row_offset);
    let targets = into_contiguous(targets);
    let client = logits.client.clone();
    let types = [logits.dtype.into(), targets.dtype.into(), DType::F32.into()];
    let width = padded_row_vector_size(&[&logits], vocab);
    row_loss_kernel::launch::<R>(
        &client,
        row_grid(rows),
        CubeDim::new_1d(ROW_UNITS as u32),
        width,
        logits.into_tensor_arg(),
        targets.into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        loss.clone().into_tensor_arg(),
        row_offset,
        ROW_UNITS,
        types,
    );
}

/// Overwrites `logits [c, V]` (any layout whose elements are distinct: padded rows are fine)
/// with `(softmax − onehot(target)) · grad_loss[0] ·
/// inv_rows`, the softmax rebuilt from the forward's `lse [N]` at rows `row_offset ..`;
/// `grad_loss [1]` is f32 and stays on the device (no host round trip).
pub fn softmax_grad_in_place<R: CubeRuntime>(
    logits: &CubeTensor<R>,
    targets: CubeTensor<R>,
    lse: CubeTensor<R>,
    grad_loss: CubeTensor<R>,
    inv_rows: f32,
    row_offset: usize,
) {
    let [rows, vocab] = shape2(logits, "softmax_grad logits");
    check_rows(&targets, &[&lse], rows, row_offset);
    assert_distinct(logits, "softmax_grad: logits are written in place");
    assert_eq!(
        grad_loss.dtype,
        DType::F32,
        "softmax_grad: grad_loss is f32"
    );
    let [targets, lse, grad_loss] = [targets, lse, grad_loss].map(into_contiguous);
    let client = logits.client.clone();
    let types = [logits.dtype.into(), targets.dtype.into(), DType::F32.into()];
    let width = padded_row_vector_size(&[logits], vocab);
    softmax_grad_kernel::launch::<R>(
        &client,
        row_grid(rows),
        CubeDim::new_1d(ROW_UNITS as u32),
        width,
        logits.clone().into_tensor_arg(),
        targets.into_tensor_arg(),
        lse.into_tensor_arg(),
        grad_loss.into_tensor_arg(),
        inv_rows,
        row_offset,
        ROW_UNITS,
        types,
    );
}

/// `acc += x` elementwise for 2-D tensors of one shape: `acc` f32, `x` any float type, each in
/// any layout (`acc`'s elements distinct: it is written in place).
pub fn add_widened<R: CubeRuntime>(acc: &CubeTensor<R>, x: CubeTensor<R>) {
    assert_eq!(acc.dtype, DType::F32, "add_widened: the accumulator is f32");
    assert_distinct(acc, "add_widened: the accumulator is written in place");
    assert_eq!(
        acc.meta.shape(),
        x.meta.shape(),
        "add_widened: shapes differ"
    );
    let types = [x.dtype.into(), DType::F32.into()];
    let [rows, cols] = shape2(acc, "add_widened");
    let width = padded_row_vector_size(&[acc, &x], cols);
    let client = acc.client.clone();
    let cube_dim = CubeDim::new_1d(ADD_UNITS);
    add_widened_kernel::launch::<R>(
        &client,
        cubecl::calculate_cube_count_elemwise(&client, rows * cols.div_ceil(width), cube_dim),
        cube_dim,
        width,
        acc.clone().into_tensor_arg(),
        x.into_tensor_arg(),
        types,
    );
}
