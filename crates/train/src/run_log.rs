//! The run folder's logs: append-only `metrics.jsonl` (one object per logged step) and
//! `events.jsonl` (checkpoints, resumes, interruptions …), and the `status.json` snapshot that
//! `lab status` and the budget sidecar read.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};

pub const METRICS: &str = "metrics.jsonl";
pub const EVENTS: &str = "events.jsonl";
pub const STATUS: &str = "status.json";

/// RFC 3339 UTC timestamp, the one format of every `time_utc` in a run folder (the budget
/// guard writes events to the same events.jsonl).
pub fn now_utc() -> String {
    lab_budget::clock::format_utc(lab_budget::clock::now_unix())
}

/// An append-only JSON-lines file; each line is flushed and fsynced so a kill loses nothing
/// already written.
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

    pub fn append(&mut self, value: &Value) -> Result<()> {
        let mut line = serde_json::to_string(value)?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.sync_data())
            .with_context(|| format!("cannot append to {}", self.path.display()))
    }
}

/// On resume, drops the lines logged after the checkpoint's step (they belong to the
/// interrupted attempt, whose later steps are re-run), so the log reads as one run.
pub fn truncate_after_step(path: &Path, step: u64) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut kept = String::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue; // a torn last line from a kill -9
        };
        if v.get("step")
            .and_then(Value::as_u64)
            .is_some_and(|s| s <= step)
        {
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    lab_fsio::write_atomic(path, kept.as_bytes())
}

/// Appends an event `{time_utc, step, kind, ...fields}` to events.jsonl.
pub fn event(log: &mut JsonLines, step: u64, kind: &str, fields: Value) -> Result<()> {
    let mut obj = Map::new();
    obj.insert("time_utc".into(), json!(now_utc()));
    obj.insert("step".into(), json!(step));
    obj.insert("kind".into(), json!(kind));
    if let Value::Object(extra) = fields {
        obj.extend(extra);
    }
    log.append(&Value::Object(obj))
}

/// What `status.json` says about a run.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub state: &'static str,
    pub step: u64,
    pub total_steps: u64,
    pub loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// Wall-clock seconds per optimizer step, measured over the last log interval.
    pub secs_per_step: Option<f64>,
    pub mfu: Option<f64>,
    pub elapsed_s: f64,
    pub eta_s: Option<f64>,
    pub config_sha256: String,
    pub started_utc: String,
    pub updated_utc: String,
}

impl Status {
    /// Sets the state and step, stamps the time and rewrites status.json.
    pub fn finish(
        &mut self,
        state: &'static str,
        step: u64,
        started: std::time::Instant,
        run_dir: &Path,
    ) -> Result<()> {
        self.state = state;
        self.step = step;
        self.elapsed_s = started.elapsed().as_secs_f64();
        self.updated_utc = now_utc();
        self.write(run_dir)
    }

    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)? + "\n";
        lab_fsio::write_atomic(&run_dir.join(STATUS), json.as_bytes())
    }
}
