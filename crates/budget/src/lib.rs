//! Budget guard and billing sidecar: a run never spends past its cap.
//!
//! Two processes share one file. The **sidecar** (`lab budget sidecar`) polls a billing
//! provider every `poll_interval_s` (default 300 s) and rewrites `budget.json` atomically:
//! `spent_usd, rate_usd_per_hr, hours_elapsed, projected_total_usd, last_update_utc` plus the
//! provider, the instance id and how the spend was obtained. The **guard** inside `lab train`
//! reads it every `check_interval_s` (default 1800 s) and at every checkpoint, and decides:
//!
//! | condition | action |
//! |---|---|
//! | spent > cap | stop at once, no checkpoint, exit 4 |
//! | projected > cap | graceful checkpoint, exit 3 |
//! | spent > alert | alert once: stdout, `events.jsonl`, webhook; the run goes on |
//!
//! **Spend and projection.** The guard extrapolates the file to the moment of the check:
//! `spent = spent_usd + rate_usd_per_hr × age of the file`, and
//! `projected = max(projected_total_usd, spent + rate_usd_per_hr × remaining hours)`, where
//! remaining hours = (total_steps − step) × measured seconds per step / 3600, from the trainer
//! itself or its `status.json`. Before any step is timed, the pre-launch check uses
//! `budget.planned_hours` (scaled by the steps left) when set.
//!
//! **Fail safe and the grace period.** budget.json that is missing, unparsable (bad JSON,
//! wrong types, negative or non-finite numbers, projection below spend), from the future (more
//! than 60 s ahead of this clock) or stale (older than 3 poll intervals, using the smaller of
//! the configured interval and the file's own) is never trusted. From the moment the file went
//! bad (for a stale file: its last update + 3 polls; otherwise the first check that saw it) the
//! run may continue for `grace_s` (default 600 s, two sidecar polls: long enough to ride out a
//! sidecar restart or a provider outage, short enough to cost cents at A100 prices), checked
//! no later than the end of the grace period; then it checkpoints and exits 3 with a one-line
//! reason. During the grace period the last good numbers, extrapolated at their rate, still
//! apply: if they cross the cap the run stops at once. Before launch there is no grace: an
//! untrusted file refuses the launch (exit 4).
//!
//! **Providers.** `meter` (no API: rate × wall clock, the default so the guard runs in CI),
//! `lambda` (price × time since the instance started: Lambda reports no spend) and `runpod`
//! (billed buckets + rate × time since the last billed instant). Keys come from an environment
//! variable or a file and live in [`secret::Secret`], which never prints them and scrubs them
//! from errors.

pub mod clock;
pub mod file;
pub mod guard;
pub mod lambda;
pub mod meter;
pub mod notify;
pub mod prelaunch;
pub mod provider;
pub mod run;
pub mod runpod;
pub mod secret;
pub mod setup;
pub mod sidecar;
pub mod status;
pub mod terminate;

pub use file::{read_budget, BudgetFile, BudgetUri, Problem, Reading};
pub use guard::{Decision, Guard, GuardSettings, Verdict};
pub use prelaunch::{PlannedRun, Report};
pub use provider::{EndAction, Provider, Sample};
pub use run::{BudgetFlags, EndOfRun, RunGuard};
pub use secret::Secret;
pub use status::Progress;
