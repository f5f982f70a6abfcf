//! A tokenizer swap for continued pretraining: the embedding (and untied LM-head) rows of a
//! model trained with one tokenizer, re-indexed for another, the rest of the network kept.
//!
//! Each row of the new vocabulary is
//! - **copied** from the old row of the token both vocabularies spell with the same bytes (or a
//!   pair matched on purpose: the end-of-text tokens);
//! - **composed**: the mean of the old rows of the tokens the new token's text encodes to with
//!   the old tokenizer (the "sub-token mean" initialisation);
//! - **initialised** from the seeded normal init when neither applies (an id no token has, a
//!   text that encodes to nothing).
//!
//! Rows are vocabulary-major (`[vocab, d_model]`): HF's layout of both `embed_tokens` and
//! `lm_head`, so the swap runs on an HF state dict before it is renamed to lab's.

use std::collections::HashMap;

use anyhow::{bail, Result};
use lab_config::ModelConfig;
use serde::Serialize;

use crate::weights::HostTensor;

/// Where one new row comes from (old row ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowSource {
    Copied(u32),
    Composed(Vec<u32>),
    Initialised,
}

/// How many rows came each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SwapCounts {
    pub copied: usize,
    pub composed: usize,
    pub initialised: usize,
}

/// The old vocabulary as the plan needs it.
pub struct OldVocab<'a> {
    /// Token bytes → old id.
    pub ids: &'a HashMap<Vec<u8>, u32>,
    /// Rows of the old embedding: ids at or past it have no row.
    pub rows: usize,
    /// The old ids of a byte string (the old tokenizer's encoding of the new token's text).
    pub encode: &'a dyn Fn(&[u8]) -> Vec<u32>,
}

/// The source of every row of the new embedding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPlan {
    pub rows: Vec<RowSource>,
}

impl RowPlan {
    /// `new_tokens[id]`: the bytes of each new id (`None`: no token), for a model of `rows`
    /// rows (ids past `new_tokens` are initialised); `pairs`: (new id, old id) copied whatever
    /// their spelling.
    pub fn new(
        new_tokens: &[Option<Vec<u8>>],
        rows: usize,
        old: &OldVocab,
        pairs: &[(u32, u32)],
    ) -> Self {
        let has_row = |id: u32| (id as usize) < old.rows;
        let source = |id: usize| -> RowSource {
            if let Some(&(_, o)) = pairs.iter().find(|(n, o)| *n as usize == id && has_row(*o)) {
                return RowSource::Copied(o);
            }
            let Some(Some(bytes)) = new_tokens.get(id) else {
                return RowSource::Initialised;
            };
            match old.ids.get(bytes) {
                Some(&o) if has_row(o) => RowSource::Copied(o),
                _ => {
                    let parts: Vec<u32> = (old.encode)(bytes);
                    if parts.is_empty() || !parts.iter().all(|&p| has_row(p)) {
                        RowSource::Initialised
                    } else {
                        RowSource::Composed(parts)
                    }
                }
            }
        };
        Self {
            rows: (0..rows).map(source).collect(),
        }
    }

    pub fn counts(&self) -> SwapCounts {
        let mut c = SwapCounts::default();
        for r in &self.rows {
            match r {
                RowSource::Copied(_) => c.copied += 1,
                RowSource::Composed(_) => c.composed += 1,
                RowSource::Initialised => c.initialised += 1,
            }
        }
        c
    }

    /// Every old row the plan reads.
    fn old_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.rows
            .iter()
            .flat_map(|r| match r {
                RowSource::Copied(o) => std::slice::from_ref(o),
                RowSource::Composed(parts) => parts.as_slice(),
                RowSource::Initialised => &[],
            })
            .copied()
    }

    /// The new `[rows, d]` matrix from the old `[old rows, d]` one; initialised rows come from
    /// `fresh` (`[rows, d]`, needed only when the plan initialises a row).
    pub fn apply(&self, old: &HostTensor, fresh: Option<&HostTensor>) -> Result<HostTensor> {
        let [old_rows, d] = old.shape[..] else {
            bail!("a vocabulary matrix is 2-D, not {:?}", old.shape);
        };
        if let Some(id) = self.old_ids().find(|&id| id as usize >= old_rows) {
            bail!("the plan reads old row {id} of a matrix of {old_rows} rows");
        }
        let row = |id: u32| &old.data[id as usize * d..(id as usize + 1) * d];
        let mut data = Vec::with_capacity(self.rows.len() * d);
        for (i, source) in self.rows.iter().enumerate() {
            match source {
                RowSource::Copied(o) => data.extend_from_slice(row(*o)),
                RowSource::Composed(parts) => data.extend(mean_row(parts, d, row)),
                RowSource::Initialised => {
                    let Some(f) = fresh.filter(|f| f.shape == [self.rows.len(), d]) else {
                        bail!(
                            "row {i} needs the initial weights of a {} × {d} matrix",
                            self.rows.len()
                        );
                    };
                    data.extend_from_slice(&f.data[i * d..(i + 1) * d]);
                }
            }
        }
        Ok(HostTensor {
            shape: vec![self.rows.len(), d],
            data,
        })
    }
}

/// The element-wise mean of the rows `parts` (accumulated in f64).
fn mean_row<'a>(parts: &[u32], d: usize, row: impl Fn(u32) -> &'a [f32]) -> Vec<f32> {
    let mut sum = vec![0.0f64; d];
    for &p in parts {
        for (s, &x) in sum.iter_mut().zip(row(p)) {
            *s += x as f64;
        }
    }
    let n = parts.len() as f64;
    sum.into_iter().map(|s| (s / n) as f32).collect()
}

/// The seeded initial rows of a model of shape `cfg` (what `Llama::new` draws), vocabulary-major:
/// the embedding's, and the LM head's when it is untied.
pub fn fresh_rows(cfg: &ModelConfig, seed: u64) -> (HostTensor, Option<HostTensor>) {
    let (v, d, std) = (cfg.vocab_size, cfg.d_model, cfg.init_std);
    let embed = HostTensor {
        shape: vec![v, d],
        data: crate::init::normal_values(seed, "embed", v * d, std),
    };
    let head = (!cfg.tie_embeddings).then(|| {
        // lab keeps the head as [d, v]: row t of the vocabulary is column t.
        let cols = HostTensor {
            shape: vec![d, v],
            data: crate::init::normal_values(seed, "lm_head.weight", d * v, std),
        };
        crate::hf::transpose(&cols).expect("a [d, v] matrix transposes")
    });
    (embed, head)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Old vocabulary: a b c ab <eot> (5 rows), and q, an id past the old matrix; new: a ab
    /// abc q x <eos> and an id with no token.
    fn plan() -> RowPlan {
        let mut old: HashMap<Vec<u8>, u32> = ["a", "b", "c", "ab", "<eot>"]
            .iter()
            .enumerate()
            .map(|(i, s)| (s.as_bytes().to_vec(), i as u32))
            .collect();
        old.insert(b"q".to_vec(), 9);
        // A greedy longest-match "tokenizer" over the old vocabulary.
        let encode = |bytes: &[u8]| -> Vec<u32> {
            let mut out = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                let (len, id) = (1..=bytes.len() - i)
                    .rev()
                    .find_map(|n| old.get(&bytes[i..i + n]).map(|&id| (n, id)))
                    .unwrap_or((1, u32::MAX));
                if id != u32::MAX {
                    out.push(id);
                }
                i += len;
            }
            out
        };
        let new: Vec<Option<Vec<u8>>> = ["a", "ab", "abc", "q", "x", "<eos>"]
            .iter()
            .map(|s| Some(s.as_bytes().to_vec()))
            .chain([None])
            .collect();
        let vocab = OldVocab {
            ids: &old,
            rows: 5,
            encode: &encode,
        };
        // 8 rows: the model is padded past the tokenizer's 7 ids.
        RowPlan::new(&new, 8, &vocab, &[(5, 4)])
    }

    fn old_matrix() -> HostTensor {
        HostTensor {
            shape: vec![5, 3],
            data: (0..15).map(|i| i as f32 * 0.37 - 2.0).collect(),
        }
    }

    #[test]
    fn rows_are_copied_composed_or_initialised_and_counted() {
        let p = plan();
        assert_eq!(
            p.rows,
            vec![
                RowSource::Copied(0),
                RowSource::Copied(3),
                RowSource::Composed(vec![3, 2]), // abc = ab + c
                RowSource::Initialised,          // q: its old id has no row
                RowSource::Initialised,          // x: encodes to nothing
                RowSource::Copied(4),            // <eos> ↔ <eot>, paired
                RowSource::Initialised,          // an id with no token
                RowSource::Initialised,          // a padding row
            ]
        );
        assert_eq!(
            p.counts(),
            SwapCounts {
                copied: 3,
                composed: 1,
                initialised: 4
            }
        );
    }

    #[test]
    fn copied_rows_equal_the_source_and_composed_rows_the_mean_of_their_parts() {
        let (old, p) = (old_matrix(), plan());
        let fresh = HostTensor {
            shape: vec![8, 3],
            data: (0..24).map(|i| 100.0 + i as f32).collect(),
        };
        let new = p.apply(&old, Some(&fresh)).unwrap();
        assert_eq!(new.shape, vec![8, 3]);
        let row = |t: &HostTensor, i: usize| t.data[i * 3..i * 3 + 3].to_vec();
        assert_eq!(row(&new, 0), row(&old, 0));
        assert_eq!(row(&new, 1), row(&old, 3));
        assert_eq!(row(&new, 5), row(&old, 4));
        let mean: Vec<f32> = (0..3)
            .map(|j| ((old.data[9 + j] as f64 + old.data[6 + j] as f64) / 2.0) as f32)
            .collect();
        assert_eq!(row(&new, 2), mean);
        for i in [3, 4, 6, 7] {
            assert_eq!(row(&new, i), row(&fresh, i), "row {i} from the init");
        }
        let e = p.apply(&old, None).unwrap_err().to_string();
        assert!(e.contains("row 3 needs the initial weights"), "{e}");
        let short = HostTensor {
            shape: vec![4, 3],
            data: old.data[..12].to_vec(),
        };
        let e = p.apply(&short, Some(&fresh)).unwrap_err().to_string();
        assert!(e.contains("reads old row 4 of a matrix of 4 rows"), "{e}");
    }

    #[test]
    fn fresh_rows_are_the_models_own_initial_rows() {
        type B = burn::backend::Flex;
        let cfg = crate::tiny_test_config();
        let model = crate::Llama::<B>::new(&cfg, 7, &Default::default());
        let lab = crate::weights::tensor_map(&model);
        let hf = crate::hf::to_hf(&lab).unwrap();
        let (embed, head) = fresh_rows(&cfg, 7);
        assert_eq!(embed, hf["model.embed_tokens.weight"]);
        assert_eq!(head.unwrap(), hf["lm_head.weight"]);
    }
}
