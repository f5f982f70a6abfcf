//! What the run executes on: a device from a table of known accelerators (peak FLOP/s,
//! memory, bandwidth), so MFU and plans never assume an A100 by accident.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Datasheet numbers for one device (dense, no sparsity).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HardwareSpec {
    pub name: &'static str,
    /// Peak dense bf16 tensor-core FLOP/s.
    pub peak_bf16_flops: f64,
    /// Peak fp32 FLOP/s (no TF32).
    pub peak_fp32_flops: f64,
    pub memory_bytes: f64,
    /// Memory bandwidth, bytes/s.
    pub memory_bandwidth: f64,
}

const GB: f64 = 1e9;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Known devices. CPU: a nominal 2-core AVX2 machine (2 cores × 2 FMA × 8 lanes × 2 FLOP ×
/// 2.5 GHz = 160 GFLOP/s); override with `hardware.peak_flops` for your own machine.
pub const DEVICES: &[HardwareSpec] = &[
    HardwareSpec {
        name: "cpu",
        peak_bf16_flops: 160e9,
        peak_fp32_flops: 160e9,
        memory_bytes: 24.0 * GIB,
        memory_bandwidth: 20.0 * GB,
    },
    HardwareSpec {
        name: "a100-40gb",
        peak_bf16_flops: 312e12,
        peak_fp32_flops: 19.5e12,
        memory_bytes: 40.0 * GIB,
        memory_bandwidth: 1555.0 * GB,
    },
    HardwareSpec {
        name: "a100-80gb",
        peak_bf16_flops: 312e12,
        peak_fp32_flops: 19.5e12,
        memory_bytes: 80.0 * GIB,
        memory_bandwidth: 2039.0 * GB,
    },
    HardwareSpec {
        name: "h100-sxm",
        peak_bf16_flops: 989e12,
        peak_fp32_flops: 67e12,
        memory_bytes: 80.0 * GIB,
        memory_bandwidth: 3350.0 * GB,
    },
    HardwareSpec {
        name: "h200",
        peak_bf16_flops: 989e12,
        peak_fp32_flops: 67e12,
        memory_bytes: 141.0 * GB,
        memory_bandwidth: 4800.0 * GB,
    },
    HardwareSpec {
        name: "l4",
        peak_bf16_flops: 121e12,
        peak_fp32_flops: 30.3e12,
        memory_bytes: 24.0 * GIB,
        memory_bandwidth: 300.0 * GB,
    },
];

pub fn lookup(name: &str) -> Option<&'static HardwareSpec> {
    DEVICES.iter().find(|d| d.name == name)
}

/// `[hardware]` section of a config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    /// A name from [`DEVICES`].
    #[serde(default = "default_device")]
    pub device: String,
    /// Overrides the table's peak FLOP/s for the run's precision (for MFU).
    #[serde(default)]
    pub peak_flops: Option<f64>,
}

fn default_device() -> String {
    "cpu".into()
}

impl Default for Hardware {
    fn default() -> Self {
        Self {
            device: default_device(),
            peak_flops: None,
        }
    }
}

impl Hardware {
    pub fn validate(&self) -> Result<()> {
        if lookup(&self.device).is_none() {
            let known: Vec<_> = DEVICES.iter().map(|d| d.name).collect();
            bail!(
                "hardware.device {:?} is unknown; use one of {}",
                self.device,
                known.join(", ")
            );
        }
        if let Some(p) = self.peak_flops {
            if !(p > 0.0 && p.is_finite()) {
                bail!("hardware.peak_flops ({p}) must be a positive number");
            }
        }
        Ok(())
    }

    pub fn spec(&self) -> &'static HardwareSpec {
        lookup(&self.device).expect("validated device")
    }

    /// Peak FLOP/s for MFU at the given precision.
    pub fn peak_flops(&self, precision: crate::Precision) -> f64 {
        self.peak_flops.unwrap_or(match precision {
            crate::Precision::Fp32 => self.spec().peak_fp32_flops,
            crate::Precision::Bf16 => self.spec().peak_bf16_flops,
        })
    }
}
