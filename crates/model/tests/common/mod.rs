//! What the model's integration tests share: a small GQA config and deterministic token ids.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use lab_config::ModelConfig;

// The GPU tests' tolerance for f32 through cubecl's products (TF32 on CUDA), lab-kernels'.
#[path = "../../../../kernels/tests/common/close.rs"]
mod close;
#[allow(unused_imports)] // the GPU tests' only
pub use close::f32_products;

/// Held by each test that runs on the GPU backend, so they run one at a time: `gpu_memory`
/// reads the bytes of live tensors in the device's pool, which another test's would change.
/// A GPU test added to this binary without it makes `gpu_memory` fail now and then.
pub fn gpu_alone() -> MutexGuard<'static, ()> {
    static GPU: Mutex<()> = Mutex::new(());
    GPU.lock().unwrap_or_else(|e| e.into_inner())
}

/// 61 tokens, 2 layers, 6 query heads over 2 key/value heads (head width 8).
pub fn small_config(seq_len: usize, init_std: f64) -> ModelConfig {
    ModelConfig {
        init_std,
        ..ModelConfig::llama(61, 2, 48, 6, 2, 64, seq_len)
    }
}

/// `[batch, t]` ids in `0..61`, a different sequence per `salt`.
pub fn ids<B: Backend>(batch: usize, t: usize, salt: usize) -> Tensor<B, 2, Int> {
    let data: Vec<i64> = (0..batch * t)
        .map(|i| ((i * 37 + salt * 11 + 5) % 61) as i64)
        .collect();
    Tensor::from_data(TensorData::new(data, [batch, t]), &Default::default())
}
