//! Timing of whole training steps, split into forward, backward and optimizer, on real text
//! (the bundled corpus, GPT-2 tokenized in memory). Speed is measured here, never in tests.

use std::time::Instant;

use anyhow::{bail, Result};
use burn::optim::GradientsParams;
use burn::tensor::ElementConversion;
use lab_config::LabConfig;
use lab_data::Batch;
use lab_model::Llama;
use serde::Serialize;

use crate::backend::{OnBackend, TrainBackend};
use crate::optim::AdamW;
use crate::trainer::to_tensors;

pub struct BenchOptions {
    pub config: LabConfig,
    /// Timed steps (after the warm-up steps, which are not timed).
    pub steps: usize,
    pub warmup: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub config: String,
    pub tokens_per_step: usize,
    pub steps: usize,
    pub tokens_per_s: f64,
    pub ms_per_step: f64,
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    pub mfu: f64,
}

impl OnBackend for BenchOptions {
    type Output = BenchReport;
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<BenchReport> {
        bench::<B>(self, device)
    }
}

fn bench<B: TrainBackend>(opts: BenchOptions, device: B::Device) -> Result<BenchReport> {
    let cfg = &opts.config;
    let (rows, t) = (cfg.train.micro_batch, cfg.model.seq_len);
    if opts.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if cfg.model.vocab_size < lab_data::gpt2::GPT2_VOCAB {
        bail!("lab bench feeds GPT-2 tokens: model.vocab_size must be >= 50257");
    }
    // Enough real text for every window of the run.
    let text: String = lab_data::TINYSHAKESPEARE.chars().take(400_000).collect();
    let tokens = lab_data::gpt2::encoder().encode_ordinary(&text);
    if tokens.len() < 2 * (t + 1) {
        bail!(
            "model.seq_len {t} is too long for the bench's {} tokens of text",
            tokens.len()
        );
    }
    let batch_at = |i: usize| {
        let mut b = Batch {
            inputs: Vec::with_capacity(rows * t),
            targets: Vec::with_capacity(rows * t),
            rows,
            seq_len: t,
        };
        for r in 0..rows {
            let o = ((i * rows + r) * t) % (tokens.len() - t - 1);
            b.inputs.extend_from_slice(&tokens[o..o + t]);
            b.targets.extend_from_slice(&tokens[o + 1..o + t + 1]);
        }
        b
    };

    let mut model = Llama::<B>::new(&cfg.model, cfg.train.seed, &device);
    let mut optim = AdamW::<B::InnerBackend>::new(&cfg.train);
    let (mut fwd, mut bwd, mut opt) = (0.0, 0.0, 0.0);
    for i in 0..opts.warmup + opts.steps {
        let (x, y) = to_tensors::<B>(&batch_at(i), &device);
        let t0 = Instant::now();
        let loss = model.loss(x, y);
        let _: f64 = loss.clone().into_scalar().elem();
        let t1 = Instant::now();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        B::sync(&device).ok();
        let t2 = Instant::now();
        let (next, _) = optim.step(model, grads, 1e-4);
        model = next;
        B::sync(&device).ok();
        let t3 = Instant::now();
        if i >= opts.warmup {
            fwd += (t1 - t0).as_secs_f64();
            bwd += (t2 - t1).as_secs_f64();
            opt += (t3 - t2).as_secs_f64();
        }
    }
    let n = opts.steps.max(1) as f64;
    let ms_per_step = (fwd + bwd + opt) / n * 1e3;
    let tokens_per_step = rows * t;
    let tokens_per_s = tokens_per_step as f64 / (ms_per_step / 1e3);
    Ok(BenchReport {
        config: cfg.name.clone(),
        tokens_per_step,
        steps: opts.steps,
        tokens_per_s,
        ms_per_step,
        forward_ms: fwd / n * 1e3,
        backward_ms: bwd / n * 1e3,
        optimizer_ms: opt / n * 1e3,
        mfu: tokens_per_s * cfg.model.train_flops_per_token()
            / cfg.hardware.peak_flops(lab_config::Precision::Fp32),
    })
}
