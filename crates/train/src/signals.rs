//! SIGINT / SIGTERM while a trainer runs: the first one asks it to write an emergency
//! checkpoint and exit (130 / 143); a second one, while the first is pending, ends the process
//! at once. Outside training (before it, or after it, as in `lab run`'s evaluation and export)
//! each keeps the disposition the process started with: by default the first one ends the
//! process, and one a shell set to be ignored (`lab run … &`) stays ignored.
//!
//! signal-hook's handlers cannot be taken back once installed, so they are installed once per
//! process and a [`StopSignal`] arms them while it lives. Without that, a process that had
//! trained once swallowed the next Ctrl-C into a flag nobody read.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::Result;
use signal_hook::consts::{SIGINT, SIGTERM};

/// The last stop signal's number while armed, else 0.
static WHICH: AtomicUsize = AtomicUsize::new(0);
/// A stop signal arrived while armed: the next one exits at once.
static PENDING: AtomicBool = AtomicBool::new(false);
/// No trainer is armed: a signal acts as it did when the process started.
static IDLE: AtomicBool = AtomicBool::new(true);
/// Whether the handlers are installed, and how many trainers are armed (tests train side by
/// side in one process).
static ARMED: Mutex<Armed> = Mutex::new(Armed {
    installed: false,
    trainers: 0,
});

struct Armed {
    installed: bool,
    trainers: usize,
}

/// Installs the one handler of `sig`; it reads the state above.
fn install_handler(sig: i32) -> Result<()> {
    let ignored = ignored_at_start(sig);
    let action = move || {
        if IDLE.load(Ordering::SeqCst) {
            if !ignored {
                let _ = signal_hook::low_level::emulate_default_handler(sig);
            }
        } else if PENDING.swap(true, Ordering::SeqCst) {
            signal_hook::low_level::exit(128 + sig);
        } else {
            WHICH.store(sig as usize, Ordering::SeqCst);
        }
    };
    // Safety: the action only touches atomics and calls signal-hook's async-signal-safe
    // default action and `_exit`.
    unsafe { signal_hook::low_level::register(sig, action)? };
    Ok(())
}

/// Whether `sig` was set to be ignored when this process started (a shell does that for
/// SIGINT in `cmd &`): read before lab's handler replaces the disposition.
fn ignored_at_start(sig: i32) -> bool {
    // Safety: sigaction with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Which stop signal arrived while this trainer was armed, if any. Dropping it disarms.
pub struct StopSignal(());

impl StopSignal {
    /// Arms the SIGINT and SIGTERM handlers (installing them the first time) until dropped.
    pub fn install() -> Result<Self> {
        let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
        if !armed.installed {
            install_handler(SIGINT)?;
            install_handler(SIGTERM)?;
            armed.installed = true;
        }
        if armed.trainers == 0 {
            // A signal from an earlier training was answered by it; this one starts clean.
            WHICH.store(0, Ordering::SeqCst);
            PENDING.store(false, Ordering::SeqCst);
            IDLE.store(false, Ordering::SeqCst);
        }
        armed.trainers += 1;
        Ok(Self(()))
    }

    /// Some(signal number) once a stop was requested.
    pub fn received(&self) -> Option<i32> {
        match WHICH.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

impl Drop for StopSignal {
    fn drop(&mut self) {
        let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
        armed.trainers -= 1;
        if armed.trainers == 0 {
            IDLE.store(true, Ordering::SeqCst);
        }
    }
}

/// The conventional exit status for a process stopped by `signal`: 128 + signal.
pub fn exit_code(signal: i32) -> u8 {
    (128 + signal) as u8
}

#[cfg(test)]
mod tests {
    //! Each case raises real signals, so each runs in a child process: this test binary run
    //! again on `child_case` alone, with the case named in the environment.

    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, ExitStatus};

    use signal_hook::low_level::raise;

    use super::*;
    use crate::policy::{Decision, Journal, StepPolicy, StepView, Stop};
    use crate::stream::StepData;

    const CASE: &str = "LAB_SIGNALS_TEST_CASE";
    /// The child's exit status when its case saw what it expected and was not ended.
    const SURVIVED: i32 = 3;

    /// Runs `case` in a child (started with SIGINT ignored when `sigint_ignored`, as a shell
    /// starts `cmd &`): its status, and its output for the failure message.
    fn run_case(case: &str, sigint_ignored: bool) -> (ExitStatus, String) {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "signals::tests::child_case", "--ignored"])
            .args(["--test-threads", "1", "--nocapture"])
            .env(CASE, case);
        // Set either way: a test process run in the background by a shell (as CI's side-by-side
        // runs are) starts with SIGINT ignored, and the child would inherit that.
        let sigint = if sigint_ignored {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        // Safety: signal() is async-signal-safe; the child execs right after.
        unsafe {
            cmd.pre_exec(move || {
                libc::signal(libc::SIGINT, sigint);
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status, format!("case {case}: {}\n{text}", out.status))
    }

    /// Signals blocked by whoever started the tests would never be delivered.
    fn unblock_stop_signals() {
        // Safety: a sigset on the stack, filled by libc, then applied to this thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, SIGINT);
            libc::sigaddset(&mut set, SIGTERM);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }

    #[test]
    #[ignore = "a child process of the signal tests"]
    fn child_case() {
        let Ok(case) = std::env::var(CASE) else {
            return;
        };
        unblock_stop_signals();
        let stop = |signal| {
            raise(signal).unwrap();
        };
        match case.as_str() {
            "armed_once" => {
                let s = StopSignal::install().unwrap();
                stop(SIGTERM);
                assert_eq!(s.received(), Some(SIGTERM));
            }
            "armed_twice" => {
                let _s = StopSignal::install().unwrap();
                stop(SIGINT);
                stop(SIGINT); // exits 130 here
            }
            "after_training" => {
                drop(StopSignal::install().unwrap());
                stop(SIGINT); // the default action ends the process here, unless ignored
            }
            "trained_again" => {
                let first = StopSignal::install().unwrap();
                stop(SIGINT);
                drop(first);
                let second = StopSignal::install().unwrap();
                assert_eq!(
                    second.received(),
                    None,
                    "the first training's signal is stale"
                );
                stop(SIGTERM);
                assert_eq!(second.received(), Some(SIGTERM));
            }
            "two_trainers" => {
                let a = StopSignal::install().unwrap();
                let b = StopSignal::install().unwrap();
                drop(a);
                stop(SIGINT); // b is still armed
                assert_eq!(b.received(), Some(SIGINT));
            }
            "in_the_last_step" => {
                let mut policy = crate::stability::Signals(StopSignal::install().unwrap());
                stop(SIGTERM); // while the last step computes: no step comes after it
                assert_eq!(
                    last_step_ends(&mut policy),
                    Decision::Stop(Stop::Interrupted { signal: SIGTERM })
                );
            }
            other => panic!("no case {other}"),
        }
        std::process::exit(SURVIVED);
    }

    /// What the signal policy says once the last of 10 steps is applied and logged.
    fn last_step_ends(policy: &mut crate::stability::Signals) -> Decision {
        let data = StepData {
            micro: Vec::new(),
            ranges: Vec::new(),
            injected: false,
            offsets: Vec::new(),
            stats: Default::default(),
        };
        let view = StepView {
            step: 9,
            total_steps: 10,
            loss: 1.0,
            grad_norm: 1.0,
            clip_scale: 1.0,
            lr: 1e-3,
            data: &data,
            steps_this_session: 10,
            elapsed_s: 1.0,
            at_checkpoint: true,
            at_log: true,
            val_loss: None,
        };
        policy.after_update(&view, &mut Silent)
    }

    /// A journal that keeps nothing.
    struct Silent;

    impl Journal for Silent {
        fn event(&mut self, _: u64, _: &str, _: serde_json::Value) {}
        fn alert(&mut self, _: &str) {}
        fn say(&mut self, _: &str) {}
        fn flag_step(&mut self, _: &str) {}
        fn metric(&mut self, _: &str, _: f64) {}
    }

    /// How a child case ends.
    #[derive(Debug, PartialEq)]
    enum Ends {
        Survives,
        Exits(i32),
        KilledBy(i32),
    }

    fn assert_ends(case: &str, sigint_ignored: bool, want: Ends) {
        let (status, text) = run_case(case, sigint_ignored);
        let got = match (status.code(), status.signal()) {
            (Some(SURVIVED), _) => Ends::Survives,
            (Some(code), _) => Ends::Exits(code),
            (None, Some(signal)) => Ends::KilledBy(signal),
            (None, None) => panic!("{text}"),
        };
        assert_eq!(got, want, "{text}");
    }

    #[test]
    fn an_armed_trainer_is_asked_to_stop_by_the_first_signal() {
        assert_ends("armed_once", false, Ends::Survives);
        assert_ends("two_trainers", false, Ends::Survives);
    }

    #[test]
    fn a_second_signal_while_armed_exits_at_once() {
        assert_ends("armed_twice", false, Ends::Exits(128 + SIGINT));
    }

    #[test]
    fn after_training_the_first_signal_ends_the_process() {
        assert_ends("after_training", false, Ends::KilledBy(SIGINT));
    }

    #[test]
    fn a_signal_the_process_started_ignoring_stays_ignored_outside_training() {
        assert_ends("after_training", true, Ends::Survives);
        // Armed, it still stops the trainer.
        assert_ends("armed_twice", true, Ends::Exits(128 + SIGINT));
    }

    #[test]
    fn a_signal_during_the_last_step_stops_the_run_as_interrupted() {
        assert_ends("in_the_last_step", false, Ends::Survives);
    }

    #[test]
    fn training_again_starts_without_the_last_trainings_signal() {
        assert_ends("trained_again", false, Ends::Survives);
    }
}
