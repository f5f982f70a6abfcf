//! Validation loss on fixed, evenly spaced windows of val.bin (the same every evaluation, so
//! losses compare across steps and runs).

use anyhow::Result;
use burn::module::Module;
use burn::tensor::ElementConversion;
use lab_config::LabConfig;
use lab_data::{sampler, TokenFile};
use lab_model::{FusedOps, Llama};

use crate::step::to_tensors;

/// Mean loss over `train.eval_batches` batches of `train.micro_batch` windows.
pub fn evaluate<B: FusedOps>(model: &Llama<B>, val: &TokenFile, cfg: &LabConfig) -> Result<f64> {
    let (rows, n) = (cfg.train.micro_batch, cfg.train.eval_batches);
    let mut total = 0.0;
    for b in 0..n {
        let batch = sampler::eval_batch(val, cfg.model.seq_len, b, rows, n)?;
        let (x, y) = to_tensors::<B>(&batch, &model.devices()[0]);
        total += model.loss(x, y).into_scalar().elem::<f64>();
    }
    Ok(total / n as f64)
}
