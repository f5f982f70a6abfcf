//! Timing of whole training steps, then of their forward, backward and optimizer, on real text
//! (the bundled corpus, GPT-2 tokenized in memory), through the trainer's own step function
//! and MFU formula. Speed is measured here, never in tests.

use std::ops::Range;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lab_config::LabConfig;
use lab_data::Batch;
use serde::Serialize;

use burn::module::AutodiffModule;

use crate::backend::{OnBackend, TrainBackend};
use crate::op_split;
use crate::optim::grad_norm;
use crate::state::TrainingState;
use crate::step::{forward_backward, mfu, PhaseReadings};

pub struct BenchOptions {
    pub config: LabConfig,
    /// Timed whole steps (after the warm-up steps, which are not timed); the phases are timed
    /// on as many steps again, after them.
    pub steps: usize,
    pub warmup: usize,
    /// Also write the token stream the steps draw from here (little-endian u32 ids).
    pub tokens_out: Option<std::path::PathBuf>,
    /// Also split the step's time by op class (`lab bench --split`).
    pub split: bool,
    pub memory: MemoryGauge,
}

/// Where the bench reads the peak memory it reports.
pub enum MemoryGauge {
    /// The process's peak resident memory over the timed steps (the kernel's high-water
    /// mark): all of it on the CPU backend; host memory only on wgpu.
    ProcessPeak,
    /// A GPU's used memory (NVML on CUDA), read after every timed step; the largest reading.
    /// burn's memory pool keeps what a step reserved, so the reading after a step holds the
    /// forward's peak.
    Gpu(Box<dyn lab_health::Probe>),
}

impl MemoryGauge {
    pub fn describe(&self) -> &'static str {
        match self {
            Self::ProcessPeak => "process peak RSS",
            Self::Gpu(_) => "GPU memory used",
        }
    }
}

/// A gauge read over the timed steps: the peak memory, and on a GPU how busy it was.
struct StepGauge {
    gauge: MemoryGauge,
    gpu_peak: u64,
    /// NVML's utilisation read after each whole timed step: (sum, readings).
    gpu_util: (f64, usize),
    /// The GPU stopped answering: the figures cover the readings before.
    gpu_lost: bool,
}

impl StepGauge {
    fn new(gauge: MemoryGauge) -> Self {
        Self {
            gauge,
            gpu_peak: 0,
            gpu_util: (0.0, 0),
            gpu_lost: false,
        }
    }

    /// Starts the window: the process's high-water mark is reset to what it holds now.
    fn start(&self) {
        memory::reset_peak();
    }

    fn after_step(&mut self) {
        let MemoryGauge::Gpu(probe) = &mut self.gauge else {
            return;
        };
        if self.gpu_lost {
            return;
        }
        match lab_health::Probe::sample(probe.as_mut()) {
            Ok(s) => {
                self.gpu_peak = self.gpu_peak.max(s.mem_used_bytes);
                self.gpu_util = (self.gpu_util.0 + s.util_pct, self.gpu_util.1 + 1);
            }
            Err(e) => {
                eprintln!("warning: reading the GPU: {e:#}; its figures cover the steps before");
                self.gpu_lost = true;
            }
        }
    }

    fn peak(&self) -> u64 {
        match self.gauge {
            MemoryGauge::ProcessPeak => memory::peak(),
            MemoryGauge::Gpu(_) => self.gpu_peak,
        }
    }

    /// The mean utilisation, where the GPU was read at all.
    fn mean_util_pct(&self) -> Option<f64> {
        let (sum, n) = self.gpu_util;
        (n > 0).then(|| sum / n as f64)
    }
}

/// What a GPU backend's memory pool reports over the timed steps ([`lab_ops::DeviceMemory`]).
#[derive(Default)]
struct PoolMemory {
    tensors: Option<u64>,
    reserved: Option<u64>,
}

impl PoolMemory {
    fn after_step<B: TrainBackend>(&mut self, step: &PhaseReadings, device: &B::Device) {
        let most = |a: Option<u64>, b: Option<u64>| a.max(b);
        self.tensors = most(self.tensors, step.tensor_bytes_after_forward);
        let reserved = B::device_bytes(device).map(|b| b.reserved);
        self.reserved = most(self.reserved, reserved);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub config: String,
    pub lm_head_loss: String,
    /// `fp32` or `bf16` (mixed precision).
    pub precision: String,
    /// What the products compute in, whose peak MFU is against: `bf16`, `fp32`, or `tf32` for
    /// an fp32 run on CUDA.
    pub products: String,
    /// `none` or `selective` activation checkpointing.
    pub activation_checkpointing: String,
    /// Tokens this process computes per step (one replica's share of a data-parallel step).
    pub tokens_per_step: usize,
    pub steps: usize,
    pub tokens_per_s: f64,
    pub ms_per_step: f64,
    /// The phases, timed on as many steps again with a sync ending each phase.
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    /// A step with those syncs, whole (its three phases and the batches' upload). It exceeds
    /// `ms_per_step` by the host time the syncs expose, which a whole step hides behind the
    /// GPU's work. (On the CPU nothing tells the two apart: a sync waits for nothing.)
    pub phased_ms_per_step: f64,
    pub mfu: f64,
    /// The FLOP/s MFU divides by (the detected device's peak for the run's products, or
    /// `hardware.peak_flops`): bench.sh puts every row of its table over this same peak.
    pub peak_flops: f64,
    /// The peak memory the gauge saw over the whole timed steps, and which gauge it was.
    pub peak_memory_bytes: u64,
    pub memory_gauge: String,
    /// On CUDA, the mean of NVML's utilisation read after each whole timed step: the share
    /// of NVML's last sample period (1/6 to 1 s) in which a kernel ran, so it covers the
    /// step's end (backward, gradient norm, optimizer) or more. Near 100 % the kernels bound
    /// the step; under it the GPU waited on the host: issuing work, or reading the loss and
    /// the gradient norm (whole steps wait for both, as training does).
    pub gpu_util_pct: Option<f64>,
    /// GPU backends, read on the phased steps (a reading needs a sync): the most bytes of live
    /// tensors at the end of a step's first forward (weights, optimizer moments, the
    /// activations kept for backward), and the most this thread's memory pool held from the
    /// device after a step (live tensors, padding and the free blocks it keeps). On CUDA, NVML's reading (`peak_memory_bytes`) adds the CUDA
    /// context, cuBLASLt's workspaces and any other stream's pool.
    pub device_tensor_bytes: Option<u64>,
    pub device_pool_bytes: Option<u64>,
    /// The step's time by op class, when asked for.
    pub split: Option<crate::op_split::OpSplit>,
    /// The loss of the last whole step (step warmup + steps): what the PyTorch
    /// reference's loss at the same step is compared with.
    pub last_loss: f64,
}

impl OnBackend for BenchOptions {
    type Output = BenchReport;
    fn checkpointing(&self) -> lab_config::ActivationCheckpointing {
        self.config.train.activation_checkpointing
    }
    fn precision(&self) -> lab_config::Precision {
        self.config.train.precision
    }
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<BenchReport> {
        bench::<B>(self, device)
    }
}

/// `grad_accum` micro-batches of real text for step `i`.
fn batches(cfg: &LabConfig, tokens: &[u32], i: usize) -> Vec<Batch> {
    let (rows, t) = (cfg.train.micro_batch, cfg.model.seq_len);
    (0..cfg.train.grad_accum)
        .map(|m| {
            let mut b = Batch {
                inputs: Vec::with_capacity(rows * t),
                targets: Vec::with_capacity(rows * t),
                rows,
                seq_len: t,
            };
            for r in 0..rows {
                let k = (i * cfg.train.grad_accum + m) * rows + r;
                let o = (k * t) % (tokens.len() - t - 1);
                b.inputs.extend_from_slice(&tokens[o..o + t]);
                b.targets.extend_from_slice(&tokens[o + 1..o + t + 1]);
            }
            b
        })
        .collect()
}

/// The token stream every bench step draws its windows from: the GPT-2 tokens of the first
/// 400,000 characters of the bundled text (`lab bench --tokens-out` writes it for the PyTorch
/// reference, which reads the same windows).
pub fn bench_tokens(cfg: &LabConfig) -> Result<Vec<u32>> {
    let t = cfg.model.seq_len;
    if cfg.model.vocab_size < lab_data::gpt2::GPT2_VOCAB {
        bail!("lab bench feeds GPT-2 tokens: model.vocab_size must be >= 50257");
    }
    let text: String = lab_data::TINYSHAKESPEARE.chars().take(400_000).collect();
    let tokens = lab_data::gpt2::encoder().encode_ordinary(&text);
    if tokens.len() < 2 * (t + 1) {
        bail!(
            "model.seq_len {t} is too long for the bench's {} tokens of text",
            tokens.len()
        );
    }
    Ok(tokens)
}

fn bench<B: TrainBackend>(opts: BenchOptions, device: B::Device) -> Result<BenchReport> {
    let cfg = &opts.config;
    if opts.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let tokens = bench_tokens(cfg)?;
    if let Some(path) = &opts.tokens_out {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        lab_fsio::write_atomic(path, &bytes)
            .with_context(|| format!("--tokens-out {}", path.display()))?;
    }

    let steps = Steps::<B> {
        cfg,
        tokens: &tokens,
        device: &device,
    };
    let mut state = TrainingState::<B>::fresh(cfg, &device);
    for i in 0..opts.warmup {
        state = steps.take(state, i, None).0;
    }
    B::sync(&device).ok();
    let mut memory = StepGauge::new(opts.memory);
    let whole = opts.warmup..opts.warmup + opts.steps;
    let (state, whole_s, last_loss) = steps.time_whole(state, whole.clone(), &mut memory);
    // Read now: the split below allocates its probes' inputs, which are not a step's.
    let peak_memory_bytes = memory.peak();
    let phased = whole.end..whole.end + opts.steps;
    let (state, phases, pool) = steps.time_phased(state, phased);

    let ms = |s: f64| s / opts.steps as f64 * 1e3;
    let (ms_per_step, phased_ms_per_step) = (ms(whole_s), ms(phases.step_s));
    let tokens_per_step = cfg.tokens_per_replica_step();
    let tokens_per_s = tokens_per_step as f64 / (ms_per_step / 1e3);
    let split = opts.split.then(|| {
        let first = &batches(cfg, &tokens, 0)[0];
        let per_run = time_classes(&state.model, cfg, first, opts.steps, &device);
        op_split::OpSplit::new(cfg, &per_run, ms(phases.optimizer_s), phased_ms_per_step)
    });
    Ok(BenchReport {
        config: cfg.name.clone(),
        lm_head_loss: cfg.train.lm_head_loss.as_str().into(),
        precision: cfg.train.precision.as_str().into(),
        products: cfg
            .hardware
            .products_in(cfg.train.precision)
            .as_str()
            .into(),
        activation_checkpointing: cfg.train.activation_checkpointing.as_str().into(),
        tokens_per_step,
        steps: opts.steps,
        tokens_per_s,
        ms_per_step,
        forward_ms: ms(phases.forward_s),
        backward_ms: ms(phases.backward_s),
        optimizer_ms: ms(phases.optimizer_s),
        phased_ms_per_step,
        mfu: mfu(cfg, tokens_per_s),
        peak_flops: cfg.hardware.peak_flops(cfg.train.precision),
        peak_memory_bytes,
        memory_gauge: memory.gauge.describe().into(),
        gpu_util_pct: memory.mean_util_pct(),
        device_tensor_bytes: pool.tensors,
        device_pool_bytes: pool.reserved,
        split,
        last_loss,
    })
}

/// What every bench step draws on: the config, the token stream and the device.
struct Steps<'a, B: TrainBackend> {
    cfg: &'a LabConfig,
    tokens: &'a [u32],
    device: &'a B::Device,
}

impl<B: TrainBackend> Steps<'_, B> {
    /// The headline: steps `range` as the trainer takes them, waiting only for the loss and
    /// the gradient norm, so the host may issue the next step while the GPU finishes this
    /// one's update; one sync ends the window. The gauge is read after each step (NVML's
    /// reads do not wait for the GPU). Returns the state, the window's seconds and the last
    /// step's loss.
    fn time_whole(
        &self,
        mut state: TrainingState<B>,
        range: Range<usize>,
        gauge: &mut StepGauge,
    ) -> (TrainingState<B>, f64, f64) {
        gauge.start();
        let (t0, mut loss) = (Instant::now(), f64::NAN);
        for i in range {
            (state, loss) = self.take(state, i, None);
            gauge.after_step();
        }
        B::sync(self.device).ok();
        (state, t0.elapsed().as_secs_f64(), loss)
    }

    /// Steps `range` again with a sync ending each phase, so each phase can be timed, and the
    /// GPU pool read after each step's first forward. A step so taken (`step_s`, its whole
    /// wall clock) is longer than a whole one by the host time the syncs expose.
    fn time_phased(
        &self,
        mut state: TrainingState<B>,
        range: Range<usize>,
    ) -> (TrainingState<B>, PhaseReadings, PoolMemory) {
        let (mut phases, mut pool) = (PhaseReadings::default(), PoolMemory::default());
        for i in range {
            let mut step = PhaseReadings::default();
            let t0 = Instant::now();
            state = self.take(state, i, Some(&mut step)).0;
            step.step_s = t0.elapsed().as_secs_f64();
            phases.add(&step);
            pool.after_step::<B>(&step, self.device);
        }
        (state, phases, pool)
    }

    /// One optimizer step on step `i`'s micro-batches, as the trainer takes it: it waits for
    /// the loss and the gradient norm, not for the update. With `phases`, a sync also ends the
    /// forward, the backward and the update, and all three are timed. Returns the new state
    /// and the step's loss.
    fn take(
        &self,
        state: TrainingState<B>,
        i: usize,
        mut phases: Option<&mut PhaseReadings>,
    ) -> (TrainingState<B>, f64) {
        let micro = batches(self.cfg, self.tokens, i);
        let (grads, loss) =
            forward_backward(&state.model, &micro, self.device, phases.as_deref_mut());
        let t0 = Instant::now();
        let norm = grad_norm(&state.model, &grads);
        let scale = state.optim.clip_scale(norm);
        let state = state.apply(grads, 1e-4, scale);
        if let Some(p) = phases {
            B::sync(self.device).ok();
            p.optimizer_s += t0.elapsed().as_secs_f64();
        }
        (state, loss)
    }
}

/// Milliseconds per run of every op class, `reps` runs each, on `batch`'s tokens.
fn time_classes<B: TrainBackend>(
    model: &lab_model::Llama<B>,
    cfg: &LabConfig,
    batch: &Batch,
    reps: usize,
    device: &B::Device,
) -> Vec<(op_split::OpClass, f64)> {
    let (ids, targets) = crate::step::to_tensors::<B>(batch, device);
    let targets = targets.reshape([batch.rows * batch.seq_len]);
    // The weights as a training step holds them (bf16 casts made once a step).
    let model = model.step_copy();
    let probes = op_split::probes(&model, cfg, ids, targets, device);
    probes
        .iter()
        .map(|p| (p.class, op_split::time(p, reps, device)))
        .collect()
}

/// `lab bench --generate N`: decoding N tokens with the KV cache against recomputing the whole
/// sequence for every token, on the config's freshly initialised model.
pub struct GenerateBench {
    pub config: LabConfig,
    pub new_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct GenerateReport {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub cached_tokens_per_s: f64,
    pub recompute_tokens_per_s: f64,
    pub speedup: f64,
    /// Greedy decoding gave the same tokens both ways.
    pub identical: bool,
}

impl OnBackend for GenerateBench {
    type Output = GenerateReport;
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<GenerateReport> {
        use lab_model::generate::{generate, generate_recompute, Sampling};
        let cfg = &self.config;
        let model = lab_model::Llama::<B::InnerBackend>::new(&cfg.model, cfg.train.seed, &device);
        let t = cfg.model.seq_len;
        let new = self.new_tokens.min(t - t / 4);
        let prompt: Vec<u32> = lab_data::gpt2::encoder()
            .encode_ordinary(&lab_data::TINYSHAKESPEARE[..4000])
            .into_iter()
            .take(t / 4)
            .collect();
        let greedy = Sampling::greedy();
        let t0 = Instant::now();
        let (cached, _) = generate(&model, &prompt, new, &greedy, None, &mut |_| {});
        let t1 = Instant::now();
        let (full, _) = generate_recompute(&model, &prompt, new, &greedy, None);
        let t2 = Instant::now();
        let rate = |d: std::time::Duration| cached.len() as f64 / d.as_secs_f64();
        Ok(GenerateReport {
            prompt_tokens: prompt.len(),
            new_tokens: cached.len(),
            cached_tokens_per_s: rate(t1 - t0),
            recompute_tokens_per_s: rate(t2 - t1),
            speedup: (t2 - t1).as_secs_f64() / (t1 - t0).as_secs_f64(),
            identical: cached == full,
        })
    }
}

/// `lab bench --checkpoint`: writing and loading a checkpoint of the config's freshly
/// initialised weights and zero AdamW moments (no training step), as the trainer does it.
pub struct CheckpointBench {
    pub config: LabConfig,
    /// The folder on the disk being measured: the checkpoint goes to a folder of its own
    /// inside it, removed afterwards.
    pub dir: std::path::PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointReport {
    /// Bytes of weights and moments (fp32).
    pub state_bytes: u64,
    /// Bytes on disk (both safetensors files and state.json).
    pub file_bytes: u64,
    pub write_s: f64,
    pub write_gb_per_s: f64,
    pub load_s: f64,
    pub load_gb_per_s: f64,
    /// Process RSS before the save and its peak during it (Linux; 0 elsewhere).
    pub rss_before_save: u64,
    pub peak_rss_save: u64,
}

impl OnBackend for CheckpointBench {
    type Output = CheckpointReport;
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<CheckpointReport> {
        use crate::checkpoint;
        let cfg = &self.config;
        let mut state = TrainingState::<B>::fresh(cfg, &device);
        state.optim.zero_moments(&state.model.valid(), &device);
        let params = cfg.model.param_count().total();
        // A folder of its own inside --ckpt-dir: nothing else there is touched.
        let dir = self
            .dir
            .join(format!(".bench-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let train_state = checkpoint::TrainState {
            step: 0,
            optimizer_updates: 0,
            param_updates: Default::default(),
            cursor: Default::default(),
            rollbacks: 0,
            policies: Default::default(),
            data_sha256: String::new(),
            stability: serde_json::Value::Null,
            seed: cfg.train.seed,
            rng: "stateless".into(),
            next_lr: cfg.train.peak_lr,
            schedule_extensions: Vec::new(),
            config_sha256: cfg.sha256(),
            training_sha256: cfg.training_sha256(),
            created_utc: String::new(),
            lab_version: env!("CARGO_PKG_VERSION").into(),
            files: Default::default(),
        };

        let rss_before_save = memory::reset_peak();
        let t0 = Instant::now();
        let written = state.save(&dir, train_state)?;
        let write_s = t0.elapsed().as_secs_f64();
        let peak_rss_save = memory::peak();
        let file_bytes = dir_bytes(&written)?;
        memory::evict_from_page_cache(&written);

        let t1 = Instant::now();
        let mut ck = checkpoint::load(&written, &checkpoint::every)?;
        let loaded = TrainingState::<B>::from_checkpoint(cfg, &mut ck, &device)?;
        let load_s = t1.elapsed().as_secs_f64();
        drop((loaded, ck));
        std::fs::remove_dir_all(&dir)?;
        Ok(CheckpointReport {
            state_bytes: params * 3 * 4,
            file_bytes,
            write_s,
            write_gb_per_s: file_bytes as f64 / write_s / 1e9,
            load_s,
            load_gb_per_s: file_bytes as f64 / load_s / 1e9,
            rss_before_save,
            peak_rss_save,
        })
    }
}

fn dir_bytes(dir: &std::path::Path) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        n += e?.metadata()?.len();
    }
    Ok(n)
}

/// The process's resident memory, from /proc (Linux).
mod memory {
    fn status_kb(field: &str) -> u64 {
        let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(field)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// Resets the peak (`VmHWM`) to the current RSS, which it returns, in bytes.
    pub fn reset_peak() -> u64 {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        status_kb("VmRSS:") * 1024
    }

    pub fn peak() -> u64 {
        status_kb("VmHWM:") * 1024
    }

    /// Drops the checkpoint's pages from the page cache (after the fsync they are clean),
    /// so the load reads the disk rather than memory.
    pub fn evict_from_page_cache(dir: &std::path::Path) {
        use std::os::fd::AsRawFd;
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if let Ok(f) = std::fs::File::open(e.path()) {
                // SAFETY: a valid open descriptor; advice only, no memory is touched.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
    }
}

/// `lab bench --matmul`: the projections' product on the model's projection shapes, in the
/// run's precision (`rows = micro_batch × seq_len` tokens times each weight), against which
/// scripts/gpu/bench.sh sets cuBLAS (through PyTorch) on the same shapes. It runs what the
/// model's projections run: the backend's matmul, or cuBLASLt with `LAB_MATMUL=cublaslt`.
pub struct MatmulBench {
    pub config: LabConfig,
    pub iters: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct MatmulShape {
    /// What multiplies by this weight (`wq`, `ffn.up`, `lm_head`, …).
    pub name: &'static str,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub ms: f64,
    pub tflops: f64,
}

impl MatmulBench {
    /// `(name, k, n)` of every distinct projection: `[rows, k] @ [k, n]`. The LM head comes
    /// twice when the vocabulary is not a multiple of 64: as the model stores it, and as the
    /// GPU loss's products see it (`lm_head/pad`, [`lab_ops::padded_vocab`]).
    pub fn shapes(cfg: &lab_config::ModelConfig) -> Vec<(&'static str, usize, usize)> {
        let (d, hd) = (cfg.d_model, cfg.head_dim());
        let mut shapes = vec![
            // The q, k and v weights side by side: one product (`lab_ops::project_joined`).
            ("attn.qkv", d, cfg.d_attn() + 2 * cfg.n_kv_head * hd),
            ("wo", cfg.d_attn(), d),
            // The gate and up weights side by side: one product (`lab_ops::project_joined`).
            ("ffn.gate_up", d, 2 * cfg.d_ff),
            ("ffn.down", cfg.d_ff, d),
            ("lm_head", d, cfg.vocab_size),
        ];
        let padded = lab_ops::padded_vocab(cfg.vocab_size);
        if padded != cfg.vocab_size {
            shapes.push(("lm_head/pad", d, padded));
        }
        shapes
    }
}

impl OnBackend for MatmulBench {
    type Output = Vec<MatmulShape>;
    fn precision(&self) -> lab_config::Precision {
        self.config.train.precision
    }
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<Vec<MatmulShape>> {
        use burn::tensor::{backend::Backend, Distribution, Tensor};
        type Inner<B> = <B as burn::tensor::backend::AutodiffBackend>::InnerBackend;
        let cfg = &self.config;
        let m = cfg.train.micro_batch * cfg.model.seq_len;
        let dtype = lab_model::compute_dtype(cfg.train.precision);
        let normal = Distribution::Normal(0.0, 1.0);
        if self.iters == 0 {
            bail!("--steps must be at least 1 (--matmul times each shape that many times)");
        }
        let iters = self.iters;
        let mut out = Vec::new();
        for (name, k, n) in Self::shapes(&cfg.model) {
            let a = Tensor::<Inner<B>, 2>::random([m, k], normal, &device).cast(dtype);
            let b = Tensor::<Inner<B>, 2>::random([k, n], normal, &device).cast(dtype);
            // The product stays alive until the sync: a lazy backend (burn's fusion) may
            // drop work whose result nobody holds. The first, untimed, selects the kernel
            // (cubecl autotunes here) and warms caches.
            let product = || {
                let c = lab_ops::project(a.clone(), b.clone());
                Inner::<B>::sync(&device).ok();
                drop(c);
            };
            product();
            let t0 = Instant::now();
            for _ in 0..iters {
                product();
            }
            let s = t0.elapsed().as_secs_f64() / iters as f64;
            let tflops = 2.0 * (m * k * n) as f64 / s / 1e12;
            out.push(MatmulShape {
                name,
                m,
                k,
                n,
                ms: s * 1e3,
                tflops,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny CPU config at `micro_batch` rows of `seq_len` tokens.
    fn tiny(micro_batch: usize, seq_len: usize) -> LabConfig {
        let mut config =
            LabConfig::from_toml(include_str!("../../../configs/tiny-cpu.toml")).unwrap();
        config.train.micro_batch = micro_batch;
        config.model.seq_len = seq_len;
        config
    }

    /// The LM head's padded line comes only when there is something to pad.
    #[test]
    fn an_aligned_vocabulary_has_no_padded_lm_head_line() {
        let x1 = LabConfig::from_toml(include_str!("../../../configs/x1-50m-a100.toml")).unwrap();
        let mut aligned = x1.model.clone();
        aligned.vocab_size = 50_304;
        let shapes = MatmulBench::shapes(&aligned);
        assert_eq!(shapes.last(), Some(&("lm_head", 768, 50_304)));
        assert_eq!(shapes.len(), 5, "nothing to pad");
    }

    /// The GPU gauge reports the largest memory reading taken after the timed steps and the
    /// mean utilisation of those readings: the three timed steps read (30, 20 %), (70, 50 %)
    /// and (50, 80 %) of a replayed NVML stream (peak 70, mean 50 %); a fourth reading would
    /// have reached 90 and lowered the mean.
    #[test]
    fn the_gpu_gauge_reports_the_peak_and_mean_busy_of_the_timed_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.jsonl");
        let line = |(used, util): (u64, u32)| {
            format!("{{\"t_s\":0,\"util_pct\":{util},\"mem_used_bytes\":{used},\"mem_total_bytes\":100,\"temp_c\":60}}\n")
        };
        let lines: String = [(30, 20), (70, 50), (50, 80), (90, 0)].map(line).concat();
        std::fs::write(&path, lines).unwrap();
        let config = tiny(1, 16);
        let probe = lab_health::replay::ReplayProbe::open(&path).unwrap();
        let opts = BenchOptions {
            config,
            steps: 3,
            warmup: 1,
            tokens_out: None,
            split: false,
            memory: MemoryGauge::Gpu(Box::new(probe)),
        };
        let r = bench::<crate::backend::Cpu>(opts, Default::default()).unwrap();
        assert_eq!(r.peak_memory_bytes, 70);
        assert_eq!(r.gpu_util_pct, Some(50.0));
        assert_eq!(r.memory_gauge, "GPU memory used");
        assert!(r.split.is_none());
    }

    /// The loss reported is the last whole step's: with one warm-up and two timed steps it is
    /// step 3's, as three steps taken directly give it, not that of the steps with a sync
    /// ending each phase, which come after. Those steps' phases are timed and fit inside them.
    #[test]
    fn the_loss_is_the_last_whole_steps_and_the_phases_are_timed_after() {
        let config = tiny(1, 16);
        let opts = BenchOptions {
            config: config.clone(),
            steps: 2,
            warmup: 1,
            tokens_out: None,
            split: false,
            memory: MemoryGauge::ProcessPeak,
        };
        let r = bench::<crate::backend::Cpu>(opts, Default::default()).unwrap();

        let (device, tokens) = (Default::default(), bench_tokens(&config).unwrap());
        let steps = Steps::<crate::backend::Cpu> {
            cfg: &config,
            tokens: &tokens,
            device: &device,
        };
        let mut state = TrainingState::fresh(&config, &device);
        let mut losses = Vec::new();
        for i in 0..5 {
            let loss;
            (state, loss) = steps.take(state, i, None);
            losses.push(loss);
        }
        assert_eq!(r.last_loss, losses[2]);
        assert_ne!(losses[2], losses[4], "a later step's loss would show");
        let phases = r.forward_ms + r.backward_ms + r.optimizer_ms;
        assert!(phases > 0.0 && r.phased_ms_per_step >= phases, "{r:?}");
    }

    /// `--matmul` times the projections' shapes (q, k and v as one, the output, gate and up as
    /// one, down, the LM head) and the LM head as the GPU loss pads it, at
    /// `micro_batch × seq_len` rows, and
    /// `--steps 0` is refused rather than quietly timing one product.
    #[test]
    fn the_matmul_bench_times_each_projection_and_refuses_zero_steps() {
        let config = tiny(2, 8);
        let run = |iters| {
            crate::BackendKind::Cpu.dispatch(MatmulBench {
                config: config.clone(),
                iters,
            })
        };
        let err = run(0).unwrap_err().to_string();
        assert!(err.starts_with("--steps must be at least 1"), "{err}");
        let shapes = run(1).unwrap();
        let names: Vec<_> = shapes.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "attn.qkv",
                "wo",
                "ffn.gate_up",
                "ffn.down",
                "lm_head",
                "lm_head/pad"
            ]
        );
        let m = &config.model;
        let [qkv, gate_up, lm_head, padded] = [&shapes[0], &shapes[2], &shapes[4], &shapes[5]];
        let kv = m.n_kv_head * m.head_dim();
        assert_eq!((qkv.k, qkv.n), (m.d_model, m.d_attn() + 2 * kv));
        assert_eq!((gate_up.k, gate_up.n), (m.d_model, 2 * m.d_ff));
        assert_eq!(
            (lm_head.m, lm_head.k, lm_head.n),
            (16, m.d_model, m.vocab_size)
        );
        // GPT-2's 50,257 words as the GPU loss's products see them.
        assert_eq!((padded.k, padded.n), (m.d_model, 50_304));
        assert!(shapes.iter().all(|s| s.m == 16 && s.tflops.is_finite()));
    }
}
