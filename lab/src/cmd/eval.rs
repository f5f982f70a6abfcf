//! `lab eval --run DIR`: perplexity overall and by document type, multiple-choice probes and
//! the memorization probe, on a run's checkpoint.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use lab_corpus::tokenize::Tokenizer;
use lab_eval::mc::{self, McOptions};
use lab_eval::memorize;
use lab_report::run_model::{load_run_model, RunModel};
use lab_train::TrainBackend;
use serde_json::{json, Value};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// The run folder (`lab train --ckpt-dir`).
    #[arg(long)]
    pub run: PathBuf,
    /// latest (default), best, a step number or step-N.
    #[arg(long, default_value = "latest")]
    pub checkpoint: String,
    /// A prepared data dir to measure perplexity on (default: the run's own).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Which of its files: val.bin (default) or train.bin.
    #[arg(long, default_value = "val.bin")]
    pub file: String,
    /// Skip the perplexity pass.
    #[arg(long)]
    pub no_perplexity: bool,
    /// Multiple-choice items (MMLU- or HellaSwag-shaped JSONL).
    #[arg(long)]
    pub mc: Option<PathBuf>,
    /// Where k-shot examples come from (default: the first k items of --mc, not scored).
    #[arg(long)]
    pub dev: Option<PathBuf>,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub shots: usize,
    /// Score at most this many items (evenly spaced).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Memorization probe: JSONL of {text|prompt, identifier}.
    #[arg(long)]
    pub memorization: Option<PathBuf>,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = "cpu")]
    pub backend: String,
}

impl lab_train::backend::OnBackend for Args {
    type Output = Value;
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<Value> {
        evaluate::<B::InnerBackend>(&self, &device)
    }
}

/// A perplexity means something only on tokens of the run's own tokenizer: a data folder
/// prepared with another is refused in one line (its ids may not even fit the model).
fn check_same_tokenizer<B: burn::tensor::backend::Backend>(
    dir: &Path,
    meta: &lab_data::Meta,
    rm: &RunModel<B>,
) -> Result<()> {
    let fix = "prepare it with the run's tokenizer (lab data prepare --tokenizer …)";
    let vocab = rm.cfg.model.vocab_size;
    if meta.vocab_size > vocab {
        bail!(
            "--data {}: its tokenizer {} has {} ids, more than the model's {vocab}: {fix}",
            dir.display(),
            meta.tokenizer,
            meta.vocab_size
        );
    }
    let (Some(run_meta), Some(run_data)) = (&rm.meta, &rm.data_dir) else {
        return Ok(());
    };
    let identity = |spec: &str, data: &Path| -> Option<String> {
        let found = Tokenizer::locate_for_data(spec, data).ok()?;
        match lab_fsio::sha256_file(Path::new(&found)) {
            Ok(sha) => Some(sha),
            // A name: GPT-2's ranks go by two.
            Err(_) => Some(found.replace("r50k_base", "gpt2")),
        }
    };
    let (theirs, ours) = (
        identity(&meta.tokenizer, dir),
        identity(&run_meta.tokenizer, run_data),
    );
    if theirs.is_some() && ours.is_some() && theirs != ours {
        bail!(
            "--data {} was tokenized by {}, not by the run's tokenizer {}: {fix}",
            dir.display(),
            meta.tokenizer,
            run_meta.tokenizer
        );
    }
    Ok(())
}

fn evaluate<B: lab_model::FusedOps>(a: &Args, device: &B::Device) -> Result<Value> {
    let choice = super::checkpoint_choice(&a.checkpoint)?;
    for (flag, v) in [("--batch", Some(a.batch)), ("--limit", a.limit)] {
        if v == Some(0) {
            super::bail_usage!("{flag} 0: give at least 1");
        }
    }
    let rm = load_run_model::<B>(&a.run, choice, device)?;
    let tokenizer_spec = rm
        .meta
        .as_ref()
        .map_or("gpt2".to_string(), |m| m.tokenizer.clone());
    let mut out = json!({ "run": a.run, "checkpoint_step": rm.step });
    if !a.no_perplexity {
        let Some(dir) = a.data.clone().or(rm.data_dir.clone()) else {
            bail!("{} records no data dir: pass --data", a.run.display());
        };
        let meta = lab_data::Meta::load(&dir)?;
        check_same_tokenizer(&dir, &meta, &rm)?;
        let file = lab_data::TokenFile::open(&dir, &a.file, &meta)?;
        let p = lab_eval::perplexity::perplexity(
            &rm.model,
            &file,
            &meta,
            &a.file,
            rm.cfg.model.seq_len,
            a.batch,
        )?;
        out["perplexity"] = serde_json::to_value(&p)?;
    }
    if a.mc.is_some() || a.memorization.is_some() {
        // The run's own data names the tokenizer and keeps its copy (`--data` is what to score).
        let data_dir = rm.data_dir.clone().or(a.data.clone()).unwrap_or_default();
        let tok = Tokenizer::of_data(&tokenizer_spec, &data_dir).context("the run's tokenizer")?;
        if let Some(path) = &a.mc {
            let items = mc::load_items(path)?;
            let dev = a.dev.as_deref().map(mc::load_items).transpose()?;
            let opts = McOptions {
                shots: a.shots,
                dev,
                limit: a.limit,
                batch_rows: a.batch,
            };
            let (report, _) = mc::score(&rm.model, &tok, &items, &opts)?;
            out["mc"] = serde_json::to_value(&report)?;
            out["mc"]["file"] = json!(path);
        }
        if let Some(path) = &a.memorization {
            let probes = memorize::load_probes(path)?;
            out["memorization"] =
                serde_json::to_value(memorize::probe(&rm.model, &tok, &probes, 8))?;
        }
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<ExitCode> {
    let backend = super::backend_kind(&args.backend)?;
    super::checkpoint_choice(&args.checkpoint)?; // a usage error before any device starts
    let json_out = args.json;
    let v = backend.dispatch(args)?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} at step {}",
        v["run"].as_str().unwrap_or(""),
        v["checkpoint_step"]
    );
    if let Some(p) = v.get("perplexity") {
        println!(
            "\nperplexity on {}:\n  {:<24} {:>12} {:>10} {:>12}",
            p["file"].as_str().unwrap_or(""),
            "type",
            "tokens",
            "loss",
            "perplexity"
        );
        let by_type = p["by_type"].as_array().cloned().unwrap_or_default();
        // One type only is the overall figure again: show it once.
        let typed = if by_type.len() > 1 {
            by_type.as_slice()
        } else {
            &[]
        };
        for (name, t) in typed
            .iter()
            .map(|t| (t["doc_type"].as_str().unwrap_or(""), t))
            .chain(std::iter::once(("overall", &p["overall"])))
        {
            println!(
                "  {:<24} {:>12} {:>10.4} {:>12.2}",
                name,
                t["tokens"].as_u64().unwrap_or(0),
                t["loss"].as_f64().unwrap_or(f64::NAN),
                t["perplexity"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    if let Some(m) = v.get("mc") {
        let pct = |x: &Value| x.as_f64().unwrap_or(f64::NAN) * 100.0;
        println!(
            "\nmultiple choice ({}, {} items, {} shots): acc {:.1} % [{:.1}, {:.1}], acc_norm {:.1} % [{:.1}, {:.1}] (95 % intervals), chance {:.1} %",
            m["file"].as_str().unwrap_or(""),
            m["items"],
            m["shots"],
            pct(&m["acc"]),
            pct(&m["acc_ci"][0]),
            pct(&m["acc_ci"][1]),
            pct(&m["acc_norm"]),
            pct(&m["acc_norm_ci"][0]),
            pct(&m["acc_norm_ci"][1]),
            pct(&m["chance"])
        );
    }
    if let Some(m) = v.get("memorization") {
        println!(
            "\nmemorization: {} of {} probes reproduced their identifier ({:.1} %)",
            m["leaked"],
            m["probes"],
            m["rate"].as_f64().unwrap_or(0.0) * 100.0
        );
    }
    Ok(ExitCode::SUCCESS)
}
