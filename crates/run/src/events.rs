//! `events.jsonl`: one line per thing that happened in a run, written by the trainer and the
//! budget guard alike: `{time_utc, step, kind, ...fields}`.

use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::clock::{format_utc, now_unix};
use crate::jsonl;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub time_utc: String,
    pub step: u64,
    pub kind: String,
    /// Everything else the event says (its numbers, reasons, paths).
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl Event {
    pub fn f64(&self, key: &str) -> Option<f64> {
        self.fields.get(key).and_then(Value::as_f64)
    }
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.fields.get(key).and_then(Value::as_u64)
    }
    pub fn str(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }
}

/// Appends an event, stamped now, to `run_dir/events.jsonl`. `fields` is a JSON object (other
/// values are ignored).
pub fn append_event(run_dir: &Path, step: u64, kind: &str, fields: Value) -> Result<()> {
    let fields = match fields {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let event = Event {
        time_utc: format_utc(now_unix()),
        step,
        kind: kind.to_string(),
        fields,
    };
    jsonl::append_line(&run_dir.join(crate::EVENTS), &event)
}

/// On resume: the events of `kinds` logged after `step` by the attempt that was cut short are
/// moved to `events-abandoned.jsonl` (the resumed run logs them again as it replays those
/// steps); other events (budget alerts, interruptions) stay. Torn lines are dropped.
pub fn abandon_after(run_dir: &Path, step: u64, kinds: &[&str]) -> Result<()> {
    let path = run_dir.join(crate::EVENTS);
    let events: Vec<Event> = jsonl::read_lines(&path)?;
    let (keep, moved): (Vec<Event>, Vec<Event>) = events
        .into_iter()
        .partition(|e| e.step <= step || !kinds.contains(&e.kind.as_str()));
    let aside = run_dir.join(crate::ABANDONED_EVENTS);
    for e in &moved {
        jsonl::append_line(&aside, e)?;
    }
    let mut text = String::new();
    for e in &keep {
        text.push_str(&serde_json::to_string(e)?);
        text.push('\n');
    }
    lab_fsio::write_atomic(&path, text.as_bytes())
}

/// Every event of a run, in the order written.
pub fn read_events(run_dir: &Path) -> Result<Vec<Event>> {
    jsonl::read_lines(&run_dir.join(crate::EVENTS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_round_trip_with_their_fields() {
        let dir = tempfile::tempdir().unwrap();
        append_event(
            dir.path(),
            7,
            "spike_detected",
            json!({ "ratio": 1.5, "why": "z" }),
        )
        .unwrap();
        append_event(dir.path(), 9, "done", json!(null)).unwrap();
        let e = read_events(dir.path()).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].step, e[0].kind.as_str()), (7, "spike_detected"));
        assert_eq!(e[0].f64("ratio"), Some(1.5));
        assert_eq!(e[0].str("why"), Some("z"));
        assert!(e[1].fields.is_empty());
        assert!(crate::clock::parse_utc(&e[1].time_utc).is_ok());
    }
}
