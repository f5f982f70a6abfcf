//! The trainer's `status.json` as the budget code needs it: where the run stands and how long
//! a step takes, for the projection spent + rate × remaining hours.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Step counts and measured step time of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub step: u64,
    pub total_steps: u64,
    /// Measured wall-clock seconds per optimizer step (None before any step was timed).
    pub sec_per_step: Option<f64>,
}

impl Progress {
    /// Hours the rest of the run will take at the measured pace.
    pub fn remaining_hours(&self) -> Option<f64> {
        let s = self.sec_per_step.filter(|s| s.is_finite() && *s >= 0.0)?;
        Some(self.total_steps.saturating_sub(self.step) as f64 * s / 3600.0)
    }
}

/// The key under which the trainer (`lab_train::run_log::Status`) publishes the measured
/// seconds per step.
const SECS_PER_STEP: &str = "secs_per_step";

/// Reads `status.json` (tolerant of extra fields; strict about the ones it needs).
pub fn read_status(path: &Path) -> Result<Progress> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read run status {}", path.display()))?;
    parse_status(&text).with_context(|| format!("run status {}", path.display()))
}

pub fn parse_status(text: &str) -> Result<Progress> {
    let v: Value = serde_json::from_str(text).context("not valid JSON")?;
    let int = |k: &str| -> Result<u64> {
        match v.get(k).and_then(Value::as_u64) {
            Some(n) => Ok(n),
            None => bail!("`{k}` is missing or not a non-negative integer"),
        }
    };
    let step = int("step")?;
    let total_steps = int("total_steps")?;
    let sec_per_step = v
        .get(SECS_PER_STEP)
        .and_then(Value::as_f64)
        .filter(|s| s.is_finite() && *s >= 0.0);
    Ok(Progress {
        step,
        total_steps,
        sec_per_step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_projects() {
        let p = parse_status(r#"{"step": 100, "total_steps": 1100, "secs_per_step": 3.6, "x": 1}"#)
            .unwrap();
        assert!((p.remaining_hours().unwrap() - 1.0).abs() < 1e-12);
        let p = parse_status(r#"{"step": 0, "total_steps": 10}"#).unwrap();
        assert_eq!(p.remaining_hours(), None);
        let e = format!(
            "{:#}",
            parse_status(r#"{"step": "1", "total_steps": 10}"#).unwrap_err()
        );
        assert!(e.contains("`step`"), "{e}");
    }
}
