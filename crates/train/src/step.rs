//! One training step's forward and backward, shared by the trainer and `lab bench` (so the
//! bench times exactly what training runs), and the one MFU formula.

use std::time::Instant;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, FloatDType, Int, Tensor, TensorData};
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
    // In bf16, the linear weights cast once for all micro-batches; `add_widened` widens
    // their gradients back to fp32. The copy goes with the last backward, before the last
    // sum is made.
    let mut copy = Some(model.step_copy());
    let mut total = GradientsParams::new();
    let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
    for (i, batch) in micro.iter().enumerate() {
        let step_model = copy
            .as_ref()
            .expect("the copy lives until the last backward");
        let (x, y) = to_tensors::<B>(batch, device);
        let t0 = Instant::now();
        let loss = step_model.loss(x, y);
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
        let grads = GradientsParams::from_grads((loss / n).backward(), step_model);
        if i + 1 == micro.len() {
            copy = None;
        }
        add_widened(model, grads, &mut total);
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
    (total, loss / n)
}

/// Adds one micro-batch's gradients to `total`, each widened to fp32 first where it is not
/// (the step's bf16 casts of the linear weights, ZeRO-1's bf16 copies of the weights other
/// ranks update), as the cast in front of an fp32 master widens it: the micro-batches add up
/// in fp32 either way. Each parameter's widening and addition are issued together, so a
/// fusing backend can run them as one kernel.
fn add_widened<B: TrainBackend>(
    model: &Llama<B>,
    mut grads: GradientsParams,
    total: &mut GradientsParams,
) {
    struct V<'a>(&'a mut GradientsParams, &'a mut GradientsParams);
    impl<B: AutodiffBackend> ModuleVisitor<B> for V<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let Some(g) = self.0.remove::<B::InnerBackend, D>(p.id) else {
                return;
            };
            let g = lab_ops::cast_to(g, FloatDType::F32);
            let sum = match self.1.remove::<B::InnerBackend, D>(p.id) {
                Some(sum) => sum + g,
                None => g,
            };
            self.1.register(p.id, sum);
        }
    }
    model.visit(&mut V(&mut grads, total));
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

#[cfg(test)]
mod tests {
    use burn::module::ParamId;
    use burn::optim::GradientsAccumulator;
    use burn::tensor::DType;

    use super::*;

    type B = burn::backend::Autodiff<burn::backend::Flex>;

    /// A tiny bf16 model, untied so the LM head is a linear weight too.
    fn model() -> Llama<B> {
        let cfg = LabConfig::from_toml(
            "name='t'\n[model]\nvocab_size=40\nn_layer=2\nd_model=16\nn_head=4\nn_kv_head=2\nd_ff=32\nseq_len=6\n\
             [train]\nmicro_batch=2\ntotal_steps=4\nwarmup_steps=0\npeak_lr=1e-2\nmin_lr=1e-3\nprecision='bf16'\n",
        )
        .unwrap();
        assert!(!cfg.model.tie_embeddings);
        Llama::new(&cfg.model, 3, &Default::default()).with_precision(cfg.train.precision)
    }

    fn batches() -> Vec<Batch> {
        (0..3u32)
            .map(|k| Batch {
                inputs: (0..12).map(|i| (i * 7 + k * 5) % 40).collect(),
                targets: (0..12).map(|i| (i * 11 + k * 3 + 1) % 40).collect(),
                rows: 2,
                seq_len: 6,
            })
            .collect()
    }

    /// Each parameter's id, dtype and whether it wants a gradient, by path.
    fn params(model: &Llama<B>) -> Vec<(String, ParamId, DType, bool)> {
        struct V(
            lab_model::weights::PathStack,
            Vec<(String, ParamId, DType, bool)>,
        );
        impl ModuleVisitor<B> for V {
            fn enter_module(&mut self, name: &str, _: &str) {
                self.0.enter(name);
            }
            fn exit_module(&mut self, _: &str, _: &str) {
                self.0.exit();
            }
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                let t = p.val();
                self.1
                    .push((self.0.path(), p.id, t.dtype(), t.is_require_grad()));
            }
        }
        let mut v = V(Default::default(), Vec::new());
        model.visit(&mut v);
        v.1
    }

    /// The step's copy holds the linear weights (q, k, v, o, the feed-forward's and the LM
    /// head's) in bf16 as leaves with their ids; the embedding and the norm gains stay fp32.
    #[test]
    fn a_steps_copy_casts_the_linear_weights_and_nothing_else() {
        let model = model();
        let before = params(&model);
        let after = params(&model.step_copy());
        assert_eq!(before.len(), after.len());
        let mut cast = 0;
        for ((path, id, dtype, grad), (path2, id2, dtype2, grad2)) in before.iter().zip(&after) {
            assert_eq!((path, id, dtype, grad), (path2, id2, &DType::F32, grad2));
            let linear = lab_model::layers::is_linear_weight(path);
            assert_eq!(
                *dtype2,
                if linear { DType::BF16 } else { DType::F32 },
                "{path}"
            );
            assert!(grad2, "{path} must stay a leaf that wants a gradient");
            cast += linear as usize;
        }
        assert_eq!(cast, 2 * 7 + 1, "7 linear weights a layer and the LM head");
        assert_eq!(params(&model), before, "the model itself is left as it was");
    }

    /// A fresh model's weights are drawn lazily; the copy has them drawn in the model, which
    /// the optimizer then reads, not in the copy alone (the model would draw them again).
    #[test]
    fn a_fresh_models_weights_are_drawn_in_the_model_itself() {
        struct Drawn(Vec<bool>);
        impl ModuleVisitor<B> for Drawn {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                self.0.push(p.is_initialized());
            }
        }
        let drawn = |m: &Llama<B>| {
            let mut v = Drawn(Vec::new());
            m.visit(&mut v);
            v.0
        };
        let model = model();
        assert!(drawn(&model).contains(&false), "init draws lazily");
        let _copy = model.step_copy();
        assert!(drawn(&model).iter().all(|&d| d));
    }

    /// What the step summed before the copy: each micro-batch's forward casting every fp32
    /// weight at its use, the cast's backward returning fp32 gradients.
    fn cast_at_each_use(model: &Llama<B>, micro: &[Batch]) -> (GradientsParams, f64) {
        let (n, device) = (micro.len() as f64, Default::default());
        let mut accum = GradientsAccumulator::<Llama<B>>::new();
        let mut losses = Vec::new();
        for batch in micro {
            let (x, y) = to_tensors::<B>(batch, &device);
            let l = model.loss(x, y);
            losses.push(l.clone().inner());
            let grads = (l / n).backward();
            accum.accumulate(model, GradientsParams::from_grads(grads, model));
        }
        // Summed as `forward_backward` sums them: in the backend, in order.
        let sum = losses.into_iter().reduce(|a, b| a + b).unwrap();
        (accum.grads(), sum.into_scalar().elem::<f64>() / n)
    }

    /// Casting once a step sums the same bits as casting at each use: the same bf16 weights
    /// go into every product, and the same bf16 gradients come back widened to fp32.
    #[test]
    fn casting_once_a_step_sums_the_bits_of_casting_at_each_use() {
        let (model, micro) = (model(), batches());
        let device = Default::default();
        let (mut got, got_loss) = forward_backward(&model, &micro, &device, None);
        let (mut want, want_loss) = cast_at_each_use(&model, &micro);
        assert_eq!(got_loss.to_bits(), want_loss.to_bits());
        struct Same<'a>(&'a mut GradientsParams, &'a mut GradientsParams, usize);
        impl ModuleVisitor<B> for Same<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                type Inner = <B as burn::tensor::backend::AutodiffBackend>::InnerBackend;
                let (a, b) = (
                    self.0.remove::<Inner, D>(p.id).expect("a gradient"),
                    self.1.remove::<Inner, D>(p.id).expect("a gradient"),
                );
                assert_eq!(a.dtype(), DType::F32);
                let bits = |t: Tensor<Inner, D>| -> Vec<u32> {
                    t.into_data()
                        .to_vec::<f32>()
                        .unwrap()
                        .iter()
                        .map(|x| x.to_bits())
                        .collect()
                };
                assert_eq!(bits(a), bits(b), "parameter {}", self.2);
                self.2 += 1;
            }
        }
        let mut same = Same(&mut got, &mut want, 0);
        model.visit(&mut same);
        assert_eq!(same.2, 2 * 9 + 3, "every parameter compared");
    }
}
