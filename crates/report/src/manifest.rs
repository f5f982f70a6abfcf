//! `manifest.json`: everything needed to say what an exported run was and prove it: seed,
//! versions, config and its hash, hardware, data identity, money spent, times, final metrics
//! and the sha256 of every artifact.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use lab_run::Hardware;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::versions::Versions;

pub const MANIFEST: &str = "manifest.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Total spent as the billing file last said (None when the run had no budget guard).
    pub total_usd: Option<f64>,
    pub provider: Option<String>,
    pub rate_usd_per_hr: Option<f64>,
    /// The run's cap (`[budget] cap_usd`).
    pub cap_usd: Option<f64>,
    /// Where the numbers came from.
    pub source: Option<String>,
}

/// The losses of the shipped weights: the metrics row of the checkpoint's step, and the last
/// validation at or before it (with its step, to prove it was measured on those weights).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinalMetrics {
    pub step: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_step: Option<u64>,
    /// The last evaluation's other figures: `val_loss.<type>`, `mc_acc`, `mc_acc_norm`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub evaluation: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The config's name (the lab).
    pub name: String,
    pub seed: u64,
    pub versions: Versions,
    pub config_sha256: String,
    /// The effective config, as the run recorded it.
    pub config: Value,
    pub hardware: Hardware,
    /// data.json of the run: data dir, meta.json sha256 and contents (token counts, hashes,
    /// sources, filters).
    pub data: Value,
    pub cost: Cost,
    pub started_utc: Option<String>,
    pub ended_utc: Option<String>,
    /// status.json's final state (`done`, `unstable` …).
    pub state: String,
    /// The step of the shipped weights, and the run's planned length.
    pub checkpoint_step: u64,
    pub total_steps: u64,
    pub tokens: f64,
    pub final_metrics: FinalMetrics,
    /// Spikes injected and detected, rollbacks.
    pub stability: BTreeMap<String, u64>,
    /// sha256 of every other file of the export, by name.
    pub artifacts: BTreeMap<String, String>,
}

impl Manifest {
    pub fn read(export_dir: &Path) -> Result<Manifest> {
        let path = export_dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid manifest", path.display()))
    }
}
