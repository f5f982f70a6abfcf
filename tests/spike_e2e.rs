//! Loss spikes end to end on the real binary: seeded injection, detection, the responses
//! (wait, rollback, skip, kill, wait escalating to kill), non-finite gradients, kills during
//! rollbacks and incidents, and the post-mortem's numbers. Steps are counted from 1, as the
//! logs count them: `--inject-spike-at-step 30` makes step 30 the first injected one.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;
use serde_json::Value;

fn train(cfg: &Path, run: &Path) -> Command {
    let mut c = train_on(cfg, &data_dir(), run);
    c.args(["--log-every", "1"]);
    c
}

fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn row(rows: &[Value], step: u64) -> &Value {
    rows.iter()
        .find(|r| r["step"] == step)
        .unwrap_or_else(|| panic!("no metrics row for step {step}"))
}

/// Every float of a safetensors file is finite.
fn all_finite(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header..]
        .chunks_exact(4)
        .all(|b| f32::from_le_bytes(b.try_into().unwrap()).is_finite())
}

fn state(run: &Path, step: u64) -> Value {
    let p = run.join(format!("step-{step:08}")).join("state.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn latest(run: &Path) -> String {
    std::fs::read_to_string(run.join("latest"))
        .unwrap()
        .trim()
        .to_string()
}

/// Spawns a training run and kills it (SIGKILL) once `reached()`.
fn kill_when(cmd: &mut Command, reached: &dyn Fn() -> bool) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(&mut child, reached),
        "ended before the kill point"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn an_injected_spike_is_detected_recovers_and_the_postmortem_says_what_metrics_say() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("spiked");
    run_ok(train(&cfg, &run).args(["--inject-spike-at-step", "30"]));

    // Five injected batches, at steps 30..=34, logged with their statistics.
    let injected = events(&run, "spike_injected");
    let steps: Vec<u64> = injected
        .iter()
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![30, 31, 32, 33, 34]);
    assert!(injected
        .iter()
        .all(|e| e["batch"]["rare_share"] == 1.0 && e["spike_kind"] == "rare-token"));
    // The detector fires at the spike, and the loss comes back (policy wait).
    let detected = events(&run, "spike_detected");
    assert_eq!(detected.len(), 1, "{detected:?}");
    assert_eq!(detected[0]["step"], 30);
    assert_eq!(detected[0]["flag"], "loss_spike");
    assert_eq!(events(&run, "spike_recovered").len(), 1);

    // Recompute the post-mortem's numbers from metrics.jsonl and the detection event.
    let rows = metrics(&run);
    let baseline = detected[0]["window_mean"].as_f64().unwrap();
    let back = rows
        .iter()
        .find(|r| {
            r["step"].as_u64().unwrap() > 30 && r["loss"].as_f64().unwrap() <= baseline * 1.05
        })
        .expect("a step back within 5 % of the pre-spike mean");
    let back_step = back["step"].as_u64().unwrap();
    let peak = rows
        .iter()
        .filter(|r| (30..=back_step).contains(&r["step"].as_u64().unwrap()))
        .map(|r| r["loss"].as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    assert!(peak / baseline >= 1.2, "a real spike: {peak} vs {baseline}");

    let out = run_ok(lab().args(["postmortem", "--run"]).arg(&run));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 spike(s)"));
    let md = std::fs::read_to_string(run.join("spike-postmortem.md")).unwrap();
    let summary = md
        .lines()
        .find(|l| l.starts_with("| 30 |"))
        .unwrap_or_else(|| panic!("no summary row for the spike at 30:\n{md}"));
    let cells: Vec<&str> = summary.split('|').map(str::trim).collect();
    assert_eq!(
        cells[5],
        format!("{:.3}", peak / baseline),
        "peak ratio: {summary}"
    );
    assert_eq!(
        cells[6],
        (back_step - 30).to_string(),
        "steps to recover: {summary}"
    );
    assert!(md.contains("![loss and gradient norm around step 30](spike-step-30.png)"));
    let (ink, colors) = png_ink(&run.join("spike-step-30.png"));
    assert!(ink > 0.02 && colors > 8, "a drawn chart: {ink} {colors}");
    // --output naming a folder writes the report and its chart inside it.
    let folder = tmp.path().join("reports");
    std::fs::create_dir(&folder).unwrap();
    run_ok(
        lab()
            .args(["postmortem", "--run"])
            .arg(&run)
            .arg("--output")
            .arg(&folder),
    );
    assert!(
        folder.join("spike-postmortem.md").is_file() && folder.join("spike-step-30.png").is_file()
    );

    // A run without spikes gets a report that says so plainly.
    let calm = tmp.path().join("calm");
    run_ok(train(&cfg, &calm).args(["--total-steps", "20"]));
    run_ok(lab().args(["postmortem", "--run"]).arg(&calm));
    let md = std::fs::read_to_string(calm.join("spike-postmortem.md")).unwrap();
    assert!(
        md.contains("No loss spike was detected in this run"),
        "{md}"
    );
}

#[test]
fn injection_is_reproducible_and_never_moves_the_data_cursor() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let (a, b, plain) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("plain"),
    );
    for run in [&a, &b] {
        run_ok(train(&cfg, run).args(["--inject-spike-at-step", "30"]));
    }
    run_ok(&mut train(&cfg, &plain));
    assert_eq!(
        losses(&a),
        losses(&b),
        "the injected run is bit-reproducible"
    );
    assert_eq!(
        sha256(&final_weights(&a, 60)),
        sha256(&final_weights(&b, 60))
    );

    // Identical before the spike; after it, the injected run's real-data cursor trails the
    // plain run's by exactly the five injected steps.
    let (ra, rp) = (metrics(&a), metrics(&plain));
    for s in 1..=29 {
        assert_eq!(row(&ra, s)["loss"], row(&rp, s)["loss"], "step {s}");
    }
    for s in 29..=55 {
        assert_eq!(
            row(&ra, s + 5)["samples"],
            row(&rp, s)["samples"],
            "step {s}"
        );
    }
    assert_eq!(row(&ra, 34)["samples"], row(&ra, 29)["samples"]);
    assert!(row(&ra, 30)["injected"] == true && row(&ra, 34)["injected"] == true);
    assert!(row(&ra, 35).get("injected").is_none());
}

#[test]
fn a_non_finite_gradient_never_reaches_weights_or_moments_and_the_run_rolls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    run_ok(train(&cfg, &run).args(["--inject-nan-grad-at-step", "22", "--ckpt-every", "5"]));

    let nonfinite = events(&run, "nonfinite");
    assert_eq!(nonfinite.len(), 1);
    assert_eq!(nonfinite[0]["step"], 22);
    assert_eq!(nonfinite[0]["grad_norm"], "NaN");
    let loss: f64 = nonfinite[0]["loss"].as_str().unwrap().parse().unwrap();
    assert!(loss.is_finite());
    let rollback = events(&run, "rollback");
    assert_eq!(rollback.len(), 1);
    assert_eq!(
        rollback[0]["to_step"], 20,
        "the newest checkpoint before the bad step"
    );
    assert_eq!(
        events(&run, "fire_drill").len(),
        1,
        "the drill is on record"
    );
    // The skipped data is recorded and survives into the final checkpoint.
    let skipped = state(&run, 60)["skipped"].clone();
    assert_eq!(skipped.as_array().unwrap().len(), 1, "{skipped}");
    assert_eq!(skipped[0]["step"], 22);
    // No NaN anywhere on disk: every checkpoint's weights and optimizer moments are finite.
    for entry in std::fs::read_dir(&run).unwrap() {
        let dir = entry.unwrap().path();
        if dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("step-")
        {
            assert!(
                all_finite(&dir.join("model.safetensors")),
                "{}",
                dir.display()
            );
            assert!(
                all_finite(&dir.join("optimizer.safetensors")),
                "{}",
                dir.display()
            );
        }
    }
    let rows = metrics(&run);
    assert!(rows.iter().all(|r| r["loss"].as_f64().unwrap().is_finite()));
    assert_eq!(
        rows.last().unwrap()["step"],
        60,
        "the run continued to the end"
    );
}

#[test]
fn rollback_and_skip_is_reproducible_and_survives_a_kill_9_during_and_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let flags = [
        "--inject-spike-at-step",
        "30",
        "--spike-batches",
        "2",
        "--spike-policy",
        "rollback",
        "--ckpt-every",
        "5",
    ];
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run_ok(train(&cfg, &a).args(flags));
    run_ok(train(&cfg, &b).args(flags));
    // Each spike batch is flagged at step 30, rolled back to the checkpoint of step 25 and
    // skipped: two rollbacks.
    let rollbacks = events(&a, "rollback");
    assert_eq!(rollbacks.len(), 2, "{rollbacks:?}");
    assert!(rollbacks
        .iter()
        .all(|r| r["to_step"] == 25 && r["from_step"] == 30));
    let skipped = state(&a, 60)["skipped"].clone();
    assert_eq!(skipped.as_array().unwrap().len(), 2, "{skipped}");
    assert_eq!(
        skipped,
        state(&b, 60)["skipped"],
        "the same ranges on a rerun"
    );
    assert_eq!(skipped[0]["source"], "spike");
    let want = sha256(&final_weights(&a, 60));
    assert_eq!(sha256(&final_weights(&b, 60)), want);
    let rows = metrics(&a);
    assert!(
        rows.iter().all(|r| r.get("injected").is_none()),
        "no spike step was kept"
    );
    assert!(
        rows.iter().all(|r| r.get("flag").is_none()),
        "no stale flag on replayed steps"
    );

    // kill -9 in the middle of the first rollback (the drill aborts after the abandoned
    // checkpoints are gone, before the restored state is saved), then resume.
    let during = tmp.path().join("during");
    let out = train(&cfg, &during)
        .args(flags)
        .arg("--inject-crash-in-rollback")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the drill aborts the process");
    assert!(!during.join("step-00000060").exists());
    run_ok(train(&cfg, &during).args(flags).arg("--resume-from-latest"));
    assert_eq!(
        sha256(&final_weights(&during, 60)),
        want,
        "killed during a rollback"
    );

    // kill -9 as soon as the first rollback is on record, then resume.
    let after = tmp.path().join("after");
    kill_when(train(&cfg, &after).args(flags), &|| {
        !events(&after, "rollback").is_empty()
    });
    run_ok(train(&cfg, &after).args(flags).arg("--resume-from-latest"));
    assert_eq!(
        sha256(&final_weights(&after, 60)),
        want,
        "killed after a rollback"
    );
}

#[test]
fn a_kill_during_an_incident_is_resumed_without_counting_the_spike_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let reference = tmp.path().join("reference");
    run_ok(train(&cfg, &reference).args(["--inject-spike-at-step", "32"]));
    let run = tmp.path().join("run");
    kill_when(
        train(&cfg, &run).args(["--inject-spike-at-step", "32"]),
        &|| !events(&run, "spike_detected").is_empty(),
    );
    run_ok(train(&cfg, &run).args(["--inject-spike-at-step", "32", "--resume-from-latest"]));
    assert_eq!(
        events(&run, "spike_detected").len(),
        1,
        "one spike, logged once"
    );
    assert_eq!(events(&run, "spike_injected").len(), 5);
    assert_eq!(
        sha256(&final_weights(&run, 60)),
        sha256(&final_weights(&reference, 60))
    );
    assert_eq!(losses(&run), losses(&reference));
    let aside = std::fs::read_to_string(run.join("events-abandoned.jsonl")).unwrap();
    assert!(
        aside.contains("spike_detected"),
        "the killed attempt's events are kept aside"
    );
}

#[test]
fn skip_drops_each_flagged_update_and_kill_stops_with_exit_5() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let skip = tmp.path().join("skip");
    run_ok(train(&cfg, &skip).args(["--inject-spike-at-step", "30", "--spike-policy", "skip"]));
    let skipped: Vec<u64> = events(&skip, "update_skipped")
        .iter()
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    assert_eq!(skipped, vec![30, 31, 32, 33, 34]);
    let rows = metrics(&skip);
    assert!(row(&rows, 32)["update_skipped"] == true);
    // Weights untouched by the skipped steps: the parameter norm did not move across them.
    assert_eq!(row(&rows, 34)["param_norm"], row(&rows, 29)["param_norm"]);

    let kill = tmp.path().join("kill");
    let out = train(&cfg, &kill)
        .args(["--inject-spike-at-step", "30", "--spike-policy", "kill"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains("stability policy") && stderr.contains("loss_spike"),
        "{stderr}"
    );
    // Stopped before the flagged update: the checkpoint holds the state after step 29.
    assert_eq!(latest(&kill), "step-00000029");
    assert!(std::fs::read_to_string(kill.join("status.json"))
        .unwrap()
        .contains("\"unstable\""));
    // A person decides: resume with another response (recorded), and the run completes.
    run_ok(train(&cfg, &kill).args([
        "--inject-spike-at-step",
        "30",
        "--spike-policy",
        "skip",
        "--resume-from-latest",
    ]));
    assert_eq!(events(&kill, "stability_changed").len(), 1);
    assert!(final_weights(&kill, 60).exists());
}

#[test]
fn wait_escalating_to_kill_stops_on_the_last_good_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    // A long spike (8 batches) and a short deadline: not back within 5 steps.
    let text = std::fs::read_to_string(&cfg).unwrap()
        + "[stability]\nrecovery_steps = 5\nescalate = \"kill\"\n";
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    let out = train(&cfg, &run)
        .args([
            "--inject-spike-at-step",
            "30",
            "--spike-batches",
            "8",
            "--ckpt-every",
            "5",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(events(&run, "spike_escalated").len(), 1);
    // The spike's updates were applied while waiting; the stop restored the state before it.
    assert_eq!(latest(&run), "step-00000025");
    let ck = state(&run, 25);
    assert_eq!(ck["step"], 25);
    assert!(
        ck["skipped"].as_array().is_none_or(|s| s.is_empty()),
        "a person decides about the data"
    );
    assert!(
        !run.join("step-00000035").exists(),
        "no checkpoint of the damaged weights"
    );
}
