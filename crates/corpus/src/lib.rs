//! lab-corpus: from raw corpora to nanoGPT token files.
//!
//! `reader` streams documents out of text, JSONL, JSONL+zstd and parquet files; `clean`,
//! `redact` (with `deid_probe`, its Safe Harbor probe), `dedup` and `decontam` are the filter stages; `tokenize` encodes (GPT-2 BPE or a
//! trained tokenizer.json) and `prepare` runs the whole pipeline in parallel, deterministically,
//! into `train.bin` / `val.bin` / `meta.json`. `shards` plans multi-node data sharding,
//! `bpe_train` trains a byte-level BPE tokenizer and `fertility` compares tokenizers.

pub mod bpe_train;
pub mod chart;
pub mod clean;
pub mod decontam;
pub mod dedup;
pub mod deid_probe;
pub mod fertility;
pub mod hash;
pub mod hf_tokenizer;
pub mod parts;
pub mod prepare;
pub mod reader;
pub mod redact;
pub mod report;
pub mod shards;
pub mod split;
pub mod tokenize;

/// MedQuAD answers (CC BY 4.0), zstd-compressed JSONL; see corpora/README.md.
pub const MEDQUAD_ZST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/corpora/medquad.jsonl.zst");
/// MMLU medical test questions (MIT), JSONL; see corpora/README.md.
pub const MMLU_MEDICAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/corpora/mmlu-medical.jsonl");
/// tinyshakespeare (public domain), shipped by lab-data.
pub const TINYSHAKESPEARE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/corpora/tinyshakespeare.txt"
);
