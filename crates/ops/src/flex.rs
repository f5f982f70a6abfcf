//! The fused LM-head loss on `Flex`, the pure-Rust CPU backend, written against raw buffers.
//!
//! Why not the generic version: on Flex every tensor op allocates a fresh `[c, V]` result
//! (new pages the kernel must zero), `exp` is scalar and single-threaded, and the weight
//! gradient would be summed chunk by chunk through extra `[d, V]` temporaries. Here:
//! - one `[chunk_rows, V]` logits buffer lives for the whole call and is reused by every chunk;
//! - the three products go straight to `gemm` (the crate Flex itself uses), the weight
//!   gradient accumulating in place (`gemm`'s `dst = dst + lhs·rhs`);
//! - the per-row passes (max, Σexp, softmax − onehot) run in parallel over rows with a
//!   vectorizable `exp`.
//!
//! Determinism: every output element is produced by one thread with an operation order fixed
//! by the shapes and the thread count (rows are independent; each row's sum uses 16 fixed
//! lanes combined in a fixed order; the loss sums rows sequentially; gemm splits work by
//! output tiles, never along the inner dimension), so results are bit-identical run to run.
//! The SIMD and scalar builds of the row kernel agree bit for bit (Rust never contracts
//! `a * b + c` into an FMA on its own).
//!
//! Cost per step for N rows, width d, vocabulary V (chunk of c rows):
//! - forward: `[c, d] @ [d, V]` per chunk = 2·N·d·V FLOPs; ~2 reads of each `[c, V]` row block.
//! - backward: the same product again (recompute), then `g @ W^T` (2·N·d·V) and
//!   `h^T @ g` (2·N·d·V): 6·N·d·V FLOPs; the `[d, V]` weight gradient is read and written
//!   once per chunk.
//! - training (`lm_head_loss_with_grads`): forward and backward in one pass, 6·N·d·V FLOPs
//!   instead of 8: the logits of a chunk are computed once and turned into `g` in place.
//! - memory: `[c, V]` logits block + `[N, d]` and `[d, V]` gradients; the forward keeps only
//!   `lse [N]` for backward.
//!
//! Inputs that are not plain f32 matrices with non-negative strides take the generic path.

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::{ops::FloatTensor, DType};
use rayon::prelude::*;

use crate::flex_tensor::f32_tensor;
use crate::{generic, FusedLoss};

impl FusedLoss for Flex {
    fn lm_head_loss_forward(
        hidden: FlexTensor,
        weight: FlexTensor,
        targets: FlexTensor,
        chunk_rows: usize,
    ) -> (FlexTensor, FlexTensor) {
        match (Mat::of(&hidden), Mat::of(&weight)) {
            (Some(h), Some(w)) => {
                let t = target_ids(&targets, h.rows, w.cols);
                let (loss, lse) = forward(&h, &w, &t, chunk_rows);
                (f32_tensor(vec![loss], [1]), f32_tensor(lse, [h.rows]))
            }
            _ => generic::forward::<Flex>(hidden, weight, targets, chunk_rows),
        }
    }

    fn lm_head_loss_with_grads(
        hidden: FlexTensor,
        weight: FlexTensor,
        targets: FlexTensor,
        chunk_rows: usize,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        match (Mat::of(&hidden), Mat::of(&weight)) {
            (Some(h), Some(w)) => {
                let (n, d, v) = (h.rows, h.cols, w.cols);
                let t = target_ids(&targets, n, v);
                let (loss, gh, gw) = forward_with_grads(&h, &w, &t, chunk_rows);
                (
                    f32_tensor(vec![loss], [1]),
                    f32_tensor(gh, [n, d]),
                    f32_tensor(gw, [d, v]),
                )
            }
            _ => {
                let (loss, lse) = generic::forward::<Flex>(
                    hidden.clone(),
                    weight.clone(),
                    targets.clone(),
                    chunk_rows,
                );
                let one = f32_tensor(vec![1.0], [1]);
                let (gh, gw) =
                    generic::backward::<Flex>(hidden, weight, targets, lse, one, chunk_rows);
                (loss, gh, gw)
            }
        }
    }

    fn lm_head_loss_backward(
        hidden: FlexTensor,
        weight: FlexTensor,
        targets: FlexTensor,
        lse: FlexTensor,
        grad_loss: FlexTensor,
        chunk_rows: usize,
    ) -> (FlexTensor, FlexTensor) {
        match (Mat::of(&hidden), Mat::of(&weight), Mat::of(&lse)) {
            (Some(h), Some(w), Some(l)) => {
                let (n, d, v) = (h.rows, h.cols, w.cols);
                let t = target_ids(&targets, n, v);
                let lse: Vec<f32> = (0..n).map(|i| l.at(i, 0)).collect();
                let grad_loss = first_f32(grad_loss);
                let (gh, gw) = backward(&h, &w, &t, &lse, grad_loss, chunk_rows);
                (f32_tensor(gh, [n, d]), f32_tensor(gw, [d, v]))
            }
            _ => generic::backward::<Flex>(hidden, weight, targets, lse, grad_loss, chunk_rows),
        }
    }
}

/// A read-only f32 matrix view of a Flex tensor: element `[i, j]` is
/// `data[offset + i·rs + j·cs]` (covers contiguous tensors and transposed/sliced views).
/// 1-D tensors are viewed as one column.
struct Mat<'a> {
    data: &'a [f32],
    offset: usize,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

impl<'a> Mat<'a> {
    fn of(t: &'a FlexTensor) -> Option<Self> {
        let layout = t.layout();
        if t.dtype() != DType::F32 || !layout.has_positive_strides() {
            return None;
        }
        let shape = layout.shape();
        let strides = layout.strides();
        let (rows, cols, rs, cs) = match shape.num_dims() {
            1 => (shape[0], 1, strides[0], 1),
            2 => (shape[0], shape[1], strides[0], strides[1]),
            _ => return None,
        };
        Some(Self {
            data: t.storage::<f32>(),
            offset: layout.start_offset(),
            rows,
            cols,
            rs,
            cs,
        })
    }

    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[self.offset + i * self.rs as usize + j * self.cs as usize]
    }

    /// Pointer to element `[i, 0]`.
    fn row_ptr(&self, i: usize) -> *const f32 {
        assert!(i < self.rows);
        // In bounds: the layout says row i starts there.
        self.data[self.offset + i * self.rs as usize..].as_ptr()
    }
}

fn first_f32(t: FloatTensor<Flex>) -> f32 {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")[0]
}

/// Target ids as `usize`, checked against the vocabulary (an id ≥ V would read out of bounds).
fn target_ids(targets: &FlexTensor, n: usize, v: usize) -> Vec<usize> {
    let ids = targets
        .clone()
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .expect("integer targets");
    assert_eq!(
        ids.len(),
        n,
        "lm_head_loss: {n} rows but {} targets",
        ids.len()
    );
    ids.into_iter()
        .map(|t| {
            assert!(
                (0..v as i64).contains(&t),
                "lm_head_loss: target {t} outside the vocabulary 0..{v}"
            );
            t as usize
        })
        .collect()
}

/// `dst[m, n] (+)= lhs[m, k] @ rhs[k, n]`, all row-major-ish strided views given by
/// (pointer, row stride, column stride). `accumulate` adds to what `dst` holds.
fn matmul(
    dst: &mut [f32],
    dims: (usize, usize, usize),
    dst_rs: usize,
    lhs: (*const f32, isize, isize),
    rhs: (*const f32, isize, isize),
    accumulate: bool,
) {
    let (m, n, k) = dims;
    // Same threshold Flex uses: below ~7 MFLOP threads cost more than they save.
    let parallelism = if m * n * k >= 192 * 192 * 192 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    gemm_into(dst, dims, dst_rs, lhs, rhs, accumulate, parallelism);
}

/// [`matmul`] on the calling thread only (`dst = lhs @ rhs`).
fn matmul_serial(
    dst: &mut [f32],
    dims: (usize, usize, usize),
    dst_rs: usize,
    lhs: (*const f32, isize, isize),
    rhs: (*const f32, isize, isize),
) {
    gemm_into(dst, dims, dst_rs, lhs, rhs, false, gemm::Parallelism::None);
}

/// The one call into `gemm` behind [`matmul`] and [`matmul_serial`].
#[allow(clippy::too_many_arguments)]
fn gemm_into(
    dst: &mut [f32],
    (m, n, k): (usize, usize, usize),
    dst_rs: usize,
    lhs: (*const f32, isize, isize),
    rhs: (*const f32, isize, isize),
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    assert!(m == 0 || dst.len() >= (m - 1) * dst_rs + n);
    // SAFETY: dst holds m rows of n at stride dst_rs (checked above); the callers build lhs
    // and rhs from `Mat` views whose layouts cover [m, k] and [k, n].
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.0,
            lhs.2,
            lhs.1,
            rhs.0,
            rhs.2,
            rhs.1,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Loss and per-row log-sum-exp. Buffers: one `[c, V]` logits block, `lse [N]`.
/// The shape contract every raw-pointer matmul below relies on (the safe public methods can be
/// called without `lm_head_loss`'s own checks, so it is enforced here too).
fn check_shapes(h: &Mat, w: &Mat, targets: &[usize], chunk_rows: usize) {
    assert_eq!(
        h.cols, w.rows,
        "hidden [N, d] and weight [d, V] disagree on d"
    );
    assert_eq!(targets.len(), h.rows, "one target per hidden row");
    assert!(chunk_rows > 0, "chunk_rows must be > 0");
}

fn forward(h: &Mat, w: &Mat, targets: &[usize], chunk_rows: usize) -> (f32, Vec<f32>) {
    check_shapes(h, w, targets, chunk_rows);
    let (n, d, v) = (h.rows, h.cols, w.cols);
    let mut logits = vec![0f32; chunk_rows.min(n) * v]; // [c, V], reused by every chunk
    let mut lse = vec![0f32; n]; // [N]
    let mut picked = vec![0f32; n]; // [N]: logits[i, target[i]]
    for (s, e) in generic::chunks(n, chunk_rows) {
        let c = e - s;
        let block = &mut logits[..c * v];
        // logits[c, V] = hidden[s..e] @ W: 2·c·d·V FLOPs.
        matmul(
            block,
            (c, v, d),
            v,
            (h.row_ptr(s), h.rs, h.cs),
            (w.row_ptr(0), w.rs, w.cs),
            false,
        );
        block
            .par_chunks(v)
            .zip(lse[s..e].par_iter_mut())
            .for_each(|(row, out)| *out = kernels::log_sum_exp(row));
        for i in s..e {
            picked[i] = block[(i - s) * v + targets[i]];
        }
    }
    (mean_loss(&lse, &picked), lse)
}

/// `(grad_hidden [N, d], grad_weight [d, V])` for the upstream gradient `grad_loss`, given
/// the forward's `lse`: each chunk's logits are recomputed.
fn backward(
    h: &Mat,
    w: &Mat,
    targets: &[usize],
    lse: &[f32],
    grad_loss: f32,
    chunk_rows: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (gh, gw, _) = gradients(h, w, targets, Some(lse), grad_loss, chunk_rows);
    (gh, gw)
}

/// `(loss, grad_hidden, grad_weight)` in one pass for an upstream gradient of 1: the chunk's
/// logits are computed once, their log-sum-exp taken, and the same block turned into `g`.
/// Bit for bit the forward's loss and the backward's gradients.
fn forward_with_grads(
    h: &Mat,
    w: &Mat,
    targets: &[usize],
    chunk_rows: usize,
) -> (f32, Vec<f32>, Vec<f32>) {
    let (gh, gw, loss) = gradients(h, w, targets, None, 1.0, chunk_rows);
    (loss.expect("computed without a forward lse"), gh, gw)
}

/// The gradients, one chunk of rows at a time. Buffers: one `[c, V]` block that holds the
/// chunk's logits and is then overwritten in place by `g = (softmax − onehot)·scale`. With
/// `lse` the logits are a recomputation; without it, each row's log-sum-exp comes from the
/// block (as the forward computes it) and the mean loss is returned too.
fn gradients(
    h: &Mat,
    w: &Mat,
    targets: &[usize],
    lse: Option<&[f32]>,
    grad_loss: f32,
    chunk_rows: usize,
) -> (Vec<f32>, Vec<f32>, Option<f32>) {
    check_shapes(h, w, targets, chunk_rows);
    let (n, d, v) = (h.rows, h.cols, w.cols);
    let scale = grad_loss / n as f32; // d loss / d logits = (softmax − onehot) · scale
    let mut block_buf = vec![0f32; chunk_rows.min(n) * v]; // [c, V]
    let mut grad_hidden = vec![0f32; n * d]; // [N, d]
    let mut grad_weight = vec![0f32; d * v]; // [d, V]
    let mut own_lse = vec![0f32; if lse.is_some() { 0 } else { n }];
    let mut picked = vec![0f32; own_lse.len()];
    for (chunk, (s, e)) in generic::chunks(n, chunk_rows).enumerate() {
        let c = e - s;
        let g = &mut block_buf[..c * v];
        // logits[c, V] = hidden[s..e] @ W: 2·c·d·V FLOPs.
        matmul(
            g,
            (c, v, d),
            v,
            (h.row_ptr(s), h.rs, h.cs),
            (w.row_ptr(0), w.rs, w.cs),
            false,
        );
        let chunk_lse = match lse {
            Some(l) => &l[s..e],
            None => {
                g.par_chunks(v)
                    .zip(own_lse[s..e].par_iter_mut())
                    .for_each(|(row, out)| *out = kernels::log_sum_exp(row));
                for i in s..e {
                    picked[i] = g[(i - s) * v + targets[i]];
                }
                &own_lse[s..e]
            }
        };
        g.par_chunks_mut(v)
            .zip(chunk_lse.par_iter())
            .zip(targets[s..e].par_iter())
            .for_each(|((row, &l), &t)| kernels::softmax_minus_onehot(row, l, t, scale));
        // grad_hidden[s..e] = g @ W^T: [c, V] @ [V, d], 2·c·d·V FLOPs. The output is small
        // and the inner dimension huge, which gemm's own threading handles badly (slower on
        // 2 threads than on 1), so each thread takes its own rows with a serial gemm.
        let g = &*g;
        let rows_per_task = c.div_ceil(rayon::current_num_threads());
        grad_hidden[s * d..e * d]
            .par_chunks_mut(rows_per_task * d)
            .enumerate()
            .for_each(|(i, out)| {
                let r0 = i * rows_per_task;
                matmul_serial(
                    out,
                    (out.len() / d, d, v),
                    d,
                    (g[r0 * v..].as_ptr(), v as isize, 1),
                    (w.row_ptr(0), w.cs, w.rs),
                );
            });
        // grad_weight += hidden[s..e]^T @ g: [d, c] @ [c, V], 2·c·d·V FLOPs.
        matmul(
            &mut grad_weight,
            (d, v, c),
            v,
            (h.row_ptr(s), h.cs, h.rs),
            (g.as_ptr(), v as isize, 1),
            chunk > 0,
        );
    }
    let loss = lse.is_none().then(|| mean_loss(&own_lse, &picked));
    (grad_hidden, grad_weight, loss)
}

/// Mean over rows of `lse − picked`, summed in row order in f64.
fn mean_loss(lse: &[f32], picked: &[f32]) -> f32 {
    let total: f64 = lse.iter().zip(picked).map(|(&l, &p)| (l - p) as f64).sum();
    (total / lse.len() as f64) as f32
}

/// Row kernels. Written as plain loops over 16 independent lanes so LLVM vectorizes them;
/// compiled twice (baseline x86-64 and AVX2) and picked at run time. Both builds compute
/// the same bits: same operations, same order, no FMA contraction.
mod kernels {
    const LANES: usize = 16;

    /// `exp(x)` to ~1 ulp over the f32 range (Cephes `expf`): `x = k·ln2 + r` with
    /// `|r| ≤ ln2/2`, `exp(r)` by a degree-7 polynomial, `2^k` built in the exponent bits.
    /// Branch-free so it vectorizes; inputs are clamped to [-87, 88] (results stay normal).
    #[inline(always)]
    fn exp(x: f32) -> f32 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        // Adding 1.5·2^23 rounds to an integer and leaves it in the low mantissa bits.
        const MAGIC: f32 = 12_582_912.0;
        let x = x.clamp(-87.0, 88.0);
        let t = x * LOG2E + MAGIC;
        let k = t.to_bits() as i32 - MAGIC.to_bits() as i32;
        let kf = t - MAGIC;
        let r = x - kf * LN2_HI - kf * LN2_LO;
        let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
            * r
            + 1.666_666_5e-1)
            * r
            + 0.5;
        let er = p * (r * r) + r + 1.0;
        er * f32::from_bits(((k + 127) << 23) as u32)
    }

    #[inline(always)]
    fn lse_impl(row: &[f32]) -> f32 {
        let mut mx = [f32::NEG_INFINITY; LANES];
        let mut it = row.chunks_exact(LANES);
        for ch in &mut it {
            for l in 0..LANES {
                mx[l] = mx[l].max(ch[l]);
            }
        }
        let m = it.remainder().iter().fold(
            mx.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)),
            |a, &b| a.max(b),
        );
        let mut acc = [0f32; LANES];
        let mut it = row.chunks_exact(LANES);
        for ch in &mut it {
            for l in 0..LANES {
                acc[l] += exp(ch[l] - m);
            }
        }
        let tail: f32 = it.remainder().iter().map(|&x| exp(x - m)).sum();
        let sum: f32 = acc.iter().sum::<f32>() + tail;
        m + sum.ln()
    }

    #[inline(always)]
    fn grad_impl(row: &mut [f32], lse: f32, target: usize, scale: f32) {
        let x_target = row[target];
        let mut it = row.chunks_exact_mut(LANES);
        for ch in &mut it {
            for x in ch.iter_mut() {
                *x = exp(*x - lse) * scale;
            }
        }
        for x in it.into_remainder() {
            *x = exp(*x - lse) * scale;
        }
        row[target] = (exp(x_target - lse) - 1.0) * scale;
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn lse_avx2(row: &[f32]) -> f32 {
        lse_impl(row)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn grad_avx2(row: &mut [f32], lse: f32, target: usize, scale: f32) {
        grad_impl(row, lse, target, scale)
    }

    /// `log Σ_j exp(row[j])`, shifted by the row max so nothing overflows.
    pub(super) fn log_sum_exp(row: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { lse_avx2(row) };
        }
        lse_impl(row)
    }

    /// In place: `row[j] = (exp(row[j] − lse) − [j == target]) · scale`.
    pub(super) fn softmax_minus_onehot(row: &mut [f32], lse: f32, target: usize, scale: f32) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { grad_avx2(row, lse, target, scale) };
        }
        grad_impl(row, lse, target, scale)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn exp_is_within_two_ulp_of_std() {
            let mut x = -87.0f32;
            while x < 88.0 {
                let (a, b) = (exp(x), x.exp());
                let ulp = (b.to_bits() as i64 - a.to_bits() as i64).abs();
                assert!(ulp <= 2, "exp({x}) = {a}, std {b}");
                x += 0.0137;
            }
            assert_eq!(exp(0.0), 1.0);
            assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        }

        #[test]
        fn simd_and_scalar_builds_agree_bitwise() {
            let row: Vec<f32> = (0..1037)
                .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 9.0)
                .collect();
            assert_eq!(lse_impl(&row).to_bits(), log_sum_exp(&row).to_bits());
            let (mut a, mut b) = (row.clone(), row.clone());
            grad_impl(&mut a, 12.5, 3, 0.25);
            softmax_minus_onehot(&mut b, 12.5, 3, 0.25);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

    fn max_rel(a: FlexTensor, b: FlexTensor) -> f64 {
        let a = a.into_data().to_vec::<f32>().unwrap();
        let b = b.into_data().to_vec::<f32>().unwrap();
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
        let diff = a
            .iter()
            .zip(&b)
            .fold(0f64, |m, (&x, &y)| m.max((x - y).abs() as f64));
        diff / scale
    }

    /// The hand-written kernel and the generic tensor-op version agree (this also keeps the
    /// generic path, which GPU backends use, under test).
    #[test]
    fn kernel_matches_generic_path() {
        let dev = Default::default();
        let (n, d, v, chunk) = (45, 12, 333, 16);
        let f = |len: usize, k: usize| -> Vec<f32> {
            (0..len)
                .map(|i| (((i * k) % 97) as f32 / 97.0 - 0.5) * 2.0)
                .collect()
        };
        let hidden = Tensor::<Flex, 2>::from_data(TensorData::new(f(n * d, 31), [n, d]), &dev);
        let weight = Tensor::<Flex, 2>::from_data(TensorData::new(f(d * v, 17), [d, v]), &dev);
        let ids: Vec<i64> = (0..n as i64).map(|i| (i * 37) % v as i64).collect();
        let targets = Tensor::<Flex, 1, Int>::from_data(TensorData::new(ids, [n]), &dev);
        let (h, w, t) = (
            hidden.into_primitive().tensor(),
            weight.into_primitive().tensor(),
            targets.into_primitive(),
        );
        let (loss_k, lse_k) = Flex::lm_head_loss_forward(h.clone(), w.clone(), t.clone(), chunk);
        let (loss_g, lse_g) = generic::forward::<Flex>(h.clone(), w.clone(), t.clone(), chunk);
        assert!(max_rel(loss_k, loss_g) <= 1e-6);
        assert!(max_rel(lse_k.clone(), lse_g) <= 1e-6);
        let up = Tensor::<Flex, 1>::from_data([0.5f32], &dev);
        let up = match up.into_primitive() {
            TensorPrimitive::Float(t) => t,
            _ => unreachable!(),
        };
        let (gh_k, gw_k) = Flex::lm_head_loss_backward(
            h.clone(),
            w.clone(),
            t.clone(),
            lse_k.clone(),
            up.clone(),
            chunk,
        );
        let (gh_g, gw_g) = generic::backward::<Flex>(h, w, t, lse_k, up, chunk);
        assert!(max_rel(gh_k, gh_g) <= 1e-5);
        assert!(max_rel(gw_k, gw_g) <= 1e-5);
    }

    /// Training's one pass gives exactly the forward's loss and the backward's gradients for
    /// an upstream gradient of 1 (the logits of a chunk are the same products, the same row
    /// kernels run on them).
    #[test]
    fn one_pass_equals_forward_then_backward_bit_for_bit() {
        let dev = Default::default();
        let (n, d, v, chunk) = (45, 12, 333, 16);
        let f = |len: usize, k: usize| -> Vec<f32> {
            (0..len)
                .map(|i| (((i * k) % 89) as f32 / 89.0 - 0.5) * 3.0)
                .collect()
        };
        let hidden = Tensor::<Flex, 2>::from_data(TensorData::new(f(n * d, 29), [n, d]), &dev);
        let weight = Tensor::<Flex, 2>::from_data(TensorData::new(f(d * v, 13), [d, v]), &dev);
        let ids: Vec<i64> = (0..n as i64).map(|i| (i * 41) % v as i64).collect();
        let targets = Tensor::<Flex, 1, Int>::from_data(TensorData::new(ids, [n]), &dev);
        let (h, w, t) = (
            hidden.into_primitive().tensor(),
            weight.into_primitive().tensor(),
            targets.into_primitive(),
        );
        let bits = |x: FlexTensor| -> Vec<u32> {
            x.into_data()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        let (loss, lse) = Flex::lm_head_loss_forward(h.clone(), w.clone(), t.clone(), chunk);
        let one = f32_tensor(vec![1.0], [1]);
        let (gh, gw) =
            Flex::lm_head_loss_backward(h.clone(), w.clone(), t.clone(), lse, one, chunk);
        let (loss1, gh1, gw1) = Flex::lm_head_loss_with_grads(h, w, t, chunk);
        assert_eq!(bits(loss1), bits(loss));
        assert_eq!(bits(gh1), bits(gh));
        assert_eq!(bits(gw1), bits(gw));
    }
}
