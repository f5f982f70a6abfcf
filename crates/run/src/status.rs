//! `status.json`: where a run stands, rewritten atomically by the trainer at every log step and
//! at the end, and read by `lab status` and the budget guard.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// `step` and `total_steps` are required of a file that is read; the rest may be missing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// `running`, `done`, `interrupted`, `budget_stopped`, `unstable`, `stopped_early`.
    #[serde(default)]
    pub state: String,
    pub step: u64,
    pub total_steps: u64,
    pub loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// Wall-clock seconds per optimizer step, measured over the last log interval.
    pub secs_per_step: Option<f64>,
    pub mfu: Option<f64>,
    #[serde(default)]
    pub elapsed_s: f64,
    pub eta_s: Option<f64>,
    #[serde(default)]
    pub config_sha256: String,
    #[serde(default)]
    pub started_utc: String,
    #[serde(default)]
    pub updated_utc: String,
    /// The trainer's process id (`lab status` tells a live run from one whose process died).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

impl Status {
    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)? + "\n";
        lab_fsio::write_atomic(&run_dir.join(crate::STATUS), json.as_bytes())
    }

    /// Reads `run_dir/status.json`.
    pub fn read(run_dir: &Path) -> Result<Status> {
        Self::read_file(&run_dir.join(crate::STATUS))
    }

    pub fn read_file(path: &Path) -> Result<Status> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read run status {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("run status {}", path.display()))
    }
}
