//! Text generation: incremental decoding with the KV cache (each new token attends to the
//! cached keys and values; positions and mask offset by the cache), greedy or sampled
//! (temperature, top-k, top-p) from a seeded generator, so the same seed gives the same text.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::Llama;

#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 is greedy (argmax).
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub seed: u64,
}

impl Sampling {
    pub fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }
}

/// Why decoding stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    MaxTokens,
    EndOfText,
    /// The sequence reached the model's context length.
    ContextFull,
}

fn ids<B: Backend>(tokens: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
    let data: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    Tensor::from_data(TensorData::new(data, [1, tokens.len()]), device)
}

fn last_row<B: Backend>(logits: Tensor<B, 3>) -> Vec<f32> {
    let [_, t, v] = logits.dims();
    logits
        .narrow(1, t - 1, 1)
        .reshape([v])
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32 logits")
}

/// The prompt's last `seq_len` tokens at most (the context a forward pass takes).
fn fit(prompt: &[u32], seq_len: usize) -> &[u32] {
    &prompt[prompt.len().saturating_sub(seq_len)..]
}

/// Decodes up to `max_new` tokens after `prompt` with the KV cache, calling `on_token` as each
/// is chosen (streaming). Stops early at `eot` or when the context is full.
pub fn generate<B: lab_ops::FusedLayers>(
    model: &Llama<B>,
    prompt: &[u32],
    max_new: usize,
    sampling: &Sampling,
    eot: Option<u32>,
    on_token: &mut dyn FnMut(u32),
) -> (Vec<u32>, Stop) {
    let device = model.embed.val().device();
    let prompt = fit(prompt, model.seq_len());
    let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
    let mut cache = model.new_cache(prompt.len().saturating_add(max_new));
    let mut logits = last_row(model.forward_cached(ids::<B>(prompt, &device), &mut cache));
    let mut out = Vec::new();
    loop {
        if out.len() == max_new {
            return (out, Stop::MaxTokens);
        }
        let next = pick(&logits, sampling, &mut rng);
        out.push(next);
        on_token(next);
        if Some(next) == eot {
            return (out, Stop::EndOfText);
        }
        // The next forward pass would see more positions than the model has.
        if cache.len() + 1 > model.seq_len() && out.len() < max_new {
            return (out, Stop::ContextFull);
        }
        logits = last_row(model.forward_cached(ids::<B>(&[next], &device), &mut cache));
    }
}

/// The same decoding without a cache: the whole sequence recomputed for every token (the
/// reference the cache is tested against, and the baseline of `lab bench --generate`).
pub fn generate_recompute<B: lab_ops::FusedLayers>(
    model: &Llama<B>,
    prompt: &[u32],
    max_new: usize,
    sampling: &Sampling,
    eot: Option<u32>,
) -> (Vec<u32>, Stop) {
    let device = model.embed.val().device();
    let mut seq = fit(prompt, model.seq_len()).to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
    let mut out = Vec::new();
    loop {
        if out.len() == max_new {
            return (out, Stop::MaxTokens);
        }
        let logits = last_row(model.logits(ids::<B>(&seq, &device)));
        let next = pick(&logits, sampling, &mut rng);
        out.push(next);
        seq.push(next);
        if Some(next) == eot {
            return (out, Stop::EndOfText);
        }
        if seq.len() > model.seq_len() && out.len() < max_new {
            return (out, Stop::ContextFull);
        }
    }
}

/// The next token from a row of logits.
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut ChaCha8Rng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .map_or(0, |(i, _)| i as u32)
    };
    if s.temperature <= 0.0 {
        return argmax();
    }
    // Candidates by descending logit (ties by id), then top-k, then the nucleus.
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if let Some(k) = s.top_k.filter(|&k| k > 0) {
        order.truncate(k);
    }
    let top = logits[order[0]] as f64;
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] as f64 - top) / s.temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut keep = order.len();
    if let Some(p) = s.top_p.filter(|&p| p < 1.0) {
        let mut mass = 0.0;
        for (i, w) in weights.iter().enumerate() {
            mass += w / total;
            if mass >= p {
                keep = i + 1;
                break;
            }
        }
    }
    let kept: f64 = weights[..keep].iter().sum();
    let mut u = rng.random::<f64>() * kept;
    for (i, w) in weights[..keep].iter().enumerate() {
        u -= w;
        if u <= 0.0 {
            return order[i] as u32;
        }
    }
    order[keep - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_respects_greedy_top_k_top_p_and_the_seed() {
        let logits = [0.0f32, 5.0, 4.9, -3.0];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(pick(&logits, &Sampling::greedy(), &mut rng), 1);
        let top2 = Sampling {
            temperature: 1.0,
            top_k: Some(2),
            top_p: None,
            seed: 3,
        };
        let draws: Vec<u32> = (0..200).map(|_| pick(&logits, &top2, &mut rng)).collect();
        assert!(draws.iter().all(|&t| t == 1 || t == 2));
        assert!(draws.contains(&1) && draws.contains(&2));
        // A nucleus of 0.4 holds only the most likely token.
        let nucleus = Sampling {
            top_k: None,
            top_p: Some(0.4),
            ..top2.clone()
        };
        assert!((0..50).all(|_| pick(&logits, &nucleus, &mut rng) == 1));
        let run = |seed| {
            let mut r = ChaCha8Rng::seed_from_u64(seed);
            (0..20)
                .map(|_| pick(&logits, &top2, &mut r))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(9), run(9));
    }
}
