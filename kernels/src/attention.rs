//! Causal grouped-query flash attention, forward and backward, as cubecl kernels.
//!
//! Shapes: `q [B, H, T, hd]`, `k, v [B, KV, T, hd]` with `H = KV · group`; query head `h`
//! reads key/value head `h / group` in place (no repeated K/V). Scores are `scale · q·k`,
//! causal (key `j` is visible to query `i` when `j ≤ i`).
//!
//! Every tensor is read and written at its own strides, its rows (the head width) at unit
//! stride, and the outputs take the layout of the inputs they belong to ([`crate::layout`]):
//! the model's `[B, T, H, hd]` projections, read as `[B, H, T, hd]` through a swap of the
//! middle axes, need no copy in, and the output and gradients need none on the way out.
//!
//! Forward (FlashAttention-2's loop order, queries outside): a cube owns `block` consecutive
//! query rows of one head, one unit per row (or a few: see below). Key/value rows come
//! through shared memory `block` at a time; each unit keeps its running max `m`, its running
//! sum `l` and its output row, rescaling them as the max grows (online softmax). It writes
//! the output and `lse = m + ln l` per row: the one number per row backward needs to rebuild
//! a probability, `p = exp(s − lse)`. No `T × T` tensor exists anywhere.
//!
//! Backward, with `D_i = dO_i · O_i` (a small kernel of its own):
//! - `dQ_i = scale · Σ_{j≤i} p_ij (dO_i·v_j − D_i) k_j`: one unit per query row (or a few),
//!   keys tiled as in the forward;
//! - `dK_j = scale · Σ_{h in group} Σ_{i≥j} p_ij (dO_i·v_j − D_i) q_i` and
//!   `dV_j = Σ_h Σ_{i≥j} p_ij dO_i`: one unit per key row of a key/value head (or a few), the
//!   query rows of every head of its group tiled through shared memory. Each unit owns its
//!   key row (or its part of it) for the whole group, so no atomics are needed and the sums
//!   have a fixed order.
//!
//! On CUDA, loops over the head width are unrolled where a kernel's per-unit rows fit the
//! register budget: the head width is a compile-time constant, so each unit's rows (`q_i`,
//! its accumulators) get constant indices and can stay in registers, where a run-time index
//! puts them in local memory. See [`unrolls`] and [`unrolled_rows`]. Where a kernel's rows
//! would not fit (`dQ` holds 3 rows, `dK/dV` 4: 256 floats at hd = 64), 2 or 4 units share
//! each row, each holding every 2nd or 4th run of 4 elements ([`lane_col`]), and add their
//! partial products by warp shuffles ([`row_lanes`]): the rows stay in registers rather than
//! in local memory, where the first H100 run found them. Each unit still reads every
//! shared-memory row it needs, a run at a time.
//!
//! Arithmetic is f32 whatever the storage type (f32, f16, bf16): scores, softmax statistics,
//! accumulators and `lse`, `D` are f32; inputs are widened on load, outputs rounded on store.
//!
//! On CUDA at f16/bf16, forward and backward can run on tensor cores instead
//! ([`tensor_cores`], opt-in with `LAB_ATTENTION_MMA=1` until measured on a GPU): the same
//! algorithm with 64-row tiles, its products on tensor cores (`mma.sync`, the row-wise work in
//! their registers; `LAB_ATTENTION_ROWS=bounce`: cooperative matrices and shared rows).
//!
//! On CUDA the forward, `dQ` and `dK/dV` launch unchecked ([`launch_on`]): cubecl's checked
//! launch clamps every global index and selects zero past the end, about a fifth of their
//! instructions (NVRTC and ptxas at bf16 hd 64). Each access is in bounds by construction:
//! rows are read and written only below `seq`, columns below the head width, the tensors'
//! last dimension ([`Dims`]), and the grid spans the tensors' batches and heads. So that this
//! holds, `forward_into` and `backward_into` check every tensor's shape against `q`, `k` and
//! `v`. The CUDA emulation (`cuda_source`) compiles the kernels in cubecl's `Validate` mode,
//! which reports a read or write past the end of a tensor (not one into a neighbouring row or
//! head: the fp64 comparison catches those), and fails on one. It runs CUDA's layouts with
//! rows shared by 2 or 4 units; one unit a row (`LAB_ATTENTION_SHUFFLE=0`) shares their index
//! arithmetic. On wgpu the kernels stay checked.
//!
//! Masked scores never enter a sum (a branch on `j ≤ i`), so no −∞ is needed (WGSL rejects
//! it); the running max starts at the type's lowest finite value, and the first visible key
//! (`j = 0`, always visible) replaces it.

use burn::tensor::{DType, Shape};
use burn_cubecl::{
    kernel::into_contiguous, ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor,
    CubeRuntime,
};
use cubecl::prelude::*;

use crate::layout::{empty_in_layout_of, unit_stride_rows};

/// Launches `$kernel` on `$client` with the rest of the arguments: unchecked on CUDA (the
/// module doc says why that is safe), checked on other runtimes.
macro_rules! launch_on {
    ($kernel:ident, $client:expr, $($arg:expr),+ $(,)?) => {
        if R::name($client) == "cuda" {
            // SAFETY: every access is in bounds (the module doc), checked on the emulation.
            unsafe { $kernel::launch_unchecked::<R>($client, $($arg),+) }
        } else {
            $kernel::launch::<R>($client, $($arg),+)
        }
    };
}

#[cfg(all(test, feature = "cuda-source"))]
pub(crate) mod cuda_source;
pub mod tensor_cores;

/// Query (or key) rows per cube for head width `head_dim`: two `[block, hd]` f32 tiles take
/// at most 16 KiB of shared memory (plus two `[block]` rows in the dK/dV kernel; lavapipe has
/// 32 KiB, CUDA 48 KiB by default).
pub fn block_rows(head_dim: usize) -> usize {
    (2048 / head_dim).clamp(1, 32)
}

/// How an f32 kernel lays out its rows, fixed when it compiles: the head width, the rows a
/// cube owns ([`block_rows`]), the units that share each row ([`row_lanes`]) and whether the
/// loops over a row unroll ([`unrolled_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tiling {
    head_dim: usize,
    block: usize,
    lanes: usize,
    unroll: bool,
}

impl Tiling {
    /// The layout of a kernel holding `rows` head-width rows per row it works on (the
    /// forward 2: `q_i` and its output; `dQ` 3; `dK/dV` 4), for `variant` at `head_dim`.
    pub(crate) fn of(variant: Variant, rows: usize, head_dim: usize) -> Self {
        let lanes = row_lanes(variant.shuffles, rows, head_dim);
        Tiling {
            head_dim,
            block: block_rows(head_dim),
            lanes,
            unroll: unrolled_rows(variant.unroll, rows, head_dim, lanes),
        }
    }

    /// `(head_dim, block, lanes, unroll)`.
    fn parts(self) -> (usize, usize, usize, bool) {
        (self.head_dim, self.block, self.lanes, self.unroll)
    }

    /// Elements of a row each unit holds.
    fn width(self) -> usize {
        self.head_dim / self.lanes
    }

    /// A cube: `block` rows of `lanes` units each.
    pub(crate) fn cube_dim(self) -> CubeDim {
        CubeDim::new_1d((self.block * self.lanes) as u32)
    }

    /// Cubes for `seq` rows of each of `heads` heads of each of `batch` sequences.
    fn cubes(self, seq: usize, heads: usize, batch: usize) -> CubeCount {
        CubeCount::Static(seq.div_ceil(self.block) as u32, heads as u32, batch as u32)
    }
}

#[cube(launch, launch_unchecked)]
fn forward_kernel<F: Float, A: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<A>,
    scale: f32,
    #[comptime] tiling: Tiling,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (head_dim, block, lanes, unroll) = comptime!(tiling.parts());
    let (seq, heads, kv_heads) = (q.shape(2), q.shape(1), k.shape(1));
    let (b, h) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
    let row0 = CUBE_POS_X as usize * block;
    let (i, lane) = row_and_lane(row0, lanes);
    let live = i < seq;
    let kv_head = h / (heads / kv_heads);
    let (k_base, v_base) = (row_at(k, b, kv_head, 0), row_at(v, b, kv_head, 0));

    let q_at = row_at(q, b, h, i);
    let qi = row_of::<F, A>(q, q_at, live, A::cast_from(scale), tiling);
    let mut acc = zeros::<A>(tiling);
    let mut k_tile = SharedMemory::<A>::new(block * head_dim);
    let mut v_tile = SharedMemory::<A>::new(block * head_dim);
    let mut m = A::min_value();
    let mut l = A::new(0.0);

    // Keys 0 ..= the block's last query row.
    let mut end = row0 + block;
    if end > seq {
        end = seq;
    }
    let mut start = 0;
    while start < end {
        load_rows::<F, A>(k, &mut k_tile, k_base, start, tiling);
        load_rows::<F, A>(v, &mut v_tile, v_base, start, tiling);
        sync_cube();
        for jj in 0..block {
            // Every unit reaches the lanes' exchange, visible key or not (see `lanes_sum`).
            let s = lanes_sum::<A>(dot(&qi, &k_tile, jj, lane, tiling), lanes);
            if live && start + jj <= i {
                let mut m_new = m;
                if s > m {
                    m_new = s;
                }
                let rescale = (m - m_new).exp();
                let p = (s - m_new).exp();
                l = l * rescale + p;
                #[unroll(unroll)]
                for c in 0..comptime!(tiling.width()) {
                    acc[c] =
                        acc[c] * rescale + p * v_tile[jj * head_dim + lane_col(c, lane, lanes)];
                }
                m = m_new;
            }
        }
        sync_cube();
        start += block;
    }
    if live {
        let o = row_at(out, b, h, i);
        #[unroll(unroll)]
        for c in 0..comptime!(tiling.width()) {
            out[o + lane_col(c, lane, lanes)] = F::cast_from(acc[c] / l);
        }
        if lane == 0 {
            lse[(b * heads + h) * seq + i] = m + l.ln();
        }
    }
}

/// The row (of the cube's `block` starting at `row0`) this unit works on, and its lane:
/// `lanes` consecutive units share a row, each holding runs of its elements ([`lane_col`]).
#[cube]
fn row_and_lane(row0: usize, #[comptime] lanes: usize) -> (usize, usize) {
    let unit = UNIT_POS_X as usize;
    (row0 + unit / lanes, unit % lanes)
}

/// Where a lane's `c`-th element sits in its row, shared by `lanes` units: the lanes take
/// turns by runs of [`RUN`] consecutive elements (lane 0 elements 0..4, lane 1 4..8, …), so
/// that NVCC loads each run from shared memory in one 16-byte access, and the lanes of a
/// row read different banks. One unit a row holds the row in order.
#[cube]
fn lane_col(c: usize, lane: usize, #[comptime] lanes: usize) -> usize {
    let mut col = c;
    if comptime!(lanes > 1) {
        col = (c / RUN * lanes + lane) * RUN + c % RUN;
    }
    col
}

/// Consecutive elements of a row a lane holds where units share it: one 16-byte f32 load.
const RUN: usize = 4;

/// `Σ_c x[c] · tile[jj, lane_col(c)]`: this lane's part of a row's product with the tile's
/// row `jj`.
#[cube]
fn dot<A: Float>(
    x: &Array<A>,
    tile: &SharedMemory<A>,
    jj: usize,
    lane: usize,
    #[comptime] tiling: Tiling,
) -> A {
    let (head_dim, _, lanes, unroll) = comptime!(tiling.parts());
    let mut s = A::new(0.0);
    #[unroll(unroll)]
    for c in 0..comptime!(tiling.width()) {
        s += x[c] * tile[jj * head_dim + lane_col(c, lane, lanes)];
    }
    s
}

/// The sum of `x` over the `lanes` units of a row (1, 2 or 4), the same bits in each:
/// float addition commutes, and every lane adds the same pairs. A warp shuffle needs every
/// unit of the plane to reach it, so callers call this outside any branch that differs
/// between rows.
#[cube]
fn lanes_sum<A: Float>(x: A, #[comptime] lanes: usize) -> A {
    let mut s = x;
    if comptime!(lanes >= 2) {
        s += plane_shuffle_xor(s, 1);
    }
    if comptime!(lanes >= 4) {
        s += plane_shuffle_xor(s, 2);
    }
    s
}

/// Where row `i` of head `head` of sequence `b` starts in `t`, read from its strides (the
/// head width's axis has unit stride: [`crate::layout::unit_stride_rows`]).
#[cube]
fn row_at<E: CubePrimitive>(t: &Tensor<E>, b: usize, head: usize, i: usize) -> usize {
    b * t.stride(0) + head * t.stride(1) + i * t.stride(2)
}

/// The cube copies rows `start .. start + block` (zeros past the sequence's end) of the head
/// whose row 0 is at `base` into `tile`, widened to `A`; rows are `src.stride(2)` apart. The cube
/// has `block · lanes` units; unit `u` copies columns `u, u + block · lanes, …` of each row,
/// so consecutive units read consecutive elements and a unit's loads from one row sit at
/// constant offsets from the row's start, the one runtime term (per-element row arithmetic
/// costs registers).
#[cube]
fn load_rows<F: Float, A: Float>(
    src: &Tensor<F>,
    tile: &mut SharedMemory<A>,
    base: usize,
    start: usize,
    #[comptime] tiling: Tiling,
) {
    let (head_dim, block, lanes, unroll) = comptime!(tiling.parts());
    let seq = src.shape(2);
    let unit = UNIT_POS_X as usize;
    let units = comptime!(block * lanes);
    #[unroll(unroll)]
    for r in 0..block {
        let at = base + (start + r) * src.stride(2);
        let live = start + r < seq;
        #[unroll(unroll)]
        for k in 0..comptime!(head_dim.div_ceil(units)) {
            let c = unit + k * units;
            if c < head_dim {
                let mut x = A::new(0.0);
                if live {
                    x = A::cast_from(src[at + c]);
                }
                tile[r * head_dim + c] = x;
            }
        }
    }
}

/// This lane's part of the row of `src` that starts at `at` ([`row_at`]): its elements
/// ([`lane_col`]), widened to `A` and multiplied by `scale`
/// (zeros for a unit past the end, which computes nothing but must still reach every
/// barrier and shuffle).
#[cube]
fn row_of<F: Float, A: Float>(
    src: &Tensor<F>,
    at: usize,
    live: bool,
    scale: A,
    #[comptime] tiling: Tiling,
) -> Array<A> {
    let (_, _, lanes, unroll) = comptime!(tiling.parts());
    let lane = UNIT_POS_X as usize % lanes;
    let mut x = zeros::<A>(tiling);
    if live {
        #[unroll(unroll)]
        for c in 0..comptime!(tiling.width()) {
            x[c] = A::cast_from(src[at + lane_col(c, lane, lanes)]) * scale;
        }
    }
    x
}

/// A lane's part of a row, zeroed.
#[cube]
fn zeros<A: Float>(#[comptime] tiling: Tiling) -> Array<A> {
    let (width, unroll) = comptime!((tiling.width(), tiling.unroll));
    let mut x = Array::<A>::new(width);
    #[unroll(unroll)]
    for c in 0..width {
        x[c] = A::new(0.0);
    }
    x
}

/// Units a cube of [`delta_kernel`], a row each.
pub(crate) const DELTA_UNITS: u32 = 64;

/// `D_i = Σ_d dO_i,d · O_i,d` for every row, and its `lse_i · log2 e`, the units the tensor
/// cores' register kernels take their softmax in (one FFMA an element in their loops, where
/// `lse` in natural units takes a multiply more).
#[cube(launch)]
fn delta_kernel<F: Float, A: Float>(
    out: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<A>,
    delta: &mut Tensor<A>,
    lse_log2: &mut Tensor<A>,
    #[comptime] head_dim: usize,
    #[comptime] unroll: bool,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (seq, heads) = (delta.shape(2), delta.shape(1));
    let (b, h) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
    let i = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i < seq {
        let (o, g) = (row_at(out, b, h, i), row_at(d_out, b, h, i));
        let mut s = A::new(0.0);
        #[unroll(unroll)]
        for d in 0..head_dim {
            s += A::cast_from(d_out[g + d]) * A::cast_from(out[o + d]);
        }
        let row = (b * heads + h) * seq + i;
        delta[row] = s;
        lse_log2[row] = lse[row] * A::new(std::f32::consts::LOG2_E);
    }
}

#[cube(launch, launch_unchecked)]
fn grad_q_kernel<F: Float, A: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<A>,
    delta: &Tensor<A>,
    d_q: &mut Tensor<F>,
    scale: f32,
    #[comptime] tiling: Tiling,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (head_dim, block, lanes, unroll) = comptime!(tiling.parts());
    let (seq, heads, kv_heads) = (q.shape(2), q.shape(1), k.shape(1));
    let (b, h) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
    let row0 = CUBE_POS_X as usize * block;
    let (i, lane) = row_and_lane(row0, lanes);
    let live = i < seq;
    let row = (b * heads + h) * seq + i;
    let kv_head = h / (heads / kv_heads);
    let (k_base, v_base) = (row_at(k, b, kv_head, 0), row_at(v, b, kv_head, 0));
    let scale = A::cast_from(scale);

    let qi = row_of::<F, A>(q, row_at(q, b, h, i), live, scale, tiling);
    let do_at = row_at(d_out, b, h, i);
    let doi = row_of::<F, A>(d_out, do_at, live, A::new(1.0), tiling);
    let mut dq = zeros::<A>(tiling);
    let mut lse_i = A::new(0.0);
    let mut delta_i = A::new(0.0);
    if live {
        lse_i = lse[row];
        delta_i = delta[row];
    }
    let mut k_tile = SharedMemory::<A>::new(block * head_dim);
    let mut v_tile = SharedMemory::<A>::new(block * head_dim);

    let mut end = row0 + block;
    if end > seq {
        end = seq;
    }
    let mut start = 0;
    while start < end {
        load_rows::<F, A>(k, &mut k_tile, k_base, start, tiling);
        load_rows::<F, A>(v, &mut v_tile, v_base, start, tiling);
        sync_cube();
        for jj in 0..block {
            let s = lanes_sum::<A>(dot(&qi, &k_tile, jj, lane, tiling), lanes);
            let dp = lanes_sum::<A>(dot(&doi, &v_tile, jj, lane, tiling), lanes);
            if live && start + jj <= i {
                let ds = (s - lse_i).exp() * (dp - delta_i);
                #[unroll(unroll)]
                for c in 0..comptime!(tiling.width()) {
                    dq[c] += ds * k_tile[jj * head_dim + lane_col(c, lane, lanes)];
                }
            }
        }
        sync_cube();
        start += block;
    }
    if live {
        let o = row_at(d_q, b, h, i);
        #[unroll(unroll)]
        for c in 0..comptime!(tiling.width()) {
            d_q[o + lane_col(c, lane, lanes)] = F::cast_from(dq[c] * scale);
        }
    }
}

#[cube(launch, launch_unchecked)]
fn grad_kv_kernel<F: Float, A: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<A>,
    delta: &Tensor<A>,
    d_k: &mut Tensor<F>,
    d_v: &mut Tensor<F>,
    scale: f32,
    #[comptime] tiling: Tiling,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let (head_dim, block, lanes, unroll) = comptime!(tiling.parts());
    let (seq, heads, kv_heads) = (q.shape(2), q.shape(1), k.shape(1));
    let group = heads / kv_heads;
    let (b, kvh) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
    let row0 = CUBE_POS_X as usize * block;
    let (j, lane) = row_and_lane(row0, lanes);
    let u = UNIT_POS_X as usize;
    let live = j < seq;
    let scale = A::cast_from(scale);

    let (k_at, v_at) = (row_at(k, b, kvh, j), row_at(v, b, kvh, j));
    let kj = row_of::<F, A>(k, k_at, live, scale, tiling);
    let vj = row_of::<F, A>(v, v_at, live, A::new(1.0), tiling);
    let mut dk = zeros::<A>(tiling);
    let mut dv = zeros::<A>(tiling);
    let mut q_tile = SharedMemory::<A>::new(block * head_dim);
    let mut do_tile = SharedMemory::<A>::new(block * head_dim);
    let mut lse_tile = SharedMemory::<A>::new(block);
    let mut delta_tile = SharedMemory::<A>::new(block);

    for g in 0..group {
        let head = kvh * group + g;
        let head_rows = (b * heads + head) * seq;
        let (q_base, do_base) = (row_at(q, b, head, 0), row_at(d_out, b, head, 0));
        // Queries from the block's first key row to the end.
        let mut start = row0;
        while start < seq {
            load_rows::<F, A>(q, &mut q_tile, q_base, start, tiling);
            load_rows::<F, A>(d_out, &mut do_tile, do_base, start, tiling);
            if u < block {
                let r = start + u;
                let mut lse_r = A::new(0.0);
                let mut delta_r = A::new(0.0);
                if r < seq {
                    lse_r = lse[head_rows + r];
                    delta_r = delta[head_rows + r];
                }
                lse_tile[u] = lse_r;
                delta_tile[u] = delta_r;
            }
            sync_cube();
            for ii in 0..block {
                let i = start + ii;
                let s = lanes_sum::<A>(dot(&kj, &q_tile, ii, lane, tiling), lanes);
                let dp = lanes_sum::<A>(dot(&vj, &do_tile, ii, lane, tiling), lanes);
                if live && i < seq && i >= j {
                    let p = (s - lse_tile[ii]).exp();
                    let ds = p * (dp - delta_tile[ii]);
                    #[unroll(unroll)]
                    for c in 0..comptime!(tiling.width()) {
                        let at = ii * head_dim + lane_col(c, lane, lanes);
                        dv[c] += p * do_tile[at];
                        dk[c] += ds * q_tile[at];
                    }
                }
            }
            sync_cube();
            start += block;
        }
    }
    if live {
        let (ok, ov) = (row_at(d_k, b, kvh, j), row_at(d_v, b, kvh, j));
        #[unroll(unroll)]
        for c in 0..comptime!(tiling.width()) {
            d_k[ok + lane_col(c, lane, lanes)] = F::cast_from(dk[c] * scale);
            d_v[ov + lane_col(c, lane, lanes)] = F::cast_from(dv[c]);
        }
    }
}

/// The dimensions of one attention call, read from (and checked against) its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seq: usize,
    pub head_dim: usize,
}

impl Dims {
    /// Panics (a caller's bug, not a user's) unless `q [B, H, T, hd]`, `k` and `v`
    /// `[B, KV, T, hd]` with `KV` dividing `H`.
    pub fn of<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>, v: &CubeTensor<R>) -> Self {
        let dims = |t: &CubeTensor<R>| -> [usize; 4] {
            let s = t.meta.shape();
            assert_eq!(s.num_dims(), 4, "attention: tensors are [B, heads, T, hd]");
            [s[0], s[1], s[2], s[3]]
        };
        assert!(
            q.dtype == k.dtype && k.dtype == v.dtype,
            "attention: q, k, v dtypes differ ({:?}, {:?}, {:?})",
            q.dtype,
            k.dtype,
            v.dtype
        );
        let ([b, h, t, hd], kd, vd) = (dims(q), dims(k), dims(v));
        assert_eq!(kd, vd, "attention: k and v shapes differ");
        let [kb, kv, kt, khd] = kd;
        assert!(
            kb == b && kt == t && khd == hd && kv > 0 && h % kv == 0,
            "attention: q {:?} and k/v {:?} do not form grouped-query attention",
            [b, h, t, hd],
            kd
        );
        Self {
            batch: b,
            heads: h,
            kv_heads: kv,
            seq: t,
            head_dim: hd,
        }
    }

    /// Whether the call has no rows (an empty tensor's strides may be 0, so its layout
    /// cannot be checked; there is nothing to launch).
    pub fn is_empty(&self) -> bool {
        self.batch * self.heads * self.seq * self.head_dim == 0
    }
}

/// The forward's outputs: `out [B, H, T, hd]` in the inputs' dtype (any layout whose rows
/// have unit stride), `lse [B, H, T]` f32, contiguous.
pub struct Forward<R: CubeRuntime> {
    pub out: CubeTensor<R>,
    pub lse: CubeTensor<R>,
}

/// The backward's outputs, shaped and typed as `q`, `k`, `v` (any layout whose rows have
/// unit stride).
pub struct Grads<R: CubeRuntime> {
    pub q: CubeTensor<R>,
    pub k: CubeTensor<R>,
    pub v: CubeTensor<R>,
}

/// Panics (a caller's bug) unless `t` is `shape` at `dtype`: on CUDA the kernels launch
/// unchecked, so a tensor smaller than `q`, `k` and `v` say would be read or written past its
/// end. No allocation unless it fails: it runs at every attention call.
fn assert_shaped<R: CubeRuntime>(name: &str, t: &CubeTensor<R>, shape: &[usize], dtype: DType) {
    let s = t.meta.shape();
    let same = s.num_dims() == shape.len() && shape.iter().enumerate().all(|(i, &n)| s[i] == n);
    if !same || t.dtype != dtype {
        let dims: Vec<usize> = (0..s.num_dims()).map(|i| s[i]).collect();
        panic!(
            "attention: {name} is {dims:?} at {:?}, not {shape:?} at {dtype:?}",
            t.dtype
        );
    }
}

/// Panics (a caller's bug) unless the kernels can write `t` element by element at its
/// strides: no two elements share memory, and rows have unit stride.
fn assert_writable_rows<R: CubeRuntime>(name: &str, t: &CubeTensor<R>) {
    assert!(
        t.is_nonoverlapping() && t.meta.strides().last() == Some(&1),
        "attention: {name} must be non-overlapping with unit-stride rows, not strides {:?}",
        t.meta.strides()
    );
}

fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Vec<usize>, dtype: DType) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        dtype,
    )
}

/// Causal GQA attention `softmax(scale · q kᵀ + causal) v` and its per-row log-sum-exp;
/// the output in `q`'s layout.
pub fn forward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    scale: f32,
) -> Forward<R> {
    let d = Dims::of(&q, &k, &v);
    let out = empty_in_layout_of(&q, q.dtype);
    let lse = empty(&q, vec![d.batch, d.heads, d.seq], DType::F32);
    let variant = Variant::of(&q);
    forward_into(q, k, v, Forward { out, lse }, scale, variant)
}

/// Which kernels an attention call runs. Every variant computes the same results, to its
/// precision's tolerance; tests run each, benches time each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Unroll the loops over the head width ([`unrolls`]).
    pub unroll: bool,
    /// Run on tensor cores where the call can ([`tensor_cores::runs`]); other calls take the
    /// f32 kernels.
    pub tensor_cores: bool,
    /// Let the f32 kernels share a row among units that add their partial products by warp
    /// shuffles ([`shuffles`], [`row_lanes`]).
    pub shuffles: bool,
}

impl Variant {
    /// What `t`'s device runs by default.
    pub fn of<R: CubeRuntime>(t: &CubeTensor<R>) -> Self {
        Self {
            unroll: unrolls(t),
            tensor_cores: tensor_cores_by_default(t),
            shuffles: shuffles(t),
        }
    }
}

/// Whether calls on `t`'s device run on tensor cores by default: where
/// [`tensor_cores::available`] and `LAB_ATTENTION_MMA=1`. Opt-in for now: the tensor-core
/// kernels have not yet run on a GPU (lavapipe has none), so their CUDA tests and
/// `scripts/gpu/session.sh` must pass and time them before they become the default.
/// `LAB_ATTENTION_MMA` is read once per process; other values leave them off.
pub fn tensor_cores_by_default<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LAB_ATTENTION_MMA").as_deref() == Ok("1"))
        && tensor_cores::available(t)
}

/// Whether the kernels unroll their loops over the head width on `t`'s runtime: on CUDA,
/// where constant indices let each unit's rows stay in registers instead of local memory
/// (not yet measured on a GPU); not on wgpu, where lavapipe (the CI's device) compiles
/// unrolled kernels slowly. `LAB_ATTENTION_UNROLL=0` or `=1` overrides the choice, to compare
/// both on one device. Each kernel still unrolls only rows that fit [`unrolled_rows`].
/// Other values of the variable are ignored.
pub fn unrolls<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    // Read once: this runs at every attention call of every step.
    static CHOSEN: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| match std::env::var("LAB_ATTENTION_UNROLL").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    });
    chosen.unwrap_or_else(|| R::name(&t.client) == "cuda")
}

/// Whether the f32 kernels may split a row among units on `t`'s runtime: on CUDA, whose
/// warp shuffles add the units' partial products; not on wgpu, where cubecl offers plane
/// operations on no CPU device (lavapipe, CI's). `LAB_ATTENTION_SHUFFLE=0` turns the split
/// off on CUDA, to compare both on one device; other values are ignored.
pub fn shuffles<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var("LAB_ATTENTION_SHUFFLE").as_deref() == Ok("0"));
    !off && R::name(&t.client) == "cuda"
}

/// Floats of per-unit rows a kernel unrolls at most: CUDA has 255 registers a thread, and
/// the kernels need some for indices and sums.
const REGISTER_ROWS: usize = 192;

/// Floats of per-unit rows beyond which a kernel shares each row among more units.
const LANE_FLOATS: usize = 128;

/// Units that share a row ([`row_lanes`]) at most: the lanes add their parts in
/// `log2(lanes)` shuffles.
const MAX_LANES: usize = 4;

/// Units per row for a kernel holding `rows` head-width rows per row it works on (the
/// forward 2: `q_i` and its output; `dQ` 3; `dK/dV` 4): the fewest (1, 2 or 4) that bring
/// a unit's part under [`LANE_FLOATS`] and give each whole runs of [`RUN`] elements
/// ([`lane_col`]), where `shuffles` allows.
/// At hd = 64: the forward keeps 1 (128 floats), `dQ` and `dK/dV` take 2 (96 and 128), so
/// that their rows fit in registers instead of local memory; at hd = 128 (the 7B's and
/// MedGemma's), 2, 4 and 4.
///
/// Shared rows need whole warps (the shuffle names all 32 lanes), so a head width whose
/// cube would end in a partial warp (hd = 96: 21 rows a cube) keeps one unit a row.
pub fn row_lanes(shuffles: bool, rows: usize, head_dim: usize) -> usize {
    let mut lanes = 1;
    while shuffles
        && lanes < MAX_LANES
        && rows * head_dim / lanes > LANE_FLOATS
        && head_dim.is_multiple_of(RUN * 2 * lanes)
    {
        lanes *= 2;
    }
    if (block_rows(head_dim) * lanes).is_multiple_of(WARP) {
        lanes
    } else {
        1
    }
}

/// Units of a CUDA warp: the lanes one shuffle names.
const WARP: usize = 32;

/// Whether a kernel holding `rows` head-width rows per unit, each split over `lanes`,
/// unrolls: where a unit's parts fit [`REGISTER_ROWS`] (constant indices keep them in
/// registers; run-time ones put them in local memory). (`D = dO·O` holds none and unrolls
/// whenever `unroll` is set.)
pub fn unrolled_rows(unroll: bool, rows: usize, head_dim: usize, lanes: usize) -> bool {
    unroll && rows * head_dim / lanes <= REGISTER_ROWS
}

/// [`forward`] into outputs the caller allocated (tests poison them to see unwritten
/// elements), shaped as [`forward`]'s: `out` in any layout of unit-stride rows, `lse`
/// contiguous.
pub fn forward_into<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    outputs: Forward<R>,
    scale: f32,
    variant: Variant,
) -> Forward<R> {
    let d = Dims::of(&q, &k, &v);
    if d.is_empty() {
        return outputs;
    }
    assert_writable_rows("out", &outputs.out);
    assert!(outputs.lse.is_contiguous(), "attention: lse is contiguous");
    let q_shape = [d.batch, d.heads, d.seq, d.head_dim];
    assert_shaped("out", &outputs.out, &q_shape, q.dtype);
    assert_shaped("lse", &outputs.lse, &q_shape[..3], DType::F32);
    let [q, k, v] = [q, k, v].map(unit_stride_rows);
    let client = q.client.clone();
    let dtype = q.dtype;
    if variant.tensor_cores && tensor_cores::runs(&q, d.head_dim) {
        tensor_cores::launch_forward([q, k, v], &outputs, scale, &d);
        return outputs;
    }
    let tiling = Tiling::of(variant, 2, d.head_dim);
    launch_on!(
        forward_kernel,
        &client,
        tiling.cubes(d.seq, d.heads, d.batch),
        tiling.cube_dim(),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        outputs.out.clone().into_tensor_arg(),
        outputs.lse.clone().into_tensor_arg(),
        scale,
        tiling,
        [dtype.into(), DType::F32.into()],
    );
    outputs
}

/// What the backward reads of each row beside the forward's `lse`, `[B, H, T]` f32 each.
pub struct BackwardRows<R: CubeRuntime> {
    /// `D = dO·O`.
    pub delta: CubeTensor<R>,
    /// `lse · log2 e`: the tensor cores' register kernels take their softmax in base 2. The
    /// f32 kernels read `lse` itself; it costs an f32 write a row where `D` reads `2 · hd`
    /// elements.
    pub lse_log2: CubeTensor<R>,
}

/// [`BackwardRows`] of the forward's `out` and its upstream gradient `d_out` (`[B, H, T, hd]`,
/// rows of unit stride) and its contiguous `lse`, one unit a row; `unroll` its loop over the
/// head width.
pub fn backward_rows<R: CubeRuntime>(
    out: CubeTensor<R>,
    d_out: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    unroll: bool,
) -> BackwardRows<R> {
    let s = out.meta.shape();
    let [batch, heads, seq, head_dim] = [s[0], s[1], s[2], s[3]];
    assert_shaped("d_out", d_out, &[batch, heads, seq, head_dim], out.dtype);
    assert_shaped("lse", lse, &[batch, heads, seq], DType::F32);
    let rows = BackwardRows {
        delta: empty(&out, vec![batch, heads, seq], DType::F32),
        lse_log2: empty(&out, vec![batch, heads, seq], DType::F32),
    };
    // Rows spread over three grid axes as the other kernels: wgpu caps each at 65,535.
    delta_kernel::launch::<R>(
        &out.client.clone(),
        CubeCount::Static(
            seq.div_ceil(DELTA_UNITS as usize) as u32,
            heads as u32,
            batch as u32,
        ),
        CubeDim::new_1d(DELTA_UNITS),
        out.clone().into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        rows.delta.clone().into_tensor_arg(),
        rows.lse_log2.clone().into_tensor_arg(),
        head_dim,
        unroll,
        [out.dtype.into(), DType::F32.into()],
    );
    rows
}

/// Gradients of [`forward`] for the upstream gradient `d_out` (shaped as `out`), from the
/// forward's `out` and `lse`; each in the layout of its input.
#[allow(clippy::too_many_arguments)]
pub fn backward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    d_out: CubeTensor<R>,
    scale: f32,
) -> Grads<R> {
    let grads = Grads {
        q: empty_in_layout_of(&q, q.dtype),
        k: empty_in_layout_of(&k, k.dtype),
        v: empty_in_layout_of(&v, v.dtype),
    };
    let variant = Variant::of(&q);
    backward_into(q, k, v, out, lse, d_out, grads, scale, variant)
}

/// [`backward`] into gradients the caller allocated (shaped as `q`, `k`, `v`, in any layout
/// of unit-stride rows).
#[allow(clippy::too_many_arguments)]
pub fn backward_into<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    d_out: CubeTensor<R>,
    grads: Grads<R>,
    scale: f32,
    variant: Variant,
) -> Grads<R> {
    let unroll = variant.unroll;
    let d = Dims::of(&q, &k, &v);
    if d.is_empty() {
        return grads;
    }
    for (name, g) in [("dq", &grads.q), ("dk", &grads.k), ("dv", &grads.v)] {
        assert_writable_rows(name, g);
    }
    let q_shape = [d.batch, d.heads, d.seq, d.head_dim];
    let kv_shape = [d.batch, d.kv_heads, d.seq, d.head_dim];
    for (name, t, shape) in [
        ("out", &out, &q_shape),
        ("d_out", &d_out, &q_shape),
        ("dq", &grads.q, &q_shape),
        ("dk", &grads.k, &kv_shape),
        ("dv", &grads.v, &kv_shape),
    ] {
        assert_shaped(name, t, shape, q.dtype);
    }
    assert_shaped("lse", &lse, &q_shape[..3], DType::F32);
    let [q, k, v, out, d_out] = [q, k, v, out, d_out].map(unit_stride_rows);
    let lse = into_contiguous(lse);
    let client = q.client.clone();
    let types = [q.dtype.into(), DType::F32.into()];

    let stats = backward_rows(out, &d_out, &lse, unroll);
    if variant.tensor_cores && tensor_cores::runs(&q, d.head_dim) {
        tensor_cores::launch_backward([q, k, v, d_out], lse, &stats, &grads, scale, &d);
        return grads;
    }
    let tiling = Tiling::of(variant, 3, d.head_dim);
    launch_on!(
        grad_q_kernel,
        &client,
        tiling.cubes(d.seq, d.heads, d.batch),
        tiling.cube_dim(),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        stats.delta.clone().into_tensor_arg(),
        grads.q.clone().into_tensor_arg(),
        scale,
        tiling,
        types,
    );
    let tiling = Tiling::of(variant, 4, d.head_dim);
    launch_on!(
        grad_kv_kernel,
        &client,
        tiling.cubes(d.seq, d.kv_heads, d.batch),
        tiling.cube_dim(),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        d_out.into_tensor_arg(),
        lse.into_tensor_arg(),
        stats.delta.into_tensor_arg(),
        grads.k.clone().into_tensor_arg(),
        grads.v.clone().into_tensor_arg(),
        scale,
        tiling,
        types,
    );
    grads
}

#[cfg(test)]
mod tests {
    use super::{block_rows, row_lanes, unrolled_rows, LANE_FLOATS, MAX_LANES, RUN};
    use proptest::prelude::*;

    /// x1-50m's head width and the 7B's and MedGemma's: the split the module docs state.
    #[test]
    fn rows_are_shared_where_they_exceed_a_units_budget() {
        let lanes = |rows, hd| row_lanes(true, rows, hd);
        assert_eq!([lanes(2, 64), lanes(3, 64), lanes(4, 64)], [1, 2, 2]);
        assert_eq!([lanes(2, 128), lanes(3, 128), lanes(4, 128)], [2, 4, 4]);
        // 21 rows a cube: 42 or 84 units would end in a partial warp.
        assert_eq!([lanes(3, 96), lanes(4, 96)], [1, 1]);
        // hd = 60: no whole runs of 4 for 2 lanes.
        assert_eq!(lanes(4, 60), 1);
        // Where the rows now fit, the loops unroll: `dK/dV` at hd = 64 did not before.
        assert!(!unrolled_rows(true, 4, 64, 1));
        assert!(unrolled_rows(true, 4, 64, lanes(4, 64)));
    }

    proptest! {
        /// The fewest lanes (1, 2 or 4) that give each whole runs of 4 and bring a unit's
        /// part under the budget, or as many as the head width and the cap allow, in whole
        /// warps; none without shuffles.
        #[test]
        fn lanes_are_the_fewest_that_fit(rows in 1usize..6, head_dim in 1usize..300, shuffles: bool) {
            let lanes = row_lanes(shuffles, rows, head_dim);
            prop_assert!([1, 2, 4].contains(&lanes));
            prop_assert!(shuffles || lanes == 1);
            prop_assert!(lanes == 1 || head_dim.is_multiple_of(RUN * lanes), "whole runs");
            let fits = rows * head_dim / lanes <= LANE_FLOATS;
            let could_split = lanes < MAX_LANES && head_dim.is_multiple_of(RUN * 2 * lanes);
            // Too few lanes only where no more divide the head width, or where shared rows
            // would leave a partial warp (then one unit a row).
            let partial_warp = !(block_rows(head_dim) * 2).is_multiple_of(32);
            prop_assert!(!shuffles || fits || !could_split || (lanes == 1 && partial_warp));
            if lanes > 1 {
                prop_assert!(rows * head_dim / (lanes / 2) > LANE_FLOATS, "more lanes than needed");
                prop_assert!((block_rows(head_dim) * lanes).is_multiple_of(32), "a partial warp");
            }
        }
    }
}
