//! RMSNorm forward and backward as cubecl kernels.
//!
//! `y = x / r ⊙ g` with `r = sqrt(mean(x²) + eps)` per row of `x: [N, d]`, and with
//! `q = x / r`, `gy = dy ⊙ g`:
//!
//! `dx = (gy − q · mean(gy ⊙ q)) / r` and `dg = Σ_rows dy ⊙ q`.
//!
//! burn's composition of these under Fusion took 1.61 ms a norm (forward and backward) on an
//! H100 at x1-50m (`[32768, 768]` fp32), where the traffic they need (read `x` twice and `dy`
//! once, write `y` and `dx`: ~500 MB) takes ~0.2 ms at 3 TB/s. Here:
//! - [`forward`]: one cube per row; its units' sums of squares meet in shared memory, then
//!   each unit writes its columns of `y`.
//! - [`backward`]: one cube per block of [`BLOCK_ROWS`] rows. For each row in turn it takes
//!   the row's two sums, `Σ x²` and `Σ gy ⊙ x`, in one read, then writes the row's `dx` and
//!   adds `dy ⊙ q` to the block's column sums, which each unit keeps in registers for its
//!   columns (256 units a cube past 4,096 columns, [`backward_units`]): `dg`'s first stage
//!   needs no second read of `x` and `dy`. A second kernel sums each column over the blocks,
//!   [`SUM_LANES`] lanes a column meeting in a tree, so that no unit adds up every block in
//!   sequence (2,048 at x1-50m). Both stages run in a fixed order.
//!
//! Arithmetic is f32 whatever the storage type (f32, f16, bf16), as autocast keeps the norm's
//! statistics in fp32; every sum is in a fixed order, so results repeat bit for bit. `x` and
//! `dy` are read through their strides (no copy for a transposed gradient); outputs are
//! contiguous. The output may be stored in another dtype than `x` (the compute dtype the
//! projections read, bf16, where `x` is the fp32 residual stream): the cast that would follow
//! is fused into the norm, with the same bits (the f32 result rounded once), and backward reads
//! `dy` in that dtype, widened exactly as the cast's backward would.
//!
//! [`backward`] can also add the gradient that reached `x` by the residual stream's skip
//! connection as it writes `dx`, where an add after it would read `dx` and the skip's
//! gradient again and write their sum.

use burn::tensor::{DType, Shape};
use burn_cubecl::{
    kernel::into_contiguous,
    ops::numeric::{empty_device_contiguous_dtype, zeros_client},
    tensor::CubeTensor,
    CubeRuntime,
};
use cubecl::prelude::*;

use crate::{
    rows::{cube_row, row_grid},
    vectors::row_vector_size,
};

/// Units per row: a power of two for the tree in `cube_sums`; x1-50m's 768 columns are six
/// strides of a unit in the backward, and one or two vectors of 4 in the forward.
pub const ROW_UNITS: usize = 128;

/// Units per row of the backward for rows of `d` columns: [`ROW_UNITS`], or twice that past
/// 32 columns a unit, since each unit keeps a sum per column it owns in registers. By ptxas
/// (`scripts/cuda-source-check.sh`): the 7B's 4,096 columns, 32 a unit, take 55 registers and
/// no spill on 128 units (16 bytes of spill on sm_90a on 256); MedGemma-27B's 5,376, 42 a
/// unit, spilled 60 bytes on an A100 on 128 units and none on 256 (21 a unit).
pub fn backward_units(d: usize) -> usize {
    if d > 32 * ROW_UNITS {
        2 * ROW_UNITS
    } else {
        ROW_UNITS
    }
}

/// Rows per cube of the backward: x1-50m's 32,768 rows a micro-batch make 2,048 cubes of
/// 128 units, enough to fill an H100's 132 multiprocessors, and `dg`'s partial sums,
/// `[N / 16, d]` in f32, are a 16th of `x`'s bytes (fp32): small next to the `x` and `dy`
/// they spare reading again.
pub const BLOCK_ROWS: usize = 16;

/// Units summing one column of `dg`'s partials, each every `SUM_LANES`-th block: 64 blocks a
/// unit for x1-50m's 2,048, where one unit a column would walk all of them.
pub const SUM_LANES: usize = 32;

/// Columns per cube of `dg`'s second stage: consecutive units on consecutive columns.
pub(crate) const SUM_COLUMNS: usize = 8;

// The trees in `cube_sums` and the lanes' sum halve a width down to one unit.
const _: () = assert!(ROW_UNITS.is_power_of_two() && SUM_LANES.is_power_of_two());

/// The cube's sums of every unit's `a` and `b`, in a tree over shared memory (the same order
/// on every run); every unit gets them. Every unit of the cube must call it.
#[cube]
fn cube_sums<A: Float>(a: A, b: A, #[comptime] units: usize) -> (A, A) {
    let u = UNIT_POS_X as usize;
    let mut sums_a = SharedMemory::<A>::new(units);
    let mut sums_b = SharedMemory::<A>::new(units);
    sums_a[u] = a;
    sums_b[u] = b;
    sync_cube();
    // Halving from the cube's width, a runtime value: cubecl cannot mutate a comptime one.
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if u < stride {
            let (a, b) = (sums_a[u + stride], sums_b[u + stride]);
            sums_a[u] += a;
            sums_b[u] += b;
        }
        sync_cube();
        stride /= 2;
    }
    let sums = (sums_a[0], sums_b[0]);
    // The backward calls this once a row: no unit writes the next row's sums before every
    // unit has read these.
    sync_cube();
    sums
}

/// `r = sqrt(Σ x² / d + eps)` from the row's sum of squares.
#[cube]
fn root_mean_square<A: Float>(sum_squares: A, inv_d: f32, eps: f32) -> A {
    (sum_squares * A::cast_from(inv_d) + A::cast_from(eps)).sqrt()
}

/// `G` is the output's storage type: the compute dtype the projections read (a cast fused into
/// the norm), or `F`.
/// Each unit reads and writes vectors of `N` columns (one where a tensor's rows do not
/// allow more: [`row_vector_size`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_kernel<F: Float, G: Float, A: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    gain: &Tensor<Vector<F, N>>,
    y: &mut Tensor<Vector<G, N>>,
    inv_d: f32,
    eps: f32,
    #[comptime] units: usize,
    #[define(F, G, A)] _dtypes: [StorageType; 3],
) {
    let (rows, d) = (x.shape(0), x.shape(1));
    let width = x.vector_size();
    let row = cube_row();
    // The whole cube shares `row`, so leaving here skips no barrier another unit waits at.
    if row < rows {
        let (base, col) = (row * x.stride(0), x.stride(1));
        let mut squares = A::new(0.0);
        let mut j = UNIT_POS_X as usize * width;
        while j < d {
            let v = Vector::<A, N>::cast_from(x[(base + j * col) / width]);
            let v2 = v * v;
            #[unroll]
            for k in 0..width {
                squares += v2[k];
            }
            j += units * width;
        }
        let (squares, _) = cube_sums::<A>(squares, A::new(0.0), units);
        let r = Vector::<A, N>::new(root_mean_square::<A>(squares, inv_d, eps));
        let mut j = UNIT_POS_X as usize * width;
        while j < d {
            // The composition's order: `x / r`, then the gain.
            let q = Vector::<A, N>::cast_from(x[(base + j * col) / width]) / r;
            let g = Vector::<A, N>::cast_from(gain[j * gain.stride(0) / width]);
            y[(row * d + j) / width] = Vector::cast_from(q * g);
            j += units * width;
        }
    }
}

/// One cube per block of `block_rows` rows: each row's `dx` (plus `skip`'s, where `adds_skip`),
/// and the block's column sums of `dy ⊙ q` into `partials[block]`. `dy` is stored as `G`, the
/// output's type; `dx` and `skip` as `x`.
/// Unit `u` owns columns `u, u + units, …`: `columns` of them, a comptime count, so that
/// their sums live in registers.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_blocks_kernel<F: Float, G: Float, A: Float>(
    x: &Tensor<F>,
    gain: &Tensor<F>,
    dy: &Tensor<G>,
    skip: &Tensor<F>,
    dx: &mut Tensor<F>,
    partials: &mut Tensor<A>,
    block_rows: usize,
    inv_d: f32,
    eps: f32,
    #[comptime] units: usize,
    #[comptime] columns: usize,
    #[comptime] adds_skip: bool,
    #[define(F, G, A)] _dtypes: [StorageType; 3],
) {
    let (rows, d) = (x.shape(0), x.shape(1));
    // One cube per block of rows, laid over the grid as the row kernels lay one per row.
    let block = cube_row();
    let start = block * block_rows;
    // The whole cube shares the block, so leaving here skips no barrier another unit waits at.
    if start < rows {
        let mut end = start + block_rows;
        if end > rows {
            end = rows;
        }
        let mut dg = Array::<A>::new(columns);
        #[unroll]
        for c in 0..columns {
            dg[c] = A::new(0.0);
        }
        let mut row = start;
        while row < end {
            let (squares, gy_x) = unit_row_sums::<F, G, A>(x, gain, dy, row, units, columns);
            let (squares, gy_x) = cube_sums::<A>(squares, gy_x, units);
            let r = root_mean_square::<A>(squares, inv_d, eps);
            // mean(gy ⊙ q) = Σ gy ⊙ x / (r d)
            let along = gy_x / r * A::cast_from(inv_d);
            row_grads::<F, G, A>(
                x, gain, dy, skip, dx, &mut dg, row, r, along, units, columns, adds_skip,
            );
            row += 1;
        }
        #[unroll]
        for c in 0..columns {
            let j = UNIT_POS_X as usize + c * units;
            if j < d {
                partials[block * d + j] = dg[c];
            }
        }
    }
}

/// This unit's shares of row `row`'s `Σ x²` and `Σ gy ⊙ x`, over its columns in order.
#[cube]
fn unit_row_sums<F: Float, G: Float, A: Float>(
    x: &Tensor<F>,
    gain: &Tensor<F>,
    dy: &Tensor<G>,
    row: usize,
    #[comptime] units: usize,
    #[comptime] columns: usize,
) -> (A, A) {
    let d = x.shape(1);
    let mut squares = A::new(0.0);
    let mut gy_x = A::new(0.0);
    #[unroll]
    for c in 0..columns {
        let j = UNIT_POS_X as usize + c * units;
        if j < d {
            let (v, _, gy) = column_terms::<F, G, A>(x, gain, dy, row, j);
            squares += v * v;
            gy_x += gy * v;
        }
    }
    (squares, gy_x)
}

/// `(x, dy, gy = dy ⊙ g)` at row `row`, column `j`, widened to `A`.
#[cube]
fn column_terms<F: Float, G: Float, A: Float>(
    x: &Tensor<F>,
    gain: &Tensor<F>,
    dy: &Tensor<G>,
    row: usize,
    j: usize,
) -> (A, A, A) {
    let v = A::cast_from(x[row * x.stride(0) + j * x.stride(1)]);
    let g = A::cast_from(dy[row * dy.stride(0) + j * dy.stride(1)]);
    (v, g, g * A::cast_from(gain[j * gain.stride(0)]))
}

/// Row `row`'s `dx` in this unit's columns, `(gy − q · along) / r` (plus the gradient that
/// reaches `x` by the residual stream's skip connection, `skip`, where `adds_skip`: the sum
/// rounds once, as the add it replaces), and `dy ⊙ q` added to their column sums `dg`. `q` is
/// rounded two ways on purpose: `x / r` in `dx`, as the composition computes it, and
/// `x · (1/r)` in `dg`, as the three-kernel version did (which kept `1/r`), so that `dx` kept
/// its bits through the change.
#[cube]
#[allow(clippy::too_many_arguments)]
fn row_grads<F: Float, G: Float, A: Float>(
    x: &Tensor<F>,
    gain: &Tensor<F>,
    dy: &Tensor<G>,
    skip: &Tensor<F>,
    dx: &mut Tensor<F>,
    dg: &mut Array<A>,
    row: usize,
    r: A,
    along: A,
    #[comptime] units: usize,
    #[comptime] columns: usize,
    #[comptime] adds_skip: bool,
) {
    let d = x.shape(1);
    let inv_r = A::new(1.0) / r;
    #[unroll]
    for c in 0..columns {
        let j = UNIT_POS_X as usize + c * units;
        if j < d {
            let (v, g, gy) = column_terms::<F, G, A>(x, gain, dy, row, j);
            let grad = (gy - v / r * along) / r;
            dx[row * d + j] = if adds_skip {
                F::cast_from(grad + A::cast_from(skip[row * d + j]))
            } else {
                F::cast_from(grad)
            };
            dg[c] += g * (v * inv_r);
        }
    }
}

/// `dg[j] = Σ_b partials[b, j]`: lane `l` (the cube's y axis) sums blocks `l, l + lanes, …` in
/// order, then the lanes meet in a tree over shared memory (the same order on every run).
#[cube(launch)]
pub(crate) fn gain_sums_kernel<F: Float, A: Float>(
    partials: &Tensor<A>,
    dg: &mut Tensor<F>,
    #[comptime] columns: usize,
    #[comptime] lanes: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (blocks, d) = (partials.shape(0), partials.shape(1));
    let (col, lane) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let j = CUBE_POS_X as usize * columns + col;
    let mut sum = A::new(0.0);
    if j < d {
        let mut b = lane;
        while b < blocks {
            sum += partials[b * d + j];
            b += lanes;
        }
    }
    let mut sums = SharedMemory::<A>::new(columns * lanes);
    sums[lane * columns + col] = sum;
    sync_cube();
    // Halving from the cube's height, a runtime value (cubecl cannot mutate a comptime one):
    // the launch makes it `lanes`, as the cube's width is `columns`.
    let mut stride = CUBE_DIM_Y as usize / 2;
    while stride > 0 {
        if lane < stride {
            let other = sums[(lane + stride) * columns + col];
            sums[lane * columns + col] += other;
        }
        sync_cube();
        stride /= 2;
    }
    if lane == 0 && j < d {
        dg[j] = F::cast_from(sums[col]);
    }
}

/// `[N, d]` of `x`, checked against the other operands.
fn dims<R: CubeRuntime>(x: &CubeTensor<R>, gain: &CubeTensor<R>) -> [usize; 2] {
    let s = x.meta.shape();
    assert_eq!(s.num_dims(), 2, "rms_norm: x is [N, d]");
    let [n, d] = [s[0], s[1]];
    // The arithmetic is f32: wider storage would lose precision silently.
    assert!(
        supports(x.dtype),
        "rms_norm: x is {:?}; the kernels compute in f32 for f32, f16 and bf16",
        x.dtype
    );
    // cubecl indexes with 32-bit addresses.
    assert!(
        (n as u64) * (d as u64) < 1 << 32,
        "rms_norm: [{n}, {d}] has 2^32 elements or more"
    );
    assert_eq!(
        gain.meta.shape().as_slice(),
        [d],
        "rms_norm: gain is not [{d}]"
    );
    assert_eq!(gain.dtype, x.dtype, "rms_norm: gain is not x's dtype");
    [n, d]
}

/// Whether the kernels take tensors of this dtype (`x` and the gain of one dtype; the output
/// and `dy` of one, which may be another).
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

fn new_tensor<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape, dtype: DType) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// RMSNorm of the rows of `x [N, d]` (any strides) with `gain [d]` of `x`'s dtype: a new
/// contiguous tensor of `dtype` (see the module docs); `x`'s dtype, or the compute dtype
/// the projections read, so that no cast follows.
pub fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    gain: CubeTensor<R>,
    eps: f64,
    dtype: DType,
) -> CubeTensor<R> {
    let out = new_tensor(&x, x.meta.shape().clone(), dtype);
    forward_into(x, gain, eps, out)
}

/// [`forward`] into an output the caller allocated (tests poison it to see unwritten
/// elements): contiguous, shaped as `x`, of a dtype the kernels take.
pub fn forward_into<R: CubeRuntime>(
    x: CubeTensor<R>,
    gain: CubeTensor<R>,
    eps: f64,
    out: CubeTensor<R>,
) -> CubeTensor<R> {
    let [n, d] = dims(&x, &gain);
    check_output(&out, &x);
    if n * d == 0 {
        return out;
    }
    let client = x.client.clone();
    let width = row_vector_size(&[&x, &gain, &out], d);
    forward_kernel::launch::<R>(
        &client,
        row_grid(n),
        CubeDim::new_1d(ROW_UNITS as u32),
        width,
        x.clone().into_tensor_arg(),
        gain.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        1.0 / d as f32,
        eps as f32,
        ROW_UNITS,
        [x.dtype.into(), out.dtype.into(), DType::F32.into()],
    );
    out
}

/// Panics unless `out` is shaped as `like`, contiguous and of a dtype the kernels take.
fn check_output<R: CubeRuntime>(out: &CubeTensor<R>, like: &CubeTensor<R>) {
    assert_eq!(
        out.meta.shape(),
        like.meta.shape(),
        "rms_norm: output shape"
    );
    assert!(out.is_contiguous(), "rms_norm: the output is contiguous");
    assert!(
        supports(out.dtype),
        "rms_norm: an output of {:?}",
        out.dtype
    );
}

/// `(dx, dg)` of RMSNorm for the upstream gradient `dy` (shaped as `x`, typed as the
/// forward's output, any strides): new contiguous tensors typed as `x` and `gain`.
///
/// With `skip` (shaped and typed as `x`; copied contiguous first where it is not), it is added
/// to `dx` in the same pass: the gradient that reaches `x` by the residual stream's skip
/// connection, which an add after the norm's backward would otherwise read and write again.
/// `dx` is then the f32 sum rounded once to `x`'s dtype: the add's bits where `x` is f32.
pub fn backward<R: CubeRuntime>(
    x: CubeTensor<R>,
    gain: CubeTensor<R>,
    eps: f64,
    dy: CubeTensor<R>,
    skip: Option<CubeTensor<R>>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let dx = new_tensor(&x, x.meta.shape().clone(), x.dtype);
    let dg = new_tensor(&gain, gain.meta.shape().clone(), gain.dtype);
    backward_in_blocks_of(BLOCK_ROWS, x, gain, eps, dy, skip, (dx, dg))
}

/// [`backward`] with `block_rows` rows a cube instead of [`BLOCK_ROWS`] (tests take other
/// sizes, and a grid of more blocks than an axis holds from few rows), into outputs the caller
/// allocated (tests poison them): `dx` contiguous, shaped and typed as `x`; `dg` as `gain`.
/// With no rows, `dg` comes back as new zeros.
#[doc(hidden)]
pub fn backward_in_blocks_of<R: CubeRuntime>(
    block_rows: usize,
    x: CubeTensor<R>,
    gain: CubeTensor<R>,
    eps: f64,
    dy: CubeTensor<R>,
    skip: Option<CubeTensor<R>>,
    (dx, dg): (CubeTensor<R>, CubeTensor<R>),
) -> (CubeTensor<R>, CubeTensor<R>) {
    assert!(block_rows > 0, "rms_norm: blocks of no rows");
    let [n, d] = dims(&x, &gain);
    assert_eq!(
        dy.meta.shape(),
        x.meta.shape(),
        "rms_norm: dy's shape is not x's"
    );
    assert!(supports(dy.dtype), "rms_norm: dy is {:?}", dy.dtype);
    if let Some(skip) = &skip {
        assert!(
            skip.meta.shape() == x.meta.shape() && skip.dtype == x.dtype,
            "rms_norm: the skip gradient is not shaped and typed as x"
        );
    }
    check_output(&dx, &x);
    check_output(&dg, &gain);
    assert!(
        dx.dtype == x.dtype && dg.dtype == gain.dtype,
        "rms_norm: gradients are typed as x and the gain"
    );
    if d == 0 {
        return (dx, dg);
    }
    if n == 0 {
        // A sum over no rows.
        let zeros = zeros_client(
            x.client.clone(),
            x.device.clone(),
            Shape::new([d]),
            dg.dtype,
        );
        return (dx, zeros);
    }
    let client = x.client.clone();
    // A grid axis holds 65,535 cubes; row_grid spills the blocks onto the y axis.
    let blocks = n.div_ceil(block_rows);
    let partials = new_tensor(&x, Shape::new([blocks, d]), DType::F32);
    let types = [x.dtype.into(), dy.dtype.into(), DType::F32.into()];
    let units = backward_units(d);
    let adds_skip = skip.is_some();
    // Without one, `x` stands in as a binding, read by no unit (wgpu forbids binding `dx`,
    // which is written, again as an input).
    let skip = skip.map(into_contiguous).unwrap_or_else(|| x.clone());
    backward_blocks_kernel::launch::<R>(
        &client,
        row_grid(blocks),
        CubeDim::new_1d(units as u32),
        x.into_tensor_arg(),
        gain.into_tensor_arg(),
        dy.into_tensor_arg(),
        skip.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        partials.clone().into_tensor_arg(),
        block_rows,
        1.0 / d as f32,
        eps as f32,
        units,
        d.div_ceil(units),
        adds_skip,
        types,
    );
    gain_sums_kernel::launch::<R>(
        &client,
        CubeCount::Static(d.div_ceil(SUM_COLUMNS) as u32, 1, 1),
        CubeDim::new_2d(SUM_COLUMNS as u32, SUM_LANES as u32),
        partials.into_tensor_arg(),
        dg.clone().into_tensor_arg(),
        SUM_COLUMNS,
        SUM_LANES,
        [dg.dtype.into(), DType::F32.into()],
    );
    (dx, dg)
}
