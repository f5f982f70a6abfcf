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

/// Hashes of the lowercased alphanumeric words of `text`: the unit that dedup shingles and
/// decontamination n-grams are built from, so punctuation and case do not hide a copy.
pub fn word_hashes(text: &str) -> Vec<u64> {
    let mut out = Vec::with_capacity(text.len() / 5);
    let mut buf = String::new();
    for w in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if w.bytes().any(|b| b.is_ascii_uppercase() || b >= 0x80) {
            buf.clear();
            buf.extend(w.chars().flat_map(char::to_lowercase));
            out.push(hash64(buf.as_bytes(), 0));
        } else {
            out.push(hash64(w.as_bytes(), 0));
        }
    }
    out
}

/// Hashes of the word n-grams (a rolling polynomial over word hashes, then mixed); one hash
/// of all words when there are fewer than n.
pub fn ngram_hashes(words: &[u64], n: usize) -> Vec<u64> {
    const BASE: u64 = 0x100_0000_01b3;
    if words.is_empty() {
        return Vec::new();
    }
    let n = n.min(words.len());
    let top = (1..n).fold(1u64, |p, _| p.wrapping_mul(BASE)); // BASE^(n-1)
    let mut out = Vec::with_capacity(words.len() + 1 - n);
    let mut h = 0u64;
    for (i, &w) in words.iter().enumerate() {
        if i >= n {
            h = h.wrapping_sub(words[i - n].wrapping_mul(top));
        }
        h = h.wrapping_mul(BASE).wrapping_add(w);
        if i + 1 >= n {
            out.push(mix(h ^ n as u64));
        }
    }
    out
}

/// SplitMix64's finalizer.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn rolling_ngrams_equal_hashing_each_window(ws in proptest::collection::vec(any::<u64>(), 0..40), n in 1usize..15) {
            let direct: Vec<u64> = if ws.is_empty() { vec![] } else {
                let n = n.min(ws.len());
                ws.windows(n).map(|win| {
                    let h = win.iter().fold(0u64, |h, &w| h.wrapping_mul(0x100_0000_01b3).wrapping_add(w));
                    mix(h ^ n as u64)
                }).collect()
            };
            prop_assert_eq!(ngram_hashes(&ws, n), direct);
        }
    }

    #[test]
    fn words_ignore_case_and_punctuation() {
        assert_eq!(
            word_hashes("The CAT, the cat!"),
            word_hashes("the cat the cat")
        );
        assert_eq!(word_hashes("Ärzte"), word_hashes("ärzte"));
    }
}
