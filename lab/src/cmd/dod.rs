//! `lab dod check DIR --spec F`: the Definition-of-Done verdict on an export folder.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use lab_report::dod::{self, Spec};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Check an export folder against a DoD spec; exit 0 only when every check passes.
    Check(CheckArgs),
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The export folder (`lab export --output`).
    dir: PathBuf,
    /// The spec: configs/dod/<lab>.toml.
    #[arg(long)]
    spec: PathBuf,
    /// text (a table), json or junit (JUnit XML, one testcase per check).
    #[arg(long, default_value = "text", value_parser = ["text", "json", "junit"])]
    format: String,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Command::Check(a) = args.command;
    let spec = Spec::load(&a.spec)?;
    // A run folder, or any folder without a manifest, gets one line rather than a table of
    // "no manifest.json" failures.
    if !a.dir.join(lab_report::manifest::MANIFEST).is_file() {
        anyhow::bail!(
            "{} is not an export folder (no manifest.json): run lab export --output DIR first, and check DIR",
            a.dir.display()
        );
    }
    let verdict = dod::check(&a.dir, &spec);
    print!(
        "{}",
        match a.format.as_str() {
            "json" => verdict.render_json(),
            "junit" => verdict.render_junit(),
            _ => verdict.render_text(),
        }
    );
    Ok(if verdict.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
