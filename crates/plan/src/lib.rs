//! `lab plan`: parameters, FLOPs, memory per GPU, GPU-hours, wall clock and dollars for a
//! config on a cluster, computed from the config plus stated assumptions, with warnings for
//! plans that cannot work. `lab plan --check-lab` checks a lab page's promises.
//!
//! One module per idea: [`compute`] (parameters, FLOPs, Chinchilla), [`memory`] (per-GPU
//! memory under DP/ZeRO/TP/PP), [`fit`] (the micro-batch a device fits), [`schedule`] (time,
//! cost, what a deadline or budget buys), [`checks`] (warnings), [`report`] (the text table),
//! [`lab_page`] (`--check-lab`).

pub mod checks;
pub mod compute;
pub mod fit;
pub mod inputs;
pub mod lab_page;
pub mod memory;
pub mod prices;
pub mod report;
pub mod schedule;
pub mod units;

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

pub use checks::Warning;
pub use inputs::{Assumption, PlanInputs, PlanRequest};
pub use prices::Price;

use compute::{Chinchilla, FlopsConvention, ParamsReport};
use memory::{Layout, MemoryBreakdown};
use schedule::{Buys, QuoteReport, Scenario, Timing};

/// A complete plan: what `lab plan` prints and `--json` serializes.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub config: String,
    pub device: String,
    pub device_memory_bytes: f64,
    pub peak_flops_per_gpu: f64,
    pub gpus: usize,
    pub assumptions: Vec<Assumption>,
    pub params: ParamsReport,
    /// FLOPs per token by convention; the one marked `used` drives time and cost.
    pub flops: Vec<FlopsRow>,
    pub flops_per_token: f64,
    pub total_flops: f64,
    pub chinchilla: Chinchilla,
    pub batch: BatchReport,
    /// One per MFU.
    pub scenarios: Vec<Scenario>,
    pub deadline: Option<DeadlineReport>,
    pub budget: Option<BudgetReport>,
    /// The most the deadline and the budget (at the first price) both allow, at the first MFU.
    pub proposal: Option<Buys>,
    pub memory: MemoryReport,
    pub checkpoint: CheckpointReport,
    pub quote: Option<QuoteReport>,
    pub warnings: Vec<Warning>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlopsRow {
    #[serde(flatten)]
    pub convention: FlopsConvention,
    pub total_flops: f64,
    /// At the first MFU.
    pub tokens_per_s: f64,
    pub compute_hours: f64,
    /// The MFU this count needs to meet the deadline, when there is one.
    pub mfu_for_deadline: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub global_batch_tokens: f64,
    pub sequences_per_step: f64,
    /// ceil(tokens / global batch).
    pub steps: u64,
    pub config_total_steps: usize,
    pub data_parallel: usize,
    pub micro_batch: usize,
    /// Micro-batches per replica per step (fractional when the batch does not divide).
    pub grad_accum: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeadlineReport {
    pub hours: f64,
    /// At the plan's FLOP count; infinite if checkpoint writes alone overrun.
    pub required_mfu: f64,
    /// What the deadline buys, per MFU.
    pub buys: Vec<Buys>,
    pub met: Vec<bool>,
    /// Renting the whole cluster for the deadline, per price.
    pub rental: Vec<Rental>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rental {
    pub price: String,
    pub usd_per_gpu_hour: f64,
    pub usd: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BudgetReport {
    pub usd: f64,
    /// What the budget buys at the first MFU, per price.
    pub buys: Vec<Buys>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    pub layout: Layout,
    /// ZeRO stages 0–3 on the chosen TP × PP × DP.
    pub stages: Vec<MemoryBreakdown>,
    pub chosen: MemoryBreakdown,
    pub device_memory_bytes: f64,
    pub fits: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointReport {
    /// fp32 weights (or master weights) + Adam's two moments: 12 bytes per parameter.
    pub resumable_bytes: f64,
    /// fp32 weights alone (an fp32 safetensors export; half that in bf16).
    pub weights_bytes: f64,
    pub storage_bytes_per_s: f64,
    pub write_seconds: f64,
    pub every_steps: usize,
    pub count: u64,
    /// At the first MFU: the write time as a share of the compute time between checkpoints.
    pub share_of_interval: f64,
}

/// Computes the plan.
pub fn plan(inputs: &PlanInputs) -> Plan {
    let model = &inputs.model;
    let params = compute::params_report(model, inputs.params_override);
    let conventions = compute::flops_conventions(model, &params);
    let used = conventions
        .iter()
        .find(|c| c.used)
        .expect("one convention is used");
    let flops_per_token = used.flops_per_token;
    let total_flops = flops_per_token * inputs.tokens;

    let bytes = memory::state_bytes(inputs.precision);
    let checkpoint_resumable = params.used * (bytes.weights.max(bytes.master) + bytes.moments);
    let write_seconds = checkpoint_resumable / inputs.storage_bytes_per_s;
    let timing = Timing {
        flops_per_token,
        gpus: inputs.layout.gpus,
        peak_flops_per_gpu: inputs.peak_flops_per_gpu,
        global_batch_tokens: inputs.global_batch_tokens,
        overhead: inputs.overhead,
        ckpt_every_steps: inputs.ckpt_every as f64,
        ckpt_write_seconds: write_seconds,
    };
    let first_mfu = inputs.mfus[0];
    let scenarios: Vec<Scenario> = inputs
        .mfus
        .iter()
        .map(|&m| timing.scenario(m, inputs.tokens, &inputs.prices))
        .collect();

    let flops: Vec<FlopsRow> = conventions
        .iter()
        .map(|c| {
            let t = Timing {
                flops_per_token: c.flops_per_token,
                ..timing.clone()
            };
            FlopsRow {
                convention: c.clone(),
                total_flops: c.flops_per_token * inputs.tokens,
                tokens_per_s: t.tokens_per_second(first_mfu),
                compute_hours: inputs.tokens / t.tokens_per_second(first_mfu) / 3600.0,
                mfu_for_deadline: inputs
                    .deadline_hours
                    .map(|h| t.required_mfu(inputs.tokens, h)),
            }
        })
        .collect();

    let deadline = inputs.deadline_hours.map(|h| DeadlineReport {
        hours: h,
        required_mfu: timing.required_mfu(inputs.tokens, h),
        buys: inputs
            .mfus
            .iter()
            .map(|&m| timing.buys(m, h, format!("deadline {}", units::hours(h))))
            .collect(),
        met: scenarios.iter().map(|s| s.wall_clock_hours <= h).collect(),
        rental: inputs
            .prices
            .iter()
            .map(|p| Rental {
                price: p.name.clone(),
                usd_per_gpu_hour: p.usd_per_gpu_hour,
                usd: h * inputs.layout.gpus as f64 * p.usd_per_gpu_hour,
            })
            .collect(),
    });
    let budget = inputs.budget_usd.map(|usd| BudgetReport {
        usd,
        buys: inputs
            .prices
            .iter()
            .map(|p| {
                let hours = usd / (inputs.layout.gpus as f64 * p.usd_per_gpu_hour);
                let limit = format!(
                    "budget {} at {} ${:.2}/GPU-h",
                    units::usd(usd),
                    p.name,
                    p.usd_per_gpu_hour
                );
                timing.buys(first_mfu, hours, limit)
            })
            .collect(),
    });
    let proposal = deadline
        .as_ref()
        .map(|d| d.buys[0].clone())
        .into_iter()
        .chain(budget.as_ref().and_then(|b| b.buys.first().cloned()))
        .min_by_key(|b| b.steps);

    let stages = memory::stage_table(model, inputs.precision, params.used, &inputs.layout);
    let chosen = memory::per_gpu(model, inputs.precision, params.used, &inputs.layout);
    let memory = MemoryReport {
        layout: inputs.layout,
        stages,
        chosen,
        device_memory_bytes: inputs.device.memory_bytes,
        fits: chosen.total <= inputs.device.memory_bytes,
    };

    let steps_exact = inputs.tokens / inputs.global_batch_tokens;
    let steps = steps_exact.ceil() as u64;
    let seconds_between_checkpoints =
        inputs.ckpt_every as f64 * inputs.global_batch_tokens / timing.tokens_per_second(first_mfu);
    let checkpoint = CheckpointReport {
        resumable_bytes: checkpoint_resumable,
        weights_bytes: params.used * bytes.weights.max(bytes.master),
        storage_bytes_per_s: inputs.storage_bytes_per_s,
        write_seconds,
        every_steps: inputs.ckpt_every,
        count: steps / inputs.ckpt_every as u64,
        share_of_interval: write_seconds / seconds_between_checkpoints,
    };

    let quote = inputs.quote_usd_per_hour.map(|q| {
        let (hours, from) = match inputs.deadline_hours {
            Some(h) => (h, "--hours".to_string()),
            None => (
                scenarios[0].wall_clock_hours,
                format!("the plan's wall clock at MFU {first_mfu:.2}"),
            ),
        };
        schedule::quote_report(
            q,
            hours,
            from,
            inputs.layout.gpus,
            inputs.gpus_per_node,
            prices::plausible_band(inputs.device.name),
        )
    });

    let mut plan = Plan {
        config: inputs.config_name.clone(),
        device: inputs.device.name.to_string(),
        device_memory_bytes: inputs.device.memory_bytes,
        peak_flops_per_gpu: inputs.peak_flops_per_gpu,
        gpus: inputs.layout.gpus,
        assumptions: inputs.assumptions.clone(),
        chinchilla: compute::chinchilla(params.used, inputs.tokens, total_flops),
        params,
        flops,
        flops_per_token,
        total_flops,
        batch: BatchReport {
            global_batch_tokens: inputs.global_batch_tokens,
            sequences_per_step: inputs.global_batch_tokens / model.seq_len as f64,
            steps,
            config_total_steps: inputs.config_total_steps,
            data_parallel: inputs.layout.dp,
            micro_batch: inputs.layout.micro_batch,
            grad_accum: inputs.grad_accum_exact,
        },
        scenarios,
        deadline,
        budget,
        proposal,
        memory,
        checkpoint,
        quote,
        warnings: Vec::new(),
        notes: Vec::new(),
    };
    let (warnings, notes) = checks::review(&plan, inputs);
    plan.warnings = warnings;
    plan.notes = notes;
    plan
}

/// What `lab plan` is asked to do.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Plan a config.
    Config(&'a Path),
    /// Check a lab page's promises (`--check-lab`).
    LabPage(&'a Path),
}

/// The printed result, and for `--check-lab` the one-line failure when a promise breaks.
#[derive(Debug, Clone)]
pub struct Output {
    /// The table, or JSON with `json`.
    pub text: String,
    pub failure: Option<String>,
}

/// Runs `lab plan`: everything but flag parsing and the exit code. Bad input is an error
/// naming the file or flag; a plan with warnings is not.
pub fn execute(target: Target, request: &PlanRequest, json: bool) -> Result<Output> {
    match target {
        Target::Config(path) => {
            let cfg = lab_config::LabConfig::load(path)?;
            let inputs = PlanInputs::resolve(&cfg, request)?;
            let plan = plan(&inputs);
            let text = if json {
                serde_json::to_string_pretty(&plan)? + "\n"
            } else {
                report::render(&plan)
            };
            Ok(Output {
                text,
                failure: None,
            })
        }
        Target::LabPage(path) => {
            let check = lab_page::check(path, request)?;
            let text = if json {
                serde_json::to_string_pretty(&check)? + "\n"
            } else {
                lab_page::render(&check)
            };
            let failure = (!check.holds).then(|| {
                let failed: Vec<&str> = check.failed().iter().map(|c| c.promise).collect();
                let proposal = check
                    .proposal
                    .as_ref()
                    .map(|p| {
                        format!(
                            "; at MFU {:.2} its {} and {} buy {} steps ({} tokens)",
                            check.promises.mfu,
                            units::hours(check.promises.hours),
                            units::usd(check.promises.budget_usd),
                            units::group(p.steps),
                            units::si(p.tokens)
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "lab page {}: {} of {} promises do not add up ({}){proposal}",
                    path.display(),
                    failed.len(),
                    check.checks.len(),
                    failed.join(", ")
                )
            });
            Ok(Output { text, failure })
        }
    }
}
