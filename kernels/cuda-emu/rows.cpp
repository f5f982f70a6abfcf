// Runs cubecl's CUDA C++ of the kernels that read 16-byte vectors (8 bf16 or f16 a vector, the
// width CUDA launches them at and lavapipe does not take) on the CPU emulation in
// include/emu.h, against fp64 references, as kernels/tests/{swiglu,lm_head,rope,rms_norm}.rs
// check them on a GPU; and the kernels that copy or add in the storage type (the joins,
// add_into: bf16 in training, which lavapipe has not), as kernels/tests/{join,accumulate}.rs. Built and run by kernels/src/cuda_source.rs's test, once per storage
// type (-DSTORAGE=__nv_bfloat16 -DSUFFIX=bf16), with each kernel's .cu file on the include
// path (its `info_st` and entry renamed after the file: info_row_loss, row_loss_kernel), and
// the units of each kernel's cube and RMSNorm's backward width as lab launches them
// (-DSWIGLU_UNITS=256 …, -DNORM_WIDTH=768, as that test passes them); with
// -DONLY_NORM_TRAINING, only RMSNorm as bf16 training runs it (at the wider models' widths).
// Outputs start as NaN, so an element no unit writes fails; padding that a kernel must leave
// alone starts as a large finite value and must come back with the same bits.
#include "emu.h"
#include "tensors.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "add_into.cu"
#include "add_widened.cu"
#include "join_columns.cu"
#include "join_three_columns.cu"
#include "pad_columns.cu"
#include "rms_norm.cu"
#include "rms_norm_backward.cu"
#include "rms_norm_backward_skip.cu"
#include "rms_norm_gain_sums.cu"
#include "rms_norm_mixed.cu"
#include "rope.cu"
#include "rope_transposed_added.cu"
#include "row_loss.cu"
#include "softmax_grad.cu"
#include "swiglu.cu"
#include "swiglu_backward.cu"

using T = STORAGE;
const char* const driver_name = "rows";
// Elements a vector: 16 bytes of the storage type; the f32 accumulator's 4.
constexpr unsigned width = 16 / sizeof(T);
constexpr unsigned f32_width = 4;
// Units a cube, as lab_kernels launches each kernel (the test's -D definitions).
constexpr unsigned swiglu_units = SWIGLU_UNITS, rope_units = ROPE_UNITS, add_units = ADD_UNITS;
constexpr unsigned join_units = JOIN_UNITS, add_into_units = ADD_INTO_UNITS;
constexpr unsigned loss_units = LOSS_UNITS, norm_units = NORM_UNITS, norm_backward_units = NORM_BACKWARD_UNITS;
// RMSNorm's backward: the columns its kernels are compiled for; the gain's sums' cube, of
// SUM_COLUMNS columns and SUM_LANES lanes a column.
constexpr unsigned norm_width = NORM_WIDTH, sum_columns = SUM_COLUMNS, sum_lanes = SUM_LANES;
// A value no kernel computes: padding lanes start as it and must keep it.
constexpr float padding_value = 60.0f;
// bf16 keeps 8 significant bits, f16 11: one rounding of the output, with room.
const double tolerance = std::is_same_v<T, __half> ? 2e-3 : 1e-2;

// Sets the padding of `values`, rows `stride` apart, past their first `cols`, to
// `padding_value`; returns where it is, for bits_changed.
template <class V>
std::vector<bool> fill_padding(std::vector<V>& values, unsigned cols, unsigned stride) {
    std::vector<bool> padding(values.size());
    for (size_t i = 0; i < values.size(); ++i)
        if (i % stride >= cols) padding[i] = true, values[i] = V(padding_value);
    return padding;
}

// The first `cols` of each of the rows of `values`, `stride` apart, side by side.
template <class V>
std::vector<V> leading_columns(const std::vector<V>& values, unsigned cols, unsigned stride) {
    std::vector<V> out;
    for (size_t i = 0; i < values.size(); ++i)
        if (i % stride < cols) out.push_back(values[i]);
    return out;
}

double sigmoid(double x) { return 1 / (1 + exp(-x)); }

// SwiGLU forward and backward on `h = [g | u]` of rows `stride` elements apart (2f, or more
// for a pitched matrix), `f` columns a half.
void check_swiglu(unsigned n, unsigned f, unsigned stride, uint64_t seed) {
    auto h = random_values<T>(size_t(n) * stride, seed), dy = random_values<T>(size_t(n) * f, seed + 1);
    std::vector<T> out(size_t(n) * f, T(NAN)), dh(size_t(n) * 2 * f, T(NAN));
    std::vector<double> want(out.size()), want_dh(dh.size());
    for (unsigned r = 0; r < n; ++r)
        for (unsigned j = 0; j < f; ++j) {
            double g = float(h[r * stride + j]), u = float(h[r * stride + f + j]), d = float(dy[r * f + j]);
            double s = sigmoid(g);
            want[r * f + j] = g * s * u;
            want_dh[r * 2 * f + j] = d * u * s * (1 + g * (1 - s));
            want_dh[r * 2 * f + f + j] = d * g * s;
        }
    Arg ah{{n, 2 * f}, {stride, 1}, width, n * stride}, ay{{n, f}, {}, width}, adh{{n, 2 * f}, {}, width};
    auto m = tensor_metadata<info_swiglu>({ah, ay});
    emu::launch(swiglu_kernel, grid_for(n * f / width, swiglu_units), emu::dim3{swiglu_units}, h.data(), out.data(),
                m.dynamic.data(), m.info);
    auto mb = tensor_metadata<info_swiglu_backward>({ah, ay, adh});
    emu::launch(swiglu_backward_kernel, grid_for(n * f / width, swiglu_units), emu::dim3{swiglu_units}, h.data(),
                dy.data(), dh.data(), mb.dynamic.data(), mb.info);
    const auto shape = text("%ux%u/%u", n, f, stride);
    report("swiglu", shape, "y", error(out, want), tolerance);
    report("swiglu_backward", shape, "dh", error(dh, want_dh), tolerance);
}

// The LM head's loss and its gradient on a `[rows, vocab]` view of logits `stride` columns
// apart (the padded product's rows; the last vector of a row reaches into the padding), rows
// `offset ..` of `total` targets.
void check_loss(unsigned rows, unsigned vocab, unsigned stride, unsigned offset, unsigned total, uint64_t seed) {
    auto logits = random_values<T>(size_t(rows) * stride, seed);
    auto padding = fill_padding(logits, vocab, stride);
    std::vector<int32_t> targets(total);
    for (unsigned r = 0; r < total; ++r) targets[r] = int32_t((r * 7919u + seed) % vocab);
    targets[offset] = int32_t(vocab - 1);  // in a row's last vector, beside the padding
    std::vector<float> lse(total, NAN), loss(total, NAN), grad_loss{0.75f};
    std::vector<double> want_lse(rows), want_loss(rows), want_grad;
    float inv_rows = 1.0f / float(total);
    for (unsigned r = 0; r < rows; ++r) {
        double top = -INFINITY, sum = 0;
        for (unsigned j = 0; j < vocab; ++j) top = std::max(top, double(float(logits[r * stride + j])));
        for (unsigned j = 0; j < vocab; ++j) sum += exp(double(float(logits[r * stride + j])) - top);
        want_lse[r] = top + log(sum);
        want_loss[r] = want_lse[r] - double(float(logits[r * stride + targets[offset + r]]));
        for (unsigned j = 0; j < vocab; ++j) {
            double p = exp(double(float(logits[r * stride + j])) - want_lse[r]);
            want_grad.push_back((p - (int32_t(j) == targets[offset + r])) * 0.75 * double(inv_rows));
        }
    }
    Arg alogits{{rows, vocab}, {stride, 1}, width, rows * stride}, arow{{total}, {}};
    auto m = tensor_metadata<info_row_loss>({alogits, arow, arow, arow});
    m.info.scalars_uint32[0] = offset;
    emu::launch(row_loss_kernel, emu::dim3{rows, 1, 1}, emu::dim3{loss_units}, logits.data(), targets.data(), lse.data(),
                loss.data(), m.dynamic.data(), m.info);
    auto before = logits;
    auto g = tensor_metadata<info_softmax_grad>({alogits, arow, arow, Arg{{1}, {}}});
    g.info.scalars_float[0] = inv_rows;
    g.info.scalars_uint32[0] = offset;
    emu::launch(softmax_grad_kernel, emu::dim3{rows, 1, 1}, emu::dim3{loss_units}, logits.data(), targets.data(),
                lse.data(), grad_loss.data(), g.dynamic.data(), g.info);
    auto grad = leading_columns(logits, vocab, stride);
    // Rows outside the chunk keep their NaN: the kernels write at the chunk's offset only.
    bool others_untouched = true;
    for (unsigned r = 0; r < total; ++r)
        if ((r < offset || r >= offset + rows) && (lse[r] == lse[r] || loss[r] == loss[r])) others_untouched = false;
    const auto shape = text("%ux%u/%u", rows, vocab, stride);
    std::vector<float> chunk_lse(lse.begin() + offset, lse.begin() + offset + rows);
    std::vector<float> chunk_loss(loss.begin() + offset, loss.begin() + offset + rows);
    report("row_loss", shape, "lse", error(chunk_lse, want_lse), 1e-5);
    report("row_loss", shape, "loss", error(chunk_loss, want_loss), 1e-5);
    report("row_loss", shape, "others", others_untouched ? 0 : INFINITY, 0);
    // Each element against its own size: the target's is ~1/total, the others far smaller.
    // (Below f16's smallest normal, 2^-14, its spacing is absolute.)
    report("softmax_grad", shape, "grad", relative_error(grad, want_grad, ldexp(1.0, -14)), tolerance);
    report("softmax_grad", shape, "padding", bits_changed(logits, before, padding), 0);
}

// `acc += x` of `[rows, cols]` matrices, `acc` f32 rows `acc_stride` apart, `x` rows
// `x_stride` apart; `cols` not whole vectors, so a row's last vector reaches into padding.
void check_add_widened(unsigned rows, unsigned cols, unsigned acc_stride, unsigned x_stride, uint64_t seed) {
    auto acc = random_values<float>(size_t(rows) * acc_stride, seed);
    auto x = random_values<T>(size_t(rows) * x_stride, seed + 1);
    auto padding = fill_padding(acc, cols, acc_stride);
    std::vector<double> want;
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned c = 0; c < cols; ++c) want.push_back(double(float(acc[r * acc_stride + c] + float(x[r * x_stride + c]))));
    auto before = acc;
    Arg aacc{{rows, cols}, {acc_stride, 1}, f32_width, rows * acc_stride};
    Arg ax{{rows, cols}, {x_stride, 1}, f32_width, rows * x_stride};
    auto m = tensor_metadata<info_add_widened>({aacc, ax});
    emu::launch(add_widened_kernel, grid_for(rows * ceil_div(cols, f32_width), add_units), emu::dim3{add_units}, acc.data(), x.data(),
                m.dynamic.data(), m.info);
    auto got = leading_columns(acc, cols, acc_stride);
    const auto shape = text("%ux%u/%u,%u", rows, cols, acc_stride, x_stride);
    // One f32 add, as the reference's sum rounded to f32: the same bits.
    report("add_widened", shape, "acc", error(got, want), 0);
    report("add_widened", shape, "padding", bits_changed(acc, before, padding), 0);
}

// `[a | b | c]` of `parts` matrices of `rows` rows and `widths` columns, `a` in rows
// `a_stride` apart, `b` column-major, `c` contiguous: the same bits. With `parts` 1 the
// padding, `[a | 0]`, `widths[1]` the zero columns' count (`b` and `c` stand-ins).
void check_join(unsigned parts, unsigned rows, const unsigned (&widths)[3], unsigned a_stride, uint64_t seed) {
    auto [na, nb, nc] = widths;
    unsigned width = na + nb + (parts == 3 ? nc : 0);
    auto a = random_values<T>(size_t(rows) * a_stride, seed), b = random_values<T>(size_t(rows) * nb, seed + 1);
    auto c = random_values<T>(size_t(rows) * nc, seed + 2);
    std::vector<T> out(size_t(rows) * width, T(NAN)), want;
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned col = 0; col < width; ++col)
            want.push_back(col < na                  ? a[r * a_stride + col]
                           : parts == 1              ? T(0.0f)
                           : col < na + nb           ? b[(col - na) * rows + r]
                                                     : c[r * nc + col - na - nb]);
    Arg aa{{rows, na}, {a_stride, 1}, 1, rows * a_stride}, ab{{rows, nb}, {1, rows}}, ac{{rows, nc}, {}};
    Arg aout{{rows, width}, {}};
    // Absent parts are `a` again, as lab binds them.
    const T* bb = parts >= 2 ? b.data() : a.data();
    const T* bc = parts == 3 ? c.data() : a.data();
    auto launch = [&](auto kernel, auto m) {
        emu::launch(kernel, grid_for(out.size(), join_units), emu::dim3{join_units}, a.data(), bb, bc, out.data(),
                    m.dynamic.data(), m.info);
    };
    if (parts == 1) launch(pad_columns_kernel, tensor_metadata<info_pad_columns>({aa, aa, aa, aout}));
    if (parts == 2) launch(join_columns_kernel, tensor_metadata<info_join_columns>({aa, ab, aa, aout}));
    if (parts == 3) launch(join_three_columns_kernel, tensor_metadata<info_join_three_columns>({aa, ab, ac, aout}));
    const char* kernel = parts == 1 ? "pad_columns" : parts == 2 ? "join_columns" : "join_three_columns";
    report(kernel, text("%ux%u/%u", rows, width, a_stride), "out", bits_differ(out, want), 0);
}

// `out[:, first + h] += value[:, h]` of `value [B, n, T, hd]` into `out [B, m, T, hd]`, both
// stored `[B, T, heads, hd]` (the model's swapped heads): one f32 sum rounded to the storage
// type; `out`'s other heads keep their bits.
void check_add_into(unsigned b, unsigned n, unsigned m, unsigned t, unsigned hd, unsigned first, uint64_t seed) {
    auto value = random_values<T>(size_t(b) * t * n * hd, seed), out = random_values<T>(size_t(b) * t * m * hd, seed + 1);
    auto want = out;
    std::vector<bool> other_heads(out.size(), true);
    for (unsigned i = 0; i < b; ++i)
        for (unsigned h = 0; h < n; ++h)
            for (unsigned s = 0; s < t; ++s)
                for (unsigned e = 0; e < hd; ++e) {
                    size_t o = ((size_t(i) * t + s) * m + first + h) * hd + e, v = ((size_t(i) * t + s) * n + h) * hd + e;
                    want[o] = T(float(double(float(out[o])) + double(float(value[v]))));
                    other_heads[o] = false;
                }
    Arg av{{b, n, t, hd}, {t * n * hd, hd, n * hd, 1}}, aout{{b, m, t, hd}, {t * m * hd, hd, m * hd, 1}};
    auto meta = tensor_metadata<info_add_into>({av, aout});
    meta.info.scalars_uint32[0] = first;
    auto before = out;
    emu::launch(add_into_kernel, grid_for(value.size(), add_into_units), emu::dim3{add_into_units}, value.data(), out.data(),
                meta.dynamic.data(), meta.info);
    std::vector<bool> added(out.size());
    for (size_t i = 0; i < out.size(); ++i) added[i] = !other_heads[i];
    const auto shape = text("%ux%ux%ux%u+%u/%u", b, n, t, hd, first, m);
    // fp64's sum rounded to f32, then to the storage type, is the kernel's f32 sum so rounded.
    report("add_into", shape, "out", bits_changed(out, want, added), 0);
    report("add_into", shape, "others", bits_changed(out, before, other_heads), 0);
}

// RoPE of `x [B, H, T, hd]` stored `[B, T, H, hd]` (the model's swapped heads), and its
// transpose added into heads `first ..` of `out [B, H_out, T, hd]`, whose other heads keep
// their bits.
void check_rope(unsigned b, unsigned heads, unsigned t, unsigned hd, unsigned first, uint64_t seed) {
    unsigned half = hd / 2, out_heads = first + heads + 1;
    auto x = random_values<T>(size_t(b) * t * heads * hd, seed);
    auto cos_t = random_values<T>(size_t(t) * hd, seed + 1), sin_t = random_values<T>(size_t(t) * hd, seed + 2);
    auto at = [&](unsigned n, unsigned h, unsigned p, unsigned count) { return ((size_t(n) * t + p) * count + h) * hd; };
    std::vector<T> y(x.size(), T(NAN));
    auto out = random_values<T>(size_t(b) * t * out_heads * hd, seed + 3);
    auto before = out;
    std::vector<double> want(x.size()), want_out(out.size());
    for (size_t i = 0; i < out.size(); ++i) want_out[i] = float(out[i]);
    for (unsigned n = 0; n < b; ++n)
        for (unsigned h = 0; h < heads; ++h)
            for (unsigned p = 0; p < t; ++p)
                for (unsigned i = 0; i < half; ++i) {
                    size_t row = at(n, h, p, heads), o = at(n, first + h, p, out_heads);
                    double xa = float(x[row + i]), xb = float(x[row + i + half]);
                    double ca = float(cos_t[p * hd + i]), cb = float(cos_t[p * hd + i + half]);
                    double sa = float(sin_t[p * hd + i]), sb = float(sin_t[p * hd + i + half]);
                    want[row + i] = xa * ca - xb * sa;
                    want[row + i + half] = xb * cb + xa * sb;
                    want_out[o + i] += xa * ca + xb * sb;
                    want_out[o + i + half] += xb * cb - xa * sa;
                }
    auto swapped = [&](unsigned count) {
        return Arg{{b, count, t, hd}, {t * count * hd, hd, count * hd, 1}, width};
    };
    Arg table{{t, hd}, {}, width};
    auto m = tensor_metadata<info_rope>({swapped(heads), table, table, swapped(heads)});
    m.info.scalars_uint32[0] = 0;
    emu::dim3 grid = grid_for(size_t(b) * heads * t * half / width, rope_units);
    emu::launch(rope_kernel, grid, emu::dim3{rope_units}, x.data(), cos_t.data(), sin_t.data(), y.data(),
                m.dynamic.data(), m.info);
    auto ma = tensor_metadata<info_rope_transposed_added>({swapped(heads), table, table, swapped(out_heads)});
    ma.info.scalars_uint32[0] = first;
    emu::launch(rope_transposed_added_kernel, grid, emu::dim3{rope_units}, x.data(), cos_t.data(), sin_t.data(),
                out.data(), ma.dynamic.data(), ma.info);
    std::vector<bool> other_heads(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
        unsigned h = unsigned(i / hd % out_heads);
        other_heads[i] = h < first || h >= first + heads;
    }
    const auto shape = text("%ux%ux%ux%u", b, heads, t, hd);
    report("rope", shape, "y", error(y, want), tolerance);
    report("rope_transposed_added", shape, "out", error(out, want_out), tolerance);
    report("rope_transposed_added", shape, "others", bits_changed(out, before, other_heads), 0);
}

// RMSNorm's `eps`, as the model's.
constexpr float norm_eps = 1e-5f;

// RMSNorm's forward in fp64: `x [n, d] / rms(x) ⊙ gain`, row by row, `x`'s rows `stride`
// apart, `y` contiguous.
template <class X, class G>
std::vector<double> rms_norm_reference(const std::vector<X>& x, const std::vector<G>& gain, unsigned n, unsigned d,
                                       unsigned stride) {
    std::vector<double> y(size_t(n) * d);
    for (unsigned r = 0; r < n; ++r) {
        double squares = 0;
        for (unsigned j = 0; j < d; ++j) squares += double(float(x[r * stride + j])) * float(x[r * stride + j]);
        double rms = sqrt(squares / d + norm_eps);
        for (unsigned j = 0; j < d; ++j) y[r * d + j] = float(x[r * stride + j]) / rms * float(gain[j]);
    }
    return y;
}

// An RMSNorm forward kernel (its info `Info`) over `x [n, d]` of rows `stride` apart into a
// contiguous `y`, read `vector` elements at a time, one cube of `norm_units` a row, as
// lab_kernels::rms_norm launches it.
template <class Info, class Kernel, class X, class G, class Y>
void launch_rms_norm(Kernel kernel, const std::vector<X>& x, const std::vector<G>& gain, std::vector<Y>& y, unsigned n,
                     unsigned d, unsigned stride, unsigned vector) {
    Arg input{{n, d}, {stride, 1}, vector, n * stride}, row{{d}, {}, vector}, output{{n, d}, {}, vector};
    auto m = tensor_metadata<Info>({input, row, output});
    m.info.scalars_float[0] = 1.0f / float(d);
    m.info.scalars_float[1] = norm_eps;
    emu::launch(kernel, emu::dim3{n, 1, 1}, emu::dim3{norm_units}, x.data(), gain.data(), y.data(), m.dynamic.data(),
                m.info);
}

// RMSNorm's forward of `x [n, d]`, rows `stride` apart, by the gain `[d]`, all in the storage
// type.
void check_rms_norm(unsigned n, unsigned d, unsigned stride, uint64_t seed) {
    auto x = random_values<T>(size_t(n) * stride, seed), gain = random_values<T>(d, seed + 1);
    std::vector<T> y(size_t(n) * d, T(NAN));
    launch_rms_norm<info_rms_norm>(rms_norm_kernel, x, gain, y, n, d, stride, width);
    const auto shape = text("%ux%u/%u", n, d, stride);
    report("rms_norm", shape, "y", error(y, rms_norm_reference(x, gain, n, d, stride)), tolerance);
}

// The backward blocks' tensors (x, gain, dy, skip, dx, partials) and scalars.
template <class Info>
Metadata<Info> norm_backward_metadata(unsigned n, unsigned d, unsigned blocks, unsigned block_rows) {
    Arg matrix{{n, d}, {}};
    auto m = tensor_metadata<Info>({matrix, Arg{{d}, {}}, matrix, matrix, matrix, Arg{{blocks, d}, {}}});
    m.info.scalars_uint32[0] = block_rows;
    m.info.scalars_float[0] = 1.0f / float(d);
    m.info.scalars_float[1] = norm_eps;
    return m;
}

// RMSNorm as bf16 training runs it (f16 standing in at -DSUFFIX=f16): `x`, the gain and the
// gradients f32, `y` and `dy` in the storage type; the forward 4 f32 a vector; the backward
// in blocks of `block_rows` rows (the last one partial), with and without the skip
// connection's gradient added into `dx`, and the gain's gradient summed over the blocks. The
// backward kernels are compiled for `norm_width` columns.
void check_rms_norm_training(unsigned n, unsigned block_rows, uint64_t seed) {
    const unsigned d = norm_width;
    auto x = random_values<float>(size_t(n) * d, seed), gain = random_values<float>(d, seed + 1);
    auto dy = random_values<T>(size_t(n) * d, seed + 2);
    auto skip = random_values<float>(size_t(n) * d, seed + 3);
    std::vector<double> want_dx(x.size()), want_dx_skip(x.size()), want_dg(d);
    for (unsigned r = 0; r < n; ++r) {
        double squares = 0, gy_x = 0;
        for (unsigned j = 0; j < d; ++j) {
            double v = x[r * d + j];
            squares += v * v;
            gy_x += double(float(dy[r * d + j])) * gain[j] * v;
        }
        double rms = sqrt(squares / d + norm_eps), along = gy_x / rms / d;
        for (unsigned j = 0; j < d; ++j) {
            size_t i = size_t(r) * d + j;
            double q = x[i] / rms, g = float(dy[i]);
            want_dx[i] = (g * gain[j] - q * along) / rms;
            want_dx_skip[i] = want_dx[i] + skip[i];
            want_dg[j] += g * q;
        }
    }
    std::vector<T> y(x.size(), T(NAN));
    launch_rms_norm<info_rms_norm_mixed>(rms_norm_mixed_kernel, x, gain, y, n, d, d, f32_width);
    unsigned blocks = ceil_div(n, block_rows);
    std::vector<float> dx(x.size(), NAN), dx_skip(x.size(), NAN), partials(size_t(blocks) * d, NAN), dg(d, NAN);
    auto with_skip = norm_backward_metadata<info_rms_norm_backward_skip>(n, d, blocks, block_rows);
    emu::launch(rms_norm_backward_skip_kernel, emu::dim3{blocks, 1, 1}, emu::dim3{norm_backward_units}, x.data(), gain.data(),
                dy.data(), skip.data(), dx_skip.data(), partials.data(), with_skip.dynamic.data(), with_skip.info);
    // The gain's sums below read the next launch's partials, which must be this one's: the
    // skip changes `dx` only. Without the skip connection, `x` stands in for its binding, as
    // the launch passes it.
    auto skip_partials = partials;
    std::fill(partials.begin(), partials.end(), NAN);
    auto bm = norm_backward_metadata<info_rms_norm_backward>(n, d, blocks, block_rows);
    emu::launch(rms_norm_backward_kernel, emu::dim3{blocks, 1, 1}, emu::dim3{norm_backward_units}, x.data(), gain.data(),
                dy.data(), x.data(), dx.data(), partials.data(), bm.dynamic.data(), bm.info);
    auto sm = tensor_metadata<info_rms_norm_gain_sums>({Arg{{blocks, d}, {}}, Arg{{d}, {}}});
    emu::launch(rms_norm_gain_sums_kernel, emu::dim3{ceil_div(d, sum_columns), 1, 1},
                emu::dim3{sum_columns, sum_lanes, 1}, partials.data(), dg.data(), sm.dynamic.data(), sm.info);
    const auto shape = text("%ux%u/%u", n, d, block_rows);
    report("rms_norm f32 in", shape, "y", error(y, rms_norm_reference(x, gain, n, d, d)), tolerance);
    // f32 arithmetic and f32 outputs: sums of d terms in f32.
    report("rms_norm backward", shape, "dx", error(dx, want_dx), 1e-5);
    report("rms_norm backward", shape, "dx+skip", error(dx_skip, want_dx_skip), 1e-5);
    report("rms_norm backward", shape, "dg", error(dg, want_dg), 1e-5);
    report("rms_norm backward", shape, "partials", bits_differ(partials, skip_partials), 0);
}

int main() {
#ifndef ONLY_NORM_TRAINING
    // Rows of one vector and of several, more than one cube of units, pitched rows.
    check_swiglu(3, width, 2 * width, 1);
    check_swiglu(9, 5 * width, 12 * width, 2);
    check_swiglu(70, 4 * width, 8 * width, 3);
    // 257 columns (as GPT-2's 50,257: 1 real lane in a row's last vector) and 1,006 (6) on
    // padded rows; a row of fewer columns than the cube has units; chunks at an offset into
    // the targets.
    check_loss(3, 257, 304, 0, 3, 4);
    check_loss(4, 1006, 1008, 5, 11, 5);
    check_loss(2, 3 * width, 3 * width, 1, 3, 6);
    check_add_widened(3, 10, 12, 16, 7);
    check_add_widened(40, 37, 40, 40, 8);
    // Head width 64 (4 vectors a half); 16, one vector a half; heads swapped.
    check_rope(2, 3, 5, 64, 1, 9);
    check_rope(1, 4, 3, 2 * width, 2, 10);
    // Five cubes of units.
    check_rope(2, 4, 40, 64, 0, 14);
    // x1-50m's 768 columns (96 vectors on 128 units), on pitched rows too; more vectors than
    // units. (The forward is compiled for any width.)
    check_rms_norm(3, 768, 768, 11);
    check_rms_norm(3, 768, 768 + 4 * width, 15);
    check_rms_norm(2, 192 * width, 192 * width, 12);
    // Parts of odd widths, over more than one cube of units; rows of one.
    check_join(2, 37, {5, 11, 0}, 7, 17);
    check_join(3, 20, {64, 13, 30}, 70, 18);
    check_join(3, 1, {3, 1, 2}, 3, 19);
    check_join(1, 9, {50, 14, 0}, 53, 20);
    // The v gradient into the third of three parts' heads (q 4 heads, k and v 2: GQA).
    check_add_into(2, 2, 8, 5, 16, 6, 21);
    check_add_into(1, 3, 4, 37, 64, 1, 22);
#endif
    // Three blocks of rows, the last one partial; and 40 blocks, more than the gain's sums
    // have lanes a column.
    static_assert(sum_lanes < 40, "a lane sums more than one block");
    check_rms_norm_training(40, 16, 13);
    check_rms_norm_training(40, 1, 16);
    return all_passed ? 0 : 1;
}
