//! A panic is a bug in lab or in a library beneath it, never the user's mistake, yet it ends
//! the way every error does (the README's exit codes: 1, one clear line, no trace): the hook
//! prints one line saying where it happened, and `main` turns the unwinding into exit code 1.
//! What a run publishes (checkpoints, exports, data) appears by rename, so a panic leaves no
//! half-written output. A panic caught on purpose (the billing sidecar's response parsers)
//! prints its line too, and the work goes on.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe, Location};
use std::process::ExitCode;

/// Replaces Rust's panic report with one line (the full report when `RUST_BACKTRACE` asks
/// for a trace).
pub fn install() {
    let report = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let trace = std::env::var("RUST_BACKTRACE").is_ok_and(|v| !v.is_empty() && v != "0");
        if trace {
            report(info);
        } else {
            eprintln!("{}", panic_line(info.payload(), info.location()));
        }
    }));
}

/// Runs `command`; a panic anywhere inside it ends the process with exit code 1.
pub fn exit_code_of(command: impl FnOnce() -> ExitCode) -> ExitCode {
    panic::catch_unwind(AssertUnwindSafe(command)).unwrap_or(ExitCode::from(1))
}

/// `error: internal error at FILE:LINE: MESSAGE (…)`, the message's lines joined by "; ".
fn panic_line(payload: &dyn Any, at: Option<&Location>) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string());
    let at = at.map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
    format!(
        "error: internal error{at}: {} (a bug in lab or a library it uses, not in your input; please report it with the command line, and RUST_BACKTRACE=1 for the trace)",
        crate::cmd::one_line(&message)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_message_becomes_one_line_naming_where() {
        let at = Location::caller();
        let line = panic_line(&"index out of bounds", Some(at));
        assert!(line.starts_with(&format!(
            "error: internal error at {}:{}: index out of bounds (",
            at.file(),
            at.line()
        )));
        let multi = String::from("kernel failed\n  shape [2, 3]\n\n  dtype bf16\n");
        let line = panic_line(&multi, None);
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.starts_with("error: internal error: kernel failed; shape [2, 3]; dtype bf16 (")
        );
        assert!(panic_line(&42u8, None).contains("(no message)"));
    }

    #[test]
    fn a_panicking_command_exits_1_and_a_finished_one_keeps_its_code() {
        let code = |c: ExitCode| format!("{c:?}");
        assert_eq!(
            code(exit_code_of(|| panic!("deliberate, in a test"))),
            code(ExitCode::from(1))
        );
        assert_eq!(
            code(exit_code_of(|| ExitCode::from(5))),
            code(ExitCode::from(5))
        );
    }
}
