//! Lambda Cloud. `GET /api/v1/instances` gives each instance's `status` and
//! `instance_type.price_cents_per_hour`; Lambda reports no spend, so the sidecar integrates
//! price × time observed, from the instance's own start (the machine's boot time when the
//! sidecar runs on the instance, or `--started-at`). Between two polls it charges the higher
//! of the two prices, so a price change never makes the estimate low.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use crate::provider::{list, num, string, Api, EndAction, Provider, Sample};
use crate::secret::Secret;

pub const DEFAULT_BASE_URL: &str = "https://cloud.lambda.ai";

pub struct Lambda {
    api: Api,
    instance_id: Option<String>,
    started_unix: f64,
    /// (time, spent, price per hour) at the last good poll.
    last: Option<(f64, f64, f64)>,
}

impl Lambda {
    /// `instance_id`: `None` picks the only live instance of the account.
    pub fn new(
        base_url: &str,
        key: Secret,
        instance_id: Option<String>,
        started_unix: f64,
        timeout: Duration,
    ) -> Result<Lambda> {
        Ok(Lambda {
            api: Api::new("lambda", base_url, key, timeout)?,
            instance_id,
            started_unix,
            last: None,
        })
    }

    fn instances(&self) -> Result<Vec<Value>> {
        let v = self.api.get("/api/v1/instances")?;
        Ok(list(&v, &["data"], "lambda: /api/v1/instances")?.clone())
    }

    /// Our instance in the listing (by id, or the only one not terminated).
    fn find<'a>(&self, instances: &'a [Value]) -> Result<Option<&'a Value>> {
        match &self.instance_id {
            Some(id) => Ok(instances
                .iter()
                .find(|i| i.get("id").and_then(Value::as_str) == Some(id.as_str()))),
            None => {
                let live: Vec<&Value> = instances
                    .iter()
                    .filter(|i| i.get("status").and_then(Value::as_str) != Some("terminated"))
                    .collect();
                match live.len() {
                    0 => Ok(None),
                    1 => Ok(Some(live[0])),
                    n => bail!(
                        "lambda: {n} live instances in the account; name ours with \
                         --instance-id or budget.instance_id"
                    ),
                }
            }
        }
    }
}

impl Provider for Lambda {
    fn name(&self) -> &'static str {
        "lambda"
    }

    fn instance_id(&self) -> Option<String> {
        self.instance_id.clone()
    }

    fn sample(&mut self, now: f64) -> Result<Sample> {
        let instances = self.instances()?;
        let inst = self.find(&instances)?.ok_or_else(|| {
            anyhow!(
                "lambda: instance {} is not in /api/v1/instances",
                self.instance_id.as_deref().unwrap_or("(any live)")
            )
        })?;
        let id = string(inst, "id", "lambda: instance")?.to_string();
        let what = format!("lambda: instance {id}");
        let status = string(inst, "status", &what)?;
        let itype = inst
            .get("instance_type")
            .ok_or_else(|| anyhow!("{what}: instance_type is missing"))?;
        let cents = num(
            itype,
            "price_cents_per_hour",
            &format!("{what}: instance_type"),
        )?;
        if cents < 0.0 {
            bail!("{what}: instance_type.price_cents_per_hour is negative ({cents})");
        }
        let price = cents / 100.0;
        let hours_elapsed = ((now - self.started_unix) / 3600.0).max(0.0);
        let spent = match self.last {
            None => price * hours_elapsed,
            Some((t, spent, p)) => spent + p.max(price) * ((now - t) / 3600.0).max(0.0),
        };
        self.last = Some((now, spent, price));
        if self.instance_id.is_none() {
            self.instance_id = Some(id.clone());
        }
        Ok(Sample {
            spent_usd: spent,
            rate_usd_per_hr: price,
            hours_elapsed,
            method: format!(
                "lambda reports no spend: price_cents_per_hour × hours since the instance \
                 started (status {status})"
            ),
            instance_id: Some(id),
        })
    }

    fn end_instance(&mut self, action: EndAction) -> Result<Value> {
        if action == EndAction::Stop {
            bail!("lambda: instances cannot be stopped, only terminated; use terminate");
        }
        let id = self.resolved_id()?;
        self.api.post(
            "/api/v1/instance-operations/terminate",
            &json!({ "instance_ids": [id] }),
        )
    }

    fn instance_status(&mut self, _action: EndAction) -> Result<Option<String>> {
        let id = self.resolved_id()?;
        let instances = self.instances()?;
        let inst = instances
            .iter()
            .find(|i| i.get("id").and_then(Value::as_str) == Some(id.as_str()));
        Ok(match inst {
            None => None,
            Some(i) => match i.get("status").and_then(Value::as_str) {
                Some("terminated") => None,
                Some(s) => Some(s.to_string()),
                None => Some("unknown".into()),
            },
        })
    }
}

impl Lambda {
    fn resolved_id(&mut self) -> Result<String> {
        if self.instance_id.is_none() {
            let instances = self.instances()?;
            if let Some(i) = self.find(&instances)? {
                self.instance_id = Some(string(i, "id", "lambda: instance")?.to_string());
            }
        }
        self.instance_id
            .clone()
            .ok_or_else(|| anyhow!("lambda: no live instance to terminate"))
    }
}
