//! Streaming document readers: plain text, JSONL, JSONL+zstd and parquet, from files or
//! directories. Memory stays bounded by one record (at most `max_doc_bytes`) plus one parquet
//! row group, whatever the corpus size.
//!
//! JSON lines are handed on unparsed ([`Record::Json`]) so that parsing runs on the worker
//! threads; [`Record::parse`] turns any record into a [`Document`] or a counted [`Skip`].

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// JSON key / parquet column holding the text.
    pub text_field: String,
    /// JSON key / parquet column naming the document type (e.g. MedQuAD's `source`).
    pub type_field: Option<String>,
    /// Larger documents (or JSON lines) are skipped and counted, not loaded.
    pub max_doc_bytes: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            text_field: "text".into(),
            type_field: None,
            max_doc_bytes: 32 << 20,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Jsonl,
    Parquet,
}

#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    pub format: Format,
    pub zstd: bool,
    pub bytes: u64,
}

impl Source {
    /// The document type of plain-text files: the file name without extensions.
    fn text_type(&self) -> String {
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        name.split('.').next().unwrap_or("text").to_string()
    }
}

/// Why a record was not turned into a document (counted per type in the report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Skip {
    InvalidUtf8,
    InvalidJson,
    MissingField,
    Oversize,
    Empty,
}

impl Skip {
    pub const ALL: [Skip; 5] = [
        Skip::InvalidUtf8,
        Skip::InvalidJson,
        Skip::MissingField,
        Skip::Oversize,
        Skip::Empty,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Skip::InvalidUtf8 => "skip-invalid-utf8",
            Skip::InvalidJson => "skip-invalid-json",
            Skip::MissingField => "skip-missing-text-field",
            Skip::Oversize => "skip-oversize",
            Skip::Empty => "skip-empty",
        }
    }
}

/// Where a record came from, for warnings that name the file and line.
#[derive(Debug, Clone, Copy)]
pub struct Location {
    pub source: u32,
    pub line: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub text: String,
    pub doc_type: String,
}

pub enum Record {
    Json {
        line: Vec<u8>,
        at: Location,
    },
    Text {
        text: String,
        doc_type: String,
    },
    Skipped {
        skip: Skip,
        doc_type: String,
        at: Location,
    },
}

impl Record {
    /// Raw bytes this record carries (for chunking and throughput).
    pub fn len(&self) -> usize {
        match self {
            Record::Json { line, .. } => line.len(),
            Record::Text { text, .. } => text.len(),
            Record::Skipped { .. } => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn parse(self, opts: &ReadOptions) -> std::result::Result<Document, (Skip, String)> {
        let unknown = || "unknown".to_string();
        match self {
            Record::Skipped { skip, doc_type, .. } => Err((skip, doc_type)),
            Record::Text { text, doc_type } => {
                if text.trim().is_empty() {
                    Err((Skip::Empty, doc_type))
                } else {
                    Ok(Document { text, doc_type })
                }
            }
            Record::Json { line, .. } => {
                let value: serde_json::Value = match serde_json::from_slice(&line) {
                    Ok(v) => v,
                    Err(_) if std::str::from_utf8(&line).is_err() => {
                        return Err((Skip::InvalidUtf8, unknown()))
                    }
                    Err(_) => return Err((Skip::InvalidJson, unknown())),
                };
                let doc_type = match &opts.type_field {
                    Some(f) => match &value[f] {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Null => unknown(),
                        other => other.to_string(),
                    },
                    None => "all".to_string(),
                };
                match value.get(&opts.text_field) {
                    Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Ok(Document {
                        text: s.clone(),
                        doc_type,
                    }),
                    Some(serde_json::Value::String(_)) => Err((Skip::Empty, doc_type)),
                    _ => Err((Skip::MissingField, doc_type)),
                }
            }
        }
    }
}

/// Every document of `inputs` (files or folders) in order, skipped records left out: for
/// tools and tests that want the texts without a prepare.
pub fn read_documents(inputs: &[PathBuf], opts: &ReadOptions) -> Result<Vec<Document>> {
    let read = Arc::new(AtomicU64::new(0));
    let mut docs = Vec::new();
    for (i, source) in discover(inputs)?.iter().enumerate() {
        read_source(i as u32, source, opts, &read, &mut |record| {
            if let Ok(d) = record.parse(opts) {
                docs.push(d);
            }
            Ok(())
        })?;
    }
    Ok(docs)
}

/// Files named on the command line, with directories expanded (recursively, sorted, only
/// known extensions). An empty directory or a missing path is an error.
pub fn discover(inputs: &[PathBuf]) -> Result<Vec<Source>> {
    if inputs.is_empty() {
        bail!("no input: pass --input FILE_OR_DIR");
    }
    let mut sources = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input)
            .map_err(|e| anyhow::anyhow!("--input {}: {e}", input.display()))?;
        if meta.is_dir() {
            let mut files = Vec::new();
            walk(input, &mut files)?;
            files.sort();
            let before = sources.len();
            for f in files {
                if let Some(s) = source_for(&f, false)? {
                    sources.push(s);
                }
            }
            if sources.len() == before {
                bail!(
                    "--input {}: directory holds no .txt, .jsonl, .jsonl.zst or .parquet files",
                    input.display()
                );
            }
        } else {
            sources.push(source_for(input, true)?.expect("explicit files always have a format"));
        }
    }
    Ok(sources)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

fn source_for(path: &Path, explicit: bool) -> Result<Option<Source>> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let (stem, zstd) = match name.strip_suffix(".zst") {
        Some(s) => (s.to_string(), true),
        None => (name.clone(), false),
    };
    let format = if stem.ends_with(".parquet") && !zstd {
        Format::Parquet
    } else if stem.ends_with(".jsonl") || stem.ends_with(".json") || stem.ends_with(".ndjson") {
        Format::Jsonl
    } else if stem.ends_with(".txt") || stem.ends_with(".text") || stem.ends_with(".md") {
        Format::Text
    } else if explicit {
        // A file named on the command line with another extension: read it as plain text.
        Format::Text
    } else {
        return Ok(None);
    };
    if name.starts_with('.') && !explicit {
        return Ok(None);
    }
    let bytes = std::fs::metadata(path)?.len();
    Ok(Some(Source {
        path: path.to_path_buf(),
        format,
        zstd,
        bytes,
    }))
}

/// What was read from one source, for meta.json.
#[derive(Debug, Clone, Default)]
pub struct SourceStats {
    pub records: u64,
    pub sha256: String,
}

/// Counts bytes read from disk (for the progress bar) and hashes them (for meta.json).
struct Tap<R> {
    inner: R,
    hasher: Sha256,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Tap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Streams every record of `source` into `sink`; `bytes_read` advances with the disk reads.
pub fn read_source(
    index: u32,
    source: &Source,
    opts: &ReadOptions,
    bytes_read: &Arc<AtomicU64>,
    sink: &mut dyn FnMut(Record) -> Result<()>,
) -> Result<SourceStats> {
    let path = &source.path;
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    if source.format == Format::Parquet {
        let records = read_parquet(index, source, file, opts, sink)?;
        bytes_read.fetch_add(source.bytes, Ordering::Relaxed);
        return Ok(SourceStats {
            records,
            sha256: lab_fsio::sha256_file(path)?,
        });
    }
    let mut tap = Tap {
        inner: file,
        hasher: Sha256::new(),
        read: bytes_read.clone(),
    };
    let records = {
        let reader: Box<dyn BufRead + '_> = if source.zstd {
            let dec = zstd::stream::read::Decoder::new(&mut tap)
                .with_context(|| format!("{}: cannot start zstd decoding", path.display()))?;
            Box::new(BufReader::with_capacity(1 << 20, dec))
        } else {
            Box::new(BufReader::with_capacity(1 << 20, &mut tap))
        };
        let corrupt = |e: std::io::Error, line: u64| {
            let what = if source.zstd {
                "corrupt or truncated zstd stream"
            } else {
                "read error"
            };
            anyhow::anyhow!(
                "{}: {what} near line {line} ({e}); re-download or re-compress the file",
                path.display()
            )
        };
        match source.format {
            Format::Jsonl => read_jsonl(index, reader, opts, sink, corrupt)?,
            Format::Text => read_text(index, source, reader, opts, sink, corrupt)?,
            Format::Parquet => unreachable!(),
        }
    };
    // Drain the rest so the sha256 covers the whole file (e.g. a zstd frame's checksum).
    std::io::copy(&mut tap, &mut std::io::sink())?;
    Ok(SourceStats {
        records,
        sha256: hex::encode(tap.hasher.finalize()),
    })
}

fn read_jsonl(
    index: u32,
    mut reader: Box<dyn BufRead + '_>,
    opts: &ReadOptions,
    sink: &mut dyn FnMut(Record) -> Result<()>,
    corrupt: impl Fn(std::io::Error, u64) -> anyhow::Error,
) -> Result<u64> {
    let mut records = 0;
    let mut line_no = 0u64;
    loop {
        let mut line = Vec::new();
        line_no += 1;
        let at = Location {
            source: index,
            line: line_no,
        };
        match read_line_bounded(&mut reader, &mut line, opts.max_doc_bytes)
            .map_err(|e| corrupt(e, line_no))?
        {
            LineRead::Eof => break,
            LineRead::TooLong => sink(Record::Skipped {
                skip: Skip::Oversize,
                doc_type: "unknown".into(),
                at,
            })?,
            LineRead::Line => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                sink(Record::Json { line, at })?
            }
        }
        records += 1;
    }
    Ok(records)
}

fn read_text(
    index: u32,
    source: &Source,
    reader: Box<dyn BufRead + '_>,
    opts: &ReadOptions,
    sink: &mut dyn FnMut(Record) -> Result<()>,
    corrupt: impl Fn(std::io::Error, u64) -> anyhow::Error,
) -> Result<u64> {
    // A plain-text file is one document, as in nanoGPT's prepare.py.
    let doc_type = source.text_type();
    let at = Location {
        source: index,
        line: 1,
    };
    let mut bytes = Vec::new();
    reader
        .take((opts.max_doc_bytes as u64).saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| corrupt(e, 1))?;
    let record = if bytes.len() > opts.max_doc_bytes {
        Record::Skipped {
            skip: Skip::Oversize,
            doc_type,
            at,
        }
    } else {
        match String::from_utf8(bytes) {
            Ok(text) => Record::Text { text, doc_type },
            Err(_) => Record::Skipped {
                skip: Skip::InvalidUtf8,
                doc_type,
                at,
            },
        }
    };
    sink(record)?;
    Ok(1)
}

enum LineRead {
    Eof,
    Line,
    TooLong,
}

/// Reads one `\n`-terminated line into `buf`, keeping at most `max` bytes: a longer line is
/// consumed and dropped without ever being held in memory.
fn read_line_bounded(
    r: &mut dyn BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    let mut seen = 0usize;
    let mut any = false;
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(match (any, seen > max) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong,
                (true, false) => LineRead::Line,
            });
        }
        any = true;
        let (take, done) = match memchr_newline(chunk) {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let content = if done {
            &chunk[..take - 1]
        } else {
            &chunk[..take]
        };
        seen += content.len();
        if seen <= max {
            buf.extend_from_slice(content);
        } else {
            buf.clear();
        }
        r.consume(take);
        if done {
            return Ok(if seen > max {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

fn read_parquet(
    index: u32,
    source: &Source,
    file: File,
    opts: &ReadOptions,
    sink: &mut dyn FnMut(Record) -> Result<()>,
) -> Result<u64> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    use parquet::schema::types::Type;

    let path = &source.path;
    let reader = SerializedFileReader::new(file)
        .with_context(|| format!("{}: not a readable parquet file", path.display()))?;
    let schema = reader.metadata().file_metadata().schema();
    let columns: Vec<String> = schema
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    let pick = |name: &str| {
        schema
            .get_fields()
            .iter()
            .find(|f| f.name() == name)
            .cloned()
    };
    let Some(text_col) = pick(&opts.text_field) else {
        bail!(
            "{}: parquet has no column `{}` (columns: {}); choose one with --text-field",
            path.display(),
            opts.text_field,
            columns.join(", ")
        );
    };
    let mut fields = vec![text_col];
    if let Some(tf) = &opts.type_field {
        match pick(tf) {
            Some(c) => fields.push(c),
            None => bail!(
                "{}: parquet has no column `{tf}` (columns: {}); fix --type-field",
                path.display(),
                columns.join(", ")
            ),
        }
    }
    let projection = Type::group_type_builder("schema")
        .with_fields(fields)
        .build()?;
    let rows = reader
        .get_row_iter(Some(projection))
        .with_context(|| format!("{}: cannot read rows", path.display()))?;
    let mut records = 0u64;
    for (i, row) in rows.enumerate() {
        let at = Location {
            source: index,
            line: i as u64 + 1,
        };
        let row = row.with_context(|| format!("{}: corrupt row {}", path.display(), i + 1))?;
        let mut text = None;
        let mut doc_type = if opts.type_field.is_some() {
            "unknown"
        } else {
            "all"
        }
        .to_string();
        for (name, field) in row.get_column_iter() {
            let value = match field {
                Field::Str(s) => Some(s.clone()),
                Field::Bytes(b) => Some(String::from_utf8_lossy(b.data()).into_owned()),
                Field::Null => None,
                other => Some(other.to_string()),
            };
            if *name == opts.text_field {
                text = value;
            } else if let Some(v) = value {
                doc_type = v;
            }
        }
        let record = match text {
            Some(t) if t.len() > opts.max_doc_bytes => Record::Skipped {
                skip: Skip::Oversize,
                doc_type,
                at,
            },
            Some(text) => Record::Text { text, doc_type },
            None => Record::Skipped {
                skip: Skip::MissingField,
                doc_type,
                at,
            },
        };
        sink(record)?;
        records += 1;
    }
    Ok(records)
}

/// A list file given by `flag` (special tokens, terms …): one entry per line, trimmed, with
/// blank lines and `#` comments skipped.
pub fn read_line_list(path: &Path, flag: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{flag} {}: cannot read it", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_line_reader_drops_long_lines_and_keeps_the_rest() {
        let data = b"short\nthis line is too long\n\nend".to_vec();
        let mut r: Box<dyn BufRead> = Box::new(BufReader::with_capacity(4, &data[..]));
        let mut got = Vec::new();
        loop {
            let mut buf = Vec::new();
            match read_line_bounded(&mut r, &mut buf, 10).unwrap() {
                LineRead::Eof => break,
                LineRead::TooLong => got.push("<long>".to_string()),
                LineRead::Line => got.push(String::from_utf8(buf).unwrap()),
            }
        }
        assert_eq!(got, vec!["short", "<long>", "", "end"]);
    }

    #[test]
    fn json_records_parse_into_documents_or_counted_skips() {
        let opts = ReadOptions {
            type_field: Some("source".into()),
            ..Default::default()
        };
        let at = Location { source: 0, line: 1 };
        let rec = |s: &[u8]| Record::Json {
            line: s.to_vec(),
            at,
        };
        assert_eq!(
            rec(br#"{"text":"hi","source":"GHR"}"#)
                .parse(&opts)
                .unwrap(),
            Document {
                text: "hi".into(),
                doc_type: "GHR".into()
            }
        );
        assert_eq!(
            rec(br#"{"body":"hi"}"#).parse(&opts).unwrap_err().0,
            Skip::MissingField
        );
        assert_eq!(
            rec(b"{not json").parse(&opts).unwrap_err().0,
            Skip::InvalidJson
        );
        assert_eq!(
            rec(b"{\"text\":\"\xff\"}").parse(&opts).unwrap_err().0,
            Skip::InvalidUtf8
        );
        assert_eq!(
            rec(br#"{"text":"  "}"#).parse(&opts).unwrap_err().0,
            Skip::Empty
        );
    }
}
