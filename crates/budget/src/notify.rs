//! Alerts to a Slack-compatible webhook (`{"text": …}`) whose URL is itself a secret. (Guard
//! decisions also go to the run's events.jsonl, through lab-run.)

use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::secret::Secret;

/// Posts `{"text": text}` to the webhook. Errors never include the URL.
pub fn post_webhook(url: &Secret, text: &str, timeout: Duration) -> Result<()> {
    let client = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| anyhow!("webhook: {e}"))?;
    let body = serde_json::json!({ "text": text }).to_string();
    let resp = client
        .post(url.expose())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .map_err(|e| {
            let why = if e.is_timeout() {
                "timed out"
            } else {
                "request failed"
            };
            anyhow!("webhook: {why}")
        })?;
    if !resp.status().is_success() {
        return Err(anyhow!("webhook: HTTP {}", resp.status()));
    }
    Ok(())
}
