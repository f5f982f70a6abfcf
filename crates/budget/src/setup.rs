//! Building a provider from the `[budget]` config and command-line overrides.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use lab_config::{BudgetConfig, BudgetProvider};

use crate::clock::boot_time_unix;
use crate::provider::Provider;
use crate::secret::{env_nonempty, Secret};
use crate::{lambda, meter, runpod};

#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSettings {
    pub provider: BudgetProvider,
    pub base_url: Option<String>,
    pub instance_id: Option<String>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    /// When billing started; Lambda defaults to this machine's boot time.
    pub started_unix: Option<f64>,
    pub rate_usd_per_hr: f64,
    pub prior_spend_usd: f64,
    pub timeout_s: f64,
}

impl ProviderSettings {
    pub fn from_config(c: &BudgetConfig) -> ProviderSettings {
        ProviderSettings {
            provider: c.provider,
            base_url: c.api_base_url.clone(),
            instance_id: c.instance_id.clone(),
            api_key_env: c.api_key_env.clone(),
            api_key_file: c.api_key_file.as_ref().map(PathBuf::from),
            started_unix: None,
            rate_usd_per_hr: c.rate_usd_per_hr,
            prior_spend_usd: c.prior_spend_usd,
            timeout_s: 10.0,
        }
    }

    fn key(&self, default_env: &str) -> Result<Secret> {
        let env = self.api_key_env.as_deref().unwrap_or(default_env);
        Secret::from_env_or_file(env, self.api_key_file.as_deref())
    }
}

/// The provider the settings describe, started at `now` when nothing says otherwise.
pub fn build_provider(s: &ProviderSettings, now: f64) -> Result<Box<dyn Provider>> {
    if !(s.timeout_s.is_finite() && s.timeout_s > 0.0) {
        bail!("--http-timeout-s ({}) must be > 0", s.timeout_s);
    }
    let timeout = Duration::from_secs_f64(s.timeout_s);
    Ok(match s.provider {
        BudgetProvider::Meter => Box::new(meter::Meter::new(
            s.rate_usd_per_hr,
            s.prior_spend_usd,
            s.started_unix.unwrap_or(now),
        )),
        BudgetProvider::Lambda => {
            let base = s.base_url.as_deref().unwrap_or(lambda::DEFAULT_BASE_URL);
            let id = s
                .instance_id
                .clone()
                .or_else(|| env_nonempty("LAMBDA_INSTANCE_ID"));
            let started = s.started_unix.or_else(boot_time_unix).unwrap_or(now);
            Box::new(lambda::Lambda::new(
                base,
                s.key("LAMBDA_API_KEY")?,
                id,
                started,
                timeout,
            )?)
        }
        BudgetProvider::Runpod => {
            let base = s.base_url.as_deref().unwrap_or(runpod::DEFAULT_BASE_URL);
            let Some(id) = s
                .instance_id
                .clone()
                .or_else(|| env_nonempty("RUNPOD_POD_ID"))
            else {
                bail!(
                    "runpod needs the pod id: pass --instance-id, set budget.instance_id, or run \
                     inside the pod (RUNPOD_POD_ID)"
                );
            };
            Box::new(runpod::Runpod::new(
                base,
                s.key("RUNPOD_API_KEY")?,
                id,
                timeout,
            )?)
        }
    })
}
