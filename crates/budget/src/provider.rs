//! Billing providers behind one trait, and the small HTTP client they share. Every request
//! carries the key in a header only; every error is one line with the key scrubbed out.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::secret::Secret;

/// One good reading of the provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub spent_usd: f64,
    pub rate_usd_per_hr: f64,
    /// Hours since billing started.
    pub hours_elapsed: f64,
    /// How `spent_usd` was obtained, written into budget.json.
    pub method: String,
    pub instance_id: Option<String>,
}

/// What `--terminate-on-exit` asks the provider to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndAction {
    /// Delete the instance: billing stops entirely.
    Terminate,
    /// Stop it (RunPod keeps the volume and bills storage only).
    Stop,
}

impl EndAction {
    pub fn as_str(self) -> &'static str {
        match self {
            EndAction::Terminate => "terminate",
            EndAction::Stop => "stop",
        }
    }
}

pub trait Provider: Send {
    fn name(&self) -> &'static str;
    fn instance_id(&self) -> Option<String>;
    /// Spend and price now (`now` in Unix seconds).
    fn sample(&mut self, now: f64) -> Result<Sample>;
    /// Asks the provider to terminate or stop the instance; returns the API's answer.
    fn end_instance(&mut self, action: EndAction) -> Result<Value>;
    /// Lists instances: `None` when ours is gone (terminated, or stopped for `Stop`), else
    /// its status.
    fn instance_status(&mut self, action: EndAction) -> Result<Option<String>>;
}

/// A JSON-over-HTTPS client for one provider: base URL, bearer key, timeout.
pub struct Api {
    client: reqwest::blocking::Client,
    base: String,
    key: Secret,
    provider: &'static str,
}

impl Api {
    pub fn new(provider: &'static str, base: &str, key: Secret, timeout: Duration) -> Result<Api> {
        let client = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("lab-budget/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| anyhow!("{provider}: cannot build HTTP client: {e}"))?;
        Ok(Api {
            client,
            base: base.trim_end_matches('/').to_string(),
            key,
            provider,
        })
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let req = self.client.get(&url);
        self.send(req, "GET", &url)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let req = self
            .client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string());
        self.send(req, "POST", &url)
    }

    fn send(
        &self,
        req: reqwest::blocking::RequestBuilder,
        method: &str,
        url: &str,
    ) -> Result<Value> {
        let result = (|| -> Result<Value> {
            let resp = req
                .bearer_auth(self.key.expose())
                .send()
                .map_err(|e| anyhow!("{}", describe_reqwest(&e)))?;
            let status = resp.status();
            let text = resp
                .text()
                .map_err(|e| anyhow!("reading the body: {}", describe_reqwest(&e)))?;
            if !status.is_success() {
                let hint = match status.as_u16() {
                    429 => " (rate limited)",
                    401 | 403 => " (check the API key)",
                    s if s >= 500 => " (provider error)",
                    _ => "",
                };
                bail!("HTTP {status}{hint}: {}", snippet(&text));
            }
            serde_json::from_str(&text)
                .map_err(|e| anyhow!("response is not valid JSON ({e}); truncated?"))
        })();
        // One line, no key: the body of an error may echo the Authorization header.
        result.map_err(|e| {
            anyhow!(
                "{}",
                self.key
                    .redact(&format!(
                        "{}: {method} {}: {e:#}",
                        self.provider,
                        crate::file::redact_url(url)
                    ))
                    .replace(['\n', '\r'], " ")
            )
        })
    }
}

fn describe_reqwest(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    if e.is_connect() {
        return "cannot connect".into();
    }
    // Without the URL (the caller names it once) but with the causes.
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(&format!(" ({u})"), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// First 200 characters of a body, on one line.
fn snippet(text: &str) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

/// `value[key]` as a number, with an error naming the field and what was there instead.
pub fn num(obj: &Value, key: &str, what: &str) -> Result<f64> {
    match obj.get(key) {
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|v| v.is_finite())
            .ok_or_else(|| anyhow!("{what}.{key} is not a finite number")),
        Some(other) => bail!("{what}.{key} is {}, expected a number", kind(other)),
        None => bail!("{what}.{key} is missing"),
    }
}

/// `value[key]` as a string.
pub fn string<'a>(obj: &'a Value, key: &str, what: &str) -> Result<&'a str> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => bail!("{what}.{key} is {}, expected a string", kind(other)),
        None => bail!("{what}.{key} is missing"),
    }
}

pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The array in `v` itself or under one of `keys` (APIs wrap lists differently).
pub fn list<'a>(v: &'a Value, keys: &[&str], what: &str) -> Result<&'a Vec<Value>> {
    if let Value::Array(a) = v {
        return Ok(a);
    }
    for k in keys {
        if let Some(Value::Array(a)) = v.get(*k) {
            return Ok(a);
        }
    }
    bail!(
        "{what}: expected a list (or an object with {}), got {}",
        keys.join("/"),
        kind(v)
    )
}
