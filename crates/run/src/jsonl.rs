//! Append-only JSON-lines files: every line is written whole and fsynced, so a kill loses
//! nothing already written and leaves at most one torn last line, which readers skip.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// An open JSON-lines file for appending.
pub struct JsonLines {
    path: PathBuf,
    file: File,
}

impl JsonLines {
    pub fn open(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {} for appending", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn append<T: Serialize>(&mut self, value: &T) -> Result<()> {
        append_to(&mut self.file, &self.path, value)
    }
}

/// Appends one line to `path` (opened and closed here: one `write` call, so lines written by
/// several processes never interleave).
pub fn append_line<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {} for appending", path.display()))?;
    append_to(&mut file, path, value)
}

fn append_to<T: Serialize>(file: &mut File, path: &Path, value: &T) -> Result<()> {
    let mut line = serde_json::to_string(value)?;
    line.push('\n');
    file.write_all(line.as_bytes())
        .and_then(|_| file.sync_data())
        .with_context(|| format!("cannot append to {}", path.display()))
}

/// Every line of `path` as `T` (an absent file is empty). A line that does not parse is an
/// error, except the last one, which a kill may have torn.
pub fn read_lines<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() => break, // a torn last line from a kill -9
            Err(e) => bail!("{} line {}: {e}", path.display(), i + 1),
        }
    }
    Ok(out)
}

fn step_of(line: &str) -> Option<u64> {
    serde_json::from_str::<Value>(line)
        .ok()?
        .get("step")
        .and_then(Value::as_u64)
}

/// Keeps the lines of `path` whose `step` is at most `step` and returns the others (torn
/// lines are dropped). Used on resume and rollback: later lines belong to steps that are
/// re-run.
pub fn split_after_step(path: &Path, step: u64) -> Result<Vec<String>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (mut kept, mut later) = (String::new(), Vec::new());
    for line in text.lines() {
        match step_of(line) {
            Some(s) if s <= step => {
                kept.push_str(line);
                kept.push('\n');
            }
            Some(_) => later.push(line.to_string()),
            None => {}
        }
    }
    lab_fsio::write_atomic(path, kept.as_bytes())?;
    Ok(later)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn torn_last_line_is_skipped_and_split_keeps_earlier_steps() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.jsonl");
        let mut f = JsonLines::open(&p).unwrap();
        for s in 1..=4 {
            f.append(&json!({ "step": s })).unwrap();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"{\"step\": 5, \"lo")
            .unwrap();
        assert_eq!(read_lines::<Value>(&p).unwrap().len(), 4);
        let later = split_after_step(&p, 2).unwrap();
        assert_eq!(later.len(), 2);
        assert_eq!(read_lines::<Value>(&p).unwrap().len(), 2);
    }

    #[test]
    fn a_bad_line_in_the_middle_is_an_error_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.jsonl");
        std::fs::write(&p, "{\"step\":1}\nnot json\n{\"step\":3}\n").unwrap();
        let e = format!("{:#}", read_lines::<Value>(&p).unwrap_err());
        assert!(e.contains("line 2"), "{e}");
    }
}
