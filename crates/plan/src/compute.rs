//! Parameters and FLOPs: the exact parameter breakdown of the config, FLOPs per token under
//! the usual conventions, Chinchilla-optimal sizes, and how the config's count differs from
//! the published model of the same depth and width (the figure case studies tend to quote).

use lab_config::ModelConfig;
use serde::Serialize;

use crate::units::group;

/// The config's parameter count by component, plus the count the plan actually uses.
#[derive(Debug, Clone, Serialize)]
pub struct ParamsReport {
    pub embedding: u64,
    pub attention: u64,
    pub ffn: u64,
    pub norms: u64,
    pub lm_head: u64,
    pub total: u64,
    pub non_embedding: u64,
    pub tied_embeddings: bool,
    /// `--params`: a count to plan with instead of the exact one (a case study's assumption).
    pub override_params: Option<f64>,
    /// The count behind 6N, memory and checkpoint sizes: the override if given, else `total`.
    pub used: f64,
    /// The published model of the same shape, or the one the override matches.
    pub reference: Option<ReferenceComparison>,
}

pub fn params_report(model: &ModelConfig, override_params: Option<f64>) -> ParamsReport {
    let p = model.param_count();
    ParamsReport {
        embedding: p.embedding,
        attention: p.attention,
        ffn: p.ffn,
        norms: p.norms,
        lm_head: p.lm_head,
        total: p.total(),
        non_embedding: p.non_embedding(),
        tied_embeddings: model.tie_embeddings,
        override_params,
        used: override_params.unwrap_or(p.total() as f64),
        reference: reference_comparison(model, override_params),
    }
}

/// One way of counting training FLOPs per token.
#[derive(Debug, Clone, Serialize)]
pub struct FlopsConvention {
    pub key: &'static str,
    pub name: String,
    pub flops_per_token: f64,
    /// The convention the plan's times and costs use.
    pub used: bool,
}

/// Training FLOPs per token, counted four ways (five with `--params`). The plan uses the
/// full count (`lab train` reports MFU against the same number), or 6 × the override.
pub fn flops_conventions(model: &ModelConfig, params: &ParamsReport) -> Vec<FlopsConvention> {
    let attention_full = 12.0 * model.n_layer as f64 * model.seq_len as f64 * model.d_attn() as f64;
    let full = model.train_flops_per_token();
    let mut rows = vec![
        convention(
            "6n-non-embedding",
            "6N non-embedding (Kaplan et al. 2020)",
            6.0 * params.non_embedding as f64,
        ),
        convention("6n-total", "6N all parameters", 6.0 * params.total as f64),
        convention(
            "full",
            "6 x matmul params (LM head incl.) + 12·L·T·d_attn (PaLM app. B)",
            full,
        ),
        convention(
            "full-causal",
            "same, causal half of attention skipped (FlashAttention)",
            full - attention_full / 2.0,
        ),
    ];
    match params.override_params {
        Some(n) => rows.push(FlopsConvention {
            key: "6n-override",
            name: format!("6N with --params {}", crate::units::si(n)),
            flops_per_token: 6.0 * n,
            used: true,
        }),
        None => rows[2].used = true,
    }
    rows
}

fn convention(key: &'static str, name: &str, flops_per_token: f64) -> FlopsConvention {
    FlopsConvention {
        key,
        name: name.into(),
        flops_per_token,
        used: false,
    }
}

/// Chinchilla (Hoffmann et al. 2022): about 20 training tokens per parameter is compute-optimal,
/// and with C = 6·N·D that gives N = sqrt(C / 120), D = 20·N for a FLOP budget C.
#[derive(Debug, Clone, Serialize)]
pub struct Chinchilla {
    pub tokens_per_param_optimal: f64,
    /// 20 × the parameters the plan uses.
    pub optimal_tokens: f64,
    /// The plan's tokens per parameter.
    pub planned_tokens_per_param: f64,
    /// The plan's total FLOPs, spent compute-optimally.
    pub flop_budget: f64,
    pub compute_optimal_params: f64,
    pub compute_optimal_tokens: f64,
}

pub const CHINCHILLA_TOKENS_PER_PARAM: f64 = 20.0;

pub fn chinchilla(params: f64, tokens: f64, flop_budget: f64) -> Chinchilla {
    let n_opt = (flop_budget / (6.0 * CHINCHILLA_TOKENS_PER_PARAM)).sqrt();
    Chinchilla {
        tokens_per_param_optimal: CHINCHILLA_TOKENS_PER_PARAM,
        optimal_tokens: CHINCHILLA_TOKENS_PER_PARAM * params,
        planned_tokens_per_param: tokens / params,
        flop_budget,
        compute_optimal_params: n_opt,
        compute_optimal_tokens: CHINCHILLA_TOKENS_PER_PARAM * n_opt,
    }
}

/// Published Llama-style shapes whose parameter counts case studies quote.
fn reference_models() -> Vec<(&'static str, ModelConfig)> {
    let shape = ModelConfig::llama;
    vec![
        // Touvron et al. 2023, table 2: 6.7B ("7B"); multi-head attention, 32K SentencePiece.
        ("LLaMA-7B", shape(32_000, 32, 4096, 32, 32, 11008, 2048)),
        ("LLaMA-13B", shape(32_000, 40, 5120, 40, 40, 13824, 2048)),
        ("Llama-3-8B", shape(128_256, 32, 4096, 32, 8, 14336, 8192)),
    ]
}

/// The config's count next to a published model's, component by component.
#[derive(Debug, Clone, Serialize)]
pub struct ReferenceComparison {
    pub name: &'static str,
    pub params: u64,
    /// Why this reference: it has the config's depth and width, or it matches `--params`.
    pub matched_by: String,
    pub components: Vec<ComponentDelta>,
    /// `--params` minus the reference's exact count (rounding in the quoted figure).
    pub override_minus_reference: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ComponentDelta {
    pub component: &'static str,
    pub config: u64,
    pub reference: u64,
    /// config − reference.
    pub delta: i64,
    /// The shape fields behind the difference.
    pub because: String,
}

/// Finds the reference the override matches (within 2%), else one with the config's depth,
/// width and FFN, and explains each component's difference. None when nothing matches or the
/// config *is* the reference.
pub fn reference_comparison(
    model: &ModelConfig,
    override_params: Option<f64>,
) -> Option<ReferenceComparison> {
    let refs = reference_models();
    let by_override = override_params.and_then(|n| {
        refs.iter()
            .find(|(_, r)| (r.param_count().total() as f64 - n).abs() / n < 0.02)
            .map(|(name, r)| {
                (
                    *name,
                    r.clone(),
                    format!("--params {} matches it", crate::units::si(n)),
                )
            })
    });
    let by_shape = || {
        refs.iter()
            .find(|(_, r)| {
                r.n_layer == model.n_layer && r.d_model == model.d_model && r.d_ff == model.d_ff
            })
            .map(|(name, r)| {
                (
                    *name,
                    r.clone(),
                    "same n_layer, d_model and d_ff".to_string(),
                )
            })
    };
    let (name, reference, matched_by) = by_override.or_else(by_shape)?;
    let ours = model.param_count();
    let theirs = reference.param_count();
    if ours == theirs && override_params.is_none() {
        return None;
    }
    let differing = |fields: &[(&str, usize, usize)]| {
        let parts: Vec<String> = fields
            .iter()
            .filter(|(_, a, b)| a != b)
            .map(|(f, a, b)| format!("{f} {} vs {}", group(*a as u64), group(*b as u64)))
            .collect();
        if parts.is_empty() {
            "same shape".to_string()
        } else {
            parts.join(", ")
        }
    };
    let attention_fields = [
        ("n_layer", model.n_layer, reference.n_layer),
        ("d_model", model.d_model, reference.d_model),
        ("n_head", model.n_head, reference.n_head),
        ("n_kv_head", model.n_kv_head, reference.n_kv_head),
        ("head_dim", model.head_dim(), reference.head_dim()),
    ];
    let vocab_fields = [
        ("vocab_size", model.vocab_size, reference.vocab_size),
        ("d_model", model.d_model, reference.d_model),
    ];
    let mut head_because = differing(&vocab_fields);
    if model.tie_embeddings != reference.tie_embeddings {
        head_because = format!(
            "tie_embeddings {} vs {}",
            model.tie_embeddings, reference.tie_embeddings
        );
    } else if !model.tie_embeddings && model.vocab_size != reference.vocab_size {
        head_because.push_str(", untied: paid again in the head");
    }
    let delta = |component, a: u64, b: u64, because: String| ComponentDelta {
        component,
        config: a,
        reference: b,
        delta: a as i64 - b as i64,
        because,
    };
    let components = vec![
        delta(
            "embedding",
            ours.embedding,
            theirs.embedding,
            differing(&vocab_fields),
        ),
        delta(
            "attention",
            ours.attention,
            theirs.attention,
            differing(&attention_fields),
        ),
        delta(
            "ffn",
            ours.ffn,
            theirs.ffn,
            differing(&[
                ("n_layer", model.n_layer, reference.n_layer),
                ("d_model", model.d_model, reference.d_model),
                ("d_ff", model.d_ff, reference.d_ff),
            ]),
        ),
        delta(
            "norms",
            ours.norms,
            theirs.norms,
            differing(&[
                ("n_layer", model.n_layer, reference.n_layer),
                ("d_model", model.d_model, reference.d_model),
            ]),
        ),
        delta("lm_head", ours.lm_head, theirs.lm_head, head_because),
    ];
    Some(ReferenceComparison {
        name,
        params: theirs.total(),
        matched_by,
        components,
        override_minus_reference: override_params.map(|n| n - theirs.total() as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn med7b() -> ModelConfig {
        let mut m = reference_models()[0].1.clone();
        m.vocab_size = 64_000;
        m.n_kv_head = 8;
        m.seq_len = 4096;
        m
    }

    #[test]
    fn llama_7b_is_the_6_7b_figure() {
        let (name, llama) = &reference_models()[0];
        assert_eq!(*name, "LLaMA-7B");
        assert_eq!(llama.param_count().total(), 6_738_415_616);
    }

    #[test]
    fn med_7b_differs_from_llama_7b_by_kv_heads_and_vocabulary() {
        let m = med7b();
        assert_eq!(m.param_count().total(), 6_195_253_248);
        let r = reference_comparison(&m, None).unwrap();
        assert_eq!(r.name, "LLaMA-7B");
        let by = |c: &str| {
            r.components
                .iter()
                .find(|d| d.component == c)
                .unwrap()
                .clone()
        };
        // 8 KV heads instead of 32: K and V shrink 4×: 32 layers × 2 × 4096 × 3072 fewer.
        assert_eq!(by("attention").delta, -(32 * 2 * 4096 * 3072));
        assert!(by("attention").because.contains("n_kv_head 8 vs 32"));
        // 64K vocabulary instead of 32K, in the embedding and again in the untied head.
        assert_eq!(by("embedding").delta, 32_000 * 4096);
        assert_eq!(by("lm_head").delta, 32_000 * 4096);
        assert!(by("lm_head").because.contains("untied"));
        assert_eq!(by("ffn").delta, 0);
        let sum: i64 = r.components.iter().map(|d| d.delta).sum();
        assert_eq!(sum, 6_195_253_248 - 6_738_415_616);
    }

    #[test]
    fn override_matches_the_reference_it_quotes() {
        let r = reference_comparison(&med7b(), Some(6.7e9)).unwrap();
        assert_eq!(r.name, "LLaMA-7B");
        assert!(r.matched_by.contains("--params"));
        let rounding = r.override_minus_reference.unwrap();
        assert!((rounding - (6.7e9 - 6_738_415_616.0)).abs() < 1.0);
        // A count nothing matches and a shape nothing shares: no comparison.
        let mut odd = med7b();
        odd.n_layer = 7;
        assert!(reference_comparison(&odd, Some(1e9)).is_none());
        // The reference itself: nothing to explain.
        assert!(reference_comparison(&reference_models()[0].1, None).is_none());
    }

    #[test]
    fn flops_conventions_order_and_override() {
        let m = med7b();
        let p = params_report(&m, None);
        let rows = flops_conventions(&m, &p);
        assert_eq!(rows.iter().filter(|r| r.used).count(), 1);
        assert_eq!(rows[2].key, "full");
        assert!(rows[2].used);
        assert_eq!(rows[2].flops_per_token, m.train_flops_per_token());
        assert!(rows[0].flops_per_token < rows[1].flops_per_token);
        assert!(rows[3].flops_per_token < rows[2].flops_per_token);
        let p = params_report(&m, Some(6.7e9));
        let rows = flops_conventions(&m, &p);
        let used: Vec<_> = rows.iter().filter(|r| r.used).collect();
        assert_eq!(used.len(), 1);
        assert_eq!(used[0].flops_per_token, 40.2e9);
    }

    #[test]
    fn chinchilla_optimum_spends_the_budget() {
        let c = chinchilla(6.7e9, 200e9, 8.04e21);
        assert_eq!(c.optimal_tokens, 134e9);
        let spent = 6.0 * c.compute_optimal_params * c.compute_optimal_tokens;
        assert!((spent / 8.04e21 - 1.0).abs() < 1e-12);
        assert!((c.planned_tokens_per_param - 29.85).abs() < 0.01);
    }
}
