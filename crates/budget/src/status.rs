//! The trainer's `status.json` (lab-run's [`Status`]) as the budget code needs it: where the run
//! stands and how long a step takes, for the projection spent + rate × remaining hours.

use std::path::Path;

use anyhow::{Context, Result};
use lab_run::Status;

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

    fn of(status: &Status) -> Progress {
        Progress {
            step: status.step,
            total_steps: status.total_steps,
            sec_per_step: status.secs_per_step.filter(|s| s.is_finite() && *s >= 0.0),
        }
    }
}

/// Reads a `status.json` (tolerant of extra fields; strict about `step` and `total_steps`).
pub fn read_status(path: &Path) -> Result<Progress> {
    Ok(Progress::of(&Status::read_file(path)?))
}

pub fn parse_status(text: &str) -> Result<Progress> {
    let status: Status = serde_json::from_str(text).context("not a valid status.json")?;
    Ok(Progress::of(&status))
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
        assert!(e.contains("invalid type"), "{e}");
        let e = format!("{:#}", parse_status(r#"{"total_steps": 10}"#).unwrap_err());
        assert!(e.contains("`step`"), "{e}");
    }
}
