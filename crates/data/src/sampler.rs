//! The order in which training windows are drawn: a pure function of (seed, sample index).
//!
//! Each epoch cuts the token stream into `n_windows` windows of `seq_len + 1` tokens, starting
//! at a phase in `[0, seq_len)` chosen per epoch, and visits them in a seeded pseudo-random
//! permutation (a Feistel network with cycle-walking: a bijection computed in O(1) per index,
//! so nothing is stored and any position of the stream can be jumped to on resume). Within an
//! epoch no window repeats; across epochs the phase shifts which token starts each window.

use anyhow::{bail, Result};

use crate::token_file::TokenFile;

/// Inputs and next-token targets for `rows` windows, row-major `[rows, seq_len]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub rows: usize,
    pub seq_len: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct Sampler {
    seed: u64,
    seq_len: usize,
    n_windows: u64,
}

impl Sampler {
    pub fn new(n_tokens: usize, seq_len: usize, seed: u64) -> Result<Self> {
        if n_tokens < 2 * seq_len + 1 {
            bail!(
                "only {n_tokens} tokens: need at least 2 × seq_len + 1 = {} to draw windows",
                2 * seq_len + 1
            );
        }
        Ok(Self {
            seed,
            seq_len,
            n_windows: ((n_tokens - seq_len) / seq_len) as u64,
        })
    }

    pub fn windows_per_epoch(&self) -> u64 {
        self.n_windows
    }

    /// Start offset (in tokens) of the `sample`-th window of the stream.
    pub fn offset(&self, sample: u64) -> usize {
        let epoch = sample / self.n_windows;
        let key = splitmix64(self.seed ^ splitmix64(epoch.wrapping_add(0x5eed)));
        let phase = (splitmix64(key) % self.seq_len as u64) as usize;
        let window = permute(sample % self.n_windows, self.n_windows, key);
        phase + window as usize * self.seq_len
    }

    /// Reads windows `first_sample .. first_sample + rows` into a batch.
    pub fn batch(&self, file: &TokenFile, first_sample: u64, rows: usize) -> Result<Batch> {
        let offsets: Vec<usize> = (0..rows as u64)
            .map(|r| self.offset(first_sample + r))
            .collect();
        read_windows(file, &offsets, self.seq_len)
    }
}

/// Evenly spaced, seed-independent windows of a validation file: the same every evaluation,
/// so eval losses are comparable across steps and runs.
pub fn eval_batch(
    file: &TokenFile,
    seq_len: usize,
    batch: usize,
    rows: usize,
    n_batches: usize,
) -> Result<Batch> {
    if file.len() < seq_len + 1 {
        bail!(
            "{} has {} tokens, fewer than seq_len + 1 = {}",
            file.path().display(),
            file.len(),
            seq_len + 1
        );
    }
    let offsets = eval_offsets(file.len(), seq_len, batch, rows, n_batches);
    read_windows(file, &offsets, seq_len)
}

/// Start offsets of the windows of eval batch `batch` (see [`eval_batch`]).
pub fn eval_offsets(
    n_tokens: usize,
    seq_len: usize,
    batch: usize,
    rows: usize,
    n_batches: usize,
) -> Vec<usize> {
    let total = rows * n_batches;
    let span = n_tokens.saturating_sub(seq_len + 1);
    (batch * rows..(batch + 1) * rows)
        .map(|i| {
            if total <= 1 {
                0
            } else {
                span * i / (total - 1)
            }
        })
        .collect()
}

/// Reads the windows of `seq_len + 1` tokens starting at `offsets` into a batch.
pub fn read_windows(file: &TokenFile, offsets: &[usize], seq_len: usize) -> Result<Batch> {
    let mut inputs = Vec::with_capacity(offsets.len() * seq_len);
    let mut targets = Vec::with_capacity(offsets.len() * seq_len);
    let mut window = Vec::with_capacity(seq_len + 1);
    for &o in offsets {
        window.clear();
        file.read_into(o, seq_len + 1, &mut window)?;
        inputs.extend_from_slice(&window[..seq_len]);
        targets.extend_from_slice(&window[1..]);
    }
    Ok(Batch {
        inputs,
        targets,
        rows: offsets.len(),
        seq_len,
    })
}

/// SplitMix64's finalizer: a fast, well-mixed 64-bit hash.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A keyed bijection on `[0, n)`: a 4-round balanced Feistel network on the smallest even
/// number of bits covering `n`, cycle-walking until the value lands below `n`.
pub fn permute(index: u64, n: u64, key: u64) -> u64 {
    debug_assert!(index < n);
    let bits = (64 - (n.max(2) - 1).leading_zeros()).max(2);
    let half = bits.div_ceil(2);
    let mask = (1u64 << half) - 1;
    let mut x = index;
    loop {
        let (mut left, mut right) = (x >> half, x & mask);
        for round in 0..4u64 {
            let f = splitmix64(key ^ (round << 56) ^ right) & mask;
            (left, right) = (right, left ^ f);
        }
        x = (left << half) | right;
        if x < n {
            return x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn permutation_is_a_bijection(n in 1u64..3000, key: u64) {
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let p = permute(i, n, key);
                prop_assert!(p < n);
                prop_assert!(!seen[p as usize]);
                seen[p as usize] = true;
            }
        }

        #[test]
        fn each_epoch_visits_every_window_once_and_stays_in_bounds(
            n_tokens in 50usize..5000, seq_len in 1usize..24, seed: u64, epoch in 0u64..4
        ) {
            prop_assume!(n_tokens > 2 * seq_len);
            let s = Sampler::new(n_tokens, seq_len, seed).unwrap();
            let n = s.windows_per_epoch();
            let mut starts: Vec<usize> = (epoch * n..(epoch + 1) * n).map(|i| s.offset(i)).collect();
            for &o in &starts {
                prop_assert!(o + seq_len < n_tokens, "window {o}+{seq_len}+1 past {n_tokens}");
            }
            starts.sort();
            starts.dedup();
            prop_assert_eq!(starts.len() as u64, n);
            // Same phase within an epoch: windows tile without overlap.
            let phase = starts[0] % seq_len;
            prop_assert!(starts.iter().all(|o| o % seq_len == phase));
        }

        #[test]
        fn order_is_a_pure_function_of_seed_and_index(seed: u64, i in 0u64..100_000) {
            let a = Sampler::new(10_000, 16, seed).unwrap();
            let b = Sampler::new(10_000, 16, seed).unwrap();
            prop_assert_eq!(a.offset(i), b.offset(i));
        }
    }

    #[test]
    fn different_seeds_give_different_orders() {
        let a = Sampler::new(100_000, 64, 1).unwrap();
        let b = Sampler::new(100_000, 64, 2).unwrap();
        let same = (0..100).filter(|&i| a.offset(i) == b.offset(i)).count();
        assert!(same < 5, "{same} of 100 offsets agree");
    }
}
