//! `lab generate --run DIR --prompt …`: text from a run's checkpoint, decoded with the KV
//! cache, streamed to stdout as it comes; the same seed gives the same text.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use lab_corpus::tokenize::Tokenizer;
use lab_model::generate::{generate, Sampling, Stop};
use lab_report::run_model::load_run_model;
use lab_report::CheckpointChoice;
use lab_train::TrainBackend;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// The run folder (`lab train --ckpt-dir`).
    #[arg(long)]
    pub run: PathBuf,
    /// The checkpoint's step (default: the latest).
    #[arg(long)]
    pub step: Option<u64>,
    /// Or: latest, best.
    #[arg(long, conflicts_with = "step")]
    pub checkpoint: Option<String>,
    #[arg(long)]
    pub prompt: String,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value = "cpu")]
    pub backend: String,
}

impl lab_train::backend::OnBackend for Args {
    type Output = ();
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<()> {
        decode::<B::InnerBackend>(&self, &device)
    }
}

/// Prints bytes as text once they form whole UTF-8 characters (a character may span tokens).
struct Utf8Stream(Vec<u8>);

impl Utf8Stream {
    fn push(&mut self, bytes: &[u8], out: &mut impl Write) {
        self.0.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.0) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(), // incomplete: wait
            Err(_) => self.0.len(),                               // invalid: print lossily
        };
        let _ = write!(out, "{}", String::from_utf8_lossy(&self.0[..valid]));
        let _ = out.flush();
        self.0.drain(..valid);
    }
}

fn decode<B: lab_model::FusedLayers>(a: &Args, device: &B::Device) -> Result<()> {
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        super::bail_usage!("--temperature ({}) must be >= 0", a.temperature);
    }
    if a.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        super::bail_usage!("--top-p must be in (0, 1]");
    }
    if a.prompt.is_empty() {
        super::bail_usage!("--prompt is empty: give the text to continue");
    }
    let choice = match (&a.step, &a.checkpoint) {
        (Some(s), _) => CheckpointChoice::Step(*s),
        (None, Some(c)) => super::checkpoint_choice(c)?,
        (None, None) => CheckpointChoice::Latest,
    };
    let rm = load_run_model::<B>(&a.run, choice, device)?;
    let spec = rm
        .meta
        .as_ref()
        .map_or("gpt2".to_string(), |m| m.tokenizer.clone());
    let data_dir = rm.data_dir.clone().unwrap_or_default();
    let tok = Tokenizer::of_data(&spec, &data_dir).context("the run's tokenizer")?;
    let table = tok.token_bytes();
    let sampling = Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    let mut out = std::io::stdout();
    let _ = write!(out, "{}", a.prompt);
    let mut stream = Utf8Stream(Vec::new());
    let prompt = room_to_answer(tok.encode(&a.prompt), rm.model.seq_len(), a.max_new_tokens);
    let (ids, stop) = generate(
        &rm.model,
        &prompt,
        a.max_new_tokens,
        &sampling,
        Some(tok.eot()),
        &mut |id| {
            if let Some(Some(bytes)) = table.get(id as usize) {
                stream.push(bytes, &mut out);
            }
        },
    );
    let why = match stop {
        Stop::MaxTokens => "max tokens",
        Stop::EndOfText => "end of text",
        Stop::ContextFull => "context full",
    };
    eprintln!(
        "\n[{} tokens, stopped at {why}; checkpoint step {}]",
        ids.len(),
        rm.step
    );
    Ok(())
}

/// A prompt too long for the context and the tokens asked for keeps its end (as nanoGPT crops
/// to its block size), leaving room for the answer: all of it where it fits in half the
/// context, else half the context. Said on stderr, not done silently.
fn room_to_answer(prompt: Vec<u32>, context: usize, max_new: usize) -> Vec<u32> {
    let keep = context.saturating_sub(max_new).max(context / 2).max(1);
    if prompt.len() <= keep || prompt.len() + max_new <= context {
        return prompt;
    }
    eprintln!(
        "note: the prompt is {} tokens and the context {context}: continuing from its last {keep}",
        prompt.len()
    );
    prompt[prompt.len() - keep..].to_vec()
}

pub fn run(args: Args) -> Result<ExitCode> {
    let backend = super::backend_kind(&args.backend)?;
    if let Some(c) = &args.checkpoint {
        super::checkpoint_choice(c)?; // a usage error before any device starts
    }
    backend.dispatch(args)?;
    Ok(ExitCode::SUCCESS)
}
