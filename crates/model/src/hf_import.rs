//! Reading a Hugging Face `LlamaForCausalLM` folder to train on from it (`lab train
//! --init-from-hf DIR`): `config.json` checked against the training config field by field, the
//! weights from `model.safetensors` or from the shards `model.safetensors.index.json` names
//! (fp32, or bf16/fp16 widened to fp32 exactly), renamed through the one table [`crate::hf::NAMES`].

use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use lab_config::ModelConfig;
use serde_json::Value;

use crate::hf;
use crate::weights::TensorMap;

pub const CONFIG: &str = "config.json";
/// The weights in one file.
pub const SINGLE: &str = "model.safetensors";
/// The weights in shards: `{"weight_map": {tensor name: shard file}}`.
pub const INDEX: &str = "model.safetensors.index.json";

/// `config.json` of a folder: as written, and as the model shape it describes.
pub struct HfConfig {
    pub json: Value,
    pub model: ModelConfig,
}

/// Reads and checks `DIR/config.json` (a Llama lab can run).
pub fn read_config(dir: &Path) -> Result<HfConfig> {
    let path = dir.join(CONFIG);
    if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}; a Hugging Face folder (lab export --hf) has one",
            path.display()
        )
    })?;
    let json: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let model = hf::model_config_from_hf(&json).with_context(|| path.display().to_string())?;
    Ok(HfConfig { json, model })
}

/// One mismatch line: `config.json KEY = A but the training config has model.FIELD = B`.
fn differs(key: &str, hf: impl Display, field: &str, ours: impl Display) -> String {
    format!("config.json {key} = {hf} but the training config has model.{field} = {ours}")
}

/// The architecture of `hf` against the training config's: every field that differs, on one
/// line. `vocab` also compares the vocabulary size (left out when a tokenizer swap re-indexes
/// the embedding rows).
pub fn check_architecture(hf: &ModelConfig, ours: &ModelConfig, vocab: bool) -> Result<()> {
    let mut out = Vec::new();
    let ints = [
        ("hidden_size", "d_model", hf.d_model, ours.d_model),
        ("num_hidden_layers", "n_layer", hf.n_layer, ours.n_layer),
        ("num_attention_heads", "n_head", hf.n_head, ours.n_head),
        (
            "num_key_value_heads",
            "n_kv_head",
            hf.n_kv_head,
            ours.n_kv_head,
        ),
        ("intermediate_size", "d_ff", hf.d_ff, ours.d_ff),
        ("head_dim", "head_dim", hf.head_dim(), ours.head_dim()),
        ("vocab_size", "vocab_size", hf.vocab_size, ours.vocab_size),
    ];
    for (key, field, a, b) in ints {
        if a != b && (vocab || key != "vocab_size") {
            out.push(differs(key, a, field, b));
        }
    }
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs());
    for (key, field, a, b) in [
        ("rope_theta", "rope_base", hf.rope_base, ours.rope_base),
        ("rms_norm_eps", "norm_eps", hf.norm_eps, ours.norm_eps),
    ] {
        if !close(a, b) {
            out.push(differs(key, a, field, b));
        }
    }
    if hf.tie_embeddings != ours.tie_embeddings {
        out.push(differs(
            "tie_word_embeddings",
            hf.tie_embeddings,
            "tie_embeddings",
            ours.tie_embeddings,
        ));
    }
    if out.is_empty() {
        return Ok(());
    }
    bail!(
        "{}; the architecture must match: use a config with the folder's shape",
        out.join("; ")
    )
}

/// The folder's weights under their HF names, and the files they came from.
pub fn read_weights(dir: &Path) -> Result<(TensorMap, Vec<PathBuf>)> {
    let single = dir.join(SINGLE);
    if single.is_file() {
        return Ok((load_widened(&single)?, vec![single]));
    }
    let index = dir.join(INDEX);
    if index.is_file() {
        return read_shards(dir, &index);
    }
    bail!(
        "{} has neither {SINGLE} nor {INDEX} (pytorch_model.bin is not read: save the model with safe_serialization=True)",
        dir.display()
    )
}

/// The tensors `index`'s `weight_map` lists, each from the shard it names.
fn read_shards(dir: &Path, index: &Path) -> Result<(TensorMap, Vec<PathBuf>)> {
    let text = std::fs::read_to_string(index)
        .with_context(|| format!("cannot read {}", index.display()))?;
    let json: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", index.display()))?;
    let Some(map) = json["weight_map"].as_object() else {
        bail!("{} has no weight_map object", index.display());
    };
    let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, file) in map {
        let file = file.as_str().filter(|f| is_plain_file_name(f));
        let Some(file) = file else {
            bail!(
                "{}: weight_map puts {name} in {}, not a file name in the folder",
                index.display(),
                map[name]
            );
        };
        by_shard.entry(file).or_default().push(name);
    }
    let (mut out, mut files) = (TensorMap::new(), Vec::new());
    for (file, names) in by_shard {
        let path = dir.join(file);
        let mut shard = load_widened(&path)?;
        for name in names {
            let Some(t) = shard.remove(name) else {
                bail!(
                    "{}: weight_map puts {name} in {file}, which does not hold it",
                    index.display()
                );
            };
            out.insert(name.to_string(), t);
        }
        files.push(path);
    }
    Ok((out, files))
}

/// A shard name must stay inside the folder.
fn is_plain_file_name(f: &str) -> bool {
    let mut parts = Path::new(f).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    )
}

/// A safetensors file's tensors as fp32 (bf16 and fp16 widen exactly).
pub fn load_widened(path: &Path) -> Result<TensorMap> {
    Ok(crate::weights::load_safetensors(path)?.0)
}

/// HF tensors under lab's names and layouts. A tied model takes no `lm_head.weight` (some
/// folders carry the copy anyway).
pub fn to_lab(mut tensors: TensorMap, tied: bool) -> Result<TensorMap> {
    if tied {
        tensors.remove("lm_head.weight");
    }
    hf::from_hf(&tensors)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::weights::{save_safetensors, HostTensor};
    use safetensors::Dtype;

    fn cfg() -> ModelConfig {
        ModelConfig {
            vocab_size: 16,
            d_model: 8,
            d_ff: 12,
            seq_len: 8,
            ..crate::tiny_test_config()
        }
    }

    fn t(shape: &[usize], seed: f32) -> HostTensor {
        let n = shape.iter().product();
        HostTensor {
            shape: shape.to_vec(),
            data: (0..n).map(|i| seed + i as f32 * 0.5).collect(),
        }
    }

    fn write_config(dir: &Path, c: &ModelConfig) {
        let json = hf::hf_config(c, 0, 0);
        std::fs::write(dir.join(CONFIG), json.to_string()).unwrap();
    }

    #[test]
    fn sharded_folders_read_every_tensor_from_the_shard_the_index_names() {
        let dir = tempfile::tempdir().unwrap();
        let a = TensorMap::from([
            ("model.embed_tokens.weight".into(), t(&[16, 8], 0.0)),
            ("model.norm.weight".into(), t(&[8], 1.0)),
        ]);
        let b = TensorMap::from([("lm_head.weight".into(), t(&[16, 8], 2.0))]);
        let (fa, fb) = (
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        );
        save_safetensors(&dir.path().join(fa), &a, HashMap::new()).unwrap();
        save_safetensors(&dir.path().join(fb), &b, HashMap::new()).unwrap();
        let index = serde_json::json!({
            "metadata": { "total_size": 0 },
            "weight_map": {
                "model.embed_tokens.weight": fa, "model.norm.weight": fa, "lm_head.weight": fb,
            },
        });
        std::fs::write(dir.path().join(INDEX), index.to_string()).unwrap();

        let (tensors, files) = read_weights(dir.path()).unwrap();
        let mut all = a.clone();
        all.extend(b.clone());
        assert_eq!(tensors, all);
        assert_eq!(files, vec![dir.path().join(fa), dir.path().join(fb)]);

        // A map that points at the wrong shard, or outside the folder, is refused by name.
        let wrong = serde_json::json!({ "weight_map": { "lm_head.weight": fa } });
        std::fs::write(dir.path().join(INDEX), wrong.to_string()).unwrap();
        let e = format!("{:#}", read_weights(dir.path()).unwrap_err());
        assert!(
            e.contains(
                "puts lm_head.weight in model-00001-of-00002.safetensors, which does not hold it"
            ),
            "{e}"
        );
        let outside = serde_json::json!({ "weight_map": { "lm_head.weight": "../x.safetensors" } });
        std::fs::write(dir.path().join(INDEX), outside.to_string()).unwrap();
        let e = format!("{:#}", read_weights(dir.path()).unwrap_err());
        assert!(e.contains("not a file name in the folder"), "{e}");
    }

    #[test]
    fn a_folder_without_weights_says_what_it_looks_for() {
        let dir = tempfile::tempdir().unwrap();
        let e = format!("{:#}", read_weights(dir.path()).unwrap_err());
        assert!(e.contains(SINGLE) && e.contains(INDEX), "{e}");
    }

    #[test]
    fn bf16_and_f16_widen_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let values = [1.5f32, -0.25, 3.0];
        let mut bytes = Vec::new();
        for v in values {
            bytes.extend(half::bf16::from_f32(v).to_bits().to_le_bytes());
        }
        let view = safetensors::tensor::TensorView::new(Dtype::BF16, vec![3], &bytes).unwrap();
        let file = safetensors::serialize([("w", view)], &None).unwrap();
        let path = dir.path().join("w.safetensors");
        std::fs::write(&path, file).unwrap();
        assert_eq!(load_widened(&path).unwrap()["w"].data, values);
    }

    #[test]
    fn an_architecture_mismatch_names_each_field_and_both_values_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut theirs = cfg();
        (theirs.d_model, theirs.d_ff, theirs.rope_base) = (16, 24, 500_000.0);
        write_config(dir.path(), &theirs);
        let hf = read_config(dir.path()).unwrap();
        assert_eq!(hf.model, theirs);
        let e = format!(
            "{:#}",
            check_architecture(&hf.model, &cfg(), true).unwrap_err()
        );
        assert!(!e.contains('\n'), "{e}");
        for part in [
            "config.json hidden_size = 16 but the training config has model.d_model = 8",
            "config.json intermediate_size = 24 but the training config has model.d_ff = 12",
            "config.json rope_theta = 500000 but the training config has model.rope_base = 10000",
            "config.json head_dim = 8 but the training config has model.head_dim = 4",
        ] {
            assert!(e.contains(part), "{part:?} in {e}");
        }

        let mut other = cfg();
        (other.vocab_size, other.n_kv_head, other.tie_embeddings) = (32, 2, true);
        let e = format!(
            "{:#}",
            check_architecture(&cfg(), &other, true).unwrap_err()
        );
        assert!(e.contains("config.json num_key_value_heads = 1 but the training config has model.n_kv_head = 2"), "{e}");
        assert!(
            e.contains(
                "config.json vocab_size = 16 but the training config has model.vocab_size = 32"
            ),
            "{e}"
        );
        assert!(e.contains("config.json tie_word_embeddings = false but the training config has model.tie_embeddings = true"), "{e}");
        // A tokenizer swap re-indexes the rows: the vocabulary may differ then.
        other.n_kv_head = 1;
        other.tie_embeddings = false;
        check_architecture(&cfg(), &other, false).unwrap();
        check_architecture(&cfg(), &cfg(), true).unwrap();
    }

    #[test]
    fn a_tied_model_drops_the_lm_head_copy() {
        let hf = TensorMap::from([
            ("model.embed_tokens.weight".into(), t(&[4, 2], 0.0)),
            ("lm_head.weight".into(), t(&[4, 2], 0.0)),
        ]);
        let lab = to_lab(hf.clone(), true).unwrap();
        assert_eq!(lab.keys().collect::<Vec<_>>(), ["embed"]);
        assert_eq!(
            to_lab(hf, false).unwrap()["lm_head.weight"].shape,
            vec![2, 4]
        );
    }
}
