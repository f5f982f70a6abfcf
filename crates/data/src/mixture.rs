//! Drawing training windows from several sources to set weights (a data mixture), optionally
//! changing the weights with the tokens seen (a curriculum), as a pure function of
//! (seed, sample index) so a run resumes bit-identically.
//!
//! Samples come in blocks of [`BLOCK`]. In each block a source owns a fixed number of slots
//! (its weight × `BLOCK`, rounded by largest remainder so the counts sum to `BLOCK`), and a
//! seeded permutation of the block decides which sample takes which slot. Over whole blocks
//! each share is exact to 1/`BLOCK`. A source's slots are numbered across blocks, so sample
//! `i` is the `k`-th draw of its source, and draw `k` is window `k` of that source's own
//! [`Sampler`] over its spans of the token file (its documents, in file order). A curriculum
//! stage ends at the first block boundary at or after its token count.

use anyhow::{bail, Result};

use crate::meta::Meta;
use crate::sampler::{permute, splitmix64, Batch, Sampler};
use crate::token_file::TokenFile;

/// Samples per block: the resolution of the shares (1e-4).
pub const BLOCK: u64 = 10_000;

/// One stage of a curriculum: these weights until `until_tokens` training tokens (the last
/// stage: to the end).
#[derive(Debug, Clone, PartialEq)]
pub struct MixtureStage {
    pub until_tokens: Option<u64>,
    pub weights: Vec<(String, f64)>,
}

/// One source: its spans of the file seen as one stream, and the windows drawn from it.
#[derive(Debug)]
struct SourceStream {
    name: String,
    /// (file start, virtual start) of each span, and the virtual end.
    spans: Vec<(u64, u64)>,
    tokens: u64,
    sampler: Option<Sampler>,
}

impl SourceStream {
    /// The file ranges holding virtual tokens `start .. start + len`.
    fn file_ranges(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let (mut at, end) = (start, start + len);
        let mut i = self.spans.partition_point(|&(_, v)| v <= at) - 1;
        while at < end {
            let (file, virt) = self.spans[i];
            let span_end = self.spans.get(i + 1).map_or(self.tokens, |&(_, v)| v);
            let take = (end.min(span_end)) - at;
            out.push((file + (at - virt), take));
            at += take;
            i += 1;
        }
        out
    }
}

/// A stage as blocks and slot counts.
#[derive(Debug, Clone)]
struct BlockStage {
    first_block: u64,
    /// Slots per block of each source (sums to BLOCK).
    counts: Vec<u64>,
}

#[derive(Debug)]
pub struct MixtureSampler {
    seed: u64,
    seq_len: usize,
    sources: Vec<SourceStream>,
    stages: Vec<BlockStage>,
}

impl MixtureSampler {
    /// Reads the sources' spans of `file` from `meta` and checks every weighted source has
    /// enough tokens.
    pub fn new(
        meta: &Meta,
        file: &str,
        seq_len: usize,
        seed: u64,
        stages: &[MixtureStage],
    ) -> Result<Self> {
        let sources = source_streams(meta, file, seq_len, seed)?;
        let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        let mut block_stages = Vec::new();
        let mut first_block = 0;
        for (i, stage) in stages.iter().enumerate() {
            let counts = slot_counts(&stage.weights, &names)?;
            for (s, &c) in sources.iter().zip(&counts) {
                if c > 0 && s.sampler.is_none() {
                    bail!(
                        "data source '{}' has {} tokens in {file}, fewer than 2 × seq_len + 1: give it weight 0 or prepare more of it",
                        s.name,
                        s.tokens
                    );
                }
            }
            block_stages.push(BlockStage {
                first_block,
                counts,
            });
            if let Some(t) = stage.until_tokens {
                // Stages switch at block boundaries: the first block at or after the count.
                let end = (t / seq_len as u64).div_ceil(BLOCK);
                if end <= first_block {
                    bail!(
                        "curriculum stage {} ends at {t} tokens, within the block of {BLOCK} samples ({} tokens) where it starts; stages switch on whole blocks: give it more tokens",
                        i + 1,
                        BLOCK * seq_len as u64
                    );
                }
                first_block = end;
            } else if i + 1 < stages.len() {
                bail!(
                    "curriculum stage {} has no until_tokens but is not the last",
                    i + 1
                );
            }
        }
        Ok(Self {
            seed,
            seq_len,
            sources,
            stages: block_stages,
        })
    }

    fn stage_of(&self, block: u64) -> usize {
        self.stages.partition_point(|s| s.first_block <= block) - 1
    }

    /// Draws of each source over the blocks before `block`.
    fn draws_before_block(&self, block: u64) -> Vec<u64> {
        (0..self.sources.len())
            .map(|s| self.source_draws_before_block(s, block))
            .collect()
    }

    /// Draws of source `s` over the blocks before `block`.
    fn source_draws_before_block(&self, s: usize, block: u64) -> u64 {
        let ends = self
            .stages
            .iter()
            .skip(1)
            .map(|n| n.first_block)
            .chain([u64::MAX]);
        self.stages
            .iter()
            .zip(ends)
            .map(|(st, end)| block.min(end).saturating_sub(st.first_block) * st.counts[s])
            .sum()
    }

    /// Sample `i` is draw `k` of source `s`: (s, k).
    pub fn pick(&self, i: u64) -> (usize, u64) {
        let block = i / BLOCK;
        let counts = &self.stages[self.stage_of(block)].counts;
        let key = splitmix64(self.seed ^ splitmix64(block.wrapping_add(0x6d69_7874)));
        let mut slot = permute(i % BLOCK, BLOCK, key);
        for (s, &c) in counts.iter().enumerate() {
            if slot < c {
                return (s, self.source_draws_before_block(s, block) + slot);
            }
            slot -= c;
        }
        unreachable!("slot counts sum to BLOCK")
    }

    /// Draws of each source over the first `samples` samples.
    pub fn draws(&self, samples: u64) -> Vec<u64> {
        let block = samples / BLOCK;
        let mut out = self.draws_before_block(block);
        for i in block * BLOCK..samples {
            out[self.pick(i).0] += 1;
        }
        out
    }

    /// Per source: (name, tokens, draws, epochs) over the first `samples` samples.
    pub fn epochs(&self, samples: u64) -> Vec<(String, u64, u64, f64)> {
        self.sources
            .iter()
            .zip(self.draws(samples))
            .map(|(s, d)| {
                let per_epoch = s.sampler.map_or(0, |x| x.windows_per_epoch());
                let epochs = if per_epoch == 0 {
                    0.0
                } else {
                    d as f64 / per_epoch as f64
                };
                (s.name.clone(), s.tokens, d, epochs)
            })
            .collect()
    }

    /// The windows of samples `indices` and where each starts in the file.
    pub fn batch(&self, file: &TokenFile, indices: &[u64]) -> Result<(Batch, Vec<usize>)> {
        let seq_len = self.seq_len;
        let mut inputs = Vec::with_capacity(indices.len() * seq_len);
        let mut targets = Vec::with_capacity(indices.len() * seq_len);
        let mut starts = Vec::with_capacity(indices.len());
        let mut window = Vec::with_capacity(seq_len + 1);
        for &i in indices {
            let (s, k) = self.pick(i);
            let source = &self.sources[s];
            let virt = source
                .sampler
                .expect("weighted sources have windows")
                .offset(k);
            window.clear();
            let ranges = source.file_ranges(virt as u64, seq_len as u64 + 1);
            for &(start, len) in &ranges {
                file.read_into(start as usize, len as usize, &mut window)?;
            }
            starts.push(ranges[0].0 as usize);
            inputs.extend_from_slice(&window[..seq_len]);
            targets.extend_from_slice(&window[1..]);
        }
        let batch = Batch {
            inputs,
            targets,
            rows: indices.len(),
            seq_len,
        };
        Ok((batch, starts))
    }
}

/// The sources of `file` (its document types), each with its spans and window sampler.
fn source_streams(meta: &Meta, file: &str, seq_len: usize, seed: u64) -> Result<Vec<SourceStream>> {
    let Some(spans) = meta.spans.get(file).filter(|s| !s.is_empty()) else {
        bail!(
            "a data mixture needs per-source spans in meta.json, and {file} has none: prepare the data with --type-field (e.g. --type-field source)"
        );
    };
    let mut names: Vec<&str> = spans.iter().map(|s| s.doc_type.as_str()).collect();
    names.sort();
    names.dedup();
    Ok(names
        .iter()
        .enumerate()
        .map(|(n, name)| {
            let mut virt = 0;
            let mut ranges = Vec::new();
            for s in spans.iter().filter(|s| s.doc_type == *name) {
                ranges.push((s.start, virt));
                virt += s.end - s.start;
            }
            // Each source draws in its own seeded order.
            let source_seed = splitmix64(seed ^ (n as u64 + 1).wrapping_mul(0x9e37_79b9));
            SourceStream {
                name: name.to_string(),
                spans: ranges,
                tokens: virt,
                sampler: Sampler::new(virt as usize, seq_len, source_seed).ok(),
            }
        })
        .collect())
}

/// Slots per block for each of `names` from `weights` (largest remainder; sums to BLOCK).
fn slot_counts(weights: &[(String, f64)], names: &[&str]) -> Result<Vec<u64>> {
    let mut w = vec![0.0; names.len()];
    for (name, weight) in weights {
        let Some(i) = names.iter().position(|n| n == name) else {
            bail!(
                "data source '{name}' is not in the prepared data (its sources are: {})",
                names.join(", ")
            );
        };
        w[i] = *weight;
    }
    let sum: f64 = w.iter().sum();
    if sum.is_nan() || sum <= 0.0 || w.iter().any(|x| !x.is_finite() || *x < 0.0) {
        bail!("mixture weights must be finite, non-negative and not all zero");
    }
    let exact: Vec<f64> = w.iter().map(|x| x / sum * BLOCK as f64).collect();
    let mut counts: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let missing = BLOCK - counts.iter().sum::<u64>();
    for &i in order.iter().take(missing as usize) {
        counts[i] += 1;
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{push_span, FileInfo, TokenDtype};
    use proptest::prelude::*;

    fn meta_with(sources: &[(&str, u64)]) -> Meta {
        let mut spans = Vec::new();
        let mut at = 0;
        // Interleave the sources' documents in runs of 100 tokens.
        let mut left: Vec<u64> = sources.iter().map(|s| s.1).collect();
        while left.iter().any(|&l| l > 0) {
            for (i, (name, _)) in sources.iter().enumerate() {
                let n = left[i].min(100);
                if n > 0 {
                    push_span(&mut spans, name, at, at + n);
                    at += n;
                    left[i] -= n;
                }
            }
        }
        Meta {
            tokenizer: "test".into(),
            vocab_size: 100,
            eot_token: 0,
            dtype: TokenDtype::Uint16,
            files: [(
                "train.bin".to_string(),
                FileInfo {
                    tokens: at,
                    sha256: String::new(),
                },
            )]
            .into_iter()
            .collect(),
            sources: Vec::new(),
            filters: Vec::new(),
            spans: [("train.bin".to_string(), spans)].into_iter().collect(),
        }
    }

    fn stage(weights: &[(&str, f64)], until: Option<u64>) -> MixtureStage {
        MixtureStage {
            until_tokens: until,
            weights: weights.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
        }
    }

    proptest! {
        /// Over 10,000 batches each source's share is its weight to 1e-4.
        #[test]
        fn shares_match_the_weights(raw in proptest::collection::vec(1u32..1000, 2..7), rows in 1u64..9, seed: u64) {
            let names: Vec<String> = (0..raw.len()).map(|i| format!("s{i}")).collect();
            let sources: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 5_000)).collect();
            let total: f64 = raw.iter().map(|&x| x as f64).sum();
            let weights: Vec<(&str, f64)> = names.iter().zip(&raw).map(|(n, &x)| (n.as_str(), x as f64 / total)).collect();
            let m = MixtureSampler::new(&meta_with(&sources), "train.bin", 16, seed, &[stage(&weights, None)]).unwrap();
            let samples = 10_000 * rows;
            // Counted sample by sample, as training draws them (`draws` alone would only
            // restate the per-block quotas).
            let mut draws = vec![0u64; names.len()];
            for i in 0..samples {
                draws[m.pick(i).0] += 1;
            }
            for ((_, w), d) in weights.iter().zip(&draws) {
                let share = *d as f64 / samples as f64;
                // Shares are exact to 1/BLOCK: within 1 % of any weight of 1 % or more.
                prop_assert!((share - w).abs() <= 1.0 / BLOCK as f64, "share {share} vs weight {w}");
                if *w >= 0.01 {
                    prop_assert!((share - w).abs() <= 0.01 * w, "share {share} vs weight {w}");
                }
            }
        }

        /// Within a stage, each source's draws are numbered 0, 1, 2 … without gaps or repeats,
        /// whatever the order samples are asked for (what exact resume relies on).
        #[test]
        fn draws_are_a_bijection_onto_each_sources_stream(seed: u64, start in 0u64..30_000) {
            let m = MixtureSampler::new(
                &meta_with(&[("a", 3_000), ("b", 900), ("c", 5_000)]),
                "train.bin", 8, seed,
                &[stage(&[("a", 0.5), ("b", 0.2), ("c", 0.3)], None)],
            ).unwrap();
            let block = start / BLOCK;
            let mut seen: Vec<Vec<u64>> = vec![Vec::new(); 3];
            for i in block * BLOCK..(block + 1) * BLOCK {
                let (s, k) = m.pick(i);
                seen[s].push(k);
            }
            let before = m.draws_before_block(block);
            for (s, mut ks) in seen.into_iter().enumerate() {
                ks.sort();
                let want: Vec<u64> = (before[s]..before[s] + ks.len() as u64).collect();
                prop_assert_eq!(ks, want);
            }
        }
    }

    #[test]
    fn a_curriculum_switches_weights_at_its_token_count() {
        let m = MixtureSampler::new(
            &meta_with(&[("books", 4_000), ("web", 4_000)]),
            "train.bin",
            10,
            1,
            &[
                stage(&[("books", 1.0)], Some(10 * 2 * BLOCK)),
                stage(&[("books", 0.25), ("web", 0.75)], None),
            ],
        )
        .unwrap();
        // The first 2 blocks (200,000 tokens of 10-token samples) are all books.
        assert_eq!(m.draws(2 * BLOCK), vec![2 * BLOCK, 0]);
        assert_eq!(
            m.draws(4 * BLOCK),
            vec![2 * BLOCK + BLOCK / 2, 3 * BLOCK / 2]
        );
    }

    #[test]
    fn a_stage_shorter_than_a_block_is_refused() {
        let meta = meta_with(&[("books", 4_000), ("web", 4_000)]);
        let stages = [
            stage(&[("books", 1.0)], Some(5)),
            stage(&[("web", 1.0)], None),
        ];
        let err = MixtureSampler::new(&meta, "train.bin", 10, 1, &stages).unwrap_err();
        assert!(
            err.to_string().contains("stages switch on whole blocks"),
            "{err}"
        );
    }

    #[test]
    fn windows_are_read_across_a_sources_spans() {
        // Source "a" owns tokens 0..100 and 200..300 (b owns 100..200): a window of "a" that
        // crosses its first span's end continues at 200.
        let m = MixtureSampler::new(
            &meta_with(&[("a", 200), ("b", 100)]),
            "train.bin",
            8,
            1,
            &[stage(&[("a", 1.0)], None)],
        )
        .unwrap();
        let a = &m.sources[0];
        assert_eq!(a.file_ranges(95, 9), vec![(95, 5), (200, 4)]);
        assert_eq!(a.file_ranges(0, 3), vec![(0, 3)]);
    }

    #[test]
    fn unknown_sources_and_sources_too_small_are_named() {
        let meta = meta_with(&[("a", 1_000), ("b", 10)]);
        let err = MixtureSampler::new(&meta, "train.bin", 8, 1, &[stage(&[("x", 1.0)], None)])
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("'x' is not in the prepared data (its sources are: a, b)"),
            "{err}"
        );
        let err = MixtureSampler::new(
            &meta,
            "train.bin",
            8,
            1,
            &[stage(&[("a", 0.5), ("b", 0.5)], None)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("'b' has 10 tokens"), "{err}");
    }
}
