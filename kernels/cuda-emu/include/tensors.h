// What the emulation's drivers (attention.cpp, rows.cpp, step.cpp) share: tensor arguments in
// cubecl's metadata, seeded inputs, the error against an fp64 reference, and their reports.
#pragma once

#include "emu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

// A tensor argument: its shape and strides, as cubecl's metadata describes it (row-major
// strides when none are given).
struct Arg {
    std::vector<unsigned> shape;
    std::vector<unsigned> strides;
    // Elements the kernel reads as one value: its lengths count these (cubecl's launcher).
    unsigned vector = 1;
    // Elements in the buffer where it holds more than the shape spans (a view of the first
    // columns of wider rows); 0 where it holds just that.
    unsigned buffer = 0;
};

// cubecl's kernel info (codegen/metadata.rs), passed by value as a `__grid_constant__`: the
// scalars, then per buffer its length, logical length, rank, shape offset and stride offset
// into the dynamic metadata, which holds every shape, then every stride.
template <class Info>
struct Metadata {
    Info info{};
    std::vector<uint32_t> dynamic;
};

// The tensors' part of the info and the dynamic metadata; the caller sets the scalars.
template <class Info>
Metadata<Info> tensor_metadata(const std::vector<Arg>& args) {
    size_t n = args.size();
    static_assert(sizeof(Info::static_meta) % 4 == 0);
    // Five entries a tensor, rounded up to an even count (as cubecl sizes the array): fewer
    // or more tensors than the kernel takes would lay the entries out for another count.
    if (sizeof(Info::static_meta) / 4 != ((5 * n + 1) & ~size_t(1))) {
        std::fprintf(stderr, "metadata: %zu tensors, where the kernel's static_meta holds %zu entries\n", n,
                     sizeof(Info::static_meta) / 4);
        std::exit(2);
    }
    Metadata<Info> m;
    std::vector<uint32_t> strides, offsets;
    for (const Arg& a : args) {
        offsets.push_back(uint32_t(m.dynamic.size()));
        m.dynamic.insert(m.dynamic.end(), a.shape.begin(), a.shape.end());
        std::vector<uint32_t> s(a.shape.size(), 1);
        for (size_t d = a.shape.size() - 1; d > 0; --d) s[d - 1] = s[d] * a.shape[d];
        if (!a.strides.empty()) s.assign(a.strides.begin(), a.strides.end());
        strides.insert(strides.end(), s.begin(), s.end());
    }
    uint32_t shapes = uint32_t(m.dynamic.size());
    m.dynamic.insert(m.dynamic.end(), strides.begin(), strides.end());
    for (size_t i = 0; i < n; ++i) {
        uint32_t len = std::accumulate(args[i].shape.begin(), args[i].shape.end(), 1u,
                                       [](uint32_t a, uint32_t b) { return a * b; });
        uint32_t buffer = args[i].buffer ? args[i].buffer : len;
        m.info.static_meta[i] = buffer / args[i].vector;
        m.info.static_meta[n + i] = len / args[i].vector;
        m.info.static_meta[2 * n + i] = uint32_t(args[i].shape.size());
        m.info.static_meta[3 * n + i] = offsets[i];
        m.info.static_meta[4 * n + i] = shapes + offsets[i];
    }
    return m;
}

// Seeded N(0, 1) values rounded to `V`.
template <class V>
std::vector<V> random_values(size_t n, uint64_t seed) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull | 1;
    auto uniform = [&] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return (double(state >> 11) + 0.5) / double(1ull << 53);
    };
    std::vector<V> out(n);
    for (V& x : out) x = V(float(sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform())));
    return out;
}

// The largest |got - want| over max(floor, max |want|); NaN (an unwritten element) is
// infinite.
template <class G>
double error(const std::vector<G>& got, const std::vector<double>& want, double floor = 1) {
    double peak = floor, worst = 0;
    for (double w : want) peak = std::max(peak, fabs(w));
    for (size_t i = 0; i < want.size(); ++i) {
        double e = fabs(double(float(got[i])) - want[i]);
        worst = e == e ? std::max(worst, e) : INFINITY;
    }
    return worst / peak;
}

// The largest |got - want| over max(|want|, floor), element by element: for values far smaller
// than the largest, which `error` would measure against it. NaN is infinite.
template <class G>
double relative_error(const std::vector<G>& got, const std::vector<double>& want, double floor) {
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        double e = fabs(double(float(got[i])) - want[i]) / std::max(fabs(want[i]), floor);
        worst = e == e ? std::max(worst, e) : INFINITY;
    }
    return worst;
}

#define QUOTE2(x) #x
#define QUOTE(x) QUOTE2(x)

// Each driver's name in its reports (`rows`, `step`); the storage type's is -DSUFFIX.
extern const char* const driver_name;
inline bool all_passed = true;

// Prints one check's line and remembers a failure.
inline void report(const char* kernel, const std::string& shape, const char* what, double err, double limit) {
    bool pass = err <= limit;
    all_passed &= pass;
    std::printf("%s %-5s %-22s %-16s %-8s %.1e%s (tolerance %.0e)\n", driver_name, QUOTE(SUFFIX), kernel, shape.c_str(), what,
                err, pass ? "" : " FAIL", limit);
}

// `format` filled in, as printf: a case's shape for its reports.
template <class... A>
std::string text(const char* format, A... args) {
    char out[96];
    std::snprintf(out, sizeof out, format, args...);
    return out;
}

// 0 where every element of `got` in `marked` kept its bits from `before`, else
// infinite.
template <class V>
double bits_changed(const std::vector<V>& got, const std::vector<V>& before, const std::vector<bool>& marked) {
    for (size_t i = 0; i < got.size(); ++i)
        if (marked[i] && std::memcmp(&got[i], &before[i], sizeof(V)) != 0) return INFINITY;
    return 0;
}

// 0 where every element of `got` has the bits of `want`'s, else infinite.
template <class V>
double bits_differ(const std::vector<V>& got, const std::vector<V>& want) {
    return bits_changed(got, want, std::vector<bool>(got.size(), true));
}

inline unsigned ceil_div(size_t n, unsigned d) { return unsigned((n + d - 1) / d); }

// A grid of cubes of `cube` units for `units` units, as cubecl's calculate_cube_count_elemwise
// lays out a small launch.
inline emu::dim3 grid_for(size_t units, unsigned cube) { return {ceil_div(units, cube), 1, 1}; }
