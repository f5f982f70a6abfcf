//! `lab compare`: several runs' loss curves on one chart (PNG), as CSV, and as a table of the
//! steps they all logged. The work is in lab-report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  lab compare --run swap=runs/swap --run scratch=runs/scratch --output curves.png --csv curves.csv"
)]
pub struct Args {
    /// A run folder to compare, as LABEL=DIR (or DIR, labelled by its folder name); repeatable.
    #[arg(long, required = true, value_name = "LABEL=DIR")]
    pub run: Vec<String>,
    /// The chart (PNG): training and validation loss by step, a line per run.
    #[arg(long, short, default_value = "compare.png")]
    pub output: PathBuf,
    /// Also write the points as CSV (run,step,loss,val_loss).
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let runs: Vec<(String, PathBuf)> = args.run.iter().map(|r| labelled(r)).collect();
    let curves = lab_report::compare::read_curves(&runs)?;
    lab_report::compare::write_png(&curves, &args.output)
        .with_context(|| format!("--output {}", args.output.display()))?;
    if let Some(csv) = &args.csv {
        lab_fsio::write_atomic(csv, lab_report::compare::csv(&curves).as_bytes())
            .with_context(|| format!("--csv {}", csv.display()))?;
    }
    print!("{}", lab_report::compare::table(&curves));
    println!("chart: {}", args.output.display());
    Ok(ExitCode::SUCCESS)
}

/// `LABEL=DIR`, or `DIR` labelled by its last component.
fn labelled(arg: &str) -> (String, PathBuf) {
    match arg.split_once('=') {
        Some((label, dir)) if !label.is_empty() => (label.to_string(), PathBuf::from(dir)),
        _ => {
            let dir = PathBuf::from(arg);
            let label = dir
                .file_name()
                .map_or(arg.into(), |n| n.to_string_lossy().into_owned());
            (label, dir)
        }
    }
}
