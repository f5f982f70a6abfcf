//! `meta.json`: what a token directory holds and how it was made.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    Uint16,
    Uint32,
}

impl TokenDtype {
    /// The dtype lab writes for `vocab_size`: uint32 when the vocabulary exceeds 65,535, as
    /// DESIGN.md's file contract says, so an outside reader can pick it from the vocabulary
    /// alone. (A vocabulary of exactly 65,536 would fit uint16; files lab wrote that way
    /// before still load, see [`TokenDtype::holds`].)
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 65_535 {
            Self::Uint16
        } else {
            Self::Uint32
        }
    }
    /// Whether every id below `vocab_size` fits this dtype.
    pub fn holds(self, vocab_size: usize) -> bool {
        match self {
            Self::Uint16 => vocab_size <= 1 << 16,
            Self::Uint32 => vocab_size as u64 <= 1 << 32,
        }
    }
    /// The name meta.json uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uint16 => "uint16",
            Self::Uint32 => "uint32",
        }
    }
    pub fn bytes(self) -> usize {
        match self {
            Self::Uint16 => 2,
            Self::Uint32 => 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileInfo {
    pub tokens: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// `gpt2`, or the path/name of a trained tokenizer.
    pub tokenizer: String,
    pub vocab_size: usize,
    /// The end-of-text id that joins documents.
    pub eot_token: u32,
    pub dtype: TokenDtype,
    /// `train.bin` and `val.bin`, with their token counts and sha256.
    pub files: BTreeMap<String, FileInfo>,
    /// Where the text came from (free-form objects: path, sha256, documents, bytes …).
    #[serde(default)]
    pub sources: Vec<serde_json::Value>,
    /// What was applied to it, in order (free-form objects: name, settings, removed counts …).
    #[serde(default)]
    pub filters: Vec<serde_json::Value>,
    /// Where each document type lies in each file: runs of consecutive documents of one type,
    /// by file name (`train.bin`, `val.bin`). Empty: the data has no types.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spans: BTreeMap<String, Vec<Span>>,
}

/// Tokens `start..end` of a file hold documents of type `doc_type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub doc_type: String,
    pub start: u64,
    pub end: u64,
}

/// Appends tokens `start..end` of type `doc_type`, merging with the last span when it
/// continues it.
pub fn push_span(spans: &mut Vec<Span>, doc_type: &str, start: u64, end: u64) {
    match spans.last_mut() {
        Some(last) if last.doc_type == doc_type && last.end == start => last.end = end,
        _ => spans.push(Span {
            doc_type: doc_type.to_string(),
            start,
            end,
        }),
    }
}

impl Meta {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("meta.json");
        if !dir.is_dir() {
            if dir.exists() {
                bail!(
                    "data dir {} is a file, not a folder: name a prepared data dir",
                    dir.display()
                );
            }
            bail!(
                "data dir {} does not exist: name a prepared one, or prepare it with `lab data prepare --input FILE --output-dir {}`",
                dir.display(),
                dir.display()
            );
        }
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {}; prepare the data dir with `lab data prepare`",
                path.display()
            )
        })?;
        let meta: Meta = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid meta.json", path.display()))?;
        if !meta.dtype.holds(meta.vocab_size) {
            bail!(
                "{}: vocab_size {} does not fit dtype {}; re-prepare the data with `lab data prepare`",
                path.display(),
                meta.vocab_size,
                meta.dtype.name()
            );
        }
        Ok(meta)
    }

    /// The document type of every token position of `file`, as an index into the returned
    /// type names (`None` where no span covers it). One name, "all", when the data has no types.
    pub fn types_of(&self, file: &str) -> (Vec<String>, Vec<(u64, u64, usize)>) {
        let spans = self.spans.get(file).filter(|s| !s.is_empty());
        let Some(spans) = spans else {
            let n = self.files.get(file).map_or(0, |f| f.tokens);
            return (vec!["all".to_string()], vec![(0, n, 0)]);
        };
        let mut names: Vec<String> = spans.iter().map(|s| s.doc_type.clone()).collect();
        names.sort();
        names.dedup();
        let ranges = spans
            .iter()
            .map(|s| {
                let i = names.binary_search(&s.doc_type).expect("a listed type");
                (s.start, s.end, i)
            })
            .collect();
        (names, ranges)
    }

    pub fn file(&self, name: &str) -> Result<&FileInfo> {
        self.files
            .get(name)
            .with_context(|| format!("meta.json lists no {name}"))
    }

    /// Writes meta.json atomically.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)? + "\n";
        lab_fsio::write_atomic(&dir.join("meta.json"), json.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_writes_uint32_once_the_vocabulary_exceeds_65535() {
        assert_eq!(TokenDtype::for_vocab(50_257), TokenDtype::Uint16);
        assert_eq!(TokenDtype::for_vocab(65_535), TokenDtype::Uint16);
        assert_eq!(TokenDtype::for_vocab(65_536), TokenDtype::Uint32);
        assert_eq!(TokenDtype::for_vocab(262_144), TokenDtype::Uint32);
    }

    fn load_with(dir: &Path, vocab_size: usize, dtype: &str) -> Result<Meta> {
        let meta = serde_json::json!({
            "tokenizer": "test", "vocab_size": vocab_size, "dtype": dtype,
            "eot_token": 0, "files": {}
        });
        std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
        Meta::load(dir)
    }

    #[test]
    fn data_loads_in_any_dtype_that_holds_its_ids() {
        let dir = tempfile::tempdir().unwrap();
        // Written by lab before the contract's cut-over: every id still fits.
        assert!(load_with(dir.path(), 65_536, "uint16").is_ok());
        assert!(load_with(dir.path(), 65_536, "uint32").is_ok());
        let err = load_with(dir.path(), 65_537, "uint16").unwrap_err();
        assert!(
            format!("{err:#}").contains("does not fit dtype uint16"),
            "{err:#}"
        );
    }
}
