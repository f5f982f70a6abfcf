//! The model's shape: a decoder-only Llama-style transformer (pre-norm RMSNorm, GQA, RoPE,
//! SwiGLU, untied embedding and LM head) and its exact parameter count.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub n_layer: usize,
    pub d_model: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA): each serves `n_head / n_kv_head` query heads.
    pub n_kv_head: usize,
    /// Hidden width of the SwiGLU feed-forward block.
    pub d_ff: usize,
    /// Context length in tokens.
    pub seq_len: usize,
    #[serde(default = "default_rope_base")]
    pub rope_base: f64,
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    #[serde(default = "default_init_std")]
    pub init_std: f64,
    /// Width of one attention head; defaults to `d_model / n_head`. Set it for models whose
    /// attention width differs from `d_model` (Gemma-3-27B: 32 × 128 = 4096 < 5376).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Share the input embedding with the LM head (Gemma does; the lab-00 recipe does not).
    #[serde(default)]
    pub tie_embeddings: bool,
    /// Draw the residual output projections (attention `wo`, feed-forward `down`) with
    /// std `init_std / sqrt(2 · n_layer)`, as GPT-2, nanoGPT and torchtitan do, so the residual
    /// stream's variance does not grow with depth. Off by default: the lab-00 recipe is plain
    /// normal(0, 0.02), and its weight hashes stay.
    #[serde(default, skip_serializing_if = "is_false")]
    pub init_depth_scaled: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_rope_base() -> f64 {
    10_000.0
}
fn default_norm_eps() -> f64 {
    1e-5
}
fn default_init_std() -> f64 {
    0.02
}

/// Parameter count by component. Embedding and LM head are untied, so both count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ParamCount {
    pub embedding: u64,
    /// q, k, v and o projections over all layers.
    pub attention: u64,
    /// gate, up and down projections over all layers.
    pub ffn: u64,
    /// The two RMSNorm weights per layer plus the final norm.
    pub norms: u64,
    pub lm_head: u64,
}

impl ParamCount {
    pub fn total(&self) -> u64 {
        self.embedding + self.attention + self.ffn + self.norms + self.lm_head
    }
    /// Everything but the input embedding and the LM head (the convention of Kaplan et al.).
    pub fn non_embedding(&self) -> u64 {
        self.attention + self.ffn + self.norms
    }
}

impl ModelConfig {
    /// A model of this shape (arguments in the fields' order) with everything else as a config
    /// file gets it when it leaves it out: RoPE base 10,000, RMSNorm eps 1e-5, init std 0.02,
    /// heads `d_model / n_head` wide, untied embedding, plain init. Set the rest with struct
    /// update syntax: `ModelConfig { init_std: 0.3, ..ModelConfig::llama(…) }`.
    pub fn llama(
        vocab_size: usize,
        n_layer: usize,
        d_model: usize,
        n_head: usize,
        n_kv_head: usize,
        d_ff: usize,
        seq_len: usize,
    ) -> Self {
        Self {
            vocab_size,
            n_layer,
            d_model,
            n_head,
            n_kv_head,
            d_ff,
            seq_len,
            rope_base: default_rope_base(),
            norm_eps: default_norm_eps(),
            init_std: default_init_std(),
            head_dim: None,
            tie_embeddings: false,
            init_depth_scaled: false,
        }
    }

    /// Init std of the residual output projections (see `init_depth_scaled`).
    pub fn init_std_residual(&self) -> f64 {
        if self.init_depth_scaled {
            self.init_std / (2.0 * self.n_layer as f64).sqrt()
        } else {
            self.init_std
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_head)
    }

    /// Width of the concatenated query heads (= d_model unless `head_dim` is set).
    pub fn d_attn(&self) -> usize {
        self.n_head * self.head_dim()
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.n_head / self.n_kv_head
    }

    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("n_layer", self.n_layer),
            ("d_model", self.d_model),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("d_ff", self.d_ff),
            ("seq_len", self.seq_len),
        ] {
            if v == 0 {
                bail!("model.{name} must be > 0");
            }
        }
        if self.head_dim == Some(0) {
            bail!("model.head_dim must be > 0");
        }
        if self.head_dim.is_none() && !self.d_model.is_multiple_of(self.n_head) {
            bail!(
                "model.d_model ({}) must be divisible by model.n_head ({})",
                self.d_model,
                self.n_head
            );
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            bail!(
                "model.n_head ({}) must be divisible by model.n_kv_head ({}) for grouped-query attention",
                self.n_head,
                self.n_kv_head
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            bail!("model head_dim ({}) must be even for RoPE", self.head_dim());
        }
        if self.rope_base.is_nan() || self.rope_base <= 1.0 {
            bail!("model.rope_base ({}) must be > 1", self.rope_base);
        }
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            bail!("model.norm_eps ({}) must be > 0", self.norm_eps);
        }
        if self.init_std.is_nan() || self.init_std <= 0.0 {
            bail!("model.init_std ({}) must be > 0", self.init_std);
        }
        Ok(())
    }

    pub fn param_count(&self) -> ParamCount {
        let (v, d, l) = (
            self.vocab_size as u64,
            self.d_model as u64,
            self.n_layer as u64,
        );
        let hd = self.head_dim() as u64;
        let q = d * self.d_attn() as u64;
        let kv = 2 * d * self.n_kv_head as u64 * hd;
        let o = self.d_attn() as u64 * d;
        ParamCount {
            embedding: v * d,
            attention: l * (q + kv + o),
            ffn: l * 3 * d * self.d_ff as u64,
            norms: l * 2 * d + d,
            lm_head: if self.tie_embeddings { 0 } else { d * v },
        }
    }

    /// Training FLOPs per token: 6 × (every matmul parameter, LM head included) plus the
    /// attention scores and weighted values, 12 × n_layer × seq_len × d_attn (PaLM, app. B).
    /// The causal half is not subtracted: the kernels compute the full square.
    pub fn train_flops_per_token(&self) -> f64 {
        let p = self.param_count();
        // A tied head still does its matmul: count it once more.
        let head = (self.d_model * self.vocab_size) as u64;
        let matmul_params = (p.attention + p.ffn + head) as f64;
        let d_attn = self.d_attn() as f64;
        6.0 * matmul_params + 12.0 * self.n_layer as f64 * self.seq_len as f64 * d_attn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_gives_what_a_file_naming_only_the_shape_gives() {
        let file = "vocab_size = 97\nn_layer = 2\nd_model = 32\nn_head = 4\nn_kv_head = 2\n\
                    d_ff = 48\nseq_len = 16\n";
        let parsed: ModelConfig = toml::from_str(file).unwrap();
        assert_eq!(parsed, ModelConfig::llama(97, 2, 32, 4, 2, 48, 16));
    }

    #[test]
    fn gemma3_27b_with_explicit_head_dim_and_tied_embedding() {
        let mut c = ModelConfig::llama(262144, 62, 5376, 32, 16, 21504, 8192);
        c.head_dim = Some(128);
        c.tie_embeddings = true;
        c.validate().unwrap();
        let p = c.param_count();
        assert_eq!(p.lm_head, 0);
        // ~27.0B: 62 × (66.06M attention + 346.8M FFN) + 1.41B embedding.
        assert!((p.total() as f64 - 27.0e9).abs() < 0.1e9, "{}", p.total());
    }

    #[test]
    fn x1_50m_matches_the_recipe() {
        let p = ModelConfig::llama(50257, 8, 768, 12, 4, 2048, 1024).param_count();
        // 50,343,936 in the blocks (norms included) + the 768 of the final norm.
        assert_eq!(p.non_embedding(), 50_343_936 + 768);
        assert_eq!(p.embedding, 38_597_376);
        assert_eq!(p.total(), 127_539_456);
    }

    #[test]
    fn med_7b_is_6_20_billion() {
        let p = ModelConfig::llama(64000, 32, 4096, 32, 8, 11008, 4096).param_count();
        assert_eq!(p.total(), 6_195_253_248);
    }

    #[test]
    fn flops_per_token_counts_head_and_attention() {
        let c = ModelConfig::llama(50257, 8, 768, 12, 4, 2048, 1024);
        let p = c.param_count();
        let expect = 6.0 * (p.attention + p.ffn + p.lm_head) as f64 + 12.0 * 8.0 * 1024.0 * 768.0;
        assert_eq!(c.train_flops_per_token(), expect);
        assert!(c.train_flops_per_token() > 6.0 * p.non_embedding() as f64 * 1.7);
    }
}
