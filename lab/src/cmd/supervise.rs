//! `lab supervise [--max-restarts N] -- CMD …`: torchrun's elastic restart for any launch
//! (`mpirun`, `srun`, a plain `lab train`). When the job dies (a rank was killed, a node was
//! preempted) it is started again, with `LAB_RESTART_COUNT` telling the trainer which attempt
//! this is; `lab train --resume-from-latest` then resumes from the newest checkpoint that
//! verifies, at whatever world size the launch asks for.
//!
//! Not restarted: success, and the exits that are decisions rather than failures: usage (2),
//! the budget guard (3, 4), the stability policy (5), and a stop by SIGINT/SIGTERM (130, 143:
//! the job wrote its emergency checkpoint; a scheduler that preempts requeues the job itself).
//! The job runs in its own process group, so a Ctrl-C reaches it once: passed on by the
//! supervisor, not also from the terminal (a second signal would skip the checkpoint).

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};

#[derive(Parser)]
pub struct Args {
    /// How many times a failed job is started again.
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// Seconds to wait before each restart (a preempted node's replacement may need them).
    #[arg(long, default_value_t = 1.0)]
    pub backoff_s: f64,
    /// The launch command, after `--` (e.g. `mpirun -np 2 lab train … --resume-from-latest`).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Exit codes that are decisions, not failures: a restart would repeat them.
const FINAL: [i32; 7] = [0, 2, 3, 4, 5, 130, 143];

pub fn run(args: Args) -> Result<ExitCode> {
    let (program, rest) = args.command.split_first().context("no command after --")?;
    if !args.backoff_s.is_finite() {
        bail!(
            "--backoff-s {}: give a finite number of seconds",
            args.backoff_s
        );
    }
    if args.command.iter().any(|a| a == "train")
        && !args.command.iter().any(|a| a == "--resume-from-latest")
    {
        eprintln!("warning: the command has no --resume-from-latest: a restart would refuse the run folder instead of resuming it");
    }
    let stop = Arc::new(AtomicUsize::new(0));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register_usize(sig, stop.clone(), sig as usize)?;
    }
    let mut restarts = 0;
    loop {
        let mut child = Command::new(program)
            .args(rest)
            .process_group(0)
            .env("LAB_RESTART_COUNT", restarts.to_string())
            .spawn()
            .with_context(|| format!("cannot start {program}"))?;
        let status = wait_passing_signals(&mut child, &stop)?;
        let group = child.id() as i32;
        let why = describe(&status);
        let code = status.code();
        if stop.load(Ordering::SeqCst) != 0 || code.is_some_and(|c| FINAL.contains(&c)) {
            if code != Some(0) {
                eprintln!("lab supervise: the job {why}; not restarting");
            }
            return Ok(ExitCode::from(exit_byte(&status)));
        }
        end_what_is_left(group);
        if restarts >= args.max_restarts {
            bail!(
                "the job {why}, and {restarts} restart(s) (--max-restarts {}) are used up",
                args.max_restarts
            );
        }
        restarts += 1;
        eprintln!(
            "lab supervise: the job {why} (a rank died or was preempted); restart {restarts} of {} from the latest checkpoint",
            args.max_restarts
        );
        std::thread::sleep(Duration::from_secs_f64(args.backoff_s.max(0.0)));
    }
}

/// Waits for the job, passing a SIGINT/SIGTERM the supervisor receives on to it (once).
fn wait_passing_signals(child: &mut std::process::Child, stop: &AtomicUsize) -> Result<ExitStatus> {
    let mut passed = false;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        let sig = stop.load(Ordering::SeqCst);
        if sig != 0 && !passed {
            // SAFETY: signals the process group of a child we started and have not reaped
            // (mpirun or srun passes it on to the ranks).
            unsafe { libc::kill(-(child.id() as i32), sig as i32) };
            passed = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After a failed job: its process group is killed and waited for. A launcher that died
/// (kill -9 of mpirun, the OOM killer) leaves its ranks running a moment longer, and they
/// hold the run folder's lock a restart needs (or, given up, would train on unsupervised).
fn end_what_is_left(group: i32) {
    // SAFETY: signals the process group of the job this supervisor started (its leader was
    // reaped just now; the group's number is not reused while a member lives).
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while group_has_a_live_process(group) {
        if Instant::now() >= deadline {
            eprintln!("lab supervise: warning: processes of the dead job (group {group}) still run after 30 s");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process of `group` still runs (zombies hold no locks: their files are closed).
fn group_has_a_live_process(group: i32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // "pid (comm) state ppid pgrp …": the fields after the command's closing parenthesis.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let (state, pgrp) = (fields.first().copied(), fields.get(2).copied());
        pgrp == Some(group.to_string().as_str()) && !matches!(state, Some("Z" | "X"))
    })
}

fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

fn exit_byte(status: &ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => (128 + s) as u8,
        _ => 1,
    }
}
