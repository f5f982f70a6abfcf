//! `lab status --run DIR`: where a run stands, from status.json, metrics.jsonl, events.jsonl
//! and budget.json, while it trains or after: progress, loss and its trend, tokens, speed,
//! MFU, spend and projected spend, ETA, recent alerts.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Result};
use lab_run::{Event, MetricsRow, Status};
use serde::Serialize;
use serde_json::Value;

use crate::run_files::RunFiles;

/// Event kinds worth seeing in a status line.
const ALERTS: &[&str] = &[
    "spike_detected",
    "spike_recovered",
    "spike_escalated",
    "rollback",
    "nonfinite",
    "update_skipped",
    "plateau",
    "budget_alert",
    "budget_degraded",
    "budget_stop_graceful",
    "budget_stop_immediate",
    "budget_refused",
    "interrupted",
    "preemption",
    "unstable",
];

#[derive(Debug, Clone, Serialize)]
pub struct RunStatus {
    /// status.json's state; `running` becomes `stopped (process gone)` when no trainer holds
    /// the run folder.
    pub state: String,
    pub step: u64,
    pub total_steps: u64,
    pub percent: f64,
    pub loss: Option<f64>,
    pub val_loss: Option<f64>,
    /// Relative change of the mean loss over the last 5 logged steps against the 5 before.
    pub loss_trend: Option<f64>,
    pub tokens: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub mfu: Option<f64>,
    pub spent_usd: Option<f64>,
    pub projected_usd: Option<f64>,
    pub cap_usd: Option<f64>,
    /// Seconds to go at the measured pace, counted from now.
    pub eta_s: Option<f64>,
    pub updated_utc: String,
    pub recent: Vec<Event>,
    /// Where the loss curve is heading (a power-law fit), when there are points enough.
    pub projection: Option<ProjectionView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProjectionView {
    /// Projected loss at the last step, and a 90 % interval.
    pub loss: f64,
    pub interval: (f64, f64),
    pub at_step: u64,
    /// `val` or `train`, and how many points the fit used.
    pub curve: &'static str,
    pub points: usize,
    pub completion_utc: Option<String>,
    pub remaining_cost_usd: Option<f64>,
}

/// Reads the run's files now; with `fit_until`, the projection is fitted only on the logs up
/// to that step (what the status would have projected then: the way to check a projection
/// against a finished run).
pub fn status_fitted_until(run: &Path, fit_until: Option<u64>) -> Result<RunStatus> {
    let st = match Status::read(run) {
        Ok(st) => st,
        Err(_) if !run.join(lab_run::STATUS).exists() => bail!(
            "--run {}: no status.json (not a run folder, or the run has not started)",
            run.display()
        ),
        Err(e) => bail!(
            "{e:#} (the trainer rewrites it whole at its next logged step; a hand-edited copy can be removed)"
        ),
    };
    let files = RunFiles::read(run)?;
    let last = files.metrics.last();
    let budget: Option<Value> = std::fs::read_to_string(run.join("budget.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let running = st.state == "running";
    // The trainer writes its pid; a status saying "running" whose process is gone is stale.
    let alive = running
        && st.pid.is_some_and(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("lab"))
        });
    let age = lab_run::clock::parse_utc(&st.updated_utc)
        .map(|t| (lab_run::clock::now_unix() - t).max(0.0))
        .unwrap_or(0.0);
    let alerts: Vec<Event> = files
        .events
        .iter()
        .filter(|e| ALERTS.contains(&e.kind.as_str()))
        .cloned()
        .collect();
    let recent = alerts[alerts.len().saturating_sub(5)..].to_vec();
    let eta_s = if alive {
        st.eta_s.map(|e| (e - age).max(0.0))
    } else {
        None
    };
    let rate = budget.as_ref().and_then(|b| b["rate_usd_per_hr"].as_f64());
    let projection =
        project(&files, st.total_steps, fit_until.unwrap_or(u64::MAX)).map(|(p, curve, points)| {
            ProjectionView {
                loss: p.loss,
                interval: p.interval,
                at_step: st.total_steps,
                curve,
                points,
                completion_utc: eta_s
                    .map(|e| lab_run::clock::format_utc(lab_run::clock::now_unix() + e)),
                remaining_cost_usd: eta_s.zip(rate).map(|(e, r)| e / 3600.0 * r),
            }
        });
    Ok(RunStatus {
        state: match (running, alive) {
            (true, false) => "stopped (process gone)".into(),
            _ => st.state.clone(),
        },
        step: st.step,
        total_steps: st.total_steps,
        percent: 100.0 * st.step as f64 / st.total_steps.max(1) as f64,
        loss: st.loss,
        val_loss: st.val_loss,
        loss_trend: trend(&files.metrics),
        // The last logged row may be older than the step status.json reports (a run stopped
        // between logs): its tokens per step carried to that step.
        tokens: last.map(|r| match r.step {
            0 => r.tokens,
            s => r.tokens / s as f64 * st.step as f64,
        }),
        tokens_per_s: st.tokens_per_s,
        mfu: st.mfu,
        spent_usd: budget.as_ref().and_then(|b| b["spent_usd"].as_f64()),
        projected_usd: budget
            .as_ref()
            .and_then(|b| b["projected_total_usd"].as_f64()),
        cap_usd: files
            .config
            .as_ref()
            .and_then(|c| c.budget.as_ref())
            .map(|b| b.cap_usd),
        eta_s,
        updated_utc: st.updated_utc,
        recent,
        projection,
    })
}

/// The power-law projection of the validation curve (5 points or more) or else of the training
/// curve, from the end of warmup on, spike steps left out.
fn project(
    files: &RunFiles,
    total: u64,
    fit_until: u64,
) -> Option<(lab_eval::Projection, &'static str, usize)> {
    let warmup = files.config.as_ref().map_or(0, |c| c.train.warmup_steps) as u64;
    let ordinary = |r: &&MetricsRow| {
        r.step >= warmup.max(1)
            && r.step <= fit_until
            && r.flag.is_none()
            && !r.injected
            && !r.update_skipped
    };
    let val: Vec<(f64, f64)> = files
        .metrics
        .iter()
        .filter(ordinary)
        .filter_map(|r| Some((r.step as f64, r.val_loss?)))
        .collect();
    let train: Vec<(f64, f64)> = files
        .metrics
        .iter()
        .filter(ordinary)
        .map(|r| (r.step as f64, r.loss))
        .collect();
    // A validation curve that turned upwards (overfitting) has no falling power law: the
    // training curve still says where the loss was heading.
    let fit = |curve: &'static str, points: &[(f64, f64)]| {
        Some((
            lab_eval::project::project(points, total as f64)?,
            curve,
            points.len(),
        ))
    };
    (val.len() >= 5)
        .then(|| fit("val", &val))
        .flatten()
        .or_else(|| fit("train", &train))
}

fn trend(rows: &[MetricsRow]) -> Option<f64> {
    let n = rows.len();
    if n < 10 {
        return None;
    }
    let mean = |r: &[MetricsRow]| r.iter().map(|x| x.loss).sum::<f64>() / r.len() as f64;
    let (before, now) = (mean(&rows[n - 10..n - 5]), mean(&rows[n - 5..]));
    Some(now / before - 1.0)
}

fn hms(s: f64) -> String {
    let s = s.round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

impl RunStatus {
    /// The compact table.
    pub fn render(&self, run: &Path) -> String {
        let mut o = String::new();
        let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("–".into(), f);
        let _ = writeln!(o, "run      {} ({})", run.display(), self.state);
        let _ = writeln!(
            o,
            "step     {} / {} ({:.1} %), ETA {}",
            self.step,
            self.total_steps,
            self.percent,
            opt(self.eta_s, &hms)
        );
        let trend = opt(self.loss_trend, &|t| {
            let word = if t < -0.005 {
                "falling"
            } else if t > 0.005 {
                "rising"
            } else {
                "flat"
            };
            format!("{word} ({:+.1} % over the last 5 logs)", t * 100.0)
        });
        let _ = writeln!(
            o,
            "loss     {} (val {}), {trend}",
            opt(self.loss, &|l| format!("{l:.4}")),
            opt(self.val_loss, &|l| format!("{l:.4}"))
        );
        let _ = writeln!(
            o,
            "tokens   {} seen, {} tokens/s, MFU {}",
            opt(self.tokens, &|t| format!("{t:.3e}")),
            opt(self.tokens_per_s, &|t| format!("{t:.0}")),
            opt(self.mfu, &|m| format!("{:.1} %", m * 100.0))
        );
        let _ = writeln!(
            o,
            "spend    {} spent, {} projected, cap {}",
            opt(self.spent_usd, &|u| format!("${u:.2}")),
            opt(self.projected_usd, &|u| format!("${u:.2}")),
            opt(self.cap_usd, &|u| format!("${u:.2}"))
        );
        if self.recent.is_empty() {
            let _ = writeln!(o, "alerts   none");
        }
        for e in &self.recent {
            let what = e.str("reason").or(e.str("flag")).unwrap_or("");
            let _ = writeln!(
                o,
                "alert    {} step {} {} {what}",
                e.time_utc, e.step, e.kind
            );
        }
        if let Some(p) = &self.projection {
            let _ = writeln!(
                o,
                "project  final loss ~{:.3} at step {} (90 % interval {:.3}–{:.3}; power law fit on {} {} points){}{}",
                p.loss,
                p.at_step,
                p.interval.0,
                p.interval.1,
                p.points,
                p.curve,
                p.completion_utc.as_ref().map(|t| format!("; completion {t}")).unwrap_or_default(),
                p.remaining_cost_usd.map(|c| format!("; remaining cost ~${c:.2}")).unwrap_or_default()
            );
        }
        let _ = writeln!(o, "updated  {}", self.updated_utc);
        o
    }
}
