// A CPU emulation of the CUDA surface that cubecl's generated kernels use (the attention's, the
// row kernels', the step's), so that their C++ (kernels/src/attention/cuda_source.rs,
// kernels/src/cuda_source.rs) runs on a machine without a GPU (its own checks: selftest.cpp):
// - a block's CUDA threads are fibers on one OS thread: each runs until it waits at a barrier
//   or ends, then the next one that can go on runs, in thread order; __syncthreads and
//   __syncwarp are barriers of the block and of the thread's warp of 32; __shfl_xor_sync
//   exchanges through the warp, __all_sync votes in it, and ldmatrix and mma.sync (also
//   wmma's mma_sync and store_matrix_sync) are warp-wide too. A thread that ends counts as
//   arrived at __syncthreads, as on a GPU. A run that would hang on a GPU ends at once, with
//   exit 124: a wait that no thread can end (a barrier or shuffle that some threads never
//   reach), a warp-wide operation that a lane which has ended would have to join, or lanes
//   that meet at different warp-wide operations (a __syncwarp and a shuffle, say). A warp's barrier
//   counts arrivals from any call site, and the last warp of a block that is not a multiple of
//   32 has fewer members: a shuffle in a partial warp, or two shuffles at different sites that
//   meet, pass here;
// - shared memory has a race detector: two accesses to the same bytes by different threads, at
//   least one a write, abort the run unless a barrier (__syncwarp for the warp, __syncthreads
//   for the block; not a shuffle) orders them: read after write, write after read, write
//   after write, whatever order the threads run in;
// - wmma fragments are whole 16x16 matrices held by every lane of the warp. A load reads the
//   whole tile when the lane runs it; a store is warp-wide, each lane writing its share of
//   the tile, and a product is found once for the warp: every lane must pass them the same
//   tiles, and a store the same place, ldm and layout. Loads and stores check the pointer
//   (32 bytes) and leading dimension (16 bytes) the CUDA C++ guide requires (PTX asks more of
//   a row's start: BENCHMARKS, "Reviews before the next GPU");
// - global memory has a check between blocks (which run one after another here, at once on a
//   GPU): an element one block of a launch writes, that another reads or writes, aborts the
//   run (below, at emu::Global); within a block, the race detector of shared memory checks
//   global memory too;
// - cp.async copies are NaN in shared memory from the call to the unit's next
//   lab_wait_copies (cp.async.wait_all), where they land (below, at __cp_async_shared_global);
// - __half and __nv_bfloat16 are 16-bit storage with round-to-nearest-even conversions.
// It checks what the kernels compute and where they synchronise, not how fast they are.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "fibers.h"

namespace emu {
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
}  // namespace emu

// The running thread's (the scheduler sets them as it switches to a thread).
inline emu::dim3 threadIdx, blockIdx;
// What element-wise kernels compute their unit's absolute position in.
struct uint3 {
    unsigned x, y, z;
};
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline emu::dim3 blockDim, gridDim;
constexpr unsigned warpSize = 32;

#define __global__
#define __grid_constant__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)

template <class T>
inline T min(T a, T b) { return b < a ? b : a; }
template <class T>
inline T max(T a, T b) { return a < b ? b : a; }

namespace emu {
// Up to 256 threads a block (the row kernels': SwiGLU, RoPE, the LM head's), a fiber each.
constexpr unsigned max_threads = max_fibers;

// A block's threads as fibers on one OS thread (run_block, below): a thread switches back to
// the scheduler only where it waits at a barrier, or ends.
struct Barrier;
struct Fiber {
    Context context;
    const Barrier* waits_at;  // the barrier it waits at (none: it can go on)
    uint64_t phase;           // the barrier's phase it waits for the end of
    bool ended;
};
inline Fiber fibers[max_threads];
inline Context scheduler;
inline unsigned tid;  // the running thread's index in its block

// A run that would hang on a GPU ends here, with exit 124 (as coreutils' `timeout` ends one).
[[noreturn]] inline void hang(const char* why) {
    std::fprintf(stderr, "block %u,%u,%u hangs: %s\n", blockIdx.x, blockIdx.y, blockIdx.z, why);
    std::exit(124);
}

// Phases are numbered across all barriers and blocks, so that a phase's number names it alone
// (what the warp's collectives below keep of one phase is never taken for another's).
inline uint64_t last_phase;

// What threads meet at a barrier for: all that meet in one phase must be there for the same
// (a warp's lanes at __syncwarp and at a shuffle would each find the other's result).
enum class Meeting { none, clocks_join, values_exchange, tile_product, tile_store, register_product };

// std::barrier's arrive_and_wait and arrive_and_drop for fibers: the last thread to arrive
// ends the phase and goes on first, while the others still wait in the scheduler. So what
// it finds from what they left before arriving (a warp's operands, the clocks to join) holds
// for the phase: none of them can leave anything at this barrier again before all of them
// have gone on. (Where a thread that ends ends the phase, at __syncthreads, the first waiter
// to go on finds it, before any other runs.)
struct Barrier {
    unsigned members, expected, arrived = 0;
    uint64_t phase = ++last_phase;
    Meeting meeting = Meeting::none;  // what this phase's arrivals came for
    // What the threads of `join` (below) had seen together, in the phase `joined_phase`.
    uint64_t joined_phase = 0;
    uint32_t joined[max_threads];

    explicit Barrier(unsigned count) : members(count), expected(count) {}
    void arrive_and_wait(Meeting why) {
        if (arrived == 0) meeting = why;
        if (why != meeting) hang("lanes of a warp meet at different warp-wide operations (__syncwarp, a shuffle or vote, mma, a wmma store)");
        if (++arrived == expected) return end_phase();
        fibers[tid].waits_at = this;
        fibers[tid].phase = phase;
        switch_context(fibers[tid].context, scheduler);
    }
    void arrive_and_drop() {
        if (arrived == --expected) end_phase();
    }
    // arrive_and_wait for `why`, then `find` what the phase's threads share, once a phase (by
    // the first to go on); `found` keeps the phase it was last found for.
    template <class Find>
    void arrive_and_find(Meeting why, uint64_t& found, Find find) {
        uint64_t waited = phase;
        arrive_and_wait(why);
        if (found != waited) {
            find();
            found = waited;
        }
    }

  private:
    void end_phase() {
        arrived = 0;
        phase = ++last_phase;
    }
};

// One block at a time: its shared memory (128 KiB: the tensor cores' dK at hd 128 takes 75.5),
// its barriers, each thread's warp and lane.
constexpr size_t shared_size = 1 << 17;
alignas(256) inline uint8_t shared[shared_size];
inline Barrier* block_barrier;
inline std::vector<Barrier> warp_barriers;
inline unsigned warp, lane;

// The running thread's warp, for an operation of the whole warp (a shuffle, a vote,
// __syncwarp, ldmatrix, mma, a wmma store), whose mask names every lane: undefined on a GPU
// where one has ended (thread_main checks the other order: a lane that ends while others wait
// at one).
inline Barrier& whole_warp() {
    Barrier& b = warp_barriers[warp];
    if (b.expected != b.members) hang("a warp-wide operation (shuffle, vote, __syncwarp, ldmatrix, mma, a wmma store) after a lane of "
                                        "the warp ended");
    return b;
}

// Each lane's `value`, from every lane of the warp (a shuffle's, a vote's, ldmatrix's rows):
// left in `slots`, and copied once a phase of the warp's barrier (so that a lane can leave its
// next value before the others have read this one).
inline uint64_t slots[32][32];
struct Exchanged {
    uint64_t phase;
    uint64_t values[32];
};
inline Exchanged exchanged_values[32];
inline const uint64_t* exchange(uint64_t value) {
    Barrier& b = whole_warp();
    slots[warp][lane] = value;
    Exchanged& e = exchanged_values[warp];
    b.arrive_and_find(Meeting::values_exchange, e.phase,
                      [&] { std::memcpy(e.values, slots[warp], sizeof e.values); });
    return e.values;
}

inline float half_to_float(uint16_t h) {
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        float f = ldexpf(float(man), -24);
        return sign ? -f : f;
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t float_to_half(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t sign = (u >> 16) & 0x8000;
    float a = fabsf(f);
    if (a != a) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00;
    if (a < ldexpf(1.0f, -14)) {  // subnormal: a multiple of 2^-24, rounded to even
        return sign | uint16_t(nearbyintf(a * ldexpf(1.0f, 24)));
    }
    uint32_t bits;
    std::memcpy(&bits, &a, 4);
    uint32_t rounded = bits + 0xfff + ((bits >> 13) & 1);
    return sign | uint16_t(((rounded >> 13) - (112 << 10)) & 0x7fff);
}
}  // namespace emu

struct __half {
    uint16_t bits;
    __half() = default;
    __half(float f) : bits(emu::float_to_half(f)) {}
    __half(double d) : __half(float(d)) {}
    __half(int i) : __half(float(i)) {}
    __half(unsigned i) : __half(float(i)) {}
    operator float() const { return emu::half_to_float(bits); }
};

struct __nv_bfloat16 {
    uint16_t bits;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        bits = f != f ? 0x7fc0 : uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    __nv_bfloat16(double d) : __nv_bfloat16(float(d)) {}
    __nv_bfloat16(int i) : __nv_bfloat16(float(i)) {}
    __nv_bfloat16(unsigned i) : __nv_bfloat16(float(i)) {}
    operator float() const {
        uint32_t u = uint32_t(bits) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

// Pairs, which cubecl's vector types name even where a kernel never uses them.
struct __half2 {
    __half x, y;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

namespace emu {
// A race detector on shared memory (happens-before with vector clocks, as ThreadSanitizer
// and compute-sanitizer's racecheck): two accesses to the same 2 bytes by different threads,
// at least one a write, with no barrier between them, abort the run. Only __syncwarp and
// __syncthreads order threads; a warp shuffle does not.
// The bookkeeping below is walked only for the block's own threads (`block_threads`), so
// smaller blocks cost no more.
constexpr size_t granules = shared_size / 2;
inline uint32_t clocks[max_threads][max_threads];    // row t: what thread t has seen
inline uint32_t exchanged[max_threads][max_threads]; // rows copied at a barrier
inline int16_t writer[granules];                     // last writer of a granule, -1 none
inline uint32_t written_at[granules];                // its clock then
// Each thread's clock at its last read of a granule: the block's threads side by side for each
// granule (read_at[g * block_threads + t]), so that a write checks one run of memory.
inline uint32_t read_at[granules * max_threads];
inline unsigned block_threads;
// Granules below this have been read or written since the last reset (all, before the first).
inline size_t touched_granules = granules;

inline void reset_races(unsigned threads) {
    if (threads > max_threads) {
        std::fprintf(stderr, "a block of %u threads: the emulation takes %u at most\n", threads, max_threads);
        std::abort();
    }
    // Only the granules the last block touched, in its layout of `read_at` (32 MiB in all at
    // 128 threads, where a block of the attention's touches a few hundred KiB).
    std::memset(writer, 0xff, touched_granules * sizeof writer[0]);
    std::memset(read_at, 0, touched_granules * block_threads * sizeof read_at[0]);
    touched_granules = 0;
    block_threads = threads;
    // `exchanged` too: a thread that leaves before a barrier must not count with what a thread
    // of an earlier block had seen.
    std::memset(clocks, 0, sizeof clocks);
    std::memset(exchanged, 0, sizeof exchanged);
    for (unsigned t = 0; t < threads; ++t) clocks[t][t] = 1;
}

[[noreturn]] inline void race(const char* kind, size_t at, unsigned other) {
    std::fprintf(stderr, "shared-memory race (%s) at byte %zu: thread %u against %u, block %u,%u,%u\n",
                 kind, at, tid, other, blockIdx.x, blockIdx.y, blockIdx.z);
    std::abort();
}

// Whether thread `other`'s access at its clock `time` happens before what `tid` does now.
inline bool seen(unsigned other, uint32_t time) { return time <= clocks[tid][other]; }

[[noreturn]] inline void beyond_shared(size_t at) {
    std::fprintf(stderr, "shared memory: byte %zu is beyond the emulation's %zu (emu::shared_size)\n", at,
                 shared_size);
    std::abort();
}

inline void on_read(size_t at, size_t size) {
    if (at + size > shared_size) beyond_shared(at + size);
    touched_granules = std::max(touched_granules, (at + size + 1) / 2);
    for (size_t g = at / 2; g <= (at + size - 1) / 2; ++g) {
        int w = writer[g];
        if (w >= 0 && unsigned(w) != tid && !seen(w, written_at[g])) race("read after write", at, w);
        read_at[g * block_threads + tid] = clocks[tid][tid];
    }
}

inline void on_write(size_t at, size_t size) {
    if (at + size > shared_size) beyond_shared(at + size);
    touched_granules = std::max(touched_granules, (at + size + 1) / 2);
    for (size_t g = at / 2; g <= (at + size - 1) / 2; ++g) {
        int w = writer[g];
        if (w >= 0 && unsigned(w) != tid && !seen(w, written_at[g])) race("write after write", at, w);
        uint32_t* reads = &read_at[g * block_threads];
        for (unsigned u = 0; u < block_threads; ++u)
            if (u != tid && reads[u] && !seen(u, reads[u])) race("write after read", at, u);
        std::memset(reads, 0, block_threads * sizeof reads[0]);
        writer[g] = int16_t(tid);
        written_at[g] = clocks[tid][tid];
    }
}

template <class T>
T read(size_t at) {
    on_read(at, sizeof(T));
    T value;
    std::memcpy(&value, &shared[at], sizeof(T));
    return value;
}

template <class T>
void write(size_t at, T value) {
    on_write(at, sizeof(T));
    std::memcpy(&shared[at], &value, sizeof(T));
}

// A barrier of the threads [first, first + count): each leaves having seen all they had seen
// (found once a phase, by the thread that goes on first).
inline void join(Barrier& barrier, unsigned first, unsigned count) {
    unsigned n = block_threads;
    std::memcpy(exchanged[tid], clocks[tid], n * sizeof clocks[tid][0]);
    barrier.arrive_and_find(Meeting::clocks_join, barrier.joined_phase, [&] {
        std::fill_n(barrier.joined, n, 0u);
        for (unsigned t = first; t < first + count; ++t)
            for (unsigned u = 0; u < n; ++u) barrier.joined[u] = std::max(barrier.joined[u], exchanged[t][u]);
    });
    std::memcpy(clocks[tid], barrier.joined, n * sizeof barrier.joined[0]);
    clocks[tid][tid] += 1;
}

template <class T>
struct Ref {
    size_t at;
    operator T() const { return read<T>(at); }
    Ref& operator=(T value) {
        write<T>(at, value);
        return *this;
    }
    Ref& operator=(const Ref& other) { return *this = T(other); }
};

// A shared array of the kernel (`T* shared_memory_N`), `offset` bytes into the block's.
template <class T>
struct Shared {
    size_t offset;
    Ref<T> operator[](size_t i) const { return Ref<T>{offset + i * sizeof(T)}; }
    Shared operator+(size_t i) const { return Shared{offset + i * sizeof(T)}; }
};

// The same bytes of shared memory as an array of `U` (cubecl's vector loads and stores cast a
// shared array's pointer; for_emulation turns that cast into this).
template <class U, class T>
Shared<U> recast(Shared<T> s) {
    if (s.offset % alignof(U) != 0) {
        std::fprintf(stderr, "shared memory: a %zu-byte view at byte %zu\n", sizeof(U), s.offset);
        std::abort();
    }
    return Shared<U>{s.offset};
}
}  // namespace emu

// Global memory, as the kernels' tensor parameters see it (for_emulation declares each
// `T* buffer_N` as `emu::Global<T>`), checked by 2-byte granule for the launch:
// - between blocks: they run at once on a GPU, in no order, so an element one block writes
//   must be read or written by no other block of that launch (lab's kernels use no atomics).
//   One that breaks this aborts the run, whatever the order the emulation runs the blocks in;
// - within a block: as shared memory is, by the vector clocks above (a barrier orders global
//   memory for the threads it joins, as it does shared memory). A cp.async copy reads its
//   source at the call and again at the wait, and its own thread must not write it between.
// Granules are 2 bytes, as in shared memory: threads that write neighbouring bytes of a
// 1-byte tensor would race here (lab's kernels take none).
namespace emu {
struct GlobalAccess {
    int64_t writer = -1;  // the block that wrote the granule, -1 none
    // The first block that read it, -1 none: blocks run in order, so any other reader came
    // later, and a block that writes after a reader that is not itself races with one.
    int64_t reader = -1;
    // The threads' accesses, kept for the block that touched the granule last (`block`), as
    // FastTrack keeps them: the last write, and the last read while each read happens after
    // the one before; once two reads are unordered, each thread's clock at its read.
    int64_t block = -1;
    int16_t writer_thread = -1;
    uint32_t written_at = 0;
    int16_t reader_thread = -1;
    uint32_t read_at = 0;
    std::vector<uint32_t> reads;
};
inline std::unordered_map<uintptr_t, GlobalAccess> global_accesses;
inline int64_t block_number;  // the running block's, x fastest

[[noreturn]] inline void blocks_race(const char* kind, const void* at, int64_t other) {
    std::fprintf(stderr, "global-memory race between blocks (%s) at %p: block %lld against %lld\n", kind, at,
                 static_cast<long long>(block_number), static_cast<long long>(other));
    std::abort();
}

[[noreturn]] inline void threads_race(const char* kind, const void* at, unsigned other) {
    std::fprintf(stderr, "global-memory race in a block (%s): thread %u against %u, block %u,%u,%u, at %p\n", kind,
                 tid, other, blockIdx.x, blockIdx.y, blockIdx.z, at);
    std::abort();
}

// Each 2-byte granule of the bytes [at, at + size) in global memory, by the block's access.
template <class Access>
void each_global_granule(const void* at, size_t size, Access access) {
    uintptr_t first = reinterpret_cast<uintptr_t>(at);
    for (uintptr_t g = first / 2; g <= (first + size - 1) / 2; ++g) access(global_accesses[g]);
}

// The threads' accesses to `a` as the running block's: none yet when another block's were kept.
// No race needs this (a granule that two blocks touch is only read, or the check between
// blocks ends the run), but without it the reads of one granule by many blocks would look
// unordered and be kept thread by thread.
inline void in_this_block(GlobalAccess& a) {
    if (a.block == block_number) return;
    a.block = block_number;
    a.writer_thread = a.reader_thread = -1;
    a.reads.clear();
}

// Whether thread `other`'s access at its clock `time` (none: -1 or 0) is not ordered before
// what `tid` does now.
inline bool unordered(int other, uint32_t time) {
    return other >= 0 && time > 0 && unsigned(other) != tid && !seen(other, time);
}

inline void on_thread_read(GlobalAccess& a, const void* at) {
    in_this_block(a);
    if (unordered(a.writer_thread, a.written_at)) threads_race("read after write", at, a.writer_thread);
    uint32_t now = clocks[tid][tid];
    if (!a.reads.empty()) {
        a.reads[tid] = now;
    } else if (!unordered(a.reader_thread, a.read_at)) {
        a.reader_thread = int16_t(tid);
        a.read_at = now;
    } else {
        a.reads.assign(block_threads, 0);
        a.reads[a.reader_thread] = a.read_at;
        a.reads[tid] = now;
    }
}

inline void on_thread_write(GlobalAccess& a, const void* at) {
    in_this_block(a);
    if (unordered(a.writer_thread, a.written_at)) threads_race("write after write", at, a.writer_thread);
    if (a.reads.empty() && unordered(a.reader_thread, a.read_at)) threads_race("write after read", at, a.reader_thread);
    for (unsigned u = 0; u < a.reads.size(); ++u)
        if (unordered(u, a.reads[u])) threads_race("write after read", at, u);
    a.reads.clear();
    a.reader_thread = -1;
    a.writer_thread = int16_t(tid);
    a.written_at = clocks[tid][tid];
}

// A cp.async copy not yet waited for (below, at __cp_async_shared_global): the shared bytes
// it writes, and the global bytes it reads when its source is a tensor parameter.
struct PendingCopy {
    size_t at, size;
    uint8_t bytes[16];
    const void* src = nullptr;
    size_t src_bytes = 0;
};
inline std::vector<PendingCopy> pending_copies[max_threads];  // each thread's

// A thread's own write into the source of its copy in flight: undefined on a GPU, where the
// copy reads at some time up to the wait.
inline void no_copy_reads(const void* at, size_t size) {
    auto first = static_cast<const uint8_t*>(at);
    for (const PendingCopy& copy : pending_copies[tid]) {
        auto src = static_cast<const uint8_t*>(copy.src);
        if (src && first < src + copy.src_bytes && src < first + size) {
            std::fprintf(stderr, "cp.async: thread %u writes global memory at %p that its copy not yet "
                         "waited for (lab_wait_copies) reads, block %u,%u,%u\n", tid, at, blockIdx.x,
                         blockIdx.y, blockIdx.z);
            std::abort();
        }
    }
}

inline void on_global_read(const void* at, size_t size) {
    each_global_granule(at, size, [&](GlobalAccess& a) {
        if (a.writer >= 0 && a.writer != block_number) blocks_race("read after write", at, a.writer);
        if (a.reader < 0) a.reader = block_number;
        on_thread_read(a, at);
    });
}

inline void on_global_write(const void* at, size_t size) {
    no_copy_reads(at, size);
    each_global_granule(at, size, [&](GlobalAccess& a) {
        if (a.writer >= 0 && a.writer != block_number) blocks_race("write after write", at, a.writer);
        if (a.reader >= 0 && a.reader != block_number) blocks_race("write after read", at, a.reader);
        a.writer = block_number;
        on_thread_write(a, at);
    });
}

template <class T>
struct GlobalRef {
    T* at;
    operator std::remove_cv_t<T>() const {
        on_global_read(at, sizeof(T));
        return *at;
    }
    GlobalRef& operator=(const std::remove_cv_t<T>& value) {
        on_global_write(at, sizeof(T));
        *at = value;
        return *this;
    }
    GlobalRef& operator=(const GlobalRef& other) { return *this = std::remove_cv_t<T>(other); }
};

// A tensor parameter: indexing gives a reference that records the access.
template <class T>
struct Global {
    T* at;
    GlobalRef<T> operator[](size_t i) const { return {at + i}; }
    Global operator+(size_t i) const { return {at + i}; }
};

// The element type of a kernel's tensor parameter (`emu::Global<T>`, or a pointer to `T`).
template <class P>
struct pointee {
    using type = std::remove_pointer_t<P>;
};
template <class T>
struct pointee<Global<T>> {
    using type = T;
};
template <class P>
using pointee_t = typename pointee<P>::type;
}  // namespace emu

inline void __syncthreads() {
    emu::join(*emu::block_barrier, 0, blockDim.x * blockDim.y * blockDim.z);
}

// cp.async as cubecl wraps it (`__cp_async_shared_global<N>(src, dst, src_bytes)`): N bytes
// (4, 8 or 16) into shared memory, the first `src_bytes` from global `src`, zeros after. On a
// GPU they land at some time between the call and the unit's next `cp.async.wait_all`
// (lab_wait_copies, which lab's `sync_storage` calls before its barrier). Here the N bytes are
// written as NaN (0xff) at the call, so that the race detector counts the copy's write from
// then on and a read before the wait sees NaN, and the copied bytes at the wait. Both ends
// must be N-byte aligned, as for the instruction.
template <size_t N, class S, class T>
inline void __cp_async_shared_global(const S* src, emu::Shared<T> dst, size_t src_bytes) {
    static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
    if (dst.offset % N != 0 || reinterpret_cast<uintptr_t>(src) % N != 0 || src_bytes > N) {
        std::fprintf(stderr, "cp.async of %zu: %zu bytes from %p to shared byte %zu (both ends aligned)\n", N,
                     src_bytes, static_cast<const void*>(src), dst.offset);
        std::abort();
    }
    emu::PendingCopy copy{dst.offset, N, {}};
    std::memcpy(copy.bytes, src, src_bytes);
    emu::on_write(dst.offset, N);
    std::memset(&emu::shared[dst.offset], 0xff, N);
    emu::pending_copies[emu::tid].push_back(copy);
}

// cp.async from a tensor parameter: the bytes it reads, recorded for the races at the call and
// again at the wait (it reads at some time between).
template <size_t N, class S, class T>
inline void __cp_async_shared_global(emu::Global<S> src, emu::Shared<T> dst, size_t src_bytes) {
    if (src_bytes > 0) emu::on_global_read(src.at, src_bytes);
    __cp_async_shared_global<N>(static_cast<const S*>(src.at), dst, src_bytes);
    emu::PendingCopy& copy = emu::pending_copies[emu::tid].back();
    copy.src = src.at;
    copy.src_bytes = src_bytes;
}

inline void lab_wait_copies() {
    for (const emu::PendingCopy& copy : emu::pending_copies[emu::tid]) {
        if (copy.src_bytes > 0) emu::on_global_read(copy.src, copy.src_bytes);
        emu::on_write(copy.at, copy.size);
        std::memcpy(&emu::shared[copy.at], copy.bytes, copy.size);
    }
    emu::pending_copies[emu::tid].clear();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
    unsigned threads = blockDim.x * blockDim.y * blockDim.z, first = 32 * emu::warp;
    emu::join(emu::whole_warp(), first, std::min(32u, threads - first));
}

// CUDA's fast exp and log: a multiply and the special-function unit's base-2 function, so the
// multiply's rounding is the error they add (the unit's own is a few ulp more). The exp
// flushes results below 2^-126 to zero, as lab's `ex2.approx.ftz` (vendor/cubecl-cpp) does.
// (glibc declares functions of these names; the emulation's own go by other names.)
inline float emu_fast_exp(float x) {
    float y = exp2f(x * 1.44269504088896341f);
    return y < 0x1p-126f ? 0.0f : y;
}
inline float emu_fast_log(float x) { return log2f(x) * 0.693147180559945309f; }
// And the fast pow: the unit's base-2 function of `y · log2 x`; for 2^y (lab's `ex2.approx.ftz`
// of `y`, vendor/cubecl-cpp) exact in the multiply, flushed below 2^-126 as the exp is.
inline float emu_fast_pow(float x, float y) {
    float r = exp2f(y * log2f(x));
    return x == 2.0f && r < 0x1p-126f ? 0.0f : r;
}
#define __expf emu_fast_exp
#define __logf emu_fast_log
#define __powf emu_fast_pow

template <class T>
inline T __shfl_xor_sync(int, T value, unsigned lane_mask) {
    static_assert(sizeof(T) <= 8);
    // Lanes meet here, but their clocks do not join: a shuffle orders no memory.
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    const uint64_t* values = emu::exchange(bits);
    T other;
    std::memcpy(&other, &values[emu::lane ^ lane_mask], sizeof(T));
    return other;
}

// Whether `predicate` holds on every lane of the warp (the members a partial last warp has).
inline bool __all_sync(int, bool predicate) {
    unsigned threads = blockDim.x * blockDim.y * blockDim.z, first = 32 * emu::warp;
    unsigned members = std::min(32u, threads - first);
    const uint64_t* votes = emu::exchange(predicate);
    bool all = true;
    for (unsigned l = 0; l < members; ++l) all = all && votes[l] != 0;
    return all;
}

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// Every lane holds the whole 16x16 tile, widened to float (f16/bf16 values are exact there).
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16x16x16 tiles only");
    float x[256];
};

template <class Use, class T, class L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float value) {
    for (float& e : f.x) e = value;
}

// wmma's requirements: a 256-bit aligned pointer, a leading dimension of whole 16 bytes.
template <class P>
inline void check_operand(emu::Shared<P> p, unsigned ldm) {
    if (p.offset % 32 != 0 || (ldm * sizeof(P)) % 16 != 0) {
        std::fprintf(stderr, "wmma: shared offset %zu (needs 32-byte alignment), ldm %u\n",
                     p.offset, ldm);
        std::abort();
    }
}

// Element (r, c) of a row-major tile is p[r * ldm + c]; of a column-major one p[c * ldm + r].
template <class Use, class T, class L, class P>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, emu::Shared<P> p, unsigned ldm) {
    check_operand(p, ldm);
    constexpr bool cols = std::is_same_v<L, col_major>;
    for (unsigned r = 0; r < 16; ++r)
        for (unsigned c = 0; c < 16; ++c)
            f.x[r * 16 + c] = float(P(cols ? p[c * ldm + r] : p[r * ldm + c]));
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, emu::Shared<float> p,
                             unsigned ldm, layout_t layout) {
    check_operand(p, ldm);
    for (unsigned r = 0; r < 16; ++r)
        for (unsigned c = 0; c < 16; ++c)
            f.x[r * 16 + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}

// Every lane of the warp at wmma's `op` must have passed what this one did (`same(l)`: lane l
// did), or `op` is undefined on a GPU. Run by the lane that ends the phase, while the others
// wait with their arguments on their fibers' stacks.
template <class Same>
inline void lanes_agree(const char* op, const char* passed, Same same) {
    for (unsigned l = 0; l < emu::warp_barriers[emu::warp].members; ++l)
        if (!same(l)) {
            std::fprintf(stderr, "wmma::%s: lane %u of warp %u passed %s than lane %u\n", op, l, emu::warp,
                         passed, emu::lane);
            std::abort();
        }
}

inline bool same_tile(const float* a, const float* b) { return std::memcmp(a, b, 256 * sizeof(float)) == 0; }

// A warp-wide store, as on a GPU, where each lane writes the elements it holds: every lane
// must pass the same tile, place, ldm and layout (undefined otherwise). Which lane holds
// which element is not documented; here lane l writes elements l, l + 32, ... of the tile
// (row by row), so a lane that reads what the store wrote before a __syncwarp races here as
// on a GPU.
// A partial warp (the last of a block that is not a multiple of 32) has no tile to store.
struct TileStore {
    const float* tile;
    size_t offset;
    unsigned ldm;
    layout_t layout;
};
inline TileStore tile_stores[32][32];
inline uint64_t tile_stores_checked[32];

inline void store_matrix_sync(emu::Shared<float> p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
    check_operand(p, ldm);
    emu::Barrier& warp = emu::whole_warp();
    if (warp.members != 32) {
        std::fprintf(stderr, "wmma::store_matrix_sync: warp %u has %u lanes, not 32\n", emu::warp, warp.members);
        std::abort();
    }
    const TileStore mine{f.x, p.offset, ldm, layout};
    tile_stores[emu::warp][emu::lane] = mine;
    warp.arrive_and_find(emu::Meeting::tile_store, tile_stores_checked[emu::warp], [&] {
        lanes_agree("store_matrix_sync", "another tile, place, ldm or layout", [&](unsigned l) {
            const TileStore& other = tile_stores[emu::warp][l];
            return other.offset == mine.offset && other.ldm == ldm && other.layout == layout &&
                   same_tile(other.tile, mine.tile);
        });
    });
    for (unsigned e = emu::lane; e < 256; e += 32) {
        unsigned r = e / 16, c = e % 16;
        (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[e];
    }
}

// A warp-wide operation, as on a GPU. Every lane holds the same tiles here (each loads all of
// a tile), so the lane that ends the phase finds the product once for the warp, having checked
// that every lane passed the same tiles (lanes that do not would get undefined results on a
// GPU). The others' fragments are on their fibers' stacks, which wait here.
inline const float* tile_operands[32][32][3];
struct TileProduct {
    uint64_t phase;
    float d[256];
};
inline TileProduct tile_products[32];

template <class TA, class LA, class TB, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, TB, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
    emu::Barrier& warp = emu::whole_warp();
    const float* const mine[3] = {a.x, b.x, c.x};
    std::copy_n(mine, 3, tile_operands[emu::warp][emu::lane]);
    TileProduct& p = tile_products[emu::warp];
    warp.arrive_and_find(emu::Meeting::tile_product, p.phase, [&] {
        lanes_agree("mma_sync", "other tiles", [&](unsigned l) {
            return std::equal(mine, mine + 3, tile_operands[emu::warp][l], same_tile);
        });
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 16; ++j) {
                float s = c.x[i * 16 + j];
                for (int k = 0; k < 16; ++k) s += a.x[i * 16 + k] * b.x[k * 16 + j];
                p.d[i * 16 + j] = s;
            }
    });
    std::memcpy(d.x, p.d, sizeof p.d);
}
}  // namespace nvcuda::wmma

// The register-level products of `attention::tensor_cores::registers`: cubecl's CUDA C++
// defines each as inline PTX (`ldmatrix`, `mma.sync`), which the emulation defines instead
// (for_emulation drops cubecl's definitions), from the PTX ISA's fragment layouts.
namespace emu {
// Each lane's fragments for mma: 4 registers of A, 2 of B.
inline uint32_t mma_operands[32][32][6];

// ldmatrix .x4 of 16-bit elements: lane l names the 16-byte row at `row` of matrix l / 8, row
// l % 8. Register m of lane l (group g = l / 4, t = l % 4) gets elements 2t and 2t + 1 of
// matrix m's row g, or transposed (`.trans`) element g of its rows 2t and 2t + 1; the first
// in the low 16 bits.
template <class T>
void load_matrices(Shared<T> row, bool transpose, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    static_assert(sizeof(T) == 2, "ldmatrix of 16-bit elements");
    if (row.offset % 16 != 0) {
        std::fprintf(stderr, "ldmatrix: a row at shared byte %zu (needs 16-byte alignment)\n", row.offset);
        std::abort();
    }
    const uint64_t* rows = exchange(row.offset);
    unsigned g = lane / 4, t = lane % 4;
    uint32_t out[4];
    for (unsigned m = 0; m < 4; ++m) {
        size_t first, second;
        if (transpose) {
            first = rows[8 * m + 2 * t] + 2 * g;
            second = rows[8 * m + 2 * t + 1] + 2 * g;
        } else {
            first = rows[8 * m + g] + 4 * t;
            second = first + 2;
        }
        out[m] = uint32_t(read<uint16_t>(first)) | uint32_t(read<uint16_t>(second)) << 16;
    }
    r0 = out[0], r1 = out[1], r2 = out[2], r3 = out[3];
}

// The 16-bit element `half` of a register, widened to float.
template <class T>
float element(uint32_t reg, unsigned half) {
    T value;
    uint16_t bits = uint16_t(reg >> (16 * half));
    std::memcpy(&value, &bits, 2);
    return float(value);
}

// mma.sync m16n8k16, row.col, f32 += T·T. Lane (g, t) holds A (16x16) at registers i = 0..3,
// halves h: row g + 8(i % 2), column 2t + h + 8(i / 2); B (16x8) at i = 0, 1: row 2t + h + 8i,
// column g; C and D (16x8) at elements e = 0..3: row g + 8(e / 2), column 2t + e % 2.
// A warp's mma operands as matrices, gathered once a phase of its barrier.
struct Operands {
    uint64_t phase;
    float A[16][16], B[16][8];
};
inline Operands operands[32];

template <class T>
void multiply(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
    std::memcpy(mma_operands[warp][lane], a, 16);
    std::memcpy(mma_operands[warp][lane] + 4, b, 8);
    Operands& o = operands[warp];
    whole_warp().arrive_and_find(Meeting::register_product, o.phase, [&] {
        for (unsigned l = 0; l < 32; ++l) {
            unsigned lg = l / 4, lt = l % 4;
            for (unsigned i = 0; i < 4; ++i)
                for (unsigned h = 0; h < 2; ++h)
                    o.A[lg + 8 * (i % 2)][2 * lt + h + 8 * (i / 2)] = element<T>(mma_operands[warp][l][i], h);
            for (unsigned i = 0; i < 2; ++i)
                for (unsigned h = 0; h < 2; ++h)
                    o.B[2 * lt + h + 8 * i][lg] = element<T>(mma_operands[warp][l][4 + i], h);
        }
    });
    unsigned g = lane / 4, t = lane % 4;
    for (unsigned e = 0; e < 4; ++e) {
        unsigned row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float sum = c[e];
        for (unsigned k = 0; k < 16; ++k) sum += o.A[row][k] * o.B[k][col];
        d[e] = sum;
    }
}
}  // namespace emu

// cubecl's names for them (by element type; `_trans`: transposed).
#define LAB_EMU_REGISTER_PRODUCTS(T)                                                                 \
    template <class S>                                                                              \
    void __ldmatrix_m8n8_##T##_4x(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, emu::Shared<S> row) { \
        emu::load_matrices(row, false, r0, r1, r2, r3);                                             \
    }                                                                                               \
    template <class S>                                                                              \
    void __ldmatrix_m8n8_##T##_4x_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, emu::Shared<S> row) { \
        emu::load_matrices(row, true, r0, r1, r2, r3);                                              \
    }                                                                                               \
    inline void __mma_m16n8k16_##T##_##T##_float(                                                   \
        uint32_t const& a0, uint32_t const& a1, uint32_t const& a2, uint32_t const& a3,             \
        uint32_t const& b0, uint32_t const& b1, float const& c0, float const& c1, float const& c2,  \
        float const& c3, float& d0, float& d1, float& d2, float& d3) {                              \
        uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};                                          \
        float c[4] = {c0, c1, c2, c3}, d[4];                                                        \
        emu::multiply<T>(a, b, c, d);                                                               \
        d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];                                                 \
    }
LAB_EMU_REGISTER_PRODUCTS(__half)
LAB_EMU_REGISTER_PRODUCTS(__nv_bfloat16)
#undef LAB_EMU_REGISTER_PRODUCTS

namespace emu {
// An argument as the kernel's parameter takes it: a pointer to the storage type becomes one
// to the vector type a kernel reads it as (cubecl's `Tensor<Vector<F, N>>`), whole elements
// at the vector's alignment, as a GPU's vector loads need. Any other argument passes as is.
template <class P>
struct is_global : std::false_type {};
template <class T>
struct is_global<Global<T>> : std::true_type {};

template <class P, class A>
P pass(A a) {
    if constexpr (is_global<P>::value) {
        return P{pass<decltype(P::at)>(a)};
    } else if constexpr (std::is_pointer_v<P> && std::is_pointer_v<A> && !std::is_convertible_v<A, P>) {
        using Vector = std::remove_cv_t<std::remove_pointer_t<P>>;
        using Element = std::remove_cv_t<std::remove_pointer_t<A>>;
        static_assert(sizeof(Vector) % sizeof(Element) == 0 && sizeof(Vector) > sizeof(Element),
                      "a kernel parameter that is not a vector of its argument's elements");
        if (reinterpret_cast<uintptr_t>(a) % alignof(Vector) != 0) {
            std::fprintf(stderr, "a vector parameter's buffer is not %zu-byte aligned\n", alignof(Vector));
            std::abort();
        }
        return reinterpret_cast<P>(a);
    } else {
        return a;
    }
}

// The kernel with its arguments, as each thread of a launch runs it.
inline std::function<void()> thread_body;

// A thread's fiber: the kernel, then its leaving the block's barriers, and back to the
// scheduler for good.
[[noreturn]] inline void thread_main() {
    thread_body();
    if (!pending_copies[tid].empty()) {
        std::fprintf(stderr, "thread %u of block %u,%u,%u ended with %zu cp.async copies not waited for\n", tid,
                     blockIdx.x, blockIdx.y, blockIdx.z, pending_copies[tid].size());
        std::abort();
    }
    if (warp_barriers[warp].arrived > 0)
        hang("a lane ended while others of its warp wait at a warp-wide operation (shuffle, vote, __syncwarp, ldmatrix, mma, a wmma store)");
    // At __syncthreads, as on a GPU, a thread that has ended counts as arrived.
    block_barrier->arrive_and_drop();
    warp_barriers[warp].arrive_and_drop();
    fibers[tid].ended = true;
    switch_context(fibers[tid].context, scheduler);
    std::abort();  // never resumed
}

// Whether thread `t` can run: not ended, and not waiting at a barrier whose phase goes on.
inline bool can_run(unsigned t) {
    const Fiber& f = fibers[t];
    return !f.ended && (!f.waits_at || f.waits_at->phase != f.phase);
}

inline void switch_to(unsigned t) {
    tid = t;
    warp = t / 32;
    lane = t % 32;
    threadIdx = {t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
    switch_context(scheduler, fibers[t].context);
}

// Every thread waits for a barrier's phase that cannot end: a barrier or shuffle that some of
// the block's threads never reach (a hang on a GPU). Exit 124, as coreutils' `timeout` does.
[[noreturn]] inline void deadlock(unsigned threads) {
    unsigned waiting = 0;
    for (unsigned t = 0; t < threads; ++t) waiting += !fibers[t].ended;
    char why[160];
    std::snprintf(why, sizeof why, "%u threads wait at barriers or warp-wide operations that the others never reach",
                  waiting);
    hang(why);
}

// The block's threads, each from the start until it waits or ends, in turn, until all end.
inline void run_block(unsigned threads) {
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f.waits_at = nullptr;
        f.ended = false;
        start_context(f.context, fiber_stack(t), stack_size, thread_main);
    }
    for (unsigned ended = 0; ended < threads;) {
        bool ran = false;
        for (unsigned t = 0; t < threads; ++t)
            if (can_run(t)) {
                switch_to(t);
                ran = true;
                ended += fibers[t].ended;
            }
        if (!ran) deadlock(threads);
    }
}

// Runs `kernel(args...)` over `grid`, one block after another.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    blockDim = block;
    gridDim = grid;
    unsigned threads = block.x * block.y * block.z, warps = (threads + 31) / 32;
    thread_body = [=] { kernel(pass<Params>(args)...); };
    global_accesses.clear();
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                block_number = (int64_t(z) * grid.y + y) * grid.x + x;
                std::memset(shared, 0xff, sizeof shared);  // NaN-ish garbage, as a GPU's
                reset_races(threads);
                Barrier barrier(threads);
                block_barrier = &barrier;
                warp_barriers.clear();
                for (unsigned w = 0; w < warps; ++w) warp_barriers.emplace_back(std::min(32u, threads - 32 * w));
                run_block(threads);
            }
}
}  // namespace emu
