//! Cross-entropy and perplexity of a token file, overall and by document type (meta.json's
//! spans). The per-type figures are token-weighted: the overall loss is the sum of every type's
//! summed loss over the sum of their tokens, so they add back up exactly.

use anyhow::{bail, Result};
use burn::tensor::{Int, Tensor, TensorData};
use lab_data::{sampler, Meta, TokenFile};
use lab_model::FusedOps;
use lab_model::Llama;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypeLoss {
    pub doc_type: String,
    /// Target tokens scored.
    pub tokens: u64,
    /// Summed cross-entropy (nats).
    pub nll_sum: f64,
    /// Mean cross-entropy (nats/token).
    pub loss: f64,
    pub perplexity: f64,
}

impl TypeLoss {
    fn new(doc_type: &str, tokens: u64, nll_sum: f64) -> TypeLoss {
        let loss = nll_sum / tokens.max(1) as f64;
        TypeLoss {
            doc_type: doc_type.to_string(),
            tokens,
            nll_sum,
            loss,
            perplexity: loss.exp(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Perplexity {
    pub file: String,
    pub overall: TypeLoss,
    /// By document type, in name order (one type, `all`, when the data has none).
    pub by_type: Vec<TypeLoss>,
}

/// Scores windows of `seq_len + 1` tokens starting at `offsets` of `file` (named `name` in
/// `meta`), `rows` windows per forward pass.
pub fn score_windows<B: FusedOps>(
    model: &Llama<B>,
    file: &TokenFile,
    meta: &Meta,
    name: &str,
    offsets: &[usize],
    seq_len: usize,
    rows: usize,
) -> Result<Perplexity> {
    let (names, ranges) = meta.types_of(name);
    let type_at = |pos: u64| -> Option<usize> {
        let i = ranges.partition_point(|&(start, _, _)| start <= pos);
        let (start, end, t) = *ranges.get(i.checked_sub(1)?)?;
        (start <= pos && pos < end).then_some(t)
    };
    let (mut tokens, mut sums) = (vec![0u64; names.len()], vec![0f64; names.len()]);
    let device = model.embed.val().device();
    for chunk in offsets.chunks(rows.max(1)) {
        let batch = sampler::read_windows(file, chunk, seq_len)?;
        let tensor = |v: &[u32]| {
            let data: Vec<i32> = v.iter().map(|&t| t as i32).collect();
            Tensor::<B, 2, Int>::from_data(TensorData::new(data, [chunk.len(), seq_len]), &device)
        };
        let losses = model.token_losses(tensor(&batch.inputs), tensor(&batch.targets));
        let losses: Vec<f32> = losses.into_data().convert::<f32>().into_vec().expect("f32");
        for (row, &offset) in chunk.iter().enumerate() {
            for i in 0..seq_len {
                // The target of input position i is file token offset + i + 1.
                if let Some(t) = type_at((offset + i + 1) as u64) {
                    tokens[t] += 1;
                    sums[t] += losses[row * seq_len + i] as f64;
                }
            }
        }
    }
    let by_type: Vec<TypeLoss> = names
        .iter()
        .enumerate()
        .map(|(i, n)| TypeLoss::new(n, tokens[i], sums[i]))
        .collect();
    let total_tokens = by_type.iter().map(|t| t.tokens).sum();
    let total_nll = by_type.iter().map(|t| t.nll_sum).sum();
    Ok(Perplexity {
        file: name.to_string(),
        overall: TypeLoss::new("overall", total_tokens, total_nll),
        by_type: by_type.into_iter().filter(|t| t.tokens > 0).collect(),
    })
}

/// The whole of `name` (val.bin, say) in consecutive windows: every token but the first is a
/// target exactly once (a last partial window is dropped).
pub fn perplexity<B: FusedOps>(
    model: &Llama<B>,
    file: &TokenFile,
    meta: &Meta,
    name: &str,
    seq_len: usize,
    rows: usize,
) -> Result<Perplexity> {
    if file.len() < seq_len + 1 {
        bail!(
            "{} holds {} tokens, fewer than a window of {}",
            file.path().display(),
            file.len(),
            seq_len + 1
        );
    }
    let offsets: Vec<usize> = (0..(file.len() - 1) / seq_len)
        .map(|w| w * seq_len)
        .collect();
    score_windows(model, file, meta, name, &offsets, seq_len, rows)
}

/// The fixed evaluation windows the trainer uses (`sampler::eval_batch`), scored by type.
pub fn eval_windows<B: FusedOps>(
    model: &Llama<B>,
    file: &TokenFile,
    meta: &Meta,
    seq_len: usize,
    rows: usize,
    batches: usize,
) -> Result<Perplexity> {
    let mut offsets = Vec::with_capacity(rows * batches);
    for b in 0..batches {
        offsets.extend(sampler::eval_offsets(file.len(), seq_len, b, rows, batches));
    }
    score_windows(model, file, meta, "val.bin", &offsets, seq_len, rows)
}
