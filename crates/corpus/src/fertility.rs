//! `lab tokenizer fertility`: tokens per whitespace-separated word, per document type and
//! overall, for several tokenizers side by side; plus the fertility on a list of medical
//! terms (each encoded as it appears mid-sentence, with a leading space).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{bail, Result};
use rayon::prelude::*;
use serde::Serialize;

use crate::clean::clean;
use crate::reader::{discover, read_source, ReadOptions};
use crate::tokenize::Tokenizer;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub doc_type: String,
    pub docs: u64,
    pub words: u64,
    /// Tokens per tokenizer, in the order given.
    pub tokens: Vec<u64>,
}

impl Row {
    pub fn fertility(&self, i: usize) -> f64 {
        self.tokens[i] as f64 / self.words.max(1) as f64
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FertilityReport {
    pub tokenizers: Vec<String>,
    /// One row per document type, then `(overall)`.
    pub rows: Vec<Row>,
    /// One row over the term list, when given.
    pub terms: Option<Row>,
}

pub fn fertility(
    inputs: &[PathBuf],
    read: &ReadOptions,
    tokenizer_specs: &[String],
    terms: Option<&std::path::Path>,
) -> Result<FertilityReport> {
    if tokenizer_specs.is_empty() {
        bail!("pass at least one --tokenizer (gpt2 or a tokenizer.json)");
    }
    let tokenizers: Vec<Tokenizer> = tokenizer_specs
        .iter()
        .map(|s| Tokenizer::load(s))
        .collect::<Result<_>>()?;
    let sources = discover(inputs)?;
    let mut by_type: BTreeMap<String, Row> = BTreeMap::new();
    let bytes = Arc::new(AtomicU64::new(0));
    let mut chunk = Vec::new();
    let flush = |chunk: &mut Vec<(String, String)>, by_type: &mut BTreeMap<String, Row>| {
        let counted: Vec<(String, u64, Vec<u64>)> = std::mem::take(chunk)
            .into_par_iter()
            .map(|(text, ty)| {
                let words = text.split_whitespace().count() as u64;
                let tokens = tokenizers
                    .iter()
                    .map(|t| t.encode(&text).len() as u64)
                    .collect();
                (ty, words, tokens)
            })
            .collect();
        for (ty, words, tokens) in counted {
            let row = by_type.entry(ty.clone()).or_insert_with(|| Row {
                doc_type: ty,
                docs: 0,
                words: 0,
                tokens: vec![0; tokenizers.len()],
            });
            row.docs += 1;
            row.words += words;
            row.tokens.iter_mut().zip(tokens).for_each(|(a, b)| *a += b);
        }
    };
    for (i, s) in sources.iter().enumerate() {
        read_source(i as u32, s, read, &bytes, &mut |record| {
            if let Ok(doc) = record.parse(read) {
                chunk.push((clean(&doc.text), doc.doc_type));
                if chunk.len() >= 4096 {
                    flush(&mut chunk, &mut by_type);
                }
            }
            Ok(())
        })?;
    }
    flush(&mut chunk, &mut by_type);
    if by_type.is_empty() {
        bail!("no documents in {inputs:?}; check --text-field");
    }
    let mut rows: Vec<Row> = by_type.into_values().collect();
    let overall = rows.iter().fold(
        Row {
            doc_type: "(overall)".into(),
            docs: 0,
            words: 0,
            tokens: vec![0; tokenizers.len()],
        },
        |mut acc, r| {
            acc.docs += r.docs;
            acc.words += r.words;
            acc.tokens
                .iter_mut()
                .zip(&r.tokens)
                .for_each(|(a, b)| *a += b);
            acc
        },
    );
    rows.push(overall);
    let terms = match terms {
        None => None,
        Some(path) => {
            let list = crate::reader::read_line_list(path, "--terms")?;
            if list.is_empty() {
                bail!("--terms {}: no terms (one per line)", path.display());
            }
            Some(Row {
                doc_type: "(medical terms)".into(),
                docs: list.len() as u64,
                words: list
                    .iter()
                    .map(|t| t.split_whitespace().count() as u64)
                    .sum(),
                tokens: tokenizers
                    .iter()
                    .map(|tok| {
                        list.iter()
                            .map(|t| tok.encode(&format!(" {t}")).len() as u64)
                            .sum()
                    })
                    .collect(),
            })
        }
    };
    Ok(FertilityReport {
        tokenizers: tokenizer_specs.to_vec(),
        rows,
        terms,
    })
}

impl FertilityReport {
    pub fn table(&self) -> String {
        let mut out = format!("{:<20} {:>7} {:>10}", "type", "docs", "words");
        for t in &self.tokenizers {
            let name = std::path::Path::new(t)
                .file_name()
                .map_or(t.clone(), |n| n.to_string_lossy().into_owned());
            out.push_str(&format!(" {:>16}", truncate(&name, 16)));
        }
        if self.tokenizers.len() > 1 {
            out.push_str(&format!(" {:>9}", "last/1st"));
        }
        out.push('\n');
        for r in self.rows.iter().chain(&self.terms) {
            out.push_str(&format!(
                "{:<20} {:>7} {:>10}",
                truncate(&r.doc_type, 20),
                r.docs,
                r.words
            ));
            for i in 0..self.tokenizers.len() {
                out.push_str(&format!(" {:>16.3}", r.fertility(i)));
            }
            if self.tokenizers.len() > 1 {
                let last = self.tokenizers.len() - 1;
                out.push_str(&format!(
                    " {:>9.3}",
                    r.fertility(last) / r.fertility(0).max(1e-9)
                ));
            }
            out.push('\n');
        }
        out
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}
