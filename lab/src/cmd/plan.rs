//! `lab plan`: parameters, FLOPs, memory per GPU, GPU-hours, wall clock and dollars for a
//! config on a cluster (`--config`), or a lab page's promises checked against the arithmetic
//! (`--check-lab`). The work is in lab-plan; this module maps flags to a request.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use lab_plan::units::parse_count;
use lab_plan::{PlanRequest, Price, Target};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  lab plan --config configs/med-7b-256xa100.toml --gpus 256 --tokens 200B --mfu 0.45 --price 3 --tp 2 --fsdp 128\n  lab plan --config configs/med-7b-256xa100.toml --gpus 256 --tokens 200e9 --batch-tokens 4e6 --mfu 0.45 --price 3 --params 6.7e9\n  lab plan --config configs/medgemma-27b-320xh200.toml --gpus 320 --zero 3 --hours 336 --quote 125\n  lab plan --check-lab configs/lab/lab00-a100.toml"
)]
pub struct Args {
    /// Config (TOML preset) to plan.
    #[arg(
        long,
        short,
        value_name = "FILE",
        required_unless_present = "check_lab"
    )]
    pub config: Option<PathBuf>,
    /// Check a lab page's promises (configs/lab/*.toml) against the arithmetic; exit 1 if
    /// one does not hold.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub check_lab: Option<PathBuf>,
    /// Device from the hardware table (default: the config's [hardware].device).
    #[arg(long)]
    pub device: Option<String>,
    /// GPUs in the cluster [default: the config's `[parallel]` dp × tp × pp, else 1].
    #[arg(long)]
    pub gpus: Option<usize>,
    /// GPUs per node [default: 8, or --gpus when fewer].
    #[arg(long)]
    pub gpus_per_node: Option<usize>,
    /// Tokens to train, e.g. 200e9 or 200B [default: train.total_steps × global batch].
    #[arg(long, value_parser = parse_count)]
    pub tokens: Option<f64>,
    /// Wall-clock deadline or rental period in hours (what it buys, and whether the plan fits).
    #[arg(long)]
    pub hours: Option<f64>,
    /// Global batch in tokens per optimizer step [default: the config's per-GPU batch × --gpus].
    #[arg(long, value_parser = parse_count)]
    pub batch_tokens: Option<f64>,
    /// Sequences per forward/backward per replica [default: train.micro_batch].
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// Model FLOP utilization; a comma-separated list plans each [default: 0.40].
    #[arg(long, value_delimiter = ',')]
    pub mfu: Vec<f64>,
    /// $/GPU-hour as USD or NAME=USD, repeatable [default: the device's on-demand, spot and
    /// GPU-cloud prices].
    #[arg(long = "price", value_name = "[NAME=]USD")]
    pub prices: Vec<Price>,
    /// Wall clock ÷ compute time, for evals, restarts and stragglers [default: 1.0].
    #[arg(long)]
    pub overhead: Option<f64>,
    /// Tensor-parallel degree [default: the config's `[parallel]`, else 1].
    #[arg(long)]
    pub tp: Option<usize>,
    /// Pipeline-parallel degree [default: the config's `[parallel]`, else 1].
    #[arg(long)]
    pub pp: Option<usize>,
    /// ZeRO stage 0-3 [default: 3 with --fsdp, else the config's `[parallel]`, else 0].
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// ZeRO/FSDP sharding degree [default: all data-parallel ranks].
    #[arg(long)]
    pub fsdp: Option<usize>,
    /// `none` or `selective` activation checkpointing (as train.activation_checkpointing
    /// trains) [default: the config's].
    #[arg(long)]
    pub activation_checkpointing: Option<lab_config::ActivationCheckpointing>,
    /// Steps between checkpoints [default: train.ckpt_every].
    #[arg(long)]
    pub ckpt_every: Option<usize>,
    /// Checkpoint storage write bandwidth in GB/s [default: 1].
    #[arg(long)]
    pub storage_gbps: Option<f64>,
    /// Dollar cap: warn when a price overruns it, and show what it buys.
    #[arg(long)]
    pub budget_usd: Option<f64>,
    /// Plan with this parameter count instead of the config's exact one (e.g. a case
    /// study's 6.7e9).
    #[arg(long, value_parser = parse_count)]
    pub params: Option<f64>,
    /// A quoted $/hour of unstated unit ("$125/h for 320 GPUs"): priced per cluster, per node
    /// and per GPU, and flagged if implausible.
    #[arg(long, value_parser = lab_plan::prices::parse_usd)]
    pub quote: Option<f64>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    pub fn request(&self) -> PlanRequest {
        PlanRequest {
            device: self.device.clone(),
            gpus: self.gpus,
            gpus_per_node: self.gpus_per_node,
            tokens: self.tokens,
            hours: self.hours,
            batch_tokens: self.batch_tokens,
            micro_batch: self.micro_batch,
            mfu: self.mfu.clone(),
            prices: self.prices.clone(),
            overhead: self.overhead,
            tp: self.tp,
            pp: self.pp,
            zero: self.zero,
            fsdp: self.fsdp,
            activation_checkpointing: self.activation_checkpointing,
            ckpt_every: self.ckpt_every,
            storage_gb_per_s: self.storage_gbps,
            budget_usd: self.budget_usd,
            params: self.params,
            quote_usd_per_hour: self.quote,
        }
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let target = match (&args.check_lab, &args.config) {
        (Some(page), _) => Target::LabPage(page),
        (None, Some(config)) => Target::Config(config),
        (None, None) => super::bail_usage!("lab plan needs --config FILE or --check-lab FILE"),
    };
    let output = lab_plan::execute(target, &args.request(), args.json)?;
    print!("{}", output.text);
    match output.failure {
        Some(failure) => bail!("{failure}"),
        None => Ok(ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("plan").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn flags_map_to_the_request() {
        let a = parse(&[
            "--config",
            "c.toml",
            "--gpus",
            "256",
            "--tokens",
            "200B",
            "--mfu",
            "0.35,0.45",
            "--price",
            "3",
            "--price",
            "spot=1.2",
            "--tp",
            "2",
            "--fsdp",
            "128",
            "--params",
            "6.7e9",
            "--quote",
            "$125",
            "--json",
        ])
        .unwrap();
        let r = a.request();
        assert_eq!(r.gpus, Some(256));
        assert_eq!(r.tokens, Some(200e9));
        assert_eq!(r.mfu, vec![0.35, 0.45]);
        assert_eq!(r.prices.len(), 2);
        assert_eq!(r.prices[1].name, "spot");
        assert_eq!((r.tp, r.fsdp, r.zero), (Some(2), Some(128), None));
        assert_eq!(r.params, Some(6.7e9));
        assert_eq!(r.quote_usd_per_hour, Some(125.0));
        assert!(a.json);
    }

    #[test]
    fn usage_errors() {
        use clap::error::ErrorKind;
        let kind = |argv: &[&str]| parse(argv).err().map(|e| e.kind());
        assert_eq!(kind(&[]), Some(ErrorKind::MissingRequiredArgument));
        assert_eq!(
            kind(&["--config", "a", "--check-lab", "b"]),
            Some(ErrorKind::ArgumentConflict)
        );
        assert_eq!(
            kind(&["--config", "a", "--zero", "4"]),
            Some(ErrorKind::ValueValidation)
        );
        assert_eq!(
            kind(&["--config", "a", "--tokens", "lots"]),
            Some(ErrorKind::ValueValidation)
        );
        assert_eq!(
            kind(&["--config", "a", "--price", "spot=x"]),
            Some(ErrorKind::ValueValidation)
        );
        assert!(parse(&["--check-lab", "b"]).is_ok());
    }
}
