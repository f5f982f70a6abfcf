//! `lab data prepare` (corpus → train.bin / val.bin / meta.json) and `lab data shards`
//! (shard plan for N nodes × G GPUs). The work is in lab-corpus.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use lab_corpus::prepare::{prepare, prepare_stage, PrepareConfig, Split, Stage};
use lab_corpus::reader::ReadOptions;
use lab_corpus::shards::{plan, ShardRequest};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: DataCommand,
}

impl Args {
    /// `shards` and `deid-probe` only print (see `main`'s closed-pipe handling).
    pub fn only_reports(&self) -> bool {
        matches!(
            self.command,
            DataCommand::Shards(_) | DataCommand::DeidProbe(_)
        )
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Corpus → clean/dedup/redact/decontaminate → tokenize → train.bin / val.bin + meta.json.
    Prepare(Box<PrepareArgs>),
    /// Shard plan of a prepared data dir for N nodes × G GPUs and a global batch.
    Shards(ShardsArgs),
    /// The de-identification probe: planted vs leaked PHI per Safe Harbor category on synthetic
    /// notes, over-redaction of MedQuAD with examples, redaction MB/s.
    DeidProbe(super::deid_probe::DeidProbeArgs),
}

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    lab data prepare --input crates/data/corpora/tinyshakespeare.txt --split chars:0.9 --output-dir data/shakespeare\n  \
    lab data prepare --input crates/corpus/corpora/medquad.jsonl.zst --type-field source --all-filters \\\n    \
    --decontaminate crates/corpus/corpora/mmlu-medical.jsonl --val-fraction 0.01 --workers 2 --output-dir data/medquad\n  \
    lab data prepare --input fineweb-edu/sample/10BT --tokenizer gpt2 --val-fraction 0.001 --workers 16 --output-dir data/fineweb\n\n\
    Spread over 3 machines (scripts/slurm/prepare.sbatch), each stage with the same flags:\n  \
    lab data prepare … --part 0 --of 3   (and --part 1, --part 2, at once)\n  \
    lab data prepare … --stage dedup --of 3\n  \
    lab data prepare … --stage finalize --of 3")]
pub struct PrepareArgs {
    /// Input file or directory (.txt, .jsonl, .jsonl.zst, .parquet); repeatable.
    #[arg(long, short, required = true, value_name = "PATH")]
    pub input: Vec<PathBuf>,
    /// Where train.bin, val.bin and meta.json go.
    #[arg(long, short, value_name = "DIR")]
    pub output_dir: PathBuf,
    /// `gpt2` (tiktoken's GPT-2 BPE) or a tokenizer.json from `lab tokenizer train`.
    #[arg(long, default_value = "gpt2")]
    pub tokenizer: String,
    /// JSON key / parquet column holding the text.
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// JSON key / parquet column naming the document type (per-type report).
    #[arg(long)]
    pub type_field: Option<String>,
    /// Fraction of documents (seeded, by content) that go to val.bin.
    #[arg(long, default_value_t = 0.001, conflicts_with = "split")]
    pub val_fraction: f64,
    /// `chars:F`: nanoGPT's split of one plain-text document at fraction F of its characters
    /// (no end-of-text tokens), e.g. chars:0.9 for tinyshakespeare.
    #[arg(long, value_name = "chars:F")]
    pub split: Option<String>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Tokenizer threads (the output is identical for any count) [default: all cores].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Unicode NFC, control characters dropped, whitespace normalised.
    #[arg(long)]
    pub clean: bool,
    /// Drop documents under N tokens.
    #[arg(long, value_name = "N")]
    pub min_tokens: Option<u64>,
    /// Drop documents whose visible characters are more than F non-alphanumeric.
    #[arg(long, value_name = "F")]
    pub max_non_alnum: Option<f64>,
    /// Exact (hash) and MinHash near-duplicate removal.
    #[arg(long)]
    pub dedup: bool,
    /// Jaccard similarity at which a document is a near-duplicate.
    #[arg(long, default_value_t = 0.8)]
    pub near_dup_threshold: f64,
    /// Replace PHI (MRN, SSN, phone, fax, e-mail, URLs with ids, dates, names) by typed
    /// placeholders.
    #[arg(long)]
    pub redact: bool,
    /// With --redact: cut each document at its first date after YYYY-MM-DD.
    #[arg(long, value_name = "YYYY-MM-DD", requires = "redact")]
    pub anchor_date: Option<String>,
    /// Eval set (JSONL) to decontaminate against (13-gram overlap ≥ 70%); repeatable.
    #[arg(long, value_name = "FILE")]
    pub decontaminate: Vec<PathBuf>,
    /// --clean --redact --dedup --min-tokens 50 --max-non-alnum 0.5 (the medical pipeline).
    #[arg(long)]
    pub all_filters: bool,
    /// Larger documents / JSON lines are skipped and counted.
    #[arg(long, default_value_t = 32 << 20, value_name = "BYTES")]
    pub max_doc_bytes: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// A prepare spread over N processes: `part` (with --part I --of N: records of part I,
    /// tokens and MinHash signatures into OUTPUT_DIR/parts/), then `dedup` (cross-part
    /// duplicates from the signatures), then `finalize` (train.bin / val.bin / meta.json,
    /// identical to one process). Every stage takes the same flags.
    #[arg(long, value_enum, requires = "of")]
    pub stage: Option<StageArg>,
    /// This process's part, 0 to N-1 (e.g. $SLURM_ARRAY_TASK_ID).
    #[arg(long, requires = "of", value_name = "I")]
    pub part: Option<usize>,
    /// The number of parts.
    #[arg(long, value_name = "N")]
    pub of: Option<usize>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageArg {
    Part,
    Dedup,
    Finalize,
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example:\n  lab data shards --data-dir data/fineweb --nodes 128 --gpus-per-node 8 --global-batch-tokens 4194304 --seq-len 4096"
)]
pub struct ShardsArgs {
    /// A prepared data dir (meta.json + train.bin).
    #[arg(long)]
    pub data_dir: PathBuf,
    #[arg(long)]
    pub nodes: u64,
    #[arg(long)]
    pub gpus_per_node: u64,
    /// Tokens per optimizer step across all ranks.
    #[arg(long)]
    pub global_batch_tokens: u64,
    #[arg(long, default_value_t = 1024)]
    pub seq_len: u64,
    /// Shards per rank [default: enough that none exceeds 100M tokens].
    #[arg(long)]
    pub shards_per_rank: Option<u64>,
    /// Where the plan (JSON) goes [default: DATA_DIR/shards.json].
    #[arg(long)]
    pub output: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        DataCommand::Prepare(a) => run_prepare(*a),
        DataCommand::Shards(a) => run_shards(a),
        DataCommand::DeidProbe(a) => super::deid_probe::run(a),
    }
}

/// `lab data prepare`'s flags parsed from a list (a lab page's `[run.prepare] args`).
#[derive(clap::Parser)]
#[command(name = "lab data prepare", no_binary_name = true)]
struct PrepareLine {
    #[command(flatten)]
    args: PrepareArgs,
}

/// Runs `lab data prepare` with a lab page's `flags` into `output_dir` (`[run] data`): one
/// prepare into one data dir, never a stage of a spread-out prepare.
pub fn prepare_into(flags: &[String], output_dir: &Path) -> Result<()> {
    use clap::Parser;
    const NOT_HERE: [&str; 7] = [
        "--output-dir",
        "-o",
        "--part",
        "--stage",
        "--of",
        "--help",
        "-h",
    ];
    let refused = |f: &String| {
        NOT_HERE
            .iter()
            .any(|flag| f == flag || f.starts_with(&format!("{flag}=")))
    };
    if let Some(f) = flags.iter().find(|f| refused(f)) {
        anyhow::bail!("{f} has no place here: the output is [run] data, and a page prepares in one process (spread prepare over machines with lab data prepare itself)");
    }
    let out = ["--output-dir".to_string(), output_dir.display().to_string()];
    let line = PrepareLine::try_parse_from(flags.iter().cloned().chain(out)).map_err(|e| {
        // clap's message up to its usage paragraph, on one line.
        let text = e.to_string();
        let message = text.split("\n\n").next().unwrap_or_default();
        let message = super::one_line(message.trim_start_matches("error: "));
        anyhow::anyhow!("{}", message.replace(":; ", ": "))
    })?;
    run_prepare(line.args).map(drop)
}

fn run_prepare(a: PrepareArgs) -> Result<ExitCode> {
    let split = match &a.split {
        None => Split::ValFraction(a.val_fraction),
        Some(s) => match s.strip_prefix("chars:").map(str::parse::<f64>) {
            Some(Ok(f)) => Split::Chars { train_fraction: f },
            _ => super::bail_usage!(
                "--split {s}: expected chars:F with F the train fraction, e.g. chars:0.9"
            ),
        },
    };
    let anchor_date = match &a.anchor_date {
        None => None,
        Some(s) => match lab_corpus::redact::parse_anchor(s) {
            Some(date) => Some(date),
            None => super::bail_usage!("--anchor-date {s}: expected YYYY-MM-DD"),
        },
    };
    let stage = match (a.stage, a.part, a.of) {
        (None, None, None) => Stage::All,
        (None | Some(StageArg::Part), Some(part), Some(of)) => Stage::Part { part, of },
        (Some(StageArg::Part), None, _) => super::bail_usage!("--stage part needs --part I"),
        (Some(StageArg::Dedup), _, Some(of)) => Stage::Dedup { of },
        (Some(StageArg::Finalize), _, Some(of)) => Stage::Finalize { of },
        _ => super::bail_usage!("--of N needs --part I or --stage dedup|finalize"),
    };
    let workers = a
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cfg = PrepareConfig {
        inputs: a.input,
        output_dir: a.output_dir.clone(),
        read: ReadOptions {
            text_field: a.text_field,
            type_field: a.type_field,
            max_doc_bytes: a.max_doc_bytes,
        },
        tokenizer: a.tokenizer,
        split,
        seed: a.seed,
        workers,
        clean: a.clean || a.all_filters,
        min_tokens: a.min_tokens.or(a.all_filters.then_some(50)),
        max_non_alnum: a.max_non_alnum.or(a.all_filters.then_some(0.5)),
        dedup: a.dedup || a.all_filters,
        near_dup_threshold: a.near_dup_threshold,
        redact: a.redact || a.all_filters,
        anchor_date,
        decontaminate: a.decontaminate,
        decontam_threshold: 0.7,
        progress: !a.quiet,
        stage,
    };
    if let Err(e) = lab_corpus::prepare::check_flags(&cfg) {
        super::bail_usage!("{e:#}");
    }
    if matches!(stage, Stage::Part { .. } | Stage::Dedup { .. }) {
        println!("{}", prepare_stage(cfg)?);
        return Ok(ExitCode::SUCCESS);
    }
    let out = prepare(cfg)?;
    print!("{}", out.report);
    let f = |n: &str| out.meta.files[n].tokens;
    println!(
        "\nwrote {}: train.bin {} tokens, val.bin {} tokens ({:?}, vocab {}); {:.1} MB of text in {:.1} s = {:.1} MB/s with {workers} workers",
        a.output_dir.display(),
        f("train.bin"),
        f("val.bin"),
        out.meta.dtype,
        out.meta.vocab_size,
        out.text_bytes as f64 / 1e6,
        out.elapsed.as_secs_f64(),
        out.mb_per_s(),
    );
    Ok(ExitCode::SUCCESS)
}

fn run_shards(a: ShardsArgs) -> Result<ExitCode> {
    let meta = lab_data::Meta::load(&a.data_dir)?;
    let train = meta.file("train.bin")?;
    let p = plan(&ShardRequest {
        train_tokens: train.tokens,
        nodes: a.nodes,
        gpus_per_node: a.gpus_per_node,
        global_batch_tokens: a.global_batch_tokens,
        seq_len: a.seq_len,
        shards_per_rank: a.shards_per_rank,
        target_shard_tokens: 100_000_000,
    })?;
    let out = a.output.unwrap_or_else(|| a.data_dir.join("shards.json"));
    let mut json = serde_json::to_value(&p)?;
    json["train_bin_sha256"] = train.sha256.clone().into();
    lab_fsio::write_atomic(
        &out,
        (serde_json::to_string_pretty(&json)? + "\n").as_bytes(),
    )?;
    print!("{}", p.table());
    println!("\nplan written to {}", out.display());
    Ok(ExitCode::SUCCESS)
}
