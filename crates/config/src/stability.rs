//! `[stability]`: how a run watches its own loss and what it does about a spike, and `[spike]`:
//! a seeded, reproducible loss spike injected on purpose (lab 00's fire drill).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// What the run does when the detector flags a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpikePolicy {
    /// Apply the update and watch; escalate if the loss is not back within `recovery_steps`.
    Wait,
    /// Restore the last good checkpoint in-process, skip the offending data, continue.
    Rollback,
    /// Drop this step's update (llm.c's `skip_update_lossz`) and continue.
    Skip,
    /// Checkpoint and stop with exit 5.
    Kill,
}

/// What `wait` does when the loss has not recovered by its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Escalation {
    Rollback,
    Kill,
}

/// `[stability]` as written. Windows and deadlines left out are scaled to the run's length
/// (see [`StabilityConfig::resolve`]), so a 300-step CPU lab detects and recovers within its
/// length and an 84,000-step run gets the full defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StabilityConfig {
    /// Steps in the rolling window each loss is compared with. Default: `total_steps / 10`,
    /// between 10 and 50.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Steps the window must hold before the detector decides anything (at most the window).
    pub min_history: usize,
    /// A loss spike needs a z-score of at least this against the window (llm.c uses 5) …
    pub loss_zscore: f64,
    /// … and a ratio to the window's mean of at least this (the case study's "> 20 % above the
    /// moving average"). 0 disables either condition.
    pub loss_ratio: f64,
    /// A gradient-norm explosion: the pre-clip norm at least this many times the window's mean
    /// norm. 0 disables.
    pub grad_norm_ratio: f64,
    /// Report a plateau when the window's mean loss has not improved on its best by
    /// `plateau_min_delta` (relative) for this many steps; 0 disables. Default: `total_steps
    /// / 4`, between the window and 1,000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plateau_steps: Option<usize>,
    pub plateau_min_delta: f64,
    pub policy: SpikePolicy,
    /// `wait`: steps the loss has to come back within `recovery_margin` of the pre-spike mean.
    /// Default: `total_steps / 20`, between 5 and 50.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_steps: Option<usize>,
    pub recovery_margin: f64,
    pub escalate: Escalation,
    /// Rollbacks allowed in one run; one more stops it with exit 5.
    pub max_rollbacks: usize,
}

impl Default for StabilityConfig {
    fn default() -> Self {
        Self {
            window: None,
            min_history: 10,
            loss_zscore: 5.0,
            loss_ratio: 1.2,
            grad_norm_ratio: 10.0,
            plateau_steps: None,
            plateau_min_delta: 0.001,
            policy: SpikePolicy::Wait,
            recovery_steps: None,
            recovery_margin: 0.05,
            escalate: Escalation::Rollback,
            max_rollbacks: 10,
        }
    }
}

/// The stability settings a run uses: [`StabilityConfig`] with every window resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stability {
    pub window: usize,
    pub min_history: usize,
    pub loss_zscore: f64,
    pub loss_ratio: f64,
    pub grad_norm_ratio: f64,
    pub plateau_steps: usize,
    pub plateau_min_delta: f64,
    pub policy: SpikePolicy,
    pub recovery_steps: usize,
    pub recovery_margin: f64,
    pub escalate: Escalation,
    pub max_rollbacks: usize,
}

impl StabilityConfig {
    pub fn validate(&self) -> Result<()> {
        if self.window.is_some_and(|w| w < 2) {
            bail!("stability.window ({:?}) must be at least 2", self.window);
        }
        if self.min_history < 2 {
            bail!(
                "stability.min_history ({}) must be at least 2",
                self.min_history
            );
        }
        for (name, v) in [
            ("loss_zscore", self.loss_zscore),
            ("loss_ratio", self.loss_ratio),
            ("grad_norm_ratio", self.grad_norm_ratio),
            ("plateau_min_delta", self.plateau_min_delta),
            ("recovery_margin", self.recovery_margin),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                bail!("stability.{name} ({v}) must be a finite number >= 0");
            }
        }
        if self.recovery_steps == Some(0) {
            bail!("stability.recovery_steps must be > 0");
        }
        Ok(())
    }

    /// The settings for a run of `total_steps`.
    pub fn resolve(&self, total_steps: usize) -> Stability {
        let window = self.window.unwrap_or((total_steps / 10).clamp(10, 50));
        Stability {
            window,
            min_history: self.min_history.min(window),
            loss_zscore: self.loss_zscore,
            loss_ratio: self.loss_ratio,
            grad_norm_ratio: self.grad_norm_ratio,
            plateau_steps: self
                .plateau_steps
                .unwrap_or((total_steps / 4).clamp(window, 1000.max(window))),
            plateau_min_delta: self.plateau_min_delta,
            policy: self.policy,
            recovery_steps: self
                .recovery_steps
                .unwrap_or((total_steps / 20).clamp(5, 50)),
            recovery_margin: self.recovery_margin,
            escalate: self.escalate,
            max_rollbacks: self.max_rollbacks,
        }
    }
}

/// Which kind of batch an injected spike feeds the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpikeKind {
    /// Sequences of tokens drawn from the rarest 1 % of train.bin's unigram mass.
    RareToken,
    /// Windows from inside the longest documents of train.bin (no end-of-text in sight).
    LongDoc,
    /// One short random token pattern repeated to fill every row.
    Repeated,
}

impl SpikeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RareToken => "rare-token",
            Self::LongDoc => "long-doc",
            Self::Repeated => "repeated",
        }
    }
}

/// `[spike]`: inject `batches` spike batches from step `at_step` on (steps counted from 1, as
/// metrics.jsonl and every log line count them: step `at_step` is the first to train on a
/// spike batch). The batches are drawn from the run seed and do not consume the data cursor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpikeConfig {
    pub at_step: u64,
    #[serde(default = "default_spike_batches")]
    pub batches: u64,
    #[serde(default = "default_spike_kind")]
    pub kind: SpikeKind,
}

fn default_spike_batches() -> u64 {
    5
}
fn default_spike_kind() -> SpikeKind {
    SpikeKind::RareToken
}

impl SpikeConfig {
    pub fn new(at_step: u64) -> Self {
        Self {
            at_step,
            batches: default_spike_batches(),
            kind: default_spike_kind(),
        }
    }

    pub fn validate(&self, total_steps: usize) -> Result<()> {
        if self.batches == 0 {
            bail!("spike.batches (--spike-batches) must be > 0");
        }
        if self.at_step == 0 || self.at_step > total_steps as u64 {
            bail!(
                "spike.at_step (--inject-spike-at-step {}) must be a step of the run, 1 to train.total_steps ({total_steps})",
                self.at_step
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_runs_get_short_windows_and_explicit_settings_are_kept() {
        let d = StabilityConfig::default();
        let short = d.resolve(300);
        assert_eq!(
            (short.window, short.recovery_steps, short.plateau_steps),
            (30, 15, 75)
        );
        let long = d.resolve(84_000);
        assert_eq!(
            (long.window, long.recovery_steps, long.plateau_steps),
            (50, 50, 1000)
        );
        let tiny = d.resolve(20);
        assert_eq!(
            (tiny.window, tiny.min_history, tiny.recovery_steps),
            (10, 10, 5)
        );
        let explicit = StabilityConfig {
            window: Some(200),
            recovery_steps: Some(40),
            plateau_steps: Some(0),
            ..Default::default()
        }
        .resolve(60);
        assert_eq!(
            (
                explicit.window,
                explicit.recovery_steps,
                explicit.plateau_steps
            ),
            (200, 40, 0)
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let mut s = StabilityConfig {
            loss_ratio: -1.0,
            ..Default::default()
        };
        assert!(format!("{}", s.validate().unwrap_err()).contains("stability.loss_ratio"));
        s.loss_ratio = 1.2;
        s.window = Some(1);
        assert!(format!("{}", s.validate().unwrap_err()).contains("stability.window"));
        assert!(SpikeConfig::new(300).validate(300).is_ok());
        let e = SpikeConfig::new(301).validate(300).unwrap_err();
        assert!(format!("{e}").contains("--inject-spike-at-step"), "{e}");
    }
}
