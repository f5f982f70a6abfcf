//! lab-health: how the GPU is doing while a run trains.
//!
//! A [`Probe`] reads one GPU (NVML on a GPU host, behind the `nvml` feature; a recorded file
//! for drills and tests, [`replay`]). The trainer reads it every log interval: the readings go
//! into metrics.jsonl, and a [`Watch`] turns them into alerts: utilisation under 80 % for 10
//! minutes (a starved or stalled GPU burns the budget for nothing) and new ECC errors (memory
//! going bad: the run's numbers may be wrong, and the host should be replaced).
//!
//! Time comes from the probe (`Sample::t_s`), never from the wall clock here, so the rules are
//! tested on recorded readings.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[cfg(feature = "nvml")]
pub mod nvml;
pub mod replay;
pub mod visible;

pub use visible::{nvml_gpu, NvmlGpu};

/// One reading of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds on the probe's own monotonic clock.
    pub t_s: f64,
    /// Percent of NVML's last sample period (1/6 to 1 s, by GPU) in which a kernel ran: the
    /// rate nvidia-smi shows.
    pub util_pct: f64,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    pub temp_c: u32,
    /// ECC errors since the driver loaded; `None` where the GPU has no ECC (or it is off).
    #[serde(default)]
    pub ecc_corrected: Option<u64>,
    #[serde(default)]
    pub ecc_uncorrected: Option<u64>,
}

impl Sample {
    /// The columns a metrics row gets.
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let gib = (1u64 << 30) as f64;
        let mut m = vec![
            ("gpu_util_pct", self.util_pct),
            ("gpu_mem_used_gib", self.mem_used_bytes as f64 / gib),
            ("gpu_temp_c", self.temp_c as f64),
        ];
        if let Some(n) = self.ecc_corrected {
            m.push(("gpu_ecc_corrected", n as f64));
        }
        if let Some(n) = self.ecc_uncorrected {
            m.push(("gpu_ecc_uncorrected", n as f64));
        }
        m
    }
}

/// What the device is, recorded once when a run starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub memory_bytes: u64,
    /// The driver version, where the probe knows it.
    pub driver: Option<String>,
}

/// A source of readings of one GPU.
pub trait Probe {
    fn describe(&self) -> DeviceInfo;
    fn sample(&mut self) -> Result<Sample>;
}

/// When the watch alerts.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// Utilisation under this percentage counts as low.
    pub min_util_pct: f64,
    /// Low for this long (seconds, by the probe's clock) raises an alert.
    pub low_for_s: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            min_util_pct: 80.0,
            low_for_s: 600.0,
        }
    }
}

/// Something a person should look at.
#[derive(Debug, Clone, PartialEq)]
pub enum Alert {
    /// Every reading for `for_s` seconds was under the threshold (their mean: `mean_pct`).
    LowUtilization { for_s: f64, mean_pct: f64 },
    /// The ECC error count of `kind` ("corrected" or "uncorrected") rose by `new` to `total`.
    EccErrors {
        kind: &'static str,
        new: u64,
        total: u64,
    },
}

impl Alert {
    /// The event kind in events.jsonl.
    pub fn kind(&self) -> &'static str {
        match self {
            Alert::LowUtilization { .. } => "gpu_low_utilization",
            Alert::EccErrors { .. } => "gpu_ecc_errors",
        }
    }

    pub fn fields(&self, gpu: &DeviceInfo) -> Value {
        let mut v = match self {
            Alert::LowUtilization { for_s, mean_pct } => {
                json!({ "for_s": for_s, "mean_util_pct": mean_pct })
            }
            Alert::EccErrors { kind, new, total } => {
                json!({ "ecc": kind, "new": new, "total": total })
            }
        };
        v["gpu"] = json!(gpu.index);
        v["name"] = json!(gpu.name);
        v
    }

    /// One line for the webhook and the console.
    pub fn text(&self, gpu: &DeviceInfo) -> String {
        let who = format!("GPU {} ({})", gpu.index, gpu.name);
        match self {
            Alert::LowUtilization { for_s, mean_pct } => format!(
                "{who}: utilisation {mean_pct:.0}% for {:.0} min: the GPU is starved or stalled (data loading? a hung peer?) while the meter runs",
                for_s / 60.0
            ),
            Alert::EccErrors { kind, new, total } => format!(
                "{who}: {new} new {kind} ECC error(s), {total} in all: GPU memory is failing; checkpoint and move the run to another host"
            ),
        }
    }
}

/// Turns readings into alerts. A low-utilisation episode alerts once, when it reaches
/// `low_for_s`, and re-arms when a reading is back above the threshold; ECC counts alert on
/// every rise over the previous reading (the first reading is the baseline: errors from
/// before the run are the host's history, not news).
#[derive(Debug, Clone, Default)]
pub struct Watch {
    rules: Rules,
    /// The current low episode: its first reading's time, and the sum and count of readings.
    low: Option<(f64, f64, u32)>,
    alerted_low: bool,
    ecc: [Option<u64>; 2],
}

impl Watch {
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            ..Default::default()
        }
    }

    pub fn observe(&mut self, s: &Sample) -> Vec<Alert> {
        let mut alerts = Vec::new();
        alerts.extend(self.utilization(s));
        for (i, (kind, now)) in [
            ("corrected", s.ecc_corrected),
            ("uncorrected", s.ecc_uncorrected),
        ]
        .into_iter()
        .enumerate()
        {
            if let (Some(before), Some(now)) = (self.ecc[i], now) {
                if now > before {
                    alerts.push(Alert::EccErrors {
                        kind,
                        new: now - before,
                        total: now,
                    });
                }
            }
            self.ecc[i] = now.or(self.ecc[i]);
        }
        alerts
    }

    fn utilization(&mut self, s: &Sample) -> Option<Alert> {
        if s.util_pct >= self.rules.min_util_pct {
            (self.low, self.alerted_low) = (None, false);
            return None;
        }
        let (since, sum, n) = self.low.get_or_insert((s.t_s, 0.0, 0));
        (*sum, *n) = (*sum + s.util_pct, *n + 1);
        let for_s = s.t_s - *since;
        if self.alerted_low || for_s < self.rules.low_for_s {
            return None;
        }
        self.alerted_low = true;
        Some(Alert::LowUtilization {
            for_s,
            mean_pct: *sum / *n as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(t_s: f64, util_pct: f64) -> Sample {
        Sample {
            t_s,
            util_pct,
            mem_used_bytes: 1 << 30,
            mem_total_bytes: 80 << 30,
            temp_c: 60,
            ecc_corrected: Some(0),
            ecc_uncorrected: Some(0),
        }
    }

    fn low_alerts(w: &mut Watch, readings: &[(f64, f64)]) -> Vec<(usize, Alert)> {
        readings
            .iter()
            .enumerate()
            .flat_map(|(i, &(t, u))| w.observe(&at(t, u)).into_iter().map(move |a| (i, a)))
            .collect()
    }

    #[test]
    fn ten_low_minutes_alert_once_and_recovery_rearms() {
        let mut w = Watch::new(Rules::default());
        // Low from t = 0, a reading a minute: the alert comes at t = 600 s, once.
        let mut readings: Vec<(f64, f64)> = (0..15).map(|m| (m as f64 * 60.0, 40.0)).collect();
        readings.push((15.0 * 60.0, 95.0)); // recovered
        readings.extend((16..27).map(|m| (m as f64 * 60.0, 10.0)));
        let alerts = low_alerts(&mut w, &readings);
        assert_eq!(alerts.len(), 2, "{alerts:?}");
        assert_eq!(
            alerts[0],
            (
                10,
                Alert::LowUtilization {
                    for_s: 600.0,
                    mean_pct: 40.0
                }
            )
        );
        // The second episode starts at minute 16 and reaches 10 minutes at minute 26.
        assert_eq!(alerts[1].0, 26);
    }

    #[test]
    fn a_busy_reading_inside_the_window_resets_it() {
        let mut w = Watch::new(Rules::default());
        let readings: Vec<(f64, f64)> = (0..20)
            .map(|m| (m as f64 * 60.0, if m == 8 { 85.0 } else { 50.0 }))
            .collect();
        let alerts = low_alerts(&mut w, &readings);
        // Low from minute 9: ten minutes at minute 19.
        assert_eq!(alerts.iter().map(|a| a.0).collect::<Vec<_>>(), vec![19]);
    }

    #[test]
    fn ecc_counts_alert_on_rises_after_the_first_reading() {
        let mut w = Watch::new(Rules::default());
        let mut s = at(0.0, 99.0);
        s.ecc_corrected = Some(7); // history from before the run
        assert!(w.observe(&s).is_empty());
        s.t_s = 60.0;
        assert!(w.observe(&s).is_empty());
        s.ecc_uncorrected = Some(2);
        s.ecc_corrected = Some(9);
        let alerts = w.observe(&s);
        assert_eq!(
            alerts,
            vec![
                Alert::EccErrors {
                    kind: "corrected",
                    new: 2,
                    total: 9
                },
                Alert::EccErrors {
                    kind: "uncorrected",
                    new: 2,
                    total: 2
                }
            ]
        );
        let gpu = DeviceInfo {
            index: 0,
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_bytes: 80 << 30,
            driver: None,
        };
        assert!(alerts[1]
            .text(&gpu)
            .contains("2 new uncorrected ECC error(s)"));
        assert_eq!(alerts[1].fields(&gpu)["ecc"], "uncorrected");
        // No ECC on the device: nothing to compare, nothing raised.
        s.ecc_uncorrected = None;
        assert!(w.observe(&s).is_empty());
    }

    proptest! {
        /// Against a direct reading of the rule: an alert at reading i exactly when readings
        /// j..=i are all low, i's time is ≥ 10 min after j's (j the start of the low run), and
        /// no earlier reading of the same run alerted.
        #[test]
        fn low_utilization_alerts_match_the_rule(
            steps in proptest::collection::vec((1.0f64..400.0, 0.0f64..100.0), 1..80)
        ) {
            let mut t = 0.0;
            let readings: Vec<(f64, f64)> = steps.iter().map(|&(dt, u)| { t += dt; (t, u) }).collect();
            let mut w = Watch::new(Rules::default());
            let got: Vec<usize> = low_alerts(&mut w, &readings).into_iter().map(|a| a.0).collect();
            let mut want = Vec::new();
            let mut start: Option<usize> = None;
            let mut fired = false;
            for (i, &(t, u)) in readings.iter().enumerate() {
                if u >= 80.0 { start = None; fired = false; continue; }
                let j = *start.get_or_insert(i);
                if !fired && t - readings[j].0 >= 600.0 { want.push(i); fired = true; }
            }
            prop_assert_eq!(got, want);
        }
    }
}
