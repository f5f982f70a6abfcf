//! What a run leaves behind for people and tools, written from the run folder's own files
//! (metrics.jsonl, metrics-abandoned.jsonl, events.jsonl, config.toml, the checkpoints):
//! the export (manifest, CSV, plots, weights, model card), the spike post-mortem, the
//! Definition-of-Done check, `lab status`, and the Hugging Face and MLflow formats.

pub mod compare;
pub mod dod;
pub mod export;
pub mod hf;
pub mod manifest;
pub mod mlflow;
pub mod model_card;
pub mod plots;
pub mod postmortem;
pub mod run_files;
pub mod run_model;
pub mod status;
pub mod versions;

pub use export::{export, CheckpointChoice, ExportOptions};
pub use manifest::Manifest;
pub use postmortem::{write_postmortem, Postmortem, Spike};
pub use run_files::RunFiles;
