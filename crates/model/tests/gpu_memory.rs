//! `lab plan`'s activation count against what a GPU backend really keeps: lab's model runs its
//! training forward on `Autodiff<Fusion<CubeBackend>>` (wgpu, lavapipe in CI; CUDA when built
//! with only `--features cuda`, on a GPU host), and the bytes of live tensors in cubecl's pool
//! after the forward, less those before it, must match [`block_bytes_per_token`]'s `Flash`
//! count within 1 % (on lavapipe, at fp32, it matches to the byte). The CPU's `Scores` count
//! is checked by lab-plan's `activation_memory` test.
//!
//! Per layer per token, by differences: (3 layers − 1 layer) × (8 sequences − 4), so what a
//! forward keeps once (the parameters' casts, RoPE tables, the loss) cancels. cubecl counts
//! a tensor's bytes without its pool's padding, so no reading needs repeating.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::Autodiff;
use lab_config::{ModelConfig, Precision};
use lab_model::Llama;
use lab_ops::DeviceMemory;
use lab_plan::memory::{block_bytes_per_token, AttentionKind};

use crate::common;

#[cfg(feature = "wgpu")]
type Inner = burn::backend::Wgpu;
#[cfg(not(feature = "wgpu"))]
type Inner = burn::backend::Cuda;
type B<C> = Autodiff<Inner, C>;

/// A small GQA model: `(d_model, n_head, n_kv_head, head_dim, d_ff, seq_len)`.
fn config(shape: (usize, usize, usize, usize, usize, usize), layers: usize) -> ModelConfig {
    let (d_model, n_head, n_kv_head, head_dim, d_ff, seq_len) = shape;
    ModelConfig {
        n_layer: layers,
        d_model,
        n_head,
        n_kv_head,
        d_ff,
        head_dim: Some(head_dim),
        ..common::small_config(seq_len, 0.02)
    }
}

fn in_use<C: CheckpointStrategy>() -> i64 {
    B::<C>::device_bytes(&Default::default())
        .expect("a GPU backend reports its pool")
        .in_use as i64
}

/// Bytes of live tensors after the training forward (loss computed, graph kept for backward)
/// that were not live before it.
fn kept_by_forward<C: CheckpointStrategy>(cfg: &ModelConfig, batch: usize, p: Precision) -> i64 {
    let model = Llama::<B<C>>::new(cfg, 7, &Default::default()).with_precision(p);
    let tokens = common::ids::<B<C>>(batch, cfg.seq_len, 0);
    let targets = common::ids::<B<C>>(batch, cfg.seq_len, 1);
    let before = in_use::<C>();
    let loss = model.loss(tokens, targets);
    let kept = in_use::<C>() - before;
    drop(loss);
    kept
}

/// Bytes kept per layer per token, measured.
fn measured<C: CheckpointStrategy>(
    shape: (usize, usize, usize, usize, usize, usize),
    p: Precision,
) -> f64 {
    let (one, three) = (config(shape, 1), config(shape, 3));
    let kept = |cfg: &ModelConfig, batch| kept_by_forward::<C>(cfg, batch, p) as f64;
    let per_two_layers_four_sequences =
        kept(&three, 8) - kept(&one, 8) - kept(&three, 4) + kept(&one, 4);
    per_two_layers_four_sequences / (2.0 * 4.0 * shape.5 as f64)
}

#[test]
fn the_planner_counts_what_the_gpu_backend_keeps() {
    let _gpu = common::gpu_alone();
    let shapes = [
        (64, 4, 2, 16, 160, 32),
        (64, 4, 2, 16, 320, 32),  // d_ff
        (64, 4, 4, 16, 160, 32),  // key/value heads
        (64, 4, 2, 32, 160, 32),  // head width: d_attn 128 ≠ d_model
        (128, 8, 2, 16, 160, 32), // d_model and query heads
        (64, 4, 2, 16, 160, 64),  // sequence: no T × T term on a GPU
    ];
    // lavapipe has no bf16; a CUDA build checks the mixed-precision count too.
    let precisions: &[Precision] = if cfg!(feature = "wgpu") {
        &[Precision::Fp32]
    } else {
        &[Precision::Fp32, Precision::Bf16]
    };
    for shape in shapes {
        let cfg = config(shape, 1);
        for &p in precisions {
            let plan = |selective| block_bytes_per_token(&cfg, p, AttentionKind::Flash, selective);
            let kept = measured::<NoCheckpointing>(shape, p);
            let kept_selective = measured::<BalancedCheckpointing>(shape, p);
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
    }
}
