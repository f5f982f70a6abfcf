//! The micro-batch a run should use on the device it got: the largest that fits the device's
//! memory by the memory model, with gradient accumulation making up the rest of the step, so
//! the recipe's tokens per step (and the samples each step draws) stay the same.

use anyhow::{bail, Result};
use lab_config::{ActivationCheckpointing, LabConfig};

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
    /// The memory model's bytes per GPU at the chosen micro-batch.
    pub planned_bytes: f64,
    /// The share of the device a plan may use (the rest: CUDA context, allocator slack).
    pub usable_bytes: f64,
}

/// The largest micro-batch whose planned memory per device fits `device_bytes` when `world`
/// ranks train `cfg` with `attention`, among those that split the config's sequences per step
/// (`micro_batch × grad_accum` per replica) into whole micro-batches shared evenly by the ranks.
pub fn fit_micro_batch(
    cfg: &LabConfig,
    world: usize,
    device_bytes: f64,
    attention: AttentionKind,
) -> Result<MicroBatchFit> {
    let parallel = cfg.parallel();
    let sequences = cfg.train.micro_batch * cfg.train.grad_accum;
    let usable_bytes = device_bytes * TIGHT_MEMORY_SHARE;
    let params = cfg.model.param_count().total() as f64;
    let planned = |micro_batch: usize, local_accum: usize| {
        let layout = Layout {
            gpus: world,
            dp: world,
            tp: 1,
            pp: 1,
            zero_stage: parallel.zero,
            shard: world,
            micro_batch,
            grad_accum: local_accum,
            activation_checkpointing: cfg.train.activation_checkpointing
                == ActivationCheckpointing::Selective,
        };
        per_device(&cfg.model, cfg.train.precision, params, &layout, attention).total
    };
    let splits = (1..=sequences).rev().filter_map(|micro_batch| {
        let grad_accum = sequences.checked_div(micro_batch)?;
        let global = grad_accum * parallel.dp;
        let even = sequences.is_multiple_of(micro_batch) && global.is_multiple_of(world);
        even.then_some((micro_batch, grad_accum, global / world))
    });
    let mut smallest = None;
    for (micro_batch, grad_accum, local_accum) in splits {
        let planned_bytes = planned(micro_batch, local_accum);
        if planned_bytes <= usable_bytes {
            return Ok(MicroBatchFit {
                micro_batch,
                grad_accum,
                planned_bytes,
                usable_bytes,
            });
        }
        smallest = Some((micro_batch, planned_bytes));
    }
    let Some((micro_batch, bytes)) = smallest else {
        bail!("--fit-micro-batch: {world} ranks cannot share the config's {sequences} sequences per step evenly; launch a number of ranks that divides train.grad_accum × parallel.dp");
    };
    bail!(
        "--fit-micro-batch: even a micro-batch of {micro_batch} needs {:.2} GiB per device by the memory model, over the {:.2} GiB usable of {:.2} GiB; set train.activation_checkpointing = \"selective\", shard the optimizer (parallel.zero = 1) or shorten model.seq_len",
        bytes / GIB,
        usable_bytes / GIB,
        device_bytes / GIB
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
        // 512 sequences per step; 128 plan at 43.4 GiB, 256 at ~86 GiB (over the 72 usable).
        assert_eq!((fit.micro_batch, fit.grad_accum), (128, 4));
        assert!(fit.planned_bytes <= fit.usable_bytes);
        let next = fit_micro_batch(&cfg, 1, fit.planned_bytes / TIGHT_MEMORY_SHARE, FLASH).unwrap();
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
        let kept = fit_micro_batch(&cfg, 1, 24.0 * GIB, FLASH).unwrap();
        cfg.train.activation_checkpointing = ActivationCheckpointing::Selective;
        let selective = fit_micro_batch(&cfg, 1, 24.0 * GIB, FLASH).unwrap();
        assert!(
            selective.micro_batch > kept.micro_batch,
            "{selective:?} vs {kept:?}"
        );
    }

    #[test]
    fn ranks_share_the_step_evenly_and_too_little_memory_is_one_clear_error() {
        let mut cfg = x1();
        cfg.train.micro_batch = 3;
        cfg.train.grad_accum = 4;
        // 12 sequences per step: 4 ranks take one micro-batch of 3 each (12, 6 or 4 per
        // micro-batch would leave a rank without one); 2 ranks one of 6 each.
        let on = |world| {
            let fit = fit_micro_batch(&cfg, world, 80.0 * GIB, FLASH).unwrap();
            (fit.micro_batch, fit.grad_accum)
        };
        assert_eq!(on(4), (3, 4));
        assert_eq!(on(2), (6, 2));
        assert_eq!(on(1), (12, 1));
        let err = fit_micro_batch(&cfg, 4, GIB, FLASH)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--fit-micro-batch: even a micro-batch of 1 needs"),
            "{err}"
        );
        assert!(err.contains("activation_checkpointing"), "{err}");
        let err = fit_micro_batch(&cfg, 5, 80.0 * GIB, FLASH)
            .unwrap_err()
            .to_string();
        assert!(err.contains("5 ranks cannot share"), "{err}");
    }
}
