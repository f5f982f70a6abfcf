//! Where each step's tokens come from: the training data, drawn in the sampler's seeded order
//! from a cursor that skips the ranges a rollback ruled out, or an injected spike batch, which
//! never moves that cursor.
//!
//! Every sample has an index in its source: training window `i` is `Sampler::offset(i)`, spike
//! sample `i` is a pure function of (seed, i). A step draws `grad_accum × micro_batch` indices
//! from one source; the ranges it drew are its provenance, which a rollback records as skipped.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lab_config::{LabConfig, SpikeKind};
use lab_data::{Batch, Meta, MixtureSampler, MixtureStage, Sampler, TokenFile};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::forensics::{batch_stats, BatchStats};
use crate::inject::{RareTokens, SpikeBatches};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// train.bin, in the sampler's order.
    Train,
    /// Injected spike samples.
    Spike,
}

/// Samples `start..end` of one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleRange {
    pub source: Source,
    pub start: u64,
    pub end: u64,
}

/// A range ruled out by a rollback, with when and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    #[serde(flatten)]
    pub range: SampleRange,
    /// The step whose data this was.
    pub step: u64,
    pub reason: String,
}

/// The data cursor, as state.json stores it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DataCursor {
    /// Training windows consumed or skipped: the next window drawn is the first index at or
    /// after this one that no skipped range covers.
    pub samples_consumed: u64,
    /// Spike samples consumed or skipped.
    #[serde(default)]
    pub spike_samples_consumed: u64,
    #[serde(default)]
    pub skipped: Vec<Skipped>,
}

impl DataCursor {
    /// The next index of `source` at or after `from` that no skipped range covers.
    fn first_unskipped(&self, source: Source, mut from: u64) -> u64 {
        while let Some(r) = self
            .skipped
            .iter()
            .find(|s| s.range.source == source && s.range.start <= from && from < s.range.end)
        {
            from = r.range.end;
        }
        from
    }

    /// Draws `n` indices of `source`, skipping ruled-out ranges; returns them as ranges.
    fn draw(&mut self, source: Source, n: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut next = self.position(source);
        for _ in 0..n {
            let at = self.first_unskipped(source, next);
            next = at + 1;
            match out.last_mut() {
                Some(last) if last.1 == at => last.1 = next,
                _ => out.push((at, next)),
            }
        }
        match source {
            Source::Train => self.samples_consumed = next,
            Source::Spike => self.spike_samples_consumed = next,
        }
        out
    }

    fn position(&self, source: Source) -> u64 {
        match source {
            Source::Train => self.samples_consumed,
            Source::Spike => self.spike_samples_consumed,
        }
    }

    /// Rules out `ranges` (the data of `step`) for the rest of the run.
    pub fn skip(&mut self, ranges: &[SampleRange], step: u64, reason: &str) {
        for r in ranges {
            let s = Skipped {
                range: *r,
                step,
                reason: reason.to_string(),
            };
            if !self.skipped.contains(&s) {
                self.skipped.push(s);
            }
        }
    }
}

/// One step's data: its micro-batches and where they came from.
#[derive(Debug, Clone)]
pub struct StepData {
    pub micro: Vec<Batch>,
    pub ranges: Vec<SampleRange>,
    pub injected: bool,
    /// Training-file token offsets of the rows (empty for injected batches).
    pub offsets: Vec<usize>,
    pub stats: BatchStats,
}

/// The order training windows are drawn in: uniform over the file, or a `[data]` mixture.
enum Order {
    Uniform(Sampler),
    Mixture(MixtureSampler),
}

impl Order {
    fn new(meta: &Meta, train: &TokenFile, cfg: &LabConfig) -> Result<Self> {
        let (seq_len, seed) = (cfg.model.seq_len, cfg.train.seed);
        Ok(match &cfg.data {
            None => Self::Uniform(
                Sampler::new(train.len(), seq_len, seed)
                    .with_context(|| train.path().display().to_string())?,
            ),
            Some(data) => {
                let stages: Vec<MixtureStage> = data
                    .stages()
                    .into_iter()
                    .map(|(until_tokens, weights)| MixtureStage {
                        until_tokens,
                        weights,
                    })
                    .collect();
                Self::Mixture(
                    MixtureSampler::new(meta, "train.bin", seq_len, seed, &stages)
                        .with_context(|| format!("[data] over {}", train.path().display()))?,
                )
            }
        })
    }

    /// The windows of training samples `rows`, and where each starts in the file.
    fn read(&self, file: &TokenFile, rows: &[u64], seq_len: usize) -> Result<(Batch, Vec<usize>)> {
        match self {
            Self::Uniform(s) => {
                let o: Vec<usize> = rows.iter().map(|&i| s.offset(i)).collect();
                Ok((lab_data::sampler::read_windows(file, &o, seq_len)?, o))
            }
            Self::Mixture(m) => m.batch(file, rows),
        }
    }
}

/// What a mixture will draw over the run (printed and recorded at its start).
pub struct MixtureReport {
    pub table: String,
    pub warnings: Vec<String>,
    pub json: serde_json::Value,
}

/// Whether [`TrainData::open`] reads the files whole to check them against meta.json's sha256
/// (their sizes are checked always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Sha256,
    SizeOnly,
}

/// Checks train.bin and val.bin against meta.json's sha256 (see `lab_data::verify`), saying so
/// when a file is large enough for the reading to take a while.
fn verify(dir: &Path, meta: &Meta) -> Result<()> {
    lab_data::verify::verify_files(dir, meta, &mut |name, bytes| {
        if bytes >= 1 << 30 {
            eprintln!(
                "lab train: checking {name} ({:.1} GB) against meta.json's sha256 (once per version of the file)",
                bytes as f64 / 1e9
            );
        }
    })
}

/// The run's data: validated files, the sample order, the rare-token set and the spike plan.
pub struct TrainData {
    pub dir: PathBuf,
    pub meta: Meta,
    /// sha256 of meta.json: the data's identity (it lists the sha256 of every file).
    pub meta_sha256: String,
    pub train: TokenFile,
    pub val: TokenFile,
    pub rare: RareTokens,
    order: Order,
    spike: Option<(lab_config::SpikeConfig, SpikeBatches)>,
    micro_batch: usize,
    grad_accum: usize,
    seq_len: usize,
}

impl TrainData {
    /// Opens and checks a data dir for `cfg` before any compute is spent on it.
    pub fn open(dir: &Path, cfg: &LabConfig, check: Check) -> Result<Self> {
        let meta = Meta::load(dir)?;
        if meta.vocab_size > cfg.model.vocab_size {
            bail!(
                "{}: data vocab_size {} exceeds model.vocab_size {}; use a config for this tokenizer",
                dir.join("meta.json").display(),
                meta.vocab_size,
                cfg.model.vocab_size
            );
        }
        let meta_sha256 = lab_fsio::sha256_file(&dir.join("meta.json"))?;
        let train = TokenFile::open(dir, "train.bin", &meta)?;
        let val = TokenFile::open(dir, "val.bin", &meta)?;
        if check == Check::Sha256 {
            verify(dir, &meta)?;
        }
        let seq_len = cfg.model.seq_len;
        let order = Order::new(&meta, &train, cfg)?;
        if val.len() < seq_len + 1 {
            bail!(
                "{} has {} tokens, fewer than model.seq_len + 1 = {}: prepare a larger validation split",
                val.path().display(),
                val.len(),
                seq_len + 1
            );
        }
        let rare = RareTokens::load_or_compute(dir, &meta, &train)?;
        if rare.ids.is_empty()
            && cfg
                .spike
                .as_ref()
                .is_some_and(|s| s.kind == SpikeKind::RareToken)
        {
            bail!(
                "{} is too small or too uniform to have rare tokens (no token holds under 1 % of it): use --spike-kind long-doc or repeated",
                train.path().display()
            );
        }
        let spike = match &cfg.spike {
            Some(s) => Some((
                s.clone(),
                SpikeBatches::new(
                    s.kind,
                    cfg.train.seed,
                    seq_len,
                    &rare,
                    &train,
                    meta.eot_token,
                ),
            )),
            None => None,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            meta_sha256,
            train,
            val,
            rare,
            order,
            spike,
            micro_batch: cfg.train.micro_batch,
            grad_accum: cfg.global_micro_batches(),
            seq_len,
        })
    }

    /// With a `[data]` mixture: each source's tokens, draws and epochs over `total_steps`,
    /// and a warning for each source repeated more than `max_epochs` times.
    pub fn mixture_report(&self, cfg: &LabConfig, total_steps: u64) -> Option<MixtureReport> {
        let (Order::Mixture(m), Some(data)) = (&self.order, &cfg.data) else {
            return None;
        };
        let rows = m.epochs(total_steps * self.rows_per_step());
        let mut table = format!(
            "data mixture over {total_steps} steps:\n  {:<20} {:>12} {:>10} {:>8}\n",
            "source", "tokens", "windows", "epochs"
        );
        let mut warnings = Vec::new();
        for (name, tokens, draws, epochs) in &rows {
            table += &format!("  {name:<20} {tokens:>12} {draws:>10} {epochs:>8.2}\n");
            if *epochs > data.max_epochs {
                warnings.push(format!(
                    "data source '{name}' is repeated {epochs:.1} times (more than data.max_epochs = {}): give it less weight or add data",
                    data.max_epochs
                ));
            }
        }
        let json = json!(rows
            .iter()
            .map(|(n, t, d, e)| json!({"source": n, "tokens": t, "windows": d, "epochs": e}))
            .collect::<Vec<_>>());
        Some(MixtureReport {
            table,
            warnings,
            json,
        })
    }

    fn rows_per_step(&self) -> u64 {
        (self.micro_batch * self.grad_accum) as u64
    }

    /// Whether the step of 0-based index `step` trains on an injected batch: from step
    /// `at_step` (counted from 1) on, while spike samples that no rollback ruled out remain.
    fn injects(&self, step: u64, cursor: &DataCursor) -> bool {
        let Some((s, _)) = &self.spike else {
            return false;
        };
        let total = s.batches * self.rows_per_step();
        step + 1 >= s.at_step
            && cursor.first_unskipped(Source::Spike, cursor.spike_samples_consumed) < total
    }

    /// Draws step `step`'s micro-batches, advancing `cursor`.
    pub fn next_step(&self, step: u64, cursor: &mut DataCursor) -> Result<StepData> {
        let injected = self.injects(step, cursor);
        let source = if injected {
            Source::Spike
        } else {
            Source::Train
        };
        let drawn = cursor.draw(source, self.rows_per_step());
        let indices: Vec<u64> = drawn.iter().flat_map(|&(a, b)| a..b).collect();
        let mut micro = Vec::with_capacity(self.grad_accum);
        let mut offsets = Vec::new();
        for rows in indices.chunks(self.micro_batch) {
            let batch = match (&self.spike, injected) {
                (Some((_, spikes)), true) => spikes.batch(rows, &self.train)?,
                _ => {
                    let (batch, o) = self.order.read(&self.train, rows, self.seq_len)?;
                    offsets.extend_from_slice(&o);
                    batch
                }
            };
            micro.push(batch);
        }
        let stats = batch_stats(&micro, self.meta.eot_token, &self.rare);
        Ok(StepData {
            micro,
            ranges: drawn
                .into_iter()
                .map(|(start, end)| SampleRange { source, start, end })
                .collect(),
            injected,
            offsets,
            stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(source: Source, start: u64, end: u64) -> SampleRange {
        SampleRange { source, start, end }
    }

    #[test]
    fn draws_jump_over_skipped_ranges_and_merge_contiguous_indices() {
        let mut c = DataCursor::default();
        c.skip(&[range(Source::Train, 2, 5)], 0, "test");
        assert_eq!(c.draw(Source::Train, 4), vec![(0, 2), (5, 7)]);
        assert_eq!(c.samples_consumed, 7);
        // The spike stream is untouched by training draws and skips.
        assert_eq!(c.draw(Source::Spike, 3), vec![(0, 3)]);
        c.skip(&[range(Source::Train, 2, 5)], 0, "test");
        assert_eq!(c.skipped.len(), 1, "the same skip twice is recorded once");
    }

    proptest! {
        /// Drawing with skips yields exactly the indices not skipped, in order.
        #[test]
        fn draw_equals_filtering_the_plain_order(
            skips in proptest::collection::vec((0u64..200, 1u64..20), 0..6), n in 0u64..150
        ) {
            let mut c = DataCursor::default();
            for &(a, len) in &skips {
                c.skip(&[range(Source::Train, a, a + len)], 0, "p");
            }
            let got: Vec<u64> = c.draw(Source::Train, n).into_iter().flat_map(|(a, b)| a..b).collect();
            let want: Vec<u64> = (0..)
                .filter(|i| !skips.iter().any(|&(a, len)| a <= *i && *i < a + len))
                .take(n as usize)
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
