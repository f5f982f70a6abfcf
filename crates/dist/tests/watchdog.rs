//! The collectives watchdog on a real process: a call that never returns ends the process
//! with one line and a non-zero exit; one that returns leaves it alone. The test binary runs
//! itself as the child (`WATCHDOG_CHILD` picks what the child does).

use std::process::{Command, Output};
use std::time::Duration;

use lab_dist::{Timeout, Watchdog};

/// Runs this test binary's `child` test in a fresh process with `WATCHDOG_CHILD=mode`.
fn run_child(mode: &str) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
        .env("WATCHDOG_CHILD", mode)
        .output()
        .unwrap()
}

/// What the child process does; a no-op in the normal test run.
#[test]
fn child() {
    let Ok(mode) = std::env::var("WATCHDOG_CHILD") else {
        return;
    };
    let dog = Watchdog::exiting("rank 1 of 2".into(), Timeout(Duration::from_millis(300))).unwrap();
    {
        let _watched = dog.arm("NCCL all_reduce");
        // "stuck": a peer that does not answer for 20 s (without the watchdog the child
        // would then succeed); otherwise the call returns at once.
        if mode == "stuck" {
            std::thread::sleep(Duration::from_secs(20));
        }
    }
    // Outlive the deadline: a finished call's watchdog stays quiet.
    std::thread::sleep(Duration::from_secs(1));
}

#[test]
fn a_call_that_never_returns_ends_the_process_with_one_line() {
    let out = run_child("stuck");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        lines,
        ["error: rank 1 of 2: NCCL all_reduce waited 300ms for its peers (a rank died or hangs; [parallel] timeout_s sets the wait); exiting"],
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_call_that_returns_is_left_alone() {
    let out = run_child("returns");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("1 passed"), "{stdout}");
}
