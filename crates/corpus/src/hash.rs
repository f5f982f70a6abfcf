//! Stable hashes: the same bytes give the same value on every machine, Rust version and run
//! (std's `DefaultHasher` makes no such promise), so splits and dedup decisions reproduce.

use xxhash_rust::xxh3::{xxh3_128, xxh3_64_with_seed};

pub fn hash64(bytes: &[u8], seed: u64) -> u64 {
    xxh3_64_with_seed(bytes, seed)
}

pub fn hash128(bytes: &[u8]) -> u128 {
    xxh3_128(bytes)
}

/// A uniform value in [0, 1) drawn from a hash.
pub fn unit_interval(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Lowercased alphanumeric words: the unit that dedup shingles and decontamination n-grams
/// are built from, so punctuation and case differences do not hide a copy.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
}

/// Hashes of the word n-grams of `words` (one hash of all words when there are fewer than n).
pub fn ngram_hashes(words: &[String], n: usize) -> Vec<u64> {
    let join = |ws: &[String]| -> u64 {
        let mut buf = Vec::with_capacity(ws.iter().map(|w| w.len() + 1).sum());
        for w in ws {
            buf.extend_from_slice(w.as_bytes());
            buf.push(b' ');
        }
        hash64(&buf, 0)
    };
    if words.is_empty() {
        return Vec::new();
    }
    if words.len() < n {
        return vec![join(words)];
    }
    words.windows(n).map(join).collect()
}
