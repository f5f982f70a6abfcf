//! A tokenizer as Hugging Face files, so `AutoTokenizer.from_pretrained(dir)` loads it offline
//! next to an exported model: GPT-2 as `vocab.json` + `merges.txt` (recovered from tiktoken's
//! ranks, the files OpenAI published), a trained tokenizer as its own `tokenizer.json`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use rustc_hash::FxHashMap;
use serde_json::json;

use crate::tokenize::{byte_level_encoder, Tokenizer};

const EOT_TEXT: &str = "<|endoftext|>";

/// Writes the files of tokenizer `spec` (meta.json's `tokenizer`: `gpt2` or a tokenizer.json
/// path) into `dir`; returns their names.
pub fn write_hf_tokenizer(spec: &str, dir: &Path, model_max_length: usize) -> Result<Vec<String>> {
    if spec == "gpt2" {
        return write_gpt2(dir, model_max_length);
    }
    let src = Path::new(spec);
    if !src.is_file() {
        bail!("the run's tokenizer {spec} is not a file here: export on the machine that has it");
    }
    std::fs::copy(src, dir.join("tokenizer.json"))
        .with_context(|| format!("cannot copy {spec}"))?;
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
    });
    write_json(dir, "tokenizer_config.json", &config)?;
    Ok(vec![
        "tokenizer.json".into(),
        "tokenizer_config.json".into(),
    ])
}

fn write_json(dir: &Path, name: &str, v: &serde_json::Value) -> Result<()> {
    lab_fsio::write_atomic(
        &dir.join(name),
        (serde_json::to_string_pretty(v)? + "\n").as_bytes(),
    )
}

fn write_gpt2(dir: &Path, model_max_length: usize) -> Result<Vec<String>> {
    let tok = Tokenizer::gpt2()?;
    let chars = byte_level_encoder();
    let spell = |bytes: &[u8]| bytes.iter().map(|&b| chars[b as usize]).collect::<String>();

    let mut vocab: Vec<(String, u32)> = tok.ranks().iter().map(|(b, &id)| (spell(b), id)).collect();
    vocab.push((EOT_TEXT.into(), tok.eot()));
    vocab.sort_by_key(|&(_, id)| id);
    let vocab: serde_json::Map<String, serde_json::Value> =
        vocab.into_iter().map(|(s, id)| (s, json!(id))).collect();
    write_json(dir, "vocab.json", &serde_json::Value::Object(vocab))?;

    let mut merges = String::from("#version: 0.2\n");
    for (a, b) in merges_from_ranks(tok.ranks())? {
        merges.push_str(&format!("{} {}\n", spell(&a), spell(&b)));
    }
    lab_fsio::write_atomic(&dir.join("merges.txt"), merges.as_bytes())?;

    let specials = json!({ "bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT });
    write_json(dir, "special_tokens_map.json", &specials)?;
    let mut config = specials;
    config["tokenizer_class"] = json!("GPT2Tokenizer");
    config["model_max_length"] = json!(model_max_length);
    config["add_prefix_space"] = json!(false);
    config["errors"] = json!("replace");
    write_json(dir, "tokenizer_config.json", &config)?;
    Ok([
        "vocab.json",
        "merges.txt",
        "special_tokens_map.json",
        "tokenizer_config.json",
    ]
    .map(String::from)
    .to_vec())
}

/// The merge that made each multi-byte token, in rank order: BPE on the token's bytes with
/// only the merges ranked below it ends in exactly two parts, and those are the pair.
pub fn merges_from_ranks(ranks: &FxHashMap<Vec<u8>, u32>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut tokens: Vec<(&Vec<u8>, u32)> = ranks.iter().map(|(b, &r)| (b, r)).collect();
    tokens.sort_by_key(|&(_, r)| r);
    let mut out = Vec::new();
    for (bytes, rank) in tokens.into_iter().filter(|(b, _)| b.len() > 1) {
        let mut parts: Vec<Vec<u8>> = bytes.iter().map(|&b| vec![b]).collect();
        loop {
            let best = (0..parts.len() - 1)
                .filter_map(|i| {
                    let joined = [parts[i].as_slice(), parts[i + 1].as_slice()].concat();
                    ranks.get(&joined).filter(|&&r| r < rank).map(|&r| (r, i))
                })
                .min();
            let Some((_, i)) = best else { break };
            let right = parts.remove(i + 1);
            parts[i].extend(right);
        }
        if parts.len() != 2 {
            bail!("token of rank {rank} is not one merge of lower-ranked tokens");
        }
        let b = parts.pop().expect("two parts");
        out.push((parts.pop().expect("two parts"), b));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_files_hold_the_full_vocabulary_and_one_merge_per_multibyte_token() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_hf_tokenizer("gpt2", dir.path(), 1024).unwrap();
        assert!(files.contains(&"merges.txt".to_string()));
        let vocab: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("vocab.json")).unwrap())
                .unwrap();
        assert_eq!(vocab.len(), 50257);
        assert_eq!(vocab["<|endoftext|>"], 50256);
        assert_eq!(vocab["Ġthe"], 262, "GPT-2's ' the'");
        let merges = std::fs::read_to_string(dir.path().join("merges.txt")).unwrap();
        let lines: Vec<&str> = merges.lines().collect();
        assert_eq!(lines[0], "#version: 0.2");
        assert_eq!(lines.len(), 1 + 50256 - 256);
        assert_eq!(lines[1], "Ġ t", "GPT-2's first merge");
    }
}
