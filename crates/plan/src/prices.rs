//! Rental prices in $/GPU-hour. The table is indicative (rounded list prices seen 2024–2026),
//! not a quote: every plan prints the prices it used, and `--price` replaces them.

use std::str::FromStr;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::units::parse_count;

/// One price the plan is costed at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// What kind of price: `on-demand`, `spot`, `gpu-cloud`, or a name given with `--price`.
    pub name: String,
    pub usd_per_gpu_hour: f64,
}

impl FromStr for Price {
    type Err = anyhow::Error;

    /// `3` (named `price`) or `NAME=USD` such as `spot=1.2`.
    fn from_str(text: &str) -> Result<Self> {
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name.trim(), value),
            None => ("price", text),
        };
        if name.is_empty() {
            bail!("price {text:?} has an empty name; write NAME=USD, e.g. spot=1.2");
        }
        let usd_per_gpu_hour = value
            .trim()
            .trim_start_matches('$')
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .with_context(|| {
                format!("price {text:?} is not a positive $/GPU-hour; write 3 or NAME=USD, e.g. spot=1.2")
            })?;
        Ok(Price {
            name: name.to_string(),
            usd_per_gpu_hour,
        })
    }
}

impl Price {
    pub fn validate(&self) -> Result<()> {
        if !(self.usd_per_gpu_hour.is_finite() && self.usd_per_gpu_hour > 0.0) {
            bail!(
                "price {:?} ({}) must be a positive $/GPU-hour",
                self.name,
                self.usd_per_gpu_hour
            );
        }
        Ok(())
    }
}

/// Indicative $/GPU-hour: (hyperscaler on-demand, hyperscaler spot, GPU cloud on-demand).
/// On-demand = the 8-GPU instance price / 8 (AWS p4d, p4de, p5; H200 rounded up from p5e/p5en);
/// GPU cloud = Lambda / RunPod / CoreWeave single-GPU list prices.
const TABLE: &[(&str, f64, f64, f64)] = &[
    ("cpu", 0.10, 0.03, 0.05),
    ("a100-40gb", 4.10, 1.50, 1.29),
    ("a100-80gb", 5.12, 1.80, 1.49),
    ("h100-sxm", 12.29, 4.00, 2.49),
    // No 8-GPU AWS instance: Azure's NC H100 v5 (PCIe) and NCads H100 v5 (NVL) per GPU.
    ("h100-pcie", 6.98, 2.50, 1.99),
    ("h100-nvl", 6.98, 2.80, 2.59),
    ("h200", 10.00, 3.00, 3.50),
    ("l4", 0.80, 0.30, 0.44),
];

/// The default prices for a device: on-demand, spot and GPU cloud.
pub fn default_prices(device: &str) -> Vec<Price> {
    TABLE
        .iter()
        .find(|row| row.0 == device)
        .map(|&(_, on_demand, spot, cloud)| {
            vec![
                price("on-demand", on_demand),
                price("spot", spot),
                price("gpu-cloud", cloud),
            ]
        })
        .unwrap_or_default()
}

/// The range of $/GPU-hour a real offer for this device plausibly falls in: half the lowest
/// to twice the highest price of the table (prices differ that much across providers and
/// years). None for a device without prices.
pub fn plausible_band(device: &str) -> Option<(f64, f64)> {
    let prices = default_prices(device);
    let lowest = prices.iter().map(|p| p.usd_per_gpu_hour).reduce(f64::min)?;
    let highest = prices.iter().map(|p| p.usd_per_gpu_hour).reduce(f64::max)?;
    Some((lowest / 2.0, highest * 2.0))
}

fn price(name: &str, usd: f64) -> Price {
    Price {
        name: name.into(),
        usd_per_gpu_hour: usd,
    }
}

/// Parses a `--quote` style number (`125`, `$125`).
pub fn parse_usd(text: &str) -> Result<f64> {
    parse_count(text.trim().trim_start_matches('$'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_in_the_hardware_table_has_prices() {
        for d in lab_config::hardware::DEVICES {
            assert_eq!(default_prices(d.name).len(), 3, "{}", d.name);
            let (lo, hi) = plausible_band(d.name).unwrap();
            assert!(lo > 0.0 && lo < hi);
        }
        assert!(default_prices("tpu").is_empty());
        assert!(plausible_band("tpu").is_none());
    }

    #[test]
    fn parses_prices() {
        assert_eq!("3".parse::<Price>().unwrap(), price("price", 3.0));
        assert_eq!("spot=1.2".parse::<Price>().unwrap(), price("spot", 1.2));
        assert_eq!("x=$2".parse::<Price>().unwrap(), price("x", 2.0));
        for bad in ["", "=3", "spot=", "spot=-1", "spot=abc", "nan"] {
            let e = bad.parse::<Price>().unwrap_err().to_string();
            assert!(e.contains("NAME=USD"), "{bad}: {e}");
        }
    }
}
