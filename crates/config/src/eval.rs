//! `[eval]`: what the trainer measures at every evaluation besides the validation loss, and the
//! stop rules that read it. None of it changes the numbers a step computes, so it is not part
//! of the training hash.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Validation loss by document type (meta.json's spans) at every evaluation.
    pub by_type: bool,
    /// A multiple-choice probe (MMLU- or HellaSwag-shaped JSONL) scored at every evaluation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mc_file: Option<String>,
    /// Items of the probe scored each time (evenly spaced over the file).
    pub mc_items: usize,
    pub mc_shots: usize,
    /// Prompts whose greedy continuations are logged (events.jsonl `samples`) at every eval.
    pub prompts: Vec<String>,
    pub sample_tokens: usize,
    /// Stop rule: end the run (exit 0, `stopped_early`) when the validation loss has not
    /// improved on its best for this many training tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plateau_tokens: Option<u64>,
    /// Stop rule: end the run when, over this many consecutive evaluations, the validation
    /// loss rose at each while the (smoothed) training loss fell: overfitting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overfit_evals: Option<usize>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            by_type: true,
            mc_file: None,
            mc_items: 50,
            mc_shots: 0,
            prompts: Vec::new(),
            sample_tokens: 32,
            plateau_tokens: None,
            overfit_evals: None,
        }
    }
}

impl EvalConfig {
    pub fn validate(&self) -> Result<()> {
        if self.mc_file.is_some() && self.mc_items == 0 {
            bail!("eval.mc_items must be > 0 when eval.mc_file is set");
        }
        if self.plateau_tokens == Some(0) {
            bail!("eval.plateau_tokens must be > 0 (leave it out to disable the rule)");
        }
        if self.overfit_evals.is_some_and(|n| n < 2) {
            bail!("eval.overfit_evals must be at least 2 (leave it out to disable the rule)");
        }
        Ok(())
    }
}
