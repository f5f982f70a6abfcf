//! Multiple choice, the HellaSwag / lm-eval recipe: for each choice, the log-likelihood of its
//! tokens given the context; an item is right when the true choice scores highest, by the sum
//! (`acc`) or by the sum per byte of the choice (`acc_norm`). Inputs are JSONL in the MMLU shape
//! (`question, choices[], answer`) or the HellaSwag shape (`ctx, endings[], label`); k-shot
//! prompts come from a dev split. Sequences are scored in padded batches.

use std::path::Path;

use anyhow::{bail, Context, Result};
use burn::tensor::{Int, Tensor, TensorData};
use lab_corpus::tokenize::Tokenizer;
use lab_model::FusedOps;
use lab_model::Llama;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct McItem {
    /// The prompt up to where the answer starts (`Question: …\nAnswer:` for MMLU).
    pub context: String,
    /// Continuations, each with its leading space.
    pub choices: Vec<String>,
    pub answer: usize,
}

/// Reads MMLU- or HellaSwag-shaped JSONL.
pub fn load_items(path: &Path) -> Result<Vec<McItem>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut items = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        items.push(item(&v).with_context(|| format!("{} line {}", path.display(), i + 1))?);
    }
    if items.is_empty() {
        bail!("{} holds no items", path.display());
    }
    Ok(items)
}

fn item(v: &Value) -> Result<McItem> {
    let strings = |k: &str| -> Option<Vec<String>> {
        v[k].as_array()?
            .iter()
            .map(|c| c.as_str().map(|s| format!(" {}", s.trim())))
            .collect()
    };
    let index = |x: &Value| -> Option<usize> {
        match x {
            Value::Number(n) => n.as_u64().map(|n| n as usize),
            Value::String(s) if s.len() == 1 && s.as_bytes()[0].is_ascii_uppercase() => {
                Some((s.as_bytes()[0] - b'A') as usize)
            }
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
    };
    let (context, choices, answer) = if let (Some(q), Some(c)) =
        (v["question"].as_str(), strings("choices"))
    {
        (
            format!("Question: {}\nAnswer:", q.trim()),
            c,
            index(&v["answer"]),
        )
    } else if let (Some(ctx), Some(e)) = (v["ctx"].as_str(), strings("endings")) {
        (ctx.trim().to_string(), e, index(&v["label"]))
    } else {
        bail!("neither the MMLU shape (question, choices, answer) nor the HellaSwag shape (ctx, endings, label)");
    };
    let Some(answer) = answer.filter(|&a| a < choices.len()) else {
        bail!(
            "the answer is not an index (or letter) of one of the {} choices",
            choices.len()
        );
    };
    Ok(McItem {
        context,
        choices,
        answer,
    })
}

#[derive(Debug, Clone)]
pub struct McOptions {
    /// Examples with their answers placed before each question.
    pub shots: usize,
    /// Where shots come from; without one, the first `shots` items are used and not scored.
    pub dev: Option<Vec<McItem>>,
    /// Score at most this many items (evenly spaced over the set).
    pub limit: Option<usize>,
    /// Sequences per forward pass.
    pub batch_rows: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemScore {
    /// Sum of the choice tokens' log-probabilities, per choice.
    pub loglik: Vec<f64>,
    /// `loglik` per byte of the choice.
    pub per_byte: Vec<f64>,
    pub pred: usize,
    pub pred_norm: usize,
    pub answer: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct McReport {
    pub items: usize,
    pub shots: usize,
    pub acc: f64,
    /// 95 % Wilson interval.
    pub acc_ci: (f64, f64),
    pub acc_norm: f64,
    pub acc_norm_ci: (f64, f64),
    /// Expected accuracy of guessing.
    pub chance: f64,
}

/// Wilson score interval at 95 %.
pub fn wilson(successes: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (z, n_f) = (1.96f64, n as f64);
    let p = successes as f64 / n_f;
    let denom = 1.0 + z * z / n_f;
    let centre = (p + z * z / (2.0 * n_f)) / denom;
    let half = z * (p * (1.0 - p) / n_f + z * z / (4.0 * n_f * n_f)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

fn argmax(xs: &[f64]) -> usize {
    xs.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i)
}

/// Scores `items` (after taking shots as `opts` says).
pub fn score<B: FusedOps>(
    model: &Llama<B>,
    tok: &Tokenizer,
    items: &[McItem],
    opts: &McOptions,
) -> Result<(McReport, Vec<ItemScore>)> {
    let (shots, pool): (&[McItem], &[McItem]) = match &opts.dev {
        Some(dev) => (&dev[..opts.shots.min(dev.len())], items),
        None => items.split_at(opts.shots.min(items.len())),
    };
    let prefix: String = shots
        .iter()
        .map(|s| format!("{}{}\n\n", s.context, s.choices[s.answer]))
        .collect();
    let chosen: Vec<&McItem> = match opts.limit.filter(|&l| l < pool.len()) {
        Some(l) => (0..l).map(|i| &pool[i * pool.len() / l]).collect(),
        None => pool.iter().collect(),
    };
    if chosen.is_empty() {
        bail!("no item left to score after {} shot(s)", shots.len());
    }
    // One sequence per (item, choice): context tokens then choice tokens.
    let mut seqs = Vec::new();
    for it in &chosen {
        let ctx = tok.encode(&format!("{prefix}{}", it.context));
        for c in &it.choices {
            seqs.push((ctx.clone(), tok.encode(c)));
        }
    }
    let logliks = loglik_batched(model, &seqs, opts.batch_rows)?;
    let mut scores = Vec::new();
    let mut k = 0;
    for it in &chosen {
        let n = it.choices.len();
        let loglik = logliks[k..k + n].to_vec();
        k += n;
        let per_byte: Vec<f64> = loglik
            .iter()
            .zip(&it.choices)
            .map(|(l, c)| l / c.len().max(1) as f64)
            .collect();
        scores.push(ItemScore {
            pred: argmax(&loglik),
            pred_norm: argmax(&per_byte),
            answer: it.answer,
            loglik,
            per_byte,
        });
    }
    let n = scores.len();
    let right = scores.iter().filter(|s| s.pred == s.answer).count();
    let right_norm = scores.iter().filter(|s| s.pred_norm == s.answer).count();
    let report = McReport {
        items: n,
        shots: shots.len(),
        acc: right as f64 / n as f64,
        acc_ci: wilson(right, n),
        acc_norm: right_norm as f64 / n as f64,
        acc_norm_ci: wilson(right_norm, n),
        chance: chosen
            .iter()
            .map(|i| 1.0 / i.choices.len() as f64)
            .sum::<f64>()
            / n as f64,
    };
    Ok((report, scores))
}

/// Sum of log p(continuation | context) per (context, continuation), `rows` sequences per
/// padded batch; sequences longer than the model's context lose tokens from the left.
pub fn loglik_batched<B: FusedOps>(
    model: &Llama<B>,
    seqs: &[(Vec<u32>, Vec<u32>)],
    rows: usize,
) -> Result<Vec<f64>> {
    let window = model.seq_len() + 1;
    let device = model.embed.val().device();
    let mut out = Vec::with_capacity(seqs.len());
    for chunk in seqs.chunks(rows.max(1)) {
        let full: Vec<(Vec<u32>, usize)> = chunk
            .iter()
            .map(|(ctx, cont)| {
                let mut ids = [ctx.as_slice(), cont.as_slice()].concat();
                ids.drain(..ids.len().saturating_sub(window));
                (ids, cont.len())
            })
            .collect();
        let t = full
            .iter()
            .map(|(ids, _)| ids.len() - 1)
            .max()
            .unwrap_or(1)
            .max(1);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for (ids, _) in &full {
            let pad = |v: &[u32]| {
                v.iter()
                    .map(|&i| i as i32)
                    .chain(std::iter::repeat(0))
                    .take(t)
                    .collect::<Vec<_>>()
            };
            x.extend(pad(&ids[..ids.len() - 1]));
            y.extend(pad(&ids[1..]));
        }
        let shape = [full.len(), t];
        let losses = model.token_losses(
            Tensor::<B, 2, Int>::from_data(TensorData::new(x, shape), &device),
            Tensor::<B, 2, Int>::from_data(TensorData::new(y, shape), &device),
        );
        let losses: Vec<f32> = losses.into_data().convert::<f32>().into_vec().expect("f32");
        for (r, (ids, cont)) in full.iter().enumerate() {
            let end = ids.len() - 1; // targets 0..end are real
            let start = end.saturating_sub(*cont);
            out.push(-(start..end).map(|i| losses[r * t + i] as f64).sum::<f64>());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_load_and_bad_answers_are_refused() {
        let mmlu =
            item(&serde_json::json!({"question": "2+2?", "choices": ["3", "4"], "answer": 1}))
                .unwrap();
        assert_eq!(mmlu.context, "Question: 2+2?\nAnswer:");
        assert_eq!(mmlu.choices, [" 3", " 4"]);
        let letter =
            item(&serde_json::json!({"question": "q", "choices": ["a", "b"], "answer": "B"}))
                .unwrap();
        assert_eq!(letter.answer, 1);
        let hs = item(
            &serde_json::json!({"ctx": "A man", "endings": ["sits.", "flies."], "label": "0"}),
        )
        .unwrap();
        assert_eq!((hs.context.as_str(), hs.answer), ("A man", 0));
        assert!(
            item(&serde_json::json!({"question": "q", "choices": ["a"], "answer": 3})).is_err()
        );
        assert!(item(&serde_json::json!({"text": "x"})).is_err());
    }

    #[test]
    fn wilson_interval_brackets_the_rate() {
        let (lo, hi) = wilson(50, 100);
        assert!(
            (lo - 0.404).abs() < 0.002 && (hi - 0.596).abs() < 0.002,
            "{lo} {hi}"
        );
        assert_eq!(wilson(0, 10).0, 0.0);
        assert!(wilson(10, 10).1 <= 1.0);
    }
}
