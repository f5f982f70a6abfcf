//! The fused LM-head loss on a GPU backend (wgpu, lavapipe in CI; CUDA when built with only
//! `--features cuda`, on a GPU host): the projection op's matmul per chunk over a vocabulary
//! padded to a multiple of 64 (cuBLASLt on CUDA, as `common::choose_products` sets it), plus
//! lab-kernels' row kernels, wired as an autodiff node over a Fusion custom op, against
//! an fp64 host reference of the loss and both gradients.
//!
//! Tolerances, as a fraction of the largest reference magnitude of each tensor (no floor: the
//! gradients are small, ~1/N, and a floor of 1 would make the tolerance absolute and loose):
//! - f32: 1e-5. Each logit is a d = 24 term f32 dot product; the row statistics are f32 sums
//!   of at most a few hundred terms; the weight gradient sums chunks in f32. On CUDA the
//!   products compute as TF32 (cuBLASLt declines f32, cubecl takes tensor cores):
//!   `common::f32_products`.
//! - f16 inputs (f16 matmuls, f32 softmax and loss): 4e-3 on the loss and 1e-2 on the
//!   gradients. Logits (|x| up to ~3, so ~1.5e-3 absolute) and the logits' gradient are
//!   rounded to f16 before the matmuls that follow, and those matmuls' sums are stored in f16
//!   again: a few 2^-11 ≈ 4.9e-4 roundings of values near the peak.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::backend::{Autodiff, Flex};
use burn::tensor::{backend::Backend, DType, FloatDType, Int, Tensor, TensorData, TensorPrimitive};
use lab_ops::{lm_head_loss_chunked, padded_vocab, FusedLoss};

use crate::common;
use common::{assert_close_to_peak, token_losses_fp64, Gpu};

type Ad = Autodiff<Gpu>;

struct Case {
    n: usize,
    d: usize,
    v: usize,
    hidden: Vec<f32>,
    weight: Vec<f32>,
    targets: Vec<i32>,
}

fn case(n: usize, d: usize, v: usize, seed: u64) -> Case {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let hidden = (0..n * d).map(|_| uniform()).collect();
    // Logits spread over about ±3.
    let weight = (0..d * v)
        .map(|_| uniform() * 3.0 / (d as f32).sqrt())
        .collect();
    let targets = (0..n).map(|i| ((i * 7919 + 13) % v) as i32).collect();
    Case {
        n,
        d,
        v,
        hidden,
        weight,
        targets,
    }
}

/// (loss, d hidden, d weight) on the host.
type Grads = (Vec<f32>, Vec<f32>, Vec<f32>);
type Reference = (f64, Vec<f64>, Vec<f64>);

/// (loss, d hidden, d weight) of `mean_i (lse_i − logit_i,t_i) · upstream` in fp64.
fn reference(c: &Case, upstream: f64) -> Reference {
    let (n, d, v) = (c.n, c.d, c.v);
    let (mut loss, mut gh, mut gw) = (0.0, vec![0.0; n * d], vec![0.0; d * v]);
    for i in 0..n {
        let logits: Vec<f64> = (0..v)
            .map(|j| {
                (0..d)
                    .map(|k| c.hidden[i * d + k] as f64 * c.weight[k * v + j] as f64)
                    .sum()
            })
            .collect();
        let m = logits.iter().cloned().fold(f64::MIN, f64::max);
        let lse = m + logits.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        let t = c.targets[i] as usize;
        loss += (lse - logits[t]) / n as f64;
        for (j, x) in logits.iter().enumerate() {
            let g = ((x - lse).exp() - if j == t { 1.0 } else { 0.0 }) * upstream / n as f64;
            for k in 0..d {
                gh[i * d + k] += g * c.weight[k * v + j] as f64;
                gw[k * v + j] += g * c.hidden[i * d + k] as f64;
            }
        }
    }
    (loss * upstream, gh, gw)
}

/// f32's `(loss, gradient)` tolerances (see the module docs).
fn f32_tolerances() -> (f64, f64) {
    (common::f32_products(1e-5), common::f32_products(1e-5))
}

/// The loss and both gradients against the reference, at `(loss, gradient)` tolerances.
fn assert_matches(got: &Grads, want: &Reference, (loss_tol, grad_tol): (f64, f64)) {
    assert_close_to_peak("loss", &got.0, &[want.0], loss_tol);
    assert_close_to_peak("d hidden", &got.1, &want.1, grad_tol);
    assert_close_to_peak("d weight", &got.2, &want.2, grad_tol);
}

fn host<Bk: Backend, const D: usize>(t: Tensor<Bk, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

fn inputs<Bk: Backend>(
    c: &Case,
    dtype: FloatDType,
) -> (Tensor<Bk, 2>, Tensor<Bk, 2>, Tensor<Bk, 1, Int>) {
    let dev = Default::default();
    let h = Tensor::<Bk, 2>::from_data(TensorData::new(c.hidden.clone(), [c.n, c.d]), &dev);
    let w = Tensor::<Bk, 2>::from_data(TensorData::new(c.weight.clone(), [c.d, c.v]), &dev);
    let t = Tensor::<Bk, 1, Int>::from_data(TensorData::new(c.targets.clone(), [c.n]), &dev);
    (h.cast(dtype), w.cast(dtype), t)
}

/// Training's path: the autodiff node, computing the gradients with the loss.
fn trained(c: &Case, chunk_rows: usize, dtype: FloatDType) -> Grads {
    common::choose_products(); // on CUDA, the loss's products on cuBLASLt
    let (h, w, t) = inputs::<Ad>(c, dtype);
    let (h, w) = (h.require_grad(), w.require_grad());
    let loss = lm_head_loss_chunked(h.clone(), w.clone(), t, chunk_rows);
    let grads = loss.backward();
    let gh = h.grad(&grads).expect("d hidden");
    let gw = w.grad(&grads).expect("d weight");
    assert_eq!(gh.dtype(), dtype.into(), "d hidden has the input's dtype");
    assert_eq!(gw.dtype(), dtype.into(), "d weight has the input's dtype");
    (host(loss.inner()), host(gh), host(gw))
}

#[test]
fn training_loss_and_gradients_match_the_fp64_reference_over_several_chunks() {
    // 13 rows in chunks of 5: two full chunks and a partial one; V not a multiple of 256.
    // The products pad V to 320 columns; at 128 words they pad nothing.
    for c in [case(13, 24, 300, 1), case(13, 24, 128, 4)] {
        assert_matches(
            &trained(&c, 5, FloatDType::F32),
            &reference(&c, 1.0),
            f32_tolerances(),
        );
    }
}

#[test]
fn forward_then_backward_halves_match_the_fp64_reference() {
    // What a caller without the autodiff node runs: the forward's log-sum-exp, then the
    // backward for an upstream gradient of 0.5, each a Fusion custom op.
    let c = case(9, 16, 70, 2);
    common::choose_products();
    let (h, w, t) = inputs::<Gpu>(&c, FloatDType::F32);
    let prim = |x: Tensor<Gpu, 2>| x.into_primitive().tensor();
    let (h, w, t) = (prim(h), prim(w), t.into_primitive());
    let (loss, lse) = <Gpu as FusedLoss>::lm_head_loss_forward(h.clone(), w.clone(), t.clone(), 4);
    let upstream =
        Tensor::<Gpu, 1>::from_data(TensorData::new(vec![0.5f32], [1]), &Default::default());
    let (gh, gw) = <Gpu as FusedLoss>::lm_head_loss_backward(
        h,
        w,
        t,
        lse,
        upstream.into_primitive().tensor(),
        4,
    );
    let float = |x| Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(x));
    let loss = Tensor::<Gpu, 1>::from_primitive(TensorPrimitive::Float(loss));
    // The forward's loss is not scaled by the upstream gradient.
    let mut want = reference(&c, 0.5);
    want.0 *= 2.0;
    let got = (host(loss), host(float(gh)), host(float(gw)));
    assert_matches(&got, &want, f32_tolerances());
}

#[test]
fn f16_inputs_train_with_an_f32_softmax() {
    assert!(
        Gpu::supports_dtype(&Default::default(), DType::F16),
        "this wgpu device has no f16: the f16 loss cannot be checked"
    );
    let mut c = case(11, 16, 200, 3);
    // The reference sees the inputs as f16 stores them.
    for x in c.hidden.iter_mut().chain(c.weight.iter_mut()) {
        *x = burn::tensor::f16::from_f32(*x).to_f32();
    }
    assert_matches(
        &trained(&c, 4, FloatDType::F16),
        &reference(&c, 1.0),
        (4e-3, 1e-2),
    );
}

/// bf16, the trainer's precision (CUDA builds only: lavapipe has no bf16). bf16 keeps 8 bits,
/// f16 11: the f16 tolerances times 8.
#[cfg(not(feature = "wgpu"))]
#[test]
fn bf16_inputs_train_with_an_f32_softmax() {
    let mut c = case(11, 16, 200, 3);
    for x in c.hidden.iter_mut().chain(c.weight.iter_mut()) {
        *x = burn::tensor::bf16::from_f32(*x).to_f32();
    }
    assert_matches(
        &trained(&c, 4, FloatDType::BF16),
        &reference(&c, 1.0),
        (3.2e-2, 8e-2),
    );
}

#[test]
fn a_tied_head_and_aligned_row_chunks_match_the_fp64_reference() {
    // A tied model's head is the embedding `[V, d]` read transposed, padded like any other;
    // and 4-row chunks of 64 f32 columns start 1 KiB apart, so burn can keep them as views of
    // the hidden states rather than copies.
    common::choose_products();
    let c = case(12, 64, 150, 6);
    let dev = Default::default();
    let h = Tensor::<Ad, 2>::from_data(TensorData::new(c.hidden.clone(), [c.n, c.d]), &dev)
        .require_grad();
    let (d, v) = (c.d, c.v);
    let table: Vec<f32> = (0..v * d).map(|k| c.weight[(k % d) * v + k / d]).collect();
    let table = Tensor::<Ad, 2>::from_data(TensorData::new(table, [v, d]), &dev).require_grad();
    let t = Tensor::<Ad, 1, Int>::from_data(TensorData::new(c.targets.clone(), [c.n]), &dev);
    let loss = lm_head_loss_chunked(h.clone(), table.clone().transpose(), t, 4);
    let grads = loss.backward();
    let gh = host(h.grad(&grads).expect("d hidden"));
    let g_table = host(table.grad(&grads).expect("d table")); // [V, d]
    let gw = (0..d * v).map(|k| g_table[(k % v) * d + k / v]).collect(); // [d, V]
    assert_matches(
        &(host(loss.inner()), gh, gw),
        &reference(&c, 1.0),
        f32_tolerances(),
    );
}

/// Evaluation's per-token losses: the Fusion forward's log-sum-exp less each row's target
/// logit, against fp64 row by row (f32: 1e-5 of the largest loss, as the mean loss).
#[test]
fn token_losses_match_the_fp64_reference_row_by_row() {
    common::choose_products();
    let c = case(13, 24, 300, 7);
    let (h, w, t) = inputs::<Gpu>(&c, FloatDType::F32);
    let got = host(lab_ops::lm_head_token_losses(h, w, t));
    let targets = c.targets.iter().map(|&t| t as usize);
    let want = token_losses_fp64(&c.hidden, &c.weight, targets, c.v);
    assert_close_to_peak("token losses", &got, &want, common::f32_products(1e-5));
}

#[test]
fn gpu_chunks_are_sized_for_the_device_and_the_cpu_keeps_its_own() {
    // x1-50m: 32 × 1,024 rows of GPT-2's 50,257 words. 1 GiB of f32 logits over the padded
    // 50,304 columns is 5,336 rows, 5,312 at a multiple of 64: 7 chunks instead of the CPU's 256.
    assert_eq!(<Ad as FusedLoss>::loss_chunk_rows(32_768, 50_257), 5_312);
    assert_eq!(<Flex as FusedLoss>::loss_chunk_rows(32_768, 50_257), 128);
    // Never more rows than there are, never fewer than 64 for a huge vocabulary.
    assert_eq!(<Gpu as FusedLoss>::loss_chunk_rows(100, 50_257), 100);
    assert_eq!(<Gpu as FusedLoss>::loss_chunk_rows(100_000, 1 << 30), 64);
}

#[test]
fn the_products_see_the_vocabulary_padded_to_whole_rows_of_64() {
    // GPT-2's 50,257 words are 50,304 columns in the loss's products (nanoGPT's padding);
    // a vocabulary already aligned is left as it is.
    assert_eq!(padded_vocab(50_257), 50_304);
    assert_eq!(padded_vocab(50_304), 50_304);
    assert_eq!(padded_vocab(1), 64);
    assert_eq!(padded_vocab(64_000), 64_000);
}
