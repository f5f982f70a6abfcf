// Runs cubecl's CUDA C++ of the training step's kernels that the other drivers do not, on the
// CPU emulation in include/emu.h, against fp64 references, as
// kernels/tests/{embedding,square_sums,adamw,attention}.rs check them on a GPU: those that run
// in f32 whatever the precision (the embedding's backward, the gradient norm's sums of
// squares, AdamW), the sums of squares of bf16 tensors (the bf16 copies of the weights that
// `zero = 1` keeps), and the attention's `D = dO·O` from bf16 rows. lavapipe runs the same
// #[cube] source as WGSL, where a race on shared memory (the embedding's tiles of ids, the
// sums' tree) shows only if the order it runs the units in makes a result wrong: the
// emulation's race detector names one whatever the order. Built and run by
// kernels/src/cuda_source.rs's test with -DSTORAGE=float -DSUFFIX=f32, each kernel's .cu file on
// the include path, and their cubes and launch sizes as lab_kernels launches them
// (-DEMBEDDING_UNITS=256 …). Outputs start as NaN, so an element no unit writes fails.
// Tolerances: f32 sums of up to ~10^5 terms are within ~10^-6 of fp64's relative to their
// size, so 1e-5 leaves room; AdamW's few operations an element, 1e-6. The faults these checks
// were run against fail by 10^-2 or more.
#include "emu.h"
#include "tensors.h"

#include <cstdio>
#include <string>

#include "adamw.cu"
#include "adamw_first.cu"
#include "adamw_first_matrix_grad.cu"
#include "adamw_matrix_grad.cu"
#include "delta.cu"
#include "delta_wide.cu"
#include "embedding_grad.cu"
#include "partial_squares.cu"
#include "partial_squares_bf16.cu"
#include "partial_squares_bf16_matrix.cu"
#include "partial_squares_matrix.cu"
#include "sum_partials.cu"

using bf16 = __nv_bfloat16;
const char* const driver_name = "step";
constexpr unsigned embedding_units = EMBEDDING_UNITS, rows_per_slice = ROWS_PER_SLICE;
constexpr unsigned square_units = SQUARE_UNITS, most_square_cubes = MOST_SQUARE_CUBES;
constexpr unsigned adamw_units = ADAMW_UNITS;
// The attention's `D` kernel: the head widths of its two builds, its units a cube.
constexpr unsigned delta_head_dim = DELTA_HEAD_DIM, delta_wide_head_dim = DELTA_WIDE_HEAD_DIM;
constexpr unsigned delta_units = DELTA_UNITS;

// A `[rows, cols]` matrix as the kernels read one at its strides: column-major, or every other
// row of a buffer twice its size (a half of the feed-forward's joined gate|up, as training
// passes them).
struct Matrix {
    unsigned rows, cols;
    bool column_major;
    Arg arg() const {
        return column_major ? Arg{{rows, cols}, {1, rows}} : Arg{{rows, cols}, {2 * cols, 1}, 1, 2 * rows * cols};
    }
    size_t buffer() const { return size_t(rows) * cols * (column_major ? 1 : 2); }
    // Where element `i` in row-major order is stored.
    size_t at(size_t i) const {
        size_t r = i / cols, c = i % cols;
        return column_major ? c * rows + r : r * 2 * cols + c;
    }
    const char* name() const { return column_major ? "column-major" : "pitched"; }
};

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
    report("embedding_grad", shape, "in order", bits_differ(grad, in_order), 0);
    report("embedding_grad", shape, "fp64", error(grad, want), 1e-5);
}

// The cubes (and partial sums) lab gives a tensor of `n` elements (square_sums::cubes_for).
unsigned square_cubes(size_t n) { return std::min(ceil_div(n, square_units), most_square_cubes); }

// Σ x² over a matrix (read at its strides) and a flat tensor of `n` elements, both of `X`,
// through their partial sums (the flat tensor's at an offset after the matrix's), and one
// cube's sum of them. The kernels for `X`: flat and matrix.
template <class X, class FlatInfo, class MatrixInfo, class Flat, class OfMatrix>
void check_square_sums(const char* kernel, Flat flat_kernel, OfMatrix matrix_kernel, size_t n, Matrix m,
                       uint64_t seed) {
    auto flat = random_values<X>(n, seed), matrix = random_values<X>(m.buffer(), seed + 1);
    double want = 0;
    for (X x : flat) want += double(float(x)) * float(x);
    for (size_t i = 0; i < size_t(m.rows) * m.cols; ++i) want += double(float(matrix[m.at(i)])) * float(matrix[m.at(i)]);
    unsigned matrix_cubes = square_cubes(size_t(m.rows) * m.cols), flat_cubes = square_cubes(n);
    unsigned count = matrix_cubes + flat_cubes;
    std::vector<float> partials(count, NAN), total(1, NAN);
    Arg apartials{{count}, {}};
    auto mm = tensor_metadata<MatrixInfo>({m.arg(), apartials});
    mm.info.scalars_uint32[0] = 0;
    emu::launch(matrix_kernel, emu::dim3{matrix_cubes}, emu::dim3{square_units}, matrix.data(), partials.data(),
                mm.dynamic.data(), mm.info);
    auto fm = tensor_metadata<FlatInfo>({Arg{{unsigned(n)}, {}}, apartials});
    fm.info.scalars_uint32[0] = matrix_cubes;
    emu::launch(flat_kernel, emu::dim3{flat_cubes}, emu::dim3{square_units}, flat.data(), partials.data(),
                fm.dynamic.data(), fm.info);
    auto sm = tensor_metadata<info_sum_partials>({apartials, Arg{{1}, {}}});
    sm.info.scalars_uint32[0] = count;
    emu::launch(sum_partials_kernel, emu::dim3{1}, emu::dim3{square_units}, partials.data(), total.data(),
                sm.dynamic.data(), sm.info);
    const auto shape = text("%ux%u+%zu/%u", m.rows, m.cols, n, count);
    report(kernel, shape, m.name(), error(total, {want}, 1.0), 1e-5);
}

// check_square_sums with the kernels for f32 and for bf16 tensors.
void check_f32_square_sums(size_t n, Matrix m, uint64_t seed) {
    check_square_sums<float, info_partial_squares, info_partial_squares_matrix>(
        "square_sums", partial_squares_kernel, partial_squares_matrix_kernel, n, m, seed);
}
void check_bf16_square_sums(size_t n, Matrix m, uint64_t seed) {
    check_square_sums<bf16, info_partial_squares_bf16, info_partial_squares_bf16_matrix>(
        "square_sums of bf16", partial_squares_bf16_kernel, partial_squares_bf16_matrix_kernel, n, m, seed);
}

// AdamW's constants at step `t` (adamw::Constants, in its order).
struct AdamwConstants {
    float clip_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, bias1, bias2, eps, lr, decay;
};
AdamwConstants adamw_at(double t) {
    const double beta1 = 0.9, beta2 = 0.95, lr = 1e-3, wd = 0.1;
    return {0.5f, float(beta1), float(1 - beta1), float(beta2), float(1 - beta2), float(1 - pow(beta1, t)),
            float(1 - pow(beta2, t)), 1e-8f, float(lr), float(1 - lr * wd)};
}

// One AdamW step of `n` parameters: from moments at step 3, or the first (no moments, the
// parameter bound in their place, as lab binds it); the gradient flat, or a matrix read at its
// strides (each a comptime variant of the kernel).
void check_adamw(unsigned n, bool first, const Matrix* grad_matrix, uint64_t seed) {
    auto param = random_values<float>(n, seed);
    auto grad = random_values<float>(grad_matrix ? grad_matrix->buffer() : n, seed + 1);
    auto m_in = random_values<float>(n, seed + 2), v_in = random_values<float>(n, seed + 3);
    for (float& v : v_in) v = v * v;
    const AdamwConstants c = adamw_at(first ? 1 : 3);
    std::vector<double> want_p(n), want_m(n), want_v(n);
    for (unsigned i = 0; i < n; ++i) {
        double g = double(grad[grad_matrix ? grad_matrix->at(i) : i]) * c.clip_scale;
        double m = (1 - double(c.beta1)) * g, v = (1 - double(c.beta2)) * g * g;
        if (!first) m += double(c.beta1) * m_in[i], v += double(c.beta2) * v_in[i];
        double update = (m / c.bias1) / (sqrt(v / c.bias2) + c.eps);
        want_p[i] = param[i] * double(c.decay) - update * c.lr, want_m[i] = m, want_v[i] = v;
    }
    std::vector<float> p_out(n, NAN), m_out(n, NAN), v_out(n, NAN);
    const float* moments[2] = {first ? param.data() : m_in.data(), first ? param.data() : v_in.data()};
    Arg flat{{n}, {}}, agrad = grad_matrix ? grad_matrix->arg() : flat;
    auto launch = [&](auto kernel, auto meta) {
        std::memcpy(meta.info.scalars_float, &c, sizeof c);
        emu::launch(kernel, grid_for(n, adamw_units), emu::dim3{adamw_units}, param.data(), grad.data(), moments[0],
                    moments[1], p_out.data(), m_out.data(), v_out.data(), meta.dynamic.data(), meta.info);
    };
    std::vector<Arg> args{flat, agrad, flat, flat, flat, flat, flat};
    if (first && grad_matrix) launch(adamw_first_matrix_grad_kernel, tensor_metadata<info_adamw_first_matrix_grad>(args));
    else if (grad_matrix) launch(adamw_matrix_grad_kernel, tensor_metadata<info_adamw_matrix_grad>(args));
    else if (first) launch(adamw_first_kernel, tensor_metadata<info_adamw_first>(args));
    else launch(adamw_kernel, tensor_metadata<info_adamw>(args));
    const auto shape = text("%u%s%s%s", n, first ? ", first" : "", grad_matrix ? ", " : "",
                            grad_matrix ? grad_matrix->name() : "");
    report("adamw", shape, "param", error(p_out, want_p), 1e-6);
    report("adamw", shape, "m", error(m_out, want_m), 1e-6);
    report("adamw", shape, "v", error(v_out, want_v), 1e-6);
}

// `D = Σ dO·O` of each row and `lse · log2 e`, of `O` and `dO` `[B, H, T, hd]` in bf16, `O`
// stored `[B, T, H, hd]` (the model's swapped heads) and `dO` contiguous, `lse` and the
// outputs f32 `[B, H, T]`; by the build of the kernel for head width `hd`.
template <class Info, class Kernel>
void check_delta(Kernel kernel, unsigned hd, unsigned b, unsigned h, unsigned t, uint64_t seed) {
    const unsigned rows = b * h * t;
    auto out = random_values<bf16>(size_t(rows) * hd, seed), d_out = random_values<bf16>(size_t(rows) * hd, seed + 1);
    auto lse = random_values<float>(rows, seed + 2);
    std::vector<double> want_delta(rows), want_log2(rows);
    for (unsigned i = 0; i < b; ++i)
        for (unsigned head = 0; head < h; ++head)
            for (unsigned s = 0; s < t; ++s) {
                size_t row = (size_t(i) * h + head) * t + s, o = ((size_t(i) * t + s) * h + head) * hd;
                double sum = 0;
                for (unsigned e = 0; e < hd; ++e) sum += double(float(d_out[row * hd + e])) * float(out[o + e]);
                want_delta[row] = sum;
                want_log2[row] = lse[row] * 1.4426950408889634;
            }
    std::vector<float> delta(rows, NAN), lse_log2(rows, NAN);
    Arg swapped{{b, h, t, hd}, {t * h * hd, hd, h * hd, 1}}, contiguous{{b, h, t, hd}, {}}, per_row{{b, h, t}, {}};
    auto m = tensor_metadata<Info>({swapped, contiguous, per_row, per_row, per_row});
    emu::launch(kernel, emu::dim3{ceil_div(t, delta_units), h, b}, emu::dim3{delta_units}, out.data(), d_out.data(),
                lse.data(), delta.data(), lse_log2.data(), m.dynamic.data(), m.info);
    const auto shape = text("%ux%ux%ux%u", b, h, t, hd);
    report("attention delta, bf16", shape, "D", error(delta, want_delta), 1e-5);
    report("attention delta, bf16", shape, "lse log2", error(lse_log2, want_log2), 1e-6);
}

int main() {
    // Two slices of the table, the last partial; two cubes of columns, the last partial; three
    // tiles of ids, the last partial; pitched `dy`.
    check_embedding(700, 300, 600, 310, 1);
    check_embedding(5, 3, 1, 3, 2);
    // Fewer elements than a cube; and the most cubes lab gives a tensor (1,024 of 256 units),
    // where some units take two elements, with more partial sums than the last cube has units.
    const Matrix column_major{70, 45, true}, pitched{33, 40, false};
    check_f32_square_sums(100, Matrix{3, 5, true}, 3);
    check_f32_square_sums(300000, column_major, 4);
    check_f32_square_sums(1000, pitched, 5);
    check_bf16_square_sums(5000, pitched, 6);
    check_bf16_square_sums(300000, column_major, 7);
    check_adamw(1000, false, nullptr, 8);
    check_adamw(1000, true, nullptr, 9);
    const Matrix grad_column_major{40, 25, true}, grad_pitched{40, 25, false};
    check_adamw(1000, false, &grad_column_major, 10);
    check_adamw(1000, false, &grad_pitched, 11);
    check_adamw(1000, true, &grad_pitched, 15);
    // A partial cube of rows, and more than one cube; x1-50m's head width and the 7B's.
    check_delta<info_delta>(delta_kernel, delta_head_dim, 2, 3, 37, 12);
    check_delta<info_delta>(delta_kernel, delta_head_dim, 1, 2, 130, 13);
    check_delta<info_delta_wide>(delta_wide_kernel, delta_wide_head_dim, 2, 2, 70, 14);
    return all_passed ? 0 : 1;
}
