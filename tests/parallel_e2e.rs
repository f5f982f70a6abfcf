//! Data parallelism on real processes under `mpirun` (CI installs Open MPI with apt and
//! builds with `--features lab/mpi`): W ranks × accumulation a against one process ×
//! accumulation W·a, ZeRO-1 against plain data parallelism, kill -9 of a rank under
//! `lab supervise`, SIGTERM on every rank, and resuming at another world size.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use lab_model::weights::load_safetensors;

/// The micro config over 30 steps (two micro-batches of 4 per step), with `[parallel]`
/// settings appended.
fn config(dir: &Path, steps: u64, parallel: &str) -> PathBuf {
    let micro = std::fs::read_to_string(micro_config(dir)).unwrap();
    let text = micro
        .replace("total_steps = 60", &format!("total_steps = {steps}"))
        .replace("log_every = 5", "log_every = 1")
        + parallel;
    let path = dir.join(format!("dp-{steps}-{}.toml", parallel.len()));
    std::fs::write(&path, text).unwrap();
    path
}

/// Rewrites `from` to `to` in the config at `cfg` (which must contain it).
fn edit(cfg: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(cfg).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", cfg.display());
    std::fs::write(cfg, text.replace(from, to)).unwrap();
}

fn mpirun(np: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "-np", &np.to_string()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(env!("CARGO_BIN_EXE_lab"));
    c
}

/// `lab train` of `cfg` into `run`, launched by `launcher`.
fn train_with(mut launcher: Command, cfg: &Path, run: &Path) -> Command {
    launcher.args(["train", "--config"]).arg(cfg);
    launcher
        .arg("--data-dir")
        .arg(data_dir())
        .arg("--ckpt-dir")
        .arg(run);
    launcher
}

/// (step, loss, samples consumed) of every metrics row.
fn rows(run: &Path) -> Vec<(u64, f64, u64)> {
    metric_rows(run)
        .iter()
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap(),
                v["samples"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The largest |a - b| over every weight of two safetensors files.
fn max_weight_diff(a: &Path, b: &Path) -> f32 {
    let (a, b) = (
        load_safetensors(a).unwrap().0,
        load_safetensors(b).unwrap().0,
    );
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    a.iter()
        .flat_map(|(k, t)| t.data.iter().zip(&b[k].data).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max)
}

/// Losses within `rel` of each other step by step, and the same samples consumed.
fn assert_same_run(a: &Path, b: &Path, rel: f64) {
    let (a, b) = (rows(a), rows(b));
    assert_eq!(a.len(), b.len());
    for ((s, la, na), (t, lb, nb)) in a.iter().zip(&b) {
        assert_eq!((s, na), (t, nb), "step and samples consumed");
        assert!(
            (la - lb).abs() <= rel * la.abs(),
            "step {s}: loss {la} vs {lb}"
        );
    }
}

/// Tolerance on final weights after 30 AdamW steps: the ranks add the same gradients in
/// another order (about 1e-7 relative), and Adam's normalised update `m / √v` can turn that
/// into up to about `lr` on an element whose gradient is near zero. A tenth of the peak
/// learning rate (3e-3) is far below one step's movement and far above what was seen (7e-5).
const WEIGHT_TOL: f32 = 3e-4;

#[test]
fn two_ranks_accumulating_one_equal_one_process_accumulating_two() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 30, "");
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    run_ok(&mut train_on(&cfg, &data_dir(), &one));
    run_ok(&mut train_with(mpirun(2), &cfg, &two));
    assert_same_run(&one, &two, 1e-5);
    let d = max_weight_diff(&final_weights(&one, 30), &final_weights(&two, 30));
    assert!(d <= WEIGHT_TOL, "final weights differ by {d}");
    let dp = events(&two, "data_parallel");
    assert_eq!(dp.len(), 1, "{dp:?}");
    assert_eq!(
        (dp[0]["world_size"].as_u64(), dp[0]["engine"].as_str()),
        (Some(2), Some("mpi"))
    );
    // hardware.json (and so the manifest) carries the job: 2 ranks of one host.
    let hw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(two.join("hardware.json")).unwrap()).unwrap();
    let job = &hw["cluster"];
    assert_eq!(
        (
            &job["world_size"],
            &job["nodes"],
            &job["launcher"],
            &job["engine"]
        ),
        (&2.into(), &1.into(), &"mpirun".into(), &"mpi".into()),
        "{job}"
    );
    assert_eq!(job["rank_hosts"][0], job["rank_hosts"][1]);
    assert_eq!(job["grad_accum_per_rank"], 1);
    // The share of step time in collectives is logged, and is a share.
    let share = metric_rows(&two)[0]["comm_share"]
        .as_f64()
        .expect("comm_share logged");
    assert!(share > 0.0 && share < 1.0, "{share}");
    // Only rank 0 writes the logs: one row per step, every step.
    let steps: Vec<u64> = rows(&two).iter().map(|r| r.0).collect();
    assert_eq!(steps, (1..=30).collect::<Vec<_>>());
}

#[test]
fn zero_1_halves_the_optimizer_state_per_rank_and_matches_plain_data_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, zero) = (
        config(dir.path(), 30, ""),
        config(dir.path(), 30, "[parallel]\nzero = 1\n"),
    );
    let (a, b) = (dir.path().join("plain"), dir.path().join("zero"));
    run_ok(&mut train_with(mpirun(2), &plain, &a));
    run_ok(&mut train_with(mpirun(2), &zero, &b));
    assert_same_run(&a, &b, 1e-6);
    let d = max_weight_diff(&final_weights(&a, 30), &final_weights(&b, 30));
    assert!(d <= WEIGHT_TOL, "final weights differ by {d}");
    let step = b.join("step-00000030");
    let whole = std::fs::metadata(a.join("step-00000030/optimizer.safetensors"))
        .unwrap()
        .len() as f64;
    for r in 0..2 {
        let shard = step.join(lab_train::checkpoint::shard_name(r, 2));
        let bytes = std::fs::metadata(&shard).unwrap().len() as f64;
        assert!(
            (bytes / whole - 0.5).abs() < 0.05,
            "rank {r} holds {bytes} of {whole} bytes"
        );
    }
    assert!(!step.join("optimizer.safetensors").exists());
}

/// ZeRO-1 in bf16 keeps fp32 masters only of the parameters a rank updates and holds the
/// other ranks' linear weights as the bf16 copies the forward reads. Every number equals plain
/// data parallelism's, bit for bit: the losses, the fp32 masters in the checkpoints, and a
/// resume from one. Clipping is off: it scales by `clip / norm`, and ZeRO-1 adds the norm's
/// squares in another order, a last-bit difference that bf16 rounding can then amplify.
#[test]
fn zero_1_in_bf16_shards_the_fp32_masters_and_equals_plain_data_parallelism_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let no_clip = |parallel: &str| {
        let cfg = config(dir.path(), 30, parallel);
        // Two micro-batches per rank: the copies' bf16 gradients are accumulated in fp32.
        edit(&cfg, "grad_accum = 2", "grad_accum = 4");
        edit(&cfg, "[train]\n", "[train]\ngrad_clip = 0.0\n");
        cfg
    };
    let (plain, zero) = (no_clip(""), no_clip("[parallel]\nzero = 1\n"));
    let (a, b) = (dir.path().join("plain"), dir.path().join("zero"));
    let bf16 = |mut c: Command| {
        c.args(["--precision", "bf16"]);
        c
    };
    run_ok(&mut bf16(train_with(mpirun(2), &plain, &a)));
    run_ok(&mut bf16(train_with(mpirun(2), &zero, &b)));
    let losses = |run: &Path| rows(run).iter().map(|r| r.1).collect::<Vec<_>>();
    assert_eq!(losses(&a), losses(&b));
    let masters = |run: &Path| load_safetensors(&final_weights(run, 30)).unwrap().0;
    assert_eq!(masters(&a), masters(&b), "the checkpoints' fp32 masters");

    // Each rank holds 2 bytes less per linear weight another rank updates: 2·L·(W-1) in all.
    let linear: usize = masters(&a)
        .iter()
        .filter(|(name, t)| t.shape.len() == 2 && *name != "embed")
        .map(|(_, t)| t.data.len())
        .sum();
    let bytes = |run: &Path| -> Vec<u64> {
        let e = &events(run, "data_parallel")[0]["weight_bytes_per_rank"];
        serde_json::from_value(e.clone()).unwrap()
    };
    let (full, sharded) = (bytes(&a), bytes(&b));
    let whole: usize = masters(&a).values().map(|t| t.data.len() * 4).sum();
    assert_eq!(full, vec![whole as u64; 2]);
    assert!(sharded.iter().all(|&s| s < whole as u64), "{sharded:?}");
    let saved: u64 = sharded.iter().map(|s| whole as u64 - s).sum();
    assert_eq!(saved, 2 * linear as u64);
    // The updated weights travel as what the ranks hold: the linear ones as bf16.
    let gathered: usize = masters(&a)
        .iter()
        .map(|(name, t)| match t.shape.len() == 2 && name != "embed" {
            true => 4 * t.data.len().div_ceil(2),
            false => 4 * t.data.len(),
        })
        .sum();
    let event = |run: &Path| events(run, "data_parallel")[0]["all_gather_bytes"].clone();
    assert_eq!(event(&b), gathered as u64);
    assert_eq!(event(&a), serde_json::Value::Null);

    // A resume from step 20 reads the masters back and deals the copies out again.
    let resumed = dir.path().join("resumed");
    fork_at(&b, &resumed, 20);
    run_ok(bf16(train_with(mpirun(2), &zero, &resumed)).arg("--resume-from-latest"));
    assert_eq!(
        sha256(&final_weights(&resumed, 30)),
        sha256(&final_weights(&b, 30))
    );
}

/// A rank that fails alone (rank 0 refuses a run folder that already holds checkpoints while
/// rank 1 waits for it) leaves without finalizing MPI, so mpirun ends the job at once instead
/// of rank 1 waiting out `parallel.timeout_s` (and rank 0 waiting in `MPI_Finalize` for it).
#[test]
fn a_rank_that_fails_alone_ends_the_job_without_waiting_out_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 30, "[parallel]\ntimeout_s = 120\n");
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("step-00000010")).unwrap();
    let out = train_with(mpirun(2), &cfg, &run).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("already holds checkpoints"), "{stderr}");
    assert!(
        !stderr.contains("for its peers"),
        "a rank waited out its timeout: {stderr}"
    );
}

/// `lab supervise FLAGS -- JOB --resume-from-latest`, its output captured.
fn supervised(job: &Command, flags: &[&str]) -> Command {
    let mut sup = lab();
    sup.arg("supervise").args(flags).arg("--");
    sup.arg(job.get_program()).args(job.get_args());
    sup.arg("--resume-from-latest");
    // The launcher's environment (mpirun's run-as-root consent) goes along.
    sup.envs(job.get_envs().filter_map(|(k, v)| Some((k, v?))));
    sup.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    sup
}

/// The pid of rank `rank` of the `lab train` writing into `run`.
fn rank_pid(rank: usize, run: &Path) -> Option<i32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let has = |hay: &[u8], needle: &[u8]| hay.split(|&b| b == 0).any(|s| s == needle);
        (has(&env, want.as_bytes()) && has(&cmd, run.as_os_str().as_encoded_bytes())).then_some(pid)
    })
}

/// Polls for `path` (a checkpoint a job is about to write); a job that died before writing
/// it fails the test instead of hanging it.
fn wait_for(path: &Path) {
    for _ in 0..30_000 {
        if path.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("{} never appeared", path.display());
}

#[test]
fn kill_9_of_a_rank_under_supervise_restarts_and_finishes_as_if_uninterrupted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 60, "[parallel]\nzero = 1\n");
    let (clean, killed) = (dir.path().join("clean"), dir.path().join("killed"));
    run_ok(&mut train_with(mpirun(2), &cfg, &clean));

    let job = train_with(mpirun(2), &cfg, &killed);
    let child = supervised(&job, &["--max-restarts", "2", "--backoff-s", "0"])
        .spawn()
        .unwrap();
    wait_for(&killed.join("step-00000010"));
    let pid = rank_pid(1, &killed).expect("rank 1 is running");
    // SAFETY: kills a process this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("restart 1 of 2 from the latest checkpoint"),
        "{stderr}"
    );

    let restarted = events(&killed, "restarted");
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert_eq!(restarted[0]["restarts"], 1);
    let at = restarted[0]["resumed_at_step"].as_u64().unwrap();
    assert!(
        (10..60).contains(&at) && at.is_multiple_of(10),
        "resumed at {at}"
    );
    // Resuming is exact at the same world size: the same weights, bit for bit.
    assert_eq!(
        sha256(&final_weights(&killed, 60)),
        sha256(&final_weights(&clean, 60))
    );
}

#[test]
fn sigterm_checkpoints_every_rank_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 2000, "[parallel]\nzero = 1\n");
    let run = dir.path().join("run");
    let mut job = train_with(mpirun(2), &cfg, &run);
    let child = job
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&run.join("step-00000010"));
    // A spot notice reaches every task of the job (as Slurm sends it).
    for r in 0..2 {
        let pid = rank_pid(r, &run).expect("rank running");
        // SAFETY: signals a process this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stopped = events(&run, "interrupted");
    assert_eq!(stopped.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
    let step = stopped[0]["step"].as_u64().unwrap();
    // Recorded as a preemption, with the checkpoint it left.
    let preempted = events(&run, "preemption");
    assert_eq!(preempted.len(), 1, "{preempted:?}");
    assert_eq!(preempted[0]["step"].as_u64(), Some(step));
    assert_eq!(preempted[0]["checkpoint"], stopped[0]["checkpoint"]);
    let dir = run.join(format!("step-{step:08}"));
    for r in 0..2 {
        assert!(
            dir.join(lab_train::checkpoint::shard_name(r, 2)).exists(),
            "rank {r}'s shard"
        );
    }
    lab_train::checkpoint::verify(&dir).unwrap();
}

/// Copies a run folder without its checkpoints after `step` (the state a job died in).
fn fork_at(from: &Path, to: &Path, step: u64) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let keep = name
            .strip_prefix("step-")
            .and_then(|s| s.parse::<u64>().ok())
            .is_none_or(|s| s <= step);
        if !keep {
            continue;
        }
        if e.path().is_dir() {
            std::fs::create_dir_all(to.join(&name)).unwrap();
            for f in std::fs::read_dir(e.path()).unwrap().flatten() {
                std::fs::copy(f.path(), to.join(&name).join(f.file_name())).unwrap();
            }
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

#[test]
fn a_job_resumes_at_another_world_size_two_to_one_and_one_to_two() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 30, "[parallel]\nzero = 1\n");
    let (two, one) = (dir.path().join("two"), dir.path().join("one"));
    run_ok(&mut train_with(mpirun(2), &cfg, &two));
    run_ok(&mut train_on(&cfg, &data_dir(), &one));
    for (from, launcher, name) in [(&two, None, "2to1"), (&one, Some(mpirun(2)), "1to2")] {
        let forked = dir.path().join(name);
        fork_at(from, &forked, 20);
        let again = |run: &Path| {
            let l = launcher
                .as_ref()
                .map(|_| mpirun(2))
                .unwrap_or_else(|| Command::new(env!("CARGO_BIN_EXE_lab")));
            let mut c = if launcher.is_some() {
                train_with(l, &cfg, run)
            } else {
                train_on(&cfg, &data_dir(), run)
            };
            run_ok(c.arg("--resume-from-latest"));
        };
        let twin = dir.path().join(format!("{name}-twin"));
        fork_at(from, &twin, 20);
        again(&forked);
        again(&twin);
        // Reproducible at the new size, and the same run as the one it left.
        assert_eq!(
            sha256(&final_weights(&forked, 30)),
            sha256(&final_weights(&twin, 30)),
            "{name}"
        );
        assert_same_run(from, &forked, 1e-5);
        let d = max_weight_diff(&final_weights(from, 30), &final_weights(&forked, 30));
        assert!(d <= WEIGHT_TOL, "{name}: final weights differ by {d}");
        assert_eq!(
            events(&forked, "resume").last().unwrap()["world_size"],
            if name == "2to1" { 1 } else { 2 }
        );
    }
}

#[test]
fn ranks_that_cannot_share_the_global_batch_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 30, "");
    let run = dir.path().join("run");
    let out = train_with(mpirun(3), &cfg, &run).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = "error: 3 ranks cannot share a global batch of 2 micro-batches (train.grad_accum 2 × parallel.dp 1); launch a number of ranks that divides 2";
    // Each rank refuses before joining; mpirun ends the job at the first refusal.
    assert!(stderr.contains(line), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!run.join("step-00000000").exists() && !run.join("metrics.jsonl").exists());
}

/// Under ZeRO-1 each rank counts the updates of the parameters it keeps; parameters frozen for
/// the first steps count fewer. A resume must restore every rank's counts, not rank 0's only.
#[test]
fn a_zero_1_resume_restores_every_ranks_update_counts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 30, "[parallel]\nzero = 1\n");
    edit(
        &cfg,
        "[train]\n",
        "[train]\nfreeze_non_embedding_steps = 5\n",
    );
    let (clean, resumed) = (dir.path().join("clean"), dir.path().join("resumed"));
    run_ok(&mut train_with(mpirun(2), &cfg, &clean));
    fork_at(&clean, &resumed, 20);
    run_ok(train_with(mpirun(2), &cfg, &resumed).arg("--resume-from-latest"));
    let state = std::fs::read_to_string(clean.join("step-00000020/state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let counts = state["param_updates"].as_object().unwrap();
    assert!(
        counts.len() > 2 && counts.values().all(|t| t == 15),
        "{counts:?}"
    );
    assert_eq!(
        sha256(&final_weights(&resumed, 30)),
        sha256(&final_weights(&clean, 30))
    );
}

/// A resume where one rank's optimizer shard of the newest checkpoint is damaged: every rank
/// must fall back to the same older checkpoint (rank 0 verifies all shards and names it), not
/// rank 1 alone, which would join a job at another step. The job then ends as if whole.
#[test]
fn a_zero_1_resume_past_a_damaged_shard_falls_back_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 30, "[parallel]\nzero = 1\n");
    let (clean, damaged) = (dir.path().join("clean"), dir.path().join("damaged"));
    run_ok(&mut train_with(mpirun(2), &cfg, &clean));
    fork_at(&clean, &damaged, 30);
    let shard = lab_train::checkpoint::shard_name(1, 2);
    flip_a_byte(&damaged.join("step-00000030").join(&shard));

    let out = run_ok(train_with(mpirun(2), &cfg, &damaged).arg("--resume-from-latest"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Said once (by rank 0), naming the shard; the folder is kept aside for inspection.
    assert_eq!(stderr.matches("skipping checkpoint").count(), 1, "{stderr}");
    assert!(stderr.contains(&shard), "{stderr}");
    assert!(damaged.join("step-00000030.corrupt").is_dir());
    let resumed = events(&damaged, "resume");
    assert_eq!(
        resumed.last().unwrap()["from"],
        "step-00000020",
        "{resumed:?}"
    );
    assert_eq!(
        sha256(&final_weights(&damaged, 30)),
        sha256(&final_weights(&clean, 30))
    );
}

/// Ctrl-C on the supervisor reaches the job once: it writes its emergency checkpoint and exits
/// 130, and the supervisor does not restart it.
#[test]
fn supervise_passes_a_stop_on_once_and_does_not_restart_a_stopped_job() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 2000, "");
    let run = dir.path().join("run");
    let job = train_on(&cfg, &data_dir(), &run);
    let child = supervised(&job, &[]).spawn().unwrap();
    wait_for(&run.join("step-00000010"));
    // SAFETY: signals a process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(!stderr.contains("restart 1"), "{stderr}");
    let stopped = events(&run, "interrupted");
    assert_eq!(stopped.len(), 1, "{stderr}");
    assert_eq!(stopped[0]["signal"], 2);
    assert!(stopped[0]["checkpoint"].is_string(), "{:?}", stopped[0]);
}
