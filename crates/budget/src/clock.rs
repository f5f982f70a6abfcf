//! Wall-clock time: the run folder's timestamp format (from lab-run) and the machine's boot
//! time, which on a rented instance is when its billing started.

pub use lab_run::clock::{format_utc, now_unix, parse_utc};

/// Time as loops that wait see it: injected so tests count polls instead of timing them.
pub trait Clock {
    fn now(&self) -> f64;
    fn sleep(&self, secs: f64);
}

/// The machine's clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        now_unix()
    }
    fn sleep(&self, secs: f64) {
        std::thread::sleep(std::time::Duration::from_secs_f64(secs.max(0.0)));
    }
}

/// Boot time of this machine (Linux `/proc/stat` `btime`): on a rented instance, when the
/// instance started, which is when its billing started.
pub fn boot_time_unix() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn boot_time_is_in_the_past() {
        assert!(super::boot_time_unix()
            .map(|b| b < super::now_unix())
            .unwrap_or(true));
    }
}
