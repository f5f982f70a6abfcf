//! The fused LM-head cross-entropy against the plain composition
//! (`matmul` + `log_softmax` + gather + mean, differentiated by burn's autodiff).

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor, TensorData};
use lab_ops::{lm_head_loss, lm_head_loss_chunked, lm_head_loss_unfused, DEFAULT_CHUNK_ROWS};

use crate::common::{assert_close_to_peak, token_losses_fp64};

type B = Autodiff<Flex>;

/// xorshift64*: test inputs that do not depend on burn's global RNG state.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-scale, scale).
    fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
            .collect()
    }
}

struct Case {
    hidden: Vec<f32>,
    weight: Vec<f32>,
    targets: Vec<i64>,
    n: usize,
    d: usize,
    v: usize,
}

fn case(n: usize, d: usize, v: usize, logit_scale: f32, seed: u64) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let hidden = rng.floats(n * d, 1.0);
    // Scale the weight so logits have a spread of about `logit_scale`.
    let weight = rng.floats(d * v, logit_scale / (d as f32).sqrt());
    let mut targets: Vec<i64> = (0..n).map(|_| (rng.next_u64() % v as u64) as i64).collect();
    // Always include both ends of the vocabulary.
    targets[0] = 0;
    if n > 1 {
        targets[n - 1] = v as i64 - 1;
    }
    Case {
        hidden,
        weight,
        targets,
        n,
        d,
        v,
    }
}

/// (loss, d loss/d hidden, d loss/d weight) as flat vectors, for `loss * upstream`.
fn run(c: &Case, fused_chunk: Option<usize>, upstream: f32) -> (f32, Vec<f32>, Vec<f32>) {
    let dev = Default::default();
    let hidden = Tensor::<B, 2>::from_data(TensorData::new(c.hidden.clone(), [c.n, c.d]), &dev)
        .require_grad();
    let weight = Tensor::<B, 2>::from_data(TensorData::new(c.weight.clone(), [c.d, c.v]), &dev)
        .require_grad();
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(c.targets.clone(), [c.n]), &dev);
    let loss = match fused_chunk {
        Some(rows) => lm_head_loss_chunked(hidden.clone(), weight.clone(), targets, rows),
        None => lm_head_loss_unfused(hidden.clone(), weight.clone(), targets),
    };
    assert_eq!(loss.dims(), [1]);
    let grads = (loss.clone() * upstream).backward();
    let gh = hidden.grad(&grads).expect("hidden grad");
    let gw = weight.grad(&grads).expect("weight grad");
    (
        loss.into_scalar(),
        gh.into_data().to_vec().unwrap(),
        gw.into_data().to_vec().unwrap(),
    )
}

/// max |a - b| / max |b|: relative error at the scale of the reference tensor.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
    assert!(scale > 0.0, "reference is all zeros");
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()));
    diff / scale
}

fn assert_matches_unfused(c: &Case, chunk: usize, upstream: f32) {
    let (loss_f, gh_f, gw_f) = run(c, Some(chunk), upstream);
    let (loss_u, gh_u, gw_u) = run(c, None, upstream);
    let what = format!("N={} d={} V={} chunk={chunk}", c.n, c.d, c.v);
    let loss_rel = ((loss_f - loss_u) as f64 / loss_u as f64).abs();
    assert!(loss_rel <= 1e-5, "{what}: loss {loss_f} vs {loss_u}");
    let e = rel_err(&gh_f, &gh_u);
    assert!(e <= 1e-5, "{what}: grad hidden rel err {e:e}");
    let e = rel_err(&gw_f, &gw_u);
    assert!(e <= 1e-5, "{what}: grad weight rel err {e:e}");
}

#[test]
fn matches_unfused_on_several_shapes() {
    // (N, d, V, chunk rows): single row, N not a multiple of the chunk, chunk larger than N,
    // exactly one full chunk, and the default chunk with a ragged last chunk.
    let shapes = [
        (1, 4, 7, 3),
        (5, 3, 11, 2),
        (37, 16, 101, 8),
        (64, 8, 50, 64),
        (20, 8, 300, 128),
        (DEFAULT_CHUNK_ROWS + 2, 32, 1000, DEFAULT_CHUNK_ROWS),
    ];
    for (i, &(n, d, v, chunk)) in shapes.iter().enumerate() {
        assert_matches_unfused(&case(n, d, v, 4.0, i as u64 + 1), chunk, 1.0);
    }
}

#[test]
fn matches_unfused_with_large_logits() {
    // Logits spread ~±60: exp would overflow fp32 without the max/log-sum-exp shift.
    assert_matches_unfused(&case(33, 16, 257, 60.0, 7), 16, 1.0);
}

#[test]
fn scales_with_the_upstream_gradient() {
    // Gradient accumulation divides the loss by the number of micro-batches.
    assert_matches_unfused(&case(19, 8, 64, 4.0, 11), 4, 0.25);
    assert_matches_unfused(&case(19, 8, 64, 4.0, 12), 4, -3.0);
}

#[test]
fn two_runs_are_bit_identical() {
    let c = case(300, 64, 5000, 4.0, 5);
    let (l1, gh1, gw1) = run(&c, Some(DEFAULT_CHUNK_ROWS), 1.0);
    let (l2, gh2, gw2) = run(&c, Some(DEFAULT_CHUNK_ROWS), 1.0);
    assert_eq!(l1.to_bits(), l2.to_bits());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&gh1), bits(&gh2));
    assert_eq!(bits(&gw1), bits(&gw2));
}

#[test]
fn chunk_height_does_not_change_the_loss_beyond_rounding() {
    let c = case(50, 16, 400, 4.0, 9);
    let (whole, _, _) = run(&c, Some(50), 1.0);
    for rows in [1, 7, 16, 49] {
        let (chunked, _, _) = run(&c, Some(rows), 1.0);
        assert!(
            ((chunked - whole) / whole).abs() <= 1e-6,
            "chunk {rows}: {chunked} vs {whole}"
        );
    }
}

#[test]
fn untracked_forward_equals_tracked_forward() {
    // Without require_grad (eval) the op takes the plain forward path: same bits.
    let c = case(70, 16, 300, 4.0, 3);
    let dev = Default::default();
    let hidden = Tensor::<B, 2>::from_data(TensorData::new(c.hidden.clone(), [c.n, c.d]), &dev);
    let weight = Tensor::<B, 2>::from_data(TensorData::new(c.weight.clone(), [c.d, c.v]), &dev);
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(c.targets.clone(), [c.n]), &dev);
    let eval: f32 = lm_head_loss(hidden, weight, targets).into_scalar();
    let (train, _, _) = run(&c, Some(DEFAULT_CHUNK_ROWS), 1.0);
    assert_eq!(eval.to_bits(), train.to_bits());
    // And on the plain (non-autodiff) backend.
    let hidden = Tensor::<Flex, 2>::from_data(TensorData::new(c.hidden.clone(), [c.n, c.d]), &dev);
    let weight = Tensor::<Flex, 2>::from_data(TensorData::new(c.weight.clone(), [c.d, c.v]), &dev);
    let targets =
        Tensor::<Flex, 1, Int>::from_data(TensorData::new(c.targets.clone(), [c.n]), &dev);
    let plain: f32 = lm_head_loss(hidden, weight, targets).into_scalar();
    assert_eq!(plain.to_bits(), train.to_bits());
}

#[test]
fn uniform_logits_give_log_v() {
    // Zero weight: every logit is 0, softmax is uniform, loss is exactly ln V, and the
    // hidden gradient is zero (W = 0) while the weight gradient is not.
    let mut c = case(10, 4, 97, 1.0, 13);
    c.weight.iter_mut().for_each(|w| *w = 0.0);
    let (loss, gh, gw) = run(&c, Some(3), 1.0);
    assert!((loss - (97f32).ln()).abs() < 1e-6, "{loss}");
    assert!(gh.iter().all(|&g| g == 0.0));
    assert!(gw.iter().any(|&g| g != 0.0));
}

#[test]
fn transposed_weight_view_matches_unfused() {
    // Tied embeddings hand the op `embed.transpose()`: a strided [d, V] view of a [V, d] matrix.
    let c = case(40, 8, 90, 4.0, 21);
    let dev = Default::default();
    let grads_of = |fused: bool| {
        let hidden = Tensor::<B, 2>::from_data(TensorData::new(c.hidden.clone(), [c.n, c.d]), &dev)
            .require_grad();
        // Same values as `c.weight`, stored as [V, d].
        let mut wt = vec![0f32; c.d * c.v];
        for k in 0..c.d {
            for j in 0..c.v {
                wt[j * c.d + k] = c.weight[k * c.v + j];
            }
        }
        let embed = Tensor::<B, 2>::from_data(TensorData::new(wt, [c.v, c.d]), &dev).require_grad();
        let targets =
            Tensor::<B, 1, Int>::from_data(TensorData::new(c.targets.clone(), [c.n]), &dev);
        let loss = if fused {
            lm_head_loss_chunked(hidden.clone(), embed.clone().transpose(), targets, 16)
        } else {
            lm_head_loss_unfused(hidden.clone(), embed.clone().transpose(), targets)
        };
        let grads = loss.clone().backward();
        (
            loss.into_scalar(),
            hidden
                .grad(&grads)
                .unwrap()
                .into_data()
                .to_vec::<f32>()
                .unwrap(),
            embed
                .grad(&grads)
                .unwrap()
                .into_data()
                .to_vec::<f32>()
                .unwrap(),
        )
    };
    let (lf, ghf, gef) = grads_of(true);
    let (lu, ghu, geu) = grads_of(false);
    assert!(((lf - lu) / lu).abs() <= 1e-5, "{lf} vs {lu}");
    assert!(rel_err(&ghf, &ghu) <= 1e-5);
    assert!(rel_err(&gef, &geu) <= 1e-5);
}

/// `lm_head_token_losses` on backend `Bk`, the weight as `[d, V]` or as the transposed view of
/// a `[V, d]` matrix (a tied embedding).
fn token_losses<Bk: lab_ops::FusedLoss>(c: &Case, transposed: bool) -> Vec<f32> {
    let dev = Default::default();
    let hidden = Tensor::<Bk, 2>::from_data(TensorData::new(c.hidden.clone(), [c.n, c.d]), &dev);
    let weight = Tensor::<Bk, 2>::from_data(TensorData::new(c.weight.clone(), [c.d, c.v]), &dev);
    let weight = if transposed {
        let stored = Tensor::<Bk, 2>::from_data(weight.transpose().into_data(), &dev);
        stored.transpose()
    } else {
        weight
    };
    let targets = Tensor::<Bk, 1, Int>::from_data(TensorData::new(c.targets.clone(), [c.n]), &dev);
    let losses = lab_ops::lm_head_token_losses(hidden, weight, targets);
    assert_eq!(losses.dims(), [c.n]);
    losses.into_data().to_vec().unwrap()
}

/// Evaluation's per-token losses, on Flex (its fused row kernels) and under autodiff (the
/// generic chunked path), against fp64: over several chunks with a ragged last one, and with a
/// tied embedding's strided view. f32 tolerance: 1e-5 of the largest loss, as the mean loss.
#[test]
fn token_losses_match_the_fp64_reference_row_by_row() {
    let cases = [
        case(1, 4, 7, 4.0, 31),
        case(DEFAULT_CHUNK_ROWS + 3, 16, 301, 4.0, 32),
        case(40, 8, 90, 12.0, 33),
    ];
    for c in &cases {
        let targets = c.targets.iter().map(|&t| t as usize);
        let want = token_losses_fp64(&c.hidden, &c.weight, targets, c.v);
        for (path, got) in [
            ("flex", token_losses::<Flex>(c, false)),
            ("flex, transposed weight", token_losses::<Flex>(c, true)),
            ("autodiff", token_losses::<B>(c, false)),
        ] {
            let what = format!("{path}, N={} V={}", c.n, c.v);
            assert_close_to_peak(&what, &got, &want, 1e-5);
        }
    }
}
