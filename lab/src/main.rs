//! `lab`: a reproducible LLM pretraining lab harness. One thin module per subcommand in
//! `cmd/`; the work itself lives in the `crates/` libraries.

mod cmd;
mod crash;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (the 16th option of the v3 mimalloc.h that
/// libmimalloc-sys builds; also 15 in v2).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// By default mimalloc hands freed pages back to the kernel after a delay (1 s in v3), and a
/// training step frees and reallocates the same buffers every step, so steps page-fault them
/// back in. Keep them (the process's RSS stays at its peak), unless the user set
/// `MIMALLOC_PURGE_DELAY` themselves.
fn keep_freed_pages() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an allocator option; mimalloc reads it at its next purge decision.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

#[derive(Parser)]
#[command(
    name = "lab",
    version,
    about = "Reproducible LLM pretraining lab harness"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole lab end to end: prepare → train with a spike → post-mortem → export → DoD.
    Run(cmd::run::Args),
    /// Train a model from a config (checkpoints, resume, metrics, budget guard).
    Train(cmd::train::Args),
    /// Time training steps of a config: tokens/s and the forward/backward/optimizer split.
    Bench(cmd::bench::Args),
    /// Parameters, FLOPs, memory per GPU, GPU-hours, wall clock and dollars for a config and
    /// cluster; `--check-lab` checks a lab page's promises.
    Plan(cmd::plan::Args),
    /// Billing sidecar (writes budget.json), one-shot guard check, instance termination.
    Budget(cmd::budget::Args),
    /// Prepare token data (read, clean, dedup, redact, decontaminate, tokenize) and plan shards.
    Data(cmd::data::Args),
    /// Train a byte-level BPE tokenizer; fertility report per document type.
    Tokenizer(cmd::tokenizer::Args),
    /// Write spike-postmortem.md from a run folder's metrics and events.
    Postmortem(cmd::postmortem::Args),
    /// Export a run: manifest, metrics.csv, plots, final weights, model card; Hugging Face;
    /// MLflow.
    Export(cmd::export::Args),
    /// Definition-of-Done verdict on an export folder (text, JSON or JUnit).
    Dod(cmd::dod::Args),
    /// Where a run stands: step, loss trend, tokens/s, MFU, spend, ETA, alerts, projection.
    Status(cmd::status::Args),
    /// Several runs' loss curves on one chart (PNG), as CSV and as a table.
    Compare(cmd::compare::Args),
    /// Perplexity by document type, multiple-choice probes, memorization probe on a checkpoint.
    Eval(cmd::eval::Args),
    /// Text from a checkpoint (KV cache; greedy or sampled, deterministic for a seed).
    Generate(cmd::generate::Args),
    /// Relaunch a (data-parallel) job when it dies, torchrun-style: `lab supervise -- mpirun …`.
    Supervise(cmd::supervise::Args),
}

fn main() -> ExitCode {
    keep_freed_pages();
    crash::install();
    let cli = Cli::parse(); // usage errors exit 2 (clap)
    if cli.command.only_reports() {
        end_quietly_on_a_closed_pipe();
    }
    crash::exit_code_of(|| run(cli.command))
}

impl Command {
    /// Commands that only read and print: piped into `head` or `grep -m1`, they may stop
    /// when the reader has seen enough. The rest write runs, data or exports, or talk to a
    /// job, and keep Rust's default (a write to a closed pipe is an error they handle).
    fn only_reports(&self) -> bool {
        matches!(
            self,
            Command::Plan(_)
                | Command::Status(_)
                | Command::Compare(_)
                | Command::Dod(_)
                | Command::Eval(_)
                | Command::Generate(_)
        ) || matches!(self, Command::Data(a) if a.only_reports())
    }
}

/// SIGPIPE back to its default action, as in any Unix tool: a closed pipe ends the process
/// silently instead of a "failed printing to stdout" panic. Rust starts programs with it
/// ignored.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: restores a signal's default disposition before any other thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Run(args) => cmd::run::run(args),
        Command::Train(args) => cmd::train::run(args),
        Command::Supervise(args) => cmd::supervise::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Budget(args) => cmd::budget::run(args),
        Command::Data(args) => cmd::data::run(args),
        Command::Tokenizer(args) => cmd::tokenizer::run(args),
        Command::Postmortem(args) => cmd::postmortem::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Dod(args) => cmd::dod::run(args),
        Command::Status(args) => cmd::status::run(args),
        Command::Compare(args) => cmd::compare::run(args),
        Command::Eval(args) => cmd::eval::run(args),
        Command::Generate(args) => cmd::generate::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            // One line: the context chain joined by ": " (a parser's multi-line message
            // joined by "; "), never a panic trace.
            eprintln!("error: {}", cmd::one_line(&format!("{err:#}")));
            let usage = err.chain().any(|e| e.is::<cmd::Usage>());
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}
