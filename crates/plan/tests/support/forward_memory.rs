//! What both activation-count tests share: a small GQA model whose training forward leaves
//! some bytes live (the tensors kept for backward), measured per layer per token by
//! differences and held against `lab plan`'s count. lab-plan's `activation_memory` reads the
//! CPU's allocator; lab-model's `gpu_memory` (which includes this file by path) reads a GPU
//! backend's memory pool.

use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use lab_config::{ModelConfig, Precision};
use lab_model::{FusedOps, Llama};
use lab_plan::memory::{block_bytes_per_token, AttentionKind};

/// `(d_model, n_head, n_kv_head, head_dim, d_ff, seq_len)`.
pub type Shape = (usize, usize, usize, usize, usize, usize);

/// A base shape, then shapes that each move one term of the count.
pub const SHAPES: [Shape; 6] = [
    (64, 4, 2, 16, 160, 32),
    (64, 4, 2, 16, 320, 32),  // d_ff
    (64, 4, 4, 16, 160, 32),  // key/value heads
    (64, 4, 2, 32, 160, 32),  // head width: d_attn 128 ≠ d_model
    (128, 8, 2, 16, 160, 32), // d_model and query heads
    (64, 4, 2, 16, 160, 64),  // sequence: the T × T scores, where they are kept
];

pub fn config(shape: Shape, layers: usize) -> ModelConfig {
    let (d_model, n_head, n_kv_head, head_dim, d_ff, seq_len) = shape;
    ModelConfig {
        head_dim: Some(head_dim),
        ..ModelConfig::llama(61, layers, d_model, n_head, n_kv_head, d_ff, seq_len)
    }
}

/// Bytes a training forward (loss computed, graph kept for backward) on backend `B`, computing
/// in `compute` (the dtype of a precision, or f16 standing in for bf16), leaves live that were
/// not live before it, as `live` reads the bytes live.
pub fn kept_by_forward<B: FusedOps>(
    cfg: &ModelConfig,
    batch: usize,
    compute: FloatDType,
    live: impl Fn() -> i64,
) -> i64 {
    let device = Default::default();
    // As a training step runs it: the weights drawn (they are drawn lazily) and, in mixed
    // precision, the linear ones cast, before the count starts.
    let model = Llama::<B>::new(cfg, 7, &device)
        .with_compute_dtype(compute)
        .step_copy();
    // `[batch, T]` ids in the config's 61 words, a different sequence per salt.
    let ids = |salt: usize| {
        let data: Vec<i64> = (0..batch * cfg.seq_len)
            .map(|i| ((i * 37 + salt * 11 + 5) % 61) as i64)
            .collect();
        Tensor::<B, 2, Int>::from_data(TensorData::new(data, [batch, cfg.seq_len]), &device)
    };
    let (tokens, targets) = (ids(0), ids(1));
    let before = live();
    let loss = model.loss(tokens, targets);
    let kept = live() - before;
    drop(loss);
    kept
}

/// Bytes kept per layer per token, from `kept(config, sequences)` (the bytes one forward
/// leaves live) at (3 layers − 1 layer) × (8 sequences − 4): what a forward keeps once
/// (parameters' casts, RoPE tables, the mask, the loss) cancels.
pub fn per_layer_per_token(shape: Shape, mut kept: impl FnMut(&ModelConfig, usize) -> f64) -> f64 {
    let (one, three) = (config(shape, 1), config(shape, 3));
    let per_two_layers_four_sequences =
        kept(&three, 8) - kept(&one, 8) - kept(&three, 4) + kept(&one, 4);
    per_two_layers_four_sequences / (2.0 * 4.0 * shape.5 as f64)
}

/// `kept` and `kept_selective` (with selective checkpointing), measured per layer per token,
/// each within 1 % of the planner's count for `attention`.
pub fn assert_planned(
    shape: Shape,
    p: Precision,
    attention: AttentionKind,
    kept: f64,
    kept_selective: f64,
) {
    let cfg = config(shape, 1);
    let plan = |selective| block_bytes_per_token(&cfg, p, attention, selective);
    eprintln!(
        "{shape:?} {p:?}: kept {kept:.0} B/layer/token (planner {:.0}), selective {kept_selective:.0} (planner {:.0})",
        plan(false),
        plan(true)
    );
    for (what, got, want) in [
        ("kept", kept, plan(false)),
        (
            "kept with selective checkpointing",
            kept_selective,
            plan(true),
        ),
    ] {
        assert!(
            (got - want).abs() <= 0.01 * want,
            "{shape:?} {p:?}: {what} {got} B/layer/token, planner {want}"
        );
    }
}
