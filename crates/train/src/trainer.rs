//! The training loop. It reads like nanoGPT's `train.py`; every concern it touches is a named
//! piece: the data stream (`stream`), the step (`step`), the optimizer (`optim`), the policies
//! that may stop, skip or rewind a step (`policy`, `stability`), and the run folder with its
//! logs, checkpoints, rollback and stop sequence (`run`).

use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::optim::GradientsParams;
use lab_config::LabConfig;
use serde_json::json;

use crate::backend::{OnBackend, TrainBackend};
use crate::freeze;
use crate::hf_init::{self, HfInit};
use crate::parallel::DataParallel;
use crate::policy::{Decision, Journal, Policies, StepPolicy, StepView, Stop};
use crate::run::Run;

use crate::signals::StopSignal;
use crate::stability::{NonFinite, Signals, SpikeResponse};
use crate::state::TrainingState;
use crate::step::forward_backward;
use crate::stop_rules::StopRules;
use crate::stream::{Check, StepData, TrainData};

/// Sends an alert (a Slack-compatible webhook, wired by the binary).
pub type AlertSink = Box<dyn Fn(&str) -> Result<()>>;

pub struct TrainOptions {
    /// The effective config (command-line overrides already applied and validated).
    pub config: LabConfig,
    pub data_dir: PathBuf,
    /// The run folder: checkpoints, `latest`, metrics.jsonl, events.jsonl, status.json.
    pub run_dir: PathBuf,
    pub resume: bool,
    /// The backend the run computes on (recorded in hardware.json).
    pub backend: crate::BackendKind,
    /// Draw a progress bar (off in tests and when stderr is not a terminal).
    pub progress: bool,
    /// Policies beyond the built-in ones (the binary plugs the budget guard in here).
    pub policies: Vec<Box<dyn StepPolicy>>,
    pub alert: Option<AlertSink>,
    /// Fire drill (`--inject-nan-grad-at-step`): the gradient of this step (counted from 1) is
    /// made non-finite while its loss stays finite, once, to show the policy never applies it.
    pub nan_grad_at_step: Option<u64>,
    /// Fire drill (`--inject-crash-in-rollback`): abort the process inside the first rollback,
    /// after the abandoned checkpoints are gone and before the restored state is saved.
    pub crash_in_rollback: bool,
    /// `--extend-to-steps`: a resumed run trains on to this step, its cosine tail recomputed
    /// from where it is (recorded in events.jsonl and state.json).
    pub extend_to_steps: Option<u64>,
    /// `--init-from-hf`: a fresh run starts from this Hugging Face folder's weights (see
    /// [`crate::hf_init`]).
    pub init_from_hf: Option<PathBuf>,
    /// This process's place in a data-parallel job (`Launch::alone()` outside one).
    pub launch: lab_dist::Launch,
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
    /// Stopped by the stability policy (exit 5); the last good weights are checkpointed.
    Unstable { step: u64, reason: String },
    /// Stopped by the budget guard: exit 3 after a checkpoint at `step`, or 4 with none.
    BudgetStopped {
        exit_code: u8,
        step: u64,
        reason: String,
    },
    /// Ended by a stop rule (exit 0) after a checkpoint at `step`.
    StoppedEarly {
        step: u64,
        reason: String,
        val_loss: Option<f64>,
    },
}

impl OnBackend for TrainOptions {
    type Output = Outcome;
    fn checkpointing(&self) -> lab_config::ActivationCheckpointing {
        self.config.train.activation_checkpointing
    }
    fn precision(&self) -> lab_config::Precision {
        self.config.train.precision
    }
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<Outcome> {
        train::<B>(self, device)
    }
}

/// Prints what the data mixture will draw, warns about sources repeated too often, and
/// records it once, at the start of a fresh run.
fn report_mixture(run: &mut Run, step: u64, mix: crate::stream::MixtureReport) {
    lab_fsio::console::line(mix.table.trim_end());
    for w in &mix.warnings {
        eprintln!("warning: {w}");
    }
    if step == 0 {
        let fields = json!({ "sources": mix.json, "warnings": mix.warnings });
        run.event(0, "data_mixture", fields);
    }
}

/// Trains on backend `B` until `total_steps`, or until a policy stops the run.
pub fn train<B: TrainBackend>(opts: TrainOptions, device: B::Device) -> Result<Outcome> {
    let cfg = opts.config.clone();
    // One process per node reads the files whole: a shared file system once per node, and a
    // copy local to each node checked where it lies.
    let check = match opts.launch.local_rank {
        0 => Check::Sha256,
        _ => Check::SizeOnly,
    };
    let data = TrainData::open(&opts.data_dir, &cfg, check)?;
    // Read and checked before the run folder is touched.
    let init = match &opts.init_from_hf {
        Some(dir) => Some(
            hf_init::load::<B>(dir, &cfg, &data, &device)
                .with_context(|| format!("--init-from-hf {}", dir.display()))?,
        ),
        None => None,
    };
    let dp = Rc::new(join_job::<B>(&cfg, &opts, &device)?);
    let outcome = train_in_job::<B>(opts, &data, init, dp.clone(), &device);
    if outcome.is_err() {
        // An error this rank may have met alone: leave without waiting for the others.
        dp.abandon();
    }
    outcome
}

/// This rank's part of the job `dp`: the run folder, the policies and the loop.
fn train_in_job<B: TrainBackend>(
    mut opts: TrainOptions,
    data: &TrainData,
    init: Option<HfInit<B>>,
    dp: Rc<DataParallel>,
    device: &B::Device,
) -> Result<Outcome> {
    let cfg = opts.config.clone();
    let mut run = Run::open(&mut opts, data, dp.clone())?;
    let mut policies = standard_policies(&cfg, std::mem::take(&mut opts.policies))?;
    let mut state = run.start::<B>(&mut policies, device, init)?;
    record_job(&mut run, &dp, &state)?;
    let total = state.schedule.total_steps();
    if let Some(mix) = data.mixture_report(&cfg, total) {
        report_mixture(&mut run, state.step, mix);
    }
    if opts.nan_grad_at_step.is_some() || opts.crash_in_rollback {
        let drill = json!({ "nan_grad_at_step": opts.nan_grad_at_step, "crash_in_rollback": opts.crash_in_rollback });
        run.event(state.step, "fire_drill", drill);
    }

    while state.step < total {
        if let Decision::Stop(stop) = dp.agree(policies.before_step(state.step, &mut run))? {
            return run.stop(stop, &state, &policies);
        }
        let started = Instant::now();
        let lr = state.schedule.lr(state.step);
        let mut cursor = state.cursor.clone();
        let batch = data.next_step(state.step, &mut cursor)?;
        let (grads, loss) = forward_backward(&state.model, dp.local(&batch.micro), device, None);
        let (grads, loss) = dp.reduce(&state.model, grads, loss)?;
        let grads = fire_drill(&opts, &state, grads);
        let grads = freeze::trainable_grads(&cfg, state.step, &state.model, grads);
        let grad_norm = dp.grad_norm(&state.model, &grads)?;
        let mut view = observe(&cfg, &state, &run, &batch, loss, grad_norm, lr);
        let update_skipped = match dp.agree(policies.after_backward(&view, &mut run))? {
            Decision::Continue => {
                state = state.apply(grads, lr, view.clip_scale);
                state.model = dp.gather_params(state.model)?;
                false
            }
            Decision::SkipUpdate { reason } => {
                run.event(
                    state.step + 1,
                    "update_skipped",
                    json!({ "reason": reason }),
                );
                true
            }
            Decision::Rollback(plan) => {
                let stop_after = plan.then_stop.then(|| plan.reason.clone());
                state = run.rollback(state, plan, &mut policies, device)?;
                let stop = stop_after.map(|reason| Stop::Unstable { reason });
                match stop.or_else(|| too_many_rollbacks(&cfg, &state)) {
                    Some(stop) => return run.stop(stop, &state, &policies),
                    None => continue,
                }
            }
            Decision::Stop(stop) => return run.stop(stop, &state, &policies),
        };
        state.step += 1;
        state.cursor = cursor;
        let secs = started.elapsed().as_secs_f64();
        view.val_loss = run.record_step(&state, &view, data, secs, update_skipped)?;
        if let Decision::Stop(stop) = dp.agree(policies.after_update(&view, &mut run))? {
            return run.stop(stop, &state, &policies);
        }
        if dp.agree_flag(view.at_checkpoint || run.new_best_pending())? {
            run.checkpoint(&state, &policies)?;
        }
    }
    run.finish(&state)
}

/// Joins the data-parallel job the launcher started (one process: a job of one). ZeRO-1
/// deals the parameters out from the model's shapes before any checkpoint is read.
fn join_job<B: TrainBackend>(
    cfg: &LabConfig,
    opts: &TrainOptions,
    device: &B::Device,
) -> Result<DataParallel> {
    let mut dp = DataParallel::connect(cfg, opts.launch.clone())?;
    if dp.zero1() {
        let model = lab_model::Llama::<B>::new(&cfg.model, cfg.train.seed, device);
        dp.learn_layout(&model, cfg.train.precision);
    }
    Ok(dp)
}

/// Events of a data-parallel job's start: its layout and, after a relaunch, the restart.
/// Every rank calls it (the ranks' weight bytes are gathered).
fn record_job<B: TrainBackend>(
    run: &mut Run,
    dp: &DataParallel,
    state: &TrainingState<B>,
) -> Result<()> {
    let (launch, step) = (dp.launch(), state.step);
    if dp.world() > 1 {
        let weight_bytes = dp.weight_bytes(&state.model)?;
        let fields = json!({ "world_size": dp.world(), "engine": dp.engine(), "launcher": launch.launcher.name(), "zero": if dp.zero1() { 1 } else { 0 }, "weight_bytes_per_rank": weight_bytes, "all_gather_bytes": dp.gathered_bytes() });
        run.event(step, "data_parallel", fields);
    }
    if launch.restarts > 0 {
        let fields = json!({ "restarts": launch.restarts, "resumed_at_step": step, "world_size": dp.world() });
        run.event(step, "restarted", fields);
    }
    Ok(())
}

/// What the policies see of the step being taken.
fn observe<'a, B: TrainBackend>(
    cfg: &LabConfig,
    state: &TrainingState<B>,
    run: &Run,
    batch: &'a StepData,
    loss: f64,
    grad_norm: f64,
    lr: f64,
) -> StepView<'a> {
    let total = state.schedule.total_steps();
    let next = state.step + 1;
    StepView {
        step: state.step,
        total_steps: total,
        loss,
        grad_norm,
        clip_scale: state.optim.clip_scale(grad_norm),
        lr,
        data: batch,
        steps_this_session: run.steps_taken + 1,
        elapsed_s: run.elapsed_s(),
        at_checkpoint: next.is_multiple_of(cfg.train.ckpt_every as u64) || next == total,
        at_log: next.is_multiple_of(cfg.train.log_every as u64) || next == total,
        val_loss: None,
    }
}

/// The rollback bound: one more than `stability.max_rollbacks` stops the run.
fn too_many_rollbacks<B: TrainBackend>(cfg: &LabConfig, state: &TrainingState<B>) -> Option<Stop> {
    let max = cfg.stability().max_rollbacks;
    (state.rollbacks as usize > max).then(|| Stop::Unstable {
        reason: format!(
            "{} rollbacks (stability.max_rollbacks = {max}): the run keeps diverging; lower train.peak_lr or inspect the data",
            state.rollbacks
        ),
    })
}

/// `--inject-nan-grad-at-step`: the embedding's gradient of that step turns NaN (once: not
/// again after the rollback it causes).
fn fire_drill<B: TrainBackend>(
    opts: &TrainOptions,
    state: &TrainingState<B>,
    mut grads: GradientsParams,
) -> GradientsParams {
    if opts.nan_grad_at_step == Some(state.step + 1) && state.rollbacks == 0 {
        let id = state.model.embed.id;
        if let Some(g) = grads.remove::<B::InnerBackend, 2>(id) {
            grads.register(id, g * f64::NAN);
        }
    }
    grads
}

/// The built-in policies (non-finite steps, spikes, stop rules), then `extra`, then signals:
/// asked last, so a stop another policy decides in the same step (the budget guard's exit 4
/// without a checkpoint) wins the tie with a signal.
fn standard_policies(cfg: &LabConfig, extra: Vec<Box<dyn StepPolicy>>) -> Result<Policies> {
    let mut all: Vec<Box<dyn StepPolicy>> = vec![
        Box::new(NonFinite),
        Box::new(SpikeResponse::new(
            cfg.stability(),
            cfg.spike.as_ref().map(|s| s.kind),
        )),
    ];
    if let Some(eval) = &cfg.eval {
        all.push(Box::new(StopRules::new(
            eval.clone(),
            cfg.tokens_per_step(),
        )));
    }
    all.extend(extra);
    all.push(Box::new(Signals(StopSignal::install()?)));
    Ok(Policies(all))
}
