//! Where guard decisions are reported besides stdout: the run's events.jsonl and, for alerts,
//! an optional Slack-compatible webhook (`{"text": …}`) whose URL is itself a secret.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

use crate::secret::Secret;

/// Appends one JSON object as a line to `events.jsonl` in `run_dir` (one write call, so lines
/// from the trainer and the guard never interleave).
pub fn append_event(run_dir: &Path, event: &Value) -> Result<()> {
    let path = run_dir.join("events.jsonl");
    let mut line = event.to_string();
    line.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // fsync each line, as the trainer does for its own events: a kill loses nothing written.
    f.write_all(line.as_bytes())
        .and_then(|_| f.sync_data())
        .with_context(|| format!("cannot append to {}", path.display()))
}

/// Posts `{"text": text}` to the webhook. Errors never include the URL.
pub fn post_webhook(url: &Secret, text: &str, timeout: Duration) -> Result<()> {
    let client = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| anyhow!("webhook: {e}"))?;
    let body = serde_json::json!({ "text": text }).to_string();
    let resp = client
        .post(url.expose())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .map_err(|e| {
            let why = if e.is_timeout() {
                "timed out"
            } else {
                "request failed"
            };
            anyhow!("webhook: {why}")
        })?;
    if !resp.status().is_success() {
        return Err(anyhow!("webhook: HTTP {}", resp.status()));
    }
    Ok(())
}
