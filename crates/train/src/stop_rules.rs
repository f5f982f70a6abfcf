//! The stop rules of `[eval]`: a validation plateau (no improvement for so many tokens) and
//! overfitting (validation rising while training falls, evaluation after evaluation) end the
//! run early: a checkpoint, exit 0, state `stopped_early`, the decision and its numbers as an
//! event.

use anyhow::Result;
use lab_config::EvalConfig;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::policy::{Decision, Journal, StepPolicy, StepView, Stop};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RulesState {
    best_val: Option<f64>,
    /// Training tokens at the best validation loss.
    best_tokens: f64,
    /// Exponential moving average (α 0.1) of ordinary steps' training loss.
    train_ema: Option<f64>,
    /// (validation loss, smoothed training loss) at the last evaluations.
    evals: Vec<(f64, f64)>,
}

/// A rule that fired: its name, the reason in words, its numbers.
pub type Fired = (&'static str, String, Value);

impl RulesState {
    /// Folds in an ordinary step's training loss.
    pub fn train_step(&mut self, loss: f64) {
        self.train_ema = Some(match self.train_ema {
            Some(ema) => ema + 0.1 * (loss - ema),
            None => loss,
        });
    }

    /// Folds in an evaluation after `tokens` training tokens; the rule that fires, if any.
    pub fn evaluation(&mut self, cfg: &EvalConfig, tokens: f64, val: f64) -> Option<Fired> {
        if self.best_val.is_none_or(|b| val < b) {
            (self.best_val, self.best_tokens) = (Some(val), tokens);
        }
        let keep = cfg.overfit_evals.unwrap_or(1) + 1;
        self.evals.push((val, self.train_ema.unwrap_or(f64::NAN)));
        let excess = self.evals.len().saturating_sub(keep);
        self.evals.drain(..excess);

        if let Some(limit) = cfg.plateau_tokens {
            let since = tokens - self.best_tokens;
            if since >= limit as f64 {
                let best = self.best_val.unwrap_or(val);
                return Some((
                    "plateau",
                    format!("validation plateau: no improvement on {best:.4} for {since:.0} tokens (eval.plateau_tokens = {limit})"),
                    json!({ "best_val_loss": best, "tokens_since_best": since, "val_loss": val }),
                ));
            }
        }
        if let Some(k) = cfg.overfit_evals {
            let e = &self.evals;
            if e.len() == k + 1 && e.windows(2).all(|w| w[1].0 > w[0].0 && w[1].1 < w[0].1) {
                return Some((
                    "overfit",
                    format!(
                        "overfitting: validation loss rose {:.4} → {:.4} while training loss fell {:.4} → {:.4} over {k} evaluations (eval.overfit_evals)",
                        e[0].0, e[k].0, e[0].1, e[k].1
                    ),
                    json!({ "evals": e }),
                ));
            }
        }
        None
    }
}

pub struct StopRules {
    cfg: EvalConfig,
    tokens_per_step: f64,
    state: RulesState,
}

impl StopRules {
    pub fn new(cfg: EvalConfig, tokens_per_step: usize) -> Self {
        Self {
            cfg,
            tokens_per_step: tokens_per_step as f64,
            state: RulesState::default(),
        }
    }
}

impl StepPolicy for StopRules {
    fn name(&self) -> &'static str {
        "stop_rules"
    }

    fn after_update(&mut self, v: &StepView, j: &mut dyn Journal) -> Decision {
        if !v.data.injected && v.loss.is_finite() {
            self.state.train_step(v.loss);
        }
        let Some(val) = v.val_loss else {
            return Decision::Continue;
        };
        let step = v.step + 1;
        match self
            .state
            .evaluation(&self.cfg, step as f64 * self.tokens_per_step, val)
        {
            Some((rule, reason, mut fields)) => {
                fields["rule"] = json!(rule);
                fields["reason"] = json!(reason);
                j.event(step, "stop_rule", fields);
                Decision::Stop(Stop::Early { reason })
            }
            None => Decision::Continue,
        }
    }

    fn save(&self) -> Option<Value> {
        serde_json::to_value(&self.state).ok()
    }

    fn restore(&mut self, state: Option<&Value>) -> Result<()> {
        self.state = match state {
            Some(v) => serde_json::from_value(v.clone())?,
            None => RulesState::default(),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The plain reference: the whole history kept, every decision recomputed from it.
    fn reference(cfg: &EvalConfig, evals: &[(f64, f64, f64)]) -> Vec<Option<&'static str>> {
        let mut seen: Vec<(f64, f64, f64)> = Vec::new();
        let mut out = Vec::new();
        let mut stopped = false;
        for &(tokens, val, ema) in evals {
            seen.push((tokens, val, ema));
            if stopped {
                out.push(None);
                continue;
            }
            // Best = the first occurrence of the minimum so far.
            let best = seen.iter().fold(
                (f64::INFINITY, 0.0),
                |b, &(t, v, _)| if v < b.0 { (v, t) } else { b },
            );
            let mut fired = None;
            if cfg
                .plateau_tokens
                .is_some_and(|p| tokens - best.1 >= p as f64)
            {
                fired = Some("plateau");
            } else if let Some(k) = cfg.overfit_evals {
                let n = seen.len();
                if n > k
                    && (n - k..n).all(|i| seen[i].1 > seen[i - 1].1 && seen[i].2 < seen[i - 1].2)
                {
                    fired = Some("overfit");
                }
            }
            stopped = fired.is_some();
            out.push(fired);
        }
        out
    }

    proptest! {
        #[test]
        fn decisions_equal_the_plain_reference(
            vals in proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0), 1..40),
            plateau in proptest::option::of(1u64..20), overfit in proptest::option::of(2usize..5)
        ) {
            let cfg = EvalConfig { plateau_tokens: plateau.map(|p| p * 1000), overfit_evals: overfit, ..Default::default() };
            let mut state = RulesState::default();
            let mut got = Vec::new();
            let mut evals = Vec::new();
            let mut stopped = false;
            for (i, &(v, t)) in vals.iter().enumerate() {
                // A smoothed training loss that drifts down, a validation loss that wanders.
                let (tokens, val) = ((i as f64 + 1.0) * 1000.0, 3.0 + v);
                state.train_step(4.0 - 0.05 * i as f64 - 0.01 * t);
                let ema = state.train_ema.unwrap();
                evals.push((tokens, val, ema));
                let fired = if stopped { None } else { state.evaluation(&cfg, tokens, val).map(|f| f.0) };
                stopped |= fired.is_some();
                got.push(fired);
            }
            prop_assert_eq!(got, reference(&cfg, &evals));
        }
    }
}
