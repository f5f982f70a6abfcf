//! `lab tokenizer train` (byte-level BPE on a corpus) and `lab tokenizer fertility`
//! (tokens per word per document type, tokenizers side by side). The work is in lab-corpus.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use lab_corpus::bpe_train::{read_special_tokens, train, TrainConfig};
use lab_corpus::chart::fertility_chart;
use lab_corpus::fertility::fertility;
use lab_corpus::reader::ReadOptions;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: TokenizerCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum TokenizerCommand {
    /// Train a byte-level BPE tokenizer (tokenizer.json + tiktoken ranks beside it).
    Train(TrainArgs),
    /// Tokens per word per document type for several tokenizers: table + PNG chart.
    Fertility(FertilityArgs),
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example:\n  lab tokenizer train --input crates/corpus/corpora/medquad.jsonl.zst --type-field source \\\n    --special-tokens crates/corpus/corpora/clinical-sections.txt --output med64k.json"
)]
pub struct TrainArgs {
    /// Input file or directory (.txt, .jsonl, .jsonl.zst, .parquet); repeatable.
    #[arg(long, short, required = true)]
    pub input: Vec<PathBuf>,
    /// Where tokenizer.json goes (the tiktoken ranks go beside it, .tiktoken).
    #[arg(long, short)]
    pub output: PathBuf,
    #[arg(long, default_value_t = 64_000)]
    pub vocab_size: usize,
    #[arg(long, default_value_t = 2)]
    pub min_frequency: u64,
    /// File of extra special tokens (clinical section headers), one per line; added after
    /// <pad> <s> </s> <unk>.
    #[arg(long, value_name = "FILE")]
    pub special_tokens: Option<PathBuf>,
    /// Train on about this many bytes, sampled so each document type keeps its share.
    #[arg(long)]
    pub sample_bytes: Option<u64>,
    #[arg(long, default_value = "text")]
    pub text_field: String,
    #[arg(long)]
    pub type_field: Option<String>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(long)]
    pub quiet: bool,
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example:\n  lab tokenizer fertility --tokenizer gpt2 --tokenizer med64k.json --input crates/corpus/corpora/medquad.jsonl.zst \\\n    --input crates/data/corpora/tinyshakespeare.txt --type-field source --terms crates/corpus/corpora/medical-terms.txt --chart fertility.png"
)]
pub struct FertilityArgs {
    /// `gpt2` or a tokenizer.json; repeat to compare (the first is the baseline).
    #[arg(long, required = true)]
    pub tokenizer: Vec<String>,
    #[arg(long, short, required = true)]
    pub input: Vec<PathBuf>,
    #[arg(long, default_value = "text")]
    pub text_field: String,
    #[arg(long)]
    pub type_field: Option<String>,
    /// Medical term list (one per line) for term fertility.
    #[arg(long)]
    pub terms: Option<PathBuf>,
    /// PNG bar chart.
    #[arg(long, default_value = "fertility.png")]
    pub chart: PathBuf,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        TokenizerCommand::Train(a) => run_train(a),
        TokenizerCommand::Fertility(a) => run_fertility(a),
    }
}

fn run_train(a: TrainArgs) -> Result<ExitCode> {
    let special_tokens = match &a.special_tokens {
        Some(p) => read_special_tokens(p)?,
        None => Vec::new(),
    };
    let start = std::time::Instant::now();
    let out = train(&TrainConfig {
        inputs: a.input,
        output: a.output.clone(),
        read: ReadOptions {
            text_field: a.text_field,
            type_field: a.type_field,
            ..Default::default()
        },
        vocab_size: a.vocab_size,
        min_frequency: a.min_frequency,
        special_tokens,
        sample_bytes: a.sample_bytes,
        seed: a.seed,
        progress: !a.quiet,
    })?;
    println!(
        "{:<24} {:>14} {:>14}",
        "type", "corpus bytes", "sampled bytes"
    );
    for (ty, c) in &out.corpus.0 {
        let s = out.sampled.0.get(ty).map_or(0, |s| s.bytes);
        println!("{ty:<24} {:>14} {s:>14}", c.bytes);
    }
    println!(
        "wrote {} (vocab {}) and {} in {:.1} s",
        a.output.display(),
        out.vocab_size,
        out.tiktoken_ranks.display(),
        start.elapsed().as_secs_f64()
    );
    if out.vocab_size < a.vocab_size {
        eprintln!(
            "warning: the corpus ran out of pairs to merge at vocab {} of the {} asked for (--min-frequency {}): a model's vocab_size must say {}",
            out.vocab_size, a.vocab_size, a.min_frequency, out.vocab_size
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn run_fertility(a: FertilityArgs) -> Result<ExitCode> {
    let read = ReadOptions {
        text_field: a.text_field,
        type_field: a.type_field,
        ..Default::default()
    };
    let report = fertility(&a.input, &read, &a.tokenizer, a.terms.as_deref())?;
    print!("{}", report.table());
    fertility_chart(&report, &a.chart)?;
    println!("chart: {}", a.chart.display());
    if let Some(p) = &a.json {
        lab_fsio::write_atomic(
            p,
            (serde_json::to_string_pretty(&report)? + "\n").as_bytes(),
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
