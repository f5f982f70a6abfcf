//! `lab export`: a run folder becomes `experiments/<lab>/<run>/`, written atomically (a
//! temporary folder, renamed into place): manifest.json, metrics.csv, loss-curve.png,
//! gradnorm-curve.png, throughput.png, final.safetensors, spike-postmortem.md (saying so
//! when the run had no spike), MODEL_CARD.md, run-uri.txt, and the run's own config.toml, events.jsonl,
//! hardware.json, data.json, budget.json and termination.json as evidence.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lab_run::{Hardware, MetricsRow};
use lab_train::checkpoint;
use serde_json::Value;

use crate::manifest::{Cost, FinalMetrics, Manifest, MANIFEST};
use crate::run_files::RunFiles;
use crate::versions::Versions;
use crate::{model_card, plots, postmortem};

/// Which checkpoint's weights become `final.safetensors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointChoice {
    /// The newest checkpoint that verifies.
    Latest,
    /// The checkpoint of the best validation loss (`best.json`).
    Best,
    Step(u64),
}

impl std::str::FromStr for CheckpointChoice {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "latest" => return Ok(Self::Latest),
            "best" => return Ok(Self::Best),
            _ => {}
        }
        match s.trim_start_matches("step-").parse() {
            Ok(n) => Ok(Self::Step(n)),
            Err(_) => bail!("--checkpoint {s:?}: use latest, best, a step number or step-N"),
        }
    }
}

pub struct ExportOptions {
    pub run: PathBuf,
    pub output: PathBuf,
    pub checkpoint: CheckpointChoice,
    /// budget.json to take the spend from (default RUN/budget.json).
    pub budget: Option<PathBuf>,
}

/// Files copied from the run folder when present.
const EVIDENCE: &[&str] = &[
    lab_run::CONFIG,
    lab_run::EVENTS,
    lab_run::hardware::HARDWARE,
    lab_train::run::DATA,
    "budget.json",
    "termination.json",
];

pub const FINAL_WEIGHTS: &str = "final.safetensors";

/// Exports `opts.run` to `opts.output`; returns the manifest written.
pub fn export(opts: &ExportOptions) -> Result<Manifest> {
    let files = RunFiles::read(&opts.run)?;
    let Some(cfg) = files.config.clone() else {
        bail!(
            "{} has no config.toml (written by lab train since the spike release): re-run or resume the run with this lab",
            opts.run.display()
        );
    };
    let out = &normalized(&opts.output);
    check_destination(out, MANIFEST)?;
    let (ck_dir, ck_state) = choose_checkpoint(&opts.run, opts.checkpoint)?;
    same_run(&opts.run, &cfg, &ck_dir, &ck_state)?;

    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let _writing = lab_fsio::lock_dir_writers(out)?;
    lab_fsio::recover_replaced_dir(out)?;
    let stage = lab_fsio::temp_sibling(out);
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(&stage).with_context(|| format!("cannot create {}", stage.display()))?;
    let written = (|| -> Result<Manifest> {
        write_metrics_csv(&files.metrics, &stage.join("metrics.csv"))?;
        if !files.abandoned.is_empty() {
            write_metrics_csv(&files.abandoned, &stage.join("metrics-abandoned.csv"))?;
        }
        plots::loss_curve(&files, &stage.join("loss-curve.png"))?;
        plots::gradnorm_curve(&files, &stage.join("gradnorm-curve.png"))?;
        plots::throughput(&files, &stage.join("throughput.png"))?;
        copy(&checkpoint::model_file(&ck_dir), &stage.join(FINAL_WEIGHTS))?;
        // Always: a run without a spike gets the page that says none was detected, and under
        // which thresholds.
        postmortem::Postmortem::of(files.clone())
            .write(Some(&stage.join("spike-postmortem.md")))?;
        for name in EVIDENCE {
            let src = match *name {
                "budget.json" => opts.budget.clone().unwrap_or(opts.run.join(name)),
                _ => opts.run.join(name),
            };
            if src.is_file() {
                copy(&src, &stage.join(name))?;
            }
        }
        let uri = format!("file://{}\n", std::path::absolute(&opts.run)?.display());
        lab_fsio::write_atomic(&stage.join("run-uri.txt"), uri.as_bytes())?;

        let mut m = manifest(&files, &cfg, ck_state.step, &stage)?;
        lab_fsio::write_atomic(
            &stage.join("MODEL_CARD.md"),
            model_card::model_card(&m, &cfg).as_bytes(),
        )?;
        m.artifacts = hash_files(&stage)?;
        let text = serde_json::to_string_pretty(&m)? + "\n";
        lab_fsio::write_atomic(&stage.join(MANIFEST), text.as_bytes())?;
        Ok(m)
    })();
    match written {
        Ok(m) => {
            lab_fsio::replace_dir(&stage, out)?;
            Ok(m)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&stage);
            Err(e)
        }
    }
}

/// The run folder's config and data are the ones the checkpoint was trained with (a refused
/// resume or a hand edit could have changed them).
fn same_run(
    run: &Path,
    cfg: &lab_config::LabConfig,
    ck: &Path,
    state: &checkpoint::TrainState,
) -> Result<()> {
    if state.training_sha256 != cfg.training_sha256() {
        bail!(
            "{}: config.toml does not describe the recipe {} was trained with (training sha256 differs); export from an untouched run folder",
            run.display(),
            ck.display()
        );
    }
    let data: Value = fs::read_to_string(run.join(lab_train::run::DATA))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    if !state.data_sha256.is_empty() && data["meta_sha256"] != state.data_sha256.as_str() {
        bail!(
            "{}: data.json does not name the data {} was trained on",
            run.display(),
            ck.display()
        );
    }
    Ok(())
}

fn copy(src: &Path, dst: &Path) -> Result<()> {
    fs::copy(src, dst)
        .with_context(|| format!("cannot copy {} to {}", src.display(), dst.display()))?;
    fs::File::open(dst)?.sync_all()?;
    Ok(())
}

/// `out` without a trailing `.` (`foo/.` is `foo`): the folder a rename can replace.
pub fn normalized(out: &Path) -> PathBuf {
    out.components().collect()
}

/// What an export may replace: nothing, an empty folder, or an earlier export (it holds
/// `marker`, lab's manifest or HF parity file). Anything else there is the user's (a run
/// folder, notes, the working folder) and is never moved or deleted.
pub fn check_destination(out: &Path, marker: &str) -> Result<()> {
    if out.file_name().is_none() {
        bail!(
            "export folder {:?} names no folder of its own: give a new folder's path",
            out.display().to_string()
        );
    }
    let Ok(meta) = fs::metadata(out) else {
        return Ok(());
    };
    if !meta.is_dir() {
        bail!(
            "export folder {} is a file: give a new folder's path",
            out.display()
        );
    }
    let empty = fs::read_dir(out)
        .with_context(|| format!("cannot list {}", out.display()))?
        .next()
        .is_none();
    if !empty && !written_by_lab(&out.join(marker)) {
        bail!(
            "export folder {} exists and is not an earlier export (no {marker}): give a new folder, or move it aside",
            out.display()
        );
    }
    Ok(())
}

/// Whether `marker` is a JSON file lab wrote: a manifest names lab's version, a parity file
/// its prompt. Another tool's `manifest.json` does not make its folder an export.
fn written_by_lab(marker: &Path) -> bool {
    let Ok(text) = fs::read_to_string(marker) else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(&text)
        .is_ok_and(|v| v["versions"]["lab"].is_string() || v["prompt"].is_string())
}

/// The checkpoint `choice` names, verified once: its folder and its state.
pub(crate) fn choose_checkpoint(
    run: &Path,
    choice: CheckpointChoice,
) -> Result<(PathBuf, checkpoint::TrainState)> {
    let list = checkpoint::list(run)?;
    // The step to take, or None for the newest that verifies.
    let step = match choice {
        CheckpointChoice::Latest => None,
        CheckpointChoice::Step(n) => Some(n),
        CheckpointChoice::Best => match lab_train::run::read_best(run) {
            Some((step, _)) => Some(step),
            None => bail!(
                "{} has no best.json (no validation yet): use --checkpoint latest",
                run.display()
            ),
        },
    };
    match step {
        None => newest_verified(run, list),
        Some(n) => match list.into_iter().find(|(s, _)| *s == n) {
            Some((_, dir)) => Ok((dir.clone(), checkpoint::verify(&dir)?)),
            None => bail!(
                "{} has no checkpoint of step {n} (retention keeps the last 5 and every 10th); pass --checkpoint latest",
                run.display()
            ),
        },
    }
}

/// The newest checkpoint that verifies; each newer one that does not is named on stderr, so
/// a reader knows the step it gets is not the run's last.
fn newest_verified(
    run: &Path,
    list: Vec<(u64, PathBuf)>,
) -> Result<(PathBuf, checkpoint::TrainState)> {
    let total = list.len();
    for (step, dir) in list {
        match checkpoint::verify(&dir) {
            Ok(state) => return Ok((dir, state)),
            Err(e) => eprintln!("warning: skipping the checkpoint of step {step}: {e:#}"),
        }
    }
    // An export names the run it came from: the folder to pass instead.
    if let (0, Ok(uri)) = (total, fs::read_to_string(run.join("run-uri.txt"))) {
        bail!(
            "{} is an export, not a run folder: pass the run it came from ({})",
            run.display(),
            uri.trim().trim_start_matches("file://")
        );
    }
    match (total, checkpoint::count_set_aside(run)) {
        (0, 0) => bail!(
            "{} holds no checkpoint: train it first (lab train --ckpt-dir {})",
            run.display(),
            run.display()
        ),
        (n, corrupt) => bail!(
            "{} holds no checkpoint that verifies ({} corrupt): restore a good step-N folder from a backup",
            run.display(),
            n + corrupt
        ),
    }
}

/// metrics.csv, long format `step,name,value`: every number of every row of metrics.jsonl.
pub fn write_metrics_csv(rows: &[MetricsRow], path: &Path) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["step", "name", "value"])?;
    for r in rows {
        let step = r.step.to_string();
        for (name, value) in r.values() {
            w.write_record([step.as_str(), name.as_str(), value.to_string().as_str()])?;
        }
    }
    let bytes = w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    lab_fsio::write_atomic(path, &bytes)
}

/// Reads metrics.csv back as (step, name, value) triples.
pub fn read_metrics_csv(path: &Path) -> Result<Vec<(u64, String, f64)>> {
    let mut r =
        csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for rec in r.records() {
        let rec = rec.with_context(|| format!("{}", path.display()))?;
        let field = |i: usize| rec.get(i).unwrap_or_default();
        out.push((
            field(0)
                .parse()
                .with_context(|| format!("{}: bad step {:?}", path.display(), field(0)))?,
            field(1).to_string(),
            field(2)
                .parse()
                .with_context(|| format!("{}: bad value {:?}", path.display(), field(2)))?,
        ));
    }
    Ok(out)
}

fn manifest(
    files: &RunFiles,
    cfg: &lab_config::LabConfig,
    step: u64,
    stage: &Path,
) -> Result<Manifest> {
    let read_json = |name: &str| -> Option<Value> {
        serde_json::from_str(&fs::read_to_string(stage.join(name)).ok()?).ok()
    };
    let budget = read_json("budget.json");
    let status = lab_run::Status::read(&files.dir).ok();
    // The rows of the shipped weights: at the checkpoint's step, never after it.
    let upto = || files.metrics.iter().rev().filter(|r| r.step <= step);
    let at = upto().next();
    let val = upto().find(|r| r.val_loss.is_some());
    let count = |kind: &str| files.events.iter().filter(|e| e.kind == kind).count() as u64;
    Ok(Manifest {
        name: cfg.name.clone(),
        seed: cfg.train.seed,
        versions: Versions::of_this_build(),
        config_sha256: cfg.sha256(),
        config: serde_json::to_value(cfg)?,
        hardware: Hardware::read(&files.dir).unwrap_or_else(|_| Hardware::detect("unknown")),
        data: read_json(lab_train::run::DATA).unwrap_or(Value::Null),
        cost: Cost {
            total_usd: budget.as_ref().and_then(|b| b["spent_usd"].as_f64()),
            provider: budget
                .as_ref()
                .and_then(|b| b["provider"].as_str().map(String::from)),
            rate_usd_per_hr: budget.as_ref().and_then(|b| b["rate_usd_per_hr"].as_f64()),
            cap_usd: cfg.budget.as_ref().map(|b| b.cap_usd),
            source: budget.as_ref().map(|_| "budget.json".to_string()),
        },
        started_utc: files.events.first().map(|e| e.time_utc.clone()),
        ended_utc: files.events.last().map(|e| e.time_utc.clone()),
        // The run's end as it ran (`--extend-to-steps` moves it past the config's).
        total_steps: status
            .as_ref()
            .map_or(cfg.train.total_steps as u64, |s| s.total_steps),
        state: status.map_or_else(|| "unknown".into(), |s| s.state),
        checkpoint_step: step,
        tokens: step as f64 * cfg.tokens_per_step() as f64,
        final_metrics: FinalMetrics {
            step: at.map_or(0, |r| r.step),
            train_loss: at.map(|r| r.loss),
            val_loss: val.and_then(|r| r.val_loss),
            val_step: val.map(|r| r.step),
            evaluation: val.map(|r| r.extra.clone()).unwrap_or_default(),
        },
        stability: BTreeMap::from([
            ("spikes_injected".into(), count("spike_injected")),
            ("spikes_detected".into(), count("spike_detected")),
            ("rollbacks".into(), count("rollback")),
        ]),
        artifacts: BTreeMap::new(),
    })
}

/// sha256 of every file in `dir` (the manifest itself excepted).
pub fn hash_files(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != MANIFEST && entry.file_type()?.is_file() {
            out.insert(name, lab_fsio::sha256_file(&entry.path())?);
        }
    }
    Ok(out)
}
