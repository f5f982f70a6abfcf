//! The `meter` provider: no cloud API, spend = prior spend + configured rate × wall clock
//! since the meter started. The embedded default, so the whole guard runs on a laptop or in CI.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::provider::{EndAction, Provider, Sample};

pub struct Meter {
    rate_usd_per_hr: f64,
    prior_spend_usd: f64,
    started_unix: f64,
}

impl Meter {
    pub fn new(rate_usd_per_hr: f64, prior_spend_usd: f64, started_unix: f64) -> Meter {
        Meter {
            rate_usd_per_hr,
            prior_spend_usd,
            started_unix,
        }
    }
}

impl Provider for Meter {
    fn name(&self) -> &'static str {
        "meter"
    }

    fn instance_id(&self) -> Option<String> {
        None
    }

    fn sample(&mut self, now: f64) -> Result<Sample> {
        let hours = ((now - self.started_unix) / 3600.0).max(0.0);
        Ok(Sample {
            spent_usd: self.prior_spend_usd + self.rate_usd_per_hr * hours,
            rate_usd_per_hr: self.rate_usd_per_hr,
            hours_elapsed: hours,
            method: format!(
                "meter: no provider; ${:.4} prior + ${:.4}/h × wall clock since the meter started",
                self.prior_spend_usd, self.rate_usd_per_hr
            ),
            instance_id: None,
        })
    }

    fn end_instance(&mut self, _action: EndAction) -> Result<Value> {
        Ok(json!({ "note": "meter provider: no cloud instance to terminate" }))
    }

    fn instance_status(&mut self, _action: EndAction) -> Result<Option<String>> {
        bail!("meter provider has no instance to list")
    }
}
