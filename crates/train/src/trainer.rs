//! The training loop, in the order a step happens:
//!
//! ```text
//! for step in start..total_steps:
//!     stop requested (SIGINT/SIGTERM)?     → emergency checkpoint, exit 130/143
//!     lr = warmup-cosine(step)
//!     for each micro-batch:                 windows (seed, step, micro) from train.bin
//!         loss = model(x, y) / grad_accum;  grads += ∂loss
//!     loss not finite?                      → checkpoint of the last good weights, exit 5
//!     model = AdamW(model, clip_global(grads), lr)
//!     log / eval / checkpoint at their cadence
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{backend::Backend, ElementConversion, Int, Tensor, TensorData};
use indicatif::{ProgressBar, ProgressStyle};
use lab_config::{LabConfig, Precision};
use lab_data::{sampler, Batch, Meta, Sampler, TokenFile};
use lab_model::{weights, FusedLoss, Llama};
use serde_json::json;

use crate::backend::{OnBackend, TrainBackend};
use crate::checkpoint::{self, TrainState};
use crate::optim::{param_norm, AdamW};
use crate::run_log::{self, JsonLines, Status};
use crate::schedule::learning_rate;
use crate::signals::StopSignal;

pub struct TrainOptions {
    /// The effective config (command-line overrides already applied and validated).
    pub config: LabConfig,
    pub data_dir: PathBuf,
    /// The run folder: checkpoints, `latest`, metrics.jsonl, events.jsonl, status.json.
    pub run_dir: PathBuf,
    pub resume: bool,
    /// Draw a progress bar (off in tests and when stderr is not a terminal).
    pub progress: bool,
    /// The budget guard (lab-budget), consulted at its interval and at every checkpoint.
    pub budget: Option<lab_budget::RunGuard>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Completed {
        step: u64,
        train_loss: f64,
        val_loss: Option<f64>,
    },
    /// Stopped by a signal after an emergency checkpoint at `step`.
    Interrupted { signal: i32, step: u64 },
    /// Stopped by the stability policy (exit 5): the loss of step `step + 1` was not finite;
    /// the weights after `step` (the last good ones) are checkpointed.
    Unstable { step: u64, loss: f64 },
    /// Stopped by the budget guard: exit 3 after a checkpoint at `step`, or 4 with none.
    BudgetStopped {
        exit_code: u8,
        step: u64,
        reason: String,
    },
}

impl OnBackend for TrainOptions {
    type Output = Outcome;
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<Outcome> {
        train::<B>(self, device)
    }
}

/// Trains on backend `B` until `total_steps`, or until stopped.
pub fn train<B: TrainBackend>(mut opts: TrainOptions, device: B::Device) -> Result<Outcome> {
    let mut budget = opts.budget.take();
    let cfg = &opts.config;
    let tc = &cfg.train;
    let run_dir = &opts.run_dir;
    let config_sha = cfg.sha256();
    let training_sha = cfg.training_sha256();

    // Fail early, before any compute: data readable, run folder writable, no silent overwrite.
    let meta = Meta::load(&opts.data_dir)?;
    if meta.vocab_size > cfg.model.vocab_size {
        bail!(
            "{}: data vocab_size {} exceeds model.vocab_size {}; use a config for this tokenizer",
            opts.data_dir.join("meta.json").display(),
            meta.vocab_size,
            cfg.model.vocab_size
        );
    }
    let train_file = TokenFile::open(&opts.data_dir, "train.bin", &meta)?;
    let val_file = TokenFile::open(&opts.data_dir, "val.bin", &meta)?;
    let sampler = Sampler::new(train_file.len(), cfg.model.seq_len, tc.seed)
        .with_context(|| train_file.path().display().to_string())?;
    if val_file.len() < cfg.model.seq_len + 1 {
        bail!(
            "{} has {} tokens, fewer than model.seq_len + 1 = {}: prepare a larger validation split",
            val_file.path().display(),
            val_file.len(),
            cfg.model.seq_len + 1
        );
    }
    // Held until the run ends: a second `lab train` on the same folder is refused.
    let _lock = prepare_run_dir(&opts)?;
    let stop = StopSignal::install()?;

    let mut metrics = JsonLines::open(&run_dir.join(run_log::METRICS))?;
    let mut events = JsonLines::open(&run_dir.join(run_log::EVENTS))?;

    // Fresh start or resume.
    let mut model = Llama::<B>::new(&cfg.model, tc.seed, &device);
    let mut optim = AdamW::<B::InnerBackend>::new(tc);
    let mut step: u64 = 0;
    if opts.resume {
        let mut warn = |w: String| {
            eprintln!("warning: {w}");
            let _ = run_log::event(&mut events, 0, "checkpoint_skipped", json!({ "reason": w }));
        };
        if let Some(ck) = checkpoint::load_latest_good(run_dir, &mut warn)? {
            if ck.state.training_sha256 != training_sha {
                let short = |s: &str| s.get(..12).unwrap_or(s).to_string();
                bail!(
                    "{} was written by a different model or optimization recipe (training sha256 {} vs {}); resume with the same config and flags, or use a new --ckpt-dir",
                    ck.dir.display(),
                    short(&ck.state.training_sha256),
                    short(&training_sha)
                );
            }
            model = weights::load_tensor_map(model, &ck.model)
                .with_context(|| format!("{}", ck.dir.display()))?;
            optim.load_state(&ck.optimizer, ck.state.optimizer_updates, &device)?;
            step = ck.state.step;
            run_log::truncate_after_step(&run_dir.join(run_log::METRICS), step)?;
            metrics = JsonLines::open(&run_dir.join(run_log::METRICS))?;
            run_log::event(
                &mut events,
                step,
                "resume",
                json!({ "from": ck.dir.file_name().map(|n| n.to_string_lossy().into_owned()) }),
            )?;
            println!("resumed from {} (step {step})", ck.dir.display());
        } else {
            println!("no checkpoint in {}: starting fresh", run_dir.display());
            // Lines of an attempt that never checkpointed are not part of this run.
            run_log::truncate_after_step(&run_dir.join(run_log::METRICS), 0)?;
            metrics = JsonLines::open(&run_dir.join(run_log::METRICS))?;
        }
    }

    let total = tc.total_steps as u64;
    let tokens_per_step = cfg.tokens_per_step() as f64;
    let flops_per_token = cfg.model.train_flops_per_token();
    // burn 0.21 has no autocast: every backend computes in fp32 here. Say so rather than
    // report MFU against a bf16 peak the run never uses.
    if tc.precision == Precision::Bf16 {
        let msg = "train.precision = \"bf16\" requested, but this build computes in fp32 (burn 0.21 has no autocast); MFU is reported against the fp32 peak";
        eprintln!("warning: {msg}");
        run_log::event(
            &mut events,
            step,
            "precision",
            json!({ "requested": "bf16", "effective": "fp32", "note": msg }),
        )?;
    }
    let peak_flops = cfg.hardware.peak_flops(Precision::Fp32);
    let started = Instant::now();
    let start_step = step;
    let mut status = Status {
        state: "running",
        step,
        total_steps: total,
        loss: None,
        val_loss: None,
        tokens_per_s: None,
        secs_per_step: None,
        mfu: None,
        elapsed_s: 0.0,
        eta_s: None,
        config_sha256: config_sha.clone(),
        started_utc: run_log::now_utc(),
        updated_utc: run_log::now_utc(),
    };
    let bar = progress_bar(opts.progress, step, total);
    let say = |line: String| {
        if bar.is_hidden() {
            println!("{line}");
        } else {
            bar.println(line);
        }
    };
    // Seconds spent in training steps (evals and checkpoints excluded) since the last log.
    let (mut step_secs, mut steps_timed) = (0.0, 0u64);
    let mut last_loss = f64::NAN;
    let mut last_val: Option<f64> = None;

    while step < total {
        if let Some(signal) = stop.received() {
            save_checkpoint(&opts, &model, &optim, step, &config_sha, &training_sha)?;
            run_log::event(
                &mut events,
                step,
                "interrupted",
                json!({ "signal": signal, "emergency_checkpoint": checkpoint::step_dir_name(step) }),
            )?;
            say(format!(
                "signal {signal}: emergency checkpoint at step {step}"
            ));
            bar.abandon();
            status.finish("interrupted", step, started, run_dir)?;
            return Ok(Outcome::Interrupted { signal, step });
        }

        // One optimizer step over grad_accum micro-batches.
        let step_started = Instant::now();
        let lr = learning_rate(tc, step as usize);
        let mut accum = GradientsAccumulator::<Llama<B>>::new();
        // Micro-batch losses are summed on the device: one host sync per step, not per micro.
        let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
        for micro in 0..tc.grad_accum {
            let first = (step * tc.grad_accum as u64 + micro as u64) * tc.micro_batch as u64;
            let batch = sampler.batch(&train_file, first, tc.micro_batch)?;
            let (x, y) = to_tensors::<B>(&batch, &device);
            let loss = model.loss(x, y);
            let value = loss.clone().inner();
            loss_sum = Some(match loss_sum {
                Some(sum) => sum + value,
                None => value,
            });
            let grads = (loss / tc.grad_accum as f64).backward();
            accum.accumulate(&model, GradientsParams::from_grads(grads, &model));
        }
        let loss_sum: f64 = loss_sum.expect("grad_accum >= 1").into_scalar().elem();
        let loss = loss_sum / tc.grad_accum as f64;
        if !loss.is_finite() {
            // Stability policy: never apply a non-finite update. The weights are still those
            // after `step`, the last good ones; keep them and stop.
            save_checkpoint(&opts, &model, &optim, step, &config_sha, &training_sha)?;
            run_log::event(
                &mut events,
                step,
                "nonfinite_loss",
                json!({ "loss": loss.to_string(), "lr": lr }),
            )?;
            say(format!("loss of step {} is {loss}: checkpoint of step {step} kept, stopping (lower train.peak_lr?)", step + 1));
            bar.abandon();
            status.finish("unstable", step, started, run_dir)?;
            return Ok(Outcome::Unstable { step, loss });
        }
        let (next, stats) = optim.step(model, accum.grads(), lr);
        model = next;
        step += 1;
        step_secs += step_started.elapsed().as_secs_f64();
        steps_timed += 1;
        last_loss = loss;
        bar.set_position(step);

        let eval_now = step.is_multiple_of(tc.eval_every as u64) || step == total;
        let val_loss = if eval_now {
            Some(evaluate(&model.valid(), &val_file, cfg)?)
        } else {
            None
        };
        if val_loss.is_some() {
            last_val = val_loss;
        }

        if step.is_multiple_of(tc.log_every as u64) || step == total || val_loss.is_some() {
            let secs_per_step = step_secs / steps_timed.max(1) as f64;
            (step_secs, steps_timed) = (0.0, 0);
            let tokens_per_s = tokens_per_step / secs_per_step;
            let mfu = tokens_per_s * flops_per_token / peak_flops;
            let mut line = json!({
                "step": step,
                "loss": last_loss,
                "lr": lr,
                "grad_norm": stats.grad_norm,
                "clip_scale": stats.clip_scale,
                "param_norm": param_norm::<B, _>(&model),
                "tokens": step as f64 * tokens_per_step,
                "tokens_per_s": tokens_per_s,
                "mfu": mfu,
                "elapsed_s": started.elapsed().as_secs_f64(),
            });
            if let Some(v) = val_loss {
                line["val_loss"] = json!(v);
            }
            metrics.append(&line)?;
            say(format!(
                "step {step:>6}/{total} | loss {last_loss:.4}{} | lr {lr:.2e} | grad norm {:.3} | {tokens_per_s:.0} tok/s | MFU {:.1}%",
                val_loss.map(|v| format!(" | val {v:.4}")).unwrap_or_default(),
                stats.grad_norm,
                mfu * 100.0
            ));
            bar.set_message(format!("loss {last_loss:.3}"));
            status.step = step;
            status.loss = Some(last_loss);
            status.val_loss = last_val;
            status.tokens_per_s = Some(tokens_per_s);
            status.secs_per_step = Some(secs_per_step);
            status.mfu = Some(mfu);
            status.eta_s = Some(secs_per_step * (total - step) as f64);
            status.finish("running", step, started, run_dir)?;
        }

        let at_ckpt = step.is_multiple_of(tc.ckpt_every as u64) || step == total;
        // BUDGET-GUARD-HOOK: the budget guard is consulted at its interval and at every
        // checkpoint step, before the checkpoint: spent > cap stops with none (exit 4),
        // projected > cap checkpoints and stops (exit 3).
        if let Some(guard) = budget.as_mut() {
            if step < total && (at_ckpt || guard.due()) {
                let secs = started.elapsed().as_secs_f64() / (step - start_step).max(1) as f64;
                let progress = lab_budget::Progress {
                    step,
                    total_steps: total,
                    sec_per_step: Some(secs),
                };
                let d = guard.check(&progress);
                if let Some(exit_code) = d.verdict.exit_code() {
                    if d.verdict == lab_budget::Verdict::StopGraceful {
                        let dir = save_checkpoint(
                            &opts,
                            &model,
                            &optim,
                            step,
                            &config_sha,
                            &training_sha,
                        )?;
                        run_log::event(&mut events, step, "checkpoint", json!({ "dir": dir }))?;
                    }
                    bar.abandon();
                    status.finish("budget_stopped", step, started, run_dir)?;
                    return Ok(Outcome::BudgetStopped {
                        exit_code,
                        step,
                        reason: d.reason,
                    });
                }
            }
        }
        if at_ckpt {
            let dir = save_checkpoint(&opts, &model, &optim, step, &config_sha, &training_sha)?;
            run_log::event(&mut events, step, "checkpoint", json!({ "dir": dir }))?;
        }
    }

    bar.finish_and_clear();
    status.loss = Some(last_loss);
    status.val_loss = last_val;
    status.eta_s = Some(0.0);
    status.finish("done", step, started, run_dir)?;
    run_log::event(&mut events, step, "done", json!({}))?;
    Ok(Outcome::Completed {
        step,
        train_loss: last_loss,
        val_loss: last_val,
    })
}

/// Creates the run folder, proves it writable and takes its lock; refuses to silently restart
/// over an existing run.
fn prepare_run_dir(opts: &TrainOptions) -> Result<std::fs::File> {
    let dir = &opts.run_dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create --ckpt-dir {}", dir.display()))?;
    let lock = lab_fsio::lock_exclusive(&dir.join(".lock")).with_context(|| {
        format!(
            "--ckpt-dir {} is in use by another lab train",
            dir.display()
        )
    })?;
    let probe = dir.join(".write-test");
    std::fs::write(&probe, b"ok")
        .with_context(|| format!("--ckpt-dir {} is not writable", dir.display()))?;
    std::fs::remove_file(&probe)?;
    if !opts.resume && !checkpoint::list(dir)?.is_empty() {
        bail!(
            "--ckpt-dir {} already holds checkpoints; pass --resume-from-latest to continue that run, or choose a new --ckpt-dir",
            dir.display()
        );
    }
    if !opts.resume {
        // A fresh run starts fresh logs.
        for f in [run_log::METRICS, run_log::EVENTS, run_log::STATUS] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
    Ok(lock)
}

fn save_checkpoint<B: TrainBackend>(
    opts: &TrainOptions,
    model: &Llama<B>,
    optim: &AdamW<B::InnerBackend>,
    step: u64,
    config_sha: &str,
    training_sha: &str,
) -> Result<PathBuf> {
    let tc = &opts.config.train;
    let (opt_state, updates) = optim.state();
    let state = TrainState {
        step,
        optimizer_updates: updates,
        samples_consumed: step * (tc.grad_accum * tc.micro_batch) as u64,
        seed: tc.seed,
        rng: "stateless: init = f(seed, parameter path), data order = f(seed, window index)".into(),
        next_lr: learning_rate(tc, step as usize),
        config_sha256: config_sha.to_string(),
        training_sha256: training_sha.to_string(),
        created_utc: run_log::now_utc(),
        lab_version: env!("CARGO_PKG_VERSION").into(),
        files: Default::default(),
    };
    let dir = checkpoint::save(
        &opts.run_dir,
        state,
        &weights::tensor_map(model),
        &opt_state,
    )?;
    checkpoint::prune(
        &opts.run_dir,
        step,
        tc.keep_last,
        tc.ckpt_every,
        tc.keep_every,
    )?;
    Ok(dir)
}

/// Mean loss over the fixed validation batches.
pub fn evaluate<B: FusedLoss>(model: &Llama<B>, val: &TokenFile, cfg: &LabConfig) -> Result<f64> {
    let (rows, n) = (cfg.train.micro_batch, cfg.train.eval_batches);
    let mut total = 0.0;
    for b in 0..n {
        let batch = sampler::eval_batch(val, cfg.model.seq_len, b, rows, n)?;
        let (x, y) = to_tensors::<B>(&batch, &model.devices()[0]);
        total += model.loss(x, y).into_scalar().elem::<f64>();
    }
    Ok(total / n as f64)
}

/// Token ids as `[rows, seq_len]` int tensors.
pub fn to_tensors<B: Backend>(
    batch: &Batch,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let shape = [batch.rows, batch.seq_len];
    let ids = |v: &[u32]| {
        let data: Vec<i32> = v.iter().map(|&t| t as i32).collect();
        Tensor::from_data(TensorData::new(data, shape), device)
    };
    (ids(&batch.inputs), ids(&batch.targets))
}

fn progress_bar(enabled: bool, step: u64, total: u64) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total).with_position(step);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} train [{elapsed_precise}] {bar:30} {pos}/{len} steps, ETA {eta} {msg}",
        )
        .expect("valid template"),
    );
    bar
}
