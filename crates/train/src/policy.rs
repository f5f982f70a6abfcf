//! The seam through which everything that may stop, skip or rewind a step decides: the signal
//! handler, the non-finite check, the spike response and (wired by the binary) the budget
//! guard. Each is a [`StepPolicy`]; the trainer asks all of them at three moments of a step
//! and acts on the most severe answer, so the loop itself never grows a new `if` per concern.

use std::collections::BTreeMap;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stream::{SampleRange, StepData};

/// Why a run stops early; each maps to an exit code and a final `status.json` state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Stop {
    /// SIGINT/SIGTERM: emergency checkpoint, exit 128 + signal.
    Interrupted { signal: i32 },
    /// The stability policy: exit 5 (the last good weights are on disk).
    Unstable { reason: String },
    /// The budget guard: exit 3 after a checkpoint, or 4 with none.
    Budget { exit_code: u8, reason: String },
    /// A stop rule of `[eval]` (plateau, overfitting): a checkpoint, exit 0.
    Early { reason: String },
}

impl Stop {
    /// Whether the stop sequence writes a checkpoint of the current (good) state first.
    pub fn checkpoints(&self) -> bool {
        match self {
            Stop::Interrupted { .. } | Stop::Unstable { .. } | Stop::Early { .. } => true,
            Stop::Budget { exit_code, .. } => *exit_code == 3,
        }
    }

    /// The `status.json` state it leaves.
    pub fn state(&self) -> &'static str {
        match self {
            Stop::Interrupted { .. } => "interrupted",
            Stop::Unstable { .. } => "unstable",
            Stop::Budget { .. } => "budget_stopped",
            Stop::Early { .. } => "stopped_early",
        }
    }
}

/// Undo back to the newest good checkpoint at or before `to_step` steps and never train on
/// `skip` again; with `then_stop`, stop there (exit 5) and let a person decide.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollback {
    pub to_step: u64,
    pub skip: Vec<SampleRange>,
    pub reason: String,
    pub then_stop: bool,
}

/// A policy's answer, in increasing severity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Decision {
    Continue,
    /// Take the step (data consumed, step counted) but do not apply its update.
    SkipUpdate {
        reason: String,
    },
    Rollback(Rollback),
    Stop(Stop),
}

impl Decision {
    fn severity(&self) -> u8 {
        match self {
            Decision::Continue => 0,
            Decision::SkipUpdate { .. } => 1,
            Decision::Rollback(_) => 2,
            Decision::Stop(_) => 3,
        }
    }

    /// The more severe of two answers (the earlier one on a tie).
    pub fn or(self, other: Decision) -> Decision {
        if other.severity() > self.severity() {
            other
        } else {
            self
        }
    }
}

/// What the policies see of a step.
pub struct StepView<'a> {
    /// Steps completed before this one (this step's 0-based index).
    pub step: u64,
    pub total_steps: u64,
    pub loss: f64,
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f64,
    pub clip_scale: f64,
    pub lr: f64,
    pub data: &'a StepData,
    /// Steps taken and seconds spent by this process so far (for pace projections).
    pub steps_this_session: u64,
    pub elapsed_s: f64,
    /// This step ends on a checkpoint boundary.
    pub at_checkpoint: bool,
    /// This step's metrics row is due (every `log_every` steps and the last one).
    pub at_log: bool,
    /// The validation loss measured after this step (after-update policies only).
    pub val_loss: Option<f64>,
}

/// Where policies report: events (events.jsonl), alerts (the webhook), the console, a flag
/// on this step's metrics row (which also makes the trainer log the step), and columns of it.
pub trait Journal {
    fn event(&mut self, step: u64, kind: &str, fields: Value);
    fn alert(&mut self, text: &str);
    fn say(&mut self, line: &str);
    fn flag_step(&mut self, flag: &str);
    /// A column for this step's metrics row, if the step is logged.
    fn metric(&mut self, name: &str, value: f64);
}

pub trait StepPolicy {
    /// Key of this policy's state in state.json.
    fn name(&self) -> &'static str;
    /// Before any work on step `step`.
    fn before_step(&mut self, _step: u64, _journal: &mut dyn Journal) -> Decision {
        Decision::Continue
    }
    /// After forward and backward, before the update: loss and gradient norm are known.
    fn after_backward(&mut self, _view: &StepView, _journal: &mut dyn Journal) -> Decision {
        Decision::Continue
    }
    /// After the update was applied (or skipped) and logged, before the checkpoint.
    fn after_update(&mut self, _view: &StepView, _journal: &mut dyn Journal) -> Decision {
        Decision::Continue
    }
    /// While it may still roll back: the newest checkpoint at or before this step must survive
    /// retention.
    fn rollback_target(&self) -> Option<u64> {
        None
    }
    /// State to keep in checkpoints, so a resumed run decides exactly as before.
    fn save(&self) -> Option<Value> {
        None
    }
    /// Restores what [`StepPolicy::save`] returned (`None`: a fresh start).
    fn restore(&mut self, _state: Option<&Value>) -> Result<()> {
        Ok(())
    }
}

/// The policies of a run, asked in order; the most severe answer wins.
#[derive(Default)]
pub struct Policies(pub Vec<Box<dyn StepPolicy>>);

impl Policies {
    pub fn before_step(&mut self, step: u64, j: &mut dyn Journal) -> Decision {
        self.0
            .iter_mut()
            .fold(Decision::Continue, |d, p| d.or(p.before_step(step, j)))
    }

    pub fn after_backward(&mut self, view: &StepView, j: &mut dyn Journal) -> Decision {
        self.0
            .iter_mut()
            .fold(Decision::Continue, |d, p| d.or(p.after_backward(view, j)))
    }

    pub fn after_update(&mut self, view: &StepView, j: &mut dyn Journal) -> Decision {
        self.0
            .iter_mut()
            .fold(Decision::Continue, |d, p| d.or(p.after_update(view, j)))
    }

    /// The earliest step a policy may still roll back to.
    pub fn rollback_target(&self) -> Option<u64> {
        self.0.iter().filter_map(|p| p.rollback_target()).min()
    }

    pub fn save(&self) -> BTreeMap<String, Value> {
        self.0
            .iter()
            .filter_map(|p| Some((p.name().to_string(), p.save()?)))
            .collect()
    }

    pub fn restore(&mut self, states: &BTreeMap<String, Value>) -> Result<()> {
        for p in &mut self.0 {
            p.restore(states.get(p.name()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_severe_answer_wins_and_ties_keep_the_first() {
        let skip = Decision::SkipUpdate { reason: "a".into() };
        let stop = Decision::Stop(Stop::Unstable { reason: "b".into() });
        assert_eq!(Decision::Continue.or(skip.clone()), skip);
        assert_eq!(stop.clone().or(skip.clone()), stop);
        let other = Decision::SkipUpdate { reason: "c".into() };
        assert_eq!(skip.clone().or(other), skip);
        assert!(Stop::Budget {
            exit_code: 3,
            reason: String::new()
        }
        .checkpoints());
        assert!(!Stop::Budget {
            exit_code: 4,
            reason: String::new()
        }
        .checkpoints());
    }
}
