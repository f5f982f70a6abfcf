//! The tensor-core forward, `dQ` and `dK/dV` with their row-wise work in the products'
//! registers, as FlashAttention-2 does it: `mma.sync` 16×8×16 products whose fragments have a
//! documented layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"), where the cooperative
//! matrices of the parent module are opaque and send every product through shared memory.
//!
//! A plane (warp) owns blocks of 16 rows: in `dK/dV` one block of key rows, as in the parent;
//! in the forward and `dQ` two blocks of query rows up to hd 64 ([`query_blocks`]: 128 queries
//! a cube, so each fragment of a key or value tile feeds the products of both blocks), one
//! above. Lane `l` of a plane holds, of every 16×8 f32 product, rows `g = l / 4` and `g + 8`
//! of a block at columns `2t` and `2t + 1` (`t = l % 4`): the four lanes of a quad share a
//! row, so a row's max and sum take two shuffles. The same registers, rounded, are the left
//! operand of the next product (an `A` fragment 16×16 is two 16×8 products side by side), so
//! `p` and `dS` never leave the registers. The backward takes 16 keys (`dQ`) or queries
//! (`dK/dV`) at a time: two products of each kind a block live at once.
//!
//! Operands come from shared memory by `ldmatrix`: the plane's own rows once as `A`
//! fragments, each tile's rows as `B` fragments, plain for a product with the tile's rows as
//! columns (`q kᵀ`, `dO vᵀ`) and transposed (`ldmatrix.trans`) for one that sums over them
//! (`P V`, `dS K`, `Pᵀ dO`, `dSᵀ Q`). Tile rows are padded by 16 bytes
//! ([`PAD_CHUNKS`]), so the 8 rows an `ldmatrix` phase reads start in 8 different bank
//! quads. The layouts are CUDA's (`sm_80` on), written out here from the PTX ISA; cubecl's
//! `position_of_nth` for CUDA gives the same, and the CUDA emulation implements them apart
//! from this code (`kernels/cuda-emu/include/emu.h`).
//!
//! All three take their softmax in base 2 ([`LOG2_E`]), as FlashAttention-2 does: each
//! probability is one FFMA and one `ex2` (lab's fast `powf` of 2,
//! vendor/cubecl-cpp/LAB-PATCH.md). The forward keeps its rows' maxima in those units and
//! writes `lse` as a natural log; the backward reads it as `lse_log2 = lse · log2 e`, which
//! the kernel of the rows' `D` writes beside `D` (`super::super::delta_kernel`).
//!
//! Each kernel keeps two stages of its walk's tiles in shared memory (the forward's and `dQ`'s
//! keys and values, [`KeyWalk`]; `dK/dV`'s queries, `dO` and their `lse_log2` and `D`,
//! [`QueryWalk`]): while the cube computes one, the next tile's `cp.async` copies run into the
//! other, so the tile's global-memory latency hides behind the products, and one barrier a
//! tile serves both stages, as in FlashAttention-2. cubecl 0.10 has the copy
//! (`copy_async_checked`) but no wait without a `cuda::barrier`; lab's patch of the vendored
//! cubecl-cpp makes `sync_storage` the wait (`cp.async.wait_all`) and the cube barrier
//! (vendor/cubecl-cpp/LAB-PATCH.md). `LAB_ATTENTION_STAGES=1` takes one stage: load a tile,
//! barrier, compute it, barrier.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;

use super::super::row_at;
use super::{
    load_row_stats, load_tile_at, pair, smaller, softmax_math, Chunk, KvGrads, CHUNK, TILE_ALIGN,
};

/// Chunks of 16 bytes a tile row is padded by: rows `hd + 8` elements apart, so that the
/// eight 16-byte rows of an `ldmatrix` phase fall in eight different groups of four banks
/// (at a stride of `hd` elements, 128 or 256 bytes, all eight share one group).
pub(super) const PAD_CHUNKS: usize = 1;

/// Elements from one tile row to the next.
const fn tile_stride(head_dim: usize) -> usize {
    head_dim + PAD_CHUNKS * CHUNK
}

/// Blocks of 16 query rows a plane of the forward and of `dQ` owns: two up to hd 64, as
/// FlashAttention-2 takes 128 queries a cube, so that each key and value fragment a plane
/// reads from shared memory feeds two products, not one (one `ldmatrix` for every four `mma`,
/// where one block has one for every two: at 16 rows a plane, four planes' reads take the SM's
/// shared memory about as long as their products take the tensor cores). One above hd 64,
/// where two blocks' output accumulators alone would take `hd` registers a lane (one block's
/// take `hd / 2`). The kernels take any number; this is the launches' default
/// ([`super::RowWork::query_blocks`]).
pub(crate) const fn query_blocks(head_dim: usize) -> usize {
    if head_dim <= 64 {
        2
    } else {
        1
    }
}

/// Two adjacent elements: what one 32-bit register of a fragment holds.
type Two<E> = Vector<E, Const<2>>;

/// The kernels take their softmax in base 2, as FlashAttention-2 does: `2^(s · scale
/// · log2 e − m)`, where `m` is in the same units, is one FFMA and one `2^x` ([`exp2`]) an
/// element; `exp(s · scale − m)` adds a multiply by `log2 e` between them.
const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// `2^x` for both elements: on CUDA one `ex2.approx.ftz` each (lab's fast `powf` of 2,
/// vendor/cubecl-cpp/LAB-PATCH.md).
#[cube]
fn exp2<A: Float>(x: Two<A>) -> Two<A> {
    Two::<A>::new(A::new(2.0)).powf(x)
}

/// A lane's registers of one fragment: `A` 4, `B` 2, an f32 accumulator 2 (of two f32 each).
type Fragment<E> = Array<Two<E>>;

/// A lane's accumulator registers of several 16×8 products side by side: product `n` in
/// elements `2n` (row `g`) and `2n + 1` (row `g + 8`).
type Products<A> = Array<Two<A>>;

/// Where a lane is: its plane's rows start at `row0 + 16 · blocks · plane`; in each of the
/// plane's `blocks` blocks of 16 rows the lane holds rows `g` and `g + 8`, columns `2t` and
/// `2t + 1` of every 8.
#[derive(CubeType)]
struct Quad {
    /// The lane's first row in the sequence (its second is 8 on; block `m`'s are `16m` on).
    i: usize,
    /// Its column pair within every 8 columns (`t`).
    t: usize,
}

#[cube]
impl Quad {
    fn new(row0: usize, #[comptime] blocks: usize) -> Quad {
        let lane = UNIT_POS_X as usize;
        Quad {
            i: row0 + UNIT_POS_Y as usize * comptime!(16 * blocks) + lane / 4,
            t: lane % 4,
        }
    }
}

/// Where a forward or `dQ` cube works: query rows `row0 .. row0 + 16 · planes · blocks` of
/// head `h` of sequence `b` (of `heads`, `seq` rows each), whose keys and values (those of
/// `h`'s group) start at `k_base` and `v_base`. It walks keys `0 .. end`; keys from
/// `plane_end` on come after every row of the unit's plane.
#[derive(CubeType)]
struct QueryBlock {
    seq: usize,
    heads: usize,
    b: usize,
    h: usize,
    row0: usize,
    k_base: usize,
    v_base: usize,
    end: usize,
    plane_end: usize,
}

#[cube]
impl QueryBlock {
    fn new<F: Float>(
        q: &Tensor<Chunk<F>>,
        k: &Tensor<Chunk<F>>,
        v: &Tensor<Chunk<F>>,
        #[comptime] planes: usize,
        #[comptime] blocks: usize,
    ) -> QueryBlock {
        let (heads, kv_heads) = (q.shape(1), k.shape(1));
        let (b, h) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
        let kv_head = h / (heads / kv_heads);
        let seq = q.shape(2);
        let (plane_rows, rows) = comptime!((16 * blocks, 16 * planes * blocks));
        let row0 = CUBE_POS_X as usize * rows;
        QueryBlock {
            seq,
            heads,
            b,
            h,
            row0,
            k_base: row_at(k, b, kv_head, 0),
            v_base: row_at(v, b, kv_head, 0),
            end: smaller(row0 + rows, seq),
            plane_end: row0 + UNIT_POS_Y as usize * plane_rows + plane_rows,
        }
    }
}

/// A tile of `16 · planes · tiles` rows in shared memory, its rows [`tile_stride`] apart.
#[cube]
fn padded_tile<F: Float>(
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] tiles: usize,
) -> SharedMemory<F> {
    SharedMemory::<F>::new_aligned(
        comptime!(16 * planes * tiles * tile_stride(head_dim)),
        TILE_ALIGN,
    )
}

/// Where this lane's row address for `ldmatrix` is, in a tile whose rows are
/// [`tile_stride`] apart, for four 8×8 matrices at `(row, col)` offsets: lane `l` names row
/// `l % 8` of matrix `l / 8`; matrix `m` starts `(8 · (m % 2), 8 · (m / 2))` from the origin
/// (`down_first`) or `(8 · (m / 2), 8 · (m % 2))`.
#[cube]
fn matrix_row(#[comptime] head_dim: usize, #[comptime] down_first: bool) -> usize {
    let lane = UNIT_POS_X as usize;
    let (m, r) = (lane / 8, lane % 8);
    let (row, col) = if comptime!(down_first) {
        (r + 8 * (m % 2), 8 * (m / 2))
    } else {
        (r + 8 * (m / 2), 8 * (m % 2))
    };
    row * comptime!(tile_stride(head_dim)) + col
}

/// Four 8×8 matrices of `tile` into this lane's registers by one `ldmatrix` (`.trans` with
/// `transpose`), the lane's row address `at`.
#[cube]
fn load_four<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    tile: &SharedMemory<F>,
    at: usize,
    #[comptime] transpose: bool,
) -> Fragment<F> {
    mma.load_matrix::<F, Const<2>>(
        &tile.slice(at, at + CHUNK),
        MatrixIdent::A,
        4usize,
        transpose,
    )
}

/// Registers 2·`half` and 2·`half` + 1 of `four` as one `B` fragment.
#[cube]
fn half_of<F: Float>(four: &Fragment<F>, #[comptime] half: usize) -> Fragment<F> {
    let mut b = Array::<Two<F>>::new(2usize);
    b[0] = four[2 * half];
    b[1] = four[2 * half + 1];
    b
}

/// `acc[2n], acc[2n + 1] += a · b`: one 16×8×16 product into product `n` of `acc`.
#[cube]
fn multiply_into<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    a: &Fragment<F>,
    b: &Fragment<F>,
    acc: &mut Products<A>,
    #[comptime] n: usize,
) {
    let mut c = Array::<Two<A>>::new(2usize);
    c[0] = acc[2 * n];
    c[1] = acc[2 * n + 1];
    mma.execute_inplace(a, b, &mut c);
    acc[2 * n] = c[0];
    acc[2 * n + 1] = c[1];
}

/// `n` zeroed 16×8 products.
#[cube]
fn zeroed<A: Float>(#[comptime] n: usize) -> Products<A> {
    let mut acc = Array::<Two<A>>::new(comptime!(2 * n));
    #[unroll]
    for e in 0..comptime!(2 * n) {
        acc[e] = Two::<A>::new(A::new(0.0));
    }
    acc
}

/// The plane's `blocks` blocks of 16 rows of the cube's rows, staged in `tile`, as `A`
/// fragments: block `m`'s for columns `16c ..` at `m · hd / 16 + c`.
#[cube]
fn query_fragments<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    tile: &SharedMemory<F>,
    #[comptime] head_dim: usize,
    #[comptime] blocks: usize,
) -> Sequence<Fragment<F>> {
    let stride = comptime!(tile_stride(head_dim));
    // Matrices: rows 0–7 and 8–15 of columns 0–7, then of 8–15: a0..a3 of the PTX layout.
    let at = UNIT_POS_Y as usize * comptime!(16 * blocks * stride) + matrix_row(head_dim, true);
    let mut frags = Sequence::<Fragment<F>>::new();
    #[unroll]
    for m in 0..blocks {
        #[unroll]
        for c in 0..comptime!(head_dim / 16) {
            frags.push(load_four::<F, A>(
                mma,
                tile,
                at + comptime!(m * 16 * stride + c * 16),
                false,
            ));
        }
    }
    frags
}

/// `X Tᵀ` for each of the plane's `blocks` blocks of 16 rows `X` (as `A` fragments:
/// [`query_fragments`]) and rows `16j .. 16j + 16` of the tile at `origin` of `tile`: two
/// 16×8 products a block, block `m`'s at `4m` (each key fragment read once for all blocks).
#[cube]
fn pair_products<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    x_frags: &Sequence<Fragment<F>>,
    tile: &SharedMemory<F>,
    origin: usize,
    #[comptime] j: usize,
    #[comptime] head_dim: usize,
    #[comptime] blocks: usize,
) -> Products<A> {
    let stride = comptime!(tile_stride(head_dim));
    let chunks = comptime!(head_dim / 16);
    // Matrices: rows 0–7 at columns 0–7 and 8–15 (b0, b1 of the first product), then rows
    // 8–15 (the second).
    let at = matrix_row(head_dim, false) + origin + comptime!(j * 16 * stride);
    let mut s = zeroed::<A>(comptime!(2 * blocks));
    #[unroll]
    for c in 0..chunks {
        let four = load_four::<F, A>(mma, tile, at + c * 16, false);
        let (b0, b1) = (half_of::<F>(&four, 0usize), half_of::<F>(&four, 1usize));
        #[unroll]
        for m in 0..blocks {
            let a = x_frags.index(comptime!(m * chunks + c));
            multiply_into::<F, A>(mma, a, &b0, &mut s, comptime!(2 * m));
            multiply_into::<F, A>(mma, a, &b1, &mut s, comptime!(2 * m + 1));
        }
    }
    s
}

/// `S = Q Kᵀ` for the plane's rows and the tile's `16 · planes` keys at `origin` of `tile`:
/// `2 · planes` 16×8 products a block, block `m`'s from `4 · planes · m`.
#[cube]
fn scores<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    q_frags: &Sequence<Fragment<F>>,
    tile: &SharedMemory<F>,
    origin: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
) -> Products<A> {
    let mut s = Array::<Two<A>>::new(comptime!(4 * planes * blocks));
    #[unroll]
    for j in 0..planes {
        let pair = pair_products::<F, A>(mma, q_frags, tile, origin, j, head_dim, blocks);
        #[unroll]
        for m in 0..blocks {
            #[unroll]
            for e in 0..4usize {
                s[comptime!(4 * planes * m + 4 * j + e)] = pair[comptime!(4 * m + e)];
            }
        }
    }
    s
}

/// `acc += W T` for each of `blocks` blocks: `w`, block `m`'s two 16×8 products side by side
/// at `4m` (the weights of rows `16j .. 16j + 16` of the tile at `origin` of `tile`, rounded to
/// `F`: one `A` fragment), times those rows, into block `m`'s `hd / 8` products of `acc`
/// (from `m · hd / 4`); each row fragment read once for all blocks.
#[allow(clippy::too_many_arguments)]
#[cube]
fn accumulate_pair<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    w: &Products<A>,
    tile: &SharedMemory<F>,
    acc: &mut Products<A>,
    origin: usize,
    #[comptime] j: usize,
    #[comptime] head_dim: usize,
    #[comptime] blocks: usize,
) {
    let stride = comptime!(tile_stride(head_dim));
    let products = comptime!(head_dim / 8);
    // Transposed matrices: rows 0–7 and 8–15 of columns 0–7 (b0, b1), then of columns 8–15.
    let at = matrix_row(head_dim, true) + origin + comptime!(j * 16 * stride);
    let mut weights = Sequence::<Fragment<F>>::new();
    #[unroll]
    for m in 0..blocks {
        let mut a = Array::<Two<F>>::new(4usize);
        #[unroll]
        for e in 0..4usize {
            a[e] = Two::<F>::cast_from(w[comptime!(4 * m + e)]);
        }
        weights.push(a);
    }
    #[unroll]
    for c in 0..comptime!(head_dim / 16) {
        let four = load_four::<F, A>(mma, tile, at + c * 16, true);
        let (b0, b1) = (half_of::<F>(&four, 0usize), half_of::<F>(&four, 1usize));
        #[unroll]
        for m in 0..blocks {
            let a = weights.index(m);
            multiply_into::<F, A>(mma, a, &b0, acc, comptime!(m * products + 2 * c));
            multiply_into::<F, A>(mma, a, &b1, acc, comptime!(m * products + 2 * c + 1));
        }
    }
}

/// `O += P V`: the probabilities of the tile's `16 · planes` keys (`2 · planes` 16×8 products
/// a block, as [`scores`] lays them out) times the tile's values at `origin` of `tile`, into
/// the `hd / 8` products a block of `o`.
#[cube]
fn accumulate<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    p: &Products<A>,
    tile: &SharedMemory<F>,
    o: &mut Products<A>,
    origin: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
) {
    #[unroll]
    for j in 0..planes {
        let mut w = Array::<Two<A>>::new(comptime!(4 * blocks));
        #[unroll]
        for m in 0..blocks {
            #[unroll]
            for e in 0..4usize {
                w[comptime!(4 * m + e)] = p[comptime!(4 * planes * m + 4 * j + e)];
            }
        }
        accumulate_pair::<F, A>(mma, &w, tile, o, origin, j, head_dim, blocks);
    }
}

/// The largest of `x` over the four lanes of the quad (the lanes of one row).
#[cube]
fn quad_max<A: Float>(x: A) -> A {
    let x = max(x, plane_shuffle_xor(x, 1));
    max(x, plane_shuffle_xor(x, 2))
}

/// The sum of `x` over the four lanes of the quad.
#[cube]
fn quad_sum<A: Float>(x: A) -> A {
    let x = x + plane_shuffle_xor(x, 1);
    x + plane_shuffle_xor(x, 2)
}

/// Sets the elements of block `block` of `s` (`products` 16×8 products side by side a block,
/// the first at column `first_col` of the sequence; the block's rows `16 · block` after the
/// lane's first) outside the causal mask to `A::min_value()`, which `exp` and [`exp2`] take
/// to 0: keys after the lane's query row, or with `transposed` (rows are keys, columns
/// queries) queries before the lane's key row. (Times the forward's `scale · log2 e`, above 1
/// only for a scale above ln 2, it may round to −∞, whose `2^x` is 0 as well.)
#[cube]
fn mask_outside_causal<A: Float>(
    s: &mut Products<A>,
    quad: &Quad,
    first_col: usize,
    #[comptime] products: usize,
    #[comptime] block: usize,
    #[comptime] transposed: bool,
) {
    let first = comptime!(2 * products * block);
    #[unroll]
    for e in 0..comptime!(2 * products) {
        // Element e: product e / 2, row 8 · (e % 2) on.
        let row = quad.i + comptime!(16 * block + (e % 2) * 8);
        let col = first_col + comptime!((e / 2) * 8) + 2 * quad.t;
        let mut x = s[first + e];
        #[unroll]
        for j in 0..2usize {
            let outside = if comptime!(transposed) {
                col + j < row
            } else {
                col + j > row
            };
            if outside {
                x[j] = A::min_value();
            }
        }
        s[first + e] = x;
    }
}

/// Each of the lane's two rows of block `block` ([`scores`]' layout): its largest score in
/// `s` over the quad, unscaled (the scale is positive, so it is the scaled scores' largest over
/// the scale). On a tile that reaches the diagonal (`masked`) the keys after a row are masked
/// first ([`mask_outside_causal`]).
#[cube]
fn row_max<A: Float>(
    s: &mut Products<A>,
    quad: &Quad,
    start: usize,
    #[comptime] planes: usize,
    #[comptime] block: usize,
    #[comptime] masked: bool,
) -> Two<A> {
    if comptime!(masked) {
        mask_outside_causal::<A>(s, quad, start, comptime!(2 * planes), block, false);
    }
    let first = comptime!(4 * planes * block);
    let mut largest = Two::<A>::new(A::min_value());
    #[unroll]
    for e in 0..comptime!(4 * planes) {
        let row = e % 2;
        largest[row] = max(largest[row], max(s[first + e][0], s[first + e][1]));
    }
    #[unroll]
    for row in 0..2usize {
        largest[row] = quad_max::<A>(largest[row]);
    }
    largest
}

/// A forward plane's running softmax in base 2 ([`LOG2_E`]): for each block, each of the
/// lane's two rows' largest score times `scale · log2 e`, `m`, and its sum of
/// `2^(scale · log2 e · s − m)` over its own columns, `l`; and the output accumulators `o`,
/// `hd / 8` products a block.
#[derive(CubeType)]
struct Running<A: Float> {
    m: Products<A>,
    l: Products<A>,
    o: Products<A>,
}

#[cube]
impl<A: Float> Running<A> {
    fn new(#[comptime] head_dim: usize, #[comptime] blocks: usize) -> Running<A> {
        let mut m = Array::<Two<A>>::new(blocks);
        let mut l = Array::<Two<A>>::new(blocks);
        #[unroll]
        for b in 0..blocks {
            m[b] = Two::<A>::new(A::min_value());
            l[b] = Two::<A>::new(A::new(0.0));
        }
        Running::<A> {
            m,
            l,
            o: zeroed::<A>(comptime!(blocks * head_dim / 8)),
        }
    }
}

/// One key tile of the forward for the plane's blocks: `s = q kᵀ`, each block's rows' new max,
/// `p = 2^(scale_log2 · s − m)` in place of `s` (`scale_log2`: the scale times `log2 e`), the
/// sums; the output rescaled where a row's max rose; `o += p v`. The tile's keys are at
/// `k_origin` of `tiles`, its values a tile on. On a tile that reaches the diagonal
/// (`diagonal`) keys after a row are masked first.
#[allow(clippy::too_many_arguments)]
#[cube]
fn forward_tile<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    q_frags: &Sequence<Fragment<F>>,
    tiles: &SharedMemory<F>,
    run: &mut Running<A>,
    quad: &Quad,
    start: usize,
    diagonal: bool,
    scale_log2: A,
    k_origin: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
) {
    let v_origin = k_origin + comptime!(16 * planes * tile_stride(head_dim));
    let mut s = scores::<F, A>(mma, q_frags, tiles, k_origin, head_dim, planes, blocks);
    let mut alpha = Array::<Two<A>>::new(blocks);
    let mut same = true;
    #[unroll]
    for b in 0..blocks {
        // Two calls, as the mask's flag is compile-time: with the mask in a branch of its own,
        // ptxas spilled at hd 128 on sm_80.
        let largest = if diagonal {
            row_max::<A>(&mut s, quad, start, planes, b, true)
        } else {
            row_max::<A>(&mut s, quad, start, planes, b, false)
        };
        let m = run.m[b];
        let mut m_new = m;
        let mut a = Two::<A>::new(A::new(1.0));
        #[unroll]
        for row in 0..2usize {
            m_new[row] = max(m[row], largest[row] * scale_log2);
            // 1 where the max stays: the skipped rescale below needs exactly that.
            a[row] = select(
                m_new[row] == m[row],
                A::new(1.0),
                A::new(2.0).powf(m[row] - m_new[row]),
            );
        }
        // p = 2^(scale_log2 · s − m_new) in place (one FFMA before the exp); each lane sums
        // its own columns (the quad's sums are added once, at the end).
        let mut sum = Two::<A>::new(A::new(0.0));
        #[unroll]
        for e in 0..comptime!(4 * planes) {
            let at = comptime!(4 * planes * b + e);
            let row = e % 2;
            let p = exp2::<A>(s[at] * Two::<A>::new(scale_log2) - Two::<A>::new(m_new[row]));
            s[at] = p;
            sum[row] += p[0] + p[1];
        }
        run.l[b] = run.l[b] * a + sum;
        same = same && m_new[0] == m[0] && m_new[1] == m[1];
        run.m[b] = m_new;
        alpha[b] = a;
    }
    // Where no row of the plane has a new max, α = 1: later tiles rarely raise a row's max
    // once its largest score has been seen. The vote is the plane's, so the branch is uniform.
    if !plane_all(same) {
        #[unroll]
        for e in 0..comptime!(blocks * head_dim / 4) {
            let b = comptime!(e / (head_dim / 4));
            run.o[e] = run.o[e] * Two::<A>::new(alpha[b][e % 2]);
        }
    }
    accumulate::<F, A>(
        mma, &s, tiles, &mut run.o, v_origin, head_dim, planes, blocks,
    );
}

#[cube(launch_unchecked, fast_math = softmax_math())]
pub(crate) fn forward_kernel<F: Float, A: Float>(
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
    let block = QueryBlock::new::<F>(q, k, v, planes, blocks);
    let (seq, heads, b, h, row0) = (block.seq, block.heads, block.b, block.h, block.row0);
    // Each stage a key tile, then a value tile: room to stage the cube's query rows first.
    let mut tiles = padded_tile::<F>(head_dim, planes, comptime!(2 * stages));
    let mma = MmaDefinition::<F, F, A>::new(16usize, 8usize, 16usize);
    let quad = Quad::new(row0, blocks);
    let scale_log2 = A::cast_from(scale) * A::new(LOG2_E);

    let q_base = row_at(q, b, h, 0);
    let q_frags = plane_fragments::<F, A>(
        &mma, q, &mut tiles, q_base, row0, seq, head_dim, planes, blocks,
    );

    let mut run = Running::<A>::new(head_dim, blocks);
    let mut walk = KeyWalk::new::<F>(k, v, &mut tiles, &block, head_dim, planes, stages);
    while walk.start < block.end {
        walk.tile_ready::<F>(k, v, &mut tiles, &block, head_dim, planes, stages);
        // Only the cube's last tiles, from its first row on, have keys after a row; of those
        // a plane skips the ones past all its rows.
        if walk.start < block.plane_end {
            let diagonal = walk.start >= row0;
            forward_tile::<F, A>(
                &mma,
                &q_frags,
                &tiles,
                &mut run,
                &quad,
                walk.start,
                diagonal,
                scale_log2,
                walk.origin(head_dim, planes, stages),
                head_dim,
                planes,
                blocks,
            );
        }
        walk.tile_done(planes, stages);
    }

    #[unroll]
    for blk in 0..blocks {
        let mut factor = Two::<A>::new(A::new(0.0));
        #[unroll]
        for row in 0..2usize {
            let l_row = quad_sum::<A>(run.l[blk][row]);
            factor[row] = A::new(1.0) / l_row;
            let i = quad.i + comptime!(16 * blk + row * 8);
            if i < seq && quad.t == 0 {
                // `m` is in base 2; `lse` is the natural log's.
                lse[(b * heads + h) * seq + i] =
                    run.m[blk][row] * A::new(std::f32::consts::LN_2) + l_row.ln();
            }
        }
        write_rows::<F, A>(
            out,
            row_at(out, b, h, 0),
            &run.o,
            &quad,
            seq,
            factor,
            head_dim,
            blk,
        );
    }
}

/// Keys `start ..` of the cube's group into the first tile of stage `stage` of `tiles`, their
/// values into the second: loaded with one stage; with two, copied (`cp.async`), in shared
/// memory once the unit has passed `sync_storage`.
#[allow(clippy::too_many_arguments)]
#[cube]
fn load_keys_values<F: Float>(
    k: &Tensor<Chunk<F>>,
    v: &Tensor<Chunk<F>>,
    tiles: &mut SharedMemory<F>,
    block: &QueryBlock,
    start: usize,
    stage: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] stages: usize,
) {
    let rows = comptime!(16 * planes);
    let copies = comptime!(stages == 2);
    let (seq, k_row0) = (block.seq, stage * comptime!(2 * rows));
    load_tile_at::<F>(
        k,
        tiles,
        block.k_base,
        start,
        seq,
        k_row0,
        head_dim,
        planes,
        PAD_CHUNKS,
        copies,
    );
    load_tile_at::<F>(
        v,
        tiles,
        block.v_base,
        start,
        seq,
        k_row0 + rows,
        head_dim,
        planes,
        PAD_CHUNKS,
        copies,
    );
}

/// A forward or `dQ` cube's walk over its key tiles, each a key tile and its value tile in a
/// stage of `tiles`. With one stage a tile is loaded, then computed, with a barrier after
/// each. With two, FlashAttention-2's pipeline: the next tile's `cp.async` copies run into
/// the other stage while the cube computes this one, and one barrier a tile sees both that a
/// tile has landed and that every plane is done with the stage the next copies overwrite.
#[derive(CubeType)]
struct KeyWalk {
    /// The tile's first key.
    start: usize,
    /// Its stage (0 or 1).
    stage: usize,
}

#[cube]
impl KeyWalk {
    /// At the first tile (the cube's query rows staged and read: `tiles` is free); with two
    /// stages, its copies started.
    #[allow(clippy::too_many_arguments)]
    fn new<F: Float>(
        k: &Tensor<Chunk<F>>,
        v: &Tensor<Chunk<F>>,
        tiles: &mut SharedMemory<F>,
        block: &QueryBlock,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
        #[comptime] stages: usize,
    ) -> KeyWalk {
        comptime!(assert!(stages == 1 || stages == 2, "one or two stages"));
        if comptime!(stages == 2) {
            load_keys_values::<F>(k, v, tiles, block, 0usize, 0usize, head_dim, planes, stages);
        }
        KeyWalk { start: 0, stage: 0 }
    }

    /// This tile in shared memory for every plane; with two stages, the next tile's copies
    /// (where the walk has one) started into the other stage.
    #[allow(clippy::too_many_arguments)]
    fn tile_ready<F: Float>(
        &self,
        k: &Tensor<Chunk<F>>,
        v: &Tensor<Chunk<F>>,
        tiles: &mut SharedMemory<F>,
        block: &QueryBlock,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
        #[comptime] stages: usize,
    ) {
        if comptime!(stages == 2) {
            // This unit's copies landed, then the barrier: everyone's did, and every plane is
            // done with the last tile, in the stage the next copies go to.
            sync_storage();
            let next = self.start + comptime!(16 * planes);
            if next < block.end {
                let other = 1 - self.stage;
                load_keys_values::<F>(k, v, tiles, block, next, other, head_dim, planes, stages);
            }
        } else {
            load_keys_values::<F>(
                k, v, tiles, block, self.start, 0usize, head_dim, planes, stages,
            );
            sync_cube();
        }
    }

    /// Where the tile's keys are in `tiles`: elements (its values are a tile on), stage
    /// `stage` of the rows [`load_keys_values`] fills ([`read_stage`]).
    fn origin(
        &self,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
        #[comptime] stages: usize,
    ) -> usize {
        read_stage(self.stage, self.start, stages) * comptime!(32 * planes * tile_stride(head_dim))
    }

    /// On to the next tile (with one stage, once every plane is done with this one).
    fn tile_done(&mut self, #[comptime] planes: usize, #[comptime] stages: usize) {
        if comptime!(stages == 1) {
            sync_cube();
        } else {
            self.stage = 1 - self.stage;
        }
        self.start += comptime!(16 * planes);
    }
}

/// The stage a walk's tile is in (`stage`; its first row `start`), as its products read it.
/// With one stage that is 0, written `start >> 31`: 0 for every row lab reaches (the kernels
/// index in 32 bits, and a head's rows at 16 columns or more in chunks of 8 keep
/// `seq · hd / 8 < 2^32`, so rows stay below 2^31), but not a constant to the compiler. With a
/// constant stage each `ldmatrix` address of a tile is the same every tile, and ptxas kept them
/// all in registers: `dK/dV` at hd 64 took 254 on sm_90a at one stage where two take 168.
#[cube]
fn read_stage(stage: usize, start: usize, #[comptime] stages: usize) -> usize {
    if comptime!(stages == 1) {
        start >> 31usize
    } else {
        stage
    }
}

/// The plane's `blocks` blocks of 16 rows of the `[16 · planes · blocks, hd]` block at `row0`
/// of the head whose row 0 is at `base` of `src`, as `A` fragments ([`query_fragments`]),
/// staged through `tile` (`blocks` tiles long).
#[allow(clippy::too_many_arguments)]
#[cube]
fn plane_fragments<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    src: &Tensor<Chunk<F>>,
    tile: &mut SharedMemory<F>,
    base: usize,
    row0: usize,
    seq: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
) -> Sequence<Fragment<F>> {
    #[unroll]
    for part in 0..blocks {
        let first = comptime!(16 * planes * part);
        load_tile_at::<F>(
            src,
            tile,
            base,
            row0 + first,
            seq,
            first,
            head_dim,
            planes,
            PAD_CHUNKS,
            false,
        );
    }
    sync_cube();
    let frags = query_fragments::<F, A>(mma, tile, head_dim, blocks);
    sync_cube();
    frags
}

/// A row statistic (`lse_log2` or `D`, `[B, H, T]`) of the lane's two rows of each of `blocks`
/// blocks (block `m`'s at `m`); 0 past the sequence.
#[cube]
fn row_values<A: Float>(
    t: &Tensor<A>,
    at: usize,
    i: usize,
    seq: usize,
    #[comptime] blocks: usize,
) -> Products<A> {
    let mut values = Array::<Two<A>>::new(blocks);
    #[unroll]
    for m in 0..blocks {
        let mut x = Two::<A>::new(A::new(0.0));
        #[unroll]
        for row in 0..2usize {
            let r = i + comptime!(16 * m + row * 8);
            if r < seq {
                x[row] = t[at + r];
            }
        }
        values[m] = x;
    }
    values
}

/// One tile's `dQ += dS K` for each of the plane's `blocks` blocks of rows, 16 keys at a
/// time: for keys `16j ..`, `p = exp(scale · q·k − lse)`, taken in base 2 as the forward
/// does ([`LOG2_E`]: `2^(scale_log2 · q·k − lse_log2)`; 0 after the row where the tile reaches
/// the `diagonal`), `dS = p (dO·v − D)`, then `dS` as the `A` fragment of the product with
/// those keys. The tile's keys are at `k_origin` of `tiles`, its values a tile on; `lse_log2`
/// (`lse · log2 e`) and `delta` hold the lane's rows' (block `m`'s at `m`).
#[allow(clippy::too_many_arguments)]
#[cube]
fn grad_q_tile<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    q_frags: &Sequence<Fragment<F>>,
    do_frags: &Sequence<Fragment<F>>,
    tiles: &SharedMemory<F>,
    dq: &mut Products<A>,
    quad: &Quad,
    start: usize,
    diagonal: bool,
    scale_log2: A,
    lse_log2: &Products<A>,
    delta: &Products<A>,
    k_origin: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
) {
    let v_origin = k_origin + comptime!(16 * planes * tile_stride(head_dim));
    #[unroll]
    for j in 0..planes {
        let mut s = pair_products::<F, A>(mma, q_frags, tiles, k_origin, j, head_dim, blocks);
        if diagonal {
            #[unroll]
            for m in 0..blocks {
                mask_outside_causal::<A>(&mut s, quad, start + j * 16, 2usize, m, false);
            }
        }
        let dp = pair_products::<F, A>(mma, do_frags, tiles, v_origin, j, head_dim, blocks);
        #[unroll]
        for m in 0..blocks {
            #[unroll]
            for e in 0..4usize {
                let (at, row) = (comptime!(4 * m + e), e % 2);
                let p =
                    exp2::<A>(s[at] * Two::<A>::new(scale_log2) - Two::<A>::new(lse_log2[m][row]));
                s[at] = p * (dp[at] - Two::<A>::new(delta[m][row]));
            }
        }
        accumulate_pair::<F, A>(mma, &s, tiles, dq, k_origin, j, head_dim, blocks);
    }
}

#[cube(launch_unchecked, fast_math = softmax_math())]
pub(crate) fn grad_q_kernel<F: Float, A: Float>(
    q: &Tensor<Chunk<F>>,
    k: &Tensor<Chunk<F>>,
    v: &Tensor<Chunk<F>>,
    d_out: &Tensor<Chunk<F>>,
    lse_log2: &Tensor<A>,
    delta: &Tensor<A>,
    d_q: &mut Tensor<F>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] blocks: usize,
    #[comptime] stages: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let block = QueryBlock::new::<F>(q, k, v, planes, blocks);
    let (seq, heads, b, h, row0) = (block.seq, block.heads, block.b, block.h, block.row0);
    // Each stage a key tile, then a value tile: room to stage the cube's query rows first.
    let mut tiles = padded_tile::<F>(head_dim, planes, comptime!(2 * stages));
    let mma = MmaDefinition::<F, F, A>::new(16usize, 8usize, 16usize);
    let quad = Quad::new(row0, blocks);
    let scale = A::cast_from(scale);
    let scale_log2 = scale * A::new(LOG2_E);

    let (q_base, do_base) = (row_at(q, b, h, 0), row_at(d_out, b, h, 0));
    let q_frags = plane_fragments::<F, A>(
        &mma, q, &mut tiles, q_base, row0, seq, head_dim, planes, blocks,
    );
    let do_frags = plane_fragments::<F, A>(
        &mma, d_out, &mut tiles, do_base, row0, seq, head_dim, planes, blocks,
    );
    let stats_at = (b * heads + h) * seq;
    let lse_log2_i = row_values::<A>(lse_log2, stats_at, quad.i, seq, blocks);
    let delta_i = row_values::<A>(delta, stats_at, quad.i, seq, blocks);

    let mut dq = zeroed::<A>(comptime!(blocks * head_dim / 8));
    let mut walk = KeyWalk::new::<F>(k, v, &mut tiles, &block, head_dim, planes, stages);
    while walk.start < block.end {
        walk.tile_ready::<F>(k, v, &mut tiles, &block, head_dim, planes, stages);
        // Only the cube's last tiles, from its first row on, have keys after a row; of those
        // a plane skips the ones past all its rows.
        if walk.start < block.plane_end {
            let diagonal = walk.start >= row0;
            grad_q_tile::<F, A>(
                &mma,
                &q_frags,
                &do_frags,
                &tiles,
                &mut dq,
                &quad,
                walk.start,
                diagonal,
                scale_log2,
                &lse_log2_i,
                &delta_i,
                walk.origin(head_dim, planes, stages),
                head_dim,
                planes,
                blocks,
            );
        }
        walk.tile_done(planes, stages);
    }
    #[unroll]
    for blk in 0..blocks {
        let factor = Two::<A>::new(scale);
        write_rows::<F, A>(
            d_q,
            row_at(d_q, b, h, 0),
            &dq,
            &quad,
            seq,
            factor,
            head_dim,
            blk,
        );
    }
}

/// Writes the lane's elements of block `block` of `acc` (`hd / 8` products a block: the
/// plane's rows of a `[., hd]` result), times `factor` (a row's own: element `row`), to the
/// rows inside the sequence of the head whose row 0 is at `base` in `dst` (rows
/// `dst.stride(2)` apart).
#[cube]
fn write_rows<F: Float, A: Float>(
    dst: &mut Tensor<F>,
    base: usize,
    acc: &Products<A>,
    quad: &Quad,
    seq: usize,
    factor: Two<A>,
    #[comptime] head_dim: usize,
    #[comptime] block: usize,
) {
    let first = comptime!(block * head_dim / 4);
    #[unroll]
    for row in 0..2usize {
        let i = quad.i + comptime!(16 * block + row * 8);
        if i < seq {
            // Element by element: the output's strides need not be even.
            let to = base + i * dst.stride(2) + 2 * quad.t;
            #[unroll]
            for n in 0..comptime!(head_dim / 8) {
                let x = acc[first + 2 * n + row];
                #[unroll]
                for j in 0..2usize {
                    dst[to + n * 8 + j] = F::cast_from(x[j] * factor[row]);
                }
            }
        }
    }
}

/// One tile of queries' share of `dK` and `dV` for the plane's 16 key rows, 16 queries at a
/// time: for queries `16j ..`, `pᵀ = exp(scale · k·q − lse)`, taken in base 2 as the forward
/// does (`2^(scale_log2 · k·q − lse_log2)`; 0 before the key, which only a `diagonal` tile
/// has: it is masked); `dV += Pᵀ dO`; `dSᵀ = pᵀ (v·dO − D)`; `dK += dSᵀ Q`. The tile's rows of
/// `q` and `dO` are at `origin` of their `tiles`, its `lse_log2` and `D` at `stats_at` of
/// theirs.
#[allow(clippy::too_many_arguments)]
#[cube]
fn grad_kv_tile<F: Float, A: Float>(
    mma: &MmaDefinition<F, F, A>,
    k_frags: &Sequence<Fragment<F>>,
    v_frags: &Sequence<Fragment<F>>,
    tiles: &QueryTiles<F, A>,
    dk: &mut Products<A>,
    dv: &mut Products<A>,
    quad: &Quad,
    start: usize,
    scale_log2: A,
    origin: usize,
    stats_at: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] grads: KvGrads,
    #[comptime] diagonal: bool,
) {
    #[unroll]
    for j in 0..planes {
        let mut s = pair_products::<F, A>(mma, k_frags, &tiles.q, origin, j, head_dim, 1usize);
        // Only the diagonal tile has a query before a key row.
        if comptime!(diagonal) {
            mask_outside_causal::<A>(&mut s, quad, start + j * 16, 2usize, 0usize, true);
        }
        // One FFMA and one `2^x` an element: `lse_log2` comes in base 2 (the `D` kernel's).
        #[unroll]
        for e in 0..4usize {
            // The element's query columns, as `lse_log2` and `D` index them.
            let col = stats_at + j * 16 + (e / 2) * 8 + 2 * quad.t;
            let lse_log2 = pair::<A>(&tiles.lse_log2, col, 0);
            s[e] = exp2::<A>(s[e] * Two::<A>::new(scale_log2) - lse_log2);
        }
        if comptime!(grads.values()) {
            accumulate_pair::<F, A>(mma, &s, &tiles.d_out, dv, origin, j, head_dim, 1usize);
        }
        if comptime!(grads.keys()) {
            let dp = pair_products::<F, A>(mma, v_frags, &tiles.d_out, origin, j, head_dim, 1usize);
            #[unroll]
            for e in 0..4usize {
                let col = stats_at + j * 16 + (e / 2) * 8 + 2 * quad.t;
                s[e] = s[e] * (dp[e] - pair::<A>(&tiles.delta, col, 0));
            }
            accumulate_pair::<F, A>(mma, &s, &tiles.q, dk, origin, j, head_dim, 1usize);
        }
    }
}

/// Where a `dK/dV` cube works: key rows `row0 .. row0 + 16 · planes` of key/value head `kvh`
/// of sequence `b` (of `seq` rows), whose rows start at `k_base` and `v_base`; the queries of
/// the `group` heads (of `heads`) that share it.
#[derive(CubeType)]
struct KeyBlock {
    seq: usize,
    heads: usize,
    group: usize,
    b: usize,
    kvh: usize,
    row0: usize,
    k_base: usize,
    v_base: usize,
}

#[cube]
impl KeyBlock {
    fn new<F: Float>(
        q: &Tensor<Chunk<F>>,
        k: &Tensor<Chunk<F>>,
        v: &Tensor<Chunk<F>>,
        #[comptime] planes: usize,
    ) -> KeyBlock {
        let (heads, kv_heads) = (q.shape(1), k.shape(1));
        let (b, kvh) = (CUBE_POS_Z as usize, CUBE_POS_Y as usize);
        KeyBlock {
            seq: q.shape(2),
            heads,
            group: heads / kv_heads,
            b,
            kvh,
            row0: CUBE_POS_X as usize * comptime!(16 * planes),
            k_base: row_at(k, b, kvh, 0),
            v_base: row_at(v, b, kvh, 0),
        }
    }
}

/// A `dK/dV` cube's query tiles in shared memory, `stages` of each: rows of `q` and `dO`
/// ([`padded_tile`]), and their `lse_log2` and (`dK` only) `D`.
#[derive(CubeType)]
struct QueryTiles<F: Float, A: Float> {
    q: SharedMemory<F>,
    d_out: SharedMemory<F>,
    lse_log2: SharedMemory<A>,
    delta: SharedMemory<A>,
}

/// The `dK/dV` kernel's query-side inputs, which its walk loads tile by tile: `q`, `dO`, and
/// the rows' `lse_log2` and `D` (`[B, H, T]`).
#[derive(CubeType)]
struct QueryInputs<F: Float, A: Float> {
    q: Tensor<Chunk<F>>,
    d_out: Tensor<Chunk<F>>,
    lse_log2: Tensor<A>,
    delta: Tensor<A>,
}

/// Queries `start ..` of head `g` of the cube's group into stage `stage` of `tiles`: their rows
/// of `q` and `dO`, their `lse_log2` and (`keys`) `D`. Loaded with one stage; with two, copied
/// (`cp.async`), in shared memory once the unit has passed `sync_storage`.
#[allow(clippy::too_many_arguments)]
#[cube]
fn load_queries<F: Float, A: Float>(
    inputs: &QueryInputs<F, A>,
    tiles: &mut QueryTiles<F, A>,
    block: &KeyBlock,
    g: usize,
    start: usize,
    stage: usize,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] keys: bool,
    #[comptime] stages: usize,
) {
    let rows = comptime!(16 * planes);
    let copies = comptime!(stages == 2);
    let (seq, b, head) = (block.seq, block.b, block.kvh * block.group + g);
    let head_rows = (b * block.heads + head) * seq;
    let tile_row0 = stage * rows;
    load_row_stats::<A>(
        &inputs.lse_log2,
        &inputs.delta,
        &mut tiles.lse_log2,
        &mut tiles.delta,
        head_rows,
        start,
        seq,
        tile_row0,
        rows,
        keys,
        copies,
    );
    load_tile_at::<F>(
        &inputs.q,
        &mut tiles.q,
        row_at(&inputs.q, b, head, 0),
        start,
        seq,
        tile_row0,
        head_dim,
        planes,
        PAD_CHUNKS,
        copies,
    );
    load_tile_at::<F>(
        &inputs.d_out,
        &mut tiles.d_out,
        row_at(&inputs.d_out, b, head, 0),
        start,
        seq,
        tile_row0,
        head_dim,
        planes,
        PAD_CHUNKS,
        copies,
    );
}

/// A `dK/dV` cube's walk over its query tiles, each tile's `q`, `dO`, `lse_log2` and `D` in a stage
/// of the query tiles. For each head of the group, its diagonal tile (the queries from the
/// cube's first key row), the only one that needs the causal mask, and the tiles past it.
/// First every head's tiles past the diagonal, then every head's diagonal tile, so that the
/// first can be a loop of their own, without the mask ([`grad_kv_tiles`]). As [`KeyWalk`]:
/// with one stage a tile is loaded, then computed; with two, the next tile's copies run while
/// the cube computes this one.
#[derive(CubeType)]
struct QueryWalk {
    /// The tile's head in the group.
    g: usize,
    /// Its first query: the cube's first key row on a diagonal tile, a later row past it.
    start: usize,
    /// Its stage (0 or 1).
    stage: usize,
}

#[cube]
impl QueryWalk {
    /// At the first tile (the key and value rows staged and read: the tiles are free); with
    /// two stages, its copies started.
    #[allow(clippy::too_many_arguments)]
    fn new<F: Float, A: Float>(
        inputs: &QueryInputs<F, A>,
        tiles: &mut QueryTiles<F, A>,
        block: &KeyBlock,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
        #[comptime] grads: KvGrads,
        #[comptime] stages: usize,
    ) -> QueryWalk {
        comptime!(assert!(stages == 1 || stages == 2, "one or two stages"));
        let keys = comptime!(grads.keys());
        let mut start = block.row0;
        let past = block.row0 + comptime!(16 * planes);
        if past < block.seq {
            start = past;
        }
        if comptime!(stages == 2) {
            load_queries::<F, A>(
                inputs, tiles, block, 0usize, start, 0usize, head_dim, planes, keys, stages,
            );
        }
        QueryWalk {
            g: 0,
            start,
            stage: 0,
        }
    }

    /// Whether the tile is one past the diagonal (the first loop's).
    fn past_diagonal(&self, block: &KeyBlock) -> bool {
        self.start != block.row0
    }

    /// Whether a tile is left: any (`diagonal`), or one past the diagonal.
    fn more(&self, block: &KeyBlock, #[comptime] diagonal: bool) -> bool {
        if comptime!(diagonal) {
            self.g < block.group
        } else {
            // Past the diagonal only while the walk is in the group (`next`; a launch has a
            // group of at least one head, `Dims::of`).
            self.past_diagonal(block)
        }
    }

    /// The tile after this one in the walk's order, as `(g, start)`; `g` is the group's size
    /// after the last.
    fn next(&self, block: &KeyBlock, #[comptime] planes: usize) -> (usize, usize) {
        let rows = comptime!(16 * planes);
        let mut g = self.g;
        let mut start = self.start + rows;
        if !self.past_diagonal(block) {
            // The next head's diagonal tile.
            start = block.row0;
            g += 1;
        } else if start >= block.seq {
            // The next head's first tile past the diagonal (one exists, as this head had one),
            // or after the last head's, the first diagonal tile.
            g += 1;
            start = block.row0 + rows;
            if g >= block.group {
                g = 0;
                start = block.row0;
            }
        }
        (g, start)
    }

    /// This tile in shared memory for every plane; with two stages, the next tile's copies
    /// (where the walk has one) started into the other stage.
    #[allow(clippy::too_many_arguments)]
    fn tile_ready<F: Float, A: Float>(
        &self,
        inputs: &QueryInputs<F, A>,
        tiles: &mut QueryTiles<F, A>,
        block: &KeyBlock,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
        #[comptime] grads: KvGrads,
        #[comptime] stages: usize,
    ) {
        let keys = comptime!(grads.keys());
        if comptime!(stages == 2) {
            // This unit's copies landed, then the barrier: everyone's did, and every plane is
            // done with the last tile, in the stage the next copies go to.
            sync_storage();
            let (g, next) = self.next(block, planes);
            if g < block.group {
                load_queries::<F, A>(
                    inputs,
                    tiles,
                    block,
                    g,
                    next,
                    1 - self.stage,
                    head_dim,
                    planes,
                    keys,
                    stages,
                );
            }
        } else {
            load_queries::<F, A>(
                inputs, tiles, block, self.g, self.start, 0usize, head_dim, planes, keys, stages,
            );
            sync_cube();
        }
    }

    /// Where the tile's `q` and `dO` rows are in their tiles (elements), and its `lse_log2` and `D`
    /// in theirs: stage `stage` of what [`load_queries`] fills ([`read_stage`]), as
    /// [`KeyWalk::origin`].
    fn origins(
        &self,
        #[comptime] head_dim: usize,
        #[comptime] planes: usize,
        #[comptime] stages: usize,
    ) -> (usize, usize) {
        let rows = comptime!(16 * planes);
        let stage = read_stage(self.stage, self.start, stages);
        (
            stage * comptime!(rows * tile_stride(head_dim)),
            stage * rows,
        )
    }

    /// On to the next tile (with one stage, once every plane is done with this one).
    fn tile_done(
        &mut self,
        block: &KeyBlock,
        #[comptime] planes: usize,
        #[comptime] stages: usize,
    ) {
        if comptime!(stages == 1) {
            sync_cube();
        } else {
            self.stage = 1 - self.stage;
        }
        let (g, start) = self.next(block, planes);
        self.g = g;
        self.start = start;
    }
}

/// The walk's tiles into `dk` and `dv` ([`grad_kv_tile`]): those past the diagonal, unmasked
/// (`diagonal` false), or all the rest, masked (true). A loop of each, 10 to 26 % shorter
/// without the mask than with it (BENCHMARKS.md, "`dK/dV` in base 2 …"). In one loop, before
/// the launch bounds, ptxas took 175–176 registers at hd 64 with the mask in a branch, and
/// 170–172 with two calls of the tile, masked and not, under one.
#[allow(clippy::too_many_arguments)]
#[cube]
fn grad_kv_tiles<F: Float, A: Float>(
    walk: &mut QueryWalk,
    inputs: &QueryInputs<F, A>,
    tiles: &mut QueryTiles<F, A>,
    block: &KeyBlock,
    mma: &MmaDefinition<F, F, A>,
    k_frags: &Sequence<Fragment<F>>,
    v_frags: &Sequence<Fragment<F>>,
    dk: &mut Products<A>,
    dv: &mut Products<A>,
    quad: &Quad,
    scale_log2: A,
    #[comptime] head_dim: usize,
    #[comptime] planes: usize,
    #[comptime] grads: KvGrads,
    #[comptime] stages: usize,
    #[comptime] diagonal: bool,
) {
    while walk.more(block, diagonal) {
        walk.tile_ready::<F, A>(inputs, tiles, block, head_dim, planes, grads, stages);
        let (origin, stats_at) = walk.origins(head_dim, planes, stages);
        grad_kv_tile::<F, A>(
            mma, k_frags, v_frags, tiles, dk, dv, quad, walk.start, scale_log2, origin, stats_at,
            head_dim, planes, grads, diagonal,
        );
        walk.tile_done(block, planes, stages);
    }
}

#[cube(launch_unchecked, fast_math = softmax_math())]
pub(crate) fn grad_kv_kernel<F: Float, A: Float>(
    q: &Tensor<Chunk<F>>,
    k: &Tensor<Chunk<F>>,
    v: &Tensor<Chunk<F>>,
    d_out: &Tensor<Chunk<F>>,
    lse_log2: &Tensor<A>,
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
    // At least three cubes of 128 threads an SM from hd 64 on: ptxas keeps to 168 registers a
    // thread (`__launch_bounds__(128, 3)`, from this comment: cubecl_cpp's
    // `MIN_CUBES_COMMENT`, vendor/cubecl-cpp/LAB-PATCH.md). Without it, hd 64
    // took 170 (sm_80) and 174 (sm_90a), and the two loops (`grad_kv_tiles`) took `dK` at hd
    // 128 to 247 and `dV` to 180–183: two cubes. Narrower heads stay below on their own, and
    // the bound would let ptxas take more (hd 16: 69 to 109 registers, fewer cubes).
    if comptime!(head_dim >= 64) {
        comment!("lab: cubes an SM 3");
    }
    let rows = comptime!(16 * planes);
    let (keys, values) = comptime!((grads.keys(), grads.values()));
    let block = KeyBlock::new::<F>(q, k, v, planes);
    let (seq, b, kvh, row0) = (block.seq, block.b, block.kvh, block.row0);
    // `D` for `dS` (`dK` only).
    let delta_len = comptime!(if keys { rows * stages } else { 2 });
    let mut tiles = QueryTiles::<F, A> {
        q: padded_tile::<F>(head_dim, planes, stages),
        d_out: padded_tile::<F>(head_dim, planes, stages),
        lse_log2: SharedMemory::<A>::new_aligned(comptime!(rows * stages), TILE_ALIGN),
        delta: SharedMemory::<A>::new_aligned(delta_len, TILE_ALIGN),
    };
    let mma = MmaDefinition::<F, F, A>::new(16usize, 8usize, 16usize);
    // Here the lane's rows are key rows; its columns are query rows.
    let quad = Quad::new(row0, 1usize);
    // `scale` itself is read again for `dK` at the end, not held through the walk.
    let scale_log2 = A::cast_from(scale) * A::new(LOG2_E);

    let k_frags = plane_fragments::<F, A>(
        &mma,
        k,
        &mut tiles.q,
        block.k_base,
        row0,
        seq,
        head_dim,
        planes,
        1usize,
    );
    let v_frags = if comptime!(keys) {
        plane_fragments::<F, A>(
            &mma,
            v,
            &mut tiles.q,
            block.v_base,
            row0,
            seq,
            head_dim,
            planes,
            1usize,
        )
    } else {
        Sequence::<Fragment<F>>::new()
    };
    // One unused product where a launch leaves a gradient to the other.
    let mut dk = zeroed::<A>(comptime!(if keys { head_dim / 8 } else { 1 }));
    let mut dv = zeroed::<A>(comptime!(if values { head_dim / 8 } else { 1 }));

    let inputs = QueryInputs::<F, A> {
        q: *q,
        d_out: *d_out,
        lse_log2: *lse_log2,
        delta: *delta,
    };
    let mut walk =
        QueryWalk::new::<F, A>(&inputs, &mut tiles, &block, head_dim, planes, grads, stages);
    // The tiles past the diagonal unmasked (pass 0); then the rest, masked (pass 1).
    #[unroll]
    for pass in 0..2usize {
        grad_kv_tiles::<F, A>(
            &mut walk,
            &inputs,
            &mut tiles,
            &block,
            &mma,
            &k_frags,
            &v_frags,
            &mut dk,
            &mut dv,
            &quad,
            scale_log2,
            head_dim,
            planes,
            grads,
            stages,
            comptime!(pass == 1),
        );
    }
    if comptime!(keys) {
        let factor = Two::<A>::new(A::cast_from(scale));
        write_rows::<F, A>(
            d_k,
            row_at(d_k, b, kvh, 0),
            &dk,
            &quad,
            seq,
            factor,
            head_dim,
            0usize,
        );
    }
    if comptime!(values) {
        let factor = Two::<A>::new(A::new(1.0));
        write_rows::<F, A>(
            d_v,
            row_at(d_v, b, kvh, 0),
            &dv,
            &quad,
            seq,
            factor,
            head_dim,
            0usize,
        );
    }
}
