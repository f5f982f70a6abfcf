//! `spike-postmortem.md`: what happened around each loss spike of a run, every number taken
//! from the run's own files. For each spike: the timeline, peak ratio, steps to recover,
//! clipping engagement, the forensics of the offending batch against the running averages, the
//! action taken and its effect, and a PNG of loss and gradient norm zoomed around it. A run
//! without spikes gets a report that says so plainly.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use lab_plot::{line_charts_png, Marker, Panel, Series};
use lab_run::{Event, MetricsRow};
use serde_json::Value;

use crate::run_files::RunFiles;

/// What the run did about a spike.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `wait`: the loss came back by itself at `step`.
    Recovered { step: u64 },
    /// `wait` past its deadline, or `rollback` at once: back to `to_step`, data skipped.
    RolledBack {
        at: u64,
        to_step: u64,
        skipped: usize,
    },
    /// `wait` past its deadline with `escalate = "kill"`, or `kill`: the run stopped.
    Stopped { at: u64, reason: String },
    /// `skip`: the update of the flagged step was dropped.
    UpdateSkipped,
    /// Still open when the run's files end.
    Open,
}

/// One spike as the run's files tell it.
#[derive(Debug, Clone)]
pub struct Spike {
    pub detected: Event,
    /// Metrics step of the flagged step.
    pub onset: u64,
    pub flag: String,
    /// The detector's window mean before the spike.
    pub baseline: f64,
    pub peak_loss: f64,
    pub peak_step: u64,
    pub peak_ratio: f64,
    /// Steps from the onset to the first step whose loss is back within the recovery margin.
    pub steps_to_recover: Option<u64>,
    pub action: Action,
    /// Steps of the incident whose gradient was clipped, out of those logged, and the smallest
    /// clip factor.
    pub clipped: (usize, usize, f64),
    /// The incident's metrics rows (from the timeline it happened in).
    pub rows: Vec<MetricsRow>,
    /// Whether a rollback later undid these steps (their rows are the abandoned ones).
    pub undone_by_rollback: Option<u64>,
}

pub struct Postmortem {
    pub files: RunFiles,
    pub spikes: Vec<Spike>,
}

/// Kinds of events that belong on the stability timeline.
const TIMELINE: &[&str] = &[
    "spike_injected",
    "spike_detected",
    "spike_recovered",
    "spike_escalated",
    "update_skipped",
    "nonfinite",
    "rollback",
    "plateau",
    "unstable",
    "resume",
    "interrupted",
];

impl Postmortem {
    pub fn read(run_dir: &Path) -> Result<Postmortem> {
        Ok(Self::of(RunFiles::read(run_dir)?))
    }

    /// The post-mortem of a run folder already read.
    pub fn of(files: RunFiles) -> Postmortem {
        let spikes = spikes(&files);
        Postmortem { files, spikes }
    }

    /// Writes the markdown to `output` (default `RUN/spike-postmortem.md`) and a PNG per spike
    /// beside it. Returns the markdown's path.
    pub fn write(&self, output: Option<&Path>) -> Result<PathBuf> {
        let out = output.map_or_else(
            || self.files.dir.join("spike-postmortem.md"),
            Path::to_path_buf,
        );
        let folder = out.parent().unwrap_or(Path::new(".")).to_path_buf();
        std::fs::create_dir_all(&folder)?;
        let mut charts = Vec::new();
        for s in &self.spikes {
            let name = format!("spike-step-{}.png", s.onset);
            spike_chart(self, s, &folder.join(&name))?;
            charts.push(name);
        }
        lab_fsio::write_atomic(&out, self.render(&charts).as_bytes())?;
        Ok(out)
    }

    fn margin(&self) -> f64 {
        self.files
            .config
            .as_ref()
            .map_or(0.05, |c| c.stability().recovery_margin)
    }
}

/// Every `spike_detected` event, followed through the events after it.
fn spikes(files: &RunFiles) -> Vec<Spike> {
    let mut out = Vec::new();
    for (i, e) in files.events.iter().enumerate() {
        if e.kind != "spike_detected" {
            continue;
        }
        let onset = e.step;
        let later = &files.events[i + 1..];
        // The first rollback after the detection that rewinds past the onset undid it.
        let undone = later
            .iter()
            .find(|r| r.kind == "rollback" && r.u64("to_step").is_some_and(|t| t < onset));
        let undone_by = undone.and_then(|r| r.u64("rollbacks"));
        let action = action_of(e, later);
        let end = match &action {
            Action::Recovered { step } => *step,
            Action::RolledBack { at, .. } | Action::Stopped { at, .. } => *at,
            Action::UpdateSkipped => onset,
            Action::Open => u64::MAX,
        };
        let timeline: Vec<MetricsRow> = match undone_by {
            Some(k) => files
                .abandoned
                .iter()
                .filter(|r| r.extra.get("rollback") == Some(&(k as f64)))
                .cloned()
                .collect(),
            None => files.metrics.clone(),
        };
        let rows: Vec<MetricsRow> = timeline
            .into_iter()
            .filter(|r| r.step >= onset && r.step <= end)
            .collect();
        let baseline = e.f64("window_mean").unwrap_or(f64::NAN);
        let (mut peak_loss, mut peak_step) = (e.f64("loss").unwrap_or(f64::NAN), onset);
        for r in &rows {
            if r.loss > peak_loss {
                (peak_loss, peak_step) = (r.loss, r.step);
            }
        }
        let clipped = rows.iter().filter(|r| r.clip_scale < 1.0).count();
        let min_scale = rows.iter().map(|r| r.clip_scale).fold(1.0, f64::min);
        out.push(Spike {
            detected: e.clone(),
            onset,
            flag: e.str("flag").unwrap_or("spike").to_string(),
            baseline,
            peak_loss,
            peak_step,
            peak_ratio: peak_loss / baseline,
            steps_to_recover: match action {
                Action::Recovered { step } => Some(step - onset),
                _ => None,
            },
            action,
            clipped: (clipped, rows.len(), min_scale),
            rows,
            undone_by_rollback: undone_by,
        });
    }
    out
}

/// What followed a detection: the first closing event of its incident.
fn action_of(detected: &Event, later: &[Event]) -> Action {
    if detected.str("policy") == Some("skip") {
        return Action::UpdateSkipped;
    }
    for e in later {
        match e.kind.as_str() {
            "spike_recovered" => return Action::Recovered { step: e.step },
            "rollback" => {
                return Action::RolledBack {
                    at: e.step,
                    to_step: e.u64("to_step").unwrap_or(0),
                    skipped: e
                        .fields
                        .get("skipped")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len),
                }
            }
            "unstable" => {
                return Action::Stopped {
                    at: e.step,
                    reason: e.str("reason").unwrap_or("").to_string(),
                }
            }
            _ => {}
        }
    }
    Action::Open
}

/// Writes the post-mortem of `run_dir` to `output` (default `RUN/spike-postmortem.md`) and a
/// PNG per spike beside it. Returns the markdown's path.
pub fn write_postmortem(run_dir: &Path, output: Option<&Path>) -> Result<PathBuf> {
    Postmortem::read(run_dir)?.write(output)
}

fn spike_chart(pm: &Postmortem, s: &Spike, path: &Path) -> Result<()> {
    let end = match s.action {
        Action::Recovered { step } | Action::RolledBack { at: step, .. } => step,
        Action::Stopped { at, .. } => at,
        _ => s.onset,
    };
    let end = end.max(s.onset);
    let pad = (end - s.onset).max(10) * 2;
    let (lo, hi) = (s.onset.saturating_sub(pad), end + pad);
    let near = |rows: &[MetricsRow], f: fn(&MetricsRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r.step >= lo && r.step <= hi)
            .map(|r| (r.step as f64, f(r)))
            .collect()
    };
    let mut loss = vec![Series {
        name: "train loss".into(),
        points: near(&pm.files.metrics, |r| r.loss),
        dots: true,
    }];
    let mut norm = vec![Series {
        name: "grad norm (pre-clip)".into(),
        points: near(&pm.files.metrics, |r| r.grad_norm),
        dots: true,
    }];
    if s.undone_by_rollback.is_some() {
        loss.push(Series {
            name: "loss, undone by rollback".into(),
            points: near(&s.rows, |r| r.loss),
            dots: true,
        });
        norm.push(Series {
            name: "grad norm, undone".into(),
            points: near(&s.rows, |r| r.grad_norm),
            dots: true,
        });
    }
    let mut markers = vec![Marker {
        x: s.onset as f64,
        label: format!("spike {}", s.onset),
    }];
    if end != s.onset {
        markers.push(Marker {
            x: end as f64,
            label: match s.action {
                Action::Recovered { .. } => "recovered".into(),
                _ => "action".into(),
            },
        });
    }
    let panel = |title: &str, y: &str, series: Vec<Series>, log_y| Panel {
        title: title.into(),
        x_label: "step".into(),
        y_label: y.into(),
        series,
        markers: markers.clone(),
        log_y,
        x_range: Some((lo as f64, hi as f64)),
    };
    line_charts_png(
        path,
        900,
        &[
            panel(
                &format!("Loss around the spike at step {}", s.onset),
                "loss (nats/token)",
                loss,
                false,
            ),
            panel(
                "Gradient norm around the spike",
                "global L2 norm (log)",
                norm,
                true,
            ),
        ],
    )
}

fn num(v: Option<&Value>) -> String {
    match v.and_then(Value::as_f64) {
        Some(x) if x.abs() >= 100.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.4}"),
        None => "–".into(),
    }
}

impl Postmortem {
    /// The markdown, with `charts[i]` the PNG file name of spike `i`.
    pub fn render(&self, charts: &[String]) -> String {
        let mut md = String::new();
        let f = &self.files;
        let _ = writeln!(md, "# Spike post-mortem: {}\n", f.dir.display());
        let last_step = f.metrics.last().map_or(0, |r| r.step);
        let injected: Vec<&Event> = f.events_of("spike_injected").collect();
        let _ = writeln!(
            md,
            "Written by `lab postmortem` from the run's metrics.jsonl, metrics-abandoned.jsonl and events.jsonl. The run's metrics end at step {last_step}.\n"
        );
        if !injected.is_empty() {
            let steps: Vec<String> = injected.iter().map(|e| e.step.to_string()).collect();
            let kind = injected[0].str("spike_kind").unwrap_or("unknown");
            let _ = writeln!(
                md,
                "**Injected spike**: {} {kind} batch(es), at step(s) {} (they do not move the data cursor).\n",
                injected.len(),
                steps.join(", ")
            );
        }
        if self.spikes.is_empty() {
            let s = f.config.as_ref().map(|c| c.stability());
            let how = s.map_or(String::new(), |s| {
                format!(
                    " (detector: a loss at least {}× the mean of a {}-step window with a z-score of at least {}, or a gradient norm {}× its window mean)",
                    s.loss_ratio, s.window, s.loss_zscore, s.grad_norm_ratio
                )
            });
            let _ = writeln!(md, "**No loss spike was detected in this run**{how}. Nothing was rolled back or skipped.\n");
        } else {
            let _ = writeln!(md, "**{} spike(s) detected.**\n", self.spikes.len());
            self.summary_table(&mut md);
        }
        self.timeline(&mut md);
        for (i, s) in self.spikes.iter().enumerate() {
            self.spike_section(&mut md, s, charts.get(i));
        }
        md
    }

    fn summary_table(&self, md: &mut String) {
        md.push_str("| onset step | flag | pre-spike mean | peak loss (step) | peak ratio | steps to recover | clipping | action |\n|---|---|---|---|---|---|---|---|\n");
        for s in &self.spikes {
            let _ = writeln!(
                md,
                "| {} | {} | {:.4} | {:.4} ({}) | {:.3} | {} | {} of {} steps, min scale {:.3} | {} |",
                s.onset,
                s.flag,
                s.baseline,
                s.peak_loss,
                s.peak_step,
                s.peak_ratio,
                s.steps_to_recover.map_or("–".into(), |n| n.to_string()),
                s.clipped.0,
                s.clipped.1,
                s.clipped.2,
                action_text(&s.action)
            );
        }
        md.push('\n');
    }

    fn timeline(&self, md: &mut String) {
        let events: Vec<&Event> = self
            .files
            .events
            .iter()
            .filter(|e| TIMELINE.contains(&e.kind.as_str()))
            .collect();
        if events.is_empty() {
            return;
        }
        md.push_str("## Timeline\n\n| time (UTC) | step | event | details |\n|---|---|---|---|\n");
        for e in events {
            let detail = match e.kind.as_str() {
                "spike_injected" => format!(
                    "loss {} on an injected batch (rare-token share {})",
                    num(e.fields.get("loss")),
                    num(e.fields.get("batch").and_then(|b| b.get("rare_share")))
                ),
                "spike_detected" => format!(
                    "{}: loss {} = {}× window mean {}, z {}",
                    e.str("flag").unwrap_or(""),
                    num(e.fields.get("loss")),
                    num(e.fields.get("ratio")),
                    num(e.fields.get("window_mean")),
                    num(e.fields.get("z"))
                ),
                "spike_recovered" => format!(
                    "loss {} back within the margin after {} steps",
                    num(e.fields.get("loss")),
                    e.u64("steps_to_recover").unwrap_or(0)
                ),
                "rollback" => format!(
                    "to step {}: {}",
                    e.u64("to_step").unwrap_or(0),
                    e.str("reason").unwrap_or("")
                ),
                _ => e.str("reason").map(str::to_string).unwrap_or_default(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                e.time_utc, e.step, e.kind, detail
            );
        }
        md.push('\n');
    }

    fn spike_section(&self, md: &mut String, s: &Spike, chart: Option<&String>) {
        let d = &s.detected;
        let _ = writeln!(md, "## Spike at step {}\n", s.onset);
        if let Some(c) = chart {
            let _ = writeln!(
                md,
                "![loss and gradient norm around step {}]({c})\n",
                s.onset
            );
        }
        let injected = d.fields.get("injected").and_then(Value::as_bool) == Some(true);
        let _ = writeln!(
            md,
            "- Detected as **{}**: loss {:.4} against a window mean of {:.4} (std {}), ratio {:.3}, z-score {}. {}",
            s.flag,
            d.f64("loss").unwrap_or(f64::NAN),
            s.baseline,
            num(d.fields.get("window_std")),
            d.f64("ratio").unwrap_or(f64::NAN),
            num(d.fields.get("z")),
            if injected { "The batch was an injected one." } else { "The batch was real training data." }
        );
        let _ = writeln!(
            md,
            "- Peak loss {:.4} at step {}: **{:.3}×** the pre-spike mean.",
            s.peak_loss, s.peak_step, s.peak_ratio
        );
        match s.steps_to_recover {
            Some(n) => {
                let _ = writeln!(
                    md,
                    "- Recovered after **{n} steps** (the first step whose loss was back within {:.0} % of the pre-spike mean).",
                    self.margin() * 100.0
                );
            }
            None => {
                let _ = writeln!(md, "- The loss did not recover on its own.");
            }
        }
        let _ = writeln!(
            md,
            "- Learning rate {}; gradient norm {} before clipping ({}× its window mean); clipping engaged on {} of the {} logged steps of the incident (smallest scale {:.3}).",
            num(d.fields.get("lr")),
            num(d.fields.get("grad_norm")),
            num(d.fields.get("grad_norm_ratio")),
            s.clipped.0,
            s.clipped.1,
            s.clipped.2
        );
        md.push_str("\n**Forensics**: the flagged batch against the running averages of ordinary steps.\n\n| statistic | flagged batch | running average | ratio |\n|---|---|---|---|\n");
        for (key, label) in [
            ("mean_doc_len", "mean document length (tokens)"),
            (
                "rare_share",
                "share of rare tokens (bottom 1 % of unigram mass)",
            ),
            ("eot_share", "share of end-of-text tokens"),
        ] {
            let b = d
                .fields
                .get("batch")
                .and_then(|v| v.get(key))
                .and_then(Value::as_f64);
            let r = d
                .fields
                .get("running")
                .and_then(|v| v.get(key))
                .and_then(Value::as_f64);
            let ratio = match (b, r) {
                (Some(b), Some(r)) if r > 0.0 => format!("{:.2}", b / r),
                _ => "–".into(),
            };
            let _ = writeln!(
                md,
                "| {label} | {} | {} | {ratio} |",
                num(b.map(Value::from).as_ref()),
                num(r.map(Value::from).as_ref())
            );
        }
        let ranges = d
            .fields
            .get("ranges")
            .map(Value::to_string)
            .unwrap_or_default();
        let offsets = d
            .fields
            .get("file_offsets")
            .map(Value::to_string)
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "\nSample ranges: `{ranges}`; train.bin token offsets of the rows: `{offsets}`.\n"
        );
        let _ = writeln!(md, "**Action and effect**: {}\n", self.effect(s));
    }

    /// What was done and what it changed, from the events and the kept metrics.
    fn effect(&self, s: &Spike) -> String {
        let after = |step: u64| {
            self.files
                .metrics
                .iter()
                .find(|r| r.step >= step)
                .map(|r| format!(" In the kept timeline the loss at step {} is {:.4} (the spike's peak was {:.4}).", r.step, r.loss, s.peak_loss))
                .unwrap_or_default()
        };
        match &s.action {
            Action::Recovered { step } => format!(
                "waited (policy `wait`); the loss came back at step {step}, {} steps after the onset, with no intervention.",
                step - s.onset
            ),
            Action::RolledBack { at, to_step, skipped } => format!(
                "rolled back at step {at} to the checkpoint of step {to_step} and skipped {skipped} sample range(s) (the offending data is never trained on again).{}",
                after(s.onset)
            ),
            Action::Stopped { at, reason } => format!("the run stopped at step {at} (exit 5): {reason}."),
            Action::UpdateSkipped => format!("the update of step {} was dropped (policy `skip`); its data counts as consumed.{}", s.onset, after(s.onset + 1)),
            Action::Open => "none yet: the incident was still open when the run's files end.".into(),
        }
    }
}

fn action_text(a: &Action) -> String {
    match a {
        Action::Recovered { step } => format!("waited, recovered at {step}"),
        Action::RolledBack { to_step, .. } => format!("rolled back to {to_step}"),
        Action::Stopped { at, .. } => format!("stopped at {at}"),
        Action::UpdateSkipped => "update skipped".into(),
        Action::Open => "open".into(),
    }
}
