// Runs cubecl's CUDA C++ of the attention (forward, dQ, dK/dV: the .cu files that
// kernels/src/attention/cuda_source.rs writes) on the CPU emulation in include/emu.h,
// against an fp64 reference, as kernels/tests/attention.rs checks the kernels on a GPU.
// Built and run by that file's tests, once per set of kernels, storage type and head width:
//   -DSTORAGE=__half -DSUFFIX=f16 -DHEAD_DIM=64, with forward.cu, grad_q.cu, grad_kv.cu on
//   the include path (each `info_st` and entry renamed after its file: info_grad_q,
//   grad_q_kernel); grad_kv_values.cu and grad_kv_keys.cu in grad_kv.cu's place where the
//   kernels come that way (the tensor cores' dK and dV launched apart, as above hd 64); for the
//   f32-arithmetic kernels also -DKERNELS=…, -DROWS=<rows a cube owns> and each kernel's cube
//   as -DFORWARD_CUBE=x,y,z (GRAD_Q_CUBE, GRAD_KV_CUBE); -DQUERY_ROWS=<rows a forward or dQ
//   cube owns> where it differs from ROWS (the register kernels' 128 up to hd 64); -DLSE_LOG2
//   for kernels whose backward reads lse in base 2 (the register kernels; without it the
//   backward gets natural lse, as the bounce and f32-arithmetic kernels read it). The other
//   defaults are the tensor cores'.
#include "emu.h"
#include "tensors.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <numeric>

#include "forward.cu"
#include "grad_q.cu"
// dK and dV apart where the folder holds their two launches (tensor_cores::KvGrads).
#if __has_include("grad_kv_keys.cu")
#define SPLIT_KV
#include "grad_kv_keys.cu"
#include "grad_kv_values.cu"
#else
#include "grad_kv.cu"
#endif

using T = STORAGE;
constexpr unsigned hd = HEAD_DIM;
#ifndef ROWS
// The tensor-core kernels: 16 rows per warp, 4 warps a block (tensor_cores::PLANES); the
// register forward and dQ 32 query rows a warp up to hd 64 (QUERY_ROWS, from the test).
#define KERNELS mma
#define ROWS 64
#define FORWARD_CUBE 32, 4, 1
#define GRAD_Q_CUBE 32, 4, 1
#define GRAD_KV_CUBE 32, 4, 1
#endif
constexpr unsigned rows = ROWS;
#ifndef QUERY_ROWS
#define QUERY_ROWS ROWS
#endif
constexpr unsigned query_rows = QUERY_ROWS;

// Elements the kernels read q, k, v and dO as one value (cubecl's `Tensor<Vector<F, N>>`: 8 for
// the tensor cores', 1 for the others), from the forward's first parameter, q.
template <class F>
struct first_param;
template <class R, class P, class... Ps>
struct first_param<R(P, Ps...)> {
    using type = P;
};
constexpr unsigned input_vector =
    sizeof(emu::pointee_t<typename first_param<decltype(forward_kernel)>::type>) / sizeof(STORAGE);

// Which tensors a case stores [B, T, heads, hd] and passes as [B, heads, T, hd] views (the
// middle axes swapped, as the model passes its projections); the others are contiguous.
enum Swapped { swap_none, swap_all, swap_qkv };

struct Case {
    unsigned batch, heads, kv_heads, seq;
    Swapped swapped;
    // An attention sink: key 0 scores ~6 above the rest for every query (a shared direction in
    // q and a large k[0]), so that later tiles seldom raise a row's max and the tensor-core
    // forward's skipped rescale is taken.
    bool sink = false;
};

// The two groups of tensors a case may lay out differently: q, k, v; and dO with the outputs.
enum Group { group_qkv, group_rest };

bool is_swapped(const Case& c, Group g) {
    return c.swapped == swap_all || (c.swapped == swap_qkv && g == group_qkv);
}

// An input (q, k, v, dO) as the kernels read it: `input_vector` elements at a time.
Arg input(Arg a) {
    a.vector = input_vector;
    return a;
}

// A [B, heads, T, hd] argument of group `g`, in the case's layout.
Arg heads_arg(const Case& c, Group g, unsigned heads) {
    if (!is_swapped(c, g)) return {{c.batch, heads, c.seq, hd}, {}};
    return {{c.batch, heads, c.seq, hd}, {c.seq * heads * hd, hd, heads * hd, 1}};
}

// Logical [B, heads, T, hd] values of group `g` stored in the case's layout, and back.
template <class V>
V stored(const Case& c, Group g, unsigned heads, const V& x, bool back = false) {
    if (!is_swapped(c, g)) return x;
    V out(x.size());
    for (unsigned b = 0; b < c.batch; ++b)
        for (unsigned h = 0; h < heads; ++h)
            for (unsigned t = 0; t < c.seq; ++t)
                for (unsigned d = 0; d < hd; ++d) {
                    size_t logical = ((size_t(b) * heads + h) * c.seq + t) * hd + d;
                    size_t physical = ((size_t(b) * c.seq + t) * heads + h) * hd + d;
                    if (back) out[logical] = x[physical];
                    else out[physical] = x[logical];
                }
    return out;
}

// cubecl's kernel info with the scale as its one float scalar.
template <class Info>
Metadata<Info> metadata(float scale, const std::vector<Arg>& args) {
    Metadata<Info> m = tensor_metadata<Info>(args);
    m.info.scalars_float[0] = scale;
    return m;
}

std::vector<T> values(size_t n, uint64_t seed) { return random_values<T>(n, seed); }

struct Reference {
    std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Case& c, const std::vector<T>& q, const std::vector<T>& k,
                    const std::vector<T>& v, const std::vector<T>& d_out, double scale) {
    unsigned t = c.seq, group = c.heads / c.kv_heads;
    Reference r;
    r.out.assign(q.size(), 0);
    r.dq.assign(q.size(), 0);
    r.lse.assign(size_t(c.batch) * c.heads * t, 0);
    r.dk.assign(k.size(), 0);
    r.dv.assign(k.size(), 0);
    std::vector<double> p(t);
    for (unsigned b = 0; b < c.batch; ++b)
        for (unsigned h = 0; h < c.heads; ++h) {
            size_t qb = (size_t(b) * c.heads + h) * t * hd;
            size_t kb = (size_t(b) * c.kv_heads + h / group) * t * hd;
            for (unsigned i = 0; i < t; ++i) {
                double m = -1e300, l = 0;
                for (unsigned j = 0; j <= i; ++j) {
                    double s = 0;
                    for (unsigned d = 0; d < hd; ++d) s += double(q[qb + i * hd + d]) * double(k[kb + j * hd + d]);
                    p[j] = s * scale;
                    m = std::max(m, p[j]);
                }
                for (unsigned j = 0; j <= i; ++j) l += (p[j] = exp(p[j] - m));
                r.lse[(size_t(b) * c.heads + h) * t + i] = m + log(l);
                double delta = 0;
                for (unsigned d = 0; d < hd; ++d) {
                    double o = 0;
                    for (unsigned j = 0; j <= i; ++j) o += p[j] / l * double(v[kb + j * hd + d]);
                    r.out[qb + i * hd + d] = o;
                    delta += o * double(d_out[qb + i * hd + d]);
                }
                for (unsigned j = 0; j <= i; ++j) {
                    double pj = p[j] / l, dp = 0;
                    for (unsigned d = 0; d < hd; ++d) dp += double(d_out[qb + i * hd + d]) * double(v[kb + j * hd + d]);
                    double ds = pj * (dp - delta);
                    for (unsigned d = 0; d < hd; ++d) {
                        r.dq[qb + i * hd + d] += scale * ds * double(k[kb + j * hd + d]);
                        r.dk[kb + j * hd + d] += scale * ds * double(q[qb + i * hd + d]);
                        r.dv[kb + j * hd + d] += pj * double(d_out[qb + i * hd + d]);
                    }
                }
            }
        }
    return r;
}

bool check(const Case& c, uint64_t seed, double tolerance) {
    size_t nq = size_t(c.batch) * c.heads * c.seq * hd, nk = size_t(c.batch) * c.kv_heads * c.seq * hd;
    size_t nrow = size_t(c.batch) * c.heads * c.seq;
    auto q = values(nq, seed), k = values(nk, seed + 1), v = values(nk, seed + 2), d_out = values(nq, seed + 3);
    if (c.sink) {
        for (size_t r = 0; r < nq / hd; ++r) q[r * hd] = T(float(q[r * hd]) + 3);
        for (size_t head = 0; head < nk / (size_t(c.seq) * hd); ++head) k[head * c.seq * hd] = T(2 * sqrtf(float(hd)));
    }
    float scale = 1.0f / sqrtf(float(hd));
    std::vector<T> out(nq, T(NAN)), dq(nq, T(NAN)), dk(nk, T(NAN)), dv(nk, T(NAN));
    std::vector<float> lse(nrow, NAN), delta(nrow);
    // The kernels see the case's layouts; the reference and the checks see logical values.
    Arg aq = heads_arg(c, group_qkv, c.heads), akv = heads_arg(c, group_qkv, c.kv_heads);
    Arg arq = heads_arg(c, group_rest, c.heads), arkv = heads_arg(c, group_rest, c.kv_heads);
    Arg arow{{c.batch, c.heads, c.seq}, {}};
    auto sq = stored(c, group_qkv, c.heads, q), sk = stored(c, group_qkv, c.kv_heads, k);
    auto sv = stored(c, group_qkv, c.kv_heads, v), s_do = stored(c, group_rest, c.heads, d_out);
    emu::dim3 grid{(c.seq + rows - 1) / rows, c.heads, c.batch};
    emu::dim3 query_grid{(c.seq + query_rows - 1) / query_rows, c.heads, c.batch};

    auto fwd = metadata<info_forward>(scale, {input(aq), input(akv), input(akv), arq, arow});
    emu::launch(forward_kernel, query_grid, emu::dim3{FORWARD_CUBE}, sq.data(), sk.data(), sv.data(), out.data(), lse.data(),
                fwd.dynamic.data(), fwd.info);
    out = stored(c, group_rest, c.heads, out, true);
    for (size_t r = 0; r < nrow; ++r) {  // D = dO·O in f32, as the delta kernel
        float s = 0;
        for (unsigned d = 0; d < hd; ++d) s += float(d_out[r * hd + d]) * float(out[r * hd + d]);
        delta[r] = s;
    }
    // The register kernels (-DLSE_LOG2) read lse · log2 e, in f32 as the delta kernel writes it.
    std::vector<float> backward_lse = lse;
#ifdef LSE_LOG2
    for (float& x : backward_lse) x *= 1.44269504088896340736f;
#endif
    auto gq = metadata<info_grad_q>(scale, {input(aq), input(akv), input(akv), input(arq), arow, arow, arq});
    emu::launch(grad_q_kernel, query_grid, emu::dim3{GRAD_Q_CUBE}, sq.data(), sk.data(), sv.data(), s_do.data(), backward_lse.data(),
                delta.data(), dq.data(), gq.dynamic.data(), gq.info);
    emu::dim3 kv_grid{grid.x, c.kv_heads, c.batch};
    std::vector<Arg> kv_args{input(aq), input(akv), input(akv), input(arq), arow, arow, arkv, arkv};
#ifdef SPLIT_KV
    auto gv = metadata<info_grad_kv_values>(scale, kv_args);
    emu::launch(grad_kv_values_kernel, kv_grid, emu::dim3{GRAD_KV_CUBE}, sq.data(), sk.data(), sv.data(), s_do.data(),
                backward_lse.data(), delta.data(), dk.data(), dv.data(), gv.dynamic.data(), gv.info);
    auto gk = metadata<info_grad_kv_keys>(scale, kv_args);
    emu::launch(grad_kv_keys_kernel, kv_grid, emu::dim3{GRAD_KV_CUBE}, sq.data(), sk.data(), sv.data(), s_do.data(),
                backward_lse.data(), delta.data(), dk.data(), dv.data(), gk.dynamic.data(), gk.info);
#else
    auto gkv = metadata<info_grad_kv>(scale, kv_args);
    emu::launch(grad_kv_kernel, kv_grid, emu::dim3{GRAD_KV_CUBE}, sq.data(), sk.data(), sv.data(), s_do.data(), backward_lse.data(),
                delta.data(), dk.data(), dv.data(), gkv.dynamic.data(), gkv.info);
#endif
    dq = stored(c, group_rest, c.heads, dq, true);
    dk = stored(c, group_rest, c.kv_heads, dk, true);
    dv = stored(c, group_rest, c.kv_heads, dv, true);

    Reference want = reference(c, q, k, v, d_out, scale);
    double errors[] = {error(out, want.out), error(lse, want.lse), error(dq, want.dq),
                       error(dk, want.dk), error(dv, want.dv)};
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    bool ok = true;
    std::printf("%-10s %-5s hd %3u  B %u H %u KV %u T %3u %s:", QUOTE(KERNELS), QUOTE(SUFFIX), hd, c.batch, c.heads,
                c.kv_heads, c.seq, c.swapped == swap_all ? "swapped   " : c.swapped == swap_qkv ? "qkv swapped" : c.sink ? "sink      " : "contiguous");
    for (int i = 0; i < 5; ++i) {
        bool pass = errors[i] <= tolerance;
        ok &= pass;
        std::printf("  %s %.1e%s", names[i], errors[i], pass ? "" : " FAIL");
    }
    std::printf("  (tolerance %.0e)\n", tolerance);
    return ok;
}

int main() {
    // The kernel tests' tolerances (kernels/tests/attention.rs): f16 4e-3, bf16 3e-2.
    double tolerance = std::is_same_v<T, __half> ? 4e-3 : 3e-2;
    // One tile, a partial last tile, several tiles; GQA groups of 1 to 3, and a group of one
    // with tiles past the diagonal (dK/dV's walk goes from a head's last such tile to its
    // diagonal one); a single row; the model's layout (heads swapped) with a partial tile and
    // with several; q, k, v swapped and the rest contiguous, so that no tensor is read or
    // written at another's strides; an attention sink.
    Case cases[] = {{1, 2, 1, 1, swap_none},  {1, 2, 2, 64, swap_none},  {2, 4, 2, 37, swap_none},
                    {2, 4, 2, 130, swap_none}, {1, 6, 2, 200, swap_none}, {2, 4, 2, 37, swap_all},
                    {1, 6, 2, 130, swap_all},  {2, 4, 2, 37, swap_qkv}, {1, 4, 2, 200, swap_none, true},
                    {1, 2, 2, 130, swap_none}};
    bool ok = true;
    uint64_t seed = 11;
    for (size_t n = 0; n < std::size(cases); ++n, seed += 10) ok &= check(cases[n], seed + 10, tolerance);
    return ok ? 0 : 1;
}
