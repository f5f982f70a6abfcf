//! Lines for a person watching a long job. A closed stdout (`lab train … | head`) loses them
//! and nothing else: the job goes on, as every line is also in its files. (`println!` panics
//! on a closed pipe, since Rust ignores SIGPIPE.)

use std::io::Write;

/// Writes `text` and a newline to stdout, ignoring a stdout that is gone.
pub fn line(text: &str) {
    let _ = writeln!(std::io::stdout(), "{text}");
}
