//! SIGINT / SIGTERM while a trainer runs: the first one asks it to write an emergency
//! checkpoint and exit (130 / 143); a second one, while the first is pending, ends the process
//! at once. Outside training (before it, or after it, as in `lab run`'s evaluation and export)
//! both keep their default action: the first one ends the process.
//!
//! signal-hook's handlers cannot be taken back once installed, so they are installed once per
//! process and a [`StopSignal`] arms them while it lives. Without that, a process that had
//! trained once swallowed the next Ctrl-C into a flag nobody read.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use signal_hook::consts::{SIGINT, SIGTERM};

/// The process's one set of handlers and the flags they write.
struct Handlers {
    /// The last stop signal's number while armed, else 0.
    which: Arc<AtomicUsize>,
    /// A stop signal arrived while armed: the next one exits at once.
    pending: Arc<AtomicBool>,
    /// No trainer is armed: the signal takes its default action.
    idle: Arc<AtomicBool>,
    /// How many trainers are armed (tests train side by side in one process).
    armed: Mutex<usize>,
}

static HANDLERS: Mutex<Option<Arc<Handlers>>> = Mutex::new(None);

fn handlers() -> Result<Arc<Handlers>> {
    let mut slot = HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = slot.as_ref() {
        return Ok(h.clone());
    }
    let h = Arc::new(Handlers {
        which: Arc::default(),
        pending: Arc::default(),
        idle: Arc::new(AtomicBool::new(true)),
        armed: Mutex::new(0),
    });
    for sig in [SIGINT, SIGTERM] {
        // Handlers run in registration order. Idle: the default action, nothing after it.
        // Armed: the shutdown check sees `pending` as it was before this signal, so only a
        // second signal exits immediately.
        signal_hook::flag::register_conditional_default(sig, h.idle.clone())?;
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, h.pending.clone())?;
        signal_hook::flag::register(sig, h.pending.clone())?;
        signal_hook::flag::register_usize(sig, h.which.clone(), sig as usize)?;
    }
    *slot = Some(h.clone());
    Ok(h)
}

/// Which stop signal arrived while this trainer was armed, if any. Dropping it disarms.
pub struct StopSignal {
    handlers: Arc<Handlers>,
}

impl StopSignal {
    /// Arms the SIGINT and SIGTERM handlers (installing them the first time) until dropped.
    pub fn install() -> Result<Self> {
        let handlers = handlers()?;
        let mut armed = handlers.armed.lock().unwrap_or_else(|e| e.into_inner());
        if *armed == 0 {
            // A signal from an earlier training was answered by it; this one starts clean.
            handlers.which.store(0, Ordering::SeqCst);
            handlers.pending.store(false, Ordering::SeqCst);
            handlers.idle.store(false, Ordering::SeqCst);
        }
        *armed += 1;
        drop(armed);
        Ok(Self { handlers })
    }

    /// Some(signal number) once a stop was requested.
    pub fn received(&self) -> Option<i32> {
        match self.handlers.which.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

impl Drop for StopSignal {
    fn drop(&mut self) {
        let mut armed = self
            .handlers
            .armed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *armed -= 1;
        if *armed == 0 {
            self.handlers.idle.store(true, Ordering::SeqCst);
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

    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, ExitStatus};

    use signal_hook::low_level::raise;

    use super::*;

    const CASE: &str = "LAB_SIGNALS_TEST_CASE";
    /// The child's exit status when its case saw what it expected and was not ended.
    const SURVIVED: i32 = 3;

    fn run_case(case: &str) -> ExitStatus {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "signals::tests::child_case",
                "--ignored",
                "--quiet",
            ])
            .args(["--test-threads", "1"])
            .env(CASE, case)
            .status()
            .unwrap()
    }

    #[test]
    #[ignore = "a child process of the signal tests"]
    fn child_case() {
        let Ok(case) = std::env::var(CASE) else {
            return;
        };
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
                stop(SIGINT); // the default action ends the process here
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
            other => panic!("no case {other}"),
        }
        std::process::exit(SURVIVED);
    }

    #[test]
    fn an_armed_trainer_is_asked_to_stop_by_the_first_signal() {
        assert_eq!(run_case("armed_once").code(), Some(SURVIVED));
        assert_eq!(run_case("two_trainers").code(), Some(SURVIVED));
    }

    #[test]
    fn a_second_signal_while_armed_exits_at_once() {
        assert_eq!(run_case("armed_twice").code(), Some(128 + SIGINT));
    }

    #[test]
    fn after_training_the_first_signal_ends_the_process() {
        let status = run_case("after_training");
        assert_eq!(status.signal(), Some(SIGINT), "{status}");
    }

    #[test]
    fn training_again_starts_without_the_last_trainings_signal() {
        assert_eq!(run_case("trained_again").code(), Some(SURVIVED));
    }
}
