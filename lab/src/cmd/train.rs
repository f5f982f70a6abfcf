//! `lab train`: flags as in lab 00, mapped onto a validated config and the trainer. The budget
//! guard plugs into the trainer here, as one more step policy.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lab_budget::{Progress, RunGuard};
use lab_config::{LabConfig, Precision, SpikeConfig, SpikeKind, SpikePolicy};
use lab_train::health::GpuHealth;
use lab_train::{signals, BackendKind, Decision, Journal, Outcome, StepPolicy, StepView, Stop};
use lab_train::{AlertSink, TrainOptions};

/// The embedded default config, so `lab train` works from any folder.
pub const TINY_CPU: &str = include_str!("../../../configs/tiny-cpu.toml");

#[derive(clap::Args)]
pub struct Args {
    /// Model/run preset (TOML). Default: the embedded configs/tiny-cpu.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Folder with train.bin, val.bin and meta.json. Default: the bundled tinyshakespeare
    /// corpus, prepared into runs/data/tinyshakespeare-gpt2 on first use.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The run folder (checkpoints, metrics.jsonl, events.jsonl). Default: runs/<config name>.
    #[arg(long)]
    pub ckpt_dir: Option<PathBuf>,
    #[arg(long)]
    pub total_steps: Option<usize>,
    #[arg(long)]
    pub ckpt_every: Option<usize>,
    #[arg(long)]
    pub eval_every: Option<usize>,
    #[arg(long)]
    pub log_every: Option<usize>,
    /// Continue from the newest checkpoint that verifies (skipping corrupt ones).
    #[arg(long)]
    pub resume_from_latest: bool,
    /// Train a resumed run on to this step (its planned `total_steps` is part of a bit-exact
    /// resume): the cosine tail is recomputed from the current step and learning rate down to
    /// min_lr at N; the decision goes to events.jsonl and state.json.
    #[arg(long, value_name = "N", requires = "resume_from_latest")]
    pub extend_to_steps: Option<u64>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// cpu (default), cuda or wgpu (the last two need a build with that feature).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Overrides train.precision: `fp32`, or `bf16` (mixed precision: bf16 matmuls and
    /// activations over fp32 master weights, optimizer state and checkpoints).
    #[arg(long)]
    pub precision: Option<Precision>,
    /// Overrides train.activation_checkpointing: `none`, or `selective` (elementwise results
    /// recomputed in backward: less activation memory, same results).
    #[arg(long)]
    pub activation_checkpointing: Option<lab_config::ActivationCheckpointing>,
    /// Replace train.micro_batch by the largest that fits this GPU's memory by `lab plan`'s
    /// memory model, and train.grad_accum so the step keeps its sequences. GIB gives the
    /// device's memory (any backend); without it the CUDA GPU is asked (NVML).
    #[arg(long, value_name = "GIB", num_args = 0..=1, allow_negative_numbers = true)]
    pub fit_micro_batch: Option<Option<f64>>,
    /// Fire drill: read the GPU's health from FILE (one JSON reading per line: t_s, util_pct,
    /// mem_used_bytes, mem_total_bytes, temp_c, ecc_corrected, ecc_uncorrected) instead of
    /// NVML, one per logged step, to see the metrics columns and alerts without a failing GPU.
    #[arg(long, value_name = "FILE")]
    pub inject_gpu_telemetry: Option<PathBuf>,
    /// Also log the run to an MLflow file store (`file:///…/mlruns`) when it ends.
    #[arg(long, value_name = "URI")]
    pub mlflow_uri: Option<String>,
    #[command(flatten)]
    pub spike: SpikeFlags,
    #[command(flatten)]
    pub init: InitFlags,
    #[command(flatten)]
    pub budget: lab_budget::BudgetFlags,
}

/// Continued pretraining from a Hugging Face model.
#[derive(clap::Args, Clone, Default)]
pub struct InitFlags {
    /// Start from a Hugging Face LlamaForCausalLM folder (config.json + model.safetensors or
    /// sharded model-*.safetensors with model.safetensors.index.json), e.g. one `lab export
    /// --hf` wrote: its architecture must match the config; step 0, fresh optimizer moments.
    /// When its tokenizer differs from the data's, the embedding and LM-head rows are
    /// re-indexed (same token: copied; new token: mean of its old sub-tokens).
    #[arg(long, value_name = "DIR")]
    pub init_from_hf: Option<PathBuf>,
    /// Train only the embedding and the LM head for the first K steps (the other parameters
    /// and their AdamW moments stay as they are); sets train.freeze_non_embedding_steps.
    #[arg(long, value_name = "K")]
    pub freeze_non_embedding_steps: Option<usize>,
}

/// Loss-spike drill and response (`[spike]` and `[stability]` in the config).
#[derive(clap::Args, Clone, Default)]
pub struct SpikeFlags {
    /// Inject a seeded loss spike: this step (counted from 1, as the logs count) and the next
    /// `--spike-batches - 1` train on spike batches (the data cursor does not move).
    #[arg(long, value_name = "STEP")]
    pub inject_spike_at_step: Option<u64>,
    /// Spike batches injected (default 5).
    #[arg(long, value_name = "N")]
    pub spike_batches: Option<u64>,
    /// rare-token (default), long-doc or repeated.
    #[arg(long, value_enum)]
    pub spike_kind: Option<SpikeKindArg>,
    /// Response to a detected spike: wait (default), rollback, skip or kill.
    #[arg(long, value_enum)]
    pub spike_policy: Option<SpikePolicyArg>,
    /// Fire drill: make the gradient of this step (counted from 1) non-finite (its loss stays
    /// finite); the stability policy must never apply it and rolls back instead.
    #[arg(long, value_name = "STEP")]
    pub inject_nan_grad_at_step: Option<u64>,
    /// Fire drill: abort the process in the middle of the first rollback (after the abandoned
    /// checkpoints are removed, before the restored state is saved); resume must recover.
    #[arg(long)]
    pub inject_crash_in_rollback: bool,
}

#[derive(clap::ValueEnum, Clone, Copy)]
pub enum SpikeKindArg {
    RareToken,
    LongDoc,
    Repeated,
}

#[derive(clap::ValueEnum, Clone, Copy)]
pub enum SpikePolicyArg {
    Wait,
    Rollback,
    Skip,
    Kill,
}

impl SpikePolicyArg {
    /// From a lab page's `spike_policy`.
    pub fn parse(s: &str) -> Result<SpikePolicyArg> {
        <Self as clap::ValueEnum>::from_str(s, false).map_err(|_| {
            anyhow::anyhow!("[run] spike_policy = {s:?}: use wait, rollback, skip or kill")
        })
    }
}

impl SpikeFlags {
    /// Applies the flags to `config` (validated by the caller).
    fn apply(&self, config: &mut LabConfig) -> Result<()> {
        if let Some(at) = self.inject_spike_at_step {
            config.spike = Some(SpikeConfig {
                at_step: at,
                ..config.spike.clone().unwrap_or(SpikeConfig::new(at))
            });
        }
        if self.spike_batches.is_some() || self.spike_kind.is_some() {
            let Some(spike) = config.spike.as_mut() else {
                super::bail_usage!("--spike-batches and --spike-kind need --inject-spike-at-step (or [spike] in the config)");
            };
            if let Some(n) = self.spike_batches {
                spike.batches = n;
            }
            if let Some(k) = self.spike_kind {
                spike.kind = match k {
                    SpikeKindArg::RareToken => SpikeKind::RareToken,
                    SpikeKindArg::LongDoc => SpikeKind::LongDoc,
                    SpikeKindArg::Repeated => SpikeKind::Repeated,
                };
            }
        }
        if let Some(p) = self.spike_policy {
            let mut s = config.stability.clone().unwrap_or_default();
            s.policy = match p {
                SpikePolicyArg::Wait => SpikePolicy::Wait,
                SpikePolicyArg::Rollback => SpikePolicy::Rollback,
                SpikePolicyArg::Skip => SpikePolicy::Skip,
                SpikePolicyArg::Kill => SpikePolicy::Kill,
            };
            config.stability = Some(s);
        }
        Ok(())
    }
}

/// Loads `--config` (or the embedded default) and applies the command-line overrides.
pub fn load_config(path: Option<&PathBuf>) -> Result<LabConfig> {
    match path {
        Some(p) => LabConfig::load(p),
        None => LabConfig::from_toml(TINY_CPU),
    }
}

pub fn options(args: &Args, backend: BackendKind) -> Result<(TrainOptions, Option<RunGuard>)> {
    check_counts(args)?;
    let mut config = load_config(args.config.as_ref())?;
    let t = &mut config.train;
    if let Some(v) = args.total_steps {
        t.total_steps = v;
        t.warmup_steps = t.warmup_steps.min(v);
    }
    if let Some(v) = args.ckpt_every {
        t.ckpt_every = v;
    }
    if let Some(v) = args.eval_every {
        t.eval_every = v;
    }
    if let Some(v) = args.log_every {
        t.log_every = v;
    }
    if let Some(v) = args.seed {
        t.seed = v;
    }
    if let Some(p) = args.precision {
        t.precision = p;
    }
    if let Some(c) = args.activation_checkpointing {
        t.activation_checkpointing = c;
    }
    if let Some(k) = args.init.freeze_non_embedding_steps {
        t.freeze_non_embedding_steps = k;
    }
    args.spike.apply(&mut config)?;
    // Flags name themselves in errors: the validated fields are the flags' targets.
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("{e} (after command-line overrides)"))?;
    let launch = lab_dist::Launch::from_env()?;
    // Rank 0 logs the run, so it alone creates the store.
    super::export::check_mlflow_uri(args.mlflow_uri.as_deref(), launch.rank == 0)?;
    let gpu = super::open_gpu(backend, &launch);
    if let Some(gib) = args.fit_micro_batch {
        fit_micro_batch(&mut config, gib, backend, &gpu, &launch)?;
    }
    if let Some(note) = super::measure_on_this_device(&mut config, backend, &gpu) {
        if launch.rank == 0 {
            eprintln!("lab train: {note}");
        }
    }

    let run_dir = args
        .ckpt_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&config.name));
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            if config.model.vocab_size != lab_data::gpt2::GPT2_VOCAB {
                bail!(
                    "config {} has vocab_size {}: the bundled corpus is GPT-2 tokenized (50257); pass --data-dir",
                    config.name,
                    config.model.vocab_size
                );
            }
            let dir = PathBuf::from("runs/data/tinyshakespeare-gpt2");
            lab_data::gpt2::ensure_tinyshakespeare(&dir)?;
            dir
        }
    };
    // Rank 0 of a data-parallel job talks to the budget guard; the others follow its stops.
    let guard = match launch.rank {
        0 => RunGuard::new(
            &args.budget,
            config.budget.as_ref(),
            &run_dir,
            args.resume_from_latest,
        )?,
        _ => None,
    };
    if launch.rank == 0 && guard.is_none() && args.resume_from_latest {
        keep_the_recorded_budget(&run_dir)?;
    }
    // The run records the budget it ran under, flags included.
    config.budget = guard.as_ref().map(|g| g.config().clone());
    let alert = guard.as_ref().and_then(RunGuard::webhook).map(|url| {
        let sink: AlertSink = Box::new(move |text: &str| {
            lab_budget::notify::post_webhook(&url, text, Duration::from_secs(10))
        });
        sink
    });
    let policies: Vec<Box<dyn StepPolicy>> = match gpu_health(args, &config, gpu, &launch)? {
        Some(p) => vec![Box::new(p)],
        None => Vec::new(),
    };
    let opts = TrainOptions {
        config,
        data_dir,
        run_dir,
        resume: args.resume_from_latest,
        backend,
        progress: std::io::stderr().is_terminal(),
        policies,
        alert,
        nan_grad_at_step: args.spike.inject_nan_grad_at_step,
        crash_in_rollback: args.spike.inject_crash_in_rollback,
        extend_to_steps: args.extend_to_steps,
        init_from_hf: args.init.init_from_hf.clone(),
        launch,
    };
    Ok((opts, guard))
}

/// Counting flags at 0 are usage errors (exit 2) that name the flag, not the config field.
fn check_counts(args: &Args) -> Result<()> {
    let counts = [
        ("--total-steps", args.total_steps.map(|v| v as u64)),
        ("--ckpt-every", args.ckpt_every.map(|v| v as u64)),
        ("--eval-every", args.eval_every.map(|v| v as u64)),
        ("--log-every", args.log_every.map(|v| v as u64)),
        ("--inject-spike-at-step", args.spike.inject_spike_at_step),
        ("--spike-batches", args.spike.spike_batches),
    ];
    if let Some((flag, _)) = counts.iter().find(|(_, v)| *v == Some(0)) {
        super::bail_usage!("{flag} 0: give at least 1");
    }
    Ok(())
}

/// A resume with no budget of a run that recorded one would train on past its cap: refused
/// before anything runs, naming the cap and how to keep it.
fn keep_the_recorded_budget(run_dir: &std::path::Path) -> Result<()> {
    let recorded = run_dir.join(lab_run::CONFIG);
    // An unreadable record is the resume's own check to report.
    let Some(budget) = LabConfig::load(&recorded).ok().and_then(|c| c.budget) else {
        return Ok(());
    };
    bail!(
        "{} ran under a ${:.2} budget cap: resume it with one (--budget-cap-usd {} and the budget flags it ran with, or a --config with [budget]); without, it would train past the cap",
        run_dir.display(),
        budget.cap_usd,
        budget.cap_usd
    )
}

/// `--fit-micro-batch [GIB]`: the micro-batch and accumulation `lab plan`'s memory model
/// fits in the device's memory, written into the config the run records.
fn fit_micro_batch(
    config: &mut LabConfig,
    gib: Option<f64>,
    backend: BackendKind,
    gpu: &super::Gpu,
    launch: &lab_dist::Launch,
) -> Result<()> {
    let device_bytes = match gib {
        Some(g) if g.is_finite() && g > 0.0 => g * lab_plan::units::GIB,
        Some(g) => super::bail_usage!("--fit-micro-batch {g}: give the device's memory in GiB, e.g. 80"),
        // Every rank must choose the same split: one number, not each GPU's own reading.
        None if launch.world > 1 => super::bail_usage!(
            "--fit-micro-batch on {} ranks: give the smallest GPU's memory in GiB (--fit-micro-batch 80) so every rank splits the step alike",
            launch.world
        ),
        None => gpu_memory_bytes(backend, gpu)?,
    };
    let (micro_batch, grad_accum) = (config.train.micro_batch, config.train.grad_accum);
    // The GPU backends run lab-kernels' flash attention; the CPU keeps the T × T scores.
    let attention = match backend {
        BackendKind::Cpu => lab_plan::memory::AttentionKind::Scores,
        BackendKind::Cuda | BackendKind::Wgpu => lab_plan::memory::AttentionKind::Flash,
    };
    let fit = lab_plan::fit::fit_micro_batch(config, launch.world, device_bytes, attention)?;
    config.train.micro_batch = fit.micro_batch;
    config.train.grad_accum = fit.grad_accum;
    config.train.eval_batches = fit.eval_batches;
    if launch.rank == 0 {
        lab_fsio::console::line(&format!(
            "lab train: --fit-micro-batch: micro-batch {} × {} accumulated (config: {micro_batch} × {grad_accum}), {:.2} GiB per device planned of {:.2} GiB usable",
            fit.micro_batch,
            fit.grad_accum,
            fit.planned_bytes / lab_plan::units::GIB,
            fit.usable_bytes / lab_plan::units::GIB
        ));
    }
    Ok(())
}

/// This rank's GPU memory, from NVML.
fn gpu_memory_bytes(backend: BackendKind, gpu: &super::Gpu) -> Result<f64> {
    match gpu {
        Ok(Some(probe)) => {
            let gpu = probe.describe();
            if gpu.memory_bytes == 0 {
                bail!("--fit-micro-batch: NVML reports no memory for GPU {}; give it in GiB (--fit-micro-batch 80)", gpu.index);
            }
            Ok(gpu.memory_bytes as f64)
        }
        Err(e) => bail!(
            "--fit-micro-batch: cannot read the GPU's memory; give it in GiB (--fit-micro-batch 80): {e}"
        ),
        Ok(None) => bail!(
            "--fit-micro-batch needs the device's memory: on --backend {} give it in GiB (--fit-micro-batch 80)",
            backend.name()
        ),
    }
}

/// GPU health readings and alerts: NVML on a CUDA run, a recorded file for the drill, none
/// on the CPU. A GPU host without NVML trains on, with a warning. Rank 0's GPU only: the
/// other ranks neither log nor alert, so their readings would be dropped.
fn gpu_health(
    args: &Args,
    config: &LabConfig,
    gpu: super::Gpu,
    launch: &lab_dist::Launch,
) -> Result<Option<GpuHealth>> {
    if launch.rank != 0 {
        return Ok(None);
    }
    let probe: Box<dyn lab_health::Probe> = match (&args.inject_gpu_telemetry, gpu) {
        (Some(file), _) => {
            Box::new(lab_health::replay::ReplayProbe::open(file).context("--inject-gpu-telemetry")?)
        }
        (None, Ok(Some(probe))) => probe,
        (None, Err(e)) => {
            eprintln!("warning: {e}");
            return Ok(None);
        }
        (None, Ok(None)) => return Ok(None),
    };
    let watch = lab_health::Watch::new(lab_health::Rules::default());
    let mfu = lab_train::device::mfu_peak(config);
    Ok(Some(GpuHealth::new(probe, watch, mfu)))
}

/// The budget guard as a step policy: consulted at its interval and at every checkpoint step,
/// before the checkpoint: spent > cap stops with none (exit 4), projected > cap checkpoints and
/// stops (exit 3).
struct BudgetPolicy(RunGuard);

impl StepPolicy for BudgetPolicy {
    fn name(&self) -> &'static str {
        "budget"
    }

    fn after_update(&mut self, v: &StepView, _: &mut dyn Journal) -> Decision {
        let step = v.step + 1;
        if step >= v.total_steps || !(v.at_checkpoint || self.0.due()) {
            return Decision::Continue;
        }
        let progress = Progress {
            step,
            total_steps: v.total_steps,
            sec_per_step: Some(v.elapsed_s / v.steps_this_session.max(1) as f64),
        };
        let d = self.0.check(&progress);
        match d.verdict.exit_code() {
            Some(exit_code) => Decision::Stop(Stop::Budget {
                exit_code,
                reason: d.reason,
            }),
            None => Decision::Continue,
        }
    }
}

/// How `lab train` ended: refused before the first step (with its exit code), or trained.
pub enum Ended {
    Refused(ExitCode),
    Trained(Outcome),
}

pub fn run(args: Args) -> Result<ExitCode> {
    Ok(match train(&args)? {
        Ended::Refused(code) => code,
        Ended::Trained(outcome) => exit_code(&outcome),
    })
}

/// Trains as the flags say (budget guard, terminate-on-exit, MLflow included).
pub fn train(args: &Args) -> Result<Ended> {
    let backend = super::backend_kind(&args.backend)?;
    backend.ensure_available()?;
    let (mut opts, mut guard) = options(args, backend)?;
    let p = opts.config.model.param_count();
    let leader = opts.launch.rank == 0;
    if leader {
        lab_fsio::console::line(&format!(
            "lab train: {} ({:.2}M parameters, {:.2}M non-embedding) on {}, run folder {}",
            opts.config.name,
            p.total() as f64 / 1e6,
            p.non_embedding() as f64 / 1e6,
            backend.name(),
            opts.run_dir.display()
        ));
    }
    if let Some(g) = guard.as_mut() {
        if let Some(code) = budget_prelaunch(g, &opts) {
            return Ok(Ended::Refused(code));
        }
    }
    let end_of_run = guard.as_ref().and_then(|g| g.end_of_run());
    if let Some(g) = guard {
        opts.policies.push(Box::new(BudgetPolicy(g)));
    }
    let run_dir = opts.run_dir.clone();
    let result = backend.dispatch(opts);
    if let Some(uri) = args.mlflow_uri.as_ref().filter(|_| leader) {
        super::export::log_mlflow(uri, &run_dir, None);
    }
    // --terminate-on-exit: a finished, budget-stopped or failed run stops paying; an
    // interrupted one (someone pressed Ctrl-C, or the provider preempts) is left to its owner.
    if let Some(end) = end_of_run {
        if !matches!(result, Ok(Outcome::Interrupted { .. })) {
            let terminated = end.terminate().context("--terminate-on-exit");
            if let Err(e) = &terminated {
                if result.is_err() {
                    eprintln!("error: {e:#}");
                }
            }
            if result.is_ok() {
                terminated?;
            }
        }
    }
    Ok(Ended::Trained(result?))
}

/// What the process exits with, after saying how the run ended.
pub fn exit_code(outcome: &Outcome) -> ExitCode {
    match outcome {
        Outcome::Completed {
            step,
            train_loss,
            val_loss,
        } => {
            lab_fsio::console::line(&format!(
                "done: step {step}, train loss {train_loss:.4}{}",
                val_loss
                    .map(|v| format!(", val loss {v:.4}"))
                    .unwrap_or_default()
            ));
            ExitCode::SUCCESS
        }
        Outcome::StoppedEarly {
            step,
            reason,
            val_loss,
        } => {
            lab_fsio::console::line(&format!(
                "stopped early at step {step}: {reason}{}",
                val_loss
                    .map(|v| format!(" (val loss {v:.4})"))
                    .unwrap_or_default()
            ));
            ExitCode::SUCCESS
        }
        Outcome::Unstable { step, reason } => {
            eprintln!("stopped by the stability policy at step {step}: {reason}; the last good checkpoint is kept");
            ExitCode::from(5)
        }
        Outcome::Interrupted { signal, step } => {
            eprintln!("interrupted by signal {signal}: emergency checkpoint at step {step}");
            ExitCode::from(signals::exit_code(*signal))
        }
        Outcome::BudgetStopped {
            exit_code, step, ..
        } => {
            let ckpt = if *exit_code == 3 {
                "after a checkpoint"
            } else {
                "with no checkpoint"
            };
            eprintln!("stopped by the budget guard at step {step} {ckpt} (exit {exit_code})");
            ExitCode::from(*exit_code)
        }
    }
}

/// The budget guard before any step: `Some(exit code)` when the launch is refused (4) or
/// this is `--dry-run-budget` (the decision table, 0 or 4).
fn budget_prelaunch(guard: &mut RunGuard, opts: &TrainOptions) -> Option<ExitCode> {
    // Resuming: the run restarts at its newest checkpoint (status.json may be further on, by
    // up to a checkpoint interval, which would under-project), and the previous attempt's
    // status.json knows the step time.
    let (start_step, status) = if opts.resume {
        // An unreadable folder counts as step 0: the whole run is projected (fail safe).
        let newest = lab_train::checkpoint::list(&opts.run_dir).unwrap_or_default();
        let status = lab_budget::status::read_status(&opts.run_dir.join("status.json")).ok();
        (newest.first().map_or(0, |(step, _)| *step), status)
    } else {
        (0, None)
    };
    // An extended run ends later than its config says.
    let planned = status.as_ref().map_or(0, |s| s.total_steps);
    let total_steps = (opts.config.train.total_steps as u64)
        .max(planned)
        .max(opts.extend_to_steps.unwrap_or(0));
    let plan = lab_budget::PlannedRun::new(total_steps, start_step, status, None);
    let report = guard.prelaunch(&plan);
    if guard.dry_run() {
        print!("{}", report.render());
        return Some(ExitCode::from(report.exit_code()));
    }
    let why = report.refusal.as_ref()?;
    eprint!("{}", report.render());
    eprintln!("budget guard: refusing to launch: {why}");
    Some(ExitCode::from(report.exit_code()))
}
