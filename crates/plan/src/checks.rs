//! Warnings for plans that cannot work (memory, MFU, deadline, budget, batch arithmetic, a
//! quote that does not add up) and notes that explain the numbers.

use serde::Serialize;

use crate::units::{gib, group, hours, si, usd};
use crate::{Plan, PlanInputs};

/// MFU above this is rarely sustained on dense transformer training (PaLM reports 46%,
/// well-tuned Megatron/torchtitan runs 40–55%).
pub const MAX_CREDIBLE_MFU: f64 = 0.6;
/// Above this share of device memory, the CUDA context, allocator fragmentation and
/// temporary buffers are likely to push a run out of memory.
pub const TIGHT_MEMORY_SHARE: f64 = 0.9;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Warning {
    /// Stable key for scripts: memory, memory-tight, mfu, deadline, budget, batch, quote,
    /// checkpoint.
    pub kind: &'static str,
    pub message: String,
}

fn warn(kind: &'static str, message: String) -> Warning {
    Warning { kind, message }
}

pub fn review(plan: &Plan, inputs: &PlanInputs) -> (Vec<Warning>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    let mem = &plan.memory;

    // Memory.
    if !mem.fits {
        let suggestion = mem
            .stages
            .iter()
            .flat_map(|s| {
                [
                    (s.total_without_checkpointing, s.zero_stage, false),
                    (s.total_with_checkpointing, s.zero_stage, true),
                ]
            })
            .filter(|(total, _, _)| *total <= mem.device_memory_bytes * TIGHT_MEMORY_SHARE)
            .map(|(_, stage, ckpt)| {
                format!(
                    "ZeRO-{stage}{}",
                    if ckpt {
                        " with --activation-checkpointing selective"
                    } else {
                        ""
                    }
                )
            })
            .next()
            .map(|s| format!("; {s} fits"))
            .unwrap_or_else(|| {
                "; no ZeRO stage fits this layout: raise --tp/--pp/--gpus or lower --micro-batch"
                    .into()
            });
        warnings.push(warn(
            "memory",
            format!(
                "does not fit: {} GiB per GPU > {} GiB on {}{suggestion}",
                gib(mem.chosen.total),
                gib(mem.device_memory_bytes),
                plan.device
            ),
        ));
    } else if mem.chosen.total > mem.device_memory_bytes * TIGHT_MEMORY_SHARE {
        warnings.push(warn(
            "memory-tight",
            format!(
                "tight: {} of {} GiB per GPU leaves under 10% for the CUDA context and fragmentation",
                gib(mem.chosen.total),
                gib(mem.device_memory_bytes)
            ),
        ));
    }

    // MFU assumed, and MFU a deadline needs.
    for s in &plan.scenarios {
        if s.mfu > MAX_CREDIBLE_MFU {
            warnings.push(warn(
                "mfu",
                format!(
                    "assumes MFU {:.2}: above {MAX_CREDIBLE_MFU} is rarely sustained in dense training",
                    s.mfu
                ),
            ));
        }
    }
    if let Some(d) = &plan.deadline {
        if d.required_mfu > MAX_CREDIBLE_MFU {
            warnings.push(warn(
                "mfu",
                format!(
                    "needs MFU {:.2} to train {} tokens in {} (above {MAX_CREDIBLE_MFU} is not credible){}",
                    d.required_mfu,
                    si(inputs.tokens),
                    hours(d.hours),
                    plan.proposal
                        .as_ref()
                        .map(|p| format!(
                            "; at MFU {:.2} the limits buy {} steps = {} tokens",
                            inputs.mfus[0],
                            group(p.steps),
                            si(p.tokens)
                        ))
                        .unwrap_or_default()
                ),
            ));
        }
        for (s, met) in plan.scenarios.iter().zip(&d.met) {
            if !met {
                warnings.push(warn(
                    "deadline",
                    format!(
                        "misses the deadline: {} at MFU {:.2} > {}",
                        hours(s.wall_clock_hours),
                        s.mfu,
                        hours(d.hours)
                    ),
                ));
            }
        }
    }

    // Budget.
    if let Some(b) = &plan.budget {
        for s in &plan.scenarios {
            for c in s.costs.iter().filter(|c| c.billed_usd > b.usd) {
                warnings.push(warn(
                    "budget",
                    format!(
                        "over budget: {} at {} ${:.2}/GPU-h and MFU {:.2} > {}",
                        usd(c.billed_usd),
                        c.price,
                        c.usd_per_gpu_hour,
                        s.mfu,
                        usd(b.usd)
                    ),
                ));
            }
        }
    }

    // Batch arithmetic.
    let l = &mem.layout;
    if plan.batch.grad_accum.fract().abs() > 1e-9 || plan.batch.grad_accum < 1.0 {
        let unit = l.dp * l.micro_batch * inputs.model.seq_len;
        warnings.push(warn(
            "batch",
            format!(
                "global batch {} tokens is not a whole number of micro-batches: DP {} × micro-batch {} × {} tokens = {} per micro-step ({:.2} per step); use a multiple of {}",
                group(plan.batch.global_batch_tokens.round() as u64),
                l.dp,
                l.micro_batch,
                inputs.model.seq_len,
                group(unit as u64),
                plan.batch.grad_accum,
                group(unit as u64)
            ),
        ));
    }

    // Checkpoints that stall training.
    if plan.checkpoint.share_of_interval > 0.05 {
        warnings.push(warn(
            "checkpoint",
            format!(
                "each checkpoint write ({:.0} s) is {:.0}% of the compute between checkpoints: write asynchronously, raise --storage-gbps or --ckpt-every",
                plan.checkpoint.write_seconds,
                plan.checkpoint.share_of_interval * 100.0
            ),
        ));
    }

    // A quote that matches no sensible unit.
    if let Some(q) = &plan.quote {
        let describe = |r: &crate::schedule::QuoteReading| {
            format!(
                "{}: ${:.2}/GPU-h, {}",
                r.reading,
                r.usd_per_gpu_hour,
                usd(r.total_usd)
            )
        };
        let all: Vec<String> = q.readings.iter().map(describe).collect();
        let literal = &q.readings[0];
        let literal_ok = literal.plausible != Some(false);
        if !literal_ok {
            let band = q
                .plausible_usd_per_gpu_hour
                .map(|(lo, hi)| format!("${lo:.2}–${hi:.2}/GPU-h"))
                .unwrap_or_default();
            warnings.push(warn(
                "quote",
                format!(
                    "inconsistent quote: ${}/h read literally ({}) is outside the plausible {band} for {}; {}",
                    q.usd_per_hour,
                    describe(literal),
                    plan.device,
                    if q.consistent.is_empty() {
                        "no reading is plausible".to_string()
                    } else {
                        format!("only '{}' is plausible", q.consistent.join("', '"))
                    }
                ),
            ));
        }
        notes.push(format!(
            "quote ${}/h over {}: {}",
            q.usd_per_hour,
            hours(q.hours),
            all.join("; ")
        ));
    }

    // Notes that explain the numbers.
    if let Some(r) = &plan.params.reference {
        let parts: Vec<String> = r
            .components
            .iter()
            .filter(|c| c.delta != 0)
            .map(|c| {
                format!(
                    "{} {} ({})",
                    c.component,
                    crate::report::signed_group(c.delta),
                    c.because
                )
            })
            .collect();
        notes.push(format!(
            "{} has {} parameters ({}; {}); this config has {} ({}): {}",
            r.name,
            group(r.params),
            si(r.params as f64),
            r.matched_by,
            group(plan.params.total),
            si(plan.params.total as f64),
            parts.join("; ")
        ));
        if let Some(rounding) = r.override_minus_reference {
            notes.push(format!(
                "--params {} is {}'s {} rounded ({:+.2}%): the case-study figure is the multi-head model, not this config",
                si(plan.params.used),
                r.name,
                group(r.params),
                rounding / r.params as f64 * 100.0
            ));
        }
    }
    if let Some(n) = plan.params.override_params {
        let exact = plan.params.total as f64;
        let full = plan
            .flops
            .iter()
            .find(|f| f.convention.key == "full")
            .map(|f| f.convention.flops_per_token)
            .unwrap_or_default();
        let m = &inputs.model;
        let attention_term = 12.0 * (m.n_layer * m.seq_len * m.d_attn()) as f64;
        // The input embedding is a lookup, not a matmul; norms are elementwise.
        let not_matmul = 6.0 * (plan.params.embedding + plan.params.norms) as f64;
        let tied_head = if m.tie_embeddings {
            6.0 * (m.vocab_size * m.d_model) as f64
        } else {
            0.0
        };
        notes.push(format!(
            "planning with --params {} ({:+.1}% vs the exact {}): 6N = {} FLOPs/token; the exact count gives {} ({:+.1}%) = 6 × {} ({}) − {} for the embedding lookup and norms{} + {} for attention scores (12·L·T·d_attn)",
            si(n),
            (n / exact - 1.0) * 100.0,
            si(exact),
            si(6.0 * n),
            si(full),
            (full / (6.0 * n) - 1.0) * 100.0,
            si(exact),
            si(6.0 * exact),
            si(not_matmul),
            if tied_head > 0.0 {
                format!(" + {} for the tied head's matmul", si(tied_head))
            } else {
                String::new()
            },
            si(attention_term)
        ));
    }
    let c = &plan.chinchilla;
    notes.push(format!(
        "Chinchilla: {:.1} tokens/parameter (optimal ≈ 20, i.e. {} tokens); the same {} FLOPs are compute-optimal at {} parameters on {} tokens",
        c.planned_tokens_per_param,
        si(c.optimal_tokens),
        crate::units::sci(c.flop_budget),
        si(c.compute_optimal_params),
        si(c.compute_optimal_tokens)
    ));
    let steps_exact = inputs.tokens / inputs.global_batch_tokens;
    if plan.batch.steps as usize != plan.batch.config_total_steps {
        notes.push(format!(
            "{} tokens / {} tokens per step = {} steps; the config's train.total_steps is {} ({} tokens)",
            si(inputs.tokens),
            group(inputs.global_batch_tokens.round() as u64),
            if steps_exact.fract() == 0.0 {
                group(steps_exact as u64)
            } else {
                format!("{steps_exact:.1} → {}", group(plan.batch.steps))
            },
            group(plan.batch.config_total_steps as u64),
            si(plan.batch.config_total_steps as f64 * inputs.global_batch_tokens)
        ));
    }
    (warnings, notes)
}
