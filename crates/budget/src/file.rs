//! budget.json: the sidecar's answer to "how much has this run cost, and where is it going".
//! Written atomically (temp name, fsync, rename) so a reader never sees half a file; read
//! strictly, so a missing, malformed, stale or future-dated file is named as such and never
//! mistaken for good numbers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::clock::parse_utc;

/// Clock skew tolerated before a file counts as "from the future".
pub const FUTURE_TOLERANCE_S: f64 = 60.0;
/// budget.json older than this many poll intervals is stale.
pub const STALE_AFTER_POLLS: f64 = 3.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetFile {
    /// Money spent so far on the instance, USD.
    pub spent_usd: f64,
    /// Current price, USD per hour.
    pub rate_usd_per_hr: f64,
    /// Hours since billing started (instance start, or run start for the meter).
    pub hours_elapsed: f64,
    /// spent + rate × remaining planned hours of the run.
    pub projected_total_usd: f64,
    /// When the provider's numbers were last good (not when the file was written).
    pub last_update_utc: String,
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub instance_id: Option<String>,
    /// How `spent_usd` was obtained (e.g. "Lambda reports no spend: price × time since start").
    #[serde(default)]
    pub method: Option<String>,
    /// Remaining planned hours used for the projection (from the trainer's status.json).
    #[serde(default)]
    pub remaining_hours: Option<f64>,
    /// The sidecar's poll interval; the guard treats the file as stale after 3 of them.
    #[serde(default)]
    pub poll_interval_s: Option<f64>,
    /// True when the last poll failed and these are the last good numbers.
    #[serde(default)]
    pub stale: bool,
    /// The last poll's error (one line, secrets scrubbed) when `stale`.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub consecutive_failures: u64,
    /// When this file was written.
    #[serde(default)]
    pub written_utc: Option<String>,
    /// Set on the copy a trainer keeps in its run folder of numbers it read elsewhere (the
    /// source's address): a copy, never the meter's own record of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_from: Option<String>,
}

impl BudgetFile {
    /// Unix seconds of `last_update_utc` (validated on read).
    pub fn updated_unix(&self) -> f64 {
        parse_utc(&self.last_update_utc).unwrap_or(f64::NEG_INFINITY)
    }

    /// Checks types that serde cannot: finite, non-negative, projection not below spend.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("spent_usd", self.spent_usd),
            ("rate_usd_per_hr", self.rate_usd_per_hr),
            ("hours_elapsed", self.hours_elapsed),
            ("projected_total_usd", self.projected_total_usd),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                bail!("{name} is {v}, expected a finite number >= 0");
            }
        }
        if self.projected_total_usd + 1e-9 < self.spent_usd {
            bail!(
                "projected_total_usd ({}) is below spent_usd ({})",
                self.projected_total_usd,
                self.spent_usd
            );
        }
        parse_utc(&self.last_update_utc).context("last_update_utc")?;
        Ok(())
    }

    /// Writes the file atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut text = serde_json::to_string_pretty(self).expect("budget file serializes");
        text.push('\n');
        lab_fsio::write_atomic(path, text.as_bytes())
    }
}

/// Where the trainer reads budget.json: a local path (`file://` optional) or an http(s) URL
/// serving the same JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum BudgetUri {
    File(PathBuf),
    Http(String),
}

impl BudgetUri {
    pub fn parse(s: &str) -> Result<BudgetUri> {
        let s = s.trim();
        if s.is_empty() {
            bail!("--budget-curr-cost-uri is empty; give a path to budget.json or an http(s) URL");
        }
        if let Some(p) = s.strip_prefix("file://") {
            return Ok(BudgetUri::File(PathBuf::from(p)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(BudgetUri::Http(s.to_string()));
        }
        if s.contains("://") {
            bail!("budget URI {s:?}: only file paths, file://, http:// and https:// are supported");
        }
        Ok(BudgetUri::File(PathBuf::from(s)))
    }
}

impl std::fmt::Display for BudgetUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetUri::File(p) => write!(f, "{}", p.display()),
            BudgetUri::Http(u) => f.write_str(&redact_url(u)),
        }
    }
}

/// A URL as it may be shown: credentials (`user:pass@`) and the query string (`?token=…`)
/// replaced by `…`, so a budget URI never leaks a secret into logs or events.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let userinfo = if host.len() < authority.len() {
        "…@"
    } else {
        ""
    };
    let path = match path.split_once('?') {
        Some((p, _)) => format!("{p}?…"),
        None => path.to_string(),
    };
    let scheme = if scheme.is_empty() {
        String::new()
    } else {
        format!("{scheme}://")
    };
    format!("{scheme}{userinfo}{host}{path}")
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url;

    #[test]
    fn credentials_and_query_never_show() {
        let shown = redact_url("https://bob:s3cret@billing.example/v1/budget.json?token=abc123");
        assert_eq!(shown, "https://…@billing.example/v1/budget.json?…");
        assert_eq!(
            redact_url("http://127.0.0.1:8080/b.json"),
            "http://127.0.0.1:8080/b.json"
        );
    }
}

/// Why a budget.json cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    Missing,
    Malformed,
    Future,
    Stale,
}

/// The outcome of reading budget.json at a given time.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// Good numbers, `age_s` seconds old.
    Fresh { file: BudgetFile, age_s: f64 },
    /// Cannot be trusted. `file` holds the numbers when they parsed (stale or future files),
    /// so the guard can still extrapolate from them.
    Bad {
        problem: Problem,
        reason: String,
        file: Option<BudgetFile>,
    },
}

/// Reads and judges budget.json at time `now`. `poll_interval_s` is the guard's idea of the
/// sidecar's interval; the smaller of it and the file's own is used, so a misconfigured file
/// cannot stretch its own freshness.
pub fn read_budget(uri: &BudgetUri, now: f64, poll_interval_s: f64) -> Reading {
    let text = match fetch_text(uri) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Reading::Bad {
                problem: Problem::Missing,
                reason: format!(
                    "budget file {uri} does not exist; start `lab budget sidecar --out {uri}`"
                ),
                file: None,
            }
        }
        Err(e) => {
            return Reading::Bad {
                problem: Problem::Missing,
                reason: format!("budget file {uri} cannot be read: {e:#}"),
                file: None,
            }
        }
    };
    judge(uri, &text, now, poll_interval_s)
}

/// Judges the text of a budget.json (separate from I/O for tests).
pub fn judge(uri: &BudgetUri, text: &str, now: f64, poll_interval_s: f64) -> Reading {
    let malformed = |why: String| Reading::Bad {
        problem: Problem::Malformed,
        reason: format!("budget file {uri} is malformed: {why}"),
        file: None,
    };
    let file: BudgetFile = match serde_json::from_str(text) {
        Ok(f) => f,
        Err(e) => return malformed(e.to_string()),
    };
    if let Err(e) = file.validate() {
        return malformed(format!("{e:#}"));
    }
    let updated = file.updated_unix();
    let age_s = now - updated;
    if age_s < -FUTURE_TOLERANCE_S {
        return Reading::Bad {
            problem: Problem::Future,
            reason: format!(
                "budget file {uri} is from the future (last_update_utc {} is {:.0} s ahead of \
                 this clock); fix the clock of the sidecar or of this machine",
                file.last_update_utc, -age_s
            ),
            file: Some(file),
        };
    }
    let poll = match file.poll_interval_s {
        Some(p) if p.is_finite() && p > 0.0 => p.min(poll_interval_s),
        _ => poll_interval_s,
    };
    let stale_after = STALE_AFTER_POLLS * poll;
    if age_s > stale_after {
        let why = match (&file.error, file.stale) {
            (Some(e), _) => format!("; the sidecar's last error: {e}"),
            (None, true) => "; the sidecar flags it stale".to_string(),
            _ => "; is the sidecar running?".to_string(),
        };
        return Reading::Bad {
            problem: Problem::Stale,
            reason: format!(
                "budget file {uri} is stale: last update {} is {} s old, more than 3 polls \
                 ({} s){why}",
                file.last_update_utc,
                secs(age_s),
                secs(stale_after)
            ),
            file: Some(file),
        };
    }
    Reading::Fresh {
        file,
        age_s: age_s.max(0.0),
    }
}

/// Seconds for messages: whole above 10, one decimal below (test intervals are sub-second).
fn secs(s: f64) -> String {
    if s.abs() >= 10.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

/// `Ok(None)` when the file does not exist (or the URL answers 404).
fn fetch_text(uri: &BudgetUri) -> Result<Option<String>> {
    match uri {
        BudgetUri::File(p) => match std::fs::read_to_string(p) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        },
        BudgetUri::Http(url) => {
            let client = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?;
            let resp = client.get(url).send().map_err(|e| anyhow::anyhow!("{e}"))?;
            if resp.status() == reqwest::StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if !resp.status().is_success() {
                bail!("HTTP {}", resp.status());
            }
            Ok(Some(resp.text()?))
        }
    }
}
