//! `metrics.jsonl`: one [`MetricsRow`] per logged step. The trainer writes these rows and every
//! reader (status, export, post-mortem, CSV) reads the same struct.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::jsonl;

/// What the trainer knows about one step when it logs it. Every number is finite (a step with
/// a non-finite loss or gradient is never applied, so never logged).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// Optimizer steps completed, this one included.
    pub step: u64,
    /// Mean training loss of this step's micro-batches (nats per token).
    pub loss: f64,
    pub lr: f64,
    /// Global L2 norm of the gradient, before clipping.
    pub grad_norm: f64,
    /// Factor the gradient was scaled by (1 when clipping did not engage).
    pub clip_scale: f64,
    /// Global L2 norm of the weights after the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_norm: Option<f64>,
    /// Training tokens consumed so far (real data and injected batches).
    pub tokens: f64,
    /// The real-data cursor after this step: training windows consumed or skipped.
    #[serde(default)]
    pub samples: u64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    /// Wall-clock seconds since this attempt started.
    pub elapsed_s: f64,
    /// When the row was written (RFC 3339 UTC): the wall-clock axis of throughput plots and
    /// MLflow's metric timestamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_utc: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// This step trained on injected (spike) batches, not on the data.
    #[serde(default, skip_serializing_if = "is_false")]
    pub injected: bool,
    /// The stability policy dropped this step's update (llm.c's skip_update).
    #[serde(default, skip_serializing_if = "is_false")]
    pub update_skipped: bool,
    /// What the spike detector saw at this step (`loss_spike`, `grad_norm_spike`, `recovering`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
    /// Further named numbers (evaluation by document type, device health …).
    #[serde(flatten)]
    pub extra: BTreeMap<String, f64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl MetricsRow {
    /// Every number of the row by name, in a fixed order (the long format of metrics.csv):
    /// optional values only when present, flags as 0/1.
    pub fn values(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = [
            ("loss", Some(self.loss)),
            ("lr", Some(self.lr)),
            ("grad_norm", Some(self.grad_norm)),
            ("clip_scale", Some(self.clip_scale)),
            ("param_norm", self.param_norm),
            ("tokens", Some(self.tokens)),
            ("samples", Some(self.samples as f64)),
            ("tokens_per_s", Some(self.tokens_per_s)),
            ("mfu", Some(self.mfu)),
            ("elapsed_s", Some(self.elapsed_s)),
            ("val_loss", self.val_loss),
            ("injected", self.injected.then_some(1.0)),
            ("update_skipped", self.update_skipped.then_some(1.0)),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
        .collect();
        out.extend(self.extra.iter().map(|(k, v)| (k.clone(), *v)));
        out
    }
}

/// Every row of a metrics file (an absent file has none).
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRow>> {
    jsonl::read_lines(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_optional_fields_stay_out_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        let mut row = MetricsRow {
            step: 3,
            loss: 5.25,
            lr: 1e-3,
            grad_norm: 0.5,
            clip_scale: 1.0,
            tokens: 3072.0,
            samples: 24,
            ..Default::default()
        };
        let mut f = crate::JsonLines::open(&p).unwrap();
        f.append(&row).unwrap();
        row.step = 4;
        row.val_loss = Some(5.5);
        row.injected = true;
        row.extra.insert("val_loss.GARD".into(), 4.0);
        f.append(&row).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let first = text.lines().next().unwrap();
        assert!(
            !first.contains("val_loss") && !first.contains("injected"),
            "{first}"
        );
        let back = read_metrics(&p).unwrap();
        assert_eq!(back[1], row);
        let names: Vec<String> = back[1].values().into_iter().map(|(k, _)| k).collect();
        assert!(names.contains(&"val_loss.GARD".to_string()));
        assert!(names.contains(&"injected".to_string()));
        assert!(!back[0].values().iter().any(|(k, _)| k == "val_loss"));
    }
}
