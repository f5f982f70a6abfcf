// The emulation's own checks (include/emu.h): small kernels, written here by hand, whose
// outcome is known. Run by kernels/src/cuda_emulation.rs's test, one case a run (`selftest
// CASE`; `selftest --list` names them all): a case that is right must end with exit 0, a race
// must end the run naming it, a barrier that some threads never reach must end it as a hang
// (exit 124). Without these, a fault in the emulation that let races or hangs through would
// pass every kernel's test.
#include "emu.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

using emu::Shared;

// Thread 0 writes `m[0]`, thread `reader` copies it into `m[1]`; between them a barrier of
// the block, of the warp, or a shuffle (which orders no memory). `m`: shared or global memory.
enum Between { block_barrier, warp_barrier, shuffle, nothing };

template <class Memory>
__device__ void write_then_read_in(Memory m, unsigned reader, int between) {
    unsigned t = threadIdx.x;
    if (t == 0) m[0] = 42.0f;
    if (between == block_barrier) __syncthreads();
    if (between == warp_barrier) __syncwarp();
    if (between == shuffle) (void)__shfl_xor_sync(-1, t, 1);
    if (t == reader) m[1] = m[0];
}

__global__ void write_then_read(float* out, unsigned reader, int between) {
    Shared<float> s{0};
    write_then_read_in(s, reader, between);
    if (threadIdx.x == reader) out[0] = s[1];
}

__global__ void global_write_then_read(emu::Global<float> g, unsigned reader, int between) {
    write_then_read_in(g, reader, between);
}

// After a barrier, the thread that ended its phase (the last, 63, which goes on first) writes
// and thread 0 reads, unordered: what each had seen at the barrier must not include the other's
// later steps.
__global__ void last_writes(float* out) {
    Shared<float> s{0};
    unsigned t = threadIdx.x;
    __syncthreads();
    if (t == 63) s[0] = 1.0f;
    if (t == 0) out[0] = s[0];
    __syncthreads();
}

// Threads 0 and 1 write the same bytes, unordered: a write after a write.
__global__ void both_write(float*) {
    Shared<float> s{0};
    unsigned t = threadIdx.x;
    if (t < 2) s[0] = float(t);
}

// Lanes 0 to 30 at __syncwarp while lane 31 shuffles (undefined on a GPU); lane 31 then writes
// what lane 0 reads, unordered.
__global__ void mixed_meetings(float* out) {
    Shared<float> s{0};
    unsigned t = threadIdx.x;
    if (t < 31) __syncwarp();
    else (void)__shfl_xor_sync(-1, t, 1);
    if (t == 31) s[0] = 1.0f;
    if (t == 0) out[0] = s[0];
    __syncthreads();
}

// Thread 1 reads `m[0]` (into `m[2]`), then thread 0 writes it, with only a shuffle between:
// a write after a read. (The fibers run in thread order, so thread 0 writes first unless it
// waits; the shuffle makes it wait for thread 1's read, but orders no memory.)
template <class Memory>
__device__ void read_then_write_in(Memory m) {
    unsigned t = threadIdx.x;
    if (t == 1) m[2] = m[0];
    (void)__shfl_xor_sync(-1, t, 1);
    if (t == 0) m[0] = 1.0f;
}

__global__ void read_then_write(float*) { read_then_write_in(Shared<float>{0}); }

__global__ void global_read_then_write(emu::Global<float> g) { read_then_write_in(g); }

// Each lane's value, exchanged with the lane `mask` away; and two votes a warp: warps 0 and 1
// all have t < 64, warp 2 none; t % 64 != 5 fails in warps 0 (t = 5) and 2 (t = 69). Values
// differ by block, so that one block's exchange is never taken for another's.
__global__ void exchange(unsigned* out, unsigned mask) {
    unsigned t = threadIdx.x, at = 192 * blockIdx.x;
    out[at + t] = __shfl_xor_sync(-1, 100 + 1000 * blockIdx.x + t, mask);
    out[at + 96 + t] = __all_sync(-1, t < 64) + 2 * __all_sync(-1, t % 64 != 5);
}

// One shuffle a block, of values that differ by block: the second block's must not be taken
// for the first's (each block's barriers start their phases alike).
__global__ void shuffle_by_block(unsigned* out) {
    unsigned t = threadIdx.x;
    out[64 * blockIdx.x + t] = __shfl_xor_sync(-1, 1000 * blockIdx.x + t, 1);
}

// Some threads end first; the others still meet at the block's barrier and order their shared
// memory by it.
__global__ void some_end(float* out) {
    Shared<float> s{0};
    unsigned t = threadIdx.x;
    if (t >= 48) return;
    s[t] = float(t);
    __syncthreads();
    out[t] = s[47 - t];
}

// A shuffle that only the first 16 lanes call: undefined on a GPU, a hang here. The other
// lanes end while the first wait at it.
__global__ void partial_shuffle(unsigned* out) {
    unsigned t = threadIdx.x;
    if (t < 16) out[t] = __shfl_xor_sync(-1, t, 1);
}

// The same, with the other lanes ended before the first 16 shuffle (they wait at the block's
// barrier first, which the ended lanes count as arrived at).
__global__ void shuffle_after_lanes_ended(unsigned* out) {
    unsigned t = threadIdx.x;
    if (t >= 16 && t < 32) return;
    __syncthreads();
    if (t < 16) out[t] = __shfl_xor_sync(-1, t, 1);
}

// Lanes 0 to 15 wait at a shuffle for lanes 16 to 31, which wait at the block's barrier for
// lanes 0 to 15.
__global__ void crossed(unsigned* out) {
    unsigned t = threadIdx.x;
    if (t < 16) out[t] = __shfl_xor_sync(-1, t, 1);
    else __syncthreads();
}

// A wmma product: every lane must pass the same tiles (undefined on a GPU otherwise); odd
// lanes pass the same tiles, or halves in place of one of A, B or C.
enum TileProductCase { same_tiles, other_a, other_b, other_c };

__global__ void tile_product(float* out, int odd_lanes_differ) {
    using namespace nvcuda::wmma;
    fragment<matrix_a, 16, 16, 16, __half, row_major> a;
    fragment<matrix_b, 16, 16, 16, __half, col_major> b;
    fragment<accumulator, 16, 16, 16, float> c;
    auto value = [&](int operand, float same) {
        return threadIdx.x % 2 && odd_lanes_differ == operand ? 0.5f : same;
    };
    fill_fragment(a, value(other_a, 1.0f));
    fill_fragment(b, value(other_b, 2.0f));
    fill_fragment(c, value(other_c, 3.0f));
    mma_sync(c, a, b, c);
    out[threadIdx.x] = c.x[255];
}

// A warp stores a tile of 3s (from lanes that each pass their own place, row stride, layout or
// tile, from half the lanes only, or from a partial warp: each undefined on a GPU), then lane 0
// adds up the tile, after a __syncwarp (right) or without one: a race with the lanes that wrote
// the other elements.
enum TileStoreCase {
    store_then_syncwarp,
    store_then_read,
    store_elsewhere,
    store_other_layout,
    store_other_ldm,
    store_other_tiles,
    store_by_half_warp,
};

__global__ void tile_store(float* out, int how) {
    using namespace nvcuda::wmma;
    fragment<accumulator, 16, 16, 16, float> c;
    unsigned lane = threadIdx.x % 32;
    fill_fragment(c, how == store_other_tiles && lane == 1 ? 4.0f : 3.0f);
    Shared<float> tile{how == store_elsewhere && lane == 1 ? 1024u : 0u};
    layout_t layout = how == store_other_layout && lane == 1 ? mem_col_major : mem_row_major;
    unsigned ldm = how == store_other_ldm && lane == 1 ? 20 : 16;
    if (how != store_by_half_warp || lane < 16) store_matrix_sync(tile, c, ldm, layout);
    if (how != store_then_read) __syncwarp();
    if (lane == 0) {
        float sum = 0;
        for (unsigned e = 0; e < 256; ++e) sum += tile[e];
        out[threadIdx.x / 32] = sum;
    }
}

// Blocks of a launch and one element of `out`, after each reads `in` (which no block
// writes): each block adds `in[0]` to its own element (right), or all add into `out[0]`, or all
// write it, or block 0 reads it (into `out[1]`) and the others write it. Right when the blocks
// run one after another, the last three are races between blocks on a GPU.
enum Blocks { apart, add_into_one, write_one, read_one_write_one };

__global__ void blocks_on_one(emu::Global<const float> in, emu::Global<float> out, int how) {
    if (threadIdx.x != 0) return;
    unsigned b = blockIdx.x;
    if (how == apart) out[2 + b] = out[2 + b] + in[0];
    if (how == add_into_one) out[0] = out[0] + in[0];
    if (how == write_one) out[0] = in[0];
    if (how == read_one_write_one) {
        if (b == 0) out[1] = out[0];
        else out[0] = in[0];
    }
}

// Threads 0 and 1 write the same element of global memory, unordered.
__global__ void global_both_write(emu::Global<float> g) {
    unsigned t = threadIdx.x;
    if (t < 2) g[0] = float(t);
}

// Threads 65 and 161 read `m[0]` (unordered reads: both must be kept), then thread 160 writes
// it after a barrier of the block (right), or of its warp only: that orders it after 161's read
// but not after 65's, the first read (so the one a check that kept only the last would lose).
// Threads past 64 and 128: a detector that kept readers 64 to a word would need every word.
template <class Memory>
__device__ void reads_then_write_in(Memory m, int between) {
    unsigned t = threadIdx.x;
    if (t == 65 || t == 161) m[1 + t / 32] = m[0];
    if (between == block_barrier) __syncthreads();
    if (between == warp_barrier && t >= 32) __syncwarp();
    if (t == 160) m[0] = 2.0f;
}

__global__ void reads_then_write(float* out, int between) {
    Shared<float> s{0};
    if (threadIdx.x == 0) s[0] = 1.0f;
    __syncthreads();
    reads_then_write_in(s, between);
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i : {0, 3, 6}) out[i] = s[i];
}

__global__ void global_reads_then_write(emu::Global<float> g, int between) { reads_then_write_in(g, between); }

// Thread 0 copies `g[0..4)` into shared memory with cp.async, and `g[0]` is written after the
// wait and a barrier (right), or before the wait: by thread 1 after a barrier, or by thread 0.
// The copy reads at some time up to the wait, so the last two race on a GPU.
enum Copy { write_after_wait, other_writes_source, own_write_to_source };

__global__ void copy_source_written(emu::Global<float> g, int how) {
    Shared<float> s{0};
    unsigned t = threadIdx.x;
    if (t == 0) __cp_async_shared_global<16>(g, s, 16);
    if (how == own_write_to_source && t == 0) g[0] = 5.0f;
    if (how == write_after_wait && t == 0) lab_wait_copies();
    __syncthreads();
    if (how != own_write_to_source && t == 1) g[0] = 5.0f;
    if (how != write_after_wait && t == 0) lab_wait_copies();
}

int main(int argc, char** argv) {
    std::string name = argc > 1 ? argv[1] : "";
    float f[192];
    unsigned u[384];
    std::fill_n(f, 192, -1.0f);
    std::fill_n(u, 384, 0u);
    emu::dim3 one{1, 1, 1}, two{2, 1, 1};
    auto block = [](unsigned threads) { return emu::dim3{threads, 1, 1}; };
    float in[1] = {1.0f};
    alignas(16) float g[35] = {};
    auto blocks = [&](Blocks how) { emu::launch(blocks_on_one, emu::dim3{3, 1, 1}, block(32), in, g, int(how)); };
    // Each case: its launch, then whether the outputs are right (a race or a hang ends the run
    // before that).
    std::map<std::string, std::function<bool()>> cases = {
        {"ordered_by_block_barrier",
         [&] { return emu::launch(write_then_read, one, block(64), f, 33u, int(block_barrier)), f[0] == 42.0f; }},
        {"ordered_by_warp_barrier",
         [&] { return emu::launch(write_then_read, one, block(64), f, 1u, int(warp_barrier)), f[0] == 42.0f; }},
        {"unordered", [&] { return emu::launch(write_then_read, one, block(64), f, 1u, int(nothing)), true; }},
        {"warp_barrier_across_warps",
         [&] { return emu::launch(write_then_read, one, block(64), f, 33u, int(warp_barrier)), true; }},
        {"shuffle_orders_nothing",
         [&] { return emu::launch(write_then_read, one, block(64), f, 1u, int(shuffle)), true; }},
        {"read_then_write", [&] { return emu::launch(read_then_write, one, block(32), f), true; }},
        {"last_writes", [&] { return emu::launch(last_writes, one, block(64), f), true; }},
        {"both_write", [&] { return emu::launch(both_write, one, block(64), f), true; }},
        {"mixed_meetings", [&] { return emu::launch(mixed_meetings, one, block(32), f), true; }},
        {"exchange",
         [&] {
             emu::launch(exchange, two, block(96), u, 3u);
             for (unsigned b = 0; b < 2; ++b)
                 for (unsigned t = 0; t < 96; ++t) {
                     unsigned value = 100 + 1000 * b + (t ^ 3), votes = t < 32 ? 1 : t < 64 ? 3 : 0;
                     const unsigned* got = u + 192 * b;
                     if (got[t] != value || got[96 + t] != votes) {
                         std::printf("block %u, thread %u: got %u and %u, want %u and %u\n", b, t, got[t], got[96 + t],
                                     value, votes);
                         return false;
                     }
                 }
             return true;
         }},
        {"shuffle_by_block",
         [&] {
             emu::launch(shuffle_by_block, two, block(64), u);
             for (unsigned t = 0; t < 128; ++t)
                 if (u[t] != 1000 * (t / 64) + ((t % 64) ^ 1)) return false;
             return true;
         }},
        {"some_end",
         [&] {
             emu::launch(some_end, two, block(64), f);
             for (unsigned t = 0; t < 48; ++t)
                 if (f[t] != float(47 - t)) return false;
             return true;
         }},
        {"tile_product",
         [&] {
             emu::launch(tile_product, one, block(64), f, int(same_tiles));
             return std::all_of(f, f + 64, [](float x) { return x == 3.0f + 16 * 2.0f; });
         }},
        {"tile_store_then_syncwarp",
         [&] {
             emu::launch(tile_store, one, block(32), f, int(store_then_syncwarp));
             return f[0] == 3.0f * 256;
         }},
        {"tile_store_then_read", [&] { return emu::launch(tile_store, one, block(32), f, int(store_then_read)), true; }},
        {"tile_store_elsewhere", [&] { return emu::launch(tile_store, one, block(32), f, int(store_elsewhere)), true; }},
        {"tile_store_other_layout",
         [&] { return emu::launch(tile_store, one, block(32), f, int(store_other_layout)), true; }},
        {"tile_store_other_ldm",
         [&] { return emu::launch(tile_store, one, block(32), f, int(store_other_ldm)), true; }},
        {"tile_store_by_partial_warp",
         [&] { return emu::launch(tile_store, one, block(48), f, int(store_then_syncwarp)), true; }},
        {"tile_store_of_other_tiles",
         [&] { return emu::launch(tile_store, one, block(32), f, int(store_other_tiles)), true; }},
        {"tile_store_by_half_warp",
         [&] { return emu::launch(tile_store, one, block(32), f, int(store_by_half_warp)), true; }},
        {"tile_product_of_other_a", [&] { return emu::launch(tile_product, one, block(64), f, int(other_a)), true; }},
        {"tile_product_of_other_b", [&] { return emu::launch(tile_product, one, block(64), f, int(other_b)), true; }},
        {"tile_product_of_other_c", [&] { return emu::launch(tile_product, one, block(64), f, int(other_c)), true; }},
        {"partial_shuffle", [&] { return emu::launch(partial_shuffle, one, block(32), u), true; }},
        {"shuffle_after_lanes_ended", [&] { return emu::launch(shuffle_after_lanes_ended, one, block(64), u), true; }},
        {"crossed", [&] { return emu::launch(crossed, one, block(64), u), true; }},
        {"blocks_apart", [&] { return blocks(apart), std::all_of(g + 2, g + 5, [](float x) { return x == 1.0f; }); }},
        {"blocks_add_into_one", [&] { return blocks(add_into_one), true; }},
        {"blocks_write_one", [&] { return blocks(write_one), true; }},
        {"blocks_read_one_write_one", [&] { return blocks(read_one_write_one), true; }},
        {"global_ordered_by_block_barrier",
         [&] {
             emu::launch(global_write_then_read, one, block(64), g, 33u, int(block_barrier));
             return g[1] == 42.0f;
         }},
        {"global_warp_barrier_across_warps",
         [&] { return emu::launch(global_write_then_read, one, block(64), g, 33u, int(warp_barrier)), true; }},
        {"global_both_write", [&] { return emu::launch(global_both_write, one, block(64), g), true; }},
        {"global_read_then_write", [&] { return emu::launch(global_read_then_write, one, block(32), g), true; }},
        {"copy_source_written_after_wait",
         [&] {
             g[0] = 1.0f;
             emu::launch(copy_source_written, one, block(32), g, int(write_after_wait));
             return g[0] == 5.0f;
         }},
        {"copy_source_written_by_other",
         [&] { return emu::launch(copy_source_written, one, block(32), g, int(other_writes_source)), true; }},
        {"copy_source_written_by_own",
         [&] { return emu::launch(copy_source_written, one, block(32), g, int(own_write_to_source)), true; }},
        {"reads_then_ordered_write",
         [&] {
             emu::launch(reads_then_write, one, block(192), f, int(block_barrier));
             return f[0] == 2.0f && f[3] == 1.0f && f[6] == 1.0f;
         }},
        {"reads_then_write",
         [&] { return emu::launch(reads_then_write, one, block(192), f, int(warp_barrier)), true; }},
        {"global_reads_then_ordered_write",
         [&] {
             g[0] = 1.0f;
             emu::launch(global_reads_then_write, one, block(192), g, int(block_barrier));
             return g[0] == 2.0f && g[3] == 1.0f && g[6] == 1.0f;
         }},
        {"global_reads_then_write",
         [&] { return emu::launch(global_reads_then_write, one, block(192), g, int(warp_barrier)), true; }},
    };
    if (name == "--list") {
        for (const auto& [case_name, run] : cases) std::printf("%s\n", case_name.c_str());
        return 0;
    }
    auto found = cases.find(name);
    if (found == cases.end()) {
        std::fprintf(stderr, "no case %s\n", name.c_str());
        return 2;
    }
    return found->second() ? 0 : 1;
}
