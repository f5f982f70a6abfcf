//! `lab postmortem`: spike-postmortem.md (and a PNG per spike) from a run folder's own files.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// The run folder (`lab train --ckpt-dir`).
    #[arg(long)]
    pub run: PathBuf,
    /// Where to write the markdown (PNGs go beside it); a folder gets spike-postmortem.md
    /// inside it. Default: RUN/spike-postmortem.md.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let pm = lab_report::Postmortem::read(&args.run)?;
    let output = args.output.map(|o| match o.is_dir() {
        true => o.join("spike-postmortem.md"),
        false => o,
    });
    let out = pm.write(output.as_deref())?;
    match pm.spikes.len() {
        0 => println!(
            "no loss spike in {}; report: {}",
            args.run.display(),
            out.display()
        ),
        n => println!("{n} spike(s); report: {}", out.display()),
    }
    Ok(ExitCode::SUCCESS)
}
