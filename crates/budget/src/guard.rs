//! The decision the trainer acts on. Given a reading of budget.json, the run's progress and the
//! time, the guard answers Continue, Warn (degraded, inside the grace period), Alert (spent
//! passed the alert threshold, first time), StopGraceful (checkpoint, exit 3) or StopImmediate
//! (exit 4 at once, no checkpoint).
//!
//! Numbers are extrapolated to now: spent = spent_usd + rate × age of the file, so a file a
//! few minutes old never hides the spend since. The projection is the larger of the file's
//! and the guard's own: spent + rate × remaining hours (remaining steps × measured s/step).

use lab_config::BudgetConfig;

use crate::file::{BudgetFile, Problem, Reading, STALE_AFTER_POLLS};
use crate::status::Progress;

#[derive(Debug, Clone, PartialEq)]
pub struct GuardSettings {
    pub cap_usd: f64,
    pub alert_usd: Option<f64>,
    pub max_price_usd_per_hr: Option<f64>,
    pub check_interval_s: f64,
    pub poll_interval_s: f64,
    pub grace_s: f64,
}

impl GuardSettings {
    pub fn from_config(c: &BudgetConfig) -> GuardSettings {
        GuardSettings {
            cap_usd: c.cap_usd,
            alert_usd: c.alert_usd,
            max_price_usd_per_hr: c.max_price_usd_per_hr,
            check_interval_s: c.check_interval_s,
            poll_interval_s: c.poll_interval_s,
            grace_s: c.grace_s,
        }
    }

    /// Age past which budget.json is stale.
    pub fn stale_after_s(&self) -> f64 {
        STALE_AFTER_POLLS * self.poll_interval_s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    /// budget.json cannot be trusted; the run goes on only until the grace period ends.
    Warn,
    /// spent passed the alert threshold (reported once).
    Alert,
    /// Checkpoint, then exit 3.
    StopGraceful,
    /// Exit 4 now, no checkpoint.
    StopImmediate,
}

impl Verdict {
    /// The process exit code a stop maps to (DESIGN.md).
    pub fn exit_code(self) -> Option<u8> {
        match self {
            Verdict::StopGraceful => Some(3),
            Verdict::StopImmediate => Some(4),
            _ => None,
        }
    }

    pub fn is_stop(self) -> bool {
        self.exit_code().is_some()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Continue => "continue",
            Verdict::Warn => "warn",
            Verdict::Alert => "alert",
            Verdict::StopGraceful => "stop-graceful",
            Verdict::StopImmediate => "stop-immediate",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    /// One line: what was seen and why this verdict.
    pub reason: String,
    /// Spend extrapolated to now (None when no numbers were ever good).
    pub spent_usd: Option<f64>,
    pub projected_usd: Option<f64>,
    pub rate_usd_per_hr: Option<f64>,
    pub over_alert: bool,
}

/// Spend and projection extrapolated from `f` to `now`.
pub fn extrapolate(f: &BudgetFile, progress: Option<&Progress>, now: f64) -> (f64, f64) {
    let age_h = ((now - f.updated_unix()) / 3600.0).max(0.0);
    let spent = f.spent_usd + f.rate_usd_per_hr * age_h;
    let remaining_h = progress
        .and_then(Progress::remaining_hours)
        .or(f.remaining_hours.map(|r| (r - age_h).max(0.0)))
        .unwrap_or(0.0);
    let projected = f
        .projected_total_usd
        .max(spent + f.rate_usd_per_hr * remaining_h);
    (spent, projected)
}

pub struct Guard {
    s: GuardSettings,
    alerted: bool,
    /// Since when the guard has had no trustworthy numbers.
    bad_since: Option<f64>,
    last_check: Option<f64>,
    last_good: Option<BudgetFile>,
}

impl Guard {
    pub fn new(s: GuardSettings) -> Guard {
        Guard {
            s,
            alerted: false,
            bad_since: None,
            last_check: None,
            last_good: None,
        }
    }

    /// Counts `now` as a check (the pre-launch one), so the next is one interval later.
    pub fn mark_checked(&mut self, now: f64) {
        self.last_check = Some(now);
    }

    pub fn settings(&self) -> &GuardSettings {
        &self.s
    }

    /// When the next check is due: every `check_interval_s`, and while budget.json is bad, no
    /// later than the end of the grace period.
    pub fn next_due(&self) -> f64 {
        match (self.last_check, self.bad_since) {
            (None, _) => f64::NEG_INFINITY,
            (Some(last), None) => last + self.s.check_interval_s,
            (Some(last), Some(since)) => {
                (last + self.s.check_interval_s).min(since + self.s.grace_s)
            }
        }
    }

    pub fn due(&self, now: f64) -> bool {
        now >= self.next_due()
    }

    /// Judges a reading at `now`.
    pub fn evaluate(
        &mut self,
        reading: &Reading,
        progress: Option<&Progress>,
        now: f64,
    ) -> Decision {
        self.last_check = Some(now);
        let (numbers, bad) = match reading {
            Reading::Fresh { file, .. } => {
                self.bad_since = None;
                self.last_good = Some(file.clone());
                (Some(file.clone()), None)
            }
            Reading::Bad {
                problem,
                reason,
                file,
            } => {
                // A stale file's numbers were good once: its grace starts when it went stale,
                // not when this guard happened to look.
                let went_bad = match (problem, file) {
                    (Problem::Stale, Some(f)) => f.updated_unix() + self.stale_after(f),
                    _ => now,
                };
                let since = self.bad_since.get_or_insert(went_bad.min(now));
                let since = *since;
                // A future-dated file's numbers are not trusted; a stale one's are the last good.
                let numbers = match (problem, file) {
                    (Problem::Stale, Some(f)) => Some(f.clone()),
                    _ => None,
                }
                .or_else(|| self.last_good.clone());
                (numbers, Some((reason.clone(), since)))
            }
        };

        let (spent, projected, rate) = match &numbers {
            Some(f) => {
                let (s, p) = extrapolate(f, progress, now);
                (Some(s), Some(p), Some(f.rate_usd_per_hr))
            }
            None => (None, None, None),
        };
        let over_alert = matches!((spent, self.s.alert_usd), (Some(s), Some(a)) if s > a);
        let decide = |verdict: Verdict, reason: String| Decision {
            verdict,
            reason,
            spent_usd: spent,
            projected_usd: projected,
            rate_usd_per_hr: rate,
            over_alert,
        };
        let cap = self.s.cap_usd;
        let basis = if bad.is_some() {
            " (extrapolated from the last good budget.json)"
        } else {
            ""
        };

        if let (Some(s), Some(p), Some(r)) = (spent, projected, rate) {
            if s > cap {
                return decide(
                    Verdict::StopImmediate,
                    format!("spent ${s:.2} exceeds the cap ${cap:.2}{basis}: stopping now, no checkpoint"),
                );
            }
            if p > cap {
                return decide(
                    Verdict::StopGraceful,
                    format!(
                        "projected total ${p:.2} exceeds the cap ${cap:.2} (spent ${s:.2} at \
                         ${r:.2}/h{basis}): checkpointing and stopping"
                    ),
                );
            }
        }
        if let Some((reason, since)) = bad {
            let blind = now - since;
            if blind >= self.s.grace_s {
                return decide(
                    Verdict::StopGraceful,
                    format!(
                        "{reason}; no trustworthy spend for {blind:.0} s, past the {:.0} s grace \
                         period: checkpointing and stopping as if over budget",
                        self.s.grace_s
                    ),
                );
            }
            return decide(
                Verdict::Warn,
                format!(
                    "{reason}; the run stops in {:.0} s unless budget.json recovers",
                    self.s.grace_s - blind
                ),
            );
        }
        let s = spent.unwrap_or(0.0);
        if let Some(a) = self.s.alert_usd {
            if over_alert {
                let first = !self.alerted;
                self.alerted = true;
                return decide(
                    if first {
                        Verdict::Alert
                    } else {
                        Verdict::Continue
                    },
                    format!("spent ${s:.2} is past the alert ${a:.2} (cap ${cap:.2})"),
                );
            }
        }
        decide(
            Verdict::Continue,
            format!(
                "spent ${s:.2}, projected ${:.2}, cap ${cap:.2}",
                projected.unwrap_or(s)
            ),
        )
    }

    fn stale_after(&self, f: &BudgetFile) -> f64 {
        let poll = match f.poll_interval_s {
            Some(p) if p.is_finite() && p > 0.0 => p.min(self.s.poll_interval_s),
            _ => self.s.poll_interval_s,
        };
        STALE_AFTER_POLLS * poll
    }
}
