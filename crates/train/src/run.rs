//! The run as the trainer keeps it: the locked run folder and its files (metrics, events,
//! status, config.toml, data.json), the progress bar, alerts, the checkpoint writer, and the
//! three ways a run moves in time besides stepping: start (fresh or resume), rollback, stop.
//!
//! In a data-parallel job every rank keeps a `Run` and walks the same path through it, but
//! only rank 0 (the leader) writes the folder's logs and status and talks to people; the
//! others read checkpoints after it and write only their optimizer shards (ZeRO-1).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::module::AutodiffModule;
use indicatif::ProgressBar;
use lab_config::{LabConfig, TrainConfig};

use lab_run::{JsonLines, MetricsRow, Status};
use serde_json::{json, Value};

use crate::backend::TrainBackend;
use crate::checkpoint::{self, TrainState};
use crate::hf_init::HfInit;
use crate::judge::Judge;
use crate::optim::param_norm;
use crate::parallel::DataParallel;
use crate::policy::{Journal, Policies, Rollback, StepView, Stop};

use crate::state::TrainingState;
use crate::step::mfu;
use crate::stream::TrainData;
use crate::trainer::{AlertSink, Outcome, TrainOptions};

/// Where the data of a run came from (`data.json` in the run folder).
pub const DATA: &str = "data.json";

/// Events the trainer derives from the data and the weights: a replay of the same steps logs
/// them again.
const REPLAYED_EVENTS: &[&str] = &[
    "checkpoint",
    "spike_injected",
    "spike_detected",
    "spike_recovered",
    "spike_escalated",
    "update_skipped",
    "nonfinite",
    "rollback",
    "plateau",
    "eval",
    "samples",
    "best",
    "stopped_early",
];

pub struct Run {
    pub dir: PathBuf,
    cfg: LabConfig,
    config_sha: String,
    training_sha: String,
    data_sha: String,
    resume: bool,
    /// data.json's content.
    identity: Value,
    backend: &'static str,
    /// Fire drill: abort inside the first rollback (`--inject-crash-in-rollback`).
    crash_in_rollback: bool,
    extend_to_steps: Option<u64>,
    /// The job this process is a rank of (one rank outside data parallelism).
    pub dp: Rc<DataParallel>,
    /// Held by the leader.
    _lock: Option<File>,
    metrics: JsonLines,
    status: Status,
    bar: ProgressBar,
    alert: Option<AlertSink>,
    started: Instant,
    /// Steps run by this process (rolled-back ones included): the pace of this session.
    pub steps_taken: u64,
    /// Seconds in training steps and steps since the last logged row.
    interval: (f64, u64),
    last_loss: f64,
    last_val: Option<f64>,
    /// Set by a policy for the step being taken; forces its metrics row.
    flag: Option<String>,
    /// Columns policies add to the next metrics row (the GPU's readings).
    pending_metrics: BTreeMap<String, f64>,
    judge: Judge,
    /// The best validation loss so far and its step; `best_pending` until it is checkpointed.
    best: Option<(u64, f64)>,
    best_pending: bool,
    /// The step, rollbacks and policies' state of the newest checkpoint this process wrote or
    /// resumed from: a stop with nothing new to keep does not write it again.
    saved: Option<(u64, u32, BTreeMap<String, Value>)>,
}

/// `best.json`: the step and validation loss of the best checkpoint, which retention keeps and
/// `lab export --checkpoint best` exports.
pub const BEST: &str = "best.json";

impl Run {
    /// Takes the run folder: creates and locks it, refuses to start fresh over a run, writes
    /// the effective config and the data's identity.
    pub fn open(opts: &mut TrainOptions, data: &TrainData, dp: Rc<DataParallel>) -> Result<Run> {
        let dir = opts.run_dir.clone();
        let leader = dp.is_leader();
        let lock = if leader {
            Some(take_folder(&dir, opts.resume)?)
        } else {
            None
        };
        // The leader has made the folder (or failed, and its exit ends the job).
        dp.barrier()?;
        let cfg = opts.config.clone();
        // Written once the run is known to be this one (fresh, or a resume that matches).
        let identity = json!({
            "data_dir": std::path::absolute(&data.dir).unwrap_or(data.dir.clone()),
            "meta_sha256": data.meta_sha256,
            "meta": data.meta,
        });
        let total = cfg.train.total_steps as u64;
        Ok(Run {
            metrics: JsonLines::open(&dir.join(lab_run::METRICS))?,
            status: Status {
                state: "running".into(),
                total_steps: total,
                pid: Some(std::process::id()),
                config_sha256: cfg.sha256(),
                started_utc: lab_run::clock::format_utc(lab_run::clock::now_unix()),
                ..Default::default()
            },
            bar: lab_plot::progress_bar(
                "train",
                "{pos}/{len} steps",
                total,
                opts.progress && leader,
            ),
            config_sha: cfg.sha256(),
            training_sha: cfg.training_sha256(),
            data_sha: data.meta_sha256.clone(),
            resume: opts.resume,
            identity,
            backend: opts.backend.name(),
            crash_in_rollback: opts.crash_in_rollback,
            extend_to_steps: opts.extend_to_steps,
            alert: opts.alert.take(),
            dp,
            cfg,
            dir,
            _lock: lock,
            started: Instant::now(),
            steps_taken: 0,
            interval: (0.0, 0),
            last_loss: f64::NAN,
            last_val: None,
            flag: None,
            pending_metrics: BTreeMap::new(),
            judge: Judge::new(&opts.config, data)?,
            best: None,
            best_pending: false,
            saved: None,
        })
    }

    /// The state to train from: fresh (from the seed, or from `init`'s weights), or the newest
    /// checkpoint that verifies (`--resume`), extended when `--extend-to-steps` asks.
    pub fn start<B: TrainBackend>(
        &mut self,
        policies: &mut Policies,
        device: &B::Device,
        init: Option<HfInit<B>>,
    ) -> Result<TrainingState<B>> {
        let mut state = self.restore(policies, device, init)?;
        state.model = self.dp.keep_own_masters(state.model);
        if let Some(to) = self.extend_to_steps {
            if self.extend(&mut state, to)? {
                // Durable at once: a kill before the next checkpoint must not lose it.
                self.checkpoint(&state, policies)?;
            }
        }
        let total = state.schedule.total_steps();
        self.status.total_steps = total;
        self.bar.set_length(total);
        // Live at once: until its first row, the last attempt's status would say the run had
        // stopped.
        self.status.loss = self.last_loss.is_finite().then_some(self.last_loss);
        self.status.val_loss = self.last_val;
        self.write_status("running", state.step)?;
        Ok(state)
    }

    /// `--extend-to-steps`: the run trains on to `to`; the decision is an event and part of
    /// state.json. False when the run already trains to `to`.
    fn extend<B: TrainBackend>(&mut self, state: &mut TrainingState<B>, to: u64) -> Result<bool> {
        let step = state.step;
        let Some(e) = state.schedule.extend(step, to)?.cloned() else {
            return Ok(false);
        };
        let min_lr = state.schedule.lr(to);
        self.event(step, "schedule_extended", serde_json::to_value(&e)?);
        self.say(&format!(
            "extended at step {step}: {} → {} steps, learning rate {:.2e} falling to {min_lr:.2e} on a new cosine tail",
                        e.from_steps, e.to_steps, e.lr_at_step
        ));
        Ok(true)
    }

    fn restore<B: TrainBackend>(
        &mut self,
        policies: &mut Policies,
        device: &B::Device,
        init: Option<HfInit<B>>,
    ) -> Result<TrainingState<B>> {
        if !self.resume {
            self.record_identity()?;
            return self.initial(policies, device, init);
        }
        let dir = self.dir.clone();
        let mut skipped = Vec::new();
        let ck = self.load_agreed(u64::MAX, &mut |w| skipped.push(w))?;
        for w in skipped {
            eprintln!("warning: {w}");
            self.event(0, "checkpoint_skipped", json!({ "reason": w }));
        }
        // Starting over would throw away a run whose every checkpoint is damaged: refuse.
        if ck.is_none() {
            let corrupt = self.agreed_corrupt_count()?;
            if corrupt > 0 {
                bail!(
                    "no checkpoint in {} verifies ({corrupt} set aside as step-N.corrupt): restore a good step-N folder from a backup, or move the run folder aside to start fresh",
                    dir.display()
                );
            }
        }
        let Some(mut ck) = ck else {
            self.say(&format!(
                "no checkpoint in {}: starting fresh",
                dir.display()
            ));
            // Lines of an attempt that never checkpointed are not part of this run.
            self.truncate_logs_after(0)?;
            self.record_identity()?;
            return self.initial(policies, device, init);
        };
        if init.is_some() {
            self.say("--init-from-hf: the run resumes from its checkpoint; the folder's weights are not used");
        }
        self.check_same_run(&ck.dir, &ck.state)?;
        self.record_identity()?;
        self.dp.keep_own_counts(&mut ck.state);
        let state = TrainingState::from_checkpoint(&self.cfg, &mut ck, device)?;
        policies.restore(&ck.state.policies)?;
        self.truncate_logs_after(state.step)?;
        let now = serde_json::to_value(self.cfg.stability())?;
        // Kept as this launch would write it, or a stop writes it again with this launch's
        // record (a resume may accept another config, such as another micro-batch split).
        let same_record = ck.state.config_sha256 == self.config_sha
            && ck.state.training_sha256 == self.training_sha
            && ck.state.stability == now;
        if same_record {
            self.saved = Some((state.step, state.rollbacks, policies.save()));
        }
        self.log_checkpoint_once(state.step, &ck.dir);
        self.read_last_readings()?;
        self.best = read_best(&self.dir).filter(|(s, _)| *s <= state.step);
        if !ck.state.stability.is_null() && ck.state.stability != now {
            self.event(
                state.step,
                "stability_changed",
                json!({ "from": ck.state.stability, "to": now }),
            );
        }
        let from = ck.dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let launch = self.dp.launch();
        self.event(
            state.step,
            "resume",
            json!({ "from": from, "world_size": self.dp.world(), "restarts": launch.restarts }),
        );
        self.say(&format!(
            "resumed from {} (step {})",
            ck.dir.display(),
            state.step
        ));
        self.bar.set_position(state.step);
        Ok(state)
    }

    /// Step 0: drawn from the seed, or `init`'s weights, recorded and checkpointed at once (a
    /// resume or a rollback to step 0 then restores them, not the seed's).
    fn initial<B: TrainBackend>(
        &mut self,
        policies: &mut Policies,
        device: &B::Device,
        init: Option<HfInit<B>>,
    ) -> Result<TrainingState<B>> {
        policies.restore(&Default::default())?;
        let Some(init) = init else {
            return Ok(TrainingState::fresh(&self.cfg, device));
        };
        self.event(0, "init_from_hf", init.record);
        self.say(&init.summary);
        self.checkpoint(&init.state, policies)?;
        Ok(init.state)
    }

    /// A checkpoint from another recipe or other data is refused with one line.
    fn check_same_run(&self, dir: &Path, state: &TrainState) -> Result<()> {
        if state.training_sha256 != self.training_sha {
            self.explain_other_recipe(dir, state)?;
        }
        if !state.data_sha256.is_empty() && state.data_sha256 != self.data_sha {
            bail!(
                "{} was trained on other data (meta.json sha256 {} vs {} in --data-dir); resume with the run's --data-dir (see {}), or use a new --ckpt-dir",
                dir.display(),
                lab_fsio::short_sha256(&state.data_sha256),
                lab_fsio::short_sha256(&self.data_sha),
                self.dir.join(DATA).display()
            );
        }
        Ok(())
    }

    /// The checkpoint's training hash is not this launch's. Resuming is still right when the
    /// run folder's config.toml splits the same step into other micro-batches and differs in
    /// nothing else (`--fit-micro-batch` on another device): a warning. Otherwise one line
    /// saying what to do: keep `total_steps` and extend, or resume with the same recipe.
    fn explain_other_recipe(&self, dir: &Path, state: &TrainState) -> Result<()> {
        let t = &self.cfg.train;
        let recorded = std::fs::read_to_string(self.dir.join(lab_run::CONFIG))
            .ok()
            .and_then(|text| LabConfig::from_toml(&text).ok());
        if let Some(r) = &recorded {
            let (micro_batch, grad_accum) = (r.train.micro_batch, r.train.grad_accum);
            let same_step = micro_batch * grad_accum == t.micro_batch * t.grad_accum;
            if same_step
                && self.same_recipe_but(r, |r| {
                    (r.micro_batch, r.grad_accum) = (t.micro_batch, t.grad_accum)
                })
            {
                eprintln!(
                    "warning: {} split its steps {micro_batch} × {grad_accum}; this launch splits them {} × {} (--fit-micro-batch on another device?): the same samples per step, summed in another order",
                    dir.display(),
                    t.micro_batch,
                    t.grad_accum
                );
                return Ok(());
            }
            let planned = r.train.total_steps;
            if planned != t.total_steps
                && self.same_recipe_but(r, |r| r.total_steps = t.total_steps)
            {
                let new = t.total_steps;
                bail!(
                    "{}: the run was planned for {planned} steps, not {new} (train.total_steps is part of the schedule a bit-exact resume keeps); to train longer, keep train.total_steps = {planned} (drop --total-steps {new}) and add --extend-to-steps {new}",
                    dir.display()
                );
            }
        }
        bail!(
            "{} was written by a different model or optimization recipe (training sha256 {} vs {}); resume with the same config and flags, or use a new --ckpt-dir",
            dir.display(),
            lab_fsio::short_sha256(&state.training_sha256),
            lab_fsio::short_sha256(&self.training_sha)
        );
    }

    /// Whether the run's recorded config, with `align` copying this launch's values over the
    /// fields that differ, trains exactly what this launch does.
    fn same_recipe_but(&self, recorded: &LabConfig, align: impl FnOnce(&mut TrainConfig)) -> bool {
        let mut aligned = recorded.clone();
        align(&mut aligned.train);
        aligned.training_sha256() == self.training_sha
    }

    /// The run folder's record of what this run is: config.toml, data.json, hardware.json.
    fn record_identity(&self) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let dir = &self.dir;
        lab_fsio::write_atomic(&dir.join(lab_run::CONFIG), self.cfg.to_toml().as_bytes())?;
        let data = serde_json::to_string_pretty(&self.identity)?;
        lab_fsio::write_atomic(&dir.join(DATA), data.as_bytes())?;
        let mut hardware = lab_run::Hardware::detect(self.backend);
        hardware.mfu_peak = Some(crate::device::mfu_peak(&self.cfg));
        hardware.cluster = Some(self.dp.cluster());
        hardware.write(dir)
    }

    /// Lines an interrupted attempt logged after `step` are re-logged by the replay: metrics
    /// are dropped, replayed events moved to events-abandoned.jsonl.
    fn truncate_logs_after(&mut self, step: u64) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let path = self.dir.join(lab_run::METRICS);
        lab_run::jsonl::split_after_step(&path, step)?;
        self.metrics = JsonLines::open(&path)?;
        lab_run::events::abandon_after(&self.dir, step, REPLAYED_EVENTS)
    }

    /// A kill between publishing a checkpoint and logging it leaves it out of events.jsonl,
    /// and a resume from it never replays its step: logged here instead.
    fn log_checkpoint_once(&mut self, step: u64, dir: &Path) {
        if !self.logged(step, "checkpoint") {
            self.event(
                step,
                "checkpoint",
                json!({ "dir": dir, "logged_on_resume": true }),
            );
        }
    }

    /// The losses of the rows a resume keeps, and the last attempt's pace, for status.json and
    /// the closing line until this process logs rows of its own (a resumed run that is already
    /// done logs none).
    fn read_last_readings(&mut self) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let rows: Vec<Value> = lab_run::jsonl::read_lines(&self.dir.join(lab_run::METRICS))?;
        if let Some(loss) = rows.iter().rev().find_map(|r| r["loss"].as_f64()) {
            self.last_loss = loss;
        }
        self.last_val = rows.iter().rev().find_map(|r| r["val_loss"].as_f64());
        if let Ok(last) = Status::read(&self.dir) {
            self.status.tokens_per_s = last.tokens_per_s;
            self.status.secs_per_step = last.secs_per_step;
            self.status.mfu = last.mfu;
        }
        Ok(())
    }

    /// Whether events.jsonl has an event `kind` at `step` (false on ranks other than the
    /// leader, which log nothing).
    fn logged(&self, step: u64, kind: &str) -> bool {
        // A damaged events.jsonl is the post-mortem's to report: logging once more is harmless.
        let events = match self.leader() {
            true => lab_run::events::read_events(&self.dir).unwrap_or_default(),
            false => Vec::new(),
        };
        events.iter().any(|e| e.step == step && e.kind == kind)
    }

    /// After a step: evaluation and the metrics row at their cadence (or when a policy
    /// flagged the step), status.json and the progress bar. Returns the validation loss when
    /// one was measured.
    pub fn record_step<B: TrainBackend>(
        &mut self,
        state: &TrainingState<B>,
        view: &StepView,
        data: &TrainData,
        secs: f64,
        update_skipped: bool,
    ) -> Result<Option<f64>> {
        let tc = self.cfg.train.clone();
        let (step, total) = (state.step, view.total_steps);
        self.steps_taken += 1;
        self.interval = (self.interval.0 + secs, self.interval.1 + 1);
        self.last_loss = view.loss;
        self.bar.set_position(step);
        if !self.leader() {
            return Ok(None);
        }
        let judged = if step.is_multiple_of(tc.eval_every as u64) || step == total {
            Some(self.judge.judge(&state.model.valid(), data, &self.cfg)?)
        } else {
            None
        };
        let val_loss = judged.as_ref().map(|j| j.val_loss);
        if let Some(j) = &judged {
            for (kind, fields) in &j.events {
                self.event(step, kind, fields.clone());
            }
            if self.best.is_none_or(|(_, b)| j.val_loss < b) {
                self.best = Some((step, j.val_loss));
                self.best_pending = true;
            }
        }
        self.last_val = val_loss.or(self.last_val);
        let flag = self.flag.take();
        if !(view.at_log || val_loss.is_some() || flag.is_some() || update_skipped) {
            return Ok(val_loss);
        }
        let steps = self.interval.1.max(1) as f64;
        let secs_per_step = self.interval.0 / steps;
        self.interval = (0.0, 0);
        let tokens_per_s = self.cfg.tokens_per_step() as f64 / secs_per_step;
        let mut row = MetricsRow {
            step,
            loss: view.loss,
            lr: view.lr,
            grad_norm: view.grad_norm,
            clip_scale: view.clip_scale,
            param_norm: Some(param_norm(&state.model.valid())),
            tokens: step as f64 * self.cfg.tokens_per_step() as f64,
            samples: state.cursor.samples_consumed,
            tokens_per_s,
            mfu: mfu(&self.cfg, tokens_per_s) / self.dp.world() as f64,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            time_utc: Some(lab_run::clock::format_utc(lab_run::clock::now_unix())),
            val_loss,
            injected: view.data.injected,
            update_skipped,
            flag,
            extra: judged.map(|j| j.extra).unwrap_or_default(),
        };
        row.extra.append(&mut self.pending_metrics);
        if self.dp.world() > 1 {
            // The share of the interval's step time spent in collectives (rank 0's view).
            row.extra.insert(
                "comm_share".into(),
                self.dp.take_comm_s() / (secs_per_step * steps),
            );
        }
        self.metrics.append(&row)?;
        self.say_row(&row, total);
        self.status.step = step;
        self.status.loss = Some(view.loss);
        self.status.val_loss = self.last_val;
        self.status.tokens_per_s = Some(tokens_per_s);
        self.status.secs_per_step = Some(secs_per_step);
        self.status.mfu = Some(row.mfu);
        self.status.eta_s = Some(secs_per_step * total.saturating_sub(step) as f64);
        self.write_status("running", step)?;
        Ok(val_loss)
    }

    /// A new best validation loss waits for its checkpoint.
    pub fn new_best_pending(&self) -> bool {
        self.best_pending
    }

    fn say_row(&mut self, r: &MetricsRow, total: u64) {
        let mut line = format!(
            "step {:>6}/{total} | loss {:.4}{} | lr {:.2e} | grad norm {:.3} | {:.0} tok/s | MFU {:.1}%",
            r.step,
            r.loss,
            r.val_loss.map(|v| format!(" | val {v:.4}")).unwrap_or_default(),
            r.lr,
            r.grad_norm,
            r.tokens_per_s,
            r.mfu * 100.0
        );
        if let Some(f) = &r.flag {
            line.push_str(&format!(" | {f}"));
        }
        if r.injected {
            line.push_str(" | injected");
        }
        self.say(&line);
        self.bar.set_message(format!("loss {:.3}", r.loss));
    }

    fn write_status(&mut self, state: &str, step: u64) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        self.status.state = state.into();
        self.status.step = step;
        self.status.elapsed_s = self.started.elapsed().as_secs_f64();
        self.status.updated_utc = lab_run::clock::format_utc(lab_run::clock::now_unix());
        self.status.write(&self.dir)
    }

    /// Writes a checkpoint of `state`, applies retention, records the event.
    pub fn checkpoint<B: TrainBackend>(
        &mut self,
        state: &TrainingState<B>,
        policies: &Policies,
    ) -> Result<PathBuf> {
        let tc = self.cfg.train.clone();
        // What a stop compares with (`saved`), serialized once.
        let kept = policies.save();
        let train_state = TrainState {
            step: state.step,
            optimizer_updates: state.optim.updates(),
            param_updates: self.dp.all_counts(state.optim.param_updates())?,
            cursor: state.cursor.clone(),
            rollbacks: state.rollbacks,
            policies: kept.clone(),
            data_sha256: self.data_sha.clone(),
            stability: serde_json::to_value(self.cfg.stability())?,
            seed: tc.seed,
            rng: "stateless: init = f(seed, parameter path), data order = f(seed, window index), spikes = f(seed, spike sample)".into(),
                        next_lr: state.schedule.lr(state.step),
            schedule_extensions: state.schedule.extensions().to_vec(),
            config_sha256: self.config_sha.clone(),
            training_sha256: self.training_sha.clone(),
            created_utc: lab_run::clock::format_utc(lab_run::clock::now_unix()),
            lab_version: env!("CARGO_PKG_VERSION").into(),
            files: Default::default(),
        };
        let dir = self.save(state, train_state)?;
        self.saved = Some((state.step, state.rollbacks, kept));
        if !self.leader() {
            return Ok(dir);
        }
        let mut protect = vec![state.step];
        if let Some((best, val)) = self.best {
            if self.best_pending && best == state.step {
                let json = serde_json::to_string_pretty(&json!({ "step": best, "val_loss": val }))?;
                lab_fsio::write_atomic(&self.dir.join(BEST), json.as_bytes())?;
                self.best_pending = false;
                self.event(best, "best", json!({ "val_loss": val }));
            }
            protect.push(best);
        }
        if let Some(target) = policies.rollback_target() {
            // The last good state before an open incident must outlive retention.
            let before = checkpoint::list(&self.dir)?
                .into_iter()
                .find(|(s, _)| *s <= target);
            protect.extend(before.map(|(s, _)| s));
        }
        checkpoint::prune(
            &self.dir,
            &protect,
            tc.keep_last,
            tc.ckpt_every,
            tc.keep_every,
        )?;
        self.event(state.step, "checkpoint", json!({ "dir": dir }));
        Ok(dir)
    }

    /// Undoes the run back to the newest good checkpoint at or before `plan.to_step` (step 0
    /// when there is none), rules out `plan.skip`, deletes the abandoned checkpoints, moves the
    /// abandoned metrics rows aside and writes the restored state back as a checkpoint, so a
    /// kill at any point resumes on the same path.
    pub fn rollback<B: TrainBackend>(
        &mut self,
        failed: TrainingState<B>,
        plan: Rollback,
        policies: &mut Policies,
        device: &B::Device,
    ) -> Result<TrainingState<B>> {
        let from = failed.step;
        let rollbacks = failed.rollbacks + 1;
        let schedule = failed.schedule.clone();
        drop(failed);
        let dir = self.dir.clone();
        let mut warnings = Vec::new();
        let mut ck = self.load_agreed(plan.to_step, &mut |w| warnings.push(w))?;
        for w in warnings {
            self.event(from, "checkpoint_skipped", json!({ "reason": w }));
        }
        let mut state = match &mut ck {
            Some(ck) => {
                self.check_same_run(&ck.dir, &ck.state)?;
                policies.restore(&ck.state.policies)?;
                self.dp.keep_own_counts(&mut ck.state);
                TrainingState::from_checkpoint(&self.cfg, ck, device)?
            }
            None => {
                policies.restore(&Default::default())?;
                TrainingState::fresh(&self.cfg, device)
            }
        };
        state.model = self.dp.keep_own_masters(state.model);
        state.cursor.skip(&plan.skip, from + 1, &plan.reason);
        state.rollbacks = rollbacks;
        // An extension is a decision about the run, not part of the step it was taken at.
        state.schedule = schedule;
        self.flag = None; // the flagged step is undone
        self.best = read_best(&self.dir).filter(|(s, _)| *s <= state.step);
        self.best_pending = false;
        if self.leader() {
            checkpoint::remove_after(&dir, state.step)?;
        }
        if self.crash_in_rollback && rollbacks == 1 {
            eprintln!("fire drill: crashing in the middle of a rollback");
            std::process::abort();
        }
        self.abandon_rows_after(state.step, rollbacks)?;
        self.checkpoint(&state, policies)?;
        let text = format!(
            "rollback {rollbacks}: step {} → {} ({}); skipping {} sample range(s)",
            from + 1,
            state.step,
            plan.reason,
            plan.skip.len()
        );
        self.event(
            from + 1,
            "rollback",
            json!({ "from_step": from + 1, "to_step": state.step, "rollbacks": rollbacks,
                    "skipped": plan.skip, "reason": plan.reason }),
        );
        self.say(&text);
        self.alert(&format!("lab {}: {text}", self.dir.display()));
        self.bar.set_position(state.step);
        Ok(state)
    }

    /// Moves metrics rows after `step` into metrics-abandoned.jsonl, tagged with the rollback.
    fn abandon_rows_after(&mut self, step: u64, rollback: u32) -> Result<()> {
        if !self.leader() {
            return Ok(());
        }
        let path = self.dir.join(lab_run::METRICS);
        // Copied aside before they leave metrics.jsonl: a kill in between duplicates them in
        // the aside file rather than losing them.
        let rows: Vec<Value> = lab_run::jsonl::read_lines(&path)?;
        let mut aside = JsonLines::open(&self.dir.join(lab_run::ABANDONED_METRICS))?;
        for mut v in rows
            .into_iter()
            .filter(|v| v["step"].as_u64().is_some_and(|s| s > step))
        {
            v["rollback"] = json!(rollback);
            aside.append(&v)?;
        }
        lab_run::jsonl::split_after_step(&path, step)?;
        self.metrics = JsonLines::open(&path)?;
        Ok(())
    }

    /// The one stop sequence: checkpoint when the stop keeps one, event, alert, status.
    pub fn stop<B: TrainBackend>(
        &mut self,
        stop: Stop,
        state: &TrainingState<B>,
        policies: &Policies,
    ) -> Result<Outcome> {
        let checkpoint = if stop.checkpoints() {
            Some(self.checkpoint_if_new(state, policies)?)
        } else {
            None
        };
        let step = state.step;
        let (text, mut fields, outcome) = match &stop {
            Stop::Interrupted { signal } => (
                format!("signal {signal}: emergency checkpoint at step {step}"),
                json!({ "signal": signal }),
                Outcome::Interrupted {
                    signal: *signal,
                    step,
                },
            ),
            Stop::Unstable { reason } => (
                format!("stopped by the stability policy at step {step}: {reason}"),
                json!({ "reason": reason }),
                Outcome::Unstable {
                    step,
                    reason: reason.clone(),
                },
            ),
            Stop::Early { reason } => (
                format!("stopped early at step {step}: {reason}"),
                json!({ "reason": reason }),
                Outcome::StoppedEarly {
                    step,
                    reason: reason.clone(),
                    val_loss: self.last_val,
                },
            ),
            Stop::Budget { exit_code, reason } => (
                format!("stopped by the budget guard at step {step}: {reason}"),
                json!({ "reason": reason, "exit_code": exit_code }),
                Outcome::BudgetStopped {
                    exit_code: *exit_code,
                    step,
                    reason: reason.clone(),
                },
            ),
        };
        fields["checkpoint"] = json!(checkpoint.map(|_| checkpoint::step_dir_name(step)));
        if let Stop::Interrupted {
            signal: signal_hook::consts::SIGTERM,
        } = stop
        {
            // SIGTERM is how a spot instance's notice and Slurm's preemption reach a job (a time
            // limit or a plain `kill` look the same; the event says so).
            let preempted = json!({
                "signal": "SIGTERM",
                "checkpoint": fields["checkpoint"],
                "note": "SIGTERM: a spot notice, Slurm preemption or time limit, or a kill",
            });
            self.event(step, "preemption", preempted);
        }
        self.event(step, stop.state(), fields);
        self.say(&text);
        self.alert(&format!("lab {}: {text}", self.dir.display()));
        self.bar.abandon();
        self.status.loss = self.last_loss.is_finite().then_some(self.last_loss);
        self.write_status(stop.state(), step)?;
        Ok(outcome)
    }

    /// A stop's checkpoint: the one already written when nothing has changed since (a signal
    /// just after a periodic checkpoint, a stop right after a rollback), so a spot instance's
    /// notice is not spent writing it again. The leader decides for every rank.
    fn checkpoint_if_new<B: TrainBackend>(
        &mut self,
        state: &TrainingState<B>,
        policies: &Policies,
    ) -> Result<PathBuf> {
        let now = (state.step, state.rollbacks, policies.save());
        if self.dp.agree_flag(self.saved.as_ref() != Some(&now))? {
            return self.checkpoint(state, policies);
        }
        Ok(self.dir.join(checkpoint::step_dir_name(state.step)))
    }

    /// The run reached `total_steps`.
    pub fn finish<B: TrainBackend>(&mut self, state: &TrainingState<B>) -> Result<Outcome> {
        self.bar.finish_and_clear();
        self.status.loss = self.last_loss.is_finite().then_some(self.last_loss);
        self.status.val_loss = self.last_val;
        self.status.eta_s = Some(0.0);
        self.write_status("done", state.step)?;
        // A resume of a finished run has nothing to add.
        if !self.logged(state.step, "done") {
            self.event(state.step, "done", json!({}));
        }
        Ok(Outcome::Completed {
            step: state.step,
            train_loss: self.last_loss,
            val_loss: self.last_val,
        })
    }

    /// Writes `state` as a checkpoint: whole by the leader, or (ZeRO-1) each rank its
    /// optimizer shard and the leader the model, with the fp32 masters the other ranks keep.
    /// Every rank returns once the folder is in place.
    fn save<B: TrainBackend>(&self, state: &TrainingState<B>, meta: TrainState) -> Result<PathBuf> {
        let dp = &self.dp;
        if !dp.zero1() {
            let dir = if self.leader() {
                state.save(&self.dir, meta)?
            } else {
                self.dir.join(checkpoint::step_dir_name(meta.step))
            };
            dp.barrier()?;
            return Ok(dir);
        }
        let barrier = || dp.barrier();
        let part = checkpoint::Part {
            rank: dp.rank(),
            world: dp.world(),
            barrier: &barrier,
        };
        let model = dp
            .masters_on_leader(state.model.valid())?
            .map(|m| lab_model::weights::pending_tensors(&m))
            .unwrap_or_default();
        let moments = state.optim.pending_state();
        checkpoint::save_sharded(&self.dir, meta, &model, &moments, &part)
    }

    /// The newest good checkpoint of at most `max_step` steps, the same one on every rank:
    /// the leader picks it (verifying, and setting aside any that fails, with a warning) and
    /// names it to the others, which load that folder or fail. Each rank keeps its own share
    /// of the optimizer state. Returns once every rank has read, so nobody writes under a
    /// reader.
    fn load_agreed(
        &self,
        max_step: u64,
        warn: &mut dyn FnMut(String),
    ) -> Result<Option<checkpoint::Loaded>> {
        let dp = &self.dp;
        let keep = |m: &str| dp.keeps_moment(m);
        let (ck, mut name) = if self.leader() {
            let ck = checkpoint::load_newest_good_at_most(&self.dir, max_step, &keep, warn)?;
            let name = ck
                .as_ref()
                .and_then(|c| c.dir.file_name())
                .map(|n| n.to_string_lossy().into_owned());
            (ck, name.unwrap_or_default().into_bytes())
        } else {
            (None, Vec::new())
        };
        dp.collectives().broadcast_bytes(&mut name, 0)?;
        let ck = match (ck, name.is_empty()) {
            (Some(ck), _) => Some(ck),
            (None, true) => None,
            (None, false) => {
                let dir = self.dir.join(String::from_utf8_lossy(&name).as_ref());
                let ck = checkpoint::load(&dir, &keep).with_context(|| {
                    format!(
                        "rank {}: cannot load {}, which rank 0 resumes from",
                        dp.rank(),
                        dir.display()
                    )
                })?;
                Some(ck)
            }
        };
        dp.barrier()?;
        Ok(ck)
    }

    /// The checkpoint folders set aside as corrupt, as rank 0 counts them: every rank then
    /// refuses, or starts, alike.
    fn agreed_corrupt_count(&self) -> Result<u64> {
        let mut count = match self.leader() {
            true => (checkpoint::count_set_aside(&self.dir) as u64)
                .to_le_bytes()
                .to_vec(),
            false => Vec::new(),
        };
        self.dp.collectives().broadcast_bytes(&mut count, 0)?;
        Ok(u64::from_le_bytes(count.try_into().unwrap_or_default()))
    }

    /// Rank 0 writes the run folder; the other ranks only read it (and write their shards).
    fn leader(&self) -> bool {
        self.dp.is_leader()
    }

    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

impl Journal for Run {
    fn event(&mut self, step: u64, kind: &str, fields: Value) {
        if !self.leader() {
            return;
        }
        if let Err(e) = lab_run::append_event(&self.dir, step, kind, fields) {
            eprintln!("warning: {e:#}");
        }
    }

    fn alert(&mut self, text: &str) {
        if !self.leader() {
            return;
        }
        if let Some(send) = &self.alert {
            if let Err(e) = send(text) {
                eprintln!("warning: alert webhook failed: {e:#}");
            }
        }
    }

    fn say(&mut self, line: &str) {
        if !self.leader() {
            return;
        }
        if self.bar.is_hidden() {
            lab_fsio::console::line(line);
        } else {
            self.bar.println(line);
        }
    }

    fn flag_step(&mut self, flag: &str) {
        self.flag = Some(flag.to_string());
    }

    fn metric(&mut self, name: &str, value: f64) {
        self.pending_metrics.insert(name.to_string(), value);
    }
}

/// The step and validation loss `best.json` records.
pub fn read_best(run_dir: &Path) -> Option<(u64, f64)> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(run_dir.join(BEST)).ok()?).ok()?;
    Some((v["step"].as_u64()?, v["val_loss"].as_f64()?))
}

/// Creates the run folder, proves it writable and takes its lock; refuses to silently restart
/// over an existing run. A fresh run starts fresh logs.
fn take_folder(dir: &Path, resume: bool) -> Result<File> {
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
    if !resume && !checkpoint::list(dir)?.is_empty() {
        bail!(
            "--ckpt-dir {} already holds checkpoints; pass --resume-from-latest to continue that run, or choose a new --ckpt-dir",
            dir.display()
        );
    }
    // A run whose checkpoints were all found corrupt is not started over in silence.
    if !resume && checkpoint::count_set_aside(dir) > 0 {
        bail!(
            "--ckpt-dir {} holds checkpoints set aside as corrupt (step-N.corrupt): restore a good step-N folder from a backup and resume, or choose a new --ckpt-dir",
            dir.display()
        );
    }
    if !resume {
        for f in [
            lab_run::METRICS,
            lab_run::ABANDONED_METRICS,
            lab_run::EVENTS,
            lab_run::STATUS,
        ] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
    Ok(lock)
}
