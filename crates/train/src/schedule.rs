//! Learning-rate schedule: linear warmup to the peak, then cosine decay that reaches the
//! minimum at `total_steps` (nanoGPT's `get_lr`; the last step taken is `total_steps - 1`).

use lab_config::TrainConfig;

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
}
