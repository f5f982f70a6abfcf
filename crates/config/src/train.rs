//! The training recipe: optimizer, schedule, batch, precision, cadence of logs, evals and
//! checkpoints.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// fp32 everywhere.
    Fp32,
    /// bf16 compute with fp32 master weights and optimizer state (the GPU recipe).
    Bf16,
}

/// How the LM head's cross-entropy is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LmHeadLoss {
    /// lab-ops' fused, chunked op: logits never held whole (the default).
    #[default]
    Fused,
    /// The plain composition (full logits, log_softmax, gather), for before/after comparisons.
    Unfused,
}

/// What the backward pass recomputes instead of keeping (`train.activation_checkpointing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActivationCheckpointing {
    /// Every activation backward needs is kept from the forward (the default).
    #[default]
    None,
    /// torchtitan's "selective" (op-level) checkpointing, as burn's `BalancedCheckpointing`
    /// does it: outputs of compute-bound ops (matmuls, casts, fused kernels) are kept, those of
    /// elementwise ops (norms, SwiGLU, softmax) are recomputed in backward from them.
    /// Same arithmetic, same results; less memory, some recomputation.
    Selective,
}

impl ActivationCheckpointing {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Selective => "selective",
        }
    }
}

/// The names `as_str` gives (`--activation-checkpointing none|selective`).
impl std::str::FromStr for ActivationCheckpointing {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        by_name(
            name,
            &[Self::None, Self::Selective],
            Self::as_str,
            "checkpointing mode",
        )
    }
}

/// The member of `all` called `name`, or a one-line error listing the names.
fn by_name<T: Copy>(
    name: &str,
    all: &[T],
    name_of: fn(T) -> &'static str,
    what: &str,
) -> Result<T, String> {
    all.iter()
        .copied()
        .find(|&x| name_of(x) == name)
        .ok_or_else(|| {
            let names: Vec<_> = all.iter().map(|&x| name_of(x)).collect();
            format!("{name:?} is not a {what}: use {}", names.join(" or "))
        })
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Bf16 => "bf16",
        }
    }
}

/// The names `as_str` gives (`--precision fp32|bf16`).
impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        by_name(name, &[Self::Fp32, Self::Bf16], Self::as_str, "precision")
    }
}

impl LmHeadLoss {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fused => "fused",
            Self::Unfused => "unfused",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// One seed drives init, data order and spike sampling.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Sequences per forward/backward pass.
    pub micro_batch: usize,
    /// Micro-batches accumulated per optimizer step.
    #[serde(default = "one")]
    pub grad_accum: usize,
    pub total_steps: usize,
    pub warmup_steps: usize,
    pub peak_lr: f64,
    pub min_lr: f64,
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Decoupled (AdamW) weight decay, applied to matrices only (see lab-train's optimizer).
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f64,
    /// Global L2 norm the gradient is clipped to; 0 disables clipping.
    #[serde(default = "one_f")]
    pub grad_clip: f64,
    #[serde(default = "default_precision")]
    pub precision: Precision,
    /// `fused` (default) or `unfused`; recorded in the run's config.toml.
    #[serde(default, skip_serializing_if = "is_fused")]
    pub lm_head_loss: LmHeadLoss,
    /// `none` (default) or `selective`; recorded in the run's config.toml when not `none`.
    #[serde(default, skip_serializing_if = "is_none")]
    pub activation_checkpointing: ActivationCheckpointing,
    #[serde(default = "default_log_every")]
    pub log_every: usize,
    #[serde(default = "default_eval_every")]
    pub eval_every: usize,
    /// Fixed validation batches per evaluation.
    #[serde(default = "default_eval_batches")]
    pub eval_batches: usize,
    #[serde(default = "default_ckpt_every")]
    pub ckpt_every: usize,
    /// Retention: the newest `keep_last` checkpoints, plus every `keep_every`-th.
    #[serde(default = "default_keep_last")]
    pub keep_last: usize,
    #[serde(default = "default_keep_every")]
    pub keep_every: usize,
    /// Continued pretraining (`--freeze-non-embedding-steps`): for the first K steps only the
    /// embedding and the LM head train; every other parameter keeps its weights and its AdamW
    /// moments stay untouched. 0 (the default) freezes nothing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub freeze_non_embedding_steps: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_none(ac: &ActivationCheckpointing) -> bool {
    *ac == ActivationCheckpointing::None
}

fn is_fused(l: &LmHeadLoss) -> bool {
    *l == LmHeadLoss::Fused
}

fn default_seed() -> u64 {
    42
}
fn one() -> usize {
    1
}
fn one_f() -> f64 {
    1.0
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.95
}
fn default_eps() -> f64 {
    1e-8
}
fn default_weight_decay() -> f64 {
    0.1
}
fn default_precision() -> Precision {
    Precision::Fp32
}
fn default_log_every() -> usize {
    10
}
fn default_eval_every() -> usize {
    100
}
fn default_eval_batches() -> usize {
    8
}
fn default_ckpt_every() -> usize {
    100
}
fn default_keep_last() -> usize {
    5
}
fn default_keep_every() -> usize {
    10
}

impl TrainConfig {
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("micro_batch", self.micro_batch),
            ("grad_accum", self.grad_accum),
            ("total_steps", self.total_steps),
            ("log_every", self.log_every),
            ("eval_every", self.eval_every),
            ("eval_batches", self.eval_batches),
            ("ckpt_every", self.ckpt_every),
            ("keep_last", self.keep_last),
            ("keep_every", self.keep_every),
        ] {
            if v == 0 {
                bail!("train.{name} must be > 0");
            }
        }
        if self.warmup_steps > self.total_steps {
            bail!(
                "train.warmup_steps ({}) must not exceed train.total_steps ({})",
                self.warmup_steps,
                self.total_steps
            );
        }
        if self.freeze_non_embedding_steps > self.total_steps {
            bail!(
                "train.freeze_non_embedding_steps ({}) must not exceed train.total_steps ({})",
                self.freeze_non_embedding_steps,
                self.total_steps
            );
        }
        if !(self.peak_lr > 0.0 && self.peak_lr.is_finite()) {
            bail!("train.peak_lr ({}) must be a positive number", self.peak_lr);
        }
        if !(self.min_lr >= 0.0 && self.min_lr <= self.peak_lr) {
            bail!(
                "train.min_lr ({}) must be between 0 and train.peak_lr ({})",
                self.min_lr,
                self.peak_lr
            );
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                bail!("train.{name} ({b}) must be in [0, 1)");
            }
        }
        if self.eps.is_nan() || self.eps <= 0.0 {
            bail!("train.eps ({}) must be > 0", self.eps);
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            bail!("train.weight_decay ({}) must be >= 0", self.weight_decay);
        }
        if self.grad_clip.is_nan() || self.grad_clip < 0.0 {
            bail!(
                "train.grad_clip ({}) must be >= 0 (0 disables clipping)",
                self.grad_clip
            );
        }
        Ok(())
    }
}
