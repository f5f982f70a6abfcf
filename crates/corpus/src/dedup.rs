//! Exact dedup (128-bit hash of the cleaned text) and MinHash near-dedup: word 5-gram
//! shingles, 128 seeded hash functions, LSH with 16 bands of 8 rows (candidate pairs from
//! Jaccard ≈ 0.7 up), then a candidate counts as a duplicate when the signatures agree on
//! ≥ `threshold` of their rows (the MinHash estimate of Jaccard ≥ 0.8).
//!
//! Signatures are computed in parallel; decisions are made in document order (first seen is
//! kept), so the result is deterministic for a seed whatever the worker count.

use std::collections::HashSet;

use rustc_hash::FxHashMap;

use crate::hash::{hash128, hash64, ngram_hashes, word_hashes};

pub const NUM_PERM: usize = 128;
pub const BANDS: usize = 16;
pub const ROWS: usize = NUM_PERM / BANDS;
pub const SHINGLE_WORDS: usize = 5;

pub type Signature = [u32; NUM_PERM];

/// The seeded hash family: multiply-shift hashes of each shingle hash.
#[derive(Clone)]
pub struct MinHasher {
    a: [u64; NUM_PERM],
    b: [u64; NUM_PERM],
}

impl MinHasher {
    pub fn new(seed: u64) -> Self {
        let mut a = [0u64; NUM_PERM];
        let mut b = [0u64; NUM_PERM];
        for i in 0..NUM_PERM {
            a[i] = hash64(&(i as u64).to_le_bytes(), seed ^ 0xa5a5) | 1;
            b[i] = hash64(&(i as u64).to_le_bytes(), seed ^ 0x5a5a);
        }
        Self { a, b }
    }

    /// None for documents without words (nothing to compare).
    pub fn signature(&self, text: &str) -> Option<Box<Signature>> {
        let mut shingles = ngram_hashes(&word_hashes(text), SHINGLE_WORDS);
        shingles.sort_unstable();
        shingles.dedup();
        if shingles.is_empty() {
            return None;
        }
        let mut sig = Box::new([u32::MAX; NUM_PERM]);
        for &s in &shingles {
            for i in 0..NUM_PERM {
                let h = (self.a[i].wrapping_mul(s).wrapping_add(self.b[i]) >> 32) as u32;
                if h < sig[i] {
                    sig[i] = h;
                }
            }
        }
        Some(sig)
    }
}

/// Fraction of rows on which two signatures agree: an unbiased estimate of Jaccard.
pub fn estimated_jaccard(a: &Signature, b: &Signature) -> f64 {
    a.iter().zip(b.iter()).filter(|(x, y)| x == y).count() as f64 / NUM_PERM as f64
}

pub fn exact_key(text: &str) -> u128 {
    hash128(text.as_bytes())
}

/// The documents kept so far, indexed for both checks.
pub struct DedupIndex {
    exact: HashSet<u128>,
    bands: FxHashMap<u64, Vec<u32>>,
    kept: Vec<Signature>,
    threshold: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Unique,
    ExactDuplicate,
    NearDuplicate,
}

impl DedupIndex {
    pub fn new(threshold: f64) -> Self {
        Self {
            exact: HashSet::new(),
            bands: FxHashMap::default(),
            kept: Vec::new(),
            threshold,
        }
    }

    /// Checks a document against everything kept before it and, if it is new, keeps it.
    /// `near` is None when near-dedup is off or the document has no words.
    pub fn check(&mut self, exact: u128, near: Option<&Signature>) -> Verdict {
        if !self.exact.insert(exact) {
            return Verdict::ExactDuplicate;
        }
        let Some(sig) = near else {
            return Verdict::Unique;
        };
        let keys: Vec<u64> = (0..BANDS)
            .map(|band| {
                let rows = &sig[band * ROWS..(band + 1) * ROWS];
                let bytes: Vec<u8> = rows.iter().flat_map(|r| r.to_le_bytes()).collect();
                hash64(&bytes, band as u64)
            })
            .collect();
        let mut seen = HashSet::new();
        for key in &keys {
            for &id in self.bands.get(key).into_iter().flatten() {
                if seen.insert(id)
                    && estimated_jaccard(&self.kept[id as usize], sig) >= self.threshold
                {
                    return Verdict::NearDuplicate;
                }
            }
        }
        let id = self.kept.len() as u32;
        self.kept.push(*sig);
        for key in keys {
            self.bands.entry(key).or_default().push(id);
        }
        Verdict::Unique
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, offset: usize) -> String {
        (offset..offset + n).map(|i| format!("w{i} ")).collect()
    }

    #[test]
    fn near_copies_are_caught_and_different_texts_kept() {
        let h = MinHasher::new(7);
        let mut index = DedupIndex::new(0.8);
        let base = text(300, 0);
        // Same 300 words with 5 changed at the end: Jaccard of 5-grams ≈ 0.94.
        let edited = format!("{}{}", text(295, 0), text(5, 10_000));
        let other = text(300, 5_000);
        let sig = |t: &str| h.signature(t).unwrap();
        assert_eq!(
            index.check(exact_key(&base), Some(&sig(&base))),
            Verdict::Unique
        );
        assert_eq!(
            index.check(exact_key(&base), Some(&sig(&base))),
            Verdict::ExactDuplicate
        );
        assert_eq!(
            index.check(exact_key(&edited), Some(&sig(&edited))),
            Verdict::NearDuplicate
        );
        assert_eq!(
            index.check(exact_key(&other), Some(&sig(&other))),
            Verdict::Unique
        );
    }

    #[test]
    fn half_overlapping_texts_are_not_duplicates() {
        let h = MinHasher::new(7);
        let a = text(400, 0);
        let b = text(400, 200); // Jaccard of 5-grams ≈ 0.33
        let j = estimated_jaccard(&h.signature(&a).unwrap(), &h.signature(&b).unwrap());
        assert!((0.2..0.5).contains(&j), "estimate {j}");
        let mut index = DedupIndex::new(0.8);
        index.check(exact_key(&a), Some(&h.signature(&a).unwrap()));
        assert_eq!(
            index.check(exact_key(&b), Some(&h.signature(&b).unwrap())),
            Verdict::Unique
        );
    }
}
