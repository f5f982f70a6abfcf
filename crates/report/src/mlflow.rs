//! MLflow's file store (`--mlflow-uri file:///…/mlruns`), written directly so `mlflow ui` and the
//! MLflow client show a run: experiment (the config's name), run (one per run folder, its id a
//! hash of the folder and start), params (the flattened config), metrics with step and
//! timestamp, tags, and the export's files as artifacts. Re-logging a run rewrites it.
//!
//! The layout follows what mlflow 3.x's FileStore reads (checked with the real client by
//! `scripts/reference/mlflow_check.py`): ids double-quoted in meta.yaml, status as an int,
//! times in integer milliseconds, one `"<ms> <value> <step>"` line per metric point, param and
//! tag files holding the value verbatim, `metrics/`, `params/`, `artifacts/` always present,
//! temporary files never inside those folders. mlflow ≥ 3 opens file stores only with
//! `MLFLOW_ALLOW_FILE_STORE=true`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::run_files::RunFiles;

/// Where a run was logged.
#[derive(Debug, Clone)]
pub struct Logged {
    pub experiment_id: String,
    pub run_id: String,
    pub run_dir: PathBuf,
}

/// MLflow's run states as meta.yaml stores them.
fn status_code(state: &str) -> (u8, bool) {
    match state {
        "running" => (1, false),
        "done" | "stopped_early" => (3, true),
        "interrupted" => (5, true),
        _ => (4, true),
    }
}

/// `file:///abs/path` or a plain path → the store's root folder.
pub fn store_root(uri: &str) -> Result<PathBuf> {
    let path = match uri.strip_prefix("file://") {
        Some(p) => p,
        // Not the URI itself: a tracking server's may hold credentials.
        None if uri.contains("://") => {
            let scheme = uri.split("://").next().unwrap_or_default();
            bail!("--mlflow-uri: only file:// stores are written by lab, not {scheme}:// (run `mlflow server` on top of one)")
        }
        None => uri,
    };
    Ok(std::path::absolute(path)?)
}

/// A double-quoted YAML scalar (also a valid JSON string).
fn yq(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20
                || (0x7f..=0x9f).contains(&(c as u32))
                || matches!(c as u32, 0x2028 | 0x2029 | 0xfffe | 0xffff) =>
            {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A key MLflow accepts: `[A-Za-z0-9_\-. /:]`, no empty, `.` or `..` segments.
fn key(k: &str) -> String {
    let k: String = k
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-. :".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if k.is_empty() || k == "." || k == ".." {
        "_".into()
    } else {
        k
    }
}

fn file_uri(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// Writes `text` to `path` through a temporary file in `tmp_dir` (never inside params/ etc.).
fn write(path: &Path, text: &str, tmp_dir: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = tmp_dir.join(format!("tmp-{}-{name}", std::process::id()));
    fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

fn now_ms() -> i64 {
    (lab_run::clock::now_unix() * 1000.0) as i64
}

fn ms(utc: &str) -> Option<i64> {
    lab_run::clock::parse_utc(utc)
        .ok()
        .map(|t| (t * 1000.0).round() as i64)
}

/// The store, with `.trash/` and the Default experiment as MLflow makes them.
fn open_store(root: &Path) -> Result<()> {
    fs::create_dir_all(root.join(".trash"))
        .with_context(|| format!("cannot create the MLflow store {}", root.display()))?;
    let default = root.join("0").join("meta.yaml");
    if !default.exists() {
        let meta = format!(
            "artifact_location: {}\ncreation_time: {t}\nexperiment_id: \"0\"\nlast_update_time: {t}\nlifecycle_stage: active\nname: \"Default\"\n",
            yq(&file_uri(&root.join("0"))),
            t = now_ms()
        );
        write(&default, &meta, root)?;
    }
    Ok(())
}

/// The experiment named `name` (found by its meta.yaml, or created with a stable id).
fn experiment(root: &Path, name: &str) -> Result<String> {
    for entry in fs::read_dir(root)? {
        let dir = entry?.path();
        let Ok(meta) = fs::read_to_string(dir.join("meta.yaml")) else {
            continue;
        };
        let found = meta.lines().find_map(|l| l.strip_prefix("name:")).map(|v| {
            let v = v.trim();
            serde_json::from_str::<String>(v).unwrap_or_else(|_| v.trim_matches('\'').to_string())
        });
        if found.as_deref() == Some(name) && !meta.contains("lifecycle_stage: deleted") {
            return Ok(dir
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned());
        }
    }
    // A stable 18-digit id from the name; the next free one on a collision.
    let digest = lab_fsio::sha256_bytes(name.as_bytes());
    let mut id =
        100_000_000_000_000_000 + u64::from_str_radix(&digest[..15], 16)? % 800_000_000_000_000_000;
    while root.join(id.to_string()).exists() {
        id += 1;
    }
    let dir = root.join(id.to_string());
    fs::create_dir_all(dir.join("tags"))?;
    let meta = format!(
        "artifact_location: {}\ncreation_time: {t}\nexperiment_id: \"{id}\"\nlast_update_time: {t}\nlifecycle_stage: active\nname: {}\n",
        yq(&file_uri(&dir)),
        yq(name),
        t = now_ms()
    );
    write(&dir.join("meta.yaml"), &meta, &dir)?;
    Ok(id.to_string())
}

/// The config as flat `section.key` params.
fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, v, out);
            }
        }
        Value::Null => {}
        Value::String(s) => {
            out.insert(prefix.into(), s.clone());
        }
        other => {
            out.insert(prefix.into(), other.to_string());
        }
    }
}

/// Creates the store at `uri` (as MLflow does on a run's start) where it is missing: a store
/// lab cannot write fails here, before a run's work, not once the run is over.
pub fn open(uri: &str) -> Result<PathBuf> {
    let root = store_root(uri)?;
    open_store(&root)?;
    Ok(root)
}

/// Logs the run folder of `files` (and, when given, the export folder's files as artifacts).
pub fn log_run(uri: &str, files: &RunFiles, artifacts: Option<&Path>) -> Result<Logged> {
    let root = open(uri)?;
    let Some(cfg) = &files.config else {
        bail!("{} has no config.toml to log", files.dir.display());
    };
    let exp = experiment(&root, &cfg.name)?;
    let run_path = std::path::absolute(&files.dir)?;
    let started = files
        .events
        .first()
        .map(|e| e.time_utc.clone())
        .unwrap_or_default();
    let run_id = lab_fsio::sha256_bytes(format!("{}\n{started}", run_path.display()).as_bytes())
        [..32]
        .to_string();
    let dir = root.join(&exp).join(&run_id);
    for sub in ["metrics", "params", "artifacts", "tags"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let state = lab_run::Status::read(&files.dir)
        .map(|s| s.state)
        .unwrap_or_else(|_| "running".into());
    let (status, ended) = status_code(&state);
    let start_ms = ms(&started).unwrap_or_else(now_ms);
    let end_ms = ended.then(|| {
        files
            .events
            .last()
            .and_then(|e| ms(&e.time_utc))
            .unwrap_or_else(now_ms)
    });
    let name = files
        .dir
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().into_owned());

    let mut params = BTreeMap::new();
    flatten("", &serde_json::to_value(cfg)?, &mut params);
    params.insert("config_sha256".into(), cfg.sha256());
    for (k, v) in &params {
        write(&dir.join("params").join(key(k)), v, &dir)?;
    }
    let user = std::env::var("USER").unwrap_or_else(|_| "lab".into());
    let tags = [
        ("mlflow.runName", name.clone()),
        ("mlflow.user", user.clone()),
        ("mlflow.source.name", "lab".into()),
        ("mlflow.source.type", "LOCAL".into()),
        ("mlflow.source.git.commit", env!("LAB_GIT_COMMIT").into()),
        (
            "mlflow.note.content",
            format!(
                "lab run {} of config {} (seed {}), state {state}",
                run_path.display(),
                cfg.name,
                cfg.train.seed
            ),
        ),
        ("lab.run_dir", run_path.display().to_string()),
        ("lab.state", state.clone()),
    ];
    for (k, v) in tags {
        write(&dir.join("tags").join(k), &v, &dir)?;
    }
    write_metrics(&dir, files)?;
    if let Some(src) = artifacts {
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                fs::copy(entry.path(), dir.join("artifacts").join(entry.file_name()))?;
            }
        }
    }
    let meta = format!(
        "artifact_uri: {}\nend_time: {}\nentry_point_name: \"\"\nexperiment_id: \"{exp}\"\nlifecycle_stage: active\nrun_id: \"{run_id}\"\nrun_name: {}\nrun_uuid: \"{run_id}\"\nsource_name: \"\"\nsource_type: 4\nsource_version: \"\"\nstart_time: {start_ms}\nstatus: {status}\ntags: []\nuser_id: {}\n",
        yq(&file_uri(&dir.join("artifacts"))),
        end_ms.map_or("null".into(), |t| t.to_string()),
        yq(&name),
        yq(&user)
    );
    write(&dir.join("meta.yaml"), &meta, &dir)?;
    Ok(Logged {
        experiment_id: exp,
        run_id,
        run_dir: dir,
    })
}

/// One file per metric, one `"<ms> <value> <step>"` line per logged point, written whole.
fn write_metrics(dir: &Path, files: &RunFiles) -> Result<()> {
    let mut by_name: BTreeMap<String, String> = BTreeMap::new();
    let fallback = now_ms();
    for row in &files.metrics {
        let t = row.time_utc.as_deref().and_then(ms).unwrap_or(fallback);
        for (name, value) in row.values() {
            by_name
                .entry(key(&name))
                .or_default()
                .push_str(&format!("{t} {value:?} {}\n", row.step));
        }
    }
    for (name, text) in by_name {
        write(&dir.join("metrics").join(name), &text, dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_strings_and_keys_are_what_mlflow_reads() {
        assert_eq!(yq("a \"b\"\n\u{2028}é"), "\"a \\\"b\\\"\\n\\u2028é\"");
        assert_eq!(key("val_loss.GARD"), "val_loss.GARD");
        assert_eq!(key("layers[0]=x"), "layers_0__x");
        assert_eq!(key(".."), "_");
        assert!(store_root("https://mlflow.example").is_err());
        assert!(store_root("file:///tmp/mlruns")
            .unwrap()
            .ends_with("mlruns"));
    }
}
