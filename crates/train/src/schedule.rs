//! Learning-rate schedule: linear warmup to the peak, then cosine decay that reaches the
//! minimum at `total_steps` (nanoGPT's `get_lr`; the last step taken is `total_steps - 1`).

use anyhow::{bail, Result};
use lab_config::TrainConfig;
use serde::{Deserialize, Serialize};

/// Learning rate for optimizer step `step` (0-based).
pub fn learning_rate(cfg: &TrainConfig, step: usize) -> f64 {
    if step < cfg.warmup_steps {
        return cfg.peak_lr * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let decay_steps = cfg.total_steps - cfg.warmup_steps;
    if decay_steps == 0 {
        return cfg.min_lr;
    }
    let progress = ((step - cfg.warmup_steps) as f64 / decay_steps as f64).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    cfg.min_lr + cosine * (cfg.peak_lr - cfg.min_lr)
}

/// `--extend-to-steps`: from `at_step` on, the run trains to `to_steps` instead of
/// `from_steps`, its learning rate a new cosine tail from the one in force at `at_step` down
/// to `min_lr` at `to_steps` (no jump: the rate only ever continues down).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Extension {
    pub at_step: u64,
    pub from_steps: u64,
    pub to_steps: u64,
    pub lr_at_step: f64,
}

/// The run's learning-rate schedule: the config's warmup and cosine, then any extensions.
/// The extensions are part of the run's state (state.json), not of its config, so the config
/// and its training hash stay those of the run as planned.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    train: TrainConfig,
    extensions: Vec<Extension>,
}

impl Schedule {
    pub fn new(train: &TrainConfig, extensions: Vec<Extension>) -> Self {
        Self {
            train: train.clone(),
            extensions,
        }
    }

    pub fn extensions(&self) -> &[Extension] {
        &self.extensions
    }

    /// The step the run trains to.
    pub fn total_steps(&self) -> u64 {
        self.extensions
            .last()
            .map_or(self.train.total_steps as u64, |e| e.to_steps)
    }

    /// Learning rate for optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        let Some(e) = self.extensions.iter().rev().find(|e| step >= e.at_step) else {
            return learning_rate(&self.train, step as usize);
        };
        let progress = (step - e.at_step) as f64 / (e.to_steps - e.at_step) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos());
        let min = self.train.min_lr.min(e.lr_at_step);
        // Written from the start so the first step of the tail is exactly the rate in force.
        e.lr_at_step - (1.0 - cosine) * (e.lr_at_step - min)
    }

    /// Extends the run at `step` to `to_steps`. `None` when it already trains to `to_steps`.
    /// A run still in warmup finishes its warmup first: the new tail starts at its end.
    pub fn extend(&mut self, step: u64, to_steps: u64) -> Result<Option<&Extension>> {
        let total = self.total_steps();
        if to_steps == total {
            return Ok(None);
        }
        if to_steps < total || to_steps <= step {
            bail!(
                "--extend-to-steps {to_steps} must be beyond the run's planned end (step {total})"
            );
        }
        let at_step = step.max(self.train.warmup_steps as u64);
        self.extensions.push(Extension {
            at_step,
            from_steps: total,
            to_steps,
            lr_at_step: self.lr(at_step),
        });
        Ok(self.extensions.last())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(total: usize, warmup: usize, peak: f64, min_frac: f64) -> TrainConfig {
        lab_config::LabConfig::from_toml(&format!(
            "name='t'\n[model]\nvocab_size=10\nn_layer=1\nd_model=8\nn_head=2\nn_kv_head=1\nd_ff=8\nseq_len=4\n\
             [train]\nmicro_batch=1\ntotal_steps={total}\nwarmup_steps={warmup}\npeak_lr={peak}\nmin_lr={}\n",
            peak * min_frac
        ))
        .unwrap()
        .train
    }

    proptest! {
        #[test]
        fn warmup_rises_then_cosine_falls_within_bounds(
            total in 1usize..3000, warmup_frac in 0.0f64..1.0, peak in 1e-5f64..1e-1, min_frac in 0.0f64..1.0
        ) {
            let warmup = (total as f64 * warmup_frac) as usize;
            let c = cfg(total, warmup, peak, min_frac);
            let lrs: Vec<f64> = (0..total).map(|s| learning_rate(&c, s)).collect();
            for (s, w) in lrs.windows(2).enumerate() {
                if s + 1 < warmup {
                    prop_assert!(w[1] > w[0], "warmup must rise at {s}");
                } else {
                    prop_assert!(w[1] <= w[0] + 1e-15, "decay must not rise at {s}");
                }
            }
            for (s, &lr) in lrs.iter().enumerate() {
                prop_assert!(lr > 0.0 || c.min_lr == 0.0);
                prop_assert!(lr <= peak * (1.0 + 1e-12));
                // Warmup starts from peak / warmup_steps, which may lie below min_lr.
                if s >= warmup {
                    prop_assert!(lr >= c.min_lr * (1.0 - 1e-12), "below min_lr at {s}");
                }
            }
            if warmup > 0 {
                prop_assert!((lrs[warmup - 1] - peak).abs() <= peak * 1e-12);
            }
        }
    }

    #[test]
    fn lab00_schedule_endpoints() {
        let c = cfg(84_000, 1000, 3e-4, 0.1);
        assert!((learning_rate(&c, 0) - 3e-7).abs() < 1e-15);
        assert!((learning_rate(&c, 999) - 3e-4).abs() < 1e-15);
        assert!((learning_rate(&c, 1000) - 3e-4).abs() < 1e-15);
        assert!((learning_rate(&c, 84_000) - 3e-5).abs() < 1e-12);
        let mid = learning_rate(&c, 1000 + 41_500);
        assert!((mid - 1.65e-4).abs() < 1e-9, "{mid}");
    }

    proptest! {
                /// An extension continues from the rate in force (no jump), never rises after warmup,
        /// and ends at min_lr; before it the schedule is the planned one.
        #[test]
        fn an_extension_continues_the_rate_down_to_min_lr(
            total in 10usize..500, at_frac in 0.0f64..=1.0, more in 1u64..500, min_frac in 0.0f64..1.0
        ) {
                        let c = cfg(total, total / 10, 1e-3, min_frac);
            let step = (total as f64 * at_frac) as u64;
            let mut s = Schedule::new(&c, vec![]);
            let to = total as u64 + more;
            let e = s.extend(step, to).unwrap().unwrap().clone();
            // Warmup is finished first: the tail never starts below the peak's schedule.
            let at = step.max(c.warmup_steps as u64);
            prop_assert_eq!(e.at_step, at);
            prop_assert_eq!(e.lr_at_step, learning_rate(&c, at as usize));
            prop_assert_eq!(s.total_steps(), to);
            for step in 0..at {
                prop_assert_eq!(s.lr(step), learning_rate(&c, step as usize));
            }
            prop_assert_eq!(s.lr(at), e.lr_at_step);
            for step in at..to {
                prop_assert!(s.lr(step + 1) <= s.lr(step) + 1e-18, "rises at {}", step);
            }
            prop_assert!((s.lr(to) - c.min_lr.min(e.lr_at_step)).abs() <= 1e-15);
                        prop_assert!(s.extend(step, to).unwrap().is_none(), "extending to the same end is a no-op");
            prop_assert!(s.extend(step, to - 1).is_err());
        }
    }
}
