//! Hugging Face `LlamaForCausalLM` ⇄ lab, through one name table used in both directions (the
//! idea of torchtitan's `state_dict_adapter`). lab keeps every matrix as `[d_in, d_out]`
//! (`y = x · W`), torch's `nn.Linear` as `[d_out, d_in]`: those rows are transposed on the way.
//! RoPE needs no permutation: lab rotates halves, as HF's Llama does.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use lab_config::ModelConfig;
use serde_json::{json, Value};

use crate::weights::{HostTensor, TensorMap};

/// (lab name, HF name, stored transposed). `{i}` is the layer index.
pub const NAMES: &[(&str, &str, bool)] = &[
    ("embed", "model.embed_tokens.weight", false),
    (
        "blocks.{i}.attn_norm.weight",
        "model.layers.{i}.input_layernorm.weight",
        false,
    ),
    (
        "blocks.{i}.attn.wq.weight",
        "model.layers.{i}.self_attn.q_proj.weight",
        true,
    ),
    (
        "blocks.{i}.attn.wk.weight",
        "model.layers.{i}.self_attn.k_proj.weight",
        true,
    ),
    (
        "blocks.{i}.attn.wv.weight",
        "model.layers.{i}.self_attn.v_proj.weight",
        true,
    ),
    (
        "blocks.{i}.attn.wo.weight",
        "model.layers.{i}.self_attn.o_proj.weight",
        true,
    ),
    (
        "blocks.{i}.ffn_norm.weight",
        "model.layers.{i}.post_attention_layernorm.weight",
        false,
    ),
    (
        "blocks.{i}.ffn.gate.weight",
        "model.layers.{i}.mlp.gate_proj.weight",
        true,
    ),
    (
        "blocks.{i}.ffn.up.weight",
        "model.layers.{i}.mlp.up_proj.weight",
        true,
    ),
    (
        "blocks.{i}.ffn.down.weight",
        "model.layers.{i}.mlp.down_proj.weight",
        true,
    ),
    ("norm.weight", "model.norm.weight", false),
    ("lm_head.weight", "lm_head.weight", true),
];

/// `name` matched against `pattern` (`{i}` = digits): the layer index, or `Some(None)` for a
/// pattern without one.
fn matches(pattern: &str, name: &str) -> Option<Option<String>> {
    match pattern.split_once("{i}") {
        None => (pattern == name).then_some(None),
        Some((pre, post)) => {
            let i = name.strip_prefix(pre)?.strip_suffix(post)?;
            (!i.is_empty() && i.bytes().all(|b| b.is_ascii_digit())).then(|| Some(i.to_string()))
        }
    }
}

/// Renames (and transposes) every tensor of `from`; `to_hf` picks the direction.
fn convert(from: &TensorMap, to_hf: bool) -> Result<TensorMap> {
    let mut out = BTreeMap::new();
    for (name, t) in from {
        let row = NAMES.iter().find_map(|&(lab, hf, transposed)| {
            let (src, dst) = if to_hf { (lab, hf) } else { (hf, lab) };
            let i = matches(src, name)?;
            Some((dst.replace("{i}", i.as_deref().unwrap_or("")), transposed))
        });
        match row {
            Some((dst, transposed)) => {
                out.insert(dst, if transposed { transpose(t)? } else { t.clone() });
            }
            // HF checkpoints of older transformers carry the RoPE table; it is derived.
            None if !to_hf && name.ends_with("rotary_emb.inv_freq") => {}
            None => bail!(
                "{} tensor {name} has no {} name (see lab_model::hf::NAMES)",
                if to_hf { "lab" } else { "Hugging Face" },
                if to_hf { "Hugging Face" } else { "lab" }
            ),
        }
    }
    Ok(out)
}

/// lab's tensors under HF Llama names and layouts.
pub fn to_hf(lab: &TensorMap) -> Result<TensorMap> {
    convert(lab, true)
}

/// An HF Llama state dict under lab's names and layouts.
pub fn from_hf(hf: &TensorMap) -> Result<TensorMap> {
    convert(hf, false)
}

pub(crate) fn transpose(t: &HostTensor) -> Result<HostTensor> {
    let [r, c] = t.shape[..] else {
        bail!("cannot transpose a tensor of shape {:?}", t.shape);
    };
    let mut data = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            data[j * r + i] = t.data[i * c + j];
        }
    }
    Ok(HostTensor {
        shape: vec![c, r],
        data,
    })
}

/// `config.json` of a `LlamaForCausalLM` with this shape (fp32 weights).
pub fn hf_config(cfg: &ModelConfig, bos: u32, eos: u32) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "head_dim": cfg.head_dim(),
        "hidden_act": "silu",
        "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_base,
        "rope_scaling": null,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "use_cache": true,
    })
}

/// The model shape an HF `config.json` describes, checked against what lab can run.
pub fn model_config_from_hf(c: &Value) -> Result<ModelConfig> {
    let arch = c["architectures"][0].as_str().unwrap_or_default();
    if c["model_type"] != "llama" && arch != "LlamaForCausalLM" {
        bail!(
            "config.json describes {arch:?} (model_type {}), not a LlamaForCausalLM",
            c["model_type"]
        );
    }
    let int = |k: &str| -> Result<usize> {
        c[k].as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| anyhow::anyhow!("config.json has no integer {k}"))
    };
    if !(c["rope_scaling"].is_null()) {
        bail!("config.json sets rope_scaling, which lab's RoPE does not implement");
    }
    let (d, h) = (int("hidden_size")?, int("num_attention_heads")?);
    if h == 0 {
        bail!("config.json num_attention_heads is 0: a model needs at least one head");
    }
    let head_dim = c["head_dim"]
        .as_u64()
        .map(|v| v as usize)
        .filter(|&hd| hd != d / h);
    let cfg = ModelConfig {
        vocab_size: int("vocab_size")?,
        n_layer: int("num_hidden_layers")?,
        d_model: d,
        n_head: h,
        n_kv_head: c["num_key_value_heads"].as_u64().map_or(h, |v| v as usize),
        d_ff: int("intermediate_size")?,
        seq_len: int("max_position_embeddings")?,
        rope_base: c["rope_theta"].as_f64().unwrap_or(10_000.0),
        norm_eps: c["rms_norm_eps"].as_f64().unwrap_or(1e-6),
        init_std: c["initializer_range"].as_f64().unwrap_or(0.02),
        head_dim,
        tie_embeddings: c["tie_word_embeddings"].as_bool().unwrap_or(false),
        init_depth_scaled: false,
    };
    cfg.validate()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], seed: f32) -> HostTensor {
        let n = shape.iter().product();
        HostTensor {
            shape: shape.to_vec(),
            data: (0..n).map(|i| seed + i as f32).collect(),
        }
    }

    #[test]
    fn names_and_layouts_round_trip_both_ways() {
        let lab = TensorMap::from([
            ("embed".into(), t(&[10, 4], 0.0)),
            ("blocks.11.attn.wq.weight".into(), t(&[4, 6], 1.0)),
            ("blocks.0.ffn_norm.weight".into(), t(&[4], 2.0)),
            ("lm_head.weight".into(), t(&[4, 10], 3.0)),
        ]);
        let hf = to_hf(&lab).unwrap();
        let q = &hf["model.layers.11.self_attn.q_proj.weight"];
        assert_eq!(q.shape, vec![6, 4]);
        assert_eq!(
            q.data[1], lab["blocks.11.attn.wq.weight"].data[6],
            "[0,1] ← [1,0]"
        );
        assert_eq!(hf["lm_head.weight"].shape, vec![10, 4]);
        assert!(hf.contains_key("model.layers.0.post_attention_layernorm.weight"));
        assert_eq!(from_hf(&hf).unwrap(), lab);
        let bad = TensorMap::from([("blocks.x.attn.wq.weight".into(), t(&[1], 0.0))]);
        assert!(format!("{:#}", to_hf(&bad).unwrap_err()).contains("blocks.x.attn.wq.weight"));
    }

    #[test]
    fn a_config_without_heads_is_an_error_not_a_division_by_zero() {
        let cfg: ModelConfig = serde_json::from_value(json!({
            "vocab_size": 16, "n_layer": 1, "d_model": 8, "n_head": 2, "n_kv_head": 1,
            "d_ff": 12, "seq_len": 8,
        }))
        .unwrap();
        let mut c = hf_config(&cfg, 0, 0);
        assert!(model_config_from_hf(&c).is_ok());
        c["num_attention_heads"] = json!(0);
        let e = model_config_from_hf(&c).unwrap_err().to_string();
        assert!(e.contains("num_attention_heads is 0"), "{e}");
    }
}
