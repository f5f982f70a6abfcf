//! `lab data shards`: how train.bin is split across N nodes × G GPUs for a global batch.
//!
//! Every rank gets the same number of whole sequences, a multiple of what it consumes per
//! optimizer step (so no rank runs out early or waits: no stragglers), split into the same
//! number of shards; all shard sizes differ by at most one sequence. Rank r reads one
//! contiguous region of train.bin; the tail that does not fill a whole step is dropped and
//! reported.

use anyhow::{bail, Result};
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct ShardRequest {
    pub train_tokens: u64,
    pub nodes: u64,
    pub gpus_per_node: u64,
    pub global_batch_tokens: u64,
    pub seq_len: u64,
    /// Shards per rank; None picks enough that no shard exceeds `target_shard_tokens`.
    pub shards_per_rank: Option<u64>,
    pub target_shard_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shard {
    pub index: u64,
    pub rank: u64,
    pub node: u64,
    pub local_rank: u64,
    /// First token in train.bin; the shard covers `tokens` tokens from here (plus the next
    /// token as the last target).
    pub start_token: u64,
    pub tokens: u64,
    pub sequences: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShardPlan {
    pub nodes: u64,
    pub gpus_per_node: u64,
    pub ranks: u64,
    pub seq_len: u64,
    pub global_batch_tokens: u64,
    pub sequences_per_rank_per_step: u64,
    pub steps: u64,
    pub sequences_per_rank: u64,
    pub tokens_per_rank: u64,
    pub shards_per_rank: u64,
    pub train_tokens: u64,
    pub used_tokens: u64,
    pub dropped_tokens: u64,
    pub shards: Vec<Shard>,
}

pub fn plan(req: &ShardRequest) -> Result<ShardPlan> {
    for (flag, v) in [
        ("--nodes", req.nodes),
        ("--gpus-per-node", req.gpus_per_node),
        ("--global-batch-tokens", req.global_batch_tokens),
        ("--seq-len", req.seq_len),
    ] {
        if v == 0 {
            // A count of 0 is the command line's mistake: a usage error (exit 2).
            lab_config::bail_usage!("{flag} must be at least 1");
        }
    }
    let too_big = || anyhow::anyhow!("--nodes × --gpus-per-node × --seq-len overflows");
    let ranks = req
        .nodes
        .checked_mul(req.gpus_per_node)
        .ok_or_else(too_big)?;
    let per_step = ranks.checked_mul(req.seq_len).ok_or_else(too_big)?;
    if !req.global_batch_tokens.is_multiple_of(per_step) {
        let lower = (req.global_batch_tokens / per_step).max(1) * per_step;
        bail!(
            "--global-batch-tokens {} is not a multiple of ranks × seq_len = {ranks} × {} = {per_step}; use {lower} or {}",
            req.global_batch_tokens,
            req.seq_len,
            lower + per_step
        );
    }
    let m = req.global_batch_tokens / per_step;
    // The last sequence needs one token past its end as its final target.
    let sequences = req.train_tokens.saturating_sub(1) / req.seq_len;
    let steps = sequences / (ranks * m);
    if steps == 0 {
        bail!(
            "train.bin has {} tokens, fewer than one global batch of {}; lower --global-batch-tokens or prepare more data",
            req.train_tokens,
            req.global_batch_tokens
        );
    }
    let per_rank = steps * m;
    let k = match req.shards_per_rank {
        Some(0) => lab_config::bail_usage!("--shards-per-rank must be at least 1"),
        Some(k) => k.min(per_rank),
        None => (per_rank * req.seq_len)
            .div_ceil(req.target_shard_tokens.max(req.seq_len))
            .clamp(1, per_rank),
    };
    let (base, extra) = (per_rank / k, per_rank % k);
    let mut shards = Vec::with_capacity((ranks * k) as usize);
    for rank in 0..ranks {
        let mut start = rank * per_rank * req.seq_len;
        for j in 0..k {
            let seqs = base + u64::from(j < extra);
            shards.push(Shard {
                index: rank * k + j,
                rank,
                node: rank / req.gpus_per_node,
                local_rank: rank % req.gpus_per_node,
                start_token: start,
                tokens: seqs * req.seq_len,
                sequences: seqs,
            });
            start += seqs * req.seq_len;
        }
    }
    let used = ranks * per_rank * req.seq_len;
    Ok(ShardPlan {
        nodes: req.nodes,
        gpus_per_node: req.gpus_per_node,
        ranks,
        seq_len: req.seq_len,
        global_batch_tokens: req.global_batch_tokens,
        sequences_per_rank_per_step: m,
        steps,
        sequences_per_rank: per_rank,
        tokens_per_rank: per_rank * req.seq_len,
        shards_per_rank: k,
        train_tokens: req.train_tokens,
        used_tokens: used,
        dropped_tokens: req.train_tokens - used,
        shards,
    })
}

impl ShardPlan {
    /// A summary and the shard table (first and last rows when there are many).
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} nodes × {} GPUs = {} ranks; global batch {} tokens = {} seq/rank/step × {} tokens\n\
             {} steps; per rank {} sequences = {} tokens in {} shards; used {} of {} tokens ({} dropped)\n\n",
            self.nodes, self.gpus_per_node, self.ranks, self.global_batch_tokens,
            self.sequences_per_rank_per_step, self.seq_len, self.steps, self.sequences_per_rank,
            self.tokens_per_rank, self.shards_per_rank, self.used_tokens, self.train_tokens,
            self.dropped_tokens,
        );
        out.push_str(&format!(
            "{:>7} {:>6} {:>5} {:>5} {:>14} {:>12} {:>10}\n",
            "shard", "rank", "node", "gpu", "start_token", "tokens", "sequences"
        ));
        let row = |s: &Shard| {
            format!(
                "{:>7} {:>6} {:>5} {:>5} {:>14} {:>12} {:>10}\n",
                s.index, s.rank, s.node, s.local_rank, s.start_token, s.tokens, s.sequences
            )
        };
        let n = self.shards.len();
        if n <= 24 {
            self.shards.iter().for_each(|s| out.push_str(&row(s)));
        } else {
            self.shards[..12].iter().for_each(|s| out.push_str(&row(s)));
            out.push_str(&format!("{:>7}\n", format!("… {} more", n - 24)));
            self.shards[n - 12..]
                .iter()
                .for_each(|s| out.push_str(&row(s)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(
        train_tokens: u64,
        nodes: u64,
        gpus: u64,
        m: u64,
        seq_len: u64,
        k: Option<u64>,
    ) -> ShardRequest {
        ShardRequest {
            train_tokens,
            nodes,
            gpus_per_node: gpus,
            global_batch_tokens: nodes * gpus * m * seq_len,
            seq_len,
            shards_per_rank: k,
            target_shard_tokens: 1 << 20,
        }
    }

    proptest! {
        #[test]
        fn every_rank_gets_whole_equal_work_and_shards_differ_by_at_most_one_sequence(
            train_tokens in 1u64..50_000_000, nodes in 1u64..17, gpus in 1u64..9,
            m in 1u64..5, seq_len in 1u64..2049, k in proptest::option::of(1u64..40),
        ) {
            let r = req(train_tokens, nodes, gpus, m, seq_len, k);
            let Ok(p) = plan(&r) else {
                // Only refused when the data cannot fill one global batch.
                prop_assert!(train_tokens.saturating_sub(1) / seq_len < nodes * gpus * m);
                return Ok(());
            };
            prop_assert_eq!(p.shards.len() as u64, p.ranks * p.shards_per_rank);
            let max = p.shards.iter().map(|s| s.tokens).max().unwrap();
            let min = p.shards.iter().map(|s| s.tokens).min().unwrap();
            prop_assert!(max - min <= seq_len, "shards {min}..{max} tokens");
            for rank in 0..p.ranks {
                let mine: Vec<&Shard> = p.shards.iter().filter(|s| s.rank == rank).collect();
                let total: u64 = mine.iter().map(|s| s.tokens).sum();
                prop_assert_eq!(total, p.tokens_per_rank);
                prop_assert_eq!(mine.len() as u64, p.shards_per_rank);
            }
            prop_assert_eq!(p.tokens_per_rank % (m * seq_len), 0);
            // Contiguous, disjoint, in bounds (with the extra target token).
            let mut next = 0;
            for s in &p.shards {
                prop_assert_eq!(s.start_token, next);
                next += s.tokens;
            }
            prop_assert!(next < train_tokens);
            prop_assert_eq!(p.used_tokens + p.dropped_tokens, train_tokens);
            // Less than one global step of whole sequences is dropped.
            prop_assert!(p.dropped_tokens <= r.global_batch_tokens + seq_len);
        }
    }

    #[test]
    fn batch_not_divisible_by_ranks_is_refused_with_a_fix() {
        let mut r = req(10_000_000, 2, 8, 1, 1024, None);
        r.global_batch_tokens = 100_000;
        let e = plan(&r).unwrap_err().to_string();
        assert!(e.contains("use 98304 or 114688"), "{e}");
    }
}
