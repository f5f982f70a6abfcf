//! The billing sidecar: polls a provider and rewrites budget.json atomically every poll.
//! A failed poll (429, 500, timeout, truncated JSON, wrong types, even a panic in a parser)
//! never crashes it: it keeps the last good numbers, keeps their `last_update_utc` (so their
//! age keeps growing and the guard can see staleness), and flags `stale` with the error.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::clock::{format_utc, now_unix};
use crate::file::BudgetFile;
use crate::provider::Provider;
use crate::status::read_status;

pub struct Sidecar {
    provider: Box<dyn Provider>,
    out: PathBuf,
    /// The trainer's status.json, for the projection.
    status: Option<PathBuf>,
    poll_interval_s: f64,
    last_good: Option<BudgetFile>,
    failures: u64,
}

/// What one poll did.
#[derive(Debug, Clone, PartialEq)]
pub enum Poll {
    /// Fresh numbers written.
    Good(BudgetFile),
    /// The provider failed; the last good numbers (if any) were rewritten flagged stale.
    Failed {
        error: String,
        kept: Option<BudgetFile>,
    },
}

impl Sidecar {
    pub fn new(
        provider: Box<dyn Provider>,
        out: PathBuf,
        status: Option<PathBuf>,
        poll_interval_s: f64,
    ) -> Sidecar {
        Sidecar {
            provider,
            out,
            status,
            poll_interval_s,
            last_good: None,
            failures: 0,
        }
    }

    pub fn provider_name(&self) -> &'static str {
        self.provider.name()
    }

    pub fn last_good(&self) -> Option<&BudgetFile> {
        self.last_good.as_ref()
    }

    /// Polls once at `now` and writes budget.json.
    pub fn poll_once(&mut self, now: f64) -> Poll {
        let provider = &mut self.provider;
        let sample = catch_unwind(AssertUnwindSafe(|| provider.sample(now)))
            .unwrap_or_else(|_| Err(anyhow!("{}: the response parser panicked", provider.name())));
        match sample {
            Ok(s) => {
                let remaining_hours = self
                    .status
                    .as_ref()
                    .and_then(|p| read_status(p).ok())
                    .and_then(|p| p.remaining_hours());
                let projected = s.spent_usd + s.rate_usd_per_hr * remaining_hours.unwrap_or(0.0);
                let file = BudgetFile {
                    spent_usd: s.spent_usd,
                    rate_usd_per_hr: s.rate_usd_per_hr,
                    hours_elapsed: s.hours_elapsed,
                    projected_total_usd: projected,
                    last_update_utc: format_utc(now),
                    provider: Some(self.provider.name().to_string()),
                    instance_id: s.instance_id.or_else(|| self.provider.instance_id()),
                    method: Some(s.method),
                    remaining_hours,
                    poll_interval_s: Some(self.poll_interval_s),
                    stale: false,
                    error: None,
                    consecutive_failures: 0,
                    written_utc: Some(format_utc(now)),
                    kept_from: None,
                };
                if let Err(e) = file.write(&self.out) {
                    return self.fail(format!("{e:#}"), now);
                }
                self.failures = 0;
                self.last_good = Some(file.clone());
                Poll::Good(file)
            }
            Err(e) => self.fail(format!("{e:#}"), now),
        }
    }

    fn fail(&mut self, error: String, now: f64) -> Poll {
        self.failures += 1;
        let error = error.replace(['\n', '\r'], " ");
        let kept = self.last_good.clone().map(|mut f| {
            f.stale = true;
            f.error = Some(error.clone());
            f.consecutive_failures = self.failures;
            f.written_utc = Some(format_utc(now));
            f
        });
        if let Some(f) = &kept {
            // Best effort: if even this write fails the file simply ages into staleness.
            let _ = f.write(&self.out);
        }
        Poll::Failed { error, kept }
    }

    /// Polls every `poll_interval_s` until `stop` is set or `max_polls` polls were made.
    /// `log` receives one line per poll.
    pub fn run(&mut self, max_polls: Option<u64>, stop: &AtomicBool, log: &mut dyn FnMut(&str)) {
        let mut polls = 0u64;
        loop {
            let now = now_unix();
            match self.poll_once(now) {
                Poll::Good(f) => log(&format!(
                    "budget: {} spent ${:.4} at ${:.4}/h, projected ${:.4} -> {}",
                    self.provider.name(),
                    f.spent_usd,
                    f.rate_usd_per_hr,
                    f.projected_total_usd,
                    self.out.display()
                )),
                Poll::Failed { error, kept } => log(&format!(
                    "budget: poll failed ({} in a row), {}: {error}",
                    self.failures,
                    if kept.is_some() {
                        "kept the last good numbers, flagged stale"
                    } else {
                        "no good numbers yet, nothing written"
                    }
                )),
            }
            polls += 1;
            if max_polls.is_some_and(|m| polls >= m) {
                return;
            }
            // Sleep in short slices so a stop request is honoured promptly.
            let deadline = now_unix() + self.poll_interval_s;
            while now_unix() < deadline {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let left = (deadline - now_unix()).clamp(0.0, 0.1);
                std::thread::sleep(Duration::from_secs_f64(left));
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
        }
    }
}

/// Convenience for one-shot use: poll once now.
pub fn poll_now(sidecar: &mut Sidecar) -> Result<BudgetFile> {
    match sidecar.poll_once(now_unix()) {
        Poll::Good(f) => Ok(f),
        Poll::Failed { error, .. } => Err(anyhow!("{error}")),
    }
}
