//! `lab data deid-probe`: the Safe Harbor probe (planted vs leaked per category on synthetic
//! notes), over-redaction of real medical text (MedQuAD by default) with examples, and the
//! redaction stage's throughput.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use lab_corpus::deid_probe::{over_redaction, probe_notes, run_probe, OverRedaction};
use lab_corpus::reader::{read_documents, ReadOptions};
use lab_corpus::redact::Redactor;

#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  lab data deid-probe --notes 2000 --seed 42")]
pub struct DeidProbeArgs {
    /// Synthetic notes in the probe set.
    #[arg(long, default_value_t = 1000)]
    pub notes: usize,
    /// Seed of the probe set.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Real text to measure over-redaction and throughput on [default: the bundled MedQuAD].
    #[arg(long, value_name = "PATH")]
    pub input: Option<PathBuf>,
    /// JSON key holding the text.
    #[arg(long, default_value = "text")]
    pub text_field: String,
}

pub fn run(a: DeidProbeArgs) -> Result<ExitCode> {
    let redactor = Redactor::new(None);
    let probe = run_probe(&redactor, &probe_notes(a.seed, a.notes));
    println!(
        "Safe Harbor probe: {} notes, seed {}\n{}",
        a.notes,
        a.seed,
        probe.table()
    );
    for (phi, part, _) in probe.examples.iter().take(5) {
        println!("  leaked {}: '{part}'", phi.placeholder());
    }
    let input = a
        .input
        .unwrap_or_else(|| PathBuf::from(lab_corpus::MEDQUAD_ZST));
    let docs = read_texts(&input, &a.text_field)?;
    let over = over_redaction(&redactor, docs.iter().map(String::as_str));
    print_over_redaction(&input, &over);
    let secs = over.redact_secs;
    println!(
        "\nthroughput: {:.1} MB in {secs:.2} s = {:.2} MB/s on one thread (redaction only)",
        over.bytes as f64 / 1e6,
        over.bytes as f64 / 1e6 / secs.max(1e-9)
    );
    Ok(if probe.total_leaked() == 0 {
        ExitCode::SUCCESS
    } else {
        println!("FAIL: {} planted identifiers leaked", probe.total_leaked());
        ExitCode::FAILURE
    })
}

fn read_texts(input: &Path, text_field: &str) -> Result<Vec<String>> {
    let opts = ReadOptions {
        text_field: text_field.to_string(),
        ..ReadOptions::default()
    };
    let docs = read_documents(&[input.to_path_buf()], &opts)
        .with_context(|| format!("--input {}", input.display()))?;
    Ok(docs.into_iter().map(|d| d.text).collect())
}

fn print_over_redaction(input: &std::path::Path, r: &OverRedaction) {
    println!(
        "Over-redaction on {} ({} documents, {:.1} MB): placeholders put in",
        input.display(),
        r.documents,
        r.bytes as f64 / 1e6
    );
    for (ph, n) in &r.replaced {
        let example = r.examples.get(ph).and_then(|e| e.first());
        println!(
            "  {ph:<14} {n:>6}   e.g. …{}…",
            example.map_or("", |s| s.as_str())
        );
    }
    let (terms, lost): (u64, u64) = r
        .eponyms
        .values()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let (words, words_lost): (u64, u64) = r
        .eponym_words
        .values()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    println!(
        "eponyms as terms (\"Parkinson disease\"): {lost} of {terms} redacted; \
         any mention (the namesake too): {words_lost} of {words}"
    );
    for (e, examples) in &r.eponym_examples {
        for (before, after) in examples.iter().take(1) {
            println!("  {e}: \"{}\" → \"{}\"", clip(before), clip(after));
        }
    }
}

fn clip(s: &str) -> String {
    let s: String = s.chars().take(140).collect();
    s.replace('\n', " ")
}
