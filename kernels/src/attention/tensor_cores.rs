//! Causal GQA flash attention on tensor cores, forward and backward, for CUDA at f16/bf16.
//!
//! Two families share this module's launches, tiles and loader. By default the kernels of
//! [`registers`] run: `mma.sync` products with a documented fragment layout, whose row-wise
//! work stays in registers. `LAB_ATTENTION_ROWS=bounce` ([`RowWork`]) runs the kernels below,
//! on cooperative matrices (`cmma`), which the rest of this doc describes.
//!
//! Same contract as the f32 kernels in [`super`]: outputs in the inputs' dtype, `lse` f32, f32
//! accumulation. What differs is who multiplies: a plane (warp) owns 16 rows (query rows in
//! the forward and `dQ`, key rows in `dK/dV`) and computes every product of them with a tile of
//! 64 rows of another tensor as 16×16×16 cooperative matrix products with f32 accumulators.
//!
//! Cooperative matrices are opaque: no unit knows which elements it holds. The row-wise work
//! (the online softmax, rebuilding `p = exp(s − lse)`, `ds = p (dp − D)`) therefore goes
//! through shared memory ("bounce"): the plane stores a product as f32 rows, two lanes per
//! row do the row's arithmetic (alternate columns each), and write the result, rounded to the
//! storage type as FlashAttention-2 feeds it to the next product, where the plane loads it as
//! an operand. The forward rescales its output the same way (store, scale each row, load; in
//! two halves above hd 96), and skips it on a tile where no row of the plane has a new max.
//!
//! A cube of [`PLANES`] planes owns 64 rows and walks the other side 64 rows at a time:
//! - forward and `dQ`: query rows `[r0, r0 + 64)`, keys `0 .. r0 + 64`, so the last tile is
//!   the diagonal one and every query row sees at least one key in every tile (the running max
//!   is finite from the first tile on);
//! - `dK/dV`: key rows `[r0, r0 + 64)` of a key/value head, the queries `r0 ..` of every head
//!   of its group. Each plane owns its key rows for the whole group, so there are no atomics
//!   and the sums have a fixed order.
//!
//! The register forward and `dQ` own 128 query rows a cube up to hd 64 (two blocks of 16 a
//! plane, [`registers`]); up to two of their last tiles reach the diagonal, and a plane skips
//! the last where it comes after all its rows, so every row it computes still sees a key.
//!
//! Rows past the sequence compute on zeros and are not written.
//!
//! Tiles of `q`, `k`, `v` and `dO` come into shared memory 16 bytes a unit at a time (the
//! inputs are `Tensor<Vector<F, 8>>`: [`load_tile`]); inputs whose rows are not 16-byte aligned
//! are copied first ([`chunk_readable`]). The register kernels copy their tiles (and `dK/dV`
//! its rows' `lse` and `D`) by `cp.async` into two stages ([`RowWork::tile_stages`]); a copy
//! for a row past the sequence reads none of its bytes and writes zeros.
//!
//! The kernels launch unchecked, for the reasons and with the checks the parent module gives
//! for its own kernels on CUDA. Their accesses are in bounds by construction: tile rows are
//! read only below `seq`, columns below the head width; `lse` and `D` are read and the outputs
//! written only for rows below `seq`; the grid spans the tensors' batches and heads.

use burn::tensor::DType;
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor, CubeRuntime};
use cubecl::cmma::{self, Matrix, MatrixIdent, MatrixLayout};
use cubecl::ir::features::MmaConfig;
use cubecl::prelude::barrier::copy_async_checked;
use cubecl::prelude::*;
use enumset::EnumSet;

use super::{row_at, BackwardRows, Dims, Forward, Grads};
use crate::vectors::RowLayout;

pub(crate) mod registers;

/// Planes (warps of 32 units) per cube; a cube owns `16 · PLANES` rows (the forward and `dQ`
/// that times their [`RowWork::query_blocks`]).
pub const PLANES: usize = 4;

/// Largest head width the kernels take: the 7B's and MedGemma's 128. Shared memory holds two
/// `[64, hd]` tiles plus each plane's bounce rows: 42 KiB at hd = 64, 58 KiB at 128 (the
/// rows stay 64 columns wide: [`column_parts`]); the backward adds its f32 probabilities, 59
/// and 75 KiB in all (`dK/dV` 0.5 KiB more, with its `lse` and `D` rows; the `dV` launch of
/// wide heads has neither `p` nor `D`: 58.25 KiB). Over CUDA's default 48 KiB, cubecl-cuda
/// asks for the device's opt-in maximum at each launch (A100 163 KiB, H100 227 KiB). Above
/// hd 64 `dK` and `dV` take a launch each ([`KvGrads`]).
pub const MAX_HEAD_DIM: usize = 128;

/// Alignment of the shared arrays that cooperative matrices or vector accesses ([`Chunk`],
/// [`Pair`]) read and write: wmma wants 256-bit pointers, a pair 8 bytes, and cubecl aligns a
/// plain shared array to its element only.
const TILE_ALIGN: usize = 128;

/// Widest head whose accumulators go through the bounce rows whole (to rescale or write
/// them). Wider heads take them in two halves ([`column_parts`]), so that at hd 128 the bounce
/// rows stay 64 columns wide and `dQ` and `dK` need 75 and 75.5 KiB of shared memory, not 91
/// and 91.5: two cubes an SM on an A100 (164 KiB), where one fit. Up to hd 96 whole rows fit
/// two already, and halves of 48 columns there made ptxas spill (bf16 `dQ` on sm_80, `dV` on
/// sm_90a).
const WHOLE_ROWS_MAX_HEAD_DIM: usize = 96;

/// Parts a head's columns are taken in when accumulators go through the bounce rows.
const fn column_parts(head_dim: usize) -> usize {
    if head_dim <= WHOLE_ROWS_MAX_HEAD_DIM {
        1
    } else {
        2
    }
}

/// Columns in each of the [`column_parts`].
const fn part_cols(head_dim: usize) -> usize {
    head_dim / column_parts(head_dim)
}

/// Columns of a plane's f32 bounce rows: a product with a 64-row tile, or a part of the
/// head's columns.
const fn bounce_width(head_dim: usize, planes: usize) -> usize {
    let part = part_cols(head_dim);
    if part > 16 * planes {
        part
    } else {
        16 * planes
    }
}

/// Elements from one f32 bounce row to the next: 4 past the width. Lane `(r, parity)` reads
/// columns `4c + 2·parity` and `+1` of row `r` as one 8-byte access ([`Pair`]), which starts
/// in bank `(stride·r + 4c + 2·parity) mod 32`; a half-warp (rows 0 to 7 or 8 to 15) then
/// covers the 32 banks once at a stride of 68, where at 64 its 8 rows would share 4 banks
/// (8-way conflicts). wmma wants rows of whole 16 bytes.
const fn values_stride(head_dim: usize, planes: usize) -> usize {
    bounce_width(head_dim, planes) + 4
}

/// Elements from one row of a plane's f32 probabilities to the next (the backward keeps `p`
/// there while `dP` takes the bounce rows): 64 columns and 4 more, for the banks as
/// [`values_stride`].
const fn probs_stride(planes: usize) -> usize {
    16 * planes + 4
}

/// Elements of every plane's f32 bounce rows together.
const fn bounce_len(head_dim: usize, planes: usize) -> usize {
    planes * 16 * values_stride(head_dim, planes)
}

/// Elements from one operand row (storage type, 64 columns) to the next: 8 past 64, for the
/// banks as [`values_stride`], in whole 16 bytes.
const fn operand_stride(planes: usize) -> usize {
    16 * planes + 8
}

/// Whether `t`'s device runs these kernels at `t`'s dtype: a CUDA device with 16×16×16
/// products of f16 or bf16 into f32; bf16, and the register kernels at either type
/// (`mma.sync` 16×8×16 and `cp.async`), only from Ampere (sm_80) on, which cubecl's
/// properties mark with `copy_async` (it lists bf16 products for older GPUs too, where NVRTC
/// rejects them). Other runtimes keep the f32 kernels: lavapipe has no tensor cores, and only
/// CUDA is measured.
pub fn available<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    if R::name(&t.client) != "cuda" || !matches!(t.dtype, DType::F16 | DType::BF16) {
        return false;
    }
    let features = &t.client.properties().features;
    let needs_ampere = t.dtype == DType::BF16 || RowWork::chosen() == RowWork::Registers;
    if needs_ampere && !features.copy_async {
        return false;
    }
    let product = MmaConfig {
        a_type: t.dtype.into(),
        b_type: t.dtype.into(),
        cd_type: DType::F32.into(),
        m: 16,
        n: 16,
        k: 16,
    };
    features.matmul.cmma.contains(&product)
}

/// Whether a call of head width `head_dim` fits these kernels: a multiple of 16 up to
/// [`MAX_HEAD_DIM`] whose [`column_parts`] are whole 16-column chunks: all but 112, which
/// takes the f32 kernels.
pub fn fits(head_dim: usize) -> bool {
    head_dim.is_multiple_of(16)
        && head_dim <= MAX_HEAD_DIM
        && part_cols(head_dim).is_multiple_of(16)
}

/// Whether a call on `t` of head width `head_dim` can run here: [`fits`] and [`available`].
pub fn runs<R: CubeRuntime>(t: &CubeTensor<R>, head_dim: usize) -> bool {
    fits(head_dim) && available(t)
}

/// One cube per `rows` rows (64, or the forward's and `dQ`'s 16 a block,
/// [`RowWork::query_blocks`], of each plane) of each of `heads` heads of each sequence.
fn grid(d: &Dims, heads: usize, rows: usize) -> CubeCount {
    CubeCount::Static(d.seq.div_ceil(rows) as u32, heads as u32, d.batch as u32)
}

/// [`PLANES`] planes of 32 units.
fn cube_dim() -> CubeDim {
    CubeDim::new_2d(32, PLANES as u32)
}

/// Where the tensor-core kernels do their row-wise work: in the products' registers
/// ([`registers`]), or through the shared bounce rows (the kernels here), which
/// `LAB_ATTENTION_ROWS=bounce` picks (read once per process) to set one against the other on
/// a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowWork {
    #[default]
    Registers,
    Bounce,
}

impl RowWork {
    /// The choice this process runs.
    pub fn chosen() -> Self {
        static CHOSEN: std::sync::OnceLock<RowWork> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("LAB_ATTENTION_ROWS").as_deref() {
            Ok("bounce") => RowWork::Bounce,
            _ => RowWork::Registers,
        })
    }

    /// Blocks of 16 query rows a plane of the forward and `dQ` owns at head width `head_dim`
    /// by default: the register kernels' [`registers::query_blocks`], the bounce kernels' one.
    pub fn default_query_blocks(self, head_dim: usize) -> usize {
        match self {
            RowWork::Registers => registers::query_blocks(head_dim),
            RowWork::Bounce => 1,
        }
    }

    /// Stages of the tiles a kernel walks (keys and values, or queries and `dO`) that it keeps
    /// in shared memory by default: the register kernels two ([`registers`]: the next tile's
    /// `cp.async` copies run while the cube computes one), the bounce kernels one.
    pub fn default_tile_stages(self) -> usize {
        match self {
            RowWork::Registers => 2,
            RowWork::Bounce => 1,
        }
    }

    /// The stages this process runs: the default, or one where `LAB_ATTENTION_STAGES=1`
    /// (read once per process: each tile loaded, then computed, to set one against the other
    /// on a GPU).
    pub fn tile_stages(self) -> usize {
        static ONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let one = *ONE.get_or_init(|| std::env::var("LAB_ATTENTION_STAGES").as_deref() == Ok("1"));
        if one {
            1
        } else {
            self.default_tile_stages()
        }
    }

    /// The blocks this process runs: the default, or one where `LAB_ATTENTION_QUERY_BLOCKS=1`
    /// (read once per process; the register kernels' earlier shape, to set one against the
    /// other on a GPU).
    pub fn query_blocks(self, head_dim: usize) -> usize {
        static ONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let one =
            *ONE.get_or_init(|| std::env::var("LAB_ATTENTION_QUERY_BLOCKS").as_deref() == Ok("1"));
        if one {
            1
        } else {
            self.default_query_blocks(head_dim)
        }
    }
}

/// Launches the forward into `outputs` (inputs with unit-stride rows, a head width that
/// [`fits`]).
pub(super) fn launch_forward<R: CubeRuntime>(
    [q, k, v]: [CubeTensor<R>; 3],
    outputs: &Forward<R>,
    scale: f32,
    d: &Dims,
) {
    let types = [q.dtype.into(), DType::F32.into()];
    let [q, k, v] = [q, k, v].map(chunk_readable);
    let rows = RowWork::chosen();
    let blocks = rows.query_blocks(d.head_dim);
    let stages = rows.tile_stages();
    let forward = match rows {
        RowWork::Registers => registers::forward_kernel::launch_unchecked::<R>,
        RowWork::Bounce => forward_kernel::launch_unchecked::<R>,
    };
    // SAFETY: every access is in bounds (the module doc).
    unsafe {
        forward(
            &q.client.clone(),
            grid(d, d.heads, 16 * PLANES * blocks),
            cube_dim(),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            outputs.out.clone().into_tensor_arg(),
            outputs.lse.clone().into_tensor_arg(),
            scale,
            d.head_dim,
            PLANES,
            blocks,
            stages,
            types,
        );
    }
}

/// Launches `dQ` and `dK/dV` into `grads` from `q, k, v, dO` with unit-stride rows and the rows'
/// statistics: the forward's `lse`, and `stats`' `lse · log2 e` (which the register kernels
/// read) and `D = dO·O`.
pub(super) fn launch_backward<R: CubeRuntime>(
    [q, k, v, d_out]: [CubeTensor<R>; 4],
    lse: CubeTensor<R>,
    stats: &BackwardRows<R>,
    grads: &Grads<R>,
    scale: f32,
    d: &Dims,
) {
    let client = q.client.clone();
    let types = [q.dtype.into(), DType::F32.into()];
    let [q, k, v, d_out] = [q, k, v, d_out].map(chunk_readable);
    let rows = RowWork::chosen();
    let blocks = rows.query_blocks(d.head_dim);
    let stages = rows.tile_stages();
    // The register kernels take their softmax in base 2, the bounce kernels in natural units.
    let backward_lse = match rows {
        RowWork::Registers => stats.lse_log2.clone(),
        RowWork::Bounce => lse,
    };
    let grad_q = match rows {
        RowWork::Registers => registers::grad_q_kernel::launch_unchecked::<R>,
        RowWork::Bounce => grad_q_kernel::launch_unchecked::<R>,
    };
    // SAFETY: every access is in bounds (the module doc).
    unsafe {
        grad_q(
            &client,
            grid(d, d.heads, 16 * PLANES * blocks),
            cube_dim(),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            d_out.clone().into_tensor_arg(),
            backward_lse.clone().into_tensor_arg(),
            stats.delta.clone().into_tensor_arg(),
            grads.q.clone().into_tensor_arg(),
            scale,
            d.head_dim,
            PLANES,
            blocks,
            stages,
            types,
        );
    }
    let grad_kv = match rows {
        RowWork::Registers => registers::grad_kv_kernel::launch_unchecked::<R>,
        RowWork::Bounce => grad_kv_kernel::launch_unchecked::<R>,
    };
    for &part in KvGrads::launches(d.head_dim) {
        // SAFETY: every access is in bounds (the module doc).
        unsafe {
            grad_kv(
                &client,
                grid(d, d.kv_heads, 16 * PLANES),
                cube_dim(),
                q.clone().into_tensor_arg(),
                k.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                d_out.clone().into_tensor_arg(),
                backward_lse.clone().into_tensor_arg(),
                stats.delta.clone().into_tensor_arg(),
                grads.k.clone().into_tensor_arg(),
                grads.v.clone().into_tensor_arg(),
                scale,
                d.head_dim,
                PLANES,
                part,
                stages,
                types,
            );
        }
    }
}

/// Which gradients a launch of [`grad_kv_kernel`] computes. Up to hd 64 one walk over the
/// queries gives both. Wider, `dK` and `dV` take a launch each: both `[16, hd]` f32
/// accumulators with the plane's key and value rows held for the whole walk do not fit 255
/// registers (at hd 128 ptxas spilled 2.4 KB a thread on sm_80), and one of them with the rows
/// it needs does (`dK` at hd 128: 168 registers on both, no spill; BENCHMARKS.md). The `dV`
/// launch recomputes `P`: five products where one walk takes four.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KvGrads {
    /// `dK` and `dV` in one walk.
    Both,
    /// `dK` alone: `P`, `dP` and `dSᵀ Q`.
    Keys,
    /// `dV` alone: `P` and `Pᵀ dO`.
    Values,
}

impl KvGrads {
    /// Widest head whose `dK` and `dV` share a walk.
    const BOTH_MAX_HEAD_DIM: usize = 64;

    /// The launches that give both gradients at head width `head_dim`.
    pub(crate) fn launches(head_dim: usize) -> &'static [KvGrads] {
        if head_dim <= Self::BOTH_MAX_HEAD_DIM {
            &[KvGrads::Both]
        } else {
            &[KvGrads::Values, KvGrads::Keys]
        }
    }

    fn keys(self) -> bool {
        self != KvGrads::Values
    }

    fn values(self) -> bool {
        self != KvGrads::Keys
    }
}

/// The f32 arithmetic the kernels may do approximately: `exp` and `ln` as CUDA's `__expf` and
/// `__logf` (one multiply and the special-function unit's `ex2`/`lg2`, as FlashAttention's
/// `exp2f`), not the accurate library calls that reduce the argument first. Their error, a
/// few units in the last place of f32, is far under what rounding `p` and `dS` to bf16/f16
/// costs; the row-wise steps take 32 of them a lane a tile beside the tile's products.
fn softmax_math() -> EnumSet<FastMath> {
    FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
}

#[cube(launch_unchecked, fast_math = softmax_math())]
pub(super) fn forward_kernel<F: Float, A: Float>(
    q: &Tensor<Chunk<F>>,
    k: &Tensor<Chunk<F>>,
    v: &Tensor<Chunk<F>>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<A>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
    #[comptime] stages: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    comptime!(assert!(
        blocks == 1 && stages == 1,
        "the bounce kernels own one block of rows a plane and load one key tile at a time"
    ));
    let rows = comptime!(16 * planes);
    let (seq, heads, kv_heads) = (q.shape(2), q.shape(1), k.shape(1));
    let (b, h) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
    let row0 = CUBE_POS_X as usize * rows;
    let kv_head = h / (heads / kv_heads);
    let (k_base, v_base) = (row_at(k, b, kv_head, 0), row_at(v, b, kv_head, 0));
    let mut k_tile = SharedMemory::<F>::new_aligned(rows * head_dim, TILE_ALIGN);
    let mut v_tile = SharedMemory::<F>::new_aligned(rows * head_dim, TILE_ALIGN);
    let mut bounce = Bounce::<F, A>::new(head_dim, planes);
    let lanes = Lanes::new(row0);

    let q_base = row_at(q, b, h, 0);
    let q_frags = plane_rows::<F>(q, &mut k_tile, q_base, row0, seq, head_dim, planes);
    let o_frags = accumulators::<A>(head_dim);
    let mut m = A::min_value();
    let mut l = A::new(0.0);
    let end = smaller(row0 + rows, seq);
    let mut start = 0;
    while start < end {
        load_tile::<F>(k, &mut k_tile, k_base, start, seq, head_dim, planes, 0usize);
        load_tile::<F>(v, &mut v_tile, v_base, start, seq, head_dim, planes, 0usize);
        sync_cube();
        bounce.product(&q_frags, &k_tile, head_dim, planes);

        // Online softmax of the plane's rows: new max, rescale, probabilities, row sum.
        let at = bounce.value_at(&lanes, head_dim, planes);
        let first = start + lanes.col0();
        let mut m_new = m;
        for c in 0..comptime!(lane_pairs(rows)) {
            let s = pair::<A>(&bounce.values, at, c);
            #[unroll]
            for j in 0..PAIR {
                let s = s[j] * A::cast_from(scale);
                if first + pair_col(c, j) <= lanes.i && s > m_new {
                    m_new = s;
                }
            }
        }
        let other = plane_shuffle_xor(m_new, 1);
        if other > m_new {
            m_new = other;
        }
        let alpha = (m - m_new).exp();
        let mut sum = A::new(0.0);
        let op = bounce.operand_at(&lanes, planes);
        for c in 0..comptime!(lane_pairs(rows)) {
            let s = pair::<A>(&bounce.values, at, c);
            let mut p = Pair::<A>::new(A::new(0.0));
            #[unroll]
            for j in 0..PAIR {
                if first + pair_col(c, j) <= lanes.i {
                    p[j] = (s[j] * A::cast_from(scale) - m_new).exp();
                }
                sum += p[j];
            }
            set_pair::<F>(&mut bounce.operand, op, c, Pair::<F>::cast_from(p));
        }
        l = l * alpha + plane_shuffle_xor(sum, 1) + sum;
        // O ← α O + P V. Where no row of the plane has a new max, α = exp(0) = 1 exactly and
        // the rescale (the plane's accumulators through shared memory and back) is skipped:
        // once a row's largest score has been seen, later tiles rarely raise it. The vote is
        // the plane's, so its cooperative matrices stay uniform.
        let rescale = !plane_all(m_new == m);
        m = m_new;
        sync_plane();
        if rescale {
            bounce.scale_rows(&o_frags, &lanes, alpha, head_dim, planes);
        }
        bounce.accumulate(&o_frags, &v_tile, head_dim, planes);
        // Every plane is done with this tile's keys and values before the next load.
        sync_cube();
        start += rows;
    }

    let one_over_l = A::new(1.0) / l;
    let out_base = row_at(out, b, h, 0);
    bounce.write_rows(
        &o_frags, out, out_base, &lanes, seq, one_over_l, head_dim, planes,
    );
    if lanes.i < seq && lanes.parity == 0 {
        lse[(b * heads + h) * seq + lanes.i] = m + l.ln();
    }
}

#[cube(launch_unchecked, fast_math = softmax_math())]
pub(super) fn grad_q_kernel<F: Float, A: Float>(
    q: &Tensor<Chunk<F>>,
    k: &Tensor<Chunk<F>>,
    v: &Tensor<Chunk<F>>,
    d_out: &Tensor<Chunk<F>>,
    lse: &Tensor<A>,
    delta: &Tensor<A>,
    d_q: &mut Tensor<F>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
    #[comptime] stages: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    comptime!(assert!(
        blocks == 1 && stages == 1,
        "the bounce kernels own one block of rows a plane and load one key tile at a time"
    ));
    let rows = comptime!(16 * planes);
    let lane_pairs = comptime!(lane_pairs(rows));
    let (seq, heads, kv_heads) = (q.shape(2), q.shape(1), k.shape(1));
    let (b, h) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
    let row0 = CUBE_POS_X as usize * rows;
    let kv_head = h / (heads / kv_heads);
    let (k_base, v_base) = (row_at(k, b, kv_head, 0), row_at(v, b, kv_head, 0));
    let mut k_tile = SharedMemory::<F>::new_aligned(rows * head_dim, TILE_ALIGN);
    let mut v_tile = SharedMemory::<F>::new_aligned(rows * head_dim, TILE_ALIGN);
    let mut bounce = Bounce::<F, A>::new(head_dim, planes);
    let lanes = Lanes::new(row0);
    let scale = A::cast_from(scale);
    let mut probs =
        SharedMemory::<A>::new_aligned(comptime!(planes * 16 * probs_stride(planes)), TILE_ALIGN);
    let pa = lanes.probs_at(planes);

    let (q_base, do_base) = (row_at(q, b, h, 0), row_at(d_out, b, h, 0));
    let q_frags = plane_rows::<F>(q, &mut k_tile, q_base, row0, seq, head_dim, planes);
    let do_frags = plane_rows::<F>(d_out, &mut k_tile, do_base, row0, seq, head_dim, planes);
    let dq_frags = accumulators::<A>(head_dim);
    let mut lse_i = A::new(0.0);
    let mut delta_i = A::new(0.0);
    if lanes.i < seq {
        lse_i = lse[(b * heads + h) * seq + lanes.i];
        delta_i = delta[(b * heads + h) * seq + lanes.i];
    }

    let end = smaller(row0 + rows, seq);
    let mut start = 0;
    while start < end {
        load_tile::<F>(k, &mut k_tile, k_base, start, seq, head_dim, planes, 0usize);
        load_tile::<F>(v, &mut v_tile, v_base, start, seq, head_dim, planes, 0usize);
        sync_cube();
        let first = start + lanes.col0();
        let at = bounce.value_at(&lanes, head_dim, planes);
        let op = bounce.operand_at(&lanes, planes);

        // p = exp(scale · q·k − lse), kept in `probs` while dP takes the bounce rows.
        bounce.product(&q_frags, &k_tile, head_dim, planes);
        #[unroll]
        for c in 0..lane_pairs {
            let s = pair::<A>(&bounce.values, at, c);
            let mut p = Pair::<A>::new(A::new(0.0));
            #[unroll]
            for j in 0..PAIR {
                if first + pair_col(c, j) <= lanes.i {
                    p[j] = (s[j] * scale - lse_i).exp();
                }
            }
            set_pair::<A>(&mut probs, pa, c, p);
        }
        sync_plane();
        bounce.product(&do_frags, &v_tile, head_dim, planes);
        #[unroll]
        for c in 0..lane_pairs {
            let dp = pair::<A>(&bounce.values, at, c);
            let ds = pair::<A>(&probs, pa, c) * (dp - Pair::<A>::new(delta_i));
            set_pair::<F>(&mut bounce.operand, op, c, Pair::<F>::cast_from(ds));
        }
        sync_plane();

        // dQ += dS K.
        bounce.accumulate(&dq_frags, &k_tile, head_dim, planes);
        sync_cube();
        start += rows;
    }
    let dq_base = row_at(d_q, b, h, 0);
    bounce.write_rows(
        &dq_frags, d_q, dq_base, &lanes, seq, scale, head_dim, planes,
    );
}

#[cube(launch_unchecked, fast_math = softmax_math())]
pub(super) fn grad_kv_kernel<F: Float, A: Float>(
    q: &Tensor<Chunk<F>>,
    k: &Tensor<Chunk<F>>,
    v: &Tensor<Chunk<F>>,
    d_out: &Tensor<Chunk<F>>,
    lse: &Tensor<A>,
    delta: &Tensor<A>,
    d_k: &mut Tensor<F>,
    d_v: &mut Tensor<F>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] grads: KvGrads,
    #[comptime] stages: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    comptime!(assert!(
        stages == 1,
        "the bounce kernels load one query tile at a time"
    ));
    let rows = comptime!(16 * planes);
    let lane_pairs = comptime!(lane_pairs(rows));
    let (keys, values) = comptime!((grads.keys(), grads.values()));
    let (seq, heads, kv_heads) = (q.shape(2), q.shape(1), k.shape(1));
    let group = heads / kv_heads;
    let (b, kvh) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
    let row0 = CUBE_POS_X as usize * rows;
    let (k_base, v_base) = (row_at(k, b, kvh, 0), row_at(v, b, kvh, 0));
    // `dK` keeps `p` here while `dP` takes the bounce rows (read in pairs: aligned). Declared
    // first: cubecl lays the shared arrays out in the order they are declared
    // (vendor/cubecl-opt), and with `p` at offset 0 ptxas kept bf16 at hd 64 on sm_90a from
    // spilling, where it spilled 36 bytes a thread with `p` last (BENCHMARKS.md).
    let probs_len = comptime!(if keys {
        planes * 16 * probs_stride(planes)
    } else {
        1
    });
    let mut probs = SharedMemory::<A>::new_aligned(probs_len, TILE_ALIGN);
    let mut q_tile = SharedMemory::<F>::new_aligned(rows * head_dim, TILE_ALIGN);
    let mut do_tile = SharedMemory::<F>::new_aligned(rows * head_dim, TILE_ALIGN);
    let mut lse_tile = SharedMemory::<A>::new(rows);
    // `D` for `dS` (`dK` only).
    let mut delta_tile = SharedMemory::<A>::new(comptime!(if keys { rows } else { 1 }));
    let mut bounce = Bounce::<F, A>::new(head_dim, planes);
    // Here a lane pair's row is a key row `j`; its columns are query rows.
    let lanes = Lanes::new(row0);
    let scale = A::cast_from(scale);
    let pa = lanes.probs_at(planes);

    let k_frags = plane_rows::<F>(k, &mut q_tile, k_base, row0, seq, head_dim, planes);
    let v_frags = if comptime!(keys) {
        plane_rows::<F>(v, &mut q_tile, v_base, row0, seq, head_dim, planes)
    } else {
        Sequence::<Matrix<F>>::new()
    };
    let dk_frags = accumulators::<A>(comptime!(if keys { head_dim } else { 0 }));
    let dv_frags = accumulators::<A>(comptime!(if values { head_dim } else { 0 }));

    for g in 0..group {
        let head = kvh * group + g;
        let head_rows = (b * heads + head) * seq;
        let (q_base, do_base) = (row_at(q, b, head, 0), row_at(d_out, b, head, 0));
        let mut start = row0;
        while start < seq {
            load_tile::<F>(q, &mut q_tile, q_base, start, seq, head_dim, planes, 0usize);
            load_tile::<F>(
                d_out,
                &mut do_tile,
                do_base,
                start,
                seq,
                head_dim,
                planes,
                0usize,
            );
            load_row_stats::<A>(
                lse,
                delta,
                &mut lse_tile,
                &mut delta_tile,
                head_rows,
                start,
                seq,
                0usize,
                rows,
                keys,
                false,
            );
            sync_cube();
            let col0 = lanes.col0();
            let at = bounce.value_at(&lanes, head_dim, planes);
            let op = bounce.operand_at(&lanes, planes);

            // pᵀ = exp(scale · k·q − lse_i) for queries i ≥ j inside the sequence.
            bounce.product(&k_frags, &q_tile, head_dim, planes);
            #[unroll]
            for c in 0..lane_pairs {
                let s = pair::<A>(&bounce.values, at, c);
                let mut p = Pair::<A>::new(A::new(0.0));
                #[unroll]
                for j in 0..PAIR {
                    let col = col0 + pair_col(c, j);
                    let i = start + col;
                    if i >= lanes.i && i < seq {
                        p[j] = (s[j] * scale - lse_tile[col]).exp();
                    }
                }
                if comptime!(keys) {
                    set_pair::<A>(&mut probs, pa, c, p);
                }
                if comptime!(values) {
                    set_pair::<F>(&mut bounce.operand, op, c, Pair::<F>::cast_from(p));
                }
            }
            sync_plane();
            if comptime!(values) {
                // dV += Pᵀ dO.
                bounce.accumulate(&dv_frags, &do_tile, head_dim, planes);
            }
            if comptime!(keys) {
                bounce.product(&v_frags, &do_tile, head_dim, planes);
                #[unroll]
                for c in 0..lane_pairs {
                    let dp = pair::<A>(&bounce.values, at, c);
                    let mut delta_j = Pair::<A>::new(A::new(0.0));
                    #[unroll]
                    for j in 0..PAIR {
                        delta_j[j] = delta_tile[col0 + pair_col(c, j)];
                    }
                    let ds = pair::<A>(&probs, pa, c) * (dp - delta_j);
                    set_pair::<F>(&mut bounce.operand, op, c, Pair::<F>::cast_from(ds));
                }
                sync_plane();
                // dK += dSᵀ Q.
                bounce.accumulate(&dk_frags, &q_tile, head_dim, planes);
            }
            sync_cube();
            start += rows;
        }
    }
    if comptime!(keys) {
        let dk_base = row_at(d_k, b, kvh, 0);
        bounce.write_rows(
            &dk_frags, d_k, dk_base, &lanes, seq, scale, head_dim, planes,
        );
    }
    if comptime!(values) {
        let dv_base = row_at(d_v, b, kvh, 0);
        bounce.write_rows(
            &dv_frags,
            d_v,
            dv_base,
            &lanes,
            seq,
            A::new(1.0),
            head_dim,
            planes,
        );
    }
}

/// `lse` (in the units the kernel reads it: natural for the bounce kernels, base 2 for the
/// register ones, [`launch_backward`]) and, for `dK` (`keys`), `D` of the queries `start ..
/// start + 64` of the head whose rows start at `head_rows` of them, into `lse_tile` and
/// `delta_tile` from `tile_at` on: 0 past the sequence, where `q` and `dO` are zeros, so that
/// `pᵀ dO` and `dS` are too. Loaded and stored, or copied by `cp.async` (`asynchronous`: in
/// shared memory once the unit has passed `sync_storage`).
#[allow(clippy::too_many_arguments)]
#[cube]
fn load_row_stats<A: Float>(
    lse: &Tensor<A>,
    delta: &Tensor<A>,
    lse_tile: &mut SharedMemory<A>,
    delta_tile: &mut SharedMemory<A>,
    head_rows: usize,
    start: usize,
    seq: usize,
    tile_at: usize,
    #[comptime] rows: usize,
    #[comptime] keys: bool,
    #[comptime] asynchronous: bool,
) {
    if UNIT_POS < rows as u32 {
        let i = start + UNIT_POS as usize;
        let to = tile_at + UNIT_POS as usize;
        if comptime!(asynchronous) {
            let (from, read) = (head_rows + i, usize::cast_from(i < seq));
            let mut lse_to = lse_tile.slice_mut(to, to + 1);
            copy_async_checked(&lse.slice(from, from + read), &mut lse_to, 1u32);
            if comptime!(keys) {
                let mut delta_to = delta_tile.slice_mut(to, to + 1);
                copy_async_checked(&delta.slice(from, from + read), &mut delta_to, 1u32);
            }
        } else {
            let mut lse_i = A::new(0.0);
            let mut delta_i = A::new(0.0);
            if i < seq {
                lse_i = lse[head_rows + i];
                if comptime!(keys) {
                    delta_i = delta[head_rows + i];
                }
            }
            lse_tile[to] = lse_i;
            if comptime!(keys) {
                delta_tile[to] = delta_i;
            }
        }
    }
}

/// Where a lane works in the row-wise steps: two lanes per row of the plane's 16, each with
/// every second [`Pair`] of adjacent columns: lane `parity` takes columns `4c + 2·parity` and
/// `4c + 2·parity + 1`.
#[derive(CubeType)]
struct Lanes {
    /// The lane's row within its plane's 16.
    r: usize,
    /// Which of the row's column pairs: the even (0) or the odd (1).
    parity: usize,
    /// The row's index in the sequence.
    i: usize,
}

#[cube]
impl Lanes {
    fn new(row0: usize) -> Lanes {
        let r = UNIT_POS_X as usize / 2;
        Lanes {
            r,
            parity: UNIT_POS_X as usize % 2,
            i: row0 + UNIT_POS_Y as usize * 16 + r,
        }
    }

    /// The lane's first column in a row: its pairs start there and every 4 columns on.
    fn col0(&self) -> usize {
        PAIR * self.parity
    }

    /// Where the lane's first column is in the plane's probabilities (its pairs follow every
    /// 4 elements: [`pair`]). Only the lane reads what it writes there: shared memory stands
    /// in for the registers that `p` would take from the accumulators. A plain index, as
    /// [`Bounce::value_at`] gives.
    fn probs_at(&self, #[comptime] planes: usize) -> usize {
        let stride = comptime!(probs_stride(planes));
        (UNIT_POS_Y as usize * 16 + self.r) * stride + self.col0()
    }
}

/// Each plane's shared rows: `values`, 16 rows of [`bounce_width`] f32 (padded to
/// [`values_stride`]), for products and a part of the accumulators at a time
/// ([`column_parts`]); `operand`, 16 rows of 64 in the storage type (padded to
/// [`operand_stride`]), for the left operand of the next product.
#[derive(CubeType)]
struct Bounce<F: Float, A: Float> {
    /// Every plane's f32 rows; the plane's own start at `values0`.
    values: SharedMemory<A>,
    /// Every plane's operand rows; the plane's own start at `operand0`.
    operand: SharedMemory<F>,
    values0: usize,
    operand0: usize,
}

#[cube]
impl<F: Float, A: Float> Bounce<F, A> {
    fn new(#[comptime] head_dim: usize, #[comptime] planes: usize) -> Bounce<F, A> {
        let stride = comptime!(values_stride(head_dim, planes));
        let len = comptime!(bounce_len(head_dim, planes));
        let operand_stride = comptime!(operand_stride(planes));
        let plane = UNIT_POS_Y as usize;
        Bounce::<F, A> {
            values: SharedMemory::<A>::new_aligned(len, TILE_ALIGN),
            operand: SharedMemory::<F>::new_aligned(planes * 16 * operand_stride, TILE_ALIGN),
            values0: plane * 16 * stride,
            operand0: plane * 16 * operand_stride,
        }
    }

    /// Where the lane's first column is in `values`; its pairs follow every 4 elements
    /// ([`pair`]).
    fn value_at(
        &self,
        lanes: &Lanes,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
    ) -> usize {
        let stride = comptime!(values_stride(head_dim, planes));
        self.values0 + lanes.r * stride + lanes.col0()
    }

    /// Where the lane's first column is in `operand`; its pairs follow every 4 elements
    /// ([`set_pair`]).
    fn operand_at(&self, lanes: &Lanes, #[comptime] planes: usize) -> usize {
        let stride = comptime!(operand_stride(planes));
        self.operand0 + lanes.r * stride + lanes.col0()
    }

    /// `rows ← X Tᵀ` for the plane's 16 rows `X` (as `A` operands, one per 16 columns of the
    /// head) and the 64 rows of `tile`: a `[16, 64]` f32 product. Ends with a plane barrier.
    fn product(
        &mut self,
        x_frags: &Sequence<Matrix<F>>,
        tile: &SharedMemory<F>,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
    ) {
        let rows = comptime!(16 * planes);
        let chunks = comptime!(head_dim / 16);
        let len = comptime!(bounce_len(head_dim, planes));
        let stride = comptime!(values_stride(head_dim, planes));
        let acc = Matrix::<A>::from_value(
            MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            MatrixLayout::Undefined,
            A::new(0.0),
        );
        #[unroll]
        for n in 0..planes {
            cmma::fill::<A>(&acc, A::new(0.0));
            #[unroll]
            for c in 0..chunks {
                // Rows n·16.. of the tile, transposed: column-major with the tile's row stride.
                let t = operand::<F>(
                    MatrixIdent::B,
                    MatrixLayout::ColMajor,
                    &tile.slice(n * 16 * head_dim + c * 16, rows * head_dim),
                    head_dim as u32,
                );
                cmma::execute::<F, F, A, A>(x_frags.index(c), &t, &acc, &acc);
            }
            cmma::store(
                &mut self.values.slice_mut(self.values0 + n * 16, len),
                &acc,
                stride as u32,
                MatrixLayout::RowMajor,
            );
        }
        sync_plane();
    }

    /// `acc += operand · tile`: the plane's `[16, 64]` operand rows times the tile's
    /// `[64, hd]`. The operand must be written and a plane barrier passed.
    fn accumulate(
        &self,
        acc: &Accumulators<A>,
        tile: &SharedMemory<F>,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
    ) {
        let rows = comptime!(16 * planes);
        let parts = comptime!(column_parts(head_dim));
        let part_chunks = comptime!(part_cols(head_dim) / 16);
        let operand_stride = comptime!(operand_stride(planes));
        let mut lhs = Sequence::<Matrix<F>>::new();
        #[unroll]
        for n in 0..planes {
            lhs.push(operand::<F>(
                MatrixIdent::A,
                MatrixLayout::RowMajor,
                &self
                    .operand
                    .slice(self.operand0 + n * 16, planes * 16 * operand_stride),
                operand_stride as u32,
            ));
        }
        #[unroll]
        for p in 0..parts {
            let part = acc.index(p);
            #[unroll]
            for c in 0..part_chunks {
                let col = (p * part_chunks + c) * 16;
                #[unroll]
                for n in 0..planes {
                    let t = operand::<F>(
                        MatrixIdent::B,
                        MatrixLayout::RowMajor,
                        &tile.slice(n * 16 * head_dim + col, rows * head_dim),
                        head_dim as u32,
                    );
                    cmma::execute::<F, F, A, A>(lhs.index(n), &t, part.index(c), part.index(c));
                }
            }
        }
        // The operand rows are read before anyone writes them again.
        sync_plane();
    }

    /// Stores one part of the accumulators ([`column_parts`]) as `[16, hd / parts]` f32 rows.
    fn store(
        &mut self,
        part: &Sequence<Matrix<A>>,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
    ) {
        let part_chunks = comptime!(part_cols(head_dim) / 16);
        let len = comptime!(bounce_len(head_dim, planes));
        let stride = comptime!(values_stride(head_dim, planes));
        #[unroll]
        for c in 0..part_chunks {
            cmma::store(
                &mut self.values.slice_mut(self.values0 + c * 16, len),
                part.index(c),
                stride as u32,
                MatrixLayout::RowMajor,
            );
        }
        sync_plane();
    }

    /// Multiplies each accumulator row by its lane pair's `alpha`, through the bounce rows a
    /// part at a time.
    fn scale_rows(
        &mut self,
        acc: &Accumulators<A>,
        lanes: &Lanes,
        alpha: A,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
    ) {
        let parts = comptime!(column_parts(head_dim));
        let part_chunks = comptime!(part_cols(head_dim) / 16);
        let len = comptime!(bounce_len(head_dim, planes));
        let stride = comptime!(values_stride(head_dim, planes));
        let at = self.value_at(lanes, head_dim, planes);
        #[unroll]
        for p in 0..parts {
            let part = acc.index(p);
            self.store(part, head_dim, planes);
            for c in 0..comptime!(lane_pairs(part_cols(head_dim))) {
                let x = pair::<A>(&self.values, at, c) * Pair::<A>::new(alpha);
                set_pair::<A>(&mut self.values, at, c, x);
            }
            sync_plane();
            #[unroll]
            for c in 0..part_chunks {
                cmma::load_with_layout(
                    part.index(c),
                    &self.values.slice(self.values0 + c * 16, len),
                    stride as u32,
                    MatrixLayout::RowMajor,
                );
            }
            if comptime!(parts > 1) {
                // Every lane has loaded this part before the next one is stored over it.
                sync_plane();
            }
        }
    }

    /// Writes the accumulators' rows inside the sequence, times `factor`, to the rows of the
    /// head whose row 0 is at `base` in `dst` (rows `dst.stride(2)` apart), a part at a time.
    #[allow(clippy::too_many_arguments)]
    fn write_rows(
        &mut self,
        acc: &Accumulators<A>,
        dst: &mut Tensor<F>,
        base: usize,
        lanes: &Lanes,
        seq: usize,
        factor: A,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
    ) {
        let parts = comptime!(column_parts(head_dim));
        let part_cols = comptime!(part_cols(head_dim));
        let at = self.value_at(lanes, head_dim, planes);
        #[unroll]
        for p in 0..parts {
            self.store(acc.index(p), head_dim, planes);
            if lanes.i < seq {
                // Element by element: the outputs' strides need not be even.
                let to = base + lanes.i * dst.stride(2) + p * part_cols + lanes.col0();
                for c in 0..comptime!(lane_pairs(part_cols)) {
                    let x = pair::<A>(&self.values, at, c);
                    #[unroll]
                    for j in 0..PAIR {
                        dst[to + pair_col(c, j)] = F::cast_from(x[j] * factor);
                    }
                }
            }
            sync_plane();
        }
    }
}

/// The plane's 16 rows of the `[64, hd]` block at `row0` of the head whose row 0 is at `base`,
/// as `A` operands (one per 16 columns), staged through `tile`.
#[cube]
fn plane_rows<F: Float>(
    src: &Tensor<Chunk<F>>,
    tile: &mut SharedMemory<F>,
    base: usize,
    row0: usize,
    seq: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
) -> Sequence<Matrix<F>> {
    let rows = comptime!(16 * planes);
    let chunks = comptime!(head_dim / 16);
    load_tile::<F>(src, tile, base, row0, seq, head_dim, planes, 0usize);
    sync_cube();
    let mut frags = Sequence::<Matrix<F>>::new();
    #[unroll]
    for c in 0..chunks {
        frags.push(operand::<F>(
            MatrixIdent::A,
            MatrixLayout::RowMajor,
            &tile.slice(
                UNIT_POS_Y as usize * 16 * head_dim + c * 16,
                rows * head_dim,
            ),
            head_dim as u32,
        ));
    }
    sync_cube();
    frags
}

/// Adjacent columns a lane takes at once in the row-wise steps: one 8-byte access to the f32
/// rows and one 4-byte store of the next product's operand (two roundings in one
/// instruction), where each column took its own.
const PAIR: usize = 2;

/// [`PAIR`] adjacent elements as one value.
type Pair<E> = Vector<E, Const<PAIR>>;

/// Pairs a lane takes of a row `cols` wide (two lanes a row).
const fn lane_pairs(cols: usize) -> usize {
    cols / (2 * PAIR)
}

/// Where element `j` of a lane's pair `c` is, from the lane's first column ([`Lanes::col0`]).
#[cube]
fn pair_col(c: usize, j: usize) -> usize {
    PAIR * 2 * c + j
}

/// The lane's pair `c` of the shared rows `rows`, whose first column is at `at` (even: see
/// [`Lanes`]): elements `at + 4c` and `at + 4c + 1`.
#[cube]
fn pair<E: Float>(rows: &SharedMemory<E>, at: usize, c: usize) -> Pair<E> {
    let pairs = rows
        .to_slice()
        .into_vectorized()
        .with_vector_size::<Const<PAIR>>();
    pairs[at / PAIR + 2 * c]
}

/// Writes the lane's pair `c` of the shared rows `rows` (as [`pair`] reads it).
#[cube]
fn set_pair<E: Float>(rows: &mut SharedMemory<E>, at: usize, c: usize, x: Pair<E>) {
    let mut pairs = rows
        .to_slice_mut()
        .into_vectorized()
        .with_vector_size::<Const<PAIR>>();
    pairs[at / PAIR + 2 * c] = x;
}

/// The smaller of `a` and `b` (where a cube's walk over the keys ends).
#[cube]
fn smaller(a: usize, b: usize) -> usize {
    let mut min = a;
    if b < min {
        min = b;
    }
    min
}

/// A 16×16 operand of a product (`A` on the left, `B` on the right) read from `src`, whose
/// rows are `stride` elements apart (`ColMajor`: read transposed).
#[cube]
fn operand<F: Float>(
    #[comptime] ident: MatrixIdent,
    #[comptime] layout: MatrixLayout,
    src: &Slice<F>,
    stride: u32,
) -> Matrix<F> {
    Matrix::<F>::from_slice(ident, 16usize, 16usize, 16usize, layout, src, stride)
}

/// A plane's f32 accumulators for its 16 rows of a `[., hd]` result: one 16×16 matrix per 16
/// columns, grouped by [`column_parts`] (a part is what the bounce rows take at once).
type Accumulators<A> = Sequence<Sequence<Matrix<A>>>;

/// Zeroed [`Accumulators`] for head width `head_dim` (no matrices at 0).
#[cube]
fn accumulators<A: Float>(#[comptime] head_dim: usize) -> Accumulators<A> {
    let parts = comptime!(column_parts(head_dim));
    let part_chunks = comptime!(part_cols(head_dim) / 16);
    let mut acc = Sequence::<Sequence<Matrix<A>>>::new();
    #[unroll]
    for _ in 0..parts {
        let mut part = Sequence::<Matrix<A>>::new();
        #[unroll]
        for _ in 0..part_chunks {
            part.push(Matrix::<A>::from_value(
                MatrixIdent::Accumulator,
                16usize,
                16usize,
                16usize,
                MatrixLayout::Undefined,
                A::new(0.0),
            ));
        }
        acc.push(part);
    }
    acc
}

/// Elements a unit copies at once in [`load_tile`]: 16 bytes of f16/bf16, one vector load
/// (`LDG.E.128`) and one vector store (`STS.128`) where elements took one each.
const CHUNK: usize = 8;

/// [`CHUNK`] elements as one value.
type Chunk<F> = Vector<F, Const<CHUNK>>;

/// Whether a tensor of `elem_bytes` elements that starts `start_bytes` into its buffer, at
/// `strides` (the last, the rows', 1), can be read [`CHUNK`] elements at a time: its start and
/// every other stride whole chunks, so that every chunk of a row is 16-byte aligned (the rule
/// the element-wise kernels' vectors follow: [`RowLayout::in_vectors`]).
fn chunk_aligned(start_bytes: u64, strides: &[usize], elem_bytes: usize) -> bool {
    let layout = RowLayout {
        start_bytes,
        strides,
        elem_bytes,
    };
    layout.in_vectors(CHUNK, CHUNK)
}

/// `t` as [`load_tile`] reads it: itself where it is [`chunk_aligned`] (the model's tensors
/// and their head-swapped views are), else a contiguous copy, whose strides are multiples of
/// the head width. (A view's start is too: burn makes views only at offsets that are multiples
/// of the runtime's memory alignment, 512 bytes on CUDA.)
fn chunk_readable<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let aligned = |t: &CubeTensor<R>| {
        let start = t.handle.offset_start.unwrap_or(0);
        chunk_aligned(start, t.meta.strides(), t.dtype.size())
    };
    let t = if aligned(&t) { t } else { into_contiguous(t) };
    assert!(
        aligned(&t),
        "attention: a tensor {} bytes into its buffer cannot be read 16 bytes at a time",
        t.handle.offset_start.unwrap_or(0)
    );
    t
}

/// The cube copies rows `start .. start + 64` (zeros past `seq`) of the head whose row 0 is at
/// `base` into `tile` (rows `src.stride(2)` apart; in the tile `head_dim` elements and
/// `pad_chunks` chunks apart), [`CHUNK`] elements a unit at a time: the
/// tile's chunks in order, unit `u` taking chunks `u`, `u + 128`, ... Consecutive units read
/// consecutive 16 bytes of a row (a warp whole rows at hd 64 and 128: 4 of 128 bytes, 2 of
/// 256) and store consecutive 16 bytes of the tile (no bank conflicts). `src` must be
/// [`chunk_aligned`]; [`fits`] keeps the head width a multiple of 16, so a unit's share is
/// whole chunks.
#[cube]
fn load_tile<F: Float>(
    src: &Tensor<Chunk<F>>,
    tile: &mut SharedMemory<F>,
    base: usize,
    start: usize,
    seq: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] pad_chunks: usize,
) {
    load_tile_at::<F>(
        src, tile, base, start, seq, 0usize, head_dim, planes, pad_chunks, false,
    );
}

/// [`load_tile`] into the tile's rows from `tile_row0` on (padded tiles only: an unpadded one
/// takes its rows from 0), with loads and stores, or `asynchronous`ly: each unit's chunks
/// copied by `cp.async` ([`copy_chunk`]), in shared memory once the unit has passed
/// `sync_storage` (cubecl-cpp as lab patches it: `cp.async.wait_all`, then the barrier).
#[allow(clippy::too_many_arguments)]
#[cube]
fn load_tile_at<F: Float>(
    src: &Tensor<Chunk<F>>,
    tile: &mut SharedMemory<F>,
    base: usize,
    start: usize,
    seq: usize,
    tile_row0: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] pad_chunks: usize,
    #[comptime] asynchronous: bool,
) {
    let units = comptime!(32 * planes);
    // Whole chunks for every unit, each pass: what `fits` promises.
    comptime!(assert!(
        head_dim.is_multiple_of(16),
        "a head width of whole 16 columns"
    ));
    let row_chunks = comptime!(head_dim / CHUNK);
    // Strides and `base` count elements; a chunked tensor is indexed in chunks.
    let row_step = src.stride(2) / CHUNK;
    let first = base / CHUNK;
    let mut chunks = tile
        .to_slice_mut()
        .into_vectorized()
        .with_vector_size::<Const<CHUNK>>();
    let passes = comptime!(16 * planes * row_chunks / units);
    // Where the units a pass takes are whole rows (hd 16, 32, 64, 128), a unit keeps its
    // column and steps down `pass_rows` rows a pass: one address and one stride.
    let pass_rows = comptime!(units / row_chunks);
    let whole_rows = comptime!(units.is_multiple_of(row_chunks));
    let (r0, c0) = (
        UNIT_POS as usize / row_chunks,
        UNIT_POS as usize % row_chunks,
    );
    let from = first + (start + r0) * row_step + c0;
    let pass_step = pass_rows * row_step;
    let tile_row = comptime!(row_chunks + pad_chunks);
    #[unroll]
    for m in 0..passes {
        let at = UNIT_POS as usize + m * units;
        // A store in each branch: merging a zeroed chunk with the loaded one made NVCC
        // move it 16 bits at a time.
        if comptime!(whole_rows) {
            // Unpadded, the tile's chunk is the unit's `at` (the form NVCC was measured on).
            let to = if comptime!(pad_chunks == 0) {
                at
            } else {
                (tile_row0 + r0 + m * pass_rows) * tile_row + c0
            };
            let inside = start + r0 + m * pass_rows < seq;
            if comptime!(asynchronous) {
                copy_chunk::<F>(src, tile, from + m * pass_step, to, inside);
            } else if inside {
                chunks[to] = src[from + m * pass_step];
            } else {
                chunks[to] = Chunk::<F>::new(F::new(0.0));
            }
        } else {
            let (r, c) = (at / row_chunks, at % row_chunks);
            let to = if comptime!(pad_chunks == 0) {
                at
            } else {
                (tile_row0 + r) * tile_row + c
            };
            let inside = start + r < seq;
            if comptime!(asynchronous) {
                copy_chunk::<F>(src, tile, first + (start + r) * row_step + c, to, inside);
            } else if inside {
                chunks[to] = src[first + (start + r) * row_step + c];
            } else {
                chunks[to] = Chunk::<F>::new(F::new(0.0));
            }
        }
    }
}

/// `cp.async` of chunk `from` of `src` into chunk `to` of `tile`, or 16 zero bytes where the
/// row is not `inside` the sequence (a copy that reads none of its 16 bytes and fills them
/// with zeros).
#[cube]
fn copy_chunk<F: Float>(
    src: &Tensor<Chunk<F>>,
    tile: &mut SharedMemory<F>,
    from: usize,
    to: usize,
    inside: bool,
) {
    let read = usize::cast_from(inside);
    // The tile's chunk as a slice of its elements: cubecl writes the copy's destination as
    // the array's address plus the slice's offset in the array's own elements (a vectorized
    // view's offset would count chunks from an element pointer).
    let at = to * CHUNK;
    let destination = tile.slice_mut(at, at + CHUNK);
    // SAFETY: the same bytes, named as one chunk for `copy_async_checked`'s one type.
    let mut destination = unsafe { destination.downcast_unchecked::<Chunk<F>>() };
    copy_async_checked(
        &src.slice(from, from + read),
        &mut destination,
        comptime!(CHUNK as u32),
    );
}

#[cfg(test)]
mod tests {
    use super::{chunk_aligned, fits, MAX_HEAD_DIM};

    /// The layouts read 16 bytes at a time as they are: contiguous `[B, H, T, hd]` and the
    /// model's head-swapped view of `[B, T, H, hd]`, from a buffer's start or a whole chunk into
    /// it, and rows 40 elements (80 bytes) apart. The others are copied: a start 2 or 8 bytes
    /// in, or rows 36 elements apart (a view of 32 columns of 36-column rows: 72 bytes).
    #[test]
    fn chunk_aligned_takes_the_layouts_whose_chunks_are_16_byte_aligned() {
        let contiguous = [4 * 37 * 64, 37 * 64, 64, 1];
        let swapped = [37 * 4 * 64, 64, 4 * 64, 1];
        assert!(chunk_aligned(0, &contiguous, 2));
        assert!(chunk_aligned(0, &swapped, 2));
        assert!(chunk_aligned(16 * 5, &swapped, 2));
        assert!(!chunk_aligned(2, &contiguous, 2));
        assert!(!chunk_aligned(8, &contiguous, 2));
        assert!(chunk_aligned(0, &[2 * 37 * 40, 37 * 40, 40, 1], 2));
        assert!(!chunk_aligned(0, &[2 * 37 * 36, 37 * 36, 36, 1], 2));
    }

    /// The head widths the kernels take: multiples of 16 up to 128 whose column parts are whole
    /// 16-column chunks. 112 is turned down (two parts of 56), and so is anything wider or
    /// not a multiple of 16.
    #[test]
    fn fits_takes_the_widths_whose_column_parts_are_whole_chunks() {
        let taken: Vec<usize> = (1..=2 * MAX_HEAD_DIM).filter(|&hd| fits(hd)).collect();
        assert_eq!(taken, [16, 32, 48, 64, 80, 96, 128]);
    }
}
