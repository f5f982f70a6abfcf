//! A decoder-only Llama-style transformer in burn: pre-norm RMSNorm, grouped-query causal
//! attention with RoPE, SwiGLU feed-forward, untied (or tied) embedding and LM head.
//!
//! Activations flow as `[tokens, d_model]` matrices (tokens = batch × seq_len) and become
//! `[batch, heads, seq, head_dim]` only inside attention, so every projection is one 2-D matmul.

pub mod attention;
pub mod generate;
pub mod hf;
pub mod hf_import;
pub mod init;
pub mod layers;
pub mod loss;
pub mod transformer;
pub mod vocab_swap;
pub mod weights;

pub use attention::LayerCache;
pub use lab_ops::{FusedLayers, FusedLoss, FusedOps};
pub use transformer::{compute_dtype, KvCache, Llama};

/// A one-layer model with an untied head, small enough to check by hand (unit tests).
#[cfg(test)]
pub(crate) fn tiny_test_config() -> lab_config::ModelConfig {
    lab_config::ModelConfig::llama(11, 1, 4, 2, 1, 8, 4)
}
