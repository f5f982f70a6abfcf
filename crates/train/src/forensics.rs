//! What a batch looked like: the statistics a spike post-mortem compares with the run's
//! running averages (document length, rare tokens, end-of-text tokens).

use lab_data::Batch;
use serde::{Deserialize, Serialize};

use crate::inject::RareTokens;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchStats {
    pub tokens: u64,
    /// Mean length of the end-of-text–delimited segments inside the batch's windows (a window
    /// with no end-of-text is one segment of the whole window).
    pub mean_doc_len: f64,
    /// Share of input tokens in the bottom 1 % of train.bin's unigram distribution.
    pub rare_share: f64,
    /// Share of input tokens that are end-of-text.
    pub eot_share: f64,
}

pub fn batch_stats(micro: &[Batch], eot: u32, rare: &RareTokens) -> BatchStats {
    let (mut tokens, mut rare_n, mut eot_n) = (0u64, 0u64, 0u64);
    let (mut segments, mut segment_tokens) = (0u64, 0u64);
    for b in micro {
        for row in b.inputs.chunks(b.seq_len.max(1)) {
            let mut len = 0u64;
            for &t in row {
                tokens += 1;
                rare_n += rare.contains(t) as u64;
                if t == eot {
                    eot_n += 1;
                    if len > 0 {
                        segments += 1;
                        segment_tokens += len;
                    }
                    len = 0;
                } else {
                    len += 1;
                }
            }
            if len > 0 {
                segments += 1;
                segment_tokens += len;
            }
        }
    }
    let share = |n: u64| {
        if tokens == 0 {
            0.0
        } else {
            n as f64 / tokens as f64
        }
    };
    BatchStats {
        tokens,
        mean_doc_len: if segments == 0 {
            0.0
        } else {
            segment_tokens as f64 / segments as f64
        },
        rare_share: share(rare_n),
        eot_share: share(eot_n),
    }
}

/// Exponential moving averages of the batch statistics of ordinary steps (α = 2 / (window+1)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RunningStats {
    pub steps: u64,
    pub mean_doc_len: f64,
    pub rare_share: f64,
    pub eot_share: f64,
}

impl RunningStats {
    pub fn update(&mut self, s: &BatchStats, window: usize) {
        let a = if self.steps == 0 {
            1.0
        } else {
            2.0 / (window as f64 + 1.0)
        };
        self.mean_doc_len += a * (s.mean_doc_len - self.mean_doc_len);
        self.rare_share += a * (s.rare_share - self.rare_share);
        self.eot_share += a * (s.eot_share - self.eot_share);
        self.steps += 1;
    }
}
