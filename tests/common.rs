//! Shared helpers for the end-to-end tests that drive the real `lab` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn lab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lab"))
}

/// A config small enough to train in tens of milliseconds per step on the GPT-2 vocabulary.
pub fn micro_config(dir: &Path) -> PathBuf {
    let path = dir.join("micro.toml");
    std::fs::write(
        &path,
        r#"name = "micro"
[model]
vocab_size = 50257
n_layer = 2
d_model = 32
n_head = 4
n_kv_head = 2
d_ff = 64
seq_len = 32
[train]
micro_batch = 4
grad_accum = 2
total_steps = 60
warmup_steps = 10
peak_lr = 3e-3
min_lr = 3e-4
log_every = 5
eval_every = 30
eval_batches = 2
ckpt_every = 10
"#,
    )
    .unwrap();
    path
}

/// The bundled corpus, prepared once under cargo's per-build temporary folder and reused by
/// every test (preparation is atomic, so concurrent test binaries are safe).
pub fn data_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tinyshakespeare-gpt2");
        lab_data::gpt2::ensure_tinyshakespeare(&dir).unwrap();
        dir
    })
    .clone()
}

/// `lab train` of `cfg` on the prepared `data` into the run folder `run`.
pub fn train_on(cfg: &Path, data: &Path, run: &Path) -> Command {
    let mut c = lab();
    c.arg("train")
        .arg("--config")
        .arg(cfg)
        .arg("--data-dir")
        .arg(data)
        .arg("--ckpt-dir")
        .arg(run);
    c
}

/// The events of `kind` in a run's events.jsonl (none when it has no such file).
pub fn events(run: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == kind)
        .collect()
}

/// Runs `lab` expecting exit 1 with exactly one line on stderr containing `needle`.
pub fn expect_one_line_error(cmd: &mut Command, needle: &str) {
    expect_one_line_exit(cmd, 1, needle)
}

/// A command line wrong whatever the files say (a flag that needs another): exit 2, as
/// clap's own usage errors, with the same one line.
pub fn expect_usage_error(cmd: &mut Command, needle: &str) {
    expect_one_line_exit(cmd, 2, needle)
}

fn expect_one_line_exit(cmd: &mut Command, code: i32, needle: &str) {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in {stderr}");
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?} failed with {:?}\nstdout:\n{}\nstderr:\n{}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every row of a run's metrics.jsonl.
pub fn metric_rows(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The `loss` of every line of metrics.jsonl, as exact bit patterns.
pub fn losses(run: &Path) -> Vec<(u64, u64)> {
    metric_rows(run)
        .iter()
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap().to_bits(),
            )
        })
        .collect()
}

pub fn sha256(path: &Path) -> String {
    lab_fsio::sha256_file(path).unwrap()
}

pub fn final_weights(run: &Path, step: u64) -> PathBuf {
    run.join(format!("step-{step:08}"))
        .join("model.safetensors")
}

/// A lab page running the micro config end to end (spike at step 30, metered budget), with a
/// DoD spec banded for it. Returns the page's path.
pub fn micro_lab(dir: &Path) -> PathBuf {
    micro_config(dir);
    let page = dir.join("page.toml");
    std::fs::write(
        &page,
        r#"name = "micro"
config = "micro.toml"
[run]
data = "tinyshakespeare"
run_dir = "runs/lab-micro"
export_dir = "experiments/micro/seed-42"
dod = "dod.toml"
inject_spike_at_step = 30
spike_batches = 5
[run.budget]
provider = "meter"
rate_usd_per_hr = 0.5
cap_usd = 1.0
poll_interval_s = 1
"#,
    )
    .unwrap();
    // The embedded lab's spec, banded for the micro model (val loss ~7.5 after 60 steps; its
    // spike stands 1.1× above the median of the 5-step logs before it).
    let spec = include_str!("../configs/dod/tiny-cpu.toml")
        .replace("name = \"tiny-cpu\"", "name = \"micro\"")
        .replace("min = 5.0", "min = 6.5")
        .replace("max = 5.7", "max = 8.5")
        .replace("min_ratio = 1.2", "min_ratio = 1.05");
    std::fs::write(dir.join("dod.toml"), spec).unwrap();
    page
}

/// The share of non-white pixels and the number of distinct colours of a PNG.
pub fn png_ink(path: &Path) -> (f64, usize) {
    let img = image::open(path).unwrap().to_rgb8();
    let colors: std::collections::HashSet<[u8; 3]> = img.pixels().map(|p| p.0).collect();
    let inked = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    (
        inked as f64 / (img.width() * img.height()) as f64,
        colors.len(),
    )
}

/// Polls `reached` while `child` runs. True once it holds; false if the child exited first.
/// No deadline: progress is the child's own (a hung child is the CI job's timeout to catch),
/// so the test never depends on how fast this machine is.
pub fn wait_until(child: &mut std::process::Child, reached: &dyn Fn() -> bool) -> bool {
    loop {
        if reached() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return reached();
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Lines in `path` (0 while it does not exist).
pub fn line_count(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// The SIGTERM drill's run: 40 steps, no periodic checkpoint (only the emergency one), every
/// step logged.
pub const SIGTERM_DRILL_FLAGS: [&str; 6] = [
    "--total-steps",
    "40",
    "--ckpt-every",
    "1000",
    "--log-every",
    "1",
];

/// Starts `cmd` (a `lab train` into `run`), sends it SIGTERM once metrics.jsonl has `rows`
/// rows, and returns its exit code.
pub fn sigterm_after_rows(cmd: &mut Command, run: &Path, rows: usize) -> Option<i32> {
    let mut child = cmd.stdout(std::process::Stdio::null()).spawn().unwrap();
    let metrics = run.join("metrics.jsonl");
    assert!(
        wait_until(&mut child, &|| line_count(&metrics) >= rows),
        "run ended early"
    );
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    child.wait().unwrap().code()
}

/// Damages `file` the way a bad disk or a cut-off copy would: one byte in its middle flipped.
pub fn flip_a_byte(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(file, bytes).unwrap();
}
