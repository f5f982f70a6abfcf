//! AdamW with global-norm gradient clipping, written out so every step is visible, in two
//! halves so the step policies see the gradient norm before anything is applied:
//!
//! 1. [`grad_norm`]: `norm = sqrt(Σ_p ‖g_p‖²)` over all parameters (burn's
//!    `GradientClipping::Norm` clips each parameter on its own, which is not the recipe), and
//!    [`AdamW::clip_scale`]: `scale = min(1, clip / norm)`;
//! 2. [`AdamW::apply`], per parameter: `g ← scale·g`, `m ← β1·m + (1-β1)·g`, `v ← β2·v + (1-β2)·g²`,
//!    `p ← p·(1 - lr·wd) - lr · (m / (1-β1ᵗ)) / (sqrt(v / (1-β2ᵗ)) + ε)` (decoupled decay,
//!    as PyTorch's AdamW), done by the backend's [`FusedAdamW`] (one pass over memory: on the
//!    CPU with the same bits as the tensor ops, on the GPUs one kernel launch a parameter).
//!
//! Weight decay applies to matrices only (projections, embedding, LM head); the 1-D RMSNorm
//! gains are not decayed (nanoGPT's rule: decay every parameter of rank ≥ 2).
//!
//! The moments are keyed by parameter path, not by burn's `ParamId`, so a checkpoint resumes
//! them exactly (burn's ids do not survive a safetensors round trip). Each parameter counts its
//! own updates (the `t` of its bias correction), as PyTorch does: a parameter frozen for the
//! first steps (`train.freeze_non_embedding_steps`) starts its moments at `t = 1` when it thaws.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{
    backend::{AutodiffBackend, Backend},
    ops::FloatTensor,
    ElementConversion, Tensor, TensorPrimitive,
};
use lab_config::TrainConfig;
use lab_model::weights::{PathStack, PendingTensor, TensorMap};
use lab_ops::{AdamWStep, FusedAdamW, SumOfSquares};

/// First and second moments of one parameter, flattened, and the updates applied to it.
struct Moments<B: Backend> {
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    t: u64,
}

pub struct AdamW<B: Backend> {
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    grad_clip: f64,
    /// Updates applied so far (the `t` of bias correction of every parameter never frozen).
    updates: u64,
    moments: BTreeMap<String, Moments<B>>,
}

impl<B: Backend> AdamW<B> {
    pub fn new(cfg: &TrainConfig) -> Self {
        Self {
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
            grad_clip: cfg.grad_clip,
            updates: 0,
            moments: BTreeMap::new(),
        }
    }

    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The factor global-norm clipping multiplies a gradient of norm `grad_norm` by.
    pub fn clip_scale(&self, grad_norm: f64) -> f64 {
        if self.grad_clip > 0.0 && grad_norm > self.grad_clip {
            self.grad_clip / grad_norm
        } else {
            1.0
        }
    }

    /// Applies one AdamW update at `lr` to the gradient scaled by `clip_scale` (see
    /// [`AdamW::clip_scale`]). The caller has checked the loss and [`grad_norm`] are finite.
    pub fn apply<AB, M>(&mut self, model: M, grads: GradientsParams, lr: f64, clip_scale: f64) -> M
    where
        B: FusedAdamW,
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        self.updates += 1;
        let mut mapper = UpdateMapper {
            opt: self,
            grads,
            lr,
            clip_scale,
            path: PathStack::default(),
        };
        model.map(&mut mapper)
    }

    /// The moments as host tensors (`m.<path>`, `v.<path>`), read whole: what
    /// [`AdamW::pending_state`] streams into a checkpoint.
    pub fn state(&self) -> (TensorMap, u64) {
        (
            lab_model::weights::fetch_all(self.pending_state()),
            self.updates,
        )
    }

    /// The update count of each parameter whose count is not [`AdamW::updates`] (one that
    /// was frozen for a while): state.json keeps them beside the moments.
    pub fn param_updates(&self) -> BTreeMap<String, u64> {
        self.moments
            .iter()
            .filter(|(_, mo)| mo.t != self.updates)
            .map(|(path, mo)| (path.clone(), mo.t))
            .collect()
    }

    /// The moments (`m.<path>`, `v.<path>`) to be written one at a time (a checkpoint).
    pub fn pending_state(&self) -> Vec<PendingTensor<'static>> {
        let mut out = Vec::new();
        for (path, mo) in &self.moments {
            out.push(PendingTensor::of_tensor(format!("m.{path}"), mo.m.clone()));
            out.push(PendingTensor::of_tensor(format!("v.{path}"), mo.v.clone()));
        }
        out
    }

    /// Zero moments for every parameter of `model` (what the first update starts from), so a
    /// checkpoint of an untrained state has the size of a trained one (`lab bench --checkpoint`).
    pub fn zero_moments<M: Module<B>>(&mut self, model: &M, device: &B::Device) {
        for t in lab_model::weights::pending_tensors(model) {
            let zeros = || Tensor::<B, 1>::zeros([t.shape.iter().product::<usize>()], device);
            self.moments.insert(
                t.name,
                Moments {
                    m: zeros(),
                    v: zeros(),
                    t: self.updates,
                },
            );
        }
    }

    /// Restores moments written by [`AdamW::state`], with the counts of
    /// [`AdamW::param_updates`].
    pub fn load_state(
        &mut self,
        mut state: TensorMap,
        updates: u64,
        param_updates: &BTreeMap<String, u64>,
        device: &B::Device,
    ) -> Result<()> {
        let paths: Vec<String> = state
            .keys()
            .filter_map(|k| k.strip_prefix("m."))
            .map(String::from)
            .collect();
        let mut moments = BTreeMap::new();
        for path in paths {
            let m = state.remove(&format!("m.{path}")).expect("listed above");
            let Some(v) = state.remove(&format!("v.{path}")) else {
                bail!("optimizer state has m.{path} but no v.{path}");
            };
            let (m, v) = (m.into_tensor(device), v.into_tensor(device));
            let t = param_updates.get(&path).copied().unwrap_or(updates);
            moments.insert(path, Moments { m, v, t });
        }
        if !state.is_empty() {
            bail!("optimizer state holds tensors other than m.* / v.* pairs");
        }
        if let Some(p) = param_updates.keys().find(|p| !moments.contains_key(*p)) {
            bail!("state.json counts updates of {p}, which has no moments");
        }
        self.moments = moments;
        self.updates = updates;
        Ok(())
    }
}

/// What a sum of squares runs over: the weights, or their gradients.
enum Squares<'a> {
    Weights,
    Grads(&'a GradientsParams),
}

/// The tensors a norm sums the squares of: every parameter of a model (or its gradient,
/// where it has one), in visit order.
struct SumSquares<'a, B: Backend> {
    of: Squares<'a>,
    tensors: Vec<FloatTensor<B>>,
}

impl<B: Backend> ModuleVisitor<B> for SumSquares<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let x = match self.of {
            Squares::Weights => Some(param.val()),
            Squares::Grads(grads) => grads.get::<B, D>(param.id),
        };
        self.tensors.extend(x.map(|x| x.into_primitive().tensor()));
    }
}

/// `sqrt(Σ ‖x‖²)`, summed on the device by the backend's [`SumOfSquares`] (on the GPUs one
/// kernel launch a tensor and one more), with one host sync at the end.
fn l2_norm<B: SumOfSquares, M: Module<B>>(model: &M, of: Squares) -> f64 {
    let mut v = SumSquares::<B> {
        of,
        tensors: Vec::new(),
    };
    model.visit(&mut v);
    if v.tensors.is_empty() {
        return 0.0;
    }
    let total =
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::sum_of_squares(v.tensors)));
    total.into_scalar().elem::<f64>().sqrt()
}

/// Global L2 norm of the gradient, `sqrt(Σ_p ‖g_p‖²)` (before clipping).
pub fn grad_norm<AB, M>(model: &M, grads: &GradientsParams) -> f64
where
    AB: AutodiffBackend<InnerBackend: SumOfSquares>,
    M: AutodiffModule<AB>,
{
    // The inner module keeps the parameter ids the gradients are keyed by.
    l2_norm::<AB::InnerBackend, _>(&model.valid(), Squares::Grads(grads))
}

/// Global L2 norm of the weights (logged to watch weight growth). Pass the inner model.
/// Under ZeRO-1 in bf16, rank 0 reads its bf16 copies of the linear weights other ranks
/// update (a relative difference of at most 2⁻⁸ per element, far less in the norm).
pub fn param_norm<B: SumOfSquares, M: Module<B>>(model: &M) -> f64 {
    l2_norm::<B, _>(model, Squares::Weights)
}

struct UpdateMapper<'a, B: Backend> {
    opt: &'a mut AdamW<B>,
    grads: GradientsParams,
    lr: f64,
    clip_scale: f64,
    path: PathStack,
}

impl<AB, B> ModuleMapper<AB> for UpdateMapper<'_, B>
where
    AB: AutodiffBackend<InnerBackend = B>,
    B: FusedAdamW,
{
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<B, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let opt = &mut *self.opt;
        let dims = tensor.dims();
        let numel: usize = dims.iter().product();
        let decay = if D >= 2 { opt.weight_decay } else { 0.0 };

        let path = self.path.path();
        let old = opt.moments.remove(&path);
        let step = AdamWStep {
            clip_scale: self.clip_scale,
            beta1: opt.beta1,
            beta2: opt.beta2,
            eps: opt.eps,
            lr: self.lr,
            weight_decay: decay,
            t: old.as_ref().map_or(1, |mo| mo.t + 1),
        };
        let flat = |t: Tensor<B, D>| t.reshape([numel]).into_primitive().tensor();
        // The gradient keeps its shape: flattening a strided view (the feed-forward's gate
        // and up halves of one product's gradient) would copy it, where the GPU kernel reads
        // it at its strides.
        let (p, m, v) = B::adamw_update(
            flat(tensor.inner()),
            grad.into_primitive().tensor(),
            old.map(|mo| {
                (
                    mo.m.into_primitive().tensor(),
                    mo.v.into_primitive().tensor(),
                )
            }),
            &step,
        );
        let float = |x| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x));
        let (p, m, v) = (float(p), float(m), float(v));
        opt.moments.insert(path, Moments { m, v, t: step.t });

        let p = Tensor::<AB, D>::from_inner(p.reshape(dims)).require_grad();
        Param::from_mapped_value(id, p, mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::module::Module;

    #[derive(Module, Debug)]
    struct Big<B: Backend> {
        w: Param<Tensor<B, 2>>,
    }

    /// A weight of 4.5M elements (past the size Flex sums in parallel chunks): its norm has
    /// the same bits on 1 thread and on 3, and matches an fp64 host sum.
    #[test]
    fn the_norm_of_a_large_tensor_does_not_depend_on_threads() {
        let (rows, cols) = (4096, 1100);
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let exact = data
            .iter()
            .map(|&x| x as f64 * x as f64)
            .sum::<f64>()
            .sqrt();
        let w = Tensor::<Flex, 2>::from_data(
            burn::tensor::TensorData::new(data, [rows, cols]),
            &Default::default(),
        );
        let model = Big {
            w: Param::from_tensor(w),
        };
        let norm_on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| param_norm::<Flex, _>(&model))
        };
        let one = norm_on(1);
        for _ in 0..3 {
            assert_eq!(norm_on(3).to_bits(), one.to_bits());
        }
        assert!((one / exact - 1.0).abs() < 1e-6, "{one} vs {exact}");
    }

    /// On the GPU backend (lavapipe in CI), the gradient norm of a real step's gradients, as
    /// the trainer takes it (lab-ops' `SumOfSquares` through Fusion), against the fp64 norm of
    /// the same gradients read back to the host, and the weight norm likewise.
    ///
    /// Tolerance 2e-6 of the norm. Every term is positive, so each f32 rounding is relative
    /// to the sum: a unit adds at most 25 squares (the 6.4M-element embedding and LM head over 1,024 cubes
    /// of 256 units), a tree of 8 levels, then the last cube adds ~21 partials a unit and
    /// another tree of 8: under 64 roundings of 2⁻²⁴, 3.8e-6 of the sum and half that of its
    /// square root. burn's tensor-op form through Fusion, which the trainer ran before, misses
    /// by 1.3e-5 here (5.912841 against 5.912915 on lavapipe).
    #[cfg(feature = "wgpu")]
    #[test]
    fn the_gpus_norms_match_the_fp64_norms_of_the_read_back_tensors() {
        use crate::backend::Wgpu;
        use burn::module::AutodiffModule;
        use lab_config::LabConfig;
        use lab_data::Batch;

        let mut cfg = LabConfig::from_toml(include_str!("../../../configs/tiny-cpu.toml")).unwrap();
        (cfg.train.micro_batch, cfg.model.seq_len) = (2, 16);
        let device = Default::default();
        let state = crate::state::TrainingState::<Wgpu>::fresh(&cfg, &device);
        let ids = |k: u32| {
            (0..32)
                .map(|i| (i * 7919 + k) % 50257)
                .collect::<Vec<u32>>()
        };
        let batch = Batch {
            inputs: ids(1),
            targets: ids(2),
            rows: 2,
            seq_len: 16,
        };
        let (grads, _) = crate::step::forward_backward(&state.model, &[batch], &device, None);

        /// `sqrt(Σ x²)` in fp64 over the tensors a norm takes (the same visitor), read back.
        fn host_norm<B: Backend>(model: &impl Module<B>, of: Squares) -> f64 {
            let mut v = SumSquares::<B> {
                of,
                tensors: Vec::new(),
            };
            model.visit(&mut v);
            let read = |x| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x)).into_data();
            let squares = v.tensors.into_iter().flat_map(|x| {
                let data = read(x).convert::<f32>().to_vec::<f32>().unwrap();
                data.into_iter().map(|v| v as f64 * v as f64)
            });
            squares.sum::<f64>().sqrt()
        }
        let inner = state.model.valid();
        let want = host_norm(&inner, Squares::Grads(&grads));
        let got = grad_norm(&state.model, &grads);
        assert!(
            (got / want - 1.0).abs() < 2e-6,
            "gradient norm {got} vs {want}"
        );
        let (got, want) = (param_norm(&inner), host_norm(&inner, Squares::Weights));
        assert!(
            (got / want - 1.0).abs() < 2e-6,
            "weight norm {got} vs {want}"
        );
    }
}
