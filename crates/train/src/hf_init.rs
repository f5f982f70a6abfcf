//! `lab train --init-from-hf DIR`: continued pretraining from a Hugging Face
//! `LlamaForCausalLM` folder. Everything is checked before the run folder is touched: the
//! architecture against the training config (lab-model's `hf_import`), then the vocabularies.
//! When the folder's tokenizer is the data's, the weights load as they are; when it differs,
//! the embedding and LM-head rows are re-indexed for the data's tokenizer (lab-model's
//! `vocab_swap`) and the rest of the network is kept. The run starts at step 0 from those
//! weights with fresh AdamW moments; the trainer checkpoints that state at once and records
//! what it did as an `init_from_hf` event.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use lab_config::LabConfig;
use lab_corpus::tokenize::{byte_pair_encode, Tokenizer};
use lab_model::hf_import::{self, HfConfig};
use lab_model::vocab_swap::{fresh_rows, OldVocab, RowPlan, SwapCounts};
use lab_model::weights::TensorMap;
use serde_json::{json, Value};

use crate::backend::TrainBackend;
use crate::state::TrainingState;
use crate::stream::TrainData;

const EMBED: &str = "model.embed_tokens.weight";
const HEAD: &str = "lm_head.weight";

/// The state to start from, what to record about it, and the line that says so.
pub struct HfInit<B: TrainBackend> {
    pub state: TrainingState<B>,
    pub record: Value,
    pub summary: String,
}

/// A tokenizer and how the report names it.
struct Named {
    tok: Tokenizer,
    name: String,
}

/// How the folder's vocabulary relates to the data's.
enum Vocab {
    /// The same tokenizer (or one that cannot be compared, of the same size: `note` says so).
    Same { note: Option<String> },
    /// Rows are re-indexed from `old` (the folder's) to `new` (the data's).
    Swap { old: Box<Named>, new: Box<Named> },
}

/// What became of the embedding rows.
enum Rows {
    Kept {
        note: Option<String>,
    },
    Swapped {
        from: String,
        to: String,
        counts: SwapCounts,
    },
}

/// Reads `dir` for a fresh run of `cfg` on `data` (errors are one line, naming the field or
/// the file).
pub fn load<B: TrainBackend>(
    dir: &Path,
    cfg: &LabConfig,
    data: &TrainData,
    device: &B::Device,
) -> Result<HfInit<B>> {
    let hf = hf_import::read_config(dir)?;
    hf_import::check_architecture(&hf.model, &cfg.model, false)?;
    // `Same` implies equal vocab sizes: every field has been compared by now.
    let vocab = resolve_vocab(dir, &hf, cfg, data)?;
    let (mut tensors, files) = hf_import::read_weights(dir)?;
    let rows = match vocab {
        Vocab::Swap { old, new } => Rows::Swapped {
            counts: swap_rows(&mut tensors, &old, &new, cfg)?,
            from: old.name,
            to: new.name,
        },
        Vocab::Same { note } => Rows::Kept { note },
    };
    let lab = hf_import::to_lab(tensors, cfg.model.tie_embeddings)?;
    let state = TrainingState::from_weights(cfg, lab, device)?;
    let (record, summary) = report(dir, &files, &rows, cfg)?;
    Ok(HfInit {
        state,
        record,
        summary,
    })
}

/// Decides between loading the rows as they are and a tokenizer swap.
fn resolve_vocab(dir: &Path, hf: &HfConfig, cfg: &LabConfig, data: &TrainData) -> Result<Vocab> {
    let old = folder_tokenizer(dir);
    let new = data_tokenizer(&data.meta.tokenizer, &data.dir, data.meta.vocab_size);
    let same_size = hf.model.vocab_size == cfg.model.vocab_size;
    Ok(match (old, new) {
        (Ok(old), Ok(new)) => {
            if same_size && same_vocabulary(&old.tok, &new.tok) {
                Vocab::Same { note: None }
            } else {
                Vocab::Swap {
                    old: Box::new(old),
                    new: Box::new(new),
                }
            }
        }
        (Err(why), _) | (_, Err(why)) if same_size => Vocab::Same {
            note: Some(format!(
                "{why}: the folder's vocabulary is taken to be the data's (both {} ids)",
                cfg.model.vocab_size
            )),
        },
        (Err(why), _) | (_, Err(why)) => bail!(
            "config.json vocab_size = {} but the training config has model.vocab_size = {}, and {why}: no tokenizer pair to map the embedding rows with",
            hf.model.vocab_size,
            cfg.model.vocab_size
        ),
    })
}

/// The folder's tokenizer: `tokenizer.json`, or GPT-2-style `vocab.json` (+ `merges.txt`).
fn folder_tokenizer(dir: &Path) -> std::result::Result<Named, String> {
    let file = dir.join("tokenizer.json");
    if file.is_file() {
        let tok = Tokenizer::from_file(&file)
            .map_err(|e| format!("the folder's tokenizer.json cannot be used ({e:#})"))?;
        return Ok(named(tok, file.display().to_string()));
    }
    let vocab = dir.join("vocab.json");
    if vocab.is_file() {
        let tok = from_vocab_json(dir)
            .map_err(|e| format!("the folder's vocab.json cannot be used ({e:#})"))?;
        return Ok(named(tok, vocab.display().to_string()));
    }
    Err("the folder has no tokenizer (tokenizer.json, or vocab.json + merges.txt)".into())
}

/// The same ids for the same bytes, and the same end-of-text id (GPT-2's own encoder keeps
/// `<|endoftext|>` out of its table; read from vocab.json it is a special token).
fn same_vocabulary(a: &Tokenizer, b: &Tokenizer) -> bool {
    a.vocab_size() == b.vocab_size() && a.eot() == b.eot() && a.ranks() == b.ranks()
}

/// Names GPT-2's vocabulary `gpt2`, whatever file it came from.
fn named(tok: Tokenizer, file: String) -> Named {
    let is_gpt2 = tok.vocab_size() == lab_corpus::tokenize::GPT2_VOCAB
        && Tokenizer::gpt2().is_ok_and(|g| same_vocabulary(&g, &tok));
    let name = if is_gpt2 { "gpt2".into() } else { file };
    Named { tok, name }
}

/// A byte-level BPE from `vocab.json` and the special tokens the folder names. Ids are the
/// merge ranks, as in GPT-2's and lab's vocabularies (merges.txt is not needed for that).
fn from_vocab_json(dir: &Path) -> Result<Tokenizer> {
    let path = dir.join("vocab.json");
    let text = std::fs::read_to_string(&path)?;
    let vocab: serde_json::Map<String, Value> = serde_json::from_str(&text)?;
    let mut specials = special_tokens(dir);
    if specials.is_empty() {
        specials.push(lab_corpus::tokenize::GPT2_EOT_TEXT.into());
    }
    let added: Vec<Value> = specials
        .iter()
        .filter_map(|s| Some(json!({ "id": vocab.get(s)?, "content": s })))
        .collect();
    let json = json!({ "model": { "type": "BPE", "vocab": vocab }, "added_tokens": added });
    Tokenizer::from_json_str(&json.to_string(), &path)
}

/// bos/eos/unk/pad tokens of special_tokens_map.json and tokenizer_config.json.
fn special_tokens(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for file in ["special_tokens_map.json", "tokenizer_config.json"] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
            continue;
        };
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            let t = v[key].as_str().or(v[key]["content"].as_str());
            if let Some(t) = t.filter(|t| !out.iter().any(|o| o == t)) {
                out.push(t.to_string());
            }
        }
    }
    out
}

/// The data's tokenizer (meta.json's `tokenizer`: `gpt2`, or a tokenizer.json path, looked
/// up as written and then beside the data).
fn data_tokenizer(spec: &str, data_dir: &Path, vocab: usize) -> std::result::Result<Named, String> {
    if matches!(spec, "gpt2" | "r50k_base") {
        let tok = Tokenizer::gpt2().map_err(|e| format!("{e:#}"))?;
        return Ok(Named {
            tok,
            name: "gpt2".into(),
        });
    }
    let path = Tokenizer::locate_for_data(spec, data_dir).map_err(|e| format!("{e:#}"))?;
    let tok = Tokenizer::from_file(Path::new(&path)).map_err(|e| format!("{e:#}"))?;
    if tok.vocab_size() != vocab {
        return Err(format!(
            "the data's tokenizer {path} has {} ids but meta.json says vocab_size {vocab}",
            tok.vocab_size()
        ));
    }
    Ok(Named {
        tok,
        name: spec.to_string(),
    })
}

/// Re-indexes the embedding (and untied LM-head) rows of the HF `tensors` from `old` to `new`.
fn swap_rows(
    tensors: &mut TensorMap,
    old: &Named,
    new: &Named,
    cfg: &LabConfig,
) -> Result<SwapCounts> {
    let Some(embed) = tensors.get(EMBED) else {
        bail!("the folder's weights have no {EMBED}");
    };
    let mut ids: HashMap<Vec<u8>, u32> = HashMap::new();
    for (id, bytes) in old.tok.token_bytes().into_iter().enumerate() {
        if let Some(b) = bytes {
            ids.entry(b).or_insert(id as u32);
        }
    }
    let encode = |bytes: &[u8]| encode_bytes(&old.tok, bytes);
    let [rows, _] = embed.shape[..] else {
        bail!("{EMBED} is not a matrix: shape {:?}", embed.shape);
    };
    let vocab = OldVocab {
        ids: &ids,
        rows,
        encode: &encode,
    };
    let eot = [(new.tok.eot(), old.tok.eot())];
    let plan = RowPlan::new(&new.tok.token_bytes(), cfg.model.vocab_size, &vocab, &eot);
    let counts = plan.counts();
    let (fresh_embed, fresh_head) = if counts.initialised > 0 {
        let (e, h) = fresh_rows(&cfg.model, cfg.train.seed);
        (Some(e), h)
    } else {
        (None, None)
    };
    let new_embed = plan.apply(embed, fresh_embed.as_ref())?;
    tensors.insert(EMBED.into(), new_embed);
    if !cfg.model.tie_embeddings {
        let Some(head) = tensors.get(HEAD) else {
            bail!("the folder's weights have no {HEAD} (config.json says the head is untied)");
        };
        let new_head = plan.apply(head, fresh_head.as_ref())?;
        tensors.insert(HEAD.into(), new_head);
    }
    Ok(counts)
}

/// The old tokenizer's ids for a new token's bytes: its text encoded, or (bytes that are not
/// UTF-8 on their own, a piece of a character) byte-pair merged directly.
fn encode_bytes(tok: &Tokenizer, bytes: &[u8]) -> Vec<u32> {
    match std::str::from_utf8(bytes) {
        Ok(text) => tok.encode(text),
        Err(_) => {
            let mut out = Vec::new();
            byte_pair_encode(bytes, tok.ranks(), &mut out);
            out
        }
    }
}

/// The `init_from_hf` event's fields and the line printed.
fn report(dir: &Path, files: &[PathBuf], rows: &Rows, cfg: &LabConfig) -> Result<(Value, String)> {
    let mut hashes = serde_json::Map::new();
    for f in files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        hashes.insert(name.into_owned(), lab_fsio::sha256_file(f)?.into());
    }
    let abs = std::path::absolute(dir).unwrap_or(dir.to_path_buf());
    let mut record = json!({ "dir": abs, "files": hashes });
    let head = if cfg.model.tie_embeddings {
        "embedding (tied head)"
    } else {
        "embedding and LM-head"
    };
    let what = match rows {
        Rows::Swapped {
            from,
            to,
            counts: c,
        } => {
            record["tokenizer_swap"] = json!({
                "from": from, "to": to, "rows": cfg.model.vocab_size,
                "copied": c.copied, "composed": c.composed, "initialised": c.initialised,
            });
            format!(
                "tokenizer swap {from} → {to}: {head} rows {} copied, {} composed, {} initialised",
                c.copied, c.composed, c.initialised
            )
        }
        Rows::Kept { note } => {
            record["tokenizer_swap"] = Value::Null;
            match note {
                Some(n) => format!("note: {n}"),
                None => "same tokenizer as the data: weights as they are".into(),
            }
        }
    };
    let summary = format!(
        "initialised from {} ({} file(s)), step 0, fresh AdamW moments; {what}",
        dir.display(),
        files.len()
    );
    Ok((record, summary))
}
