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
    /// Peak dense TF32 tensor-core FLOP/s: an f32 product's peak where it runs as TF32 (cubecl
    /// on CUDA). Half the bf16 peak on every GPU here; the CPU's is its fp32 peak.
    pub peak_tf32_flops: f64,
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
        peak_tf32_flops: 160e9,
        memory_bytes: 24.0 * GIB,
        memory_bandwidth: 20.0 * GB,
    },
    HardwareSpec {
        name: "a100-40gb",
        peak_bf16_flops: 312e12,
        peak_fp32_flops: 19.5e12,
        peak_tf32_flops: 156e12,
        memory_bytes: 40.0 * GIB,
        memory_bandwidth: 1555.0 * GB,
    },
    HardwareSpec {
        name: "a100-80gb",
        peak_bf16_flops: 312e12,
        peak_fp32_flops: 19.5e12,
        peak_tf32_flops: 156e12,
        memory_bytes: 80.0 * GIB,
        memory_bandwidth: 2039.0 * GB,
    },
    HardwareSpec {
        name: "h100-sxm",
        peak_bf16_flops: 989e12,
        peak_fp32_flops: 67e12,
        peak_tf32_flops: 494.5e12,
        memory_bytes: 80.0 * GIB,
        memory_bandwidth: 3350.0 * GB,
    },
    HardwareSpec {
        name: "h100-pcie",
        peak_bf16_flops: 756e12,
        peak_fp32_flops: 51e12,
        peak_tf32_flops: 378e12,
        memory_bytes: 80.0 * GIB,
        memory_bandwidth: 2000.0 * GB,
    },
    HardwareSpec {
        name: "h100-nvl",
        peak_bf16_flops: 835e12,
        peak_fp32_flops: 60e12,
        peak_tf32_flops: 417.5e12,
        memory_bytes: 94.0 * GB,
        memory_bandwidth: 3900.0 * GB,
    },
    HardwareSpec {
        name: "h200",
        peak_bf16_flops: 989e12,
        peak_fp32_flops: 67e12,
        peak_tf32_flops: 494.5e12,
        memory_bytes: 141.0 * GB,
        memory_bandwidth: 4800.0 * GB,
    },
    HardwareSpec {
        name: "l4",
        peak_bf16_flops: 121e12,
        peak_fp32_flops: 30.3e12,
        peak_tf32_flops: 60e12,
        memory_bytes: 24.0 * GIB,
        memory_bandwidth: 300.0 * GB,
    },
];

impl HardwareSpec {
    /// The dense peak of products computed in `products`.
    pub fn peak_flops(&self, products: Products) -> f64 {
        match products {
            Products::Bf16 => self.peak_bf16_flops,
            Products::Tf32 => self.peak_tf32_flops,
            Products::Fp32 => self.peak_fp32_flops,
        }
    }
}

pub fn lookup(name: &str) -> Option<&'static HardwareSpec> {
    DEVICES.iter().find(|d| d.name == name)
}

/// The table's entry for a GPU as the driver names it (NVML, `nvidia-smi`: "NVIDIA
/// A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200"), with its
/// memory to tell the two A100s apart when the name does not. None for a GPU the table lacks.
pub fn from_gpu_name(name: &str, memory_bytes: u64) -> Option<&'static HardwareSpec> {
    let lower = name.to_ascii_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    let has = |w: &str| words.contains(&w);
    let device = if has("mig") {
        return None; // a MIG slice has a fraction of the whole GPU's peak
    } else if has("h200") && has("nvl") {
        return None; // H200 NVL: a lower power limit, not the SXM part's peak
    } else if has("h200") {
        "h200"
    } else if has("h100") && has("pcie") {
        "h100-pcie"
    } else if has("h100") && has("nvl") {
        "h100-nvl"
    } else if has("h100") {
        "h100-sxm"
    } else if has("a100") && (has("80gb") || memory_bytes as f64 > 60.0 * GIB) {
        "a100-80gb"
    } else if has("a100") {
        "a100-40gb"
    } else if has("l4") {
        "l4"
    } else {
        return None;
    };
    lookup(device)
}

/// `[hardware]` section of a config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    /// A name from [`DEVICES`].
    #[serde(default = "default_device")]
    pub device: String,
    /// Overrides the table's peak FLOP/s for the run's products (for MFU): for an fp32 run on
    /// CUDA, the GPU's TF32 peak.
    #[serde(default)]
    pub peak_flops: Option<f64>,
    /// Whether the run's fp32 products run on tensor cores as TF32, as cubecl's do on CUDA
    /// wherever its autotune finds that faster: its MFU is then against the TF32 peak. Set by
    /// the trainer for an fp32 run on CUDA; never read from or written to a config file.
    #[serde(skip)]
    pub tf32_products: bool,
}

fn default_device() -> String {
    "cpu".into()
}

impl Default for Hardware {
    fn default() -> Self {
        Self {
            device: default_device(),
            peak_flops: None,
            tf32_products: false,
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

    /// Peak FLOP/s for MFU at the given precision: the peak of the units its products run on.
    pub fn peak_flops(&self, precision: crate::Precision) -> f64 {
        let products = self.products_in(precision);
        self.peak_flops
            .unwrap_or_else(|| self.spec().peak_flops(products))
    }

    /// What a run's products compute in: bf16, or for fp32 storage TF32 where they run on
    /// tensor cores (see `tf32_products`) and fp32 elsewhere.
    pub fn products_in(&self, precision: crate::Precision) -> Products {
        Products::of(precision, self.tf32_products)
    }
}

/// The number format a run's matrix products compute in, whose peak its MFU divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    Bf16,
    Tf32,
    Fp32,
}

impl Products {
    /// What products compute in at `precision`, where fp32 ones run as TF32 or not.
    pub fn of(precision: crate::Precision, tf32: bool) -> Products {
        match precision {
            crate::Precision::Bf16 => Products::Bf16,
            crate::Precision::Fp32 if tf32 => Products::Tf32,
            crate::Precision::Fp32 => Products::Fp32,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Products::Bf16 => "bf16",
            Products::Tf32 => "tf32",
            Products::Fp32 => "fp32",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names as NVML and nvidia-smi print them, on the GPUs lab's configs and clouds use.
    #[test]
    fn gpus_are_found_in_the_table_by_their_driver_names() {
        let gib = |g: u64| g << 30;
        let cases = [
            ("NVIDIA A100-SXM4-80GB", gib(80), Some("a100-80gb")),
            ("NVIDIA A100 80GB PCIe", gib(80), Some("a100-80gb")),
            ("NVIDIA A100-SXM4-40GB", gib(40), Some("a100-40gb")),
            ("NVIDIA A100-PCIE-40GB", gib(40), Some("a100-40gb")),
            // A name without its size: the memory decides.
            ("NVIDIA A100", gib(80), Some("a100-80gb")),
            ("NVIDIA H100 80GB HBM3", gib(80), Some("h100-sxm")),
            ("NVIDIA H100 PCIe", gib(80), Some("h100-pcie")),
            ("NVIDIA H100 NVL", 94_000_000_000, Some("h100-nvl")),
            ("NVIDIA H200", 141_000_000_000, Some("h200")),
            ("NVIDIA L4", gib(24), Some("l4")),
            ("NVIDIA H200 NVL", 141_000_000_000, None),
            ("NVIDIA GH200 480GB", gib(96), None),
            ("NVIDIA L40S", gib(48), None),
            ("Tesla V100-SXM2-16GB", gib(16), None),
            ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", gib(10), None),
        ];
        for (name, memory, want) in cases {
            let got = from_gpu_name(name, memory).map(|d| d.name);
            assert_eq!(got, want, "{name}");
        }
    }

    /// The datasheets' dense TF32 peak is half the dense bf16 one on every GPU in the table,
    /// above the CUDA cores' fp32; a typo in the table would break one of these.
    #[test]
    fn each_gpu_s_tf32_peak_is_half_its_bf16_peak() {
        for d in DEVICES.iter().filter(|d| d.name != "cpu") {
            let half = d.peak_bf16_flops / 2.0;
            assert!(
                (d.peak_tf32_flops - half).abs() <= 0.01 * half,
                "{}",
                d.name
            );
            assert!(d.peak_fp32_flops < d.peak_tf32_flops, "{}", d.name);
        }
        let cpu = lookup("cpu").unwrap();
        assert_eq!(cpu.peak_tf32_flops, cpu.peak_fp32_flops);
    }
}
