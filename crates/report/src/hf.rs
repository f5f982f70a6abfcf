//! `lab export --hf DIR`: a Hugging Face `LlamaForCausalLM` folder (config.json,
//! model.safetensors under HF names and layouts, generation_config.json, the tokenizer files
//! AutoTokenizer loads offline), through lab-model's one name table. `lab_parity.json` records
//! what lab computes on a fixed prompt (logits and 20 greedy tokens), which
//! `scripts/reference/hf_parity.py` compares with transformers.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use lab_config::LabConfig;
use lab_model::{hf, weights, Llama};
use lab_train::checkpoint;
use serde_json::json;

use crate::export::CheckpointChoice;
use crate::run_files::RunFiles;

/// The file an HF export writes last but one: its mark (an earlier export may be replaced).
pub const PARITY_FILE: &str = "lab_parity.json";

/// The prompt of lab_parity.json.
pub const PARITY_PROMPT: &str = "First Citizen:\nBefore we proceed any further, hear me speak.";
/// Greedy tokens generated after it.
pub const PARITY_NEW_TOKENS: usize = 20;

/// Writes the HF folder of `run`'s chosen checkpoint to `out` (atomically).
pub fn export_hf(run: &Path, out: &Path, choice: CheckpointChoice) -> Result<()> {
    let files = RunFiles::read(run)?;
    let Some(cfg) = files.config.clone() else {
        bail!(
            "{} has no config.toml: export it with the lab that trained it",
            run.display()
        );
    };
    let out = &crate::export::normalized(out);
    crate::export::check_destination(out, PARITY_FILE)?;
    let (ck, _) = crate::export::choose_checkpoint(run, choice)?;
    let (tensors, _) = weights::load_safetensors(&checkpoint::model_file(&ck))?;
    let data: serde_json::Value = fs::read_to_string(run.join(lab_train::run::DATA))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let tokenizer = lab_corpus::tokenize::Tokenizer::locate_for_data(
        data["meta"]["tokenizer"].as_str().unwrap_or("gpt2"),
        Path::new(data["data_dir"].as_str().unwrap_or_default()),
    )?;
    let eot = data["meta"]["eot_token"]
        .as_u64()
        .unwrap_or(lab_data::gpt2::GPT2_EOT as u64) as u32;

    let _writing = lab_fsio::lock_dir_writers(out)?;
    lab_fsio::recover_replaced_dir(out)?;
    let stage = lab_fsio::temp_sibling(out);
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(&stage).with_context(|| format!("cannot create {}", stage.display()))?;
    let written = (|| -> Result<()> {
        let json = |name: &str, v: &serde_json::Value| {
            lab_fsio::write_atomic(
                &stage.join(name),
                (serde_json::to_string_pretty(v)? + "\n").as_bytes(),
            )
        };
        json("config.json", &hf::hf_config(&cfg.model, eot, eot))?;
        json(
            "generation_config.json",
            &json!({ "bos_token_id": eot, "eos_token_id": eot, "max_length": cfg.model.seq_len }),
        )?;
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        weights::save_safetensors(
            &stage.join("model.safetensors"),
            &hf::to_hf(&tensors)?,
            meta,
        )?;
        lab_corpus::hf_tokenizer::write_hf_tokenizer(&tokenizer, &stage, cfg.model.seq_len)?;
        json(PARITY_FILE, &parity(&cfg, &tensors, &tokenizer)?)?;
        Ok(())
    })();
    match written {
        Ok(()) => lab_fsio::replace_dir(&stage, out),
        Err(e) => {
            let _ = fs::remove_dir_all(&stage);
            Err(e)
        }
    }
}

/// lab's logits on the parity prompt (every position, at ~256 evenly spaced vocabulary ids,
/// plus each position's argmax) and its greedy continuation.
fn parity(
    cfg: &LabConfig,
    tensors: &weights::TensorMap,
    tokenizer: &str,
) -> Result<serde_json::Value> {
    let device = Default::default();
    let model = weights::load_tensor_map(
        Llama::<Flex>::new(&cfg.model, cfg.train.seed, &device),
        tensors,
    )?;
    let tok = lab_corpus::tokenize::Tokenizer::load(tokenizer)?;
    let mut ids: Vec<u32> = tok.encode(PARITY_PROMPT);
    ids.truncate(cfg.model.seq_len.saturating_sub(PARITY_NEW_TOKENS));
    let v = cfg.model.vocab_size;
    let logits_of = |ids: &[u32]| -> Vec<f32> {
        let x: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let t = Tensor::<Flex, 2, Int>::from_data(TensorData::new(x, [1, ids.len()]), &device);
        model
            .logits(t)
            .into_data()
            .convert::<f32>()
            .into_vec()
            .expect("f32 logits")
    };
    let prompt_logits = logits_of(&ids);
    let stride = (v / 256).max(1);
    let sampled: Vec<usize> = (0..v).step_by(stride).collect();
    let rows: Vec<Vec<f32>> = prompt_logits
        .chunks(v)
        .map(|row| sampled.iter().map(|&j| row[j]).collect())
        .collect();
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32)
    };
    let prompt_argmax: Vec<u32> = prompt_logits.chunks(v).map(argmax).collect();
    let mut seq = ids.clone();
    for _ in 0..PARITY_NEW_TOKENS {
        let logits = logits_of(&seq);
        seq.push(argmax(&logits[logits.len() - v..]));
    }
    Ok(json!({
        "prompt": PARITY_PROMPT,
        "prompt_ids": ids,
        "vocab_ids": sampled,
        "logits": rows,
        "argmax": prompt_argmax,
        "greedy_ids": &seq[ids.len()..],
    }))
}
