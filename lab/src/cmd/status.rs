//! `lab status --run DIR`: where a run stands, while it trains or after.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// The run folder (`lab train --ckpt-dir`).
    #[arg(long)]
    pub run: PathBuf,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Refresh until the run stops running (Ctrl-C to leave).
    #[arg(long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 5.0)]
    pub interval: f64,
    /// Fit the projection only on the logs up to this step (check a projection against how
    /// the run really ended).
    #[arg(long, value_name = "STEP")]
    pub fit_until: Option<u64>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    // An hour at most: `inf` or `1e300` would not fit a sleep, NaN never ends one.
    if !(0.2..=3600.0).contains(&args.interval) {
        super::bail_usage!(
            "--interval {} must be from 0.2 to 3600 seconds",
            args.interval
        );
    }
    loop {
        let s = lab_report::status::status_fitted_until(&args.run, args.fit_until)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            if args.watch {
                print!("\x1b[2J\x1b[H"); // clear the screen, cursor home
            }
            print!("{}", s.render(&args.run));
        }
        if !args.watch || s.state != "running" {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_secs_f64(args.interval));
    }
}
