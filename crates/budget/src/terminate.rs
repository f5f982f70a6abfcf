//! `--terminate-on-exit`: ask the provider to terminate (or stop) the instance, re-list until
//! it is gone, and write the API's answer and the listings as `termination.json`: the lab's
//! "instance terminated" proof. Keep the run folder on storage that outlives the instance
//! (or run `lab budget terminate` from another machine).

use std::path::Path;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::clock::{format_utc, Clock};
use crate::provider::{EndAction, Provider};

/// Ends the instance and confirms it is gone; writes `out` whatever happens.
/// `poll_s` between listings, at most `max_wait_s` in all, on `clock`.
pub fn end_and_confirm(
    provider: &mut dyn Provider,
    action: EndAction,
    out: &Path,
    poll_s: f64,
    max_wait_s: f64,
    clock: &dyn Clock,
) -> Result<Value> {
    let started = clock.now();
    let mut record = json!({
        "provider": provider.name(),
        "instance_id": provider.instance_id(),
        "action": action.as_str(),
        "requested_utc": format_utc(started),
    });
    let write = |record: &Value| -> Result<()> {
        let mut text = serde_json::to_string_pretty(record).expect("json");
        text.push('\n');
        lab_fsio::write_atomic(out, text.as_bytes())
    };
    if provider.name() == "meter" {
        record["response"] = provider.end_instance(action)?;
        record["confirmed_gone"] = json!(false);
        write(&record)?;
        return Ok(record);
    }
    match provider.end_instance(action) {
        Ok(answer) => record["response"] = answer,
        Err(e) => {
            record["error"] = json!(format!("{e:#}"));
            write(&record)?;
            bail!("{e:#}");
        }
    }
    // The instance id may only be known after the call (Lambda picks the only live one).
    record["instance_id"] = json!(provider.instance_id());
    let mut listings = Vec::new();
    let mut confirmed = None;
    loop {
        let now = clock.now();
        match provider.instance_status(action) {
            Ok(None) => {
                listings.push(json!({ "utc": format_utc(now), "status": "gone" }));
                confirmed = Some(now);
                break;
            }
            Ok(Some(s)) => listings.push(json!({ "utc": format_utc(now), "status": s })),
            Err(e) => listings.push(json!({ "utc": format_utc(now), "error": format!("{e:#}") })),
        }
        if now - started >= max_wait_s {
            break;
        }
        clock.sleep(poll_s);
    }
    record["listings"] = json!(listings);
    record["confirmed_gone"] = json!(confirmed.is_some());
    record["confirmed_utc"] = json!(confirmed.map(format_utc));
    write(&record)?;
    if confirmed.is_none() {
        bail!(
            "{}: instance still listed {:.0} s after {}; see {}",
            provider.name(),
            max_wait_s,
            action.as_str(),
            out.display()
        );
    }
    Ok(record)
}
