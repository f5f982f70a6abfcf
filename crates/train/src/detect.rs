//! The spike detector: each step's loss and gradient norm against a rolling window of recent
//! ordinary steps (z-score and ratio to the moving mean, as llm.c's outlier detector and the
//! case study's "> 20 % above the moving average"), plus plateau tracking.
//!
//! The detector only measures; the response policy (`stability.rs`) decides what to do, and
//! which steps count as ordinary ([`Detector::accept`]): flagged steps and steps of an open
//! incident stay out of the window, so one spike does not raise the bar for the next.
//! Its whole state is serializable: it lives in the checkpoint, so a resumed run decides
//! exactly as an uninterrupted one.

use std::collections::VecDeque;

use lab_config::Stability;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Detector {
    losses: VecDeque<f64>,
    grad_norms: VecDeque<f64>,
    /// Best (lowest) window mean so far, for plateau tracking.
    best_mean: Option<f64>,
    steps_since_best: u64,
    plateau_reported: bool,
}

/// How a step's numbers compare with the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Reading {
    pub loss: f64,
    /// Mean and (population) standard deviation of the window's losses.
    pub mean: f64,
    pub std: f64,
    pub z: f64,
    pub ratio: f64,
    pub grad_norm: f64,
    pub grad_norm_mean: f64,
    pub grad_norm_ratio: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flag {
    LossSpike,
    GradNormSpike,
}

impl Flag {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LossSpike => "loss_spike",
            Self::GradNormSpike => "grad_norm_spike",
        }
    }
}

/// Mean and population standard deviation, summed in order.
pub fn mean_std(xs: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = xs.clone().count() as f64;
    if n == 0.0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.clone().sum::<f64>() / n;
    let var = xs.map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// `(x - mean) / std`; a flat window makes any rise infinitely unusual and anything else 0.
pub fn zscore(x: f64, mean: f64, std: f64) -> f64 {
    if std > 1e-12 {
        (x - mean) / std
    } else if x > mean {
        f64::INFINITY
    } else {
        0.0
    }
}

impl Detector {
    /// Compares a step with the window (before it is accepted). `None` while the window holds
    /// fewer than `min_history` steps.
    pub fn read(&self, s: &Stability, loss: f64, grad_norm: f64) -> Option<Reading> {
        if self.losses.len() < s.min_history {
            return None;
        }
        let (mean, std) = mean_std(self.losses.iter().copied());
        let (grad_norm_mean, _) = mean_std(self.grad_norms.iter().copied());
        Some(Reading {
            loss,
            mean,
            std,
            z: zscore(loss, mean, std),
            ratio: loss / mean,
            grad_norm,
            grad_norm_mean,
            grad_norm_ratio: grad_norm / grad_norm_mean,
        })
    }

    /// The detector's verdict on a reading.
    pub fn flag(s: &Stability, r: &Reading) -> Option<Flag> {
        let z_ok = s.loss_zscore == 0.0 || r.z >= s.loss_zscore;
        let ratio_ok = s.loss_ratio == 0.0 || r.ratio >= s.loss_ratio;
        let armed = s.loss_zscore > 0.0 || s.loss_ratio > 0.0;
        if armed && z_ok && ratio_ok {
            Some(Flag::LossSpike)
        } else if s.grad_norm_ratio > 0.0 && r.grad_norm_ratio >= s.grad_norm_ratio {
            Some(Flag::GradNormSpike)
        } else {
            None
        }
    }

    /// Adds an ordinary step to the window. Returns true the first time the window's mean has
    /// gone `plateau_steps` steps without improving on its best by `plateau_min_delta`.
    pub fn accept(&mut self, s: &Stability, loss: f64, grad_norm: f64) -> bool {
        for (q, v) in [(&mut self.losses, loss), (&mut self.grad_norms, grad_norm)] {
            q.push_back(v);
            while q.len() > s.window {
                q.pop_front();
            }
        }
        if s.plateau_steps == 0 || self.losses.len() < s.window {
            return false;
        }
        let (mean, _) = mean_std(self.losses.iter().copied());
        match self.best_mean {
            Some(best) if mean >= best * (1.0 - s.plateau_min_delta) => {
                self.steps_since_best += 1;
            }
            _ => {
                self.best_mean = Some(mean);
                self.steps_since_best = 0;
                self.plateau_reported = false;
            }
        }
        if self.steps_since_best >= s.plateau_steps as u64 && !self.plateau_reported {
            self.plateau_reported = true;
            return true;
        }
        false
    }

    pub fn steps_since_best(&self) -> u64 {
        self.steps_since_best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The plain reference: the whole history in a Vec, the window sliced from its end, every
    /// number recomputed from scratch at every step.
    fn reference(s: &Stability, series: &[(f64, f64)]) -> Vec<(Option<Flag>, bool)> {
        let (mut losses, mut norms) = (Vec::new(), Vec::new());
        let (mut best, mut since, mut reported) = (None::<f64>, 0u64, false);
        let mut out = Vec::new();
        for &(loss, norm) in series {
            let flag = if losses.len() < s.min_history {
                None
            } else {
                let lw = &losses[losses.len().saturating_sub(s.window)..];
                let nw = &norms[norms.len().saturating_sub(s.window)..];
                let n = lw.len() as f64;
                let mean = lw.iter().sum::<f64>() / n;
                let std = (lw.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt();
                let z = if std > 1e-12 {
                    (loss - mean) / std
                } else if loss > mean {
                    f64::INFINITY
                } else {
                    0.0
                };
                let gmean = nw.iter().sum::<f64>() / nw.len() as f64;
                if z >= s.loss_zscore && loss / mean >= s.loss_ratio {
                    Some(Flag::LossSpike)
                } else if norm / gmean >= s.grad_norm_ratio {
                    Some(Flag::GradNormSpike)
                } else {
                    None
                }
            };
            let mut plateau = false;
            if flag.is_none() {
                losses.push(loss);
                norms.push(norm);
                if losses.len() >= s.window {
                    let lw = &losses[losses.len() - s.window..];
                    let mean = lw.iter().sum::<f64>() / s.window as f64;
                    if best.is_some_and(|b| mean >= b * (1.0 - s.plateau_min_delta)) {
                        since += 1;
                    } else {
                        (best, since, reported) = (Some(mean), 0, false);
                    }
                    if since >= s.plateau_steps as u64 && !reported {
                        reported = true;
                        plateau = true;
                    }
                }
            }
            out.push((flag, plateau));
        }
        out
    }

    fn run(s: &Stability, series: &[(f64, f64)]) -> Vec<(Option<Flag>, bool)> {
        let mut d = Detector::default();
        series
            .iter()
            .map(|&(loss, norm)| {
                let flag = d.read(s, loss, norm).and_then(|r| Detector::flag(s, &r));
                let plateau = flag.is_none() && d.accept(s, loss, norm);
                (flag, plateau)
            })
            .collect()
    }

    fn settings(
        window: usize,
        min_history: usize,
        z: f64,
        ratio: f64,
        g: f64,
        p: usize,
    ) -> Stability {
        Stability {
            window,
            min_history: min_history.min(window),
            loss_zscore: z,
            loss_ratio: ratio,
            grad_norm_ratio: g,
            plateau_steps: p,
            ..lab_config::StabilityConfig::default().resolve(100)
        }
    }

    /// A falling, noisy loss with occasional spikes (multiplied by 1.1–3) and norm bursts.
    fn series() -> impl Strategy<Value = Vec<(f64, f64)>> {
        proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0, 0.0f64..1.0), 20..300).prop_map(|v| {
            v.iter()
                .enumerate()
                .map(|(i, &(noise, spike, burst))| {
                    let base = 3.0 + 7.0 * (-(i as f64) / 80.0).exp() + 0.2 * (noise - 0.5);
                    let loss = if spike > 0.95 {
                        base * (1.1 + 2.0 * noise)
                    } else {
                        base
                    };
                    let norm = if burst > 0.97 {
                        20.0 + noise
                    } else {
                        0.5 + noise
                    };
                    (loss, norm)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn decisions_equal_the_plain_reference(
            xs in series(), window in 2usize..60, min_history in 2usize..20,
            z in 1.0f64..6.0, ratio in 1.0f64..1.5, g in 2.0f64..12.0, p in 1usize..40
        ) {
            let s = settings(window, min_history, z, ratio, g, p);
            prop_assert_eq!(run(&s, &xs), reference(&s, &xs));
        }

        #[test]
        fn state_survives_a_serde_round_trip_mid_series(xs in series(), cut in 0usize..20) {
            let s = settings(20, 10, 4.0, 1.2, 8.0, 15);
            let cut = cut.min(xs.len());
            let mut d = Detector::default();
            for &(l, n) in &xs[..cut] {
                if d.read(&s, l, n).and_then(|r| Detector::flag(&s, &r)).is_none() {
                    d.accept(&s, l, n);
                }
            }
            let back: Detector = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
            prop_assert_eq!(back, d);
        }
    }

    #[test]
    fn a_spike_after_a_steady_run_is_flagged_with_its_numbers() {
        let s = settings(20, 10, 5.0, 1.2, 10.0, 0);
        let mut d = Detector::default();
        for i in 0..30 {
            let loss = 4.0 + 0.01 * ((i * 7919) % 13) as f64;
            assert!(d
                .read(&s, loss, 1.0)
                .and_then(|r| Detector::flag(&s, &r))
                .is_none());
            d.accept(&s, loss, 1.0);
        }
        let r = d.read(&s, 6.0, 1.0).unwrap();
        assert_eq!(Detector::flag(&s, &r), Some(Flag::LossSpike));
        assert!(r.ratio > 1.4 && r.z > 5.0, "{r:?}");
        // +10 %: above 5 σ of this quiet window but under the 1.2 ratio: not a spike.
        let r = d.read(&s, r.mean * 1.1, 1.0).unwrap();
        assert_eq!(Detector::flag(&s, &r), None);
        let r = d.read(&s, 4.0, 15.0).unwrap();
        assert_eq!(Detector::flag(&s, &r), Some(Flag::GradNormSpike));
    }
}
