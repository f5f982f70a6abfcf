//! Time and money: tokens/s from peak FLOP/s × MFU, compute hours, wall clock with overhead
//! and checkpoint writes, GPU-hours and dollars for each price, and what a deadline or a
//! budget buys.
//!
//! Everything is continuous in the token count (steps and checkpoints amortized, never
//! rounded), so cost is exactly linear in tokens and in price.

use serde::Serialize;

use crate::prices::Price;

/// The throughput and timing inputs shared by every MFU scenario.
#[derive(Debug, Clone)]
pub struct Timing {
    pub flops_per_token: f64,
    pub gpus: usize,
    pub peak_flops_per_gpu: f64,
    pub global_batch_tokens: f64,
    /// Wall clock = compute × overhead + checkpoint writes (evals, restarts, stragglers).
    pub overhead: f64,
    pub ckpt_every_steps: f64,
    pub ckpt_write_seconds: f64,
}

impl Timing {
    pub fn tokens_per_second(&self, mfu: f64) -> f64 {
        self.gpus as f64 * self.peak_flops_per_gpu * mfu / self.flops_per_token
    }

    /// Wall-clock seconds per optimizer step, checkpoint writes amortized over their interval.
    pub fn wall_seconds_per_step(&self, mfu: f64) -> f64 {
        self.global_batch_tokens / self.tokens_per_second(mfu) * self.overhead
            + self.ckpt_write_seconds / self.ckpt_every_steps
    }

    pub fn scenario(&self, mfu: f64, tokens: f64, prices: &[Price]) -> Scenario {
        let tokens_per_s = self.tokens_per_second(mfu);
        let steps = tokens / self.global_batch_tokens;
        let compute_hours = tokens / tokens_per_s / 3600.0;
        let checkpoint_hours = steps / self.ckpt_every_steps * self.ckpt_write_seconds / 3600.0;
        let wall_clock_hours = compute_hours * self.overhead + checkpoint_hours;
        let gpus = self.gpus as f64;
        Scenario {
            mfu,
            tokens,
            steps,
            tokens_per_s,
            tokens_per_s_per_gpu: tokens_per_s / gpus,
            compute_hours,
            checkpoint_hours,
            wall_clock_hours,
            compute_gpu_hours: compute_hours * gpus,
            billed_gpu_hours: wall_clock_hours * gpus,
            costs: prices
                .iter()
                .map(|p| Cost {
                    price: p.name.clone(),
                    usd_per_gpu_hour: p.usd_per_gpu_hour,
                    compute_usd: compute_hours * gpus * p.usd_per_gpu_hour,
                    billed_usd: wall_clock_hours * gpus * p.usd_per_gpu_hour,
                })
                .collect(),
        }
    }

    /// What `wall_hours` of the whole cluster buys at this MFU: whole steps and their tokens.
    pub fn buys(&self, mfu: f64, wall_hours: f64, limit: String) -> Buys {
        let steps = (wall_hours * 3600.0 / self.wall_seconds_per_step(mfu)).floor();
        Buys {
            limit,
            wall_clock_hours: wall_hours,
            steps: steps as u64,
            tokens: steps * self.global_batch_tokens,
        }
    }

    /// The MFU at which `tokens` finish within `wall_hours` (checkpoint writes and overhead
    /// included); infinite when the checkpoint writes alone take longer.
    pub fn required_mfu(&self, tokens: f64, wall_hours: f64) -> f64 {
        let steps = tokens / self.global_batch_tokens;
        let checkpoint_s = steps / self.ckpt_every_steps * self.ckpt_write_seconds;
        let compute_s = (wall_hours * 3600.0 - checkpoint_s) / self.overhead;
        if compute_s <= 0.0 {
            return f64::INFINITY;
        }
        tokens * self.flops_per_token / (compute_s * self.gpus as f64 * self.peak_flops_per_gpu)
    }
}

/// One MFU's timeline and bill.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub mfu: f64,
    pub tokens: f64,
    /// Optimizer steps (fractional: the last step may be partial).
    pub steps: f64,
    pub tokens_per_s: f64,
    pub tokens_per_s_per_gpu: f64,
    pub compute_hours: f64,
    pub checkpoint_hours: f64,
    pub wall_clock_hours: f64,
    pub compute_gpu_hours: f64,
    pub billed_gpu_hours: f64,
    pub costs: Vec<Cost>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    pub price: String,
    pub usd_per_gpu_hour: f64,
    /// GPU-hours of pure compute × price (the figure FLOP-based estimates quote).
    pub compute_usd: f64,
    /// Wall clock (overhead and checkpoint writes included) × GPUs × price: the bill.
    pub billed_usd: f64,
}

/// What a time or money limit buys.
#[derive(Debug, Clone, Serialize)]
pub struct Buys {
    /// The limit in words: `deadline 24 h`, `budget $35 at gpu-cloud $1.19/GPU-h`.
    pub limit: String,
    pub wall_clock_hours: f64,
    pub steps: u64,
    pub tokens: f64,
}

/// A quoted hourly price whose unit is not stated ("$125/h for 320 GPUs"), read three ways.
#[derive(Debug, Clone, Serialize)]
pub struct QuoteReport {
    pub usd_per_hour: f64,
    pub hours: f64,
    /// Where `hours` comes from: `--hours`, or the plan's wall clock.
    pub hours_from: String,
    pub readings: Vec<QuoteReading>,
    /// Half the lowest to twice the highest table price for the device, $/GPU-hour.
    pub plausible_usd_per_gpu_hour: Option<(f64, f64)>,
    /// The readings whose $/GPU-hour falls in the plausible band.
    pub consistent: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct QuoteReading {
    pub reading: String,
    pub usd_per_gpu_hour: f64,
    pub total_usd: f64,
    pub plausible: Option<bool>,
}

pub fn quote_report(
    usd_per_hour: f64,
    hours: f64,
    hours_from: String,
    gpus: usize,
    gpus_per_node: usize,
    band: Option<(f64, f64)>,
) -> QuoteReport {
    let mut per = vec![
        (format!("for the whole cluster ({gpus} GPUs)"), gpus as f64),
        ("per GPU".to_string(), 1.0),
    ];
    if gpus_per_node > 1 && gpus > gpus_per_node {
        per.insert(
            1,
            (
                format!("per {gpus_per_node}-GPU node"),
                gpus_per_node as f64,
            ),
        );
    }
    let readings: Vec<QuoteReading> = per
        .into_iter()
        .map(|(reading, gpus_covered)| {
            let usd_per_gpu_hour = usd_per_hour / gpus_covered;
            QuoteReading {
                reading,
                usd_per_gpu_hour,
                total_usd: usd_per_gpu_hour * gpus as f64 * hours,
                plausible: band.map(|(lo, hi)| (lo..=hi).contains(&usd_per_gpu_hour)),
            }
        })
        .collect();
    QuoteReport {
        usd_per_hour,
        hours,
        hours_from,
        consistent: readings
            .iter()
            .filter(|r| r.plausible == Some(true))
            .map(|r| r.reading.clone())
            .collect(),
        readings,
        plausible_usd_per_gpu_hour: band,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The medical case study: 6N with N = 6.7B, 256 A100s at 45% of 312 TF/s, 4M tokens/step.
    fn case_study() -> Timing {
        Timing {
            flops_per_token: 6.0 * 6.7e9,
            gpus: 256,
            peak_flops_per_gpu: 312e12,
            global_batch_tokens: 4e6,
            overhead: 1.0,
            ckpt_every_steps: 1000.0,
            ckpt_write_seconds: 0.0,
        }
    }

    #[test]
    fn reproduces_the_case_study() {
        let price = Price {
            name: "quoted".into(),
            usd_per_gpu_hour: 3.0,
        };
        let s = case_study().scenario(0.45, 200e9, &[price]);
        assert_eq!(s.steps, 50_000.0);
        let within = |x: f64, quoted: f64| (x / quoted - 1.0).abs() < 0.02;
        assert!(
            within(s.compute_gpu_hours, 15_950.0),
            "{}",
            s.compute_gpu_hours
        );
        assert!(within(s.compute_hours, 62.0), "{}", s.compute_hours);
        assert!(
            within(s.costs[0].compute_usd, 48_000.0),
            "{}",
            s.costs[0].compute_usd
        );
    }

    #[test]
    fn overhead_and_checkpoints_lengthen_the_wall_clock_only() {
        let mut t = case_study();
        t.overhead = 1.1;
        t.ckpt_write_seconds = 36.0;
        let s = t.scenario(0.45, 200e9, &[]);
        let base = case_study().scenario(0.45, 200e9, &[]);
        assert_eq!(s.compute_hours, base.compute_hours);
        // 50 checkpoints × 36 s = 0.5 h.
        assert!((s.checkpoint_hours - 0.5).abs() < 1e-9);
        assert!((s.wall_clock_hours - (base.compute_hours * 1.1 + 0.5)).abs() < 1e-9);
    }

    #[test]
    fn required_mfu_inverts_the_wall_clock_and_buys_inverts_steps() {
        let mut t = case_study();
        t.overhead = 1.2;
        t.ckpt_write_seconds = 60.0;
        let s = t.scenario(0.45, 200e9, &[]);
        let mfu = t.required_mfu(200e9, s.wall_clock_hours);
        assert!((mfu - 0.45).abs() < 1e-9, "{mfu}");
        let b = t.buys(0.45, s.wall_clock_hours, "x".into());
        assert!((b.steps as f64 - 50_000.0).abs() <= 1.0, "{}", b.steps);
        assert_eq!(t.required_mfu(200e9, 0.0), f64::INFINITY);
    }

    #[test]
    fn quote_is_read_three_ways() {
        let q = quote_report(125.0, 336.0, "--hours".into(), 320, 8, Some((1.5, 24.6)));
        assert_eq!(q.readings.len(), 3);
        assert!((q.readings[0].total_usd - 42_000.0).abs() < 1e-6);
        assert!((q.readings[0].usd_per_gpu_hour - 0.390625).abs() < 1e-12);
        assert!((q.readings[1].usd_per_gpu_hour - 15.625).abs() < 1e-12);
        assert!((q.readings[2].total_usd - 13_440_000.0).abs() < 1e-3);
        assert_eq!(q.consistent, vec!["per 8-GPU node".to_string()]);
        let single = quote_report(2.0, 10.0, "--hours".into(), 1, 1, None);
        assert_eq!(single.readings.len(), 2);
        assert!(single.consistent.is_empty());
    }
}
