//! A prepare spread over N processes or machines, in datatrove's three stages:
//!
//! 1. **part** (`--stage part --part I --of N`, any number at once): the records of part I
//!    (every N-th unit of [`PART_UNIT`] records) are cleaned, redacted, tokenized and signed;
//!    `parts/part-I-of-N/` gets each record's outcome (`docs.jsonl`), its tokens (`tokens.bin`)
//!    and its MinHash signature (`signatures.bin`), then `manifest.json` last.
//! 2. **dedup** (`--stage dedup --of N`, one process): reads only the outcomes and signatures
//!    in input order and writes `parts/dedup.json`, the records that duplicate an earlier one.
//! 3. **finalize** (`--stage finalize --of N`, one process): merges the parts in input order,
//!    applies the decisions and writes train.bin / val.bin / meta.json: the same bytes as a
//!    single-process prepare, because every decision is taken on the same records in the same
//!    order.
//!
//! Every stage is run with the same flags; a part made with other settings is refused.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::dedup::{DedupIndex, Signature, Verdict, NUM_PERM};
use crate::prepare::{
    create_output_dir, decide, early_removal, finish, read_and_process, start_over, Decisions,
    Dedup, Doc, PrepareConfig, PrepareOutcome, Processed, Stage, Stages,
};
use crate::reader::Skip;
use crate::redact::{Phi, Redaction};

pub use crate::prepare::PART_UNIT;

fn part_dir(out: &Path, part: usize, of: usize) -> PathBuf {
    out.join("parts").join(format!("part-{part:04}-of-{of:04}"))
}

fn dedup_file(out: &Path) -> PathBuf {
    out.join("parts").join("dedup.json")
}

/// What every stage must share: the whole config but where it runs and how fast (its Debug
/// form names every field, so a new setting joins the fingerprint by itself), the contents of
/// the files it names (a retrained tokenizer at the same path is another config), the unit
/// of work and the build.
fn fingerprint(cfg: &PrepareConfig) -> Result<String> {
    let mut c = cfg.clone();
    (c.stage, c.workers, c.progress) = (Stage::All, 1, false);
    let mut h = Sha256::new();
    h.update(format!("{c:?} unit={PART_UNIT} lab={}", env!("CARGO_PKG_VERSION")).as_bytes());
    let tokenizer = Path::new(&cfg.tokenizer);
    for file in cfg
        .decontaminate
        .iter()
        .map(PathBuf::as_path)
        .chain(Some(tokenizer).filter(|p| p.is_file()))
    {
        h.update(lab_fsio::sha256_file(file)?.as_bytes());
    }
    Ok(hex::encode(h.finalize()))
}

/// sha256 of the parts' manifests: what a dedup decision was computed from.
fn manifests_sha256(manifests: &[Value]) -> String {
    hex::encode(Sha256::digest(
        Value::from(manifests.to_vec()).to_string().as_bytes(),
    ))
}

/// Stage 1: processes part `part` of `of` into `parts/part-I-of-N/`.
pub fn write_part(cfg: PrepareConfig, part: usize, of: usize) -> Result<String> {
    let start = Instant::now();
    let stages = Stages::load(&cfg)?;
    create_output_dir(&cfg.output_dir)?;
    // Old token files and meta.json stay until finalize replaces them (`finish`).
    start_over(&cfg.output_dir)?;
    let dir = part_dir(&cfg.output_dir, part, of);
    let tmp = dir.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut writer = PartWriter::create(&tmp)?;
    let input = read_and_process(&stages, Some((part, of)), start, &mut |p| writer.write(&p))?;
    let records = writer.finish()?;
    let manifest = json!({
        "part": part, "of": of, "fingerprint": fingerprint(&cfg)?,
        "sources": input.sources_json(), "text_bytes": input.text_bytes, "records": records,
    });
    lab_fsio::write_atomic(&tmp.join("manifest.json"), manifest.to_string().as_bytes())?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).with_context(|| format!("cannot rename to {}", dir.display()))?;
    Ok(format!(
        "part {part} of {of}: {records} records, {:.1} MB of text → {}",
        input.text_bytes as f64 / 1e6,
        dir.display()
    ))
}

/// Stage 2: decides cross-part duplicates from the parts' outcomes and signatures.
pub fn dedup(cfg: PrepareConfig, of: usize) -> Result<String> {
    let manifests = manifests(&cfg, of)?;
    let mut index = DedupIndex::new(cfg.near_dup_threshold);
    let mut removed = Vec::new();
    let mut checked = 0u64;
    if cfg.dedup {
        for record in merged(&cfg.output_dir, of, false)? {
            let (p, n_tokens) = record?;
            let Ok(doc) = &p.outcome else { continue };
            if early_removal(&cfg, n_tokens, doc.non_alnum).is_some() {
                continue;
            }
            checked += 1;
            match index.check(doc.exact, doc.signature.as_deref()) {
                Verdict::Unique => {}
                v => removed.push(json!([p.index, verdict_name(v)])),
            }
        }
    }
    let decisions = json!({
        "fingerprint": manifests[0]["fingerprint"], "of": of,
        "manifests_sha256": manifests_sha256(&manifests), "removed": removed,
    });
    let path = dedup_file(&cfg.output_dir);
    lab_fsio::write_atomic(&path, decisions.to_string().as_bytes())?;
    Ok(format!(
        "dedup over {of} parts: {checked} documents checked, {} duplicates → {}",
        removed.len(),
        path.display()
    ))
}

/// Stage 3: merges the parts, applies the dedup decisions and writes the token files.
pub fn finalize(cfg: PrepareConfig, of: usize) -> Result<PrepareOutcome> {
    let start = Instant::now();
    let manifests = manifests(&cfg, of)?;
    let decided = load_decisions(&cfg, of, &manifests)?;
    let records: u64 = manifests
        .iter()
        .map(|m| m["records"].as_u64().unwrap_or(0))
        .sum();
    let stages = Stages::for_finalize(&cfg)?;
    let dir = &cfg.output_dir;
    start_over(dir)?;
    let (mut train, mut val) = stages.writers(dir)?;
    let mut d = Decisions::new(Dedup::Decided(decided));
    let mut unused = Vec::new();
    // Every record of the input once, in order: a part from another input, or a part file
    // cut short, shows as a gap.
    let mut expected = 0u64;
    for record in merged(dir, of, true)? {
        let p = record?.0;
        if p.index != expected {
            bail!(
                "the parts in {} skip or repeat record {expected}: rerun the part stage",
                dir.display()
            );
        }
        expected += 1;
        decide(&stages, &mut d, p, &mut train, &mut val, &mut unused)?;
    }
    if expected != records {
        bail!("the parts hold {expected} of {records} records: rerun the part stage");
    }
    let sources = manifests[0]["sources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let text_bytes = manifests
        .iter()
        .map(|m| m["text_bytes"].as_u64().unwrap_or(0))
        .sum();
    finish(&stages, d, train, val, sources, text_bytes, start)
}

/// The parts' manifests, checked: all present, made with these settings, of the same input.
fn manifests(cfg: &PrepareConfig, of: usize) -> Result<Vec<Value>> {
    let want = fingerprint(cfg)?;
    let mut out: Vec<Value> = Vec::with_capacity(of);
    for part in 0..of {
        let path = part_dir(&cfg.output_dir, part, of).join("manifest.json");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{}: part {part} of {of} is missing or unfinished; run `lab data prepare … --stage part --part {part} --of {of}` first",
                path.display()
            )
        })?;
        let m: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        if m["fingerprint"] != want.as_str() {
            bail!(
                "{}: part {part} was made with other flags; run every stage with the same flags",
                path.display()
            );
        }
        if out
            .first()
            .is_some_and(|first| first["sources"] != m["sources"])
        {
            bail!(
                "{}: part {part} read other input files than part 0",
                path.display()
            );
        }
        out.push(m);
    }
    Ok(out)
}

fn load_decisions(
    cfg: &PrepareConfig,
    of: usize,
    manifests: &[Value],
) -> Result<HashMap<u64, Verdict>> {
    let path = dedup_file(&cfg.output_dir);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: no dedup decisions; run `lab data prepare … --stage dedup --of {of}` first",
            path.display()
        )
    })?;
    let v: Value = serde_json::from_str(&text)?;
    // The manifests were checked against this config's fingerprint.
    if v["fingerprint"] != manifests[0]["fingerprint"]
        || v["of"] != of
        || v["manifests_sha256"] != manifests_sha256(manifests).as_str()
    {
        bail!(
            "{}: made for other flags, another --of or parts since rerun; rerun the dedup stage",
            path.display()
        );
    }
    let mut out = HashMap::new();
    for r in v["removed"].as_array().into_iter().flatten() {
        let verdict = match r[1].as_str() {
            Some("exact") => Verdict::ExactDuplicate,
            _ => Verdict::NearDuplicate,
        };
        out.insert(r[0].as_u64().unwrap_or(u64::MAX), verdict);
    }
    Ok(out)
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::ExactDuplicate => "exact",
        _ => "near",
    }
}

/// Writes one part: a JSON line per record, its tokens and its signature in binary.
struct PartWriter {
    docs: BufWriter<File>,
    tokens: BufWriter<File>,
    signatures: BufWriter<File>,
    records: u64,
}

impl PartWriter {
    fn create(dir: &Path) -> Result<Self> {
        let open = |name: &str| -> Result<BufWriter<File>> {
            let path = dir.join(name);
            Ok(BufWriter::new(File::create(&path).with_context(|| {
                format!("cannot create {}", path.display())
            })?))
        };
        Ok(Self {
            docs: open("docs.jsonl")?,
            tokens: open("tokens.bin")?,
            signatures: open("signatures.bin")?,
            records: 0,
        })
    }

    fn write(&mut self, p: &Processed) -> Result<()> {
        let mut line = json!({"i": p.index, "type": p.doc_type, "bytes": p.raw_bytes});
        match &p.outcome {
            Err(skip) => line["skip"] = json!(skip.name()),
            Ok(doc) => {
                line["doc"] = doc_json(doc);
                for t in &doc.tokens {
                    self.tokens.write_all(&t.to_le_bytes())?;
                }
                for h in doc.signature.iter().flat_map(|s| s.iter()) {
                    self.signatures.write_all(&h.to_le_bytes())?;
                }
            }
        }
        writeln!(self.docs, "{line}")?;
        self.records += 1;
        Ok(())
    }

    /// Flushes and syncs the files; the record count.
    fn finish(self) -> Result<u64> {
        for w in [self.docs, self.tokens, self.signatures] {
            let file = w.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
        }
        Ok(self.records)
    }
}

fn doc_json(doc: &Doc) -> Value {
    json!({
        "tokens": doc.tokens.len(), "non_alnum": doc.non_alnum,
        "exact": format!("{:032x}", doc.exact), "signed": doc.signature.is_some(),
        "val": doc.val, "eval": doc.eval_hit.as_ref().map(|(f, l)| json!([f, l])),
        "replaced": doc.redaction.replaced, "truncated": doc.redaction.truncated_bytes,
        "cleaned": doc.cleaned,
    })
}

/// Reads one part back, record by record, in input order.
struct PartReader {
    docs: std::io::Lines<BufReader<File>>,
    tokens: Option<BufReader<File>>,
    signatures: BufReader<File>,
}

impl PartReader {
    fn open(dir: &Path, with_tokens: bool) -> Result<Self> {
        let open = |name: &str| -> Result<BufReader<File>> {
            let path = dir.join(name);
            Ok(BufReader::new(File::open(&path).with_context(|| {
                format!("cannot open {}", path.display())
            })?))
        };
        Ok(Self {
            docs: open("docs.jsonl")?.lines(),
            tokens: if with_tokens {
                Some(open("tokens.bin")?)
            } else {
                None
            },
            signatures: open("signatures.bin")?,
        })
    }

    /// The next record and its token count.
    fn next_record(&mut self) -> Option<Result<(Processed, u64)>> {
        let line = self.docs.next()?;
        Some(line.map_err(Into::into).and_then(|l| self.parse(&l)))
    }

    fn parse(&mut self, line: &str) -> Result<(Processed, u64)> {
        let v: Value = serde_json::from_str(line).context("a part's docs.jsonl is corrupt")?;
        let n_tokens = v["doc"]["tokens"].as_u64().unwrap_or(0);
        let outcome = match v["skip"].as_str() {
            Some(name) => Err(*Skip::ALL
                .iter()
                .find(|s| s.name() == name)
                .context("unknown skip reason in a part")?),
            None => Ok(self.doc(&v["doc"], n_tokens as usize)?),
        };
        let p = Processed {
            index: v["i"].as_u64().context("record without index")?,
            doc_type: v["type"].as_str().unwrap_or_default().to_string(),
            raw_bytes: v["bytes"].as_u64().unwrap_or(0),
            outcome,
        };
        Ok((p, n_tokens))
    }

    /// The document of a record (without its tokens when the reader skips them).
    fn doc(&mut self, v: &Value, n: usize) -> Result<Doc> {
        let tokens = match &mut self.tokens {
            Some(r) => read_u32s(r, n)?,
            None => Vec::new(),
        };
        let signature = if v["signed"].as_bool() == Some(true) {
            let s: Signature = read_u32s(&mut self.signatures, NUM_PERM)?
                .try_into()
                .expect("NUM_PERM values");
            Some(Box::new(s))
        } else {
            None
        };
        let mut redaction = Redaction {
            truncated_bytes: v["truncated"].as_u64().unwrap_or(0),
            ..Redaction::default()
        };
        for (k, n) in v["replaced"].as_object().into_iter().flatten() {
            let ph = Phi::ALL
                .iter()
                .map(|p| p.placeholder())
                .find(|p| p == k)
                .context("unknown placeholder in a part")?;
            redaction.replaced.insert(ph, n.as_u64().unwrap_or(0));
        }
        Ok(Doc {
            tokens,
            text: None,
            non_alnum: v["non_alnum"].as_f64().unwrap_or(0.0),
            exact: u128::from_str_radix(v["exact"].as_str().unwrap_or("0"), 16)?,
            signature,
            eval_hit: v["eval"].as_array().map(|a| {
                (
                    PathBuf::from(a[0].as_str().unwrap_or_default()),
                    a[1].as_u64().unwrap_or(0),
                )
            }),
            redaction,
            cleaned: v["cleaned"].as_bool().unwrap_or(false),
            val: v["val"].as_bool().unwrap_or(false),
        })
    }
}

fn read_u32s(r: &mut impl Read, n: usize) -> Result<Vec<u32>> {
    let mut bytes = vec![0u8; n * 4];
    r.read_exact(&mut bytes)
        .context("a part's binary file is truncated")?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The records of all parts in input order (each part's are in order: merge by index).
fn merged(
    out: &Path,
    of: usize,
    with_tokens: bool,
) -> Result<impl Iterator<Item = Result<(Processed, u64)>>> {
    let mut readers = Vec::with_capacity(of);
    for part in 0..of {
        readers.push(PartReader::open(&part_dir(out, part, of), with_tokens)?);
    }
    let mut heads: Vec<Option<Result<(Processed, u64)>>> =
        readers.iter_mut().map(PartReader::next_record).collect();
    Ok(std::iter::from_fn(move || {
        // An error is returned as soon as any part has one.
        if let Some(i) = heads.iter().position(|h| matches!(h, Some(Err(_)))) {
            return heads[i].take();
        }
        let (i, _) = heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| match h {
                Some(Ok((p, _))) => Some((i, p.index)),
                _ => None,
            })
            .min_by_key(|&(_, index)| index)?;
        let next = readers[i].next_record();
        std::mem::replace(&mut heads[i], next)
    }))
}
