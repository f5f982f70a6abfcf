//! `[budget]` section: the money side of a run. The cap, the alert threshold and the cadence of
//! the guard, and which billing provider the sidecar asks. Secrets are never stored here: the
//! config names the environment variable or file that holds an API key or webhook URL, because
//! the config is hashed and exported with every run.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Where the spend numbers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetProvider {
    /// No provider: `rate_usd_per_hr` × wall clock of the run (laptops, CI).
    Meter,
    /// Lambda Cloud: instance price × time since the instance started.
    Lambda,
    /// RunPod: billed totals plus rate × time since the last billed bucket.
    Runpod,
}

impl BudgetProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetProvider::Meter => "meter",
            BudgetProvider::Lambda => "lambda",
            BudgetProvider::Runpod => "runpod",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Hard cap: projected > cap stops gracefully (exit 3), spent > cap stops at once (exit 4).
    pub cap_usd: f64,
    /// spent > alert ⇒ an alert (stdout, events.jsonl, webhook), the run goes on.
    #[serde(default)]
    pub alert_usd: Option<f64>,
    /// Refuse to launch when the current hourly price is above this.
    #[serde(default)]
    pub max_price_usd_per_hr: Option<f64>,
    #[serde(default = "default_provider")]
    pub provider: BudgetProvider,
    /// Hourly rate of the `meter` provider (and the fallback for projections).
    #[serde(default = "default_rate")]
    pub rate_usd_per_hr: f64,
    /// Money already spent before the meter started (instance setup, data preparation).
    #[serde(default)]
    pub prior_spend_usd: f64,
    /// How often the trainer runs the guard (it also runs at every checkpoint).
    #[serde(default = "default_check_interval")]
    pub check_interval_s: f64,
    /// How often the sidecar polls the provider; budget.json older than 3 polls is stale.
    #[serde(default = "default_poll_interval")]
    pub poll_interval_s: f64,
    /// How long a run may go on after the guard first finds budget.json missing, stale,
    /// malformed or from the future, before it stops as if over budget.
    #[serde(default = "default_grace")]
    pub grace_s: f64,
    /// Expected wall clock of the whole run, for the pre-launch projection before any step
    /// has been timed.
    #[serde(default)]
    pub planned_hours: Option<f64>,
    /// Provider instance (Lambda instance id, RunPod pod id); defaults from the environment.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Provider API base URL override (tests, proxies).
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// Environment variable holding the provider API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// File holding the provider API key (used when the variable is unset).
    #[serde(default)]
    pub api_key_file: Option<String>,
    /// Environment variable holding a webhook URL (Slack-compatible `{"text": …}`) for alerts.
    #[serde(default)]
    pub webhook_url_env: Option<String>,
}

fn default_provider() -> BudgetProvider {
    BudgetProvider::Meter
}
fn default_rate() -> f64 {
    1.29
}
fn default_check_interval() -> f64 {
    1800.0
}
fn default_poll_interval() -> f64 {
    300.0
}
fn default_grace() -> f64 {
    600.0
}

impl BudgetConfig {
    /// The course's rule: $35 cap, alert at $30, refuse above $1.40/h, A100 at $1.29/h.
    pub fn course_default() -> Self {
        Self {
            cap_usd: 35.0,
            alert_usd: Some(30.0),
            max_price_usd_per_hr: Some(1.40),
            provider: default_provider(),
            rate_usd_per_hr: default_rate(),
            prior_spend_usd: 0.0,
            check_interval_s: default_check_interval(),
            poll_interval_s: default_poll_interval(),
            grace_s: default_grace(),
            planned_hours: None,
            instance_id: None,
            api_base_url: None,
            api_key_env: None,
            api_key_file: None,
            webhook_url_env: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        fn nonneg(name: &str, v: f64) -> Result<()> {
            if !(v.is_finite() && v >= 0.0) {
                bail!("budget.{name} ({v}) must be a finite number >= 0");
            }
            Ok(())
        }
        fn positive(name: &str, v: f64) -> Result<()> {
            if !(v.is_finite() && v > 0.0) {
                bail!("budget.{name} ({v}) must be a finite number > 0");
            }
            Ok(())
        }
        nonneg("cap_usd", self.cap_usd)?;
        if let Some(a) = self.alert_usd {
            nonneg("alert_usd", a)?;
            if a > self.cap_usd {
                bail!(
                    "budget.alert_usd ({a}) is above budget.cap_usd ({}); set the alert below the cap",
                    self.cap_usd
                );
            }
        }
        if let Some(p) = self.max_price_usd_per_hr {
            positive("max_price_usd_per_hr", p)?;
        }
        nonneg("rate_usd_per_hr", self.rate_usd_per_hr)?;
        nonneg("prior_spend_usd", self.prior_spend_usd)?;
        positive("check_interval_s", self.check_interval_s)?;
        positive("poll_interval_s", self.poll_interval_s)?;
        nonneg("grace_s", self.grace_s)?;
        if let Some(h) = self.planned_hours {
            nonneg("planned_hours", h)?;
        }
        if let Some(u) = &self.api_base_url {
            if !(u.starts_with("https://") || u.starts_with("http://")) {
                bail!("budget.api_base_url ({u:?}) must start with https:// or http://");
            }
        }
        for (name, v) in [
            ("instance_id", &self.instance_id),
            ("api_key_env", &self.api_key_env),
            ("api_key_file", &self.api_key_file),
            ("webhook_url_env", &self.webhook_url_env),
        ] {
            if matches!(v, Some(s) if s.trim().is_empty()) {
                bail!("budget.{name} must not be empty; remove it or give a value");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BudgetConfig> {
        let c: BudgetConfig =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn defaults_and_course_numbers() {
        let c = parse("cap_usd = 35\nalert_usd = 30").unwrap();
        assert_eq!(c.provider, BudgetProvider::Meter);
        assert_eq!(c.poll_interval_s, 300.0);
        assert_eq!(c.check_interval_s, 1800.0);
        assert_eq!(c.grace_s, 600.0);
        BudgetConfig::course_default().validate().unwrap();
        let c = parse("cap_usd = 35\nprovider = \"runpod\"").unwrap();
        assert_eq!(c.provider.as_str(), "runpod");
    }

    #[test]
    fn errors_name_the_field() {
        for (text, field) in [
            ("cap_usd = -1", "budget.cap_usd"),
            ("cap_usd = 35\nalert_usd = 40", "budget.alert_usd"),
            (
                "cap_usd = 35\nmax_price_usd_per_hr = 0",
                "budget.max_price_usd_per_hr",
            ),
            (
                "cap_usd = 35\ncheck_interval_s = 0",
                "budget.check_interval_s",
            ),
            (
                "cap_usd = 35\npoll_interval_s = -5",
                "budget.poll_interval_s",
            ),
            ("cap_usd = 35\ngrace_s = -1", "budget.grace_s"),
            (
                "cap_usd = 35\nrate_usd_per_hr = -1",
                "budget.rate_usd_per_hr",
            ),
            (
                "cap_usd = 35\napi_base_url = \"ftp://x\"",
                "budget.api_base_url",
            ),
            ("cap_usd = 35\nprovider = \"aws\"", "aws"),
            ("cap_usd = 35\napi_key = \"k\"", "api_key"),
        ] {
            let e = format!("{:#}", parse(text).unwrap_err());
            assert!(e.contains(field), "{text}: {e}");
        }
    }
}
