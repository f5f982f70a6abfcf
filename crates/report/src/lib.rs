//! What a run leaves behind for people, written from the run folder's own files
//! (metrics.jsonl, metrics-abandoned.jsonl, events.jsonl, config.toml).
//!
//! Today: the spike post-mortem (`lab postmortem`).

pub mod postmortem;
pub mod run_files;

pub use postmortem::{write_postmortem, Postmortem, Spike};
pub use run_files::RunFiles;
