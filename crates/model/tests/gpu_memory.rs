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
#[allow(dead_code)] // its SHAPES are the CPU test's; this test has its own, below
mod forward_memory;
use forward_memory::{assert_planned, config, kept_by_forward, per_layer_per_token, Shape};

/// The CPU test's shapes (`forward_memory::SHAPES`: a base, then one term moved in each) at
/// widths CUDA's allocator does not pad. cubecl-cuda pitches the rows of every new tensor
/// (`PitchedMemoryLayoutPolicy`: a row of 512 bytes or more to a multiple of 512, a shorter
/// one to a power of two), and cubecl's pool counts the padding: there the CPU's feed-forward
/// rows of 160 and 320 columns, and q|k|v products of 192, would take 256, 384 or 512 columns'
/// bytes, which the planner does not count. Real models' widths are multiples of 256
/// (x1-50m's 768, 1,280, 2,048; the 7B's and MedGemma's too), which no precision pads. Here
/// every row (d_model, (h + 2·kv)·hd, h·hd, d_ff, 2·d_ff) is a power of two under 512 bytes
/// or a multiple of 512, in f32 and in two-byte types.
const SHAPES: [Shape; 6] = [
    (64, 4, 2, 16, 256, 32),
    (64, 4, 2, 16, 512, 32),  // d_ff
    (64, 8, 4, 16, 256, 32),  // key/value heads (query heads too: 256 q|k|v columns)
    (64, 4, 2, 32, 256, 32),  // head width: d_attn 128 ≠ d_model
    (128, 4, 2, 16, 256, 32), // d_model
    (64, 4, 2, 16, 256, 64),  // sequence
];

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
