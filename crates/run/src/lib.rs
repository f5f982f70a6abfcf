//! The run folder (`--ckpt-dir`) as files: what the trainer writes and what `lab status`,
//! `lab export`, `lab postmortem` and the budget guard read. One typed row per file, shared
//! by writer and readers, so a field can never mean two things.
//!
//! ```text
//! metrics.jsonl            one MetricsRow per logged step (append-only, fsynced)
//! metrics-abandoned.jsonl  rows of steps undone by a rollback (kept as evidence)
//! events.jsonl             one Event per thing that happened (spike, rollback, checkpoint …)
//! events-abandoned.jsonl   events of steps a resume re-runs (the killed attempt's)
//! status.json              the Status snapshot, rewritten atomically
//! ```

pub mod clock;
pub mod events;
pub mod hardware;
pub mod jsonl;
pub mod metrics;
pub mod status;

pub use events::{append_event, read_events, Event};
pub use hardware::Hardware;
pub use jsonl::JsonLines;
pub use metrics::{read_metrics, MetricsRow};
pub use status::Status;

pub const METRICS: &str = "metrics.jsonl";
pub const ABANDONED_METRICS: &str = "metrics-abandoned.jsonl";
pub const EVENTS: &str = "events.jsonl";
pub const ABANDONED_EVENTS: &str = "events-abandoned.jsonl";
pub const STATUS: &str = "status.json";
/// The effective config of the run (TOML, overrides applied), written when it starts.
pub const CONFIG: &str = "config.toml";
