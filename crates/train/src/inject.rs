//! Spike injection: batches built on purpose to make the loss jump, reproducibly (a pure
//! function of the run seed and the spike sample index), and the rare-token set they and the
//! forensics use.

use std::path::Path;

use anyhow::Result;
use lab_config::SpikeKind;
use lab_data::{sampler::splitmix64, Batch, Meta, TokenFile};
use serde::{Deserialize, Serialize};

/// Share of the unigram mass that counts as rare: the rarest tokens of train.bin whose counts
/// add up to at most this fraction of it.
pub const RARE_MASS: f64 = 0.01;
/// Cached beside the data, keyed by train.bin's sha256.
pub const RARE_CACHE: &str = "rare-tokens.json";
/// Counting stops after this many tokens (spread over the file) on very large data sets.
const MAX_COUNTED: usize = 1 << 28;

/// The rarest token ids of train.bin (the bottom 1 % of its unigram distribution); empty when
/// the data is too small or too uniform for any token to be that rare.
#[derive(Debug, Clone)]
pub struct RareTokens {
    pub ids: Vec<u32>,
    is_rare: Vec<bool>,
    /// Tokens of train.bin that were counted (all of them, up to 2^28).
    pub tokens_counted: u64,
}

#[derive(Serialize, Deserialize)]
struct RareCache {
    train_sha256: String,
    mass: f64,
    tokens_counted: u64,
    ids: Vec<u32>,
}

impl RareTokens {
    /// Reads the cache in `dir` when it was computed from this train.bin, else counts and
    /// writes it (a read-only data dir just means counting again next time).
    pub fn load_or_compute(dir: &Path, meta: &Meta, train: &TokenFile) -> Result<Self> {
        let train_sha = meta.file("train.bin")?.sha256.clone();
        let path = dir.join(RARE_CACHE);
        let cached = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<RareCache>(&t).ok())
            .filter(|c| c.train_sha256 == train_sha && c.mass == RARE_MASS);
        let cache = match cached {
            Some(c) => c,
            None => {
                let (ids, counted) = rarest(train, meta.vocab_size)?;
                let c = RareCache {
                    train_sha256: train_sha,
                    mass: RARE_MASS,
                    tokens_counted: counted,
                    ids,
                };
                let _ = lab_fsio::write_atomic(&path, serde_json::to_string(&c)?.as_bytes());
                c
            }
        };
        let mut is_rare = vec![false; meta.vocab_size];
        for &id in &cache.ids {
            if let Some(slot) = is_rare.get_mut(id as usize) {
                *slot = true;
            }
        }
        Ok(Self {
            ids: cache.ids,
            is_rare,
            tokens_counted: cache.tokens_counted,
        })
    }

    pub fn contains(&self, id: u32) -> bool {
        self.is_rare.get(id as usize).copied().unwrap_or(false)
    }
}

/// Token ids in increasing order of count (ties by id) while their counts add up to at most
/// [`RARE_MASS`] of the tokens counted; and how many were counted.
fn rarest(train: &TokenFile, vocab: usize) -> Result<(Vec<u32>, u64)> {
    let mut counts = vec![0u64; vocab];
    let n = train.len();
    let chunk = 1 << 20;
    let stride = if n <= MAX_COUNTED {
        chunk
    } else {
        n / (MAX_COUNTED / chunk)
    };
    let mut buf = Vec::with_capacity(chunk);
    let mut counted = 0u64;
    let mut start = 0;
    while start < n {
        buf.clear();
        let len = chunk.min(n - start);
        train.read_into(start, len, &mut buf)?;
        for &t in &buf {
            counts[t as usize] += 1;
        }
        counted += len as u64;
        start += stride;
    }
    let mut seen: Vec<u32> = (0..vocab as u32)
        .filter(|&i| counts[i as usize] > 0)
        .collect();
    seen.sort_by_key(|&i| (counts[i as usize], i));
    let budget = (counted as f64 * RARE_MASS) as u64;
    let mut mass = 0;
    let mut ids = Vec::new();
    for id in seen {
        mass += counts[id as usize];
        if mass > budget {
            break;
        }
        ids.push(id);
    }
    Ok((ids, counted))
}

/// A deterministic stream of 64-bit values keyed by (seed, sample, purpose).
struct Draws(u64);

impl Draws {
    fn new(seed: u64, sample: u64, kind: SpikeKind) -> Self {
        let tag = kind as u64 + 0x5b1c_e000;
        Self(splitmix64(seed ^ splitmix64(sample ^ splitmix64(tag))))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix64(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Builds injected batches of one kind.
pub struct SpikeBatches {
    kind: SpikeKind,
    seed: u64,
    seq_len: usize,
    rare: Vec<u32>,
    /// `long-doc`: (start, length) of the longest documents of train.bin.
    long_docs: Vec<(usize, usize)>,
}

impl SpikeBatches {
    pub fn new(
        kind: SpikeKind,
        seed: u64,
        seq_len: usize,
        rare: &RareTokens,
        train: &TokenFile,
        eot: u32,
    ) -> Self {
        let long_docs = if kind == SpikeKind::LongDoc {
            longest_documents(train, eot, 16)
        } else {
            Vec::new()
        };
        Self {
            kind,
            seed,
            seq_len,
            rare: rare.ids.clone(),
            long_docs,
        }
    }

    /// The batch of spike samples `rows`.
    pub fn batch(&self, rows: &[u64], train: &TokenFile) -> Result<Batch> {
        let t = self.seq_len;
        let mut b = Batch {
            inputs: Vec::with_capacity(rows.len() * t),
            targets: Vec::with_capacity(rows.len() * t),
            rows: rows.len(),
            seq_len: t,
        };
        let mut window = Vec::with_capacity(t + 1);
        for &sample in rows {
            window.clear();
            self.window(sample, train, &mut window)?;
            b.inputs.extend_from_slice(&window[..t]);
            b.targets.extend_from_slice(&window[1..]);
        }
        Ok(b)
    }

    /// `seq_len + 1` tokens of spike sample `sample`.
    fn window(&self, sample: u64, train: &TokenFile, out: &mut Vec<u32>) -> Result<()> {
        let n = self.seq_len + 1;
        let mut d = Draws::new(self.seed, sample, self.kind);
        match self.kind {
            SpikeKind::RareToken => {
                out.extend((0..n).map(|_| self.rare[d.below(self.rare.len())]));
            }
            SpikeKind::LongDoc => {
                let (start, len) = self.long_docs[d.below(self.long_docs.len())];
                let room = len.saturating_sub(n);
                let at = (start + d.below(room + 1)).min(train.len() - n);
                train.read_into(at, n, out)?;
            }
            SpikeKind::Repeated => {
                // A 2-8 token pattern taken from the data, repeated to fill the window.
                let k = 2 + d.below(7);
                let mut pattern = Vec::with_capacity(k);
                train.read_into(d.below(train.len() - k), k, &mut pattern)?;
                out.extend((0..n).map(|i| pattern[i % k]));
            }
        }
        Ok(())
    }
}

/// (start, length) of up to `keep` longest end-of-text–delimited documents (the whole file
/// is one document when it has no end-of-text token).
fn longest_documents(train: &TokenFile, eot: u32, keep: usize) -> Vec<(usize, usize)> {
    let mut docs = Vec::new();
    let (mut start, mut buf) = (0usize, Vec::with_capacity(1 << 20));
    let n = train.len().min(MAX_COUNTED);
    let mut at = 0;
    while at < n {
        buf.clear();
        let len = (1 << 20).min(n - at);
        if train.read_into(at, len, &mut buf).is_err() {
            break;
        }
        for (i, &t) in buf.iter().enumerate() {
            if t == eot {
                docs.push((start, at + i - start));
                start = at + i + 1;
            }
        }
        at += len;
    }
    docs.push((start, n - start));
    docs.sort_by_key(|&(s, len)| (std::cmp::Reverse(len), s));
    docs.truncate(keep);
    docs
}
