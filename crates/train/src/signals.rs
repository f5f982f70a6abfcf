//! SIGINT / SIGTERM: the first one asks the trainer to write an emergency checkpoint and exit
//! (130 / 143); a second one, while the first is pending, ends the process at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Result;
use signal_hook::consts::{SIGINT, SIGTERM};

/// Which stop signal arrived, if any.
#[derive(Clone, Default)]
pub struct StopSignal {
    which: Arc<AtomicUsize>,
    pending: Arc<AtomicBool>,
}

impl StopSignal {
    /// Installs handlers for SIGINT and SIGTERM.
    pub fn install() -> Result<Self> {
        let s = Self::default();
        for sig in [SIGINT, SIGTERM] {
            // Handlers run in registration order: the shutdown check sees `pending` as it was
            // before this signal, so only a second signal exits immediately.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, s.pending.clone())?;
            signal_hook::flag::register(sig, s.pending.clone())?;
            signal_hook::flag::register_usize(sig, s.which.clone(), sig as usize)?;
        }
        Ok(s)
    }

    /// Some(signal number) once a stop was requested.
    pub fn received(&self) -> Option<i32> {
        match self.which.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

/// The conventional exit status for a process stopped by `signal`: 128 + signal.
pub fn exit_code(signal: i32) -> u8 {
    (128 + signal) as u8
}
