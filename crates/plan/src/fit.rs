//! The micro-batch a run should use on the device it got: the largest that fits the device's
//! memory by the memory model, with gradient accumulation making up the rest of the step, so
//! the recipe's tokens per step (and the samples each step draws) stay the same.

use anyhow::{bail, Result};
use lab_config::{ActivationCheckpointing, LabConfig, LmHeadLoss};

use crate::checks::TIGHT_MEMORY_SHARE;
use crate::memory::{per_device, AttentionKind, Layout};
use crate::units::GIB;

/// What [`fit_micro_batch`] chose, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MicroBatchFit {
    pub micro_batch: usize,
    /// `train.grad_accum` for the chosen micro-batch (per `parallel.dp` replica, as the
    /// config counts it).
    pub grad_accum: usize,
    /// `train.eval_batches` that keeps the validation windows the config's split evaluates.
    pub eval_batches: usize,
    /// The memory model's bytes per GPU at the chosen micro-batch.
    pub planned_bytes: f64,
    /// The share of the device a plan may use (the rest: CUDA context, allocator slack).
    pub usable_bytes: f64,
}

/// The memory model's bytes per device when `world` ranks train `cfg` in micro-batches of
/// `micro_batch`, each rank accumulating `local_accum` of them, on a device running `attention`.
pub fn planned_bytes(
    cfg: &LabConfig,
    world: usize,
    micro_batch: usize,
    local_accum: usize,
    attention: AttentionKind,
) -> f64 {
    let layout = Layout {
        gpus: world,
        dp: world,
        tp: 1,
        pp: 1,
        zero_stage: cfg.parallel().zero,
        shard: world,
        micro_batch,
        grad_accum: local_accum,
        activation_checkpointing: cfg.train.activation_checkpointing
            == ActivationCheckpointing::Selective,
    };
    let params = cfg.model.param_count().total() as f64;
    per_device(&cfg.model, cfg.train.precision, params, &layout, attention).total
}

/// The largest micro-batch whose planned memory per device fits `device_bytes` when `world`
/// ranks train `cfg` with `attention`, among those that split the config's sequences per
/// replica step (`micro_batch × grad_accum`) into whole micro-batches shared evenly by the
/// ranks and that also split the validation windows (`eval_batches × micro_batch`) evenly,
/// so evaluation measures the same windows. The model counts what the forward keeps for
/// backward; the 10 % left over is for backward's temporaries, the CUDA context and the
/// allocator's slack.
pub fn fit_micro_batch(
    cfg: &LabConfig,
    world: usize,
    device_bytes: f64,
    attention: AttentionKind,
) -> Result<MicroBatchFit> {
    if cfg.train.lm_head_loss == LmHeadLoss::Unfused {
        bail!("--fit-micro-batch plans the fused LM-head loss, and train.lm_head_loss = \"unfused\" holds every logit: drop one of them");
    }
    let parallel = cfg.parallel();
    let dp = parallel.dp;
    let sequences = cfg.train.micro_batch * cfg.train.grad_accum;
    let eval_windows = cfg.train.eval_batches * cfg.train.micro_batch;
    let usable_bytes = device_bytes * TIGHT_MEMORY_SHARE;
    let splits = (1..=sequences).rev().filter_map(|micro_batch| {
        let grad_accum = sequences / micro_batch;
        let even = sequences.is_multiple_of(micro_batch)
            && eval_windows.is_multiple_of(micro_batch)
            && (grad_accum * dp).is_multiple_of(world);
        even.then_some((micro_batch, grad_accum, grad_accum * dp / world))
    });
    let mut smallest = None;
    for (micro_batch, grad_accum, local_accum) in splits {
        let planned_bytes = planned_bytes(cfg, world, micro_batch, local_accum, attention);
        if planned_bytes <= usable_bytes {
            return Ok(MicroBatchFit {
                micro_batch,
                grad_accum,
                eval_batches: eval_windows / micro_batch,
                planned_bytes,
                usable_bytes,
            });
        }
        smallest = Some((micro_batch, planned_bytes));
    }
    let Some((micro_batch, bytes)) = smallest else {
        bail!(
            "--fit-micro-batch: {world} ranks cannot share a step of {} sequences (train.micro_batch × train.grad_accum × parallel.dp) evenly; launch a number of ranks that divides it",
            sequences * dp
        );
    };
    let mut fixes = Vec::new();
    if cfg.train.activation_checkpointing == ActivationCheckpointing::None {
        fixes.push("set train.activation_checkpointing = \"selective\"");
    }
    if world > 1 && parallel.zero == 0 {
        fixes.push("shard the optimizer (parallel.zero = 1)");
    }
    fixes.push("shorten model.seq_len");
    bail!(
        "--fit-micro-batch: even a micro-batch of {micro_batch} needs {:.2} GiB per device by the memory model, over the {:.2} GiB usable of {:.2} GiB; {}",
        bytes / GIB,
        usable_bytes / GIB,
        device_bytes / GIB,
        fixes.join(", or ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLASH: AttentionKind = AttentionKind::Flash;

    fn x1() -> LabConfig {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../configs/x1-50m-a100.toml"
        );
        LabConfig::from_toml(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn the_largest_split_of_the_step_that_fits_is_chosen() {
        let cfg = x1();
        let fit = fit_micro_batch(&cfg, 1, 80.0 * GIB, FLASH).unwrap();
        // 512 sequences per step; 128 plan at 28.0 GiB. 256 would plan 53.2 GiB, within the 72
        // usable, but would not split the 20 × 32 validation windows evenly; they become 5
        // batches of 128.
        assert_eq!(
            (fit.micro_batch, fit.grad_accum, fit.eval_batches),
            (128, 4, 5)
        );
        assert!(fit.planned_bytes <= fit.usable_bytes);
        // Exactly enough memory, up to the rounding of dividing by the share and multiplying
        // back (one ulp either way).
        let exactly = fit.planned_bytes / TIGHT_MEMORY_SHARE * (1.0 + 2.0 * f64::EPSILON);
        let next = fit_micro_batch(&cfg, 1, exactly, FLASH).unwrap();
        assert_eq!(next.micro_batch, 128, "exactly enough memory still fits");
        let less = fit_micro_batch(
            &cfg,
            1,
            0.99 * fit.planned_bytes / TIGHT_MEMORY_SHARE,
            FLASH,
        );
        assert_eq!(less.unwrap().micro_batch, 64);
    }

    #[test]
    fn selective_checkpointing_fits_a_larger_micro_batch() {
        let mut cfg = x1();
        // 128 sequences plan 28.0 GiB keeping every activation, 23.0 with selective: a
        // 30 GiB GPU (27 usable) holds the second.
        let kept = fit_micro_batch(&cfg, 1, 30.0 * GIB, FLASH).unwrap();
        cfg.train.activation_checkpointing = ActivationCheckpointing::Selective;
        let selective = fit_micro_batch(&cfg, 1, 30.0 * GIB, FLASH).unwrap();
        assert!(
            selective.micro_batch > kept.micro_batch,
            "{selective:?} vs {kept:?}"
        );
    }

    #[test]
    fn ranks_share_the_step_and_the_validation_windows_evenly() {
        let split = |micro_batch, grad_accum, eval_batches, world| {
            let mut cfg = x1();
            (cfg.train.micro_batch, cfg.train.grad_accum) = (micro_batch, grad_accum);
            cfg.train.eval_batches = eval_batches;
            let fit = fit_micro_batch(&cfg, world, 80.0 * GIB, FLASH).unwrap();
            (fit.micro_batch, fit.grad_accum, fit.eval_batches)
        };
        // 12 sequences per step: 4 ranks take one micro-batch of 3 each (12, 6 or 4 per
        // micro-batch would leave a rank without one); 2 ranks one of 6 each.
        assert_eq!(split(3, 4, 4, 4), (3, 4, 4));
        assert_eq!(split(3, 4, 4, 2), (6, 2, 2));
        assert_eq!(split(3, 4, 4, 1), (12, 1, 1));
        // 16 sequences, but 4 validation windows: micro-batches of 16 or 8 would change them.
        assert_eq!(split(4, 4, 1, 1), (4, 4, 1));
    }

    #[test]
    fn what_cannot_fit_is_one_line_offering_the_fixes_not_yet_taken() {
        let mut cfg = x1();
        (cfg.train.micro_batch, cfg.train.grad_accum) = (3, 4);
        let err = |cfg: &LabConfig, world, gib| {
            fit_micro_batch(cfg, world, gib * GIB, FLASH)
                .unwrap_err()
                .to_string()
        };
        let e = err(&cfg, 4, 1.0);
        assert!(
            e.starts_with("--fit-micro-batch: even a micro-batch of 1 needs"),
            "{e}"
        );
        assert!(
            e.contains("activation_checkpointing") && e.contains("parallel.zero"),
            "{e}"
        );
        cfg.train.activation_checkpointing = ActivationCheckpointing::Selective;
        let e = err(&cfg, 1, 1.0);
        assert!(
            !e.contains("activation_checkpointing") && !e.contains("parallel.zero"),
            "{e}"
        );
        assert!(e.contains("shorten model.seq_len"), "{e}");
        let e = err(&cfg, 5, 80.0);
        assert!(
            e.contains("5 ranks cannot share a step of 12 sequences"),
            "{e}"
        );
        cfg.train.lm_head_loss = LmHeadLoss::Unfused;
        assert!(err(&cfg, 1, 80.0).contains("lm_head_loss"));
        assert!(!err(&cfg, 1, 80.0).contains('\n'));
    }
}
