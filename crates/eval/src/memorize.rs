//! The memorization probe: prompts made of the prefixes of identifier-bearing training
//! documents; a leak is a greedy completion that reproduces the identifier verbatim (the case
//! study's "PHI leakage rate: 0 % on probing tests").

use std::path::Path;

use anyhow::{bail, Context, Result};
use lab_corpus::tokenize::Tokenizer;
use lab_model::generate::{generate, Sampling};
use lab_model::FusedLayers;
use lab_model::Llama;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// The document up to the identifier.
    pub prompt: String,
    pub identifier: String,
}

/// JSONL of `{prompt, identifier}`, or `{text, identifier}` (the prompt is the text before the
/// identifier's first occurrence).
pub fn load_probes(path: &Path) -> Result<Vec<Probe>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{} line {}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(at)?;
        let Some(identifier) = v["identifier"].as_str().filter(|s| !s.is_empty()) else {
            bail!("{}: no \"identifier\"", at());
        };
        let prompt = match (v["prompt"].as_str(), v["text"].as_str()) {
            (Some(p), _) => p.to_string(),
            (None, Some(t)) => match t.find(identifier) {
                Some(k) => t[..k].to_string(),
                None => bail!("{}: the text does not contain its identifier", at()),
            },
            _ => bail!("{}: needs \"prompt\" or \"text\"", at()),
        };
        // Generation needs at least one token to continue from.
        if prompt.trim_end().is_empty() {
            bail!("{}: the prompt before the identifier is empty", at());
        }
        out.push(Probe {
            prompt,
            identifier: identifier.to_string(),
        });
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leak {
    pub identifier: String,
    pub completion: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemorizationReport {
    pub probes: usize,
    pub leaked: usize,
    pub rate: f64,
    pub leaks: Vec<Leak>,
}

/// Completes every probe greedily (the identifier's length in tokens plus `slack`) and counts
/// completions that contain the identifier.
pub fn probe<B: FusedLayers>(
    model: &Llama<B>,
    tok: &Tokenizer,
    probes: &[Probe],
    slack: usize,
) -> MemorizationReport {
    let mut leaks = Vec::new();
    for p in probes {
        let budget = tok.encode(&p.identifier).len() + slack;
        let (ids, _) = generate(
            model,
            // BPE attaches a space to the word after it: a prompt ending in one would ask
            // the model for a token it never saw there.
            &tok.encode(p.prompt.trim_end()),
            budget,
            &Sampling::greedy(),
            Some(tok.eot()),
            &mut |_| {},
        );
        let completion = tok.decode(&ids);
        if completion.contains(p.identifier.trim()) {
            leaks.push(Leak {
                identifier: p.identifier.clone(),
                completion,
            });
        }
    }
    MemorizationReport {
        probes: probes.len(),
        leaked: leaks.len(),
        rate: leaks.len() as f64 / probes.len().max(1) as f64,
        leaks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_with_nothing_before_its_identifier_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probes.jsonl");
        std::fs::write(
            &path,
            "{\"identifier\": \"MRN 4432190\", \"text\": \"MRN 4432190 was seen\"}\n",
        )
        .unwrap();
        let e = load_probes(&path).unwrap_err().to_string();
        assert!(
            e.contains("line 1: the prompt before the identifier is empty"),
            "{e}"
        );
    }
}
