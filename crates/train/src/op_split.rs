//! `lab bench --split`: where a training step's time goes, by op class.
//!
//! Each class runs alone at the step's shapes, forward and backward through the model's own
//! code (block 0's weights; random inputs that require gradients), synced after every run,
//! and its time per run is multiplied by how often one step runs it. The optimizer (gradient
//! norm and AdamW) is timed inside the bench's phased steps (a sync ending each phase), and
//! the split is set against those steps. What the measured step holds beyond the classes is
//! `other`: residual adds, dtype casts, head reshapes, v's copy out of the joined q|k|v
//! product and its gradient's add back, gradient accumulation, the batches' upload, and the
//! launches a lazy backend saves by fusing across the classes' borders
//! (which can make it negative). PyTorch's profiler would split by kernel; burn has no such hook, so this is
//! the split by the model's own pieces.

use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, ElementConversion, FloatDType, Int, Tensor};
use lab_config::LabConfig;
use lab_model::Llama;
use serde::Serialize;

use crate::backend::TrainBackend;

/// The pieces a step's time is split into (serialized as [`OpClass::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    /// The projections of a block (q, k and v as one product, o, gate and up as one product,
    /// down).
    Projections,
    /// Attention between the projections: scores, mask, softmax and weighted values, or
    /// the fused kernel.
    Attention,
    Rope,
    RmsNorm,
    Swiglu,
    Embedding,
    /// The LM head's matmul and the cross-entropy (fused or not, as the run's config says).
    LmHeadLoss,
}

impl OpClass {
    pub const ALL: [OpClass; 7] = [
        Self::Projections,
        Self::Attention,
        Self::Rope,
        Self::RmsNorm,
        Self::Swiglu,
        Self::Embedding,
        Self::LmHeadLoss,
    ];

    /// The class as reports name it (the same in text and JSON).
    pub fn name(self) -> &'static str {
        match self {
            Self::Projections => "projections",
            Self::Attention => "attention",
            Self::Rope => "rope",
            Self::RmsNorm => "rms_norm",
            Self::Swiglu => "swiglu",
            Self::Embedding => "embedding",
            Self::LmHeadLoss => "lm_head_loss",
        }
    }

    /// How many times one step of `cfg` runs this class (each run a forward and a backward
    /// over one micro-batch).
    pub fn runs_per_step(self, cfg: &LabConfig) -> usize {
        let layers = cfg.model.n_layer;
        let per_micro_batch = match self {
            Self::Projections | Self::Attention | Self::Rope | Self::Swiglu => layers,
            Self::RmsNorm => 2 * layers + 1,
            Self::Embedding | Self::LmHeadLoss => 1,
        };
        per_micro_batch * cfg.train.grad_accum
    }

    /// Training FLOPs of one run as the MFU formula counts them (6 per matmul parameter and
    /// token, 12 · T · d_attn per token and layer for attention); 0 for the classes it does
    /// not count.
    pub fn flops_per_run(self, cfg: &LabConfig) -> f64 {
        let m = &cfg.model;
        let tokens = (cfg.train.micro_batch * m.seq_len) as f64;
        let p = m.param_count();
        match self {
            Self::Projections => 6.0 * tokens * (p.attention + p.ffn) as f64 / m.n_layer as f64,
            Self::Attention => 12.0 * tokens * (m.seq_len * m.d_attn()) as f64,
            Self::LmHeadLoss => 6.0 * tokens * (m.d_model * m.vocab_size) as f64,
            _ => 0.0,
        }
    }
}

/// One name for text and JSON reports.
impl Serialize for OpClass {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// One class's share of a step.
#[derive(Debug, Clone, Serialize)]
pub struct ClassTime {
    pub class: OpClass,
    pub runs_per_step: usize,
    pub ms_per_run: f64,
    pub ms_per_step: f64,
    /// Of the measured step.
    pub share: f64,
    /// Achieved training FLOP/s (in units of 10¹²), for the classes the MFU formula counts.
    pub tflops: Option<f64>,
}

/// A step's time by op class.
#[derive(Debug, Clone, Serialize)]
pub struct OpSplit {
    pub classes: Vec<ClassTime>,
    pub optimizer_ms: f64,
    /// The measured step less the classes and the optimizer.
    pub other_ms: f64,
    pub step_ms: f64,
}

impl OpSplit {
    /// The split of a measured step of `step_ms` (its optimizer part `optimizer_ms`) given
    /// each class's time per run.
    pub fn new(
        cfg: &LabConfig,
        per_run_ms: &[(OpClass, f64)],
        optimizer_ms: f64,
        step_ms: f64,
    ) -> Self {
        let classes: Vec<ClassTime> = per_run_ms
            .iter()
            .map(|&(class, ms)| {
                let runs = class.runs_per_step(cfg);
                let flops = class.flops_per_run(cfg);
                ClassTime {
                    class,
                    runs_per_step: runs,
                    ms_per_run: ms,
                    ms_per_step: ms * runs as f64,
                    share: ms * runs as f64 / step_ms,
                    tflops: (flops > 0.0).then(|| flops / (ms / 1e3) / 1e12),
                }
            })
            .collect();
        let classes_ms: f64 = classes.iter().map(|c| c.ms_per_step).sum();
        Self {
            classes,
            optimizer_ms,
            other_ms: step_ms - classes_ms - optimizer_ms,
            step_ms,
        }
    }
}

/// The gradients of one run, held until the sync (a lazy backend may skip work whose result
/// nobody holds).
type Grads<B> = Vec<<B as AutodiffBackend>::Gradients>;

/// How much gradient (Σ|g|) reached one input of a run.
type Reached<'a, B> = Box<dyn Fn(&Grads<B>) -> f64 + 'a>;

/// One class at the step's shapes: `run` is a forward and a backward; `inputs` tell how much
/// gradient reached each input of the run (for tests: the proof that backward is timed too;
/// the bench never calls them).
pub struct Probe<'a, B: TrainBackend> {
    pub class: OpClass,
    pub run: Box<dyn Fn() -> Grads<B> + 'a>,
    pub inputs: Vec<Reached<'a, B>>,
}

/// Milliseconds per run of `probe`: one untimed run (kernel selection, caches), then `reps`.
pub fn time<B: TrainBackend>(probe: &Probe<B>, reps: usize, device: &B::Device) -> f64 {
    let once = || {
        let grads = (probe.run)();
        B::sync(device).ok();
        drop(grads);
    };
    once();
    let t0 = Instant::now();
    for _ in 0..reps.max(1) {
        once();
    }
    t0.elapsed().as_secs_f64() * 1e3 / reps.max(1) as f64
}

/// A random input of `shape` in `dtype` that requires a gradient.
fn input<B: TrainBackend, const D: usize>(
    shape: [usize; D],
    dtype: FloatDType,
    device: &B::Device,
) -> Tensor<B, D> {
    let x = Tensor::<B, D>::random(shape, Distribution::Normal(0.0, 1.0), device);
    lab_ops::cast_to(x, dtype).require_grad()
}

/// Σ|gradient| of `x` over a run's gradients (0 when none reached it).
fn reached<'a, B: TrainBackend, const D: usize>(x: Tensor<B, D>) -> Reached<'a, B> {
    Box::new(move |grads| {
        grads
            .iter()
            .filter_map(|g| x.grad(g))
            .map(|g| {
                let g = lab_ops::cast_to(g, FloatDType::F32);
                g.abs().sum().into_scalar().elem::<f64>()
            })
            .sum()
    })
}

/// The step's shapes and compute dtype, as every probe needs them.
struct Shapes<'d, B: TrainBackend> {
    cfg: &'d lab_config::ModelConfig,
    /// Sequences and tokens per sequence of one micro-batch, and their product.
    batch: usize,
    t: usize,
    rows: usize,
    compute: FloatDType,
    device: &'d B::Device,
}

impl<B: TrainBackend> Shapes<'_, B> {
    fn input<const D: usize>(&self, shape: [usize; D]) -> Tensor<B, D> {
        input(shape, self.compute, self.device)
    }

    /// Queries or keys/values of `heads` heads, `[B, heads, T, hd]`.
    fn heads(&self, heads: usize) -> Tensor<B, 4> {
        self.input([self.batch, heads, self.t, self.cfg.head_dim()])
    }
}

/// Every class's probe over `model` (built for `cfg`), in [`OpClass::ALL`]'s order, with
/// `tokens` and `targets` one micro-batch of token ids.
pub fn probes<'a, B: TrainBackend>(
    model: &'a Llama<B>,
    cfg: &LabConfig,
    tokens: Tensor<B, 2, Int>,
    targets: Tensor<B, 1, Int>,
    device: &B::Device,
) -> Vec<Probe<'a, B>> {
    let (batch, t) = (cfg.train.micro_batch, cfg.model.seq_len);
    let s = Shapes {
        cfg: &cfg.model,
        batch,
        t,
        rows: batch * t,
        compute: model.compute_dtype(),
        device,
    };
    let (q, k) = (s.heads(cfg.model.n_head), s.heads(cfg.model.n_kv_head));
    vec![
        projections(model, &s),
        attention(model, &s, q, k),
        rope(model, &s),
        rms_norm(model, &s),
        swiglu(&s),
        embedding(model, tokens),
        lm_head_loss(model, &s, targets),
    ]
}

/// Block 0's projections, each on its own input: the attention's q, k and v side by side as
/// one product, then its output; the feed-forward's gate and up as one product, then its down.
fn projections<'a, B: TrainBackend>(model: &'a Llama<B>, s: &Shapes<B>) -> Probe<'a, B> {
    let (block, m) = (&model.blocks[0], s.cfg);
    let (attn, ffn) = (&block.attn, &block.ffn);
    type Product<'a, B> = Box<dyn Fn(Tensor<B, 2>) -> Tensor<B, 2> + 'a>;
    let linear =
        |l: &'a lab_model::layers::Linear<B>| -> Product<'a, B> { Box::new(move |x| l.forward(x)) };
    let products: [(Product<'a, B>, usize); 4] = [
        (Box::new(move |x| attn.qkv(x)), m.d_model),
        (linear(&attn.wo), m.d_attn()),
        (Box::new(move |x| ffn.gate_up(x)), m.d_model),
        (linear(&ffn.down), m.d_ff),
    ];
    let xs: Vec<Tensor<B, 2>> = products
        .iter()
        .map(|&(_, k)| s.input([s.rows, k]))
        .collect();
    let mut inputs: Vec<_> = xs.iter().map(|x| reached(x.clone())).collect();
    let weights = [
        &attn.wq, &attn.wk, &attn.wv, &attn.wo, &ffn.gate, &ffn.up, &ffn.down,
    ];
    inputs.extend(weights.iter().map(|l| reached(l.weight.val())));
    Probe {
        class: OpClass::Projections,
        run: Box::new(move || {
            let each = products.iter().zip(&xs);
            each.map(|((product, _), x)| product(x.clone()).backward())
                .collect()
        }),
        inputs,
    }
}

/// Attention between the projections, the way training runs it on this backend.
fn attention<'a, B: TrainBackend>(
    model: &'a Llama<B>,
    s: &Shapes<B>,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
) -> Probe<'a, B> {
    let v = s.heads(s.cfg.n_kv_head);
    let how = model.attend_path(s.t, lab_ops::fused_attention_fn::<B>(), s.device);
    Probe {
        class: OpClass::Attention,
        inputs: vec![reached(q.clone()), reached(k.clone()), reached(v.clone())],
        run: Box::new(move || {
            let attn = &model.blocks[0].attn;
            vec![attn
                .attend_heads(q.clone(), k.clone(), v.clone(), &how)
                .backward()]
        }),
    }
}

/// RoPE on the queries and the keys, read out of the joined q|k|v product as training reads
/// them (`Rope::apply_heads`): its backward adds into the product's gradient.
fn rope<'a, B: TrainBackend>(model: &'a Llama<B>, s: &Shapes<B>) -> Probe<'a, B> {
    let (m, t, batch) = (s.cfg, s.t, s.batch);
    let rope = lab_model::layers::Rope::new(t, m.head_dim(), m.rope_base, s.device).cast(s.compute);
    let y = s.input([s.rows, m.d_attn() + 2 * m.n_kv_head * m.head_dim()]);
    let attn = &model.blocks[0].attn;
    Probe {
        class: OpClass::Rope,
        inputs: vec![reached(y.clone())],
        // One backward for both, as training's: the product's gradient is zeroed once.
        run: Box::new(move || {
            let rotated = |group| rope.apply_heads(y.clone(), attn.head_columns(group, batch), 0);
            vec![(rotated(0).sum() + rotated(1).sum()).backward()]
        }),
    }
}

/// One RMSNorm over the fp32 residual stream, its output in the compute dtype, as a block's.
fn rms_norm<'a, B: TrainBackend>(model: &'a Llama<B>, s: &Shapes<B>) -> Probe<'a, B> {
    let norm = &model.blocks[0].attn_norm;
    let x = input([s.rows, s.cfg.d_model], FloatDType::F32, s.device);
    let compute = s.compute;
    Probe {
        class: OpClass::RmsNorm,
        inputs: vec![reached(x.clone()), reached(norm.weight.val())],
        run: Box::new(move || vec![norm.forward_to(x.clone(), compute).backward()]),
    }
}

/// SwiGLU's gating between the projections, of the gate and up projections side by side.
fn swiglu<'a, B: TrainBackend>(s: &Shapes<B>) -> Probe<'a, B> {
    let gate_up: Tensor<B, 2> = s.input([s.rows, 2 * s.cfg.d_ff]);
    Probe {
        class: OpClass::Swiglu,
        inputs: vec![reached(gate_up.clone())],
        run: Box::new(move || vec![lab_model::transformer::swiglu(gate_up.clone()).backward()]),
    }
}

fn embedding<B: TrainBackend>(model: &Llama<B>, tokens: Tensor<B, 2, Int>) -> Probe<'_, B> {
    Probe {
        class: OpClass::Embedding,
        inputs: vec![reached(model.embed.val())],
        run: Box::new(move || vec![model.embed_tokens(tokens.clone()).backward()]),
    }
}

/// The LM head and the loss, fused or not as the config says.
fn lm_head_loss<'a, B: TrainBackend>(
    model: &'a Llama<B>,
    s: &Shapes<B>,
    targets: Tensor<B, 1, Int>,
) -> Probe<'a, B> {
    let hidden = input([s.rows, s.cfg.d_model], FloatDType::F32, s.device);
    let head = match &model.lm_head {
        Some(head) => head.weight.val(),
        // Tied: the gradient lands on the embedding (the leaf the head is made from).
        None => model.embed.val(),
    };
    Probe {
        class: OpClass::LmHeadLoss,
        inputs: vec![reached(hidden.clone()), reached(head)],
        run: Box::new(move || vec![model.head_loss(hidden.clone(), targets.clone()).backward()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lab_config::{LabConfig, Precision};

    fn config(name: &str) -> LabConfig {
        let path = format!("{}/../../configs/{name}", env!("CARGO_MANIFEST_DIR"));
        LabConfig::load(std::path::Path::new(&path)).unwrap()
    }

    /// The classes' FLOPs add up to what MFU counts for a step: no matmul or attention
    /// FLOP is left out of the split, none counted twice.
    #[test]
    fn the_classes_flops_are_the_steps_flops() {
        for name in ["tiny-cpu.toml", "x1-50m-a100.toml", "med-7b-256xa100.toml"] {
            let cfg = config(name);
            let split: f64 = OpClass::ALL
                .iter()
                .map(|c| c.flops_per_run(&cfg) * c.runs_per_step(&cfg) as f64)
                .sum();
            let step = cfg.model.train_flops_per_token() * cfg.tokens_per_replica_step() as f64;
            assert!(
                (split / step - 1.0).abs() < 1e-12,
                "{name}: {split} vs {step}"
            );
        }
    }

    #[test]
    fn other_is_the_step_less_the_classes_and_the_optimizer() {
        let cfg = config("tiny-cpu.toml");
        let per_run: Vec<_> = OpClass::ALL.iter().map(|&c| (c, 1.0)).collect();
        let split = OpSplit::new(&cfg, &per_run, 5.0, 200.0);
        let l = cfg.model.n_layer;
        let a = cfg.train.grad_accum;
        // Four per-layer classes, 2L + 1 norms, the embedding and the loss, once per micro-batch.
        let runs = (4 * l + 2 * l + 1 + 2) * a;
        assert_eq!(split.other_ms, 200.0 - runs as f64 - 5.0);
        let norm = &split.classes[3];
        assert_eq!(norm.runs_per_step, (2 * l + 1) * a);
        assert_eq!(norm.share, (2 * l + 1) as f64 * a as f64 / 200.0);
        assert!(norm.tflops.is_none() && split.classes[0].tflops.is_some());
    }

    /// Every probe's backward reaches every input it names (so the timed run is a forward
    /// and a backward), with finite gradients, in fp32 and bf16.
    #[test]
    fn every_probe_runs_forward_and_backward() {
        type B = crate::backend::Cpu;
        let device = Default::default();
        for precision in [Precision::Fp32, Precision::Bf16] {
            let mut cfg = config("tiny-cpu.toml");
            cfg.train.micro_batch = 2;
            cfg.model.seq_len = 16;
            cfg.train.precision = precision;
            let model = crate::state::TrainingState::<B>::fresh(&cfg, &device).model;
            let ids = |k: usize| {
                let v: Vec<i32> = (0..32).map(|i| ((i * 7919 + k) % 1000) as i32).collect();
                burn::tensor::TensorData::new(v, [2, 16])
            };
            let tokens = Tensor::<B, 2, Int>::from_data(ids(0), &device);
            let targets = Tensor::<B, 2, Int>::from_data(ids(1), &device).reshape([32]);
            let probes = probes(&model, &cfg, tokens, targets, &device);
            let classes: Vec<_> = probes.iter().map(|p| p.class).collect();
            assert_eq!(classes, OpClass::ALL);
            for p in &probes {
                let grads = (p.run)();
                for (i, reached) in p.inputs.iter().enumerate() {
                    let g = reached(&grads);
                    assert!(
                        g.is_finite() && g > 0.0,
                        "{precision:?} {:?} input {i}: Σ|grad| = {g}",
                        p.class
                    );
                }
            }
        }
    }
}
