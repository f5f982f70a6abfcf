//! `lab tokenizer train`: a byte-level BPE tokenizer (HF `tokenizers`, GPT-2 pre-tokenizer,
//! no prefix space) trained on a sample of the corpus that keeps each document type's share
//! of the bytes, with `<pad> <s> </s> <unk>` and clinical section headers as special tokens.
//!
//! Next to tokenizer.json it writes the same vocabulary as tiktoken ranks
//! (`tokenizer.tiktoken`), which `lab data prepare` encodes with through the fast encoder.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{bail, Result};
use base64::Engine;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, TokenizerBuilder};

use crate::clean::clean;
use crate::hash::{hash64, unit_interval};
use crate::reader::{discover, read_source, ReadOptions, Source};
use crate::report::ByType;

pub const BASE_SPECIALS: [&str; 4] = ["<pad>", "<s>", "</s>", "<unk>"];

#[derive(Debug, Clone)]
pub struct TrainConfig {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    pub read: ReadOptions,
    pub vocab_size: usize,
    pub min_frequency: u64,
    /// Extra special tokens (clinical section headers), one per line in a file.
    pub special_tokens: Vec<String>,
    /// Train on about this many bytes of text, sampled per document by a seeded hash so each
    /// type keeps its share (None: everything).
    pub sample_bytes: Option<u64>,
    pub seed: u64,
    pub progress: bool,
}

pub struct TrainOutcome {
    pub vocab_size: usize,
    pub sampled: ByType,
    pub corpus: ByType,
    pub tiktoken_ranks: PathBuf,
}

/// Reads special tokens from a file: one per line, `#` comments and blank lines ignored.
pub fn read_special_tokens(path: &Path) -> Result<Vec<String>> {
    crate::reader::read_line_list(path, "--special-tokens")
}

/// Streams the documents of `sources` (parsed, cleaned) to `f`, with their types.
fn for_each_doc(
    sources: &[Source],
    opts: &ReadOptions,
    mut f: impl FnMut(String, String) -> Result<()>,
) -> Result<()> {
    let bytes = Arc::new(AtomicU64::new(0));
    for (i, s) in sources.iter().enumerate() {
        read_source(i as u32, s, opts, &bytes, &mut |record| {
            if let Ok(doc) = record.parse(opts) {
                f(clean(&doc.text), doc.doc_type)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

pub fn train(cfg: &TrainConfig) -> Result<TrainOutcome> {
    // Values no corpus can make right are usage errors (exit 2), named by their flags.
    for (flag, zero) in [
        ("--sample-bytes", cfg.sample_bytes == Some(0)),
        ("--min-frequency", cfg.min_frequency == 0),
    ] {
        if zero {
            lab_config::bail_usage!("{flag} 0: give at least 1");
        }
    }
    if cfg.vocab_size < 256 + BASE_SPECIALS.len() + cfg.special_tokens.len() {
        lab_config::bail_usage!(
            "--vocab-size {}: a byte-level BPE needs at least 256 + the special tokens",
            cfg.vocab_size
        );
    }
    let sources = discover(&cfg.inputs)?;
    // Pass 1: bytes per type, to turn the sample budget into a keep probability.
    let mut corpus = ByType::default();
    for_each_doc(&sources, &cfg.read, |text, ty| {
        corpus.add(&ty, 0, text.len() as u64);
        Ok(())
    })?;
    let total = corpus.total().bytes;
    if total == 0 {
        bail!(
            "no text to train on in {:?}; check --text-field",
            cfg.inputs
        );
    }
    let keep = cfg
        .sample_bytes
        .map_or(1.0, |b| (b as f64 / total as f64).min(1.0));

    let mut specials: Vec<String> = BASE_SPECIALS.iter().map(|s| s.to_string()).collect();
    for s in &cfg.special_tokens {
        if !specials.contains(s) {
            specials.push(s.clone());
        }
    }
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(cfg.vocab_size)
        .min_frequency(cfg.min_frequency)
        .show_progress(cfg.progress)
        .special_tokens(
            specials
                .iter()
                .map(|s| AddedToken::from(s.clone(), true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        PostProcessorWrapper,
        ByteLevel,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(None)
    .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
    .with_post_processor(None)
    .with_decoder(Some(ByteLevel::new(false, true, true)))
    .build()
    .map_err(|e| anyhow::anyhow!("{e}"))?;

    // Pass 2: the sample, streamed into the trainer from a reader thread.
    let (tx, rx) = std::sync::mpsc::sync_channel::<String>(1024);
    let mut sampled = ByType::default();
    let seed = cfg.seed;
    std::thread::scope(|scope| -> Result<()> {
        let (sources, read, sampled) = (&sources, &cfg.read, &mut sampled);
        // `tx` moves into the reader: dropping it when reading ends is what ends training's
        // input stream.
        let reader = scope.spawn(move || {
            for_each_doc(sources, read, |text, ty| {
                if unit_interval(hash64(text.as_bytes(), seed)) < keep {
                    sampled.add(&ty, 0, text.len() as u64);
                    tx.send(text)
                        .map_err(|_| anyhow::anyhow!("training stopped"))?;
                }
                Ok(())
            })
        });
        let trained = tokenizer.train(&mut trainer, rx.into_iter());
        let read = reader.join().expect("reader thread panicked");
        trained.map_err(|e| anyhow::anyhow!("tokenizer training failed: {e}"))?;
        read
    })?;
    if let Some(dir) = cfg.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tiktoken_ranks = cfg.output.with_extension("tiktoken");
    if tiktoken_ranks == cfg.output {
        bail!(
            "--output {} would be overwritten by the .tiktoken ranks file; name it tokenizer.json",
            cfg.output.display()
        );
    }
    let json = tokenizer
        .to_string(true)
        .map_err(|e| anyhow::anyhow!("cannot serialize the tokenizer: {e}"))?;
    let fast = crate::tokenize::Tokenizer::from_json_str(&json, &cfg.output)?;

    // The same vocabulary as tiktoken ranks ("base64 rank" per line), written before
    // tokenizer.json: a run killed in between never pairs a new tokenizer with old ranks.
    let mut ranks = String::new();
    for (id, bytes) in fast.token_bytes().iter().enumerate() {
        if let Some(b) = bytes {
            if !specials.iter().any(|s| s.as_bytes() == b.as_slice()) {
                ranks.push_str(&format!(
                    "{} {id}\n",
                    base64::engine::general_purpose::STANDARD.encode(b)
                ));
            }
        }
    }
    lab_fsio::write_atomic(&tiktoken_ranks, ranks.as_bytes())?;
    lab_fsio::write_atomic(&cfg.output, json.as_bytes())?;
    Ok(TrainOutcome {
        vocab_size: fast.vocab_size(),
        sampled,
        corpus,
        tiktoken_ranks,
    })
}
