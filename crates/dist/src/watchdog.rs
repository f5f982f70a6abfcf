//! A deadline for calls the calling thread cannot give up on itself. The NCCL backend's calls
//! block: creating a communicator and a collective's first use of a peer connect to it, and
//! the copy back waits on the stream while the kernel spins until every peer joins; none of
//! them returns when a peer is dead. So a watchdog thread watches the one call in flight, and
//! past the deadline it ends the process with one line, as PyTorch's NCCL watchdog tears down
//! a stuck rank (the launcher or `lab supervise` restarts the job).
//!
//! Exiting rather than aborting the communicator and returning an error: the call's buffers
//! are still in use by the GPU, and a trainer that has lost a peer can only exit anyway.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::Timeout;

/// What to do with the call's name once it is overdue (the process exits; tests record it).
type OnOverdue = Box<dyn Fn(&'static str) + Send>;

/// A thread that acts when the armed call outlives its deadline: [`Watchdog::exiting`] ends
/// the process. One call is watched at a time.
pub struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    armed: Option<Armed>,
    /// The watchdog was dropped: its thread ends.
    closed: bool,
}

/// The call in flight: what it is (for the message) and when it started.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Armed {
    what: &'static str,
    since: Instant,
}

impl Armed {
    /// How long the call may still run at `now` (zero once it is overdue).
    fn left(&self, timeout: Timeout, now: Instant) -> Duration {
        timeout
            .0
            .saturating_sub(now.saturating_duration_since(self.since))
    }
}

/// Disarms the watchdog when the call returns (or unwinds).
#[must_use = "the call is watched only while the guard lives"]
pub struct Guard<'a>(&'a Watchdog);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.lock().armed = None;
        self.0.shared.changed.notify_all();
    }
}

impl Watchdog {
    /// A watchdog whose overdue call ends the process with `error: {who}: {what} waited …`.
    pub fn exiting(who: String, timeout: Timeout) -> anyhow::Result<Self> {
        Self::with_action(
            timeout,
            Box::new(move |what| {
                eprintln!("error: {who}: {}", crate::stuck_peer_message(what, timeout));
                // `_exit`, not `exit`: the C libraries' exit handlers (CUDA's, NCCL's) may
                // wait on the very call that is stuck.
                // SAFETY: ends the process; nothing runs after it.
                unsafe { libc::_exit(1) }
            }),
        )
    }

    /// A watchdog that hands an overdue call's name to `on_overdue` once.
    fn with_action(timeout: Timeout, on_overdue: OnOverdue) -> anyhow::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let watched = shared.clone();
        std::thread::Builder::new()
            .name("lab-watchdog".into())
            .spawn(move || watch(&watched, timeout, on_overdue))
            .map_err(|e| anyhow::anyhow!("cannot start the collectives watchdog thread: {e}"))?;
        Ok(Watchdog { shared })
    }

    /// Starts the deadline of `what`; it ends when the guard drops.
    pub fn arm(&self, what: &'static str) -> Guard<'_> {
        self.lock().armed = Some(Armed {
            what,
            since: Instant::now(),
        });
        self.shared.changed.notify_all();
        Guard(self)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.lock().closed = true;
        self.shared.changed.notify_all();
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A poisoned lock only means a panic elsewhere; the state is plain values.
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// The watchdog thread: sleeps until a call is armed, then until its deadline (woken early by
/// a disarm or a new call, it rechecks); ends when the watchdog is dropped.
fn watch(shared: &Shared, timeout: Timeout, on_overdue: OnOverdue) {
    let mut state = lock(shared);
    while !state.closed {
        let Some(call) = state.armed else {
            state = shared
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
            continue;
        };
        let left = call.left(timeout, Instant::now());
        if left.is_zero() {
            state.armed = None;
            drop(state);
            on_overdue(call.what);
            state = lock(shared);
            continue;
        }
        state = shared
            .changed
            .wait_timeout(state, left)
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
            what: "NCCL all_reduce",
            since: t0,
        };
        let timeout = Timeout(30 * SECOND);
        assert_eq!(call.left(timeout, t0), 30 * SECOND);
        assert_eq!(call.left(timeout, t0 + 29 * SECOND), SECOND);
        assert!(call.left(timeout, t0 + 30 * SECOND).is_zero());
        assert!(call.left(timeout, t0 + 31 * SECOND).is_zero());
        // "Forever" (a timeout too long to add to an instant) does not overflow.
        assert_eq!(call.left(Timeout(Duration::MAX), t0), Duration::MAX);
    }

    /// The thread reports a stuck call once, names it, and stays quiet after a disarm.
    /// (Only the order of events is asserted; the waits below are bounds, not speeds.)
    #[test]
    fn the_thread_reports_the_stuck_call_and_not_the_finished_one() {
        let (tx, rx) = mpsc::channel();
        let dog = Watchdog::with_action(
            // Long enough that a descheduled test thread cannot outlive it between arm and drop.
            Timeout(SECOND),
            Box::new(move |what| tx.send(what).unwrap()),
        )
        .unwrap();
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

    /// Dropping the watchdog ends its thread: the action (and the channel it owns) goes.
    #[test]
    fn dropping_the_watchdog_ends_its_thread() {
        let (tx, rx) = mpsc::channel::<&'static str>();
        let dog = Watchdog::with_action(
            Timeout(3600 * SECOND),
            Box::new(move |what| tx.send(what).unwrap()),
        )
        .unwrap();
        drop(dog);
        // The sender lived in the thread's closure: once the thread ends, the channel closes.
        assert_eq!(
            rx.recv_timeout(60 * SECOND),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
