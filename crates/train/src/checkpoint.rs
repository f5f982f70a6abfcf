//! Checkpoints that survive anything.
//!
//! Layout of a run folder (`--ckpt-dir`):
//!
//! ```text
//! step-00000100/   model.safetensors, optimizer.safetensors, state.json
//! step-00000200/   …
//! latest           "step-00000200" (rewritten last, atomically)
//! ```
//!
//! A checkpoint is written into a hidden temporary folder, every file fsynced, then the folder
//! is renamed into place and `latest` updated: a crash at any instant leaves either the old
//! checkpoint set or the new one. `state.json` records the sha256 of every file; loading
//! verifies them, and resuming falls back to the newest checkpoint that verifies. `latest` is
//! for people and tools; resume itself verifies the folders newest first, so a crash between
//! the rename and the pointer update can never mislead it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lab_model::weights::{self, PendingTensor, TensorMap};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stream::DataCursor;

pub const LATEST: &str = "latest";
const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const STATE: &str = "state.json";

/// Everything besides tensors that a bit-exact resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps completed.
    pub step: u64,
    /// AdamW updates applied (bias-correction `t`).
    pub optimizer_updates: u64,
    /// Parameters that have taken another number of updates (frozen for the first steps by
    /// `train.freeze_non_embedding_steps`): their own bias-correction `t`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub param_updates: BTreeMap<String, u64>,
    /// The data cursor: training windows and spike samples consumed or skipped, and the
    /// ranges a rollback ruled out. The order itself is a pure function of (seed, index), so
    /// this is all the loader needs.
    #[serde(flatten)]
    pub cursor: DataCursor,
    /// Rollbacks so far in this run (bounded by `stability.max_rollbacks`).
    #[serde(default)]
    pub rollbacks: u32,
    /// State of the step policies (the spike detector's window …), by policy name.
    #[serde(default)]
    pub policies: BTreeMap<String, Value>,
    /// sha256 of the data's meta.json: a resume on other data is refused.
    #[serde(default)]
    pub data_sha256: String,
    /// The stability settings in force (a resume may change them; the change is an event).
    #[serde(default)]
    pub stability: Value,
    pub seed: u64,
    /// Every random choice is a stateless function of the seed and a position (init: seed ×
    /// parameter path; data: seed × window index), so no generator state needs saving.
    pub rng: String,
    /// Learning rate the next step will use.
    pub next_lr: f64,
    /// `--extend-to-steps` decisions: the run trains past its config's `total_steps`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedule_extensions: Vec<crate::schedule::Extension>,
    pub config_sha256: String,
    /// The hash resume checks: model and optimization recipe only (see
    /// `LabConfig::training_sha256`).
    pub training_sha256: String,
    pub created_utc: String,
    pub lab_version: String,
    /// sha256 of each file in the checkpoint folder (this file excepted).
    pub files: BTreeMap<String, String>,
}

/// A verified checkpoint in memory.
pub struct Loaded {
    pub dir: PathBuf,
    pub state: TrainState,
    pub model: TensorMap,
    pub optimizer: TensorMap,
}

pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

fn parse_step(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// Step folders present in `run_dir`, newest first. A step folder that an interrupted
/// replace left moved aside (`.step-N.old-PID`, with no `step-N`) is put back first.
pub fn list(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    if !run_dir.exists() {
        return Ok(out);
    }
    recover_moved_aside(run_dir)?;
    for entry in
        fs::read_dir(run_dir).with_context(|| format!("cannot list {}", run_dir.display()))?
    {
        let entry = entry?;
        if let Some(step) = parse_step(&entry.file_name().to_string_lossy()) {
            out.push((step, entry.path()));
        }
    }
    out.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
    Ok(out)
}

fn recover_moved_aside(run_dir: &Path) -> Result<()> {
    for entry in fs::read_dir(run_dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let Some(step_name) = name.strip_prefix('.').and_then(|n| n.split(".old-").next()) else {
            continue;
        };
        if name.contains(".old-") && parse_step(step_name).is_some() {
            let target = run_dir.join(step_name);
            if !target.exists() {
                fs::rename(run_dir.join(&name), &target)
                    .with_context(|| format!("cannot restore {}", target.display()))?;
            }
        }
    }
    Ok(())
}

/// Writes a checkpoint for `state.step` and points `latest` at it. Returns its folder.
pub fn save(
    run_dir: &Path,
    mut state: TrainState,
    model: &[PendingTensor<'_>],
    optimizer: &[PendingTensor<'_>],
) -> Result<PathBuf> {
    let name = step_dir_name(state.step);
    let tmp = run_dir.join(format!(".{name}.tmp-{}", std::process::id()));
    fresh_folder(&tmp)?;
    // Streamed one tensor at a time and hashed on the way out: no second copy of the state
    // in memory, no second pass over the files.
    let meta = step_meta(state.step);
    state.files.clear();
    let model_sha = weights::save_pending(&tmp.join(MODEL), model, &meta)?;
    state.files.insert(MODEL.into(), model_sha);
    let optimizer_sha = weights::save_pending(&tmp.join(OPTIMIZER), optimizer, &meta)?;
    state.files.insert(OPTIMIZER.into(), optimizer_sha);
    publish(run_dir, &tmp, &state)
}

/// A rank's part in writing a checkpoint of a data-parallel job with a sharded optimizer
/// state (ZeRO-1): `barrier` waits for every rank of the job.
pub struct Part<'a> {
    pub rank: usize,
    pub world: usize,
    pub barrier: &'a dyn Fn() -> Result<()>,
}

/// The file of rank `rank`'s optimizer shard (Hugging Face's sharded naming).
pub fn shard_name(rank: usize, world: usize) -> String {
    format!("optimizer-{rank:05}-of-{world:05}.safetensors")
}

/// Every rank writes its optimizer shard into one temporary folder; rank 0 adds the model and
/// state.json (with every shard's sha256) and publishes the folder as [`save`] does. No rank
/// ever holds the whole optimizer state. Returns the step folder.
pub fn save_sharded(
    run_dir: &Path,
    mut state: TrainState,
    model: &[PendingTensor<'_>],
    optimizer: &[PendingTensor<'_>],
    part: &Part,
) -> Result<PathBuf> {
    let name = step_dir_name(state.step);
    // One name every rank knows; the run folder's lock keeps other jobs out.
    let tmp = run_dir.join(format!(".{name}.tmp-sharded"));
    if part.rank == 0 {
        fresh_folder(&tmp)?;
    }
    (part.barrier)()?;
    let meta = step_meta(state.step);
    let shard = shard_name(part.rank, part.world);
    let sha = weights::save_pending(&tmp.join(&shard), optimizer, &meta)?;
    lab_fsio::write_atomic(&tmp.join(format!("{shard}.sha256")), sha.as_bytes())?;
    (part.barrier)()?;
    let final_dir = run_dir.join(&name);
    if part.rank == 0 {
        state.files.clear();
        let model_sha = weights::save_pending(&tmp.join(MODEL), model, &meta)?;
        state.files.insert(MODEL.into(), model_sha);
        for r in 0..part.world {
            let shard = shard_name(r, part.world);
            let sidecar = tmp.join(format!("{shard}.sha256"));
            let sha = fs::read_to_string(&sidecar)
                .with_context(|| format!("rank {r} left no {}", sidecar.display()))?;
            fs::remove_file(&sidecar)?;
            state.files.insert(shard, sha);
        }
        publish(run_dir, &tmp, &state)?;
    }
    (part.barrier)()?;
    Ok(final_dir)
}

fn step_meta(step: u64) -> BTreeMap<String, String> {
    BTreeMap::from([("step".to_string(), step.to_string())])
}

fn fresh_folder(tmp: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(tmp);
    fs::create_dir_all(tmp).with_context(|| format!("cannot create {}", tmp.display()))
}

/// Writes state.json into `tmp`, renames `tmp` to the step folder and points `latest` at it.
fn publish(run_dir: &Path, tmp: &Path, state: &TrainState) -> Result<PathBuf> {
    let name = step_dir_name(state.step);
    let final_dir = run_dir.join(&name);
    let json = serde_json::to_string_pretty(state)? + "\n";
    lab_fsio::write_atomic(&tmp.join(STATE), json.as_bytes())?;

    // A checkpoint of this step from an earlier attempt is replaced in one step (or moved
    // aside, where [`list`] puts it back): a crash leaves one of them under a loadable name.
    lab_fsio::replace_dir(tmp, &final_dir)?;
    lab_fsio::write_atomic(&run_dir.join(LATEST), format!("{name}\n").as_bytes())?;
    Ok(final_dir)
}

/// Which optimizer moments (`m.<path>`, `v.<path>`) a load keeps: [`every`] one, or a ZeRO-1
/// rank's share.
pub type Keep<'a> = &'a dyn Fn(&str) -> bool;

pub fn every(_: &str) -> bool {
    true
}

/// The optimizer files a checkpoint lists: `optimizer.safetensors` (one process, or plain
/// data parallelism) or one shard per rank.
fn optimizer_files(state: &TrainState) -> Vec<&String> {
    state
        .files
        .keys()
        .filter(|f| f.starts_with("optimizer"))
        .collect()
}

/// Loads and verifies one checkpoint folder.
pub fn load(dir: &Path, keep: Keep) -> Result<Loaded> {
    let state = verify(dir)?;
    let (model, _) = weights::load_safetensors(&dir.join(MODEL))?;
    let mut optimizer = TensorMap::new();
    for file in optimizer_files(&state) {
        optimizer.extend(weights::load_safetensors_where(&dir.join(file), keep)?.0);
    }
    Ok(Loaded {
        dir: dir.to_path_buf(),
        state,
        model,
        optimizer,
    })
}

/// The model weights file of a checkpoint folder.
pub fn model_file(dir: &Path) -> PathBuf {
    dir.join(MODEL)
}

/// Reads a checkpoint's state.json and checks every file against its sha256, without loading
/// the tensors.
pub fn verify(dir: &Path) -> Result<TrainState> {
    let state_path = dir.join(STATE);
    let text = fs::read_to_string(&state_path)
        .with_context(|| format!("cannot read {}", state_path.display()))?;
    let state: TrainState = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid state.json", state_path.display()))?;
    let dir_name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    if dir_name.as_deref().and_then(parse_step) != Some(state.step) {
        bail!(
            "{} says step {}, which does not match its folder name",
            state_path.display(),
            state.step
        );
    }
    let shards = optimizer_files(&state);
    let whole = shards.len() == 1 && *shards[0] == OPTIMIZER;
    if shards.is_empty()
        || !whole
            && (0..shards.len()).any(|r| !state.files.contains_key(&shard_name(r, shards.len())))
    {
        bail!(
            "{} lists neither {OPTIMIZER} nor a complete set of optimizer shards",
            state_path.display()
        );
    }
    if !state.files.contains_key(MODEL) {
        bail!("{} lists no sha256 for {MODEL}", state_path.display());
    }
    for (file, expected) in &state.files {
        let actual = lab_fsio::sha256_file(&dir.join(file))?;
        if &actual != expected {
            bail!(
                "{} fails its sha256 check (corrupt or partly written)",
                dir.join(file).display()
            );
        }
    }
    Ok(state)
}

/// The newest checkpoint that verifies, with a warning for each newer one skipped. Skipped
/// folders are renamed `step-N.corrupt` (kept for inspection, out of retention's and the next
/// resume's way).
pub fn load_latest_good(
    run_dir: &Path,
    keep: Keep,
    warn: &mut dyn FnMut(String),
) -> Result<Option<Loaded>> {
    load_newest_good_at_most(run_dir, u64::MAX, keep, warn)
}

/// Where a corrupt checkpoint folder is set aside: `step-N.corrupt`, or `step-N.corrupt.K`
/// when an earlier copy of that step was set aside already.
fn quarantine_name(dir: &Path) -> PathBuf {
    let suffixed = |suffix: String| {
        let mut name = dir.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    std::iter::once(".corrupt".to_string())
        .chain((2..).map(|k| format!(".corrupt.{k}")))
        .map(suffixed)
        .find(|p| !p.exists())
        .expect("an unused name")
}

/// How many checkpoint folders of `run_dir` a resume or a rollback set aside as corrupt
/// (`step-N.corrupt…`).
pub fn count_set_aside(run_dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(run_dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((step, copy)) = name.split_once(".corrupt") else {
                return false;
            };
            parse_step(step).is_some() && (copy.is_empty() || copy.starts_with('.'))
        })
        .count()
}

/// As [`load_latest_good`], among the checkpoints of at most `max_step` steps (a rollback's
/// target: the last good state before a spike).
pub fn load_newest_good_at_most(
    run_dir: &Path,
    max_step: u64,
    keep: Keep,
    warn: &mut dyn FnMut(String),
) -> Result<Option<Loaded>> {
    for (_, dir) in list(run_dir)?.into_iter().filter(|(s, _)| *s <= max_step) {
        match load(&dir, keep) {
            Ok(loaded) => return Ok(Some(loaded)),
            Err(e) => {
                let quarantine = quarantine_name(&dir);
                fs::rename(&dir, &quarantine)
                    .with_context(|| format!("cannot set aside {}", dir.display()))?;
                warn(format!(
                    "skipping checkpoint {}: {e:#} (kept as {})",
                    dir.display(),
                    Path::new(&quarantine).display()
                ));
            }
        }
    }
    Ok(None)
}

/// Deletes the checkpoints of more than `step` steps: after a rollback they belong to an
/// abandoned timeline, which a later resume must never pick up.
pub fn remove_after(run_dir: &Path, step: u64) -> Result<()> {
    for (s, dir) in list(run_dir)? {
        if s > step {
            fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
        }
    }
    Ok(())
}

/// Retention: keep the newest `keep_last` checkpoints plus every checkpoint whose step is a
/// multiple of `ckpt_every × keep_every`; delete the rest and stale temporary folders. The
/// checkpoints of `protect` (the one just written, a rollback target, the best) are never
/// deleted.
pub fn prune(
    run_dir: &Path,
    protect: &[u64],
    keep_last: usize,
    ckpt_every: usize,
    keep_every: usize,
) -> Result<()> {
    let milestone = (ckpt_every * keep_every) as u64;
    for (i, (step, dir)) in list(run_dir)?.into_iter().enumerate() {
        let keep = protect.contains(&step)
            || i < keep_last
            || (milestone > 0 && step.is_multiple_of(milestone));
        if !keep {
            fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
        }
    }
    for entry in fs::read_dir(run_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = format!(".tmp-{}", std::process::id());
        // A moved-aside folder whose step folder is back in place is stale too.
        let temporary = name.contains(".tmp-")
            || (name.contains(".old-")
                && name
                    .strip_prefix('.')
                    .and_then(|n| n.split(".old-").next())
                    .is_some_and(|n| run_dir.join(n).exists()));
        if name.starts_with(".step-") && temporary && !name.ends_with(&ours) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lab_model::weights::{pending_from_map, HostTensor};

    fn state(step: u64) -> TrainState {
        TrainState {
            step,
            optimizer_updates: step,
            param_updates: Default::default(),
            cursor: DataCursor {
                samples_consumed: step * 4,
                ..Default::default()
            },
            rollbacks: 0,
            policies: BTreeMap::new(),
            data_sha256: String::new(),
            stability: Value::Null,
            seed: 42,
            rng: "stateless".into(),
            next_lr: 1e-3,
            schedule_extensions: Vec::new(),
            config_sha256: "abc".into(),
            training_sha256: "def".into(),
            created_utc: "now".into(),
            lab_version: "0".into(),
            files: BTreeMap::new(),
        }
    }

    /// A checkpoint of step `step` whose model and optimizer tensors are filled with `m`, `o`.
    fn save_maps(dir: &Path, step: u64, m: f32, o: f32) -> Result<PathBuf> {
        let (m, o) = (tensors(m), tensors(o));
        let (m, o) = (pending_from_map(&m), pending_from_map(&o));
        save(dir, state(step), &m, &o)
    }

    fn tensors(x: f32) -> TensorMap {
        TensorMap::from([(
            "w".to_string(),
            HostTensor {
                shape: vec![2],
                data: vec![x, x + 1.0],
            },
        )])
    }

    #[test]
    fn save_load_and_fall_back_past_a_corrupt_newest() {
        let dir = tempfile::tempdir().unwrap();
        save_maps(dir.path(), 10, 1.0, 2.0).unwrap();
        save_maps(dir.path(), 20, 3.0, 4.0).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join(LATEST)).unwrap().trim(),
            "step-00000020"
        );
        let l = load(&dir.path().join("step-00000020"), &every).unwrap();
        assert_eq!(l.model, tensors(3.0));
        assert_eq!(l.state.cursor.samples_consumed, 80);

        // Flip one byte of the newest model file: resume must skip it, with a warning.
        let f = dir.path().join("step-00000020").join(MODEL);
        let mut bytes = fs::read(&f).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&f, bytes).unwrap();
        let mut warnings = Vec::new();
        let l = load_latest_good(dir.path(), &every, &mut |w| warnings.push(w))
            .unwrap()
            .unwrap();
        assert_eq!(l.state.step, 10);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("sha256"), "{}", warnings[0]);
        assert!(dir.path().join("step-00000020.corrupt").exists());
        assert_eq!(list(dir.path()).unwrap().len(), 1);

        // Retention never deletes the checkpoint just written, even with keep_last = 0.
        prune(dir.path(), &[10], 0, 10, 10).unwrap();
        assert_eq!(list(dir.path()).unwrap().len(), 1);

        // A state.json that disagrees with its folder is refused.
        let moved = dir.path().join("step-00000011");
        fs::rename(dir.path().join("step-00000010"), &moved).unwrap();
        assert!(format!("{:#}", load(&moved, &every).err().unwrap()).contains("folder name"));
    }

    #[test]
    fn retention_keeps_last_five_and_every_tenth() {
        let dir = tempfile::tempdir().unwrap();
        for step in (10..=250).step_by(10) {
            save_maps(dir.path(), step, 0.0, 0.0).unwrap();
            prune(dir.path(), &[step], 5, 10, 10).unwrap();
        }
        let mut kept: Vec<u64> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        kept.sort();
        assert_eq!(kept, vec![100, 200, 210, 220, 230, 240, 250]);
    }

    #[test]
    fn stale_temp_folders_are_ignored_and_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(".step-00000030.tmp-999999")).unwrap();
        save_maps(dir.path(), 10, 0.0, 0.0).unwrap();
        assert_eq!(list(dir.path()).unwrap().len(), 1);
        prune(dir.path(), &[10], 5, 10, 10).unwrap();
        assert!(!dir.path().join(".step-00000030.tmp-999999").exists());
    }

    #[test]
    fn a_step_saved_again_replaces_the_earlier_copy_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        save_maps(dir.path(), 10, 1.0, 2.0).unwrap();
        save_maps(dir.path(), 10, 3.0, 4.0).unwrap();
        let loaded = load(&dir.path().join("step-00000010"), &every).unwrap();
        assert_eq!(loaded.model, tensors(3.0));
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    }

    #[test]
    fn a_step_folder_moved_aside_by_an_interrupted_replace_is_put_back() {
        let dir = tempfile::tempdir().unwrap();
        save_maps(dir.path(), 10, 1.0, 2.0).unwrap();
        // A kill between moving the old copy aside and renaming the new one in.
        fs::rename(
            dir.path().join("step-00000010"),
            dir.path().join(".step-00000010.old-4242"),
        )
        .unwrap();
        let steps: Vec<u64> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(steps, vec![10]);
        assert_eq!(
            load(&dir.path().join("step-00000010"), &every)
                .unwrap()
                .model,
            tensors(1.0)
        );
    }

    /// Two ranks (threads meeting at a real barrier) write their shards of one checkpoint;
    /// it verifies as one folder, loads whole or as one rank's share, and a missing shard is
    /// refused.
    #[test]
    fn a_sharded_checkpoint_is_one_folder_that_loads_whole_or_by_share() {
        let dir = tempfile::tempdir().unwrap();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let shard = |r: usize| {
            TensorMap::from([
                (
                    format!("m.p{r}"),
                    HostTensor {
                        shape: vec![2],
                        data: vec![r as f32, 1.0],
                    },
                ),
                (
                    format!("v.p{r}"),
                    HostTensor {
                        shape: vec![2],
                        data: vec![r as f32, 2.0],
                    },
                ),
            ])
        };
        std::thread::scope(|s| {
            for r in 0..2 {
                let (run_dir, barrier, opt) = (dir.path(), barrier.clone(), shard(r));
                s.spawn(move || {
                    let wait = || -> Result<()> {
                        barrier.wait();
                        Ok(())
                    };
                    let part = Part {
                        rank: r,
                        world: 2,
                        barrier: &wait,
                    };
                    let model = tensors(5.0);
                    let model = if r == 0 {
                        pending_from_map(&model)
                    } else {
                        Vec::new()
                    };
                    save_sharded(run_dir, state(30), &model, &pending_from_map(&opt), &part)
                        .unwrap();
                });
            }
        });
        let step = dir.path().join("step-00000030");
        let all = load(&step, &every).unwrap();
        assert_eq!(all.model, tensors(5.0));
        let mut want = shard(0);
        want.extend(shard(1));
        assert_eq!(all.optimizer, want);
        assert_eq!(all.state.files.len(), 3, "{:?}", all.state.files.keys());
        let mine = load(&step, &|name: &str| name.ends_with("p1")).unwrap();
        assert_eq!(mine.optimizer, shard(1));
        assert!(fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("tmp")));

        // A state.json that lost a shard's entry (and its file) does not verify.
        fs::remove_file(step.join(shard_name(1, 2))).unwrap();
        let text = fs::read_to_string(step.join(STATE)).unwrap();
        let mut st: TrainState = serde_json::from_str(&text).unwrap();
        st.files.remove(&shard_name(1, 2));
        fs::write(step.join(STATE), serde_json::to_string(&st).unwrap()).unwrap();
        let e = verify(&step).unwrap_err();
        assert!(
            format!("{e:#}").contains("complete set of optimizer shards"),
            "{e:#}"
        );
    }
}
