//! lab's end-to-end tests: the real `lab` binary driven as a user drives it. One test binary,
//! so that cargo links the backends once rather than once per file, and the harness runs the
//! long `lab run` of the embedded lab beside the shorter tests instead of alone.

mod common;

mod budget_cli;
mod cloud_bootstrap;
mod data_cli;
mod data_mixture_e2e;
mod embedded_default;
mod eval_e2e;
mod gpu_lease;
mod hf_init_e2e;
mod lab_run_e2e;
mod parallel_e2e;
mod plan_cli;
mod precision_e2e;
mod spike_e2e;
mod supervise_cli;
mod train_e2e;
