//! Before any GPU time: refuse (exit 4) when the cap is already reached, when the planned run
//! is projected past the cap, when the hourly price is above the maximum, or when budget.json
//! cannot be trusted. The same checks, as a table, are `--dry-run-budget` and `lab budget check`.

use serde_json::{json, Value};

use crate::file::Reading;
use crate::guard::GuardSettings;

/// The run about to start.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PlannedRun {
    pub total_steps: u64,
    /// First step to run (non-zero when resuming).
    pub start_step: u64,
    /// Measured seconds per step (from a previous status.json), if any.
    pub sec_per_step: Option<f64>,
    /// Fallback estimate of the whole run's wall clock (`budget.planned_hours`).
    pub planned_hours: Option<f64>,
}

impl PlannedRun {
    /// The run from its planned length and, when there is one, the step it starts at and the
    /// step time a previous attempt measured (its status.json).
    pub fn new(
        total_steps: u64,
        start_step: u64,
        previous: Option<crate::status::Progress>,
        planned_hours: Option<f64>,
    ) -> Self {
        Self {
            total_steps,
            start_step,
            sec_per_step: previous.and_then(|s| s.sec_per_step),
            planned_hours,
        }
    }

    /// Hours still to run, and how that number was obtained.
    pub fn hours(&self) -> Option<(f64, String)> {
        let left = self.total_steps.saturating_sub(self.start_step);
        if let Some(s) = self.sec_per_step {
            return Some((
                left as f64 * s / 3600.0,
                format!("{left} steps × {s:.3} s measured"),
            ));
        }
        self.planned_hours.map(|h| {
            let frac = if self.total_steps == 0 {
                1.0
            } else {
                left as f64 / self.total_steps as f64
            };
            (
                h * frac,
                format!(
                    "budget.planned_hours {h} × {left}/{} steps left",
                    self.total_steps
                ),
            )
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Worth knowing, does not block the launch.
    Note,
    Refuse,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub check: &'static str,
    pub value: String,
    pub limit: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub source: String,
    pub rows: Vec<Row>,
    /// The first reason to refuse, if any (one line).
    pub refusal: Option<String>,
}

impl Report {
    pub fn launch(&self) -> bool {
        self.refusal.is_none()
    }

    /// 0 to launch, 4 to refuse (DESIGN.md: stopped by the budget guard, nothing spent).
    pub fn exit_code(&self) -> u8 {
        if self.launch() {
            0
        } else {
            4
        }
    }

    /// The decision table as text.
    pub fn render(&self) -> String {
        let mut out = format!("budget guard, source {}\n", self.source);
        let w0 = self
            .rows
            .iter()
            .map(|r| r.check.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let w1 = self
            .rows
            .iter()
            .map(|r| r.value.chars().count())
            .max()
            .unwrap_or(5)
            .max(5);
        let w2 = self
            .rows
            .iter()
            .map(|r| r.limit.chars().count())
            .max()
            .unwrap_or(5)
            .max(5);
        out.push_str(&format!(
            "{:w0$}  {:w1$}  {:w2$}  result\n",
            "check", "value", "limit"
        ));
        for r in &self.rows {
            let res = match r.outcome {
                Outcome::Ok => "ok",
                Outcome::Note => "note",
                Outcome::Refuse => "REFUSE",
            };
            out.push_str(&format!(
                "{:w0$}  {:w1$}  {:w2$}  {res}\n",
                r.check, r.value, r.limit,
            ));
        }
        match &self.refusal {
            None => out.push_str("decision: launch (exit 0)\n"),
            Some(r) => out.push_str(&format!("decision: refuse to launch (exit 4): {r}\n")),
        }
        out
    }

    pub fn to_json(&self) -> Value {
        json!({
            "source": self.source,
            "launch": self.launch(),
            "exit_code": self.exit_code(),
            "refusal": self.refusal,
            "rows": self.rows.iter().map(|r| json!({
                "check": r.check,
                "value": r.value,
                "limit": r.limit,
                "outcome": match r.outcome { Outcome::Ok => "ok", Outcome::Note => "note", Outcome::Refuse => "refuse" },
            })).collect::<Vec<_>>(),
        })
    }
}

/// Runs the pre-launch checks on a reading of budget.json at `now`.
pub fn prelaunch(s: &GuardSettings, reading: &Reading, plan: &PlannedRun, source: &str) -> Report {
    let mut rows = Vec::new();
    let mut refusal: Option<String> = None;
    let mut refuse = |rows: &mut Vec<Row>, row: Row, why: String| {
        rows.push(row);
        refusal.get_or_insert(why);
    };
    let cap = s.cap_usd;
    let file = match reading {
        Reading::Fresh { file, age_s } => {
            rows.push(Row {
                check: "budget.json age",
                value: format!(
                    "{age_s:.0} s ({})",
                    file.provider.as_deref().unwrap_or("unknown provider")
                ),
                limit: format!("<= {:.0} s", s.stale_after_s()),
                outcome: Outcome::Ok,
            });
            file
        }
        Reading::Bad { reason, .. } => {
            refuse(
                &mut rows,
                Row {
                    check: "budget.json",
                    value: "untrusted".into(),
                    limit: "fresh, well-formed".into(),
                    outcome: Outcome::Refuse,
                },
                reason.clone(),
            );
            return Report {
                source: source.to_string(),
                rows,
                refusal,
            };
        }
    };
    let spent = file.spent_usd;
    let rate = file.rate_usd_per_hr;
    let row = Row {
        check: "spent so far",
        value: format!("${spent:.2}"),
        limit: format!("< cap ${cap:.2}"),
        outcome: if spent >= cap {
            Outcome::Refuse
        } else {
            Outcome::Ok
        },
    };
    if spent >= cap {
        refuse(
            &mut rows,
            row,
            format!("the cap is already reached: spent ${spent:.2} >= cap ${cap:.2}"),
        );
    } else {
        rows.push(row);
    }
    if let Some(a) = s.alert_usd {
        rows.push(Row {
            check: "alert threshold",
            value: format!("${spent:.2}"),
            limit: format!("alert ${a:.2}"),
            outcome: if spent > a {
                Outcome::Note
            } else {
                Outcome::Ok
            },
        });
    }
    match s.max_price_usd_per_hr {
        Some(max) => {
            let row = Row {
                check: "hourly price",
                value: format!("${rate:.2}/h"),
                limit: format!("<= ${max:.2}/h"),
                outcome: if rate > max {
                    Outcome::Refuse
                } else {
                    Outcome::Ok
                },
            };
            if rate > max {
                refuse(
                    &mut rows,
                    row,
                    format!("the price ${rate:.2}/h is above --max-price-usd-per-hr ${max:.2}/h"),
                );
            } else {
                rows.push(row);
            }
        }
        None => rows.push(Row {
            check: "hourly price",
            value: format!("${rate:.2}/h"),
            limit: "no maximum set".into(),
            outcome: Outcome::Note,
        }),
    }
    // The plan's projection, and the sidecar's own (it may know more: the run's ETA, a
    // resumed run's remaining steps): the larger one decides.
    let planned = plan.hours().map(|(h, how)| {
        rows.push(Row {
            check: "planned run",
            value: format!("{h:.2} h"),
            limit: how,
            outcome: Outcome::Ok,
        });
        let p = spent + rate * h;
        let why = format!(
            "the planned run is projected at ${p:.2} (spent ${spent:.2} + ${rate:.2}/h × {h:.2} h), above the cap ${cap:.2}"
        );
        (p, why)
    });
    let sidecar = (file.projected_total_usd > spent).then(|| {
        let p = file.projected_total_usd;
        let why =
            format!("budget.json ({source}) projects a total of ${p:.2}, above the cap ${cap:.2}");
        (p, why)
    });
    match [planned, sidecar]
        .into_iter()
        .flatten()
        .max_by(|a, b| a.0.total_cmp(&b.0))
    {
        Some((projected, why)) => {
            let row = Row {
                check: "projected total",
                value: format!("${projected:.2}"),
                limit: format!("<= cap ${cap:.2}"),
                outcome: if projected > cap {
                    Outcome::Refuse
                } else {
                    Outcome::Ok
                },
            };
            if projected > cap {
                refuse(&mut rows, row, why);
            } else {
                rows.push(row);
            }
        }
        None => rows.push(Row {
            check: "projected total",
            value: "unknown".into(),
            limit: "no step time yet; set budget.planned_hours".into(),
            outcome: Outcome::Note,
        }),
    }
    Report {
        source: source.to_string(),
        rows,
        refusal,
    }
}
