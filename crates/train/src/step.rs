//! One training step's forward and backward, shared by the trainer and `lab bench` (so the
//! bench times exactly what training runs), and the one MFU formula.

use std::time::Instant;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, ElementConversion, FloatDType, Int, Tensor, TensorData};
use lab_config::LabConfig;
use lab_data::Batch;
use lab_model::Llama;

use crate::backend::TrainBackend;

/// What a step's phases are measured by, when asked (`lab bench`): seconds in the forward,
/// the backward and the optimizer (timing needs a device sync ending each), and on a GPU
/// backend the bytes of live tensors at the end of the first micro-batch's forward: the
/// weights, the optimizer's moments and the activations kept for backward (later
/// micro-batches also hold the gradients summed so far).
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseReadings {
    pub forward_s: f64,
    pub backward_s: f64,
    /// Filled by the caller, which runs the optimizer and times the whole step.
    pub optimizer_s: f64,
    pub step_s: f64,
    pub tensor_bytes_after_forward: Option<u64>,
}

impl PhaseReadings {
    /// Adds another step's times (the bytes are the pool's, read per step, not summed).
    pub fn add(&mut self, step: &PhaseReadings) {
        self.forward_s += step.forward_s;
        self.backward_s += step.backward_s;
        self.optimizer_s += step.optimizer_s;
        self.step_s += step.step_s;
    }
}

/// The gradient of the mean loss over `micro` (summed over micro-batches, each scaled by
/// 1 / micro-batches) and that mean loss. One host sync for the loss, at the end.
pub fn forward_backward<B: TrainBackend>(
    model: &Llama<B>,
    micro: &[Batch],
    device: &B::Device,
    mut readings: Option<&mut PhaseReadings>,
) -> (GradientsParams, f64) {
    let n = micro.len() as f64;
    let mut accum = GradientsAccumulator::<Llama<B>>::new();
    let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
    for (i, batch) in micro.iter().enumerate() {
        let (x, y) = to_tensors::<B>(batch, device);
        let t0 = Instant::now();
        let loss = model.loss(x, y);
        if readings.is_some() {
            B::sync(device).ok();
        }
        let t1 = Instant::now();
        if let Some(r) = readings.as_deref_mut().filter(|_| i == 0) {
            r.tensor_bytes_after_forward = B::device_bytes(device).map(|b| b.in_use);
        }
        let t2 = Instant::now(); // the reading above is neither phase's
        let value = loss.clone().inner();
        loss_sum = Some(match loss_sum {
            Some(sum) => sum + value,
            None => value,
        });
        let grads = (loss / n).backward();
        let grads = widened(model, GradientsParams::from_grads(grads, model));
        accum.accumulate(model, grads);
        if let Some(r) = readings.as_deref_mut() {
            B::sync(device).ok();
            r.forward_s += (t1 - t0).as_secs_f64();
            r.backward_s += t2.elapsed().as_secs_f64();
        }
    }
    let loss: f64 = loss_sum
        .expect("a step has at least one micro-batch")
        .into_scalar()
        .elem();
    (accum.grads(), loss / n)
}

/// The gradients of bf16 parameters (ZeRO-1's copies of the weights other ranks update)
/// widened to fp32, as the cast in front of an fp32 master widens them, so the micro-batches
/// add up in fp32 either way. Other gradients are left alone.
fn widened<B: TrainBackend>(model: &Llama<B>, mut grads: GradientsParams) -> GradientsParams {
    struct V<'a>(&'a mut GradientsParams);
    impl<B: AutodiffBackend> ModuleVisitor<B> for V<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if p.val().dtype() == DType::F32 {
                return;
            }
            if let Some(g) = self.0.remove::<B::InnerBackend, D>(p.id) {
                self.0.register(p.id, g.cast(FloatDType::F32));
            }
        }
    }
    model.visit(&mut V(&mut grads));
    grads
}

/// Token ids as `[rows, seq_len]` int tensors.
pub fn to_tensors<B: Backend>(
    batch: &Batch,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let shape = [batch.rows, batch.seq_len];
    let ids = |v: &[u32]| {
        let data: Vec<i32> = v.iter().map(|&t| t as i32).collect();
        Tensor::from_data(TensorData::new(data, shape), device)
    };
    (ids(&batch.inputs), ids(&batch.targets))
}

/// Model FLOPs utilisation at `tokens_per_s`: training FLOPs per token (LM head and attention
/// included) over the device's peak at the precision the run computes in.
pub fn mfu(cfg: &LabConfig, tokens_per_s: f64) -> f64 {
    tokens_per_s * cfg.model.train_flops_per_token() / cfg.hardware.peak_flops(cfg.train.precision)
}
