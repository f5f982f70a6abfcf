//! A deadline for calls the calling thread cannot give up on itself. An NCCL collective may
//! block in its host call while it connects to a peer, and its kernel spins on the GPU until
//! every peer joins; neither returns when a peer is dead. So a watchdog thread watches the one
//! call in flight, and past the deadline it ends the process with one line, as PyTorch's NCCL
//! watchdog tears down a stuck rank (the launcher or `lab supervise` restarts the job).
//!
//! Exiting rather than aborting the communicator and returning an error: the call's buffers
//! are still in use by the GPU, and a trainer that has lost a peer can only exit anyway.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::Timeout;

/// What to do with the message once a call is overdue (the process exits; tests record it).
type OnOverdue = Box<dyn Fn(String) + Send>;

/// A thread that ends the process when an armed call outlives its deadline.
pub struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    armed: Mutex<Option<Armed>>,
    changed: Condvar,
}

/// The call in flight: what it is (for the message) and when it started.
#[derive(Debug, Clone, PartialEq)]
pub struct Armed {
    pub what: String,
    pub since: Instant,
}

impl Armed {
    /// The one-line message once `now` is past the deadline, else `None`.
    pub fn overdue(&self, timeout: Timeout, now: Instant) -> Option<String> {
        let waited = now.saturating_duration_since(self.since);
        (waited >= timeout.0).then(|| self.what.clone())
    }
}

/// Disarms the watchdog when the call returns (or unwinds).
pub struct Guard<'a>(&'a Watchdog);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        *self.0.lock() = None;
        self.0.shared.changed.notify_all();
    }
}

impl Watchdog {
    /// A watchdog whose overdue calls end the process with `error: {who}: {what} waited …`.
    pub fn exiting(who: String, timeout: Timeout) -> Self {
        Self::with_action(
            timeout,
            Box::new(move |what| {
                eprintln!(
                    "error: {who}: {}",
                    crate::stuck_peer_message(&what, timeout)
                );
                std::process::exit(1);
            }),
        )
    }

    /// A watchdog that hands an overdue call's description to `on_overdue` once.
    pub fn with_action(timeout: Timeout, on_overdue: OnOverdue) -> Self {
        let shared = Arc::new(Shared {
            armed: Mutex::new(None),
            changed: Condvar::new(),
        });
        let watched = shared.clone();
        std::thread::Builder::new()
            .name("lab-watchdog".into())
            .spawn(move || watch(&watched, timeout, on_overdue))
            .expect("spawning the collectives watchdog thread");
        Watchdog { shared }
    }

    /// Starts the deadline of `what`; it ends when the guard drops.
    pub fn arm(&self, what: &str) -> Guard<'_> {
        *self.lock() = Some(Armed {
            what: what.to_string(),
            since: Instant::now(),
        });
        self.shared.changed.notify_all();
        Guard(self)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Armed>> {
        // A poisoned lock only means a panic elsewhere; the state is a plain value.
        self.shared.armed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The watchdog thread: sleeps until something is armed, then until its deadline. It never
/// ends (it is parked while nothing is armed); the process's exit ends it.
fn watch(shared: &Shared, timeout: Timeout, on_overdue: OnOverdue) {
    let mut armed = shared.armed.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let Some(call) = armed.clone() else {
            armed = shared
                .changed
                .wait(armed)
                .unwrap_or_else(|p| p.into_inner());
            continue;
        };
        if let Some(what) = call.overdue(timeout, Instant::now()) {
            *armed = None;
            drop(armed);
            on_overdue(what);
            armed = shared.armed.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        let left = (call.since + timeout.0).saturating_duration_since(Instant::now());
        // Woken early by a disarm or a new call; rechecks either way.
        let wait = left.max(Duration::from_millis(1));
        armed = shared
            .changed
            .wait_timeout(armed, wait)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_call_is_overdue_exactly_from_its_deadline() {
        let t0 = Instant::now();
        let call = Armed {
            what: "NCCL all_reduce".into(),
            since: t0,
        };
        let timeout = Timeout(30 * SECOND);
        assert_eq!(call.overdue(timeout, t0), None);
        assert_eq!(call.overdue(timeout, t0 + 29 * SECOND), None);
        assert_eq!(
            call.overdue(timeout, t0 + 30 * SECOND).as_deref(),
            Some("NCCL all_reduce")
        );
        // A clock read before `since` (another thread's) is not overdue.
        assert_eq!(call.overdue(timeout, t0 - SECOND), None);
    }

    /// The thread reports a stuck call once, names it, and stays quiet after a disarm.
    /// (Only the order of events is asserted; the waits below are bounds, not speeds.)
    #[test]
    fn the_thread_reports_the_stuck_call_and_not_the_finished_one() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let dog = Watchdog::with_action(
            // Long enough that a descheduled test thread cannot outlive it between arm and drop.
            Timeout(SECOND),
            Box::new(move |what| tx.lock().unwrap().send(what).unwrap()),
        );
        {
            let _finished = dog.arm("broadcast");
        }
        // Past the broadcast's deadline: a disarmed call must not be reported.
        std::thread::sleep(2 * SECOND);
        let stuck = dog.arm("all_gather");
        let reported = rx
            .recv_timeout(60 * SECOND)
            .expect("no report of a stuck call");
        assert_eq!(reported, "all_gather");
        drop(stuck);
        // The finished broadcast never shows: the next (and only other) report is this call's.
        let _late = dog.arm("barrier");
        assert_eq!(rx.recv_timeout(60 * SECOND).unwrap(), "barrier");
    }
}
