//! Training: the loop, its step and optimizer, the policies that may stop, skip or rewind a
//! step (signals, non-finite steps, spikes, and the budget guard the binary plugs in), the data
//! stream with its cursor and spike injection, and checkpoints that survive anything.

pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod detect;
pub mod device;
pub mod eval;
pub mod forensics;
pub mod freeze;
pub mod gpu_pools;
pub mod health;
pub mod hf_init;
pub mod inject;
pub mod judge;
pub mod kernel_cache;
pub mod op_split;
pub mod optim;
pub mod parallel;
pub mod policy;
pub mod run;
pub mod schedule;
pub mod signals;
pub mod stability;
pub mod state;
pub mod step;
pub mod stop_rules;
pub mod stream;
pub mod trainer;

/// The whole loop on the GPU backend's kernels against the CPU's, step for step: a unit test
/// so that CI's lavapipe run of lab-train's `--lib` tests takes it without another binary.
#[cfg(all(test, feature = "wgpu"))]
mod gpu_follows_cpu;

pub use backend::{BackendKind, TrainBackend};
pub use policy::{Decision, Journal, StepPolicy, StepView, Stop};
pub use trainer::{train, AlertSink, Outcome, TrainOptions};
