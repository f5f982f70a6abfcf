//! Byte-level BPE encoding: GPT-2's ranks (from tiktoken-rs, offline) or a tokenizer.json
//! trained by `lab tokenizer train`, through one fast encoder.
//!
//! The encoder gives exactly tiktoken's output (tests compare it with tiktoken-rs and with
//! OpenAI's Python tiktoken) but runs faster: the GPT-2 pre-tokenizer pattern runs on the
//! `regex` crate's DFA (its one look-ahead, `\s+(?!\S)`, is emulated by giving back the last
//! whitespace character), merges use a heap (linear-log even on a megabyte of one character
//! class, where the quadratic merge loop stalls), and each worker thread caches the tokens of
//! the words it has already seen.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use regex::Regex;
use rustc_hash::FxHashMap;

/// GPT-2's pre-tokenizer, as in tiktoken's r50k_base, minus the look-ahead alternative.
const GPT2_PATTERN: &str = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";
/// Tiktoken's original pattern, for building a tiktoken-rs `CoreBPE` from trained ranks.
pub const TIKTOKEN_GPT2_PATTERN: &str =
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

pub const GPT2_VOCAB: usize = lab_data::gpt2::GPT2_VOCAB;
pub const GPT2_EOT: u32 = lab_data::gpt2::GPT2_EOT;
pub const GPT2_EOT_TEXT: &str = "<|endoftext|>";

/// A byte-level BPE tokenizer: ranks, pre-tokenizer, special tokens and the id joining
/// documents.
pub struct Tokenizer {
    name: String,
    ranks: FxHashMap<Vec<u8>, u32>,
    pretokenizer: Regex,
    /// Special tokens matched in text before BPE (trained tokenizers only; GPT-2 encodes
    /// ordinary text, as nanoGPT does, so `<|endoftext|>` in a document is just text).
    specials: Vec<(String, u32)>,
    special_pattern: Option<Regex>,
    vocab_size: usize,
    eot: u32,
    /// Distinguishes this tokenizer's entries in the per-thread word cache.
    cache_key: u64,
}

/// Tokens of recently seen words, tagged with the tokenizer they belong to.
type WordCache = (u64, FxHashMap<Box<[u8]>, Box<[u32]>>);

thread_local! {
    static WORD_CACHE: RefCell<WordCache> = RefCell::new((0, FxHashMap::default()));
}
const WORD_CACHE_MAX_ENTRIES: usize = 1 << 18;
const WORD_CACHE_MAX_BYTES: usize = 48;

impl Tokenizer {
    /// `gpt2`, or the path of a tokenizer.json.
    pub fn load(spec: &str) -> Result<Self> {
        match spec {
            "gpt2" | "r50k_base" => Self::gpt2(),
            path => Self::from_file(Path::new(path)),
        }
    }

    /// The tokenizer that meta.json of the data in `data_dir` names ([`Self::locate_for_data`]).
    pub fn of_data(spec: &str, data_dir: &Path) -> Result<Self> {
        Self::load(&Self::locate_for_data(spec, data_dir)?)
    }

    /// What [`Self::load`] takes for the tokenizer meta.json in `data_dir` names: GPT-2 by
    /// name, or the copy `lab data prepare` keeps beside meta.json (the file the data was
    /// tokenized with, whatever became of the original), else the file where it was named.
    pub fn locate_for_data(spec: &str, data_dir: &Path) -> Result<String> {
        if matches!(spec, "gpt2" | "r50k_base") {
            return Ok(spec.to_string());
        }
        let named = Path::new(spec);
        let beside = named.file_name().map(|n| data_dir.join(n));
        let candidates = [beside, Some(data_dir.join(spec)), Some(named.to_path_buf())];
        match candidates.into_iter().flatten().find(|p| p.is_file()) {
            Some(path) => Ok(path.display().to_string()),
            None => bail!(
                "the data's tokenizer {spec} (meta.json in {}) is neither there nor here: copy it beside meta.json",
                data_dir.display()
            ),
        }
    }

    /// GPT-2 BPE with the ranks tiktoken-rs embeds (byte-identical to OpenAI's file).
    pub fn gpt2() -> Result<Self> {
        let core = tiktoken_rs::r50k_base().context("tiktoken-rs GPT-2 ranks")?;
        let ranks: FxHashMap<Vec<u8>, u32> = core
            ._decode_native_and_split((0..GPT2_EOT).collect())
            .zip(0..)
            .collect();
        Self::from_ranks("gpt2".into(), ranks, Vec::new(), GPT2_VOCAB, GPT2_EOT)
    }

    /// A byte-level BPE tokenizer.json (as written by `lab tokenizer train` or HF tokenizers
    /// with a ByteLevel pre-tokenizer): its vocabulary becomes byte ranks.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read tokenizer {}; pass --tokenizer gpt2 or the tokenizer.json written by `lab tokenizer train`",
                path.display()
            )
        })?;
        Self::from_json_str(&text, path)
    }

    /// Builds the encoder from tokenizer.json text; `path` names it in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let json: serde_json::Value = serde_json::from_str(text)
            .with_context(|| format!("{} is not a tokenizer.json", path.display()))?;
        let model = &json["model"];
        if model["type"] != "BPE" {
            bail!(
                "{}: model type {} is not BPE; train one with `lab tokenizer train`",
                path.display(),
                model["type"]
            );
        }
        let vocab = model["vocab"]
            .as_object()
            .with_context(|| format!("{}: model.vocab is missing", path.display()))?;
        let decode = byte_level_decoder();
        let mut ranks = FxHashMap::default();
        let mut max_id = 0u32;
        for (token, id) in vocab {
            let id = id.as_u64().context("vocab id is not an integer")? as u32;
            max_id = max_id.max(id);
            let bytes: Option<Vec<u8>> = token.chars().map(|c| decode.get(&c).copied()).collect();
            match bytes {
                Some(b) => {
                    ranks.insert(b, id);
                }
                // Special tokens sit in the vocab in plain text; they come from added_tokens.
                None => continue,
            }
        }
        let mut specials = Vec::new();
        for t in json["added_tokens"].as_array().into_iter().flatten() {
            let (Some(content), Some(id)) = (t["content"].as_str(), t["id"].as_u64()) else {
                continue;
            };
            if content.is_empty() {
                continue; // an empty special would match between every two characters
            }
            max_id = max_id.max(id as u32);
            ranks.remove(content.as_bytes());
            specials.push((content.to_string(), id as u32));
        }
        if (0..=255u8).any(|b| !ranks.contains_key(&vec![b])) {
            bail!(
                "{}: not a byte-level BPE (some single bytes have no id); train one with `lab tokenizer train`",
                path.display()
            );
        }
        let eot = ["</s>", GPT2_EOT_TEXT, "<eos>"]
            .iter()
            .find_map(|name| specials.iter().find(|(s, _)| s == name).map(|(_, id)| *id))
            .with_context(|| {
                format!(
                    "{}: no end-of-text special token (</s> or <|endoftext|>)",
                    path.display()
                )
            })?;
        let vocab_size = max_id as usize + 1;
        Self::from_ranks(path.display().to_string(), ranks, specials, vocab_size, eot)
    }

    fn from_ranks(
        name: String,
        ranks: FxHashMap<Vec<u8>, u32>,
        mut specials: Vec<(String, u32)>,
        vocab_size: usize,
        eot: u32,
    ) -> Result<Self> {
        // Longest first, so `[HISTORY OF]` wins over `[HISTORY]` where both exist.
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        let special_pattern = if specials.is_empty() {
            None
        } else {
            let alts: Vec<String> = specials.iter().map(|(s, _)| regex::escape(s)).collect();
            Some(Regex::new(&alts.join("|"))?)
        };
        let cache_key = crate::hash::hash64(name.as_bytes(), vocab_size as u64) | 1;
        Ok(Self {
            name,
            ranks,
            pretokenizer: Regex::new(GPT2_PATTERN)?,
            specials,
            special_pattern,
            vocab_size,
            eot,
            cache_key,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    pub fn eot(&self) -> u32 {
        self.eot
    }

    /// Tokens of `text` (special tokens of a trained tokenizer are recognised; GPT-2 encodes
    /// ordinary text only, like tiktoken's `encode_ordinary`).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        self.encode_into(text, &mut out);
        out
    }

    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        let Some(pattern) = &self.special_pattern else {
            return self.encode_ordinary_into(text, out);
        };
        let mut last = 0;
        for m in pattern.find_iter(text) {
            self.encode_ordinary_into(&text[last..m.start()], out);
            let id = self
                .specials
                .iter()
                .find(|(s, _)| s == m.as_str())
                .unwrap()
                .1;
            out.push(id);
            last = m.end();
        }
        self.encode_ordinary_into(&text[last..], out);
    }

    fn encode_ordinary_into(&self, text: &str, out: &mut Vec<u32>) {
        WORD_CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.0 != self.cache_key || cache.1.len() > WORD_CACHE_MAX_ENTRIES {
                cache.0 = self.cache_key;
                cache.1.clear();
            }
            for piece in pretokenize(&self.pretokenizer, text) {
                let bytes = piece.as_bytes();
                if let Some(&id) = self.ranks.get(bytes) {
                    out.push(id);
                } else if bytes.len() <= WORD_CACHE_MAX_BYTES {
                    if let Some(ids) = cache.1.get(bytes) {
                        out.extend_from_slice(ids);
                    } else {
                        let start = out.len();
                        byte_pair_encode(bytes, &self.ranks, out);
                        cache.1.insert(bytes.into(), out[start..].into());
                    }
                } else {
                    byte_pair_encode(bytes, &self.ranks, out);
                }
            }
        })
    }

    /// The text of `ids` (bytes joined, invalid UTF-8 replaced). Builds the id → bytes table:
    /// decode whole sequences, not one token at a time.
    pub fn decode(&self, ids: &[u32]) -> String {
        let table = self.token_bytes();
        let bytes: Vec<u8> = ids
            .iter()
            .filter_map(|&id| table.get(id as usize).cloned().flatten())
            .flatten()
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Token bytes → id, special tokens excepted.
    pub fn ranks(&self) -> &FxHashMap<Vec<u8>, u32> {
        &self.ranks
    }

    /// The bytes of token `id` (None for special tokens and unknown ids).
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        let mut table = vec![None; self.vocab_size];
        for (bytes, &id) in &self.ranks {
            table[id as usize] = Some(bytes.clone());
        }
        for (s, id) in &self.specials {
            table[*id as usize] = Some(s.as_bytes().to_vec());
        }
        table
    }

    /// The same tokenizer as a tiktoken-rs `CoreBPE` (for callers that want tiktoken's API).
    pub fn to_tiktoken(&self) -> Result<tiktoken_rs::CoreBPE> {
        tiktoken_rs::CoreBPE::new(
            self.ranks.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            self.specials.iter().cloned().collect(),
            TIKTOKEN_GPT2_PATTERN,
        )
        .map_err(|e| anyhow::anyhow!("cannot build tiktoken encoder: {e}"))
    }
}

/// Splits `text` as tiktoken's GPT-2 pattern does.
pub fn pretokenize<'t>(re: &'t Regex, text: &'t str) -> impl Iterator<Item = &'t str> + 't {
    let mut pos = 0;
    std::iter::from_fn(move || {
        if pos >= text.len() {
            return None;
        }
        // Every character is a letter, number, whitespace or other: a match starts at `pos`.
        let m = re.find_at(text, pos)?;
        debug_assert_eq!(m.start(), pos);
        let mut end = m.end();
        let piece = m.as_str();
        // `\s+(?!\S)`: a whitespace run followed by a non-space gives its last character to
        // the next piece (so " word" keeps its space).
        if end < text.len() {
            let mut chars = piece.char_indices();
            if let (Some((_, first)), Some((last_at, last))) = (chars.next(), chars.next_back()) {
                if first.is_whitespace() && last.is_whitespace() {
                    end = m.start() + last_at;
                }
            }
        }
        let piece = &text[pos..end];
        pos = end;
        Some(piece)
    })
}

/// Byte-pair merges of one pre-token, lowest rank first (leftmost on ties), as tiktoken
/// does; appends the ranks of the resulting parts.
pub fn byte_pair_encode(piece: &[u8], ranks: &FxHashMap<Vec<u8>, u32>, out: &mut Vec<u32>) {
    let n = piece.len();
    if n == 1 {
        out.push(ranks[piece]);
        return;
    }
    // Parts as a linked list over byte offsets: part i spans start[i]..start[next[i]].
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let mut version = vec![0u32; n];
    let rank_of = |a: usize, b_end: usize| ranks.get(&piece[a..b_end]).copied();
    let mut heap = BinaryHeap::new();
    for i in 0..n - 1 {
        if let Some(r) = rank_of(i, i + 2) {
            heap.push(Reverse((r, i, 0u32)));
        }
    }
    while let Some(Reverse((_, i, v))) = heap.pop() {
        if !alive[i] || version[i] != v || next[i] >= n {
            continue;
        }
        // Merge part i with its right neighbour j.
        let j = next[i];
        alive[j] = false;
        next[i] = next[j];
        if next[j] < n {
            prev[next[j]] = i;
        }
        version[i] += 1;
        if next[i] < n {
            let end = next[next[i]];
            if let Some(r) = rank_of(i, end) {
                heap.push(Reverse((r, i, version[i])));
            }
        }
        let p = prev[i];
        if p != usize::MAX {
            version[p] += 1;
            if let Some(r) = rank_of(p, next[i]) {
                heap.push(Reverse((r, p, version[p])));
            }
        }
    }
    let mut i = 0;
    while i < n {
        out.push(ranks[&piece[i..next[i]]]);
        i = next[i];
    }
}

/// GPT-2's byte-to-printable-character table, inverted: byte-level BPE vocabularies spell
/// each byte as one of these characters.
pub fn byte_level_decoder() -> std::collections::HashMap<char, u8> {
    byte_level_encoder()
        .into_iter()
        .enumerate()
        .map(|(b, c)| (c, b as u8))
        .collect()
}

/// Character for each byte 0..=255 in byte-level BPE vocabularies.
pub fn byte_level_encoder() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    (0..=255u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretokenizer_gives_back_the_space_before_a_word() {
        let re = Regex::new(GPT2_PATTERN).unwrap();
        let pieces: Vec<&str> = pretokenize(&re, "a   b\n\n c  ").collect();
        assert_eq!(pieces, vec!["a", "  ", " b", "\n\n", " c", "  "]);
        let pieces: Vec<&str> = pretokenize(&re, "x\t\ty's").collect();
        // A tab is not the optional space of ` ?\p{L}+`: it stays a piece of its own.
        assert_eq!(pieces, vec!["x", "\t", "\t", "y", "'s"]);
    }

    #[test]
    fn byte_level_table_is_a_bijection() {
        let enc = byte_level_encoder();
        let dec = byte_level_decoder();
        assert_eq!(dec.len(), 256);
        assert_eq!(enc[b'A' as usize], 'A');
        assert_eq!(enc[b' ' as usize], 'Ġ');
        assert_eq!(enc[b'\n' as usize], 'Ċ');
    }
}
