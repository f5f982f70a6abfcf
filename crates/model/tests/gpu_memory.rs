//! `lab plan`'s activation count against what a GPU backend really keeps: lab's model runs its
//! training forward on `Autodiff<Fusion<CubeBackend>>` (wgpu, lavapipe in CI; CUDA when built
//! with only `--features cuda`, on a GPU host), and the bytes of live tensors in cubecl's pool
//! after the forward, less those before it, must match the planner's `Flash` count within 1 %
//! (on lavapipe it matches to the byte, at fp32 and in bf16's bytes with f16 standing in).
//! The measurement is lab-plan's (`crates/plan/tests/support/forward_memory.rs`), where the
//! CPU's `Scores` count is checked with a counting allocator. cubecl counts a tensor's bytes
//! without its pool's padding, so no reading needs repeating.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::Autodiff;
use burn::tensor::FloatDType;
use lab_config::{ModelConfig, Precision};
use lab_ops::DeviceMemory;
use lab_plan::memory::AttentionKind;

use crate::common;

#[path = "../../plan/tests/support/forward_memory.rs"]
mod forward_memory;
use forward_memory::{assert_planned, config, kept_by_forward, per_layer_per_token, SHAPES};

#[cfg(feature = "wgpu")]
type Inner = burn::backend::Wgpu;
#[cfg(not(feature = "wgpu"))]
type Inner = burn::backend::Cuda;
type B<C> = Autodiff<Inner, C>;

/// The dtype the forward computes in for precision `p`. lavapipe has no bf16: f16 stands in
/// for it, with the same casts and the same two bytes an element, so bf16's count is checked
/// there too (a CUDA build checks it in bf16 itself).
fn compute(p: Precision) -> FloatDType {
    match lab_model::compute_dtype(p) {
        FloatDType::BF16 if cfg!(feature = "wgpu") => FloatDType::F16,
        dtype => dtype,
    }
}

/// Bytes the training forward leaves live in the device's pool.
fn kept<C: CheckpointStrategy>(cfg: &ModelConfig, batch: usize, p: Precision) -> f64 {
    let live = || {
        B::<C>::device_bytes(&Default::default())
            .expect("a GPU backend reports its pool")
            .in_use as i64
    };
    kept_by_forward::<B<C>>(cfg, batch, compute(p), live) as f64
}

#[test]
fn the_planner_counts_what_the_gpu_backend_keeps() {
    let _gpu = common::gpu_alone();
    // Whatever a first forward sets up once (kernels, autotune results) outside the readings.
    kept::<NoCheckpointing>(&config(SHAPES[0], 2), 2, Precision::Fp32);
    for shape in SHAPES {
        for p in [Precision::Fp32, Precision::Bf16] {
            let all =
                per_layer_per_token(shape, |cfg, batch| kept::<NoCheckpointing>(cfg, batch, p));
            let selective = per_layer_per_token(shape, |cfg, batch| {
                kept::<BalancedCheckpointing>(cfg, batch, p)
            });
            assert_planned(shape, p, AttentionKind::Flash, all, selective);
        }
    }
}
