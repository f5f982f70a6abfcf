// Runs cubecl's CUDA C++ of the training step's kernels that run in f32 whatever the precision
// (the embedding's backward, the gradient norm's sums of squares, AdamW), and the attention's
// `D = dO·O` as bf16 training runs it, on the CPU emulation in include/emu.h, against fp64
// references, as kernels/tests/{embedding,square_sums,adamw,attention}.rs check them on a GPU. lavapipe runs the same #[cube] source as WGSL, where a race on shared
// memory (the embedding's tiles of ids, the sums' tree) shows only if the order it runs the
// units in makes a result wrong: the emulation's race detector names one whatever the order.
// Built and run by kernels/src/cuda_source.rs's test with -DSTORAGE=float -DSUFFIX=f32,
// each kernel's .cu file on the include path, and their cubes and launch sizes as lab_kernels
// launches them (-DEMBEDDING_UNITS=256 …). Outputs start as NaN, so an element no unit writes
// fails.
#include "emu.h"
#include "tensors.h"

#include <cstdio>
#include <string>

#include "adamw.cu"
#include "adamw_matrix_grad.cu"
#include "delta.cu"
#include "embedding_grad.cu"
#include "partial_squares.cu"
#include "partial_squares_matrix.cu"
#include "sum_partials.cu"

const char* const driver_name = "step";
constexpr unsigned embedding_units = EMBEDDING_UNITS, rows_per_slice = ROWS_PER_SLICE;
constexpr unsigned square_units = SQUARE_UNITS, most_square_cubes = MOST_SQUARE_CUBES;
constexpr unsigned adamw_units = ADAMW_UNITS;
// The attention's `D` kernel: the head width it is compiled for, its units a cube.
constexpr unsigned delta_head_dim = DELTA_HEAD_DIM, delta_units = DELTA_UNITS;

// The embedding's gradient `[vocab, d]` from `dy [n, d]` (rows `dy_stride` apart) and ids:
// each element the sum of its positions' `dy` in f32, in ascending order from zero (the same
// bits as that sum here), and within f32's rounding of fp64's.
void check_embedding(unsigned vocab, unsigned d, unsigned n, unsigned dy_stride, uint64_t seed) {
    auto dy = random_values<float>(size_t(n) * dy_stride, seed);
    std::vector<int32_t> ids(n);
    uint64_t state = seed;
    for (int32_t& id : ids) state = state * 6364136223846793005ull + 1442695040888963407ull, id = int32_t((state >> 33) % vocab);
    std::vector<float> in_order(size_t(vocab) * d, 0.0f), grad(size_t(vocab) * d, NAN);
    std::vector<double> want(size_t(vocab) * d, 0.0);
    for (unsigned i = 0; i < n; ++i)
        for (unsigned c = 0; c < d; ++c) {
            size_t at = size_t(ids[i]) * d + c;
            in_order[at] += dy[i * dy_stride + c];
            want[at] += dy[i * dy_stride + c];
        }
    auto m = tensor_metadata<info_embedding_grad>({Arg{{n, d}, {dy_stride, 1}, 1, n * dy_stride}, Arg{{n}, {}},
                                                   Arg{{vocab, d}, {}}});
    m.info.scalars_uint32[0] = rows_per_slice;
    emu::dim3 cubes{ceil_div(d, embedding_units), ceil_div(vocab, rows_per_slice), 1};
    emu::launch(embedding_grad_kernel, cubes, emu::dim3{embedding_units}, dy.data(), ids.data(), grad.data(),
                m.dynamic.data(), m.info);
    const auto shape = text("%ux%u/%u,%u", vocab, d, n, dy_stride);
    std::vector<bool> every(grad.size(), true);
    report("embedding_grad", shape, "in order", bits_changed(grad, in_order, every), 0);
    report("embedding_grad", shape, "fp64", error(grad, want), 1e-5);
}

// The cubes (and partial sums) lab gives a tensor of `n` elements (square_sums::cubes_for).
unsigned square_cubes(size_t n) { return std::min(ceil_div(n, square_units), most_square_cubes); }

// Σ x² over a flat tensor of `n` elements and a `[rows, cols]` matrix stored column-major,
// through their partial sums (the matrix's at an offset after the flat tensor's) and one
// cube's sum of them.
void check_square_sums(size_t n, unsigned rows, unsigned cols, uint64_t seed) {
    auto flat = random_values<float>(n, seed), matrix = random_values<float>(size_t(rows) * cols, seed + 1);
    double want = 0;
    for (float x : flat) want += double(x) * x;
    for (float x : matrix) want += double(x) * x;
    unsigned flat_cubes = square_cubes(n), matrix_cubes = square_cubes(size_t(rows) * cols);
    unsigned count = flat_cubes + matrix_cubes;
    std::vector<float> partials(count, NAN), total(1, NAN);
    Arg apartials{{count}, {}};
    auto fm = tensor_metadata<info_partial_squares>({Arg{{unsigned(n)}, {}}, apartials});
    fm.info.scalars_uint32[0] = 0;
    emu::launch(partial_squares_kernel, emu::dim3{flat_cubes}, emu::dim3{square_units}, flat.data(), partials.data(),
                fm.dynamic.data(), fm.info);
    auto mm = tensor_metadata<info_partial_squares_matrix>({Arg{{rows, cols}, {1, rows}}, apartials});
    mm.info.scalars_uint32[0] = flat_cubes;
    emu::launch(partial_squares_matrix_kernel, emu::dim3{matrix_cubes}, emu::dim3{square_units}, matrix.data(),
                partials.data(), mm.dynamic.data(), mm.info);
    auto sm = tensor_metadata<info_sum_partials>({apartials, Arg{{1}, {}}});
    sm.info.scalars_uint32[0] = count;
    emu::launch(sum_partials_kernel, emu::dim3{1}, emu::dim3{square_units}, partials.data(), total.data(),
                sm.dynamic.data(), sm.info);
    const auto shape = text("%zu+%ux%u/%u", n, rows, cols, count);
    report("square_sums", shape, "sum", error(total, {want}, 1.0), 1e-5);
}

// One AdamW step of `n` parameters from moments, at step 3; the gradient flat, or a
// `[rows, n / rows]` matrix stored column-major.
void check_adamw(unsigned n, unsigned rows, uint64_t seed) {
    auto param = random_values<float>(n, seed), grad = random_values<float>(n, seed + 1);
    auto m_in = random_values<float>(n, seed + 2), v_in = random_values<float>(n, seed + 3);
    for (float& v : v_in) v = v * v;
    const double beta1 = 0.9, beta2 = 0.95, lr = 1e-3, wd = 0.1, eps = 1e-8, clip = 0.5, t = 3;
    const float constants[10] = {float(clip),  float(beta1), float(1 - beta1), float(beta2),
                                 float(1 - beta2), float(1 - pow(beta1, t)), float(1 - pow(beta2, t)),
                                 float(eps), float(lr), float(1 - lr * wd)};
    unsigned cols = rows ? n / rows : 0;
    // The gradient's element in row-major order `i`, where it is stored.
    auto grad_at = [&](unsigned i) { return rows ? (i % cols) * rows + i / cols : i; };
    std::vector<double> want_p(n), want_m(n), want_v(n);
    for (unsigned i = 0; i < n; ++i) {
        double g = double(grad[grad_at(i)]) * constants[0];
        double m = beta1 * m_in[i] + (1 - beta1) * g, v = beta2 * v_in[i] + (1 - beta2) * g * g;
        double update = (m / constants[5]) / (sqrt(v / constants[6]) + eps);
        want_p[i] = param[i] * constants[9] - update * lr, want_m[i] = m, want_v[i] = v;
    }
    std::vector<float> p_out(n, NAN), m_out(n, NAN), v_out(n, NAN);
    Arg flat{{n}, {}}, agrad = rows ? Arg{{rows, cols}, {1, rows}} : flat;
    auto launch = [&](auto kernel, auto meta) {
        std::copy_n(constants, 10, meta.info.scalars_float);
        emu::launch(kernel, grid_for(n, adamw_units), emu::dim3{adamw_units}, param.data(), grad.data(), m_in.data(),
                    v_in.data(), p_out.data(), m_out.data(), v_out.data(), meta.dynamic.data(), meta.info);
    };
    if (rows) launch(adamw_matrix_grad_kernel, tensor_metadata<info_adamw_matrix_grad>({flat, agrad, flat, flat, flat, flat, flat}));
    else launch(adamw_kernel, tensor_metadata<info_adamw>({flat, agrad, flat, flat, flat, flat, flat}));
    const auto shape = rows ? text("%u as %ux%u", n, rows, cols) : text("%u", n);
    const char* kernel = rows ? "adamw matrix grad" : "adamw";
    report(kernel, shape, "param", error(p_out, want_p), 1e-6);
    report(kernel, shape, "m", error(m_out, want_m), 1e-6);
    report(kernel, shape, "v", error(v_out, want_v), 1e-6);
}

// `D = Σ dO·O` of each row and `lse · log2 e`, of `O` and `dO` `[B, H, T, hd]` in bf16 stored
// `[B, T, H, hd]` (the model's swapped heads), `lse` and the outputs f32 `[B, H, T]`.
void check_delta(unsigned b, unsigned h, unsigned t, uint64_t seed) {
    using bf16 = __nv_bfloat16;
    const unsigned hd = delta_head_dim, rows = b * h * t;
    auto out = random_values<bf16>(size_t(rows) * hd, seed), d_out = random_values<bf16>(size_t(rows) * hd, seed + 1);
    auto lse = random_values<float>(rows, seed + 2);
    std::vector<double> want_delta(rows), want_log2(rows);
    for (unsigned i = 0; i < b; ++i)
        for (unsigned head = 0; head < h; ++head)
            for (unsigned s = 0; s < t; ++s) {
                size_t row = (size_t(i) * h + head) * t + s, at = ((size_t(i) * t + s) * h + head) * hd;
                double sum = 0;
                for (unsigned e = 0; e < hd; ++e) sum += double(float(d_out[at + e])) * float(out[at + e]);
                want_delta[row] = sum;
                want_log2[row] = lse[row] * 1.4426950408889634;
            }
    std::vector<float> delta(rows, NAN), lse_log2(rows, NAN);
    Arg swapped{{b, h, t, hd}, {t * h * hd, hd, h * hd, 1}}, per_row{{b, h, t}, {}};
    auto m = tensor_metadata<info_delta>({swapped, swapped, per_row, per_row, per_row});
    emu::launch(delta_kernel, emu::dim3{ceil_div(t, delta_units), h, b}, emu::dim3{delta_units}, out.data(),
                d_out.data(), lse.data(), delta.data(), lse_log2.data(), m.dynamic.data(), m.info);
    const auto shape = text("%ux%ux%ux%u", b, h, t, hd);
    report("attention delta (bf16)", shape, "D", error(delta, want_delta), 1e-5);
    report("attention delta (bf16)", shape, "lse log2", error(lse_log2, want_log2), 1e-6);
}

int main() {
    // Two slices of the table, the last partial; two cubes of columns, the last partial; three
    // tiles of ids, the last partial; pitched `dy`.
    check_embedding(700, 300, 600, 310, 1);
    check_embedding(5, 3, 1, 3, 2);
    // Fewer elements than a cube; the most cubes, each unit taking several elements (a flat
    // tensor past 1,024 cubes of 256), and more partial sums than the last cube has units.
    check_square_sums(100, 3, 5, 3);
    check_square_sums(300000, 70, 45, 4);
    check_adamw(1000, 0, 5);
    check_adamw(1000, 40, 6);
    // A partial cube of rows, and more than one cube.
    check_delta(2, 3, 37, 7);
    check_delta(1, 2, 130, 8);
    return all_passed ? 0 : 1;
}
