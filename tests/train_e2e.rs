//! `lab train` end to end on the real binary: determinism, crash-safe resume, signals, and
//! one-line errors for user mistakes.

use std::path::Path;
use std::process::Command;

use crate::common::*;

fn train(cfg: &Path, run: &Path) -> Command {
    train_on(cfg, &data_dir(), run)
}

#[test]
fn same_seed_is_bit_identical_and_another_seed_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let (a, b, c) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
    );
    run_ok(&mut train(&cfg, &a));
    run_ok(&mut train(&cfg, &b));
    run_ok(train(&cfg, &c).args(["--seed", "7"]));

    let la = losses(&a);
    assert_eq!(la.len(), 12, "a loss every 5 of 60 steps");
    assert_eq!(la, losses(&b));
    assert_ne!(la, losses(&c));
    let (wa, wb, wc) = (
        sha256(&final_weights(&a, 60)),
        sha256(&final_weights(&b, 60)),
        sha256(&final_weights(&c, 60)),
    );
    assert_eq!(wa, wb);
    assert_ne!(wa, wc);
    // It learned something: the loss fell from ~ln(50257).
    let first = f64::from_bits(la[0].1);
    let last = f64::from_bits(la.last().unwrap().1);
    assert!(first > 9.5 && last < first - 2.0, "loss {first} → {last}");
}

#[test]
fn kill_9_at_a_random_step_then_resume_matches_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let reference = tmp.path().join("reference");
    run_ok(train(&cfg, &reference).args(["--ckpt-every", "5"]));

    // Kill -9 once the run has checkpointed at least step `target` (10..=45, varies per run).
    let target = {
        use std::hash::{BuildHasher, RandomState};
        10 + RandomState::new().hash_one(std::process::id()) % 36
    };
    let run = tmp.path().join("killed");
    let mut child = train(&cfg, &run)
        .args(["--ckpt-every", "5"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let checkpointed = || {
        let latest = std::fs::read_to_string(run.join("latest")).unwrap_or_default();
        let step: u64 = latest
            .trim()
            .trim_start_matches("step-")
            .parse()
            .unwrap_or(0);
        step >= target
    };
    assert!(
        wait_until(&mut child, &checkpointed),
        "run ended before step {target}"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!final_weights(&run, 60).exists(), "killed before the end");

    run_ok(train(&cfg, &run).args(["--ckpt-every", "5", "--resume-from-latest"]));
    assert_eq!(
        sha256(&final_weights(&run, 60)),
        sha256(&final_weights(&reference, 60)),
        "killed at ≥ step {target}"
    );
    assert_eq!(losses(&run), losses(&reference));
}

#[test]
fn sigterm_writes_an_emergency_checkpoint_exits_143_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let flags = SIGTERM_DRILL_FLAGS;
    let reference = tmp.path().join("reference");
    run_ok(train(&cfg, &reference).args(flags));

    let run = tmp.path().join("run");
    let code = sigterm_after_rows(train(&cfg, &run).args(flags), &run, 3);
    assert_eq!(code, Some(143));

    let latest = std::fs::read_to_string(run.join("latest")).unwrap();
    let step: u64 = latest.trim().trim_start_matches("step-").parse().unwrap();
    assert!(
        (3..40).contains(&step),
        "emergency checkpoint at step {step}"
    );
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert!(
        events.contains("\"interrupted\"") && events.contains("\"signal\":15"),
        "{events}"
    );
    assert!(events.contains("\"preemption\""), "{events}");

    // The emergency checkpoint resumes to the same final weights as the uninterrupted run.
    run_ok(train(&cfg, &run).args(flags).arg("--resume-from-latest"));
    assert_eq!(
        sha256(&final_weights(&run, 40)),
        sha256(&final_weights(&reference, 40))
    );
}

fn no_checkpoint(run: &Path) -> bool {
    !run.exists()
        || std::fs::read_dir(run).unwrap().all(|e| {
            !e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("step-")
        })
}

#[test]
fn user_mistakes_exit_1_with_one_line_and_write_no_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");

    // A bad config field.
    let bad = tmp.path().join("bad.toml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("n_kv_head = 2", "n_kv_head = 3"),
    )
    .unwrap();
    expect_one_line_error(
        train(&bad, &run).arg("--total-steps").arg("5"),
        "model.n_kv_head",
    );
    let typo = tmp.path().join("typo.toml");
    std::fs::write(
        &typo,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("d_ff = 64", "dff = 64"),
    )
    .unwrap();
    expect_one_line_error(&mut train(&typo, &run), "dff");
    expect_one_line_error(
        &mut train(&tmp.path().join("missing.toml"), &run),
        "missing.toml",
    );

    // A seed past TOML's integers (the run folder records its config): refused up front.
    expect_one_line_error(
        train(&cfg, &run).args(["--seed", "9223372036854775808"]),
        "train.seed = 9223372036854775808 is past TOML's largest integer",
    );
    // A tracking store lab cannot write: a usage error before any step, credentials unshown.
    let uri = "http://user:hunter2@mlflow.example:5000";
    let out = train(&cfg, &run)
        .args(["--mlflow-uri", uri])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("only file:// stores are written by lab, not http://")
            && !stderr.contains("hunter2")
            && stderr.trim_end().lines().count() == 1,
        "{stderr}"
    );
    assert!(!run.exists(), "a refused start made the run folder");
    // A file:// store that cannot be made (under a file): an error before any step too.
    let blocker = tmp.path().join("not-a-folder");
    std::fs::write(&blocker, "").unwrap();
    let uri = format!("file://{}/mlruns", blocker.display());
    expect_one_line_error(
        train(&cfg, &run).args(["--mlflow-uri", &uri]),
        "cannot create the MLflow store",
    );
    assert!(!run.exists(), "a refused start made the run folder");

    // A missing data dir.
    expect_one_line_error(
        lab()
            .args(["train", "--data-dir", "/nonexistent/data", "--ckpt-dir"])
            .arg(&run)
            .arg("--config")
            .arg(&cfg),
        "/nonexistent/data",
    );

    // A truncated .bin.
    let data = tmp.path().join("data");
    lab_data::gpt2::ensure_tinyshakespeare(&data).unwrap();
    let train_bin = data.join("train.bin");
    let bytes = std::fs::read(&train_bin).unwrap();
    std::fs::write(&train_bin, &bytes[..bytes.len() - 100]).unwrap();
    let mut c = lab();
    c.args(["train", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .arg("--ckpt-dir")
        .arg(&run);
    expect_one_line_error(&mut c, "truncated");

    // A byte changed in place (the size still matches): refused before any step.
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    std::fs::write(&train_bin, &flipped).unwrap();
    expect_one_line_error(&mut c, "train.bin: sha256");

    // Token ids ≥ vocab (a .bin written with another tokenizer), consistent with its meta.
    let ids: Vec<u8> = (0..bytes.len() / 2)
        .flat_map(|_| 60_000u16.to_le_bytes())
        .collect();
    std::fs::write(&train_bin, &ids).unwrap();
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("meta.json")).unwrap()).unwrap();
    meta["files"]["train.bin"]["sha256"] = sha256(&train_bin).into();
    std::fs::write(data.join("meta.json"), meta.to_string()).unwrap();
    expect_one_line_error(&mut c, ">= vocab_size 50257");

    // An unwritable run folder (a path through a regular file).
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    expect_one_line_error(&mut train(&cfg, &file.join("run")), "--ckpt-dir");

    // Counting flags at 0 are usage errors naming the flag.
    for flag in [
        "--total-steps",
        "--ckpt-every",
        "--eval-every",
        "--log-every",
    ] {
        expect_usage_error(
            train(&cfg, &run).args([flag, "0"]),
            &format!("{flag} 0: give at least 1"),
        );
    }

    // Flags that need another flag are a usage error (exit 2), as clap's own.
    expect_usage_error(
        train(&cfg, &run).args(["--spike-batches", "3"]),
        "--spike-batches and --spike-kind need --inject-spike-at-step",
    );
    expect_usage_error(
        train(&cfg, &run).arg("--dry-run-budget"),
        "--dry-run-budget needs a budget: pass --budget-cap-usd",
    );

    assert!(no_checkpoint(&run), "a failed start left a checkpoint");

    // Restarting over an existing run without --resume-from-latest is refused, not overwritten.
    run_ok(train(&cfg, &run).args(["--total-steps", "10"]));
    let before = sha256(&final_weights(&run, 10));
    expect_one_line_error(
        train(&cfg, &run).args(["--total-steps", "10"]),
        "--resume-from-latest",
    );
    assert_eq!(sha256(&final_weights(&run, 10)), before);
}

#[test]
fn resume_skips_a_corrupt_newest_checkpoint_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    let flags = ["--total-steps", "20", "--ckpt-every", "5"];
    run_ok(train(&cfg, &run).args(flags));
    let good = sha256(&final_weights(&run, 20));

    // Damage the newest checkpoint: resuming must fall back to step 15 and redo steps 16..20.
    flip_a_byte(&final_weights(&run, 20));

    let out = run_ok(train(&cfg, &run).args(flags).arg("--resume-from-latest"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: skipping checkpoint") && stderr.contains("step-00000020"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("(step 15)"));
    assert_eq!(sha256(&final_weights(&run, 20)), good);

    // Readers of the run take the newest that verifies too, and say which one they skipped.
    flip_a_byte(&final_weights(&run, 20));
    let export = tmp.path().join("export");
    let out = run_ok(
        lab()
            .args(["export", "--run"])
            .arg(&run)
            .arg("--output")
            .arg(&export),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("skipping the checkpoint of step 20"),
        "{stderr}"
    );
    let manifest = std::fs::read_to_string(export.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"checkpoint_step\": 15"), "{manifest}");

    // With every checkpoint damaged, a resume refuses rather than start the run over, and
    // again on the next attempt (a supervisor's restart), when they are set aside.
    for step in [5, 10, 15] {
        flip_a_byte(&final_weights(&run, step));
    }
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let out = train(&cfg, &run)
        .args(flags)
        .arg("--resume-from-latest")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(
        last.starts_with("error: ") && last.contains("no checkpoint in"),
        "{stderr}"
    );
    // Step 20 was set aside once already: its second copy goes beside the first.
    assert!(stderr.contains("step-00000020.corrupt.2"), "{stderr}");
    expect_one_line_error(
        train(&cfg, &run).args(flags).arg("--resume-from-latest"),
        "no checkpoint in",
    );
    // Nor does a fresh start there (`lab run` starts fresh when it sees no checkpoint).
    expect_one_line_error(train(&cfg, &run).args(flags), "set aside as corrupt");
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics);
}

#[test]
fn a_closed_stdout_does_not_stop_training() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    let mut child = train(&cfg, &run)
        .args(["--total-steps", "20", "--log-every", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the first line, as `lab train … | head -0` would.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(final_weights(&run, 20).is_file());
}

#[test]
fn a_diverging_run_stops_with_exit_5_and_keeps_its_last_good_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("hot.toml");
    // An absurd learning rate with clipping off: the loss overflows within a few steps.
    let text = std::fs::read_to_string(micro_config(tmp.path()))
        .unwrap()
        .replace("peak_lr = 3e-3", "peak_lr = 1e6\ngrad_clip = 0.0")
        .replace("warmup_steps = 10", "warmup_steps = 1");
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let out = train(&cfg, &run)
        .args(["--log-every", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("stability policy"), "{stderr}");

    // The kept checkpoint holds finite weights: no non-finite update was ever applied.
    let latest = std::fs::read_to_string(run.join("latest")).unwrap();
    let weights = run.join(latest.trim()).join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert!(bytes[8 + header..]
        .chunks_exact(4)
        .all(|b| f32::from_le_bytes(b.try_into().unwrap()).is_finite()));
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert!(
        events.contains("\"nonfinite\"") && events.contains("\"rollback\""),
        "{events}"
    );
    let status = std::fs::read_to_string(run.join("status.json")).unwrap();
    assert!(status.contains("\"unstable\""), "{status}");
    // Each rollback writes the state it restores; the stop after the last one keeps that
    // checkpoint rather than writing it again.
    let (checkpoints, rollbacks) = (
        crate::common::events(&run, "checkpoint").len(),
        crate::common::events(&run, "rollback").len(),
    );
    assert!(
        rollbacks > 0 && checkpoints == rollbacks,
        "{checkpoints} checkpoints, {rollbacks} rollbacks"
    );
}

fn status(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap()
}

#[test]
fn a_resume_says_it_runs_at_once_logs_a_checkpoint_a_kill_left_unlogged_and_adds_nothing_to_a_done_run(
) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    run_ok(train(&cfg, &run).args(["--total-steps", "20"]));
    let done = status(&run);
    assert!(done["loss"].as_f64().is_some(), "{done}");
    // A kill between publishing step 20's checkpoint and logging it.
    let path = run.join("events.jsonl");
    let kept: String = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| !(l.contains("\"kind\":\"checkpoint\"") && l.contains("\"step\":20,")))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, kept).unwrap();
    assert!(events(&run, "checkpoint").iter().all(|e| e["step"] != 20));

    // Resuming the finished run: the checkpoint is logged, the status and the rest unchanged.
    run_ok(train(&cfg, &run).args(["--total-steps", "20", "--resume-from-latest"]));
    let at_20 = |kind: &str| -> Vec<serde_json::Value> {
        events(&run, kind)
            .into_iter()
            .filter(|e| e["step"] == 20)
            .collect()
    };
    let logged = at_20("checkpoint");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["logged_on_resume"], true);
    assert_eq!(at_20("done").len(), 1, "done once");
    let again = status(&run);
    for field in ["state", "step", "loss", "val_loss", "tokens_per_s", "mfu"] {
        assert_eq!(again[field], done[field], "{field}: {again} against {done}");
    }

    // A resume that trains on says so before its first row (the first row here is step 40's).
    let mut child = train(&cfg, &run)
        .args([
            "--total-steps",
            "20",
            "--resume-from-latest",
            "--extend-to-steps",
            "40",
        ])
        .args(["--log-every", "1000", "--eval-every", "1000"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as u64;
    let first_seen = std::cell::RefCell::new(None);
    let by_child = || {
        let st: serde_json::Value = std::fs::read_to_string(run.join("status.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let mine = st["pid"].as_u64() == Some(pid);
        if mine {
            first_seen.borrow_mut().get_or_insert(st);
        }
        mine
    };
    assert!(
        wait_until(&mut child, &by_child),
        "no status from the resumed run"
    );
    assert!(child.wait().unwrap().success());
    let first = first_seen.into_inner().unwrap();
    assert_eq!(
        (first["state"].as_str(), first["step"].as_u64()),
        (Some("running"), Some(20)),
        "{first}"
    );
}

#[test]
fn a_second_trainer_on_the_same_run_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    let mut first = train(&cfg, &run)
        .args(["--total-steps", "100000", "--log-every", "1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let metrics = run.join("metrics.jsonl");
    assert!(
        wait_until(&mut first, &|| line_count(&metrics) >= 1),
        "run ended early"
    );
    expect_one_line_error(
        train(&cfg, &run).args(["--total-steps", "100000", "--resume-from-latest"]),
        "in use by another lab train",
    );
    first.kill().unwrap();
    first.wait().unwrap();
}

#[test]
fn resuming_on_other_data_is_refused_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    run_ok(train(&cfg, &run).args(["--total-steps", "10"]));
    // The run folder says what it trained on.
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("name = \"micro\"") && config.contains("total_steps = 10"));
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("data.json")).unwrap()).unwrap();
    assert_eq!(data["meta_sha256"], sha256(&data_dir().join("meta.json")));

    let before = (
        std::fs::read(run.join("config.toml")).unwrap(),
        std::fs::read(run.join("data.json")).unwrap(),
    );
    let other = tmp.path().join("other-data");
    let text: String = lab_data::TINYSHAKESPEARE.chars().take(200_000).collect();
    lab_data::gpt2::prepare_text(&text, "a slice", 0.9, &other).unwrap();
    let mut c = lab();
    c.args(["train", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&other)
        .arg("--ckpt-dir")
        .arg(&run)
        .args(["--total-steps", "10", "--resume-from-latest"]);
    expect_one_line_error(&mut c, "trained on other data");
    // The refused resume left the run's record alone.
    let after = (
        std::fs::read(run.join("config.toml")).unwrap(),
        std::fs::read(run.join("data.json")).unwrap(),
    );
    assert!(
        before == after,
        "a refused resume rewrote config.toml or data.json"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else if e.file_type().unwrap().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path()).unwrap(), &target).unwrap();
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_finished_run_extends_reproducibly_and_a_plain_resume_with_more_steps_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let (run, twin) = (tmp.path().join("run"), tmp.path().join("twin"));
    run_ok(train(&cfg, &run).args(["--total-steps", "20"]));
    copy_dir(&run, &twin);

    // Changing the plan on a plain resume breaks a bit-exact resume: refused, naming the flag.
    let mut c = train(&cfg, &run);
    c.args(["--total-steps", "30", "--resume-from-latest"]);
    expect_one_line_error(
        &mut c,
        "keep train.total_steps = 20 (drop --total-steps 30) and add --extend-to-steps 30",
    );

    let extend = |dir: &Path| {
        run_ok(train(&cfg, dir).args([
            "--total-steps",
            "20",
            "--resume-from-latest",
            "--extend-to-steps",
            "30",
        ]));
    };
    extend(&run);
    // Durable at once: the checkpoint it extended from now carries the extension.
    let at20: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("step-00000020/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(at20["schedule_extensions"][0]["to_steps"], 30);
    extend(&twin);
    assert_eq!(
        sha256(&final_weights(&run, 30)),
        sha256(&final_weights(&twin, 30)),
        "the same extension gives the same weights"
    );

    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    let ext: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["kind"] == "schedule_extended")
        .collect();
    assert_eq!(ext.len(), 1, "{events}");
    assert_eq!(
        (
            ext[0]["step"].as_u64(),
            ext[0]["from_steps"].as_u64(),
            ext[0]["to_steps"].as_u64()
        ),
        (Some(20), Some(20), Some(30))
    );
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("step-00000030/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["schedule_extensions"][0]["to_steps"], 30);
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    assert_eq!(
        (
            status["state"].as_str(),
            status["step"].as_u64(),
            status["total_steps"].as_u64()
        ),
        (Some("done"), Some(30), Some(30))
    );
    // A finished run is at min_lr: its new tail starts there and stays (it never jumps up).
    let lr_at = |step: u64| -> f64 {
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|r| r["step"] == step)
            .unwrap()["lr"]
            .as_f64()
            .unwrap()
    };
    assert!(
        lr_at(20) > 3e-4,
        "step 20 still decays on the planned cosine"
    );
    assert_eq!((lr_at(25), lr_at(30)), (3e-4, 3e-4));
    // Resuming the extended run again (no flag) has nothing left to do and keeps the plan.
    run_ok(train(&cfg, &run).args(["--total-steps", "20", "--resume-from-latest"]));
    assert_eq!(
        sha256(&final_weights(&run, 30)),
        sha256(&final_weights(&twin, 30))
    );
}

#[test]
fn the_checkpoint_bench_leaves_the_folder_it_measures_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let keep = tmp.path().join("disk");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("precious.txt"), "a run's file").unwrap();
    let out = run_ok(
        lab()
            .args(["bench", "--checkpoint", "--json", "--config"])
            .arg(&cfg)
            .arg("--ckpt-dir")
            .arg(&keep),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["file_bytes"].as_u64().unwrap() >= r["state_bytes"].as_u64().unwrap());
    let left: Vec<_> = std::fs::read_dir(&keep)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("precious.txt")]);

    let file = keep.join("precious.txt");
    let bench = |args: &[&str]| {
        let mut c = lab();
        c.arg("bench").arg("--config").arg(&cfg).args(args);
        c
    };
    expect_one_line_error(
        bench(&["--checkpoint", "--ckpt-dir"]).arg(&file),
        "--ckpt-dir",
    );
    expect_usage_error(&mut bench(&["--threads", "0"]), "--threads 0");
    expect_usage_error(&mut bench(&["--backend", "gpu"]), "--backend \"gpu\"");
}

#[test]
fn bench_reports_peak_memory_and_on_request_every_op_class_with_its_runs_per_step() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let bench = |extra: &[&str]| -> serde_json::Value {
        let out = run_ok(
            lab()
                .args([
                    "bench", "--json", "--steps", "2", "--warmup", "1", "--config",
                ])
                .arg(&cfg)
                .args(extra),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let plain = bench(&[]);
    assert!(plain["split"].is_null(), "no split unless asked: {plain}");
    assert_eq!(plain["memory_gauge"], "process peak RSS");
    let no_gpu = Some(&serde_json::Value::Null);
    assert_eq!(plain.get("gpu_util_pct"), no_gpu, "no GPU to read: {plain}");
    assert!(plain["peak_memory_bytes"].as_u64().unwrap() > 0);
    // The peak MFU divides by is reported (bench.sh puts PyTorch's rows over it too).
    let fpt = lab_config::LabConfig::load(&cfg)
        .unwrap()
        .model
        .train_flops_per_token();
    let (mfu, peak, tps) = (&plain["mfu"], &plain["peak_flops"], &plain["tokens_per_s"]);
    let implied = mfu.as_f64().unwrap() * peak.as_f64().unwrap() / tps.as_f64().unwrap();
    assert!((implied / fpt - 1.0).abs() < 1e-9, "{plain}");
    // Against the peak of what its products compute in: fp32 on the CPU (TF32 on CUDA).
    assert_eq!(plain["products"], plain["precision"], "{plain}");

    let r = bench(&["--split"]);
    let classes = r["split"]["classes"].as_array().unwrap();
    let names: Vec<_> = classes
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "projections",
            "attention",
            "rope",
            "rms_norm",
            "swiglu",
            "embedding",
            "lm_head_loss"
        ]
    );
    // micro: 2 layers, 2 micro-batches per step; 2L + 1 norms.
    let runs: Vec<_> = classes
        .iter()
        .map(|c| c["runs_per_step"].as_u64().unwrap())
        .collect();
    assert_eq!(runs, [4, 4, 4, 10, 4, 2, 2]);
    for c in classes {
        // Each class was run and timed.
        assert!(c["ms_per_run"].as_f64().unwrap() > 0.0, "{c}");
        let counted =
            ["projections", "attention", "lm_head_loss"].contains(&c["class"].as_str().unwrap());
        assert_eq!(c["tflops"].is_number(), counted, "{c}");
    }
}

#[test]
fn fit_micro_batch_splits_the_step_to_fit_the_memory_given() {
    use lab_plan::memory::AttentionKind;
    let tmp = tempfile::tempdir().unwrap();
    let cfg_path = micro_config(tmp.path());
    let cfg = lab_config::LabConfig::load(&cfg_path).unwrap();
    // The config's step is 4 × 2 sequences. A device between the memory model's totals at
    // micro-batches 2 and 4 (the CPU keeps T × T scores) takes 2 × 4.
    let planned = |micro_batch| {
        lab_plan::fit::planned_bytes(&cfg, 1, micro_batch, 8 / micro_batch, AttentionKind::Scores)
    };
    let usable = (planned(2) + planned(4)) / 2.0;
    let gib = usable / lab_plan::checks::TIGHT_MEMORY_SHARE / lab_plan::units::GIB;

    let steps = [
        "--total-steps",
        "3",
        "--ckpt-every",
        "1000",
        "--log-every",
        "1",
    ];
    let (fitted, plain) = (tmp.path().join("fitted"), tmp.path().join("plain"));
    let out = run_ok(
        train(&cfg_path, &fitted)
            .args(steps)
            .args(["--fit-micro-batch".to_string(), gib.to_string()]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("micro-batch 2 × 4 accumulated (config: 4 × 2)"),
        "{stdout}"
    );
    let recorded = std::fs::read_to_string(fitted.join("config.toml")).unwrap();
    assert!(
        recorded.contains("micro_batch = 2\ngrad_accum = 4\n"),
        "{recorded}"
    );

    // The same samples per step, split differently: the losses agree to summation order.
    run_ok(train(&cfg_path, &plain).args(steps));
    let loss = |run: &Path| -> Vec<f64> {
        losses(run)
            .iter()
            .map(|(_, b)| f64::from_bits(*b))
            .collect()
    };
    let (a, b) = (loss(&fitted), loss(&plain));
    assert_eq!(a.len(), 3);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * y, "fitted {x}, config's split {y}");
    }

    // Resuming with the config's own split (another device): allowed, with a warning.
    let out = run_ok(
        train(&cfg_path, &fitted)
            .args(steps)
            .arg("--resume-from-latest"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("split its steps 2 × 4; this launch splits them 4 × 2"),
        "{stderr}"
    );

    // Without a size on the CPU: one line naming the flag and the fix.
    expect_one_line_error(
        train(&cfg_path, &tmp.path().join("cpu")).args(["--fit-micro-batch"]),
        "give it in GiB (--fit-micro-batch 80)",
    );
    // A negative size is the flag's value, not another flag: the flag's own error.
    expect_usage_error(
        train(&cfg_path, &tmp.path().join("cpu")).args(["--fit-micro-batch", "-1"]),
        "--fit-micro-batch -1: give the device's memory in GiB",
    );
}
