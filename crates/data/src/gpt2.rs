//! Minimal plain-text preparation with GPT-2 BPE, as nanoGPT's `prepare.py` does it: split the
//! text 90/10 by characters, encode each part (no special tokens), write train.bin / val.bin.
//! The full pipeline (cleaning, dedup, redaction, decontamination) lives in `lab-corpus`.

use std::path::Path;

use anyhow::{Context, Result};

use crate::meta::{Meta, TokenDtype};
use crate::token_file::TokenWriter;

pub const GPT2_VOCAB: usize = 50257;
pub const GPT2_EOT: u32 = 50256;

/// GPT-2's BPE, with ranks embedded in tiktoken-rs (offline, identical to OpenAI's tiktoken).
pub fn encoder() -> tiktoken_rs::CoreBPE {
    tiktoken_rs::r50k_base().expect("tiktoken-rs embeds the GPT-2 ranks")
}

/// nanoGPT's split: the byte index where the first `train_fraction` of the characters ends.
pub fn char_split(text: &str, train_fraction: f64) -> usize {
    let n_chars = text.chars().count();
    text.char_indices()
        .nth((n_chars as f64 * train_fraction) as usize)
        .map_or(text.len(), |(i, _)| i)
}

/// Prepares `text` into `dir` with a character split at `train_fraction`.
pub fn prepare_text(text: &str, source: &str, train_fraction: f64, dir: &Path) -> Result<Meta> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create data dir {}", dir.display()))?;
    let split = char_split(text, train_fraction);
    let enc = encoder();
    let dtype = TokenDtype::for_vocab(GPT2_VOCAB);
    let mut files = std::collections::BTreeMap::new();
    for (name, part) in [("train.bin", &text[..split]), ("val.bin", &text[split..])] {
        let tokens = enc.encode_ordinary(part);
        let mut w = TokenWriter::create(&dir.join(name), dtype)?;
        w.write(&tokens)?;
        files.insert(name.to_string(), w.finish()?);
    }
    let meta = Meta {
        tokenizer: "gpt2".into(),
        vocab_size: GPT2_VOCAB,
        eot_token: GPT2_EOT,
        dtype,
        files,
        sources: vec![serde_json::json!({
            "name": source,
            "bytes": text.len(),
            "sha256": lab_fsio::sha256_bytes(text.as_bytes()),
        })],
        filters: vec![serde_json::json!({
            "name": "char-split",
            "train_fraction": train_fraction,
        })],
        spans: Default::default(),
    };
    meta.save(dir)?;
    Ok(meta)
}

/// Makes sure `dir` holds the bundled tinyshakespeare corpus, GPT-2 tokenized with nanoGPT's
/// 90/10 split: reused when its meta.json names the same text, prepared otherwise.
pub fn ensure_tinyshakespeare(dir: &Path) -> Result<Meta> {
    let sha = lab_fsio::sha256_bytes(crate::TINYSHAKESPEARE.as_bytes());
    if let Ok(meta) = Meta::load(dir) {
        let same_text =
            meta.sources.first().and_then(|s| s.get("sha256")) == Some(&sha.clone().into());
        let complete = ["train.bin", "val.bin"]
            .iter()
            .all(|f| crate::TokenFile::open(dir, f, &meta).is_ok());
        if same_text && complete {
            return Ok(meta);
        }
    }
    prepare_text(
        crate::TINYSHAKESPEARE,
        "tinyshakespeare (bundled)",
        0.9,
        dir,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TokenFile;

    #[test]
    fn tinyshakespeare_gives_nanogpt_token_counts() {
        let dir = tempfile::tempdir().unwrap();
        let meta =
            prepare_text(crate::TINYSHAKESPEARE, "tinyshakespeare", 0.9, dir.path()).unwrap();
        assert_eq!(meta.file("train.bin").unwrap().tokens, 301_966);
        assert_eq!(meta.file("val.bin").unwrap().tokens, 36_059);
        let reloaded = Meta::load(dir.path()).unwrap();
        assert_eq!(reloaded, meta);
        let f = TokenFile::open(dir.path(), "train.bin", &meta).unwrap();
        let mut first = Vec::new();
        f.read_into(0, 4, &mut first).unwrap();
        // "First Citizen:" in GPT-2 BPE.
        assert_eq!(first, vec![5962, 22307, 25, 198]);
        assert_eq!(
            lab_fsio::sha256_file(&dir.path().join("train.bin")).unwrap(),
            meta.file("train.bin").unwrap().sha256
        );
    }

    #[test]
    fn truncated_file_and_bad_ids_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let meta = prepare_text("hello world, hello again", "t", 0.5, dir.path()).unwrap();
        let train = dir.path().join("train.bin");
        let bytes = std::fs::read(&train).unwrap();
        std::fs::write(&train, &bytes[..bytes.len() - 1]).unwrap();
        let e = TokenFile::open(dir.path(), "train.bin", &meta)
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("truncated"), "{e:#}");

        let mut small = meta.clone();
        small.vocab_size = 100;
        std::fs::write(&train, &bytes).unwrap();
        let f = TokenFile::open(dir.path(), "train.bin", &small).unwrap();
        let e = f.read_into(0, f.len(), &mut Vec::new()).unwrap_err();
        assert!(format!("{e:#}").contains(">= vocab_size 100"), "{e:#}");
    }
}
