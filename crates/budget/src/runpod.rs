//! RunPod (REST v2). `GET /v2/pods` gives each pod's price per hour (`costPerHr`) and when it
//! last started; `GET /v2/billing/pods?podId=…&bucketSize=hour` gives billed totals per hour
//! bucket. Billing lags (5-minute cycles), so spent = billed + rate × time since the last
//! billed instant, where that instant is taken as the end of the newest bucket but never later
//! than one billing cycle ago: the estimate may run a cycle high, never low.
//! (The GraphQL `myself { clientBalance currentSpendPerHr }` query is not used: REST v2 covers
//! the same numbers per pod.)

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};

use crate::clock::{format_utc, parse_utc};
use crate::provider::{kind, list, num, string, Api, EndAction, Provider, Sample};
use crate::secret::Secret;

pub const DEFAULT_BASE_URL: &str = "https://api.runpod.io";
/// RunPod bills in 5-minute cycles.
pub const BILLING_CYCLE_S: f64 = 300.0;

pub struct Runpod {
    api: Api,
    pod_id: String,
}

impl Runpod {
    pub fn new(base_url: &str, key: Secret, pod_id: String, timeout: Duration) -> Result<Runpod> {
        Ok(Runpod {
            api: Api::new("runpod", base_url, key, timeout)?,
            pod_id,
        })
    }

    fn pods(&self) -> Result<Vec<Value>> {
        let v = self.api.get("/v2/pods")?;
        Ok(list(&v, &["pods", "data", "items"], "runpod: /v2/pods")?.clone())
    }

    fn find(&self, pods: &[Value]) -> Option<Value> {
        pods.iter()
            .find(|p| p.get("id").and_then(Value::as_str) == Some(self.pod_id.as_str()))
            .cloned()
    }
}

/// The first of `keys` present in `obj`, as a number.
fn first_num(obj: &Value, keys: &[&str], what: &str) -> Result<f64> {
    let key = keys
        .iter()
        .find(|k| obj.get(**k).is_some())
        .unwrap_or(&keys[0]);
    num(obj, key, what)
}

fn first_str<'a>(obj: &'a Value, keys: &[&str], what: &str) -> Result<&'a str> {
    let key = keys
        .iter()
        .find(|k| obj.get(**k).is_some())
        .unwrap_or(&keys[0]);
    string(obj, key, what)
}

impl Provider for Runpod {
    fn name(&self) -> &'static str {
        "runpod"
    }

    fn instance_id(&self) -> Option<String> {
        Some(self.pod_id.clone())
    }

    fn sample(&mut self, now: f64) -> Result<Sample> {
        let pods = self.pods()?;
        let what = format!("runpod: pod {}", self.pod_id);
        let pod = self
            .find(&pods)
            .ok_or_else(|| anyhow!("{what} is not in /v2/pods"))?;
        let rate = first_num(&pod, &["costPerHr", "adjustedCostPerHr"], &what)?;
        if rate < 0.0 {
            bail!("{what}: costPerHr is negative ({rate})");
        }
        let started_text = first_str(&pod, &["lastStartedAt", "startedAt"], &what)?;
        let started = parse_utc(started_text).map_err(|e| anyhow!("{what}: lastStartedAt: {e}"))?;
        let from_hour = (started / 3600.0).floor() * 3600.0;
        let path = format!(
            "/v2/billing/pods?podId={}&bucketSize=hour&startTime={}",
            self.pod_id,
            format_utc(from_hour).replace(".000Z", "Z")
        );
        let billing = self.api.get(&path)?;
        let records = list(
            &billing,
            &["records", "data", "items"],
            "runpod: /v2/billing/pods",
        )?;
        let mut billed = 0.0;
        let mut newest_bucket: Option<f64> = None;
        for (i, r) in records.iter().enumerate() {
            let rwhat = format!("runpod: billing record {i}");
            if let Some(pid) = r.get("podId") {
                if pid.as_str() != Some(self.pod_id.as_str()) {
                    continue; // another pod's bucket
                }
            }
            let amount = first_num(r, &["totalAmount", "amount"], &rwhat)?;
            if amount < 0.0 {
                bail!("{rwhat}: amount is negative ({amount})");
            }
            let t = parse_utc(first_str(r, &["time", "startTime"], &rwhat)?)
                .map_err(|e| anyhow!("{rwhat}: time: {e}"))?;
            billed += amount;
            newest_bucket = Some(newest_bucket.map_or(t, |n: f64| n.max(t)));
        }
        let billed_through = match newest_bucket {
            None => started,
            Some(b) => b.max((b + 3600.0).min(now - BILLING_CYCLE_S)),
        };
        let unbilled_h = ((now - billed_through) / 3600.0).max(0.0);
        let status = pod
            .get("desiredStatus")
            .map(|s| s.as_str().unwrap_or(kind(s)).to_string())
            .unwrap_or_else(|| "unknown".into());
        Ok(Sample {
            spent_usd: billed + rate * unbilled_h,
            rate_usd_per_hr: rate,
            hours_elapsed: ((now - started) / 3600.0).max(0.0),
            method: format!(
                "runpod: billed ${billed:.4} in {} hour bucket(s) + costPerHr × {:.3} h not yet \
                 billed (status {status})",
                records.len(),
                unbilled_h
            ),
            instance_id: Some(self.pod_id.clone()),
        })
    }

    fn end_instance(&mut self, action: EndAction) -> Result<Value> {
        self.api.post(
            &format!("/v2/pods/{}/action", self.pod_id),
            &json!({ "action": action.as_str() }),
        )
    }

    fn instance_status(&mut self, action: EndAction) -> Result<Option<String>> {
        let pods = self.pods()?;
        Ok(match self.find(&pods) {
            None => None,
            Some(p) => {
                let s = p
                    .get("desiredStatus")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_string();
                let gone = match action {
                    EndAction::Terminate => s == "TERMINATED",
                    EndAction::Stop => matches!(s.as_str(), "EXITED" | "STOPPED" | "TERMINATED"),
                };
                if gone {
                    None
                } else {
                    Some(s)
                }
            }
        })
    }
}
