//! Decontamination against evaluation sets: a training document is dropped when it contains
//! ≥ 70% of the word 13-grams of any one eval item (items shorter than 13 words count as one
//! n-gram of all their words; items under 8 words are ignored as too generic to match).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::hash::{ngram_hashes, word_hashes};

pub const NGRAM: usize = 13;
pub const MIN_ITEM_WORDS: usize = 8;

pub struct EvalIndex {
    /// n-gram hash → the items holding it.
    grams: FxHashMap<u64, Vec<u32>>,
    /// Distinct n-grams per item.
    item_grams: Vec<u32>,
    /// Which file and line each item came from.
    items: Vec<(u32, u64)>,
    pub files: Vec<PathBuf>,
    threshold: f64,
}

/// The text of one eval item: `text`, or a question with its choices and answer.
fn item_text(v: &serde_json::Value) -> String {
    let mut parts = Vec::new();
    for key in [
        "text", "question", "prompt", "context", "passage", "choices", "answer", "options",
    ] {
        match &v[key] {
            serde_json::Value::String(s) => parts.push(s.clone()),
            serde_json::Value::Array(a) => {
                parts.extend(a.iter().filter_map(|x| x.as_str().map(str::to_string)))
            }
            _ => {}
        }
    }
    parts.join(" ")
}

impl EvalIndex {
    pub fn load(files: &[PathBuf], threshold: f64) -> Result<Self> {
        let mut index = Self {
            grams: FxHashMap::default(),
            item_grams: Vec::new(),
            items: Vec::new(),
            files: files.to_vec(),
            threshold,
        };
        for (fi, file) in files.iter().enumerate() {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!(
                    "--decontaminate {}: cannot read the eval set (JSONL, UTF-8)",
                    file.display()
                )
            })?;
            let before = index.items.len();
            for (li, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let v: serde_json::Value = serde_json::from_str(line).with_context(|| {
                    format!(
                        "--decontaminate {}:{}: not a JSON object",
                        file.display(),
                        li + 1
                    )
                })?;
                let at = (fi as u32, li as u64 + 1);
                index.add(&item_text(&v), at);
                // A leaked question without its choices is contamination too.
                if let Some(q) = v["question"].as_str() {
                    index.add(q, at);
                }
            }
            if index.items.len() == before {
                bail!(
                    "--decontaminate {}: no item with text (fields text, question, choices …)",
                    file.display()
                );
            }
        }
        Ok(index)
    }

    fn add(&mut self, text: &str, at: (u32, u64)) {
        let ws = word_hashes(text);
        if ws.len() < MIN_ITEM_WORDS {
            return;
        }
        let grams: FxHashSet<u64> = ngram_hashes(&ws, NGRAM).into_iter().collect();
        let id = self.items.len() as u32;
        self.items.push(at);
        self.item_grams.push(grams.len() as u32);
        for g in grams {
            self.grams.entry(g).or_default().push(id);
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The n-gram hashes of a training document that could match (computed on workers).
    pub fn doc_grams(&self, text: &str) -> Vec<u64> {
        let ws = word_hashes(text);
        let mut hits: Vec<u64> = ngram_hashes(&ws, NGRAM)
            .into_iter()
            .filter(|g| self.grams.contains_key(g))
            .collect();
        // Short items are whole-item grams: look for them inside longer documents too.
        if ws.len() >= NGRAM {
            for n in MIN_ITEM_WORDS..NGRAM {
                hits.extend(
                    ngram_hashes(&ws, n)
                        .into_iter()
                        .filter(|g| self.grams.contains_key(g)),
                );
            }
        }
        hits.sort_unstable();
        hits.dedup();
        hits
    }

    /// The eval item (file, line) a document contaminates, if any.
    pub fn contaminated(&self, doc_grams: &[u64]) -> Option<(&Path, u64)> {
        let mut counts: FxHashMap<u32, u32> = FxHashMap::default();
        for g in doc_grams {
            for &item in &self.grams[g] {
                *counts.entry(item).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .filter(|&(item, n)| n as f64 >= self.threshold * self.item_grams[item as usize] as f64)
            .map(|(item, _)| item)
            .min()
            .map(|item| {
                let (f, line) = self.items[item as usize];
                (self.files[f as usize].as_path(), line)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_quoting_an_eval_item_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let eval = dir.path().join("eval.jsonl");
        std::fs::write(
            &eval,
            r#"{"question": "Which nerve innervates the muscles of facial expression in the adult human head and neck region", "choices": ["facial", "trigeminal", "vagus", "hypoglossal"]}
{"question": "Too short to match"}
"#,
        )
        .unwrap();
        let idx = EvalIndex::load(&[eval], 0.7).unwrap();
        assert_eq!(idx.len(), 2, "the item, and its question alone");
        let doc = "Notes. Which nerve innervates the muscles of facial expression in the adult human head and neck region? facial trigeminal vagus hypoglossal. More notes.";
        assert_eq!(idx.contaminated(&idx.doc_grams(doc)).map(|x| x.1), Some(1));
        let clean = "The facial nerve innervates the muscles of facial expression, and the trigeminal nerve carries sensation.";
        assert_eq!(idx.contaminated(&idx.doc_grams(clean)), None);
    }
}
