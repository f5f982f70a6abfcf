//! Training: the loop, its optimizer and schedule, checkpoints that survive anything, and the
//! run folder's logs (`metrics.jsonl`, `events.jsonl`, `status.json`).

pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod optim;
pub mod run_log;
pub mod schedule;
pub mod signals;
pub mod trainer;

pub use backend::{BackendKind, TrainBackend};
pub use trainer::{train, Outcome, TrainOptions};
