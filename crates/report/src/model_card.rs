//! `MODEL_CARD.md`, written from the run's own files: data, tokenizer, architecture, compute,
//! cost, evaluation present in the run, limits and intended use.

use std::fmt::Write as _;

use lab_config::LabConfig;
use serde_json::Value;

use crate::manifest::Manifest;

fn millions(n: u64) -> String {
    format!("{:.2}M", n as f64 / 1e6)
}

pub fn model_card(m: &Manifest, cfg: &LabConfig) -> String {
    let mut md = String::new();
    let p = cfg.model.param_count();
    let meta = &m.data["meta"];
    let _ = writeln!(md, "# Model card: {}\n", m.name);
    let _ = writeln!(
        md,
        "A {} parameter Llama-style decoder-only language model ({} outside the embedding and LM head), pretrained from scratch by `lab` {} with seed {}.\n",
        millions(p.total()),
        millions(p.non_embedding()),
        m.versions.lab,
        m.seed
    );
    md.push_str("## Intended use\n\nA foundation model for research and teaching: a base to study, evaluate and train further. It is not instruction-tuned, has not been evaluated for safety, factuality or bias, and is **not a medical device**: it must not be used to diagnose, treat or advise on any medical condition, or for any clinical decision.\n\n");

    md.push_str("## Data\n\n");
    let _ = writeln!(
        md,
        "Tokenizer: `{}` ({} tokens in its vocabulary). Training tokens: {}; validation tokens: {}.\n",
        meta["tokenizer"].as_str().unwrap_or("?"),
        meta["vocab_size"],
        meta["files"]["train.bin"]["tokens"],
        meta["files"]["val.bin"]["tokens"]
    );
    if let Some(sources) = meta["sources"].as_array().filter(|s| !s.is_empty()) {
        md.push_str("| source | details |\n|---|---|\n");
        for s in sources {
            let name = s["name"].as_str().or(s["path"].as_str()).unwrap_or("?");
            let details: Vec<String> = s
                .as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "name" | "path"))
                        .map(|(k, v)| format!("{k}: {}", compact(v)))
                        .collect()
                })
                .unwrap_or_default();
            let _ = writeln!(md, "| {name} | {} |", details.join(", "));
        }
        md.push('\n');
    }
    if let Some(filters) = meta["filters"].as_array().filter(|f| !f.is_empty()) {
        md.push_str("Filters applied, in order:\n\n");
        for f in filters {
            let name = f["name"].as_str().unwrap_or("?");
            let _ = writeln!(md, "- `{name}`: {}", compact(f));
        }
        md.push('\n');
    }

    md.push_str("## Architecture\n\n| | |\n|---|---|\n");
    let c = &cfg.model;
    for (k, v) in [
        ("layers", c.n_layer.to_string()),
        ("model width", c.d_model.to_string()),
        (
            "query / key-value heads (GQA)",
            format!("{} / {}", c.n_head, c.n_kv_head),
        ),
        ("head dimension", c.head_dim().to_string()),
        ("feed-forward (SwiGLU) width", c.d_ff.to_string()),
        ("context length", c.seq_len.to_string()),
        ("position encoding", format!("RoPE, base {}", c.rope_base)),
        (
            "normalization",
            format!("RMSNorm (pre-norm), eps {}", c.norm_eps),
        ),
        (
            "embedding and LM head",
            if c.tie_embeddings { "tied" } else { "untied" }.into(),
        ),
        (
            "parameters",
            format!("{} total, {} non-embedding", p.total(), p.non_embedding()),
        ),
    ] {
        let _ = writeln!(md, "| {k} | {v} |");
    }

    let t = &cfg.train;
    let flops = cfg.model.train_flops_per_token() * m.tokens;
    md.push_str("\n## Training\n\n");
    let _ = writeln!(
        md,
        "{} optimizer steps of {} tokens ({:.3e} tokens in all); AdamW (β {}/{}, weight decay {}), peak learning rate {} with {} warmup steps and cosine decay to {}, global gradient clipping at {}; {} precision. Compute: {:.3e} training FLOPs (6 × matmul parameters incl. LM head, plus attention). Hardware: {}. From {} to {}.\n",
        m.checkpoint_step,
        cfg.tokens_per_step(),
        m.tokens,
        t.beta1,
        t.beta2,
        t.weight_decay,
        t.peak_lr,
        t.warmup_steps,
        t.min_lr,
        t.grad_clip,
        serde_json::to_value(t.precision).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        flops,
        m.hardware.summary(),
        m.started_utc.as_deref().unwrap_or("?"),
        m.ended_utc.as_deref().unwrap_or("?")
    );
    match m.cost.total_usd {
        Some(usd) => {
            let _ = writeln!(
                md,
                "Cost: ${usd:.2} ({}{}).\n",
                m.cost.provider.as_deref().unwrap_or("unknown provider"),
                m.cost
                    .cap_usd
                    .map(|c| format!(", cap ${c:.2}"))
                    .unwrap_or_default()
            );
        }
        None => md.push_str("Cost: not recorded (the run had no budget guard).\n\n"),
    }
    let stab = &m.stability;
    let _ = writeln!(
        md,
        "Stability: {} injected spike batch(es), {} spike(s) detected, {} rollback(s); see spike-postmortem.md.\n",
        stab.get("spikes_injected").unwrap_or(&0),
        stab.get("spikes_detected").unwrap_or(&0),
        stab.get("rollbacks").unwrap_or(&0)
    );

    md.push_str("## Evaluation\n\n| metric | value |\n|---|---|\n");
    let f = &m.final_metrics;
    if let Some(l) = f.train_loss {
        let _ = writeln!(
            md,
            "| final training loss (step {}) | {l:.4} nats/token |",
            f.step
        );
    }
    if let Some(v) = f.val_loss {
        let _ = writeln!(
            md,
            "| final validation loss | {v:.4} nats/token (perplexity {:.1}) |",
            v.exp()
        );
    }
    for (name, v) in &f.evaluation {
        let _ = match name.strip_prefix("val_loss.") {
            Some(t) => writeln!(md, "| validation loss on {t} | {v:.4} nats/token |"),
            None if name.starts_with("mc_acc") => {
                writeln!(md, "| multiple-choice probe, {name} | {:.1} % |", v * 100.0)
            }
            None => writeln!(md, "| {name} | {v:.4} |"),
        };
    }
    if !f.evaluation.keys().any(|k| k.starts_with("mc_")) {
        md.push_str("\nNo downstream benchmark was run during training; the losses are on held-out text of the training distribution.\n");
    }
    md.push('\n');

    md.push_str("## Known limits\n\n");
    let _ = writeln!(
        md,
        "- Trained on {:.3e} tokens of one corpus: it knows little beyond it and writes plausible but often wrong text.\n- It may reproduce passages of its training data verbatim.\n- No alignment, no refusal behaviour, no safety filtering.\n- Context is limited to {} tokens.\n",
        m.tokens, c.seq_len
    );
    md.push_str("## Reproduce\n\n");
    let _ = writeln!(
        md,
        "lab {} (git {}), burn {}, {}; config sha256 `{}`; the effective config is `config.toml` in this folder. The same seed on the same backend reproduces these weights bit for bit (`final.safetensors`, sha256 in manifest.json).",
        m.versions.lab, m.versions.git_commit, m.versions.burn, m.versions.rustc, m.config_sha256
    );
    md
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
