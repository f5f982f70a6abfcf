//! `lab data prepare`: corpus → read → clean → redact → tokenize → quality → dedup →
//! decontaminate → seeded val split → train.bin / val.bin / meta.json.
//!
//! A reader thread streams records in chunks of about `CHUNK_BYTES`; each chunk is processed
//! on the worker pool (parse, clean, redact, tokenize, signatures) and the decisions are then
//! taken in document order on one thread. Chunk boundaries depend only on the input, so the
//! output is byte-identical whatever `--workers` is.
//!
//! Restart safety: meta.json is removed first and written last, and the .bin files are
//! written under temporary names and renamed at the end; a killed prepare leaves no
//! meta.json (so the trainer refuses the directory) and the next run starts over cleanly.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use lab_data::{Meta, TokenDtype, TokenWriter};
use rayon::prelude::*;

use crate::clean::{clean, non_alnum_fraction};
use crate::decontam::EvalIndex;
use crate::dedup::{exact_key, DedupIndex, MinHasher, Signature, Verdict};
use crate::reader::{discover, read_source, ReadOptions, Record, Skip, Source, SourceStats};
use crate::redact::{Redaction, Redactor, Ymd};
use crate::report::{table, ByType, FilterReport};
use crate::split::is_val;
use crate::tokenize::Tokenizer;

const CHUNK_BYTES: usize = 8 << 20;
const CHUNK_RECORDS: usize = 16_384;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Split {
    /// Seeded document-level split: this fraction of documents goes to val.bin.
    ValFraction(f64),
    /// nanoGPT's shakespeare split: one document cut at this fraction of its characters.
    Chars { train_fraction: f64 },
}

#[derive(Debug, Clone)]
pub struct PrepareConfig {
    pub inputs: Vec<PathBuf>,
    pub output_dir: PathBuf,
    pub read: ReadOptions,
    /// `gpt2` or a tokenizer.json path.
    pub tokenizer: String,
    pub split: Split,
    pub seed: u64,
    pub workers: usize,
    pub clean: bool,
    pub min_tokens: Option<u64>,
    pub max_non_alnum: Option<f64>,
    pub dedup: bool,
    pub near_dup_threshold: f64,
    pub redact: bool,
    pub anchor_date: Option<Ymd>,
    pub decontaminate: Vec<PathBuf>,
    pub decontam_threshold: f64,
    pub progress: bool,
    /// Which stage of a prepare spread over many processes this is (`Stage::All`: one process
    /// does everything).
    pub stage: Stage,
}

/// The stages of a prepare spread over N processes or machines (datatrove's design): each
/// part processes every N-th unit of records and writes its tokens and MinHash signatures;
/// one dedup stage decides cross-part duplicates from the signatures alone; the finalize
/// stage applies the decisions and writes train.bin / val.bin / meta.json, byte-identical to
/// a single-process prepare of the same input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    All,
    Part { part: usize, of: usize },
    Dedup { of: usize },
    Finalize { of: usize },
}

impl PrepareConfig {
    pub fn new(inputs: Vec<PathBuf>, output_dir: PathBuf) -> Self {
        Self {
            inputs,
            output_dir,
            read: ReadOptions::default(),
            tokenizer: "gpt2".into(),
            split: Split::ValFraction(0.001),
            seed: 42,
            workers: 1,
            clean: false,
            min_tokens: None,
            max_non_alnum: None,
            dedup: false,
            near_dup_threshold: 0.8,
            redact: false,
            anchor_date: None,
            decontaminate: Vec::new(),
            decontam_threshold: 0.7,
            progress: false,
            stage: Stage::All,
        }
    }
}

pub struct PrepareOutcome {
    pub meta: Meta,
    /// The removal report as a table.
    pub report: String,
    pub text_bytes: u64,
    pub elapsed: Duration,
}

impl PrepareOutcome {
    pub fn mb_per_s(&self) -> f64 {
        self.text_bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// One record after the parallel stage.
pub(crate) struct Processed {
    /// The record's place in the input (all sources in order): decisions follow it.
    pub index: u64,
    pub doc_type: String,
    pub raw_bytes: u64,
    pub outcome: std::result::Result<Doc, Skip>,
}

pub(crate) struct Doc {
    pub tokens: Vec<u32>,
    /// Kept only for the character split.
    pub text: Option<String>,
    pub non_alnum: f64,
    pub exact: u128,
    pub signature: Option<Box<Signature>>,
    /// The eval item this document contains, if any (file, line).
    pub eval_hit: Option<(PathBuf, u64)>,
    pub redaction: Redaction,
    pub cleaned: bool,
    pub val: bool,
}

/// Everything the parallel stage needs, shared read-only by the workers.
pub(crate) struct Stages {
    pub cfg: PrepareConfig,
    pub tokenizer: Tokenizer,
    redactor: Option<Redactor>,
    minhash: Option<MinHasher>,
    eval: Option<EvalIndex>,
}

impl Stages {
    pub fn load(cfg: &PrepareConfig) -> Result<Self> {
        let eval = if cfg.decontaminate.is_empty() {
            None
        } else {
            Some(EvalIndex::load(&cfg.decontaminate, cfg.decontam_threshold)?)
        };
        Ok(Self {
            tokenizer: Tokenizer::load(&cfg.tokenizer)?,
            redactor: cfg.redact.then(|| Redactor::new(cfg.anchor_date)),
            minhash: cfg.dedup.then(|| MinHasher::new(cfg.seed)),
            eval,
            cfg: cfg.clone(),
        })
    }

    /// Only what finalize uses: the tokenizer (its name, vocabulary and end-of-text id). The
    /// filters ran in the parts.
    pub fn for_finalize(cfg: &PrepareConfig) -> Result<Self> {
        Ok(Self {
            tokenizer: Tokenizer::load(&cfg.tokenizer)?,
            redactor: None,
            minhash: None,
            eval: None,
            cfg: cfg.clone(),
        })
    }

    pub fn dtype(&self) -> TokenDtype {
        TokenDtype::for_vocab(self.tokenizer.vocab_size())
    }

    /// train.bin and val.bin, written under temporary names until `finish`.
    pub fn writers(&self, dir: &Path) -> Result<(TokenWriter, TokenWriter)> {
        Ok((
            TokenWriter::create(&dir.join("train.bin"), self.dtype())?,
            TokenWriter::create(&dir.join("val.bin"), self.dtype())?,
        ))
    }

    fn process(&self, index: u64, record: Record) -> Processed {
        let raw_bytes = record.len() as u64;
        let (text, doc_type) = match record.parse(&self.cfg.read) {
            Ok(d) => (d.text, d.doc_type),
            Err((skip, doc_type)) => {
                return Processed {
                    index,
                    doc_type,
                    raw_bytes,
                    outcome: Err(skip),
                }
            }
        };
        let mut cleaned = false;
        let text = if self.cfg.clean {
            let c = clean(&text);
            cleaned = c != text;
            c
        } else {
            text
        };
        let (text, redaction) = match &self.redactor {
            Some(r) => r.redact(&text),
            None => (text, Redaction::default()),
        };
        if text.trim().is_empty() {
            return Processed {
                index,
                doc_type,
                raw_bytes,
                outcome: Err(Skip::Empty),
            };
        }
        let tokens = self.tokenizer.encode(&text);
        let doc = Doc {
            non_alnum: if self.cfg.max_non_alnum.is_some() {
                non_alnum_fraction(&text)
            } else {
                0.0
            },
            exact: if self.cfg.dedup { exact_key(&text) } else { 0 },
            signature: self.minhash.as_ref().and_then(|m| m.signature(&text)),
            eval_hit: self.eval.as_ref().and_then(|e| {
                let (file, line) = e.contaminated(&e.doc_grams(&text))?;
                Some((file.to_path_buf(), line))
            }),
            val: match self.cfg.split {
                Split::ValFraction(f) => is_val(&text, self.cfg.seed, f),
                Split::Chars { .. } => false,
            },
            text: matches!(self.cfg.split, Split::Chars { .. }).then_some(text),
            tokens,
            redaction,
            cleaned,
        };
        Processed {
            index,
            doc_type,
            raw_bytes,
            outcome: Ok(doc),
        }
    }
}

/// How the dedup filter decides: by checking an index as documents come (one process), or
/// from the decisions of the dedup stage (finalize), by record index.
pub(crate) enum Dedup {
    Index(DedupIndex),
    Decided(std::collections::HashMap<u64, Verdict>),
}

impl Dedup {
    fn verdict(&mut self, index: u64, exact: u128, signature: Option<&Signature>) -> Verdict {
        match self {
            Dedup::Index(d) => d.check(exact, signature),
            Dedup::Decided(m) => m.get(&index).copied().unwrap_or(Verdict::Unique),
        }
    }
}

/// The filters in pipeline order, with what each removed.
pub(crate) struct Decisions {
    input: ByType,
    skips: Vec<(Skip, ByType)>,
    non_alnum: ByType,
    min_tokens: ByType,
    exact: ByType,
    near: ByType,
    decontam: ByType,
    decontam_examples: Vec<String>,
    kept: ByType,
    train: ByType,
    val: ByType,
    cleaned: ByType,
    redacted_docs: ByType,
    redacted: std::collections::BTreeMap<&'static str, u64>,
    truncated: ByType,
    dedup: Dedup,
    /// Per file, where each document type landed.
    spans: std::collections::BTreeMap<String, Vec<lab_data::Span>>,
}

/// A whole prepare (`Stage::All`) or the finalize stage of one spread over parts; the part
/// and dedup stages go through [`prepare_stage`].
pub fn prepare(cfg: PrepareConfig) -> Result<PrepareOutcome> {
    check_flags(&cfg)?;
    match cfg.stage {
        Stage::All => prepare_all(cfg),
        Stage::Finalize { of } => crate::parts::finalize(cfg, of),
        Stage::Part { .. } | Stage::Dedup { .. } => {
            bail!("the part and dedup stages write no token files: use prepare_stage")
        }
    }
}

/// The part or dedup stage of a prepare spread over parts: a one-line summary of what it wrote.
pub fn prepare_stage(cfg: PrepareConfig) -> Result<String> {
    check_flags(&cfg)?;
    match cfg.stage {
        Stage::Part { part, of } => crate::parts::write_part(cfg, part, of),
        Stage::Dedup { of } => crate::parts::dedup(cfg, of),
        Stage::All | Stage::Finalize { .. } => bail!("this stage writes token files: use prepare"),
    }
}

/// The whole pipeline in one process. A failed prepare leaves no output folder it made (one
/// it made holds nothing of the user's).
fn prepare_all(cfg: PrepareConfig) -> Result<PrepareOutcome> {
    let dir = cfg.output_dir.clone();
    let made = create_output_dir(&dir)?;
    let outcome = write_all(cfg);
    if outcome.is_err() && made {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

fn write_all(cfg: PrepareConfig) -> Result<PrepareOutcome> {
    let start = Instant::now();
    let stages = Stages::load(&cfg)?;
    let dir = &cfg.output_dir;
    start_over(dir)?;
    let (mut train, mut val) = stages.writers(dir)?;
    let mut d = Decisions::new(Dedup::Index(DedupIndex::new(cfg.near_dup_threshold)));
    let mut char_split_docs: Vec<(String, String)> = Vec::new();
    let input = read_and_process(&stages, None, start, &mut |p| {
        decide(
            &stages,
            &mut d,
            p,
            &mut train,
            &mut val,
            &mut char_split_docs,
        )
    })?;
    if let Split::Chars { train_fraction } = cfg.split {
        write_char_split(
            &stages.tokenizer,
            &char_split_docs,
            train_fraction,
            &mut train,
            &mut val,
            &mut d,
        )?;
    }
    let sources = input.sources_json();
    finish(&stages, d, train, val, sources, input.text_bytes, start)
}

/// Creates the output folder; true when this call made it, as the `mkdir` itself says (a
/// path's text can name an existing folder another way: `new/../data`).
pub(crate) fn create_output_dir(dir: &Path) -> Result<bool> {
    let cannot = || format!("--output-dir {}: cannot create it", dir.display());
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(cannot)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(false),
        Err(e) => Err(e).with_context(cannot),
    }
}

/// What reading the inputs found: the sources, their stats and the bytes of text.
pub(crate) struct Input {
    pub sources: Vec<Source>,
    pub stats: Vec<SourceStats>,
    pub text_bytes: u64,
}

impl Input {
    pub fn sources_json(&self) -> Vec<serde_json::Value> {
        self.sources
            .iter()
            .zip(&self.stats)
            .map(|(s, st)| source_json(s, st))
            .collect()
    }
}

/// Reads every source in a reader thread and processes its records in chunks on the worker
/// pool; `sink` takes the processed records in input order. With `part = (i, n)` only the
/// records of part `i` of `n` are processed (every source is still read and hashed).
pub(crate) fn read_and_process(
    stages: &Stages,
    part: Option<(usize, usize)>,
    start: Instant,
    sink: &mut dyn FnMut(Processed) -> Result<()>,
) -> Result<Input> {
    let cfg = &stages.cfg;
    let sources = discover(&cfg.inputs)?;
    let total_bytes: u64 = sources.iter().map(|s| s.bytes).sum();
    let bar = progress_bar(total_bytes, cfg.progress);
    let bytes_read = Arc::new(AtomicU64::new(0));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.workers.max(1))
        .build()?;
    let (mut text_bytes, mut kept) = (0u64, 0u64);
    let (tx, rx) = sync_channel::<Vec<(u64, Record)>>(2);
    let stats = std::thread::scope(|scope| -> Result<Vec<SourceStats>> {
        // Owned here: an early return drops it, which stops the reader instead of blocking it.
        let rx = rx;
        let reader = {
            let (sources, opts, bytes_read) = (&sources, &cfg.read, bytes_read.clone());
            scope.spawn(move || read_all(sources, opts, part, &bytes_read, tx))
        };
        for chunk in rx.iter() {
            let processed: Vec<Processed> = pool.install(|| {
                chunk
                    .into_par_iter()
                    .map(|(i, r)| stages.process(i, r))
                    .collect()
            });
            for p in processed {
                text_bytes += p.raw_bytes;
                kept += p.outcome.is_ok() as u64;
                sink(p)?;
            }
            bar.set_position(bytes_read.load(Ordering::Relaxed));
            let secs = start.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "{kept} docs, text {:.1} MB/s",
                text_bytes as f64 / 1e6 / secs
            ));
        }
        // The reader stops early (dropping the channel) only on error: report that error.
        reader.join().expect("reader thread panicked")
    })?;
    bar.finish_and_clear();
    Ok(Input {
        sources,
        stats,
        text_bytes,
    })
}

/// Closes the token files and writes meta.json: the end of a prepare (single or finalize).
pub(crate) fn finish(
    stages: &Stages,
    mut d: Decisions,
    train: TokenWriter,
    val: TokenWriter,
    sources: Vec<serde_json::Value>,
    text_bytes: u64,
    start: Instant,
) -> Result<PrepareOutcome> {
    let cfg = &stages.cfg;
    let report = removal_reports(cfg, &d);
    let kept = d.kept.total();
    if d.train.total().tokens == 0 && kept.docs > 0 {
        bail!(
            "no training tokens: the {} document(s) kept all went to val.bin; {}",
            kept.docs,
            split_advice(&cfg.split, kept.docs, "lower")
        );
    }
    if d.train.total().tokens == 0 {
        bail!(
            "no training tokens: {} of {} documents were removed or skipped ({}); check --text-field, --max-doc-bytes and the filters",
            d.input.total().docs - kept.docs,
            d.input.total().docs,
            report
                .iter()
                .filter(|f| f.removed.total().docs > 0)
                .map(|f| format!("{} {}", f.name, f.removed.total().docs))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if d.val.total().tokens == 0 {
        bail!(
            "val.bin would be empty ({} document(s) kept); {}",
            kept.docs,
            split_advice(&cfg.split, kept.docs, "raise")
        );
    }
    unmark_complete(&cfg.output_dir)?;
    keep_tokenizer_beside(&cfg.tokenizer, &cfg.output_dir)?;
    let mut files = std::collections::BTreeMap::new();
    files.insert("train.bin".to_string(), train.finish()?);
    files.insert("val.bin".to_string(), val.finish()?);
    let meta = Meta {
        tokenizer: stages.tokenizer.name().to_string(),
        vocab_size: stages.tokenizer.vocab_size(),
        eot_token: stages.tokenizer.eot(),
        dtype: stages.dtype(),
        files,
        sources,
        filters: filters_json(cfg, &d, &report),
        spans: std::mem::take(&mut d.spans),
    };
    meta.save(&cfg.output_dir)?;
    Ok(PrepareOutcome {
        meta,
        report: table(&d.input, &report, &d.kept),
        text_bytes,
        elapsed: start.elapsed(),
    })
}

/// The flags' values, each error naming its flag: the CLI reports them as usage errors.
pub fn check_flags(cfg: &PrepareConfig) -> Result<()> {
    match cfg.split {
        Split::ValFraction(f) if !(0.0..1.0).contains(&f) || f == 0.0 => {
            bail!("--val-fraction {f}: must be in (0, 1)")
        }
        Split::Chars { train_fraction: f } if !(0.0..1.0).contains(&f) || f == 0.0 => {
            bail!("--split chars:{f}: the train fraction must be in (0, 1)")
        }
        _ => {}
    }
    if cfg.workers == 0 {
        bail!("--workers 0: need at least one worker");
    }
    match cfg.stage {
        Stage::Part { part, of } if of == 0 || part >= of => {
            bail!("--part {part} --of {of}: parts are numbered 0 to N-1 of N ≥ 1")
        }
        Stage::Dedup { of: 0 } | Stage::Finalize { of: 0 } => {
            bail!("--of 0: need at least one part")
        }
        Stage::All => {}
        _ if matches!(cfg.split, Split::Chars { .. }) => {
            bail!("--split chars cuts one document: prepare it in one process (no --stage)")
        }
        _ => {}
    }
    let t = cfg.near_dup_threshold;
    if t.is_nan() || t <= 0.0 || t > 1.0 {
        bail!("--near-dup-threshold {t}: a Jaccard similarity must be in (0, 1]");
    }
    if let Some(m) = cfg
        .max_non_alnum
        .filter(|m| m.is_nan() || !(0.0..=1.0).contains(m))
    {
        bail!("--max-non-alnum {m}: a fraction must be in [0, 1]");
    }
    Ok(())
}

impl Decisions {
    pub fn new(dedup: Dedup) -> Self {
        Self {
            input: ByType::default(),
            skips: Skip::ALL.iter().map(|s| (*s, ByType::default())).collect(),
            non_alnum: ByType::default(),
            min_tokens: ByType::default(),
            exact: ByType::default(),
            near: ByType::default(),
            decontam: ByType::default(),
            decontam_examples: Vec::new(),
            kept: ByType::default(),
            train: ByType::default(),
            val: ByType::default(),
            cleaned: ByType::default(),
            redacted_docs: ByType::default(),
            redacted: Default::default(),
            truncated: ByType::default(),
            dedup,
            spans: Default::default(),
        }
    }
}

/// The per-document filter before dedup that removes a document, if one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EarlyRemoval {
    NonAlnum,
    MinTokens,
}

/// Which filter before dedup removes a document of `n_tokens` tokens and that share of
/// non-alphanumeric characters (a NaN share passes): `decide` counts it, and the parts'
/// dedup stage skips documents that never reach dedup.
pub(crate) fn early_removal(
    cfg: &PrepareConfig,
    n_tokens: u64,
    non_alnum: f64,
) -> Option<EarlyRemoval> {
    if cfg.max_non_alnum.is_some_and(|max| non_alnum > max) {
        Some(EarlyRemoval::NonAlnum)
    } else if cfg.min_tokens.is_some_and(|min| n_tokens < min) {
        Some(EarlyRemoval::MinTokens)
    } else {
        None
    }
}

/// Removes temp files left by a killed run. The folder's meta.json stays until new token
/// files replace the old ones ([`unmark_complete`]): a prepare that fails on its input leaves
/// the data it found as it was.
pub(crate) fn start_over(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if [".train.bin.tmp-", ".val.bin.tmp-", ".meta.json.tmp-"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            let _ = std::fs::remove_file(dir.join(&name));
        }
    }
    Ok(())
}

/// Removes meta.json: without it no trainer reads the folder, which is incomplete until the
/// new one is written.
pub(crate) fn unmark_complete(dir: &Path) -> Result<()> {
    let meta = dir.join("meta.json");
    if meta.exists() {
        std::fs::remove_file(&meta).with_context(|| format!("cannot remove {}", meta.display()))?;
    }
    Ok(())
}

/// What to change when one side of the split came out empty: a document split cannot
/// divide a single document (a plain .txt file is one), a character split can.
fn split_advice(split: &Split, kept_docs: u64, direction: &str) -> String {
    match split {
        Split::ValFraction(_) if kept_docs < 2 => {
            "one document cannot be split by documents: cut its text with --split chars:0.9".into()
        }
        Split::ValFraction(f) => format!("{direction} --val-fraction (now {f})"),
        Split::Chars { train_fraction } => {
            format!("change --split chars:{train_fraction} (the train fraction)")
        }
    }
}

/// A tokenizer file is copied beside the meta.json that names it: the folder then carries
/// what decodes its tokens wherever it moves and wherever a later command runs
/// ([`Tokenizer::of_data`] looks there).
fn keep_tokenizer_beside(spec: &str, dir: &Path) -> Result<()> {
    let from = Path::new(spec);
    let Some(name) = from
        .file_name()
        .filter(|_| !matches!(spec, "gpt2" | "r50k_base"))
    else {
        return Ok(());
    };
    let to = dir.join(name);
    let same = |a: &Path, b: &Path| std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok();
    if ["meta.json", "train.bin", "val.bin"]
        .iter()
        .any(|f| name == *f)
        || same(from, &to)
    {
        return Ok(());
    }
    let bytes = std::fs::read(from).with_context(|| format!("cannot read tokenizer {spec}"))?;
    lab_fsio::write_atomic(&to, &bytes)
}

/// Records per unit of work of a part: part `i` of `n` takes units `i`, `i + n`, `i + 2n` …
pub const PART_UNIT: u64 = 1024;

fn read_all(
    sources: &[Source],
    opts: &ReadOptions,
    part: Option<(usize, usize)>,
    bytes_read: &Arc<AtomicU64>,
    tx: std::sync::mpsc::SyncSender<Vec<(u64, Record)>>,
) -> Result<Vec<SourceStats>> {
    let mut chunk = Vec::new();
    let mut chunk_bytes = 0usize;
    let mut stats = Vec::new();
    let mut index = 0u64;
    for (i, source) in sources.iter().enumerate() {
        let st = read_source(i as u32, source, opts, bytes_read, &mut |record| {
            let this = index;
            index += 1;
            if part.is_some_and(|(p, n)| (this / PART_UNIT) % n as u64 != p as u64) {
                return Ok(());
            }
            chunk_bytes += record.len();
            chunk.push((this, record));
            if chunk_bytes >= CHUNK_BYTES || chunk.len() >= CHUNK_RECORDS {
                chunk_bytes = 0;
                // The consumer only hangs up after an error of its own, reported by it.
                tx.send(std::mem::take(&mut chunk))
                    .map_err(|_| anyhow::anyhow!("prepare stopped"))?;
            }
            Ok(())
        })?;
        stats.push(st);
    }
    if !chunk.is_empty() {
        let _ = tx.send(chunk);
    }
    Ok(stats)
}

pub(crate) fn decide(
    stages: &Stages,
    d: &mut Decisions,
    p: Processed,
    train: &mut TokenWriter,
    val: &mut TokenWriter,
    char_split_docs: &mut Vec<(String, String)>,
) -> Result<()> {
    let cfg = &stages.cfg;
    let ty = p.doc_type.as_str();
    let doc = match p.outcome {
        Err(skip) => {
            d.input.add(ty, 0, p.raw_bytes);
            let slot = d.skips.iter_mut().find(|(s, _)| *s == skip).unwrap();
            slot.1.add(ty, 0, p.raw_bytes);
            return Ok(());
        }
        Ok(doc) => doc,
    };
    let n = doc.tokens.len() as u64;
    let b = p.raw_bytes;
    d.input.add(ty, n, b);
    if doc.cleaned {
        d.cleaned.add(ty, n, b);
    }
    if !doc.redaction.replaced.is_empty() {
        d.redacted_docs.add(ty, n, b);
        for (k, v) in &doc.redaction.replaced {
            *d.redacted.entry(k).or_default() += v;
        }
    }
    if doc.redaction.truncated_bytes > 0 {
        d.truncated.add(ty, n, b);
    }
    match early_removal(cfg, n, doc.non_alnum) {
        Some(EarlyRemoval::NonAlnum) => {
            d.non_alnum.add(ty, n, b);
            return Ok(());
        }
        Some(EarlyRemoval::MinTokens) => {
            d.min_tokens.add(ty, n, b);
            return Ok(());
        }
        None => {}
    }
    if cfg.dedup {
        match d
            .dedup
            .verdict(p.index, doc.exact, doc.signature.as_deref())
        {
            Verdict::ExactDuplicate => {
                d.exact.add(ty, n, b);
                return Ok(());
            }
            Verdict::NearDuplicate => {
                d.near.add(ty, n, b);
                return Ok(());
            }
            Verdict::Unique => {}
        }
    }
    if let Some((file, line)) = &doc.eval_hit {
        d.decontam.add(ty, n, b);
        if d.decontam_examples.len() < 20 {
            d.decontam_examples
                .push(format!("{}:{line}", file.display()));
        }
        return Ok(());
    }
    d.kept.add(ty, n, b);
    match cfg.split {
        Split::Chars { .. } => {
            char_split_docs.push((doc.text.expect("kept for the char split"), p.doc_type));
        }
        Split::ValFraction(_) => {
            let (writer, counts, file) = if doc.val {
                (val, &mut d.val, "val.bin")
            } else {
                (train, &mut d.train, "train.bin")
            };
            let start = writer.tokens();
            writer.write(&doc.tokens)?;
            writer.write(&[stages.tokenizer.eot()])?;
            counts.add(ty, n + 1, b);
            let spans = d.spans.entry(file.to_string()).or_default();
            lab_data::meta::push_span(spans, ty, start, writer.tokens());
        }
    }
    Ok(())
}

/// nanoGPT's shakespeare_char/shakespeare prepare: the first `train_fraction` of the
/// characters to train, the rest to val, no end-of-text tokens.
fn write_char_split(
    tokenizer: &Tokenizer,
    docs: &[(String, String)],
    train_fraction: f64,
    train: &mut TokenWriter,
    val: &mut TokenWriter,
    d: &mut Decisions,
) -> Result<()> {
    let [(text, ty)] = docs else {
        bail!(
            "--split chars needs exactly one document (a plain-text file), got {}; use --val-fraction for document corpora",
            docs.len()
        );
    };
    let cut = lab_data::gpt2::char_split(text, train_fraction);
    let (a, b) = (
        tokenizer.encode(&text[..cut]),
        tokenizer.encode(&text[cut..]),
    );
    train.write(&a)?;
    val.write(&b)?;
    d.train.add(ty, a.len() as u64, cut as u64);
    d.val.add(ty, b.len() as u64, (text.len() - cut) as u64);
    for (file, n) in [("train.bin", a.len()), ("val.bin", b.len())] {
        let spans = d.spans.entry(file.to_string()).or_default();
        lab_data::meta::push_span(spans, ty, 0, n as u64);
    }
    Ok(())
}

fn removal_reports(cfg: &PrepareConfig, d: &Decisions) -> Vec<FilterReport> {
    let mut out = Vec::new();
    for (skip, by) in &d.skips {
        if by.total().docs > 0 {
            out.push(FilterReport {
                name: skip.name().into(),
                settings: serde_json::json!({"max_doc_bytes": cfg.read.max_doc_bytes}),
                removed: by.clone(),
            });
        }
    }
    let mut push = |on: bool, name: &str, settings: serde_json::Value, by: &ByType| {
        if on {
            out.push(FilterReport {
                name: name.into(),
                settings,
                removed: by.clone(),
            });
        }
    };
    push(
        cfg.max_non_alnum.is_some(),
        "quality-non-alnum",
        serde_json::json!({"max_fraction": cfg.max_non_alnum}),
        &d.non_alnum,
    );
    push(
        cfg.min_tokens.is_some(),
        "quality-min-tokens",
        serde_json::json!({"min_tokens": cfg.min_tokens}),
        &d.min_tokens,
    );
    push(
        cfg.dedup,
        "dedup-exact",
        serde_json::json!({"hash": "xxh3-128"}),
        &d.exact,
    );
    push(
        cfg.dedup,
        "dedup-near",
        serde_json::json!({
            "method": "minhash-lsh", "jaccard": cfg.near_dup_threshold,
            "shingle_words": crate::dedup::SHINGLE_WORDS, "permutations": crate::dedup::NUM_PERM,
            "bands": crate::dedup::BANDS, "seed": cfg.seed,
        }),
        &d.near,
    );
    push(
        !cfg.decontaminate.is_empty(),
        "decontaminate",
        serde_json::json!({
            "eval_sets": cfg.decontaminate.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "ngram": crate::decontam::NGRAM, "min_overlap": cfg.decontam_threshold,
            "examples": d.decontam_examples,
        }),
        &d.decontam,
    );
    out
}

fn by_type_json(by: &ByType) -> serde_json::Value {
    serde_json::to_value(&by.0).expect("counts serialise")
}

fn filters_json(
    cfg: &PrepareConfig,
    d: &Decisions,
    reports: &[FilterReport],
) -> Vec<serde_json::Value> {
    let mut out = vec![serde_json::json!({
        "name": "read",
        "text_field": cfg.read.text_field,
        "type_field": cfg.read.type_field,
        "input_by_type": by_type_json(&d.input),
    })];
    if cfg.clean {
        out.push(serde_json::json!({
            "name": "clean",
            "steps": ["nfc", "drop-control-chars", "collapse-whitespace", "collapse-blank-lines"],
            "changed_by_type": by_type_json(&d.cleaned),
        }));
    }
    if cfg.redact {
        out.push(serde_json::json!({
            "name": "redact-phi",
            "anchor_date": cfg.anchor_date.map(|(y, m, dd)| format!("{y:04}-{m:02}-{dd:02}")),
            "replaced": d.redacted,
            "changed_by_type": by_type_json(&d.redacted_docs),
            "truncated_after_anchor_by_type": by_type_json(&d.truncated),
        }));
    }
    out.extend(reports.iter().map(FilterReport::to_json));
    out.push(match cfg.split {
        Split::ValFraction(f) => serde_json::json!({
            "name": "split", "mode": "documents", "val_fraction": f, "seed": cfg.seed,
            "eot_after_each_document": true,
            "train_by_type": by_type_json(&d.train), "val_by_type": by_type_json(&d.val),
        }),
        Split::Chars { train_fraction } => serde_json::json!({
            "name": "split", "mode": "chars", "train_fraction": train_fraction,
        }),
    });
    out
}

fn source_json(s: &Source, st: &SourceStats) -> serde_json::Value {
    serde_json::json!({
        "path": s.path.display().to_string(),
        "format": format!("{:?}{}", s.format, if s.zstd { "+zstd" } else { "" }).to_lowercase(),
        "bytes": s.bytes,
        "sha256": st.sha256,
        "records": st.records,
    })
}

fn progress_bar(total: u64, show: bool) -> ProgressBar {
    lab_plot::progress_bar(
        "prepare",
        "{bytes}/{total_bytes} {bytes_per_sec}",
        total,
        show,
    )
}
