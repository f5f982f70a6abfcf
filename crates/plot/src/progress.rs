//! indicatif progress bars in one house style.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar on stderr (hidden when `show` is false) for `total` units. `what` names the work;
/// `units` is the indicatif template for position/length (`{pos}/{len} steps`,
/// `{bytes}/{total_bytes} {bytes_per_sec}` …).
pub fn progress_bar(what: &str, units: &str, total: u64, show: bool) -> ProgressBar {
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let template = format!("{what} [{{elapsed_precise}}] [{{bar:30}}] {units} eta {{eta}} {{msg}}");
    bar.set_style(
        ProgressStyle::with_template(&template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    if show {
        bar.enable_steady_tick(Duration::from_millis(250));
    }
    bar
}
