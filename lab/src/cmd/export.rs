//! `lab export`: a run folder → an export folder (manifest, metrics.csv, plots, final weights,
//! post-mortem, model card), a Hugging Face folder, and/or an MLflow run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use lab_report::{ExportOptions, RunFiles};

#[derive(clap::Args)]
// Where to export is a usage question (exit 2, with clap's usage line): one of the two at least.
#[command(group = clap::ArgGroup::new("destination").required(true).multiple(true).args(["output", "hf"]))]
pub struct Args {
    /// The run folder (`lab train --ckpt-dir`).
    #[arg(long)]
    pub run: PathBuf,
    /// The export folder, e.g. experiments/<lab>/<run>/ (replaced atomically).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also (or only) write a Hugging Face LlamaForCausalLM folder here.
    #[arg(long, value_name = "DIR")]
    pub hf: Option<PathBuf>,
    /// Which checkpoint: latest (default), best, a step number, or step-N.
    #[arg(long, default_value = "latest")]
    pub checkpoint: String,
    /// budget.json to take the spend from (default RUN/budget.json).
    #[arg(long)]
    pub budget: Option<PathBuf>,
    /// Also log the run, with the export as artifacts, to an MLflow file store.
    #[arg(long, value_name = "URI")]
    pub mlflow_uri: Option<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let choice = super::checkpoint_choice(&args.checkpoint)?;
    check_destinations(&args)?;
    check_mlflow_uri(args.mlflow_uri.as_deref(), true)?;
    if let Some(budget) = &args.budget {
        check_budget_file(budget)?;
    }
    if let Some(out) = &args.output {
        let m = lab_report::export(&ExportOptions {
            run: args.run.clone(),
            output: out.clone(),
            checkpoint: choice,
            budget: args.budget.clone(),
        })?;
        println!(
            "exported {} (step {}, final val loss {}) to {}:",
            args.run.display(),
            m.checkpoint_step,
            m.final_metrics
                .val_loss
                .map_or("–".into(), |v| format!("{v:.4}")),
            out.display()
        );
        for name in m
            .artifacts
            .keys()
            .chain(std::iter::once(&"manifest.json".to_string()))
        {
            println!("  {}", out.join(name).display());
        }
    }
    if let Some(hf) = &args.hf {
        lab_report::hf::export_hf(&args.run, hf, choice)?;
        println!(
            "Hugging Face folder: {} (LlamaForCausalLM; check with scripts/reference/hf_parity.py {})",
            hf.display(),
            hf.display()
        );
    }
    if let Some(uri) = &args.mlflow_uri {
        log_mlflow(uri, &args.run, args.output.as_deref());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--hf`'s destination, checked before `--output` is written (whose own check comes first
/// in the export): a refused `--hf` must not follow a finished `--output`.
fn check_destinations(args: &Args) -> Result<()> {
    if let Some(hf) = &args.hf {
        lab_report::export::check_destination(hf, lab_report::hf::PARITY_FILE)?;
    }
    if args.output.is_some() && args.output == args.hf {
        super::bail_usage!("--output and --hf name the same folder: give each its own");
    }
    Ok(())
}

/// `--budget F` names the spend to record: a file that is missing or holds no spend is an
/// error now, not a manifest without its cost.
fn check_budget_file(path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--budget {}: cannot read it", path.display()))?;
    let spent = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["spent_usd"].as_f64());
    if spent.is_none() {
        bail!(
            "--budget {}: not a budget.json with a spent_usd (the sidecar's file, or leave --budget out to use the run's)",
            path.display()
        );
    }
    Ok(())
}

/// `--mlflow-uri` before any work: a store lab does not write is a usage error, and one it
/// cannot create (`create`: the process that will log) an error, now rather than a warning
/// once the run is over.
pub fn check_mlflow_uri(uri: Option<&str>, create: bool) -> Result<()> {
    let Some(uri) = uri else {
        return Ok(());
    };
    if let Err(e) = lab_report::mlflow::store_root(uri) {
        super::bail_usage!("{e:#}");
    }
    if create {
        lab_report::mlflow::open(uri)?;
    }
    Ok(())
}

/// Logs a run to MLflow; a failure is a warning (the run itself is fine).
pub fn log_mlflow(uri: &str, run: &Path, artifacts: Option<&Path>) {
    let logged = RunFiles::read(run).and_then(|f| lab_report::mlflow::log_run(uri, &f, artifacts));
    match logged {
        Ok(l) => lab_fsio::console::line(&format!(
            "mlflow: run {} in experiment {} ({}); view with MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {uri}",
            l.run_id,
            l.experiment_id,
            l.run_dir.display()
        )),
        Err(e) => eprintln!("warning: --mlflow-uri {uri}: {e:#}"),
    }
}
