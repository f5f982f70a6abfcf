//! Data parallelism over the [`lab_dist::Collectives`] seam.
//!
//! The global sample order is the single-process order: every rank draws the step's
//! `grad_accum × dp` micro-batches and computes on its own consecutive slice of them, so `W`
//! ranks accumulating `a` each equal one process accumulating `W·a`. Gradients are averaged
//! (all-reduce; with ZeRO-1 a reduce-scatter hands each rank only the parameters whose
//! optimizer state it owns, and an all-gather returns the updated weights). The loss, the
//! gradient norm and every stop decision are the same on every rank: rank 0 decides, the
//! others follow, and a signal on any rank stops them all (as torchtitan all-reduces its
//! finite flag). With one rank every method is the identity and costs nothing.
//!
//! ZeRO-1 in bf16 shards the fp32 master weights too: a rank keeps fp32 masters only of the
//! parameters it updates; the linear weights another rank updates it holds as bf16 copies,
//! which is all the forward reads of them (see [`lab_model::layers::is_linear_weight`]).
//! Their gradients come back bf16 and are widened to fp32 before they are accumulated
//! ([`crate::step`]), so the losses, gradients and weights equal plain data parallelism's (rank
//! 0's weight norm and evaluations read its copies). The owners all-gather their updated
//! linear weights as bf16, the form the others hold them in.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{backend::Backend, DType, FloatDType, Tensor, TensorData};
use lab_config::{LabConfig, Precision};
use lab_data::Batch;
use lab_dist::{Collectives, Engine, Launch, Reduce, Shards, Single, Timeout};
use lab_model::weights::{replace_params, PathStack};
use lab_model::Llama;
use lab_run::hardware::Cluster;

use crate::backend::TrainBackend;
use crate::policy::{Decision, Stop};

pub struct DataParallel {
    coll: Box<dyn Collectives>,
    launch: Launch,
    /// Micro-batches this rank computes per step.
    local_accum: usize,
    /// ZeRO-1: each rank keeps the optimizer state of its share of the parameters.
    zero1: bool,
    /// All-reduce bucket size, elements.
    bucket: usize,
    /// ZeRO-1: the rank that keeps each parameter's optimizer state, by path (see
    /// [`DataParallel::learn_layout`]).
    owner: BTreeMap<String, usize>,
    /// ZeRO-1: where each parameter sits in the flat buffers (see [`DataParallel::learn_layout`]).
    shards: Option<Shards>,
    /// ZeRO-1 in bf16: which parameters (visit order) are linear weights, held as bf16 copies
    /// by every rank but their owner.
    linear: Vec<bool>,
    /// ZeRO-1: where each parameter sits in the all-gather of updated weights, in f32 words
    /// (a linear weight's bf16 copy packs two values to a word under ZeRO-1 in bf16).
    gathered: Option<Shards>,
    /// Seconds spent moving gradients and weights since [`DataParallel::take_comm_s`].
    comm_s: Cell<f64>,
    /// Each rank's host, in rank order (hardware.json's cluster spec).
    rank_hosts: Vec<String>,
}

impl DataParallel {
    /// One process: nothing to share.
    pub fn single(cfg: &LabConfig) -> Self {
        Self {
            coll: Box::new(Single),
            launch: Launch::alone(),
            local_accum: cfg.global_micro_batches(),
            zero1: false,
            bucket: usize::MAX,
            owner: BTreeMap::new(),
            shards: None,
            linear: Vec::new(),
            gathered: None,
            comm_s: Cell::new(0.0),
            rank_hosts: vec![lab_run::hardware::hostname()],
        }
    }

    /// Joins the job `launch` describes with the engine `[parallel]` names.
    pub fn connect(cfg: &LabConfig, launch: Launch) -> Result<Self> {
        let p = cfg.parallel();
        if p.tp > 1 || p.pp > 1 || p.zero > 1 {
            bail!(
                "[parallel] tp = {}, pp = {}, zero = {}: the trainer runs data parallelism with ZeRO 0 or 1; tensor/pipeline parallelism and ZeRO 2-3 are for `lab plan` only",
                p.tp, p.pp, p.zero
            );
        }
        let local_accum = p.local_accum(cfg.train.grad_accum, launch.world)?;
        if launch.world == 1 {
            return Ok(Self {
                launch,
                ..Self::single(cfg)
            });
        }
        let engine: Engine = p.engine.parse()?;
        let timeout = Timeout(std::time::Duration::from_secs_f64(p.timeout_s));
        let coll = lab_dist::connect(&launch, engine, timeout)?;
        let mut dp = Self {
            coll,
            launch,
            local_accum,
            zero1: p.zero == 1,
            bucket: (p.bucket_mb * 1024.0 * 1024.0 / 4.0) as usize,
            owner: BTreeMap::new(),
            shards: None,
            linear: Vec::new(),
            gathered: None,
            comm_s: Cell::new(0.0),
            rank_hosts: Vec::new(),
        };
        let hosts = dp.gather_bytes(lab_run::hardware::hostname().into_bytes());
        let hosts = hosts.inspect_err(|_| dp.abandon())?;
        dp.rank_hosts = hosts
            .into_iter()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect();
        Ok(dp)
    }

    /// The job this process is part of, as hardware.json records it.
    pub fn cluster(&self) -> Cluster {
        let nodes: BTreeSet<&String> = self.rank_hosts.iter().collect();
        Cluster {
            world_size: self.world(),
            nodes: nodes.len(),
            rank_hosts: self.rank_hosts.clone(),
            launcher: self.launch.launcher.name().to_string(),
            engine: self.engine().to_string(),
            zero: self.zero1() as u8,
            grad_accum_per_rank: self.local_accum,
        }
    }

    /// ZeRO-1: deals `model`'s parameters out to the ranks, balanced by size. The deal is a
    /// function of the parameters' paths and sizes only, so a checkpoint's shards can be
    /// re-dealt to any world size. In bf16 the other ranks' linear weights are bf16 copies.
    pub fn learn_layout<B: Backend, M: Module<B>>(&mut self, model: &M, precision: Precision) {
        if !self.zero1() {
            return;
        }
        let mut params: Vec<(String, usize)> = slots(model)
            .into_iter()
            .map(|s| (s.path.clone(), s.numel()))
            .collect();
        params.sort();
        let sizes: Vec<usize> = params.iter().map(|(_, n)| *n).collect();
        let owners = lab_dist::balance(&sizes, self.world());
        self.owner = params.into_iter().map(|(p, _)| p).zip(owners).collect();
        // The flat layout of every step, in visit order (it never changes).
        let slots = slots(model);
        let sizes: Vec<usize> = slots.iter().map(Slot::numel).collect();
        let owner = slots.iter().map(|s| self.owner[&s.path]).collect();
        self.shards = Some(Shards::from_owner(&sizes, owner, self.world()));
        self.linear = slots
            .iter()
            .map(|s| precision == Precision::Bf16 && lab_model::layers::is_linear_weight(&s.path))
            .collect();
        let words: Vec<usize> = (sizes.iter().zip(&self.linear))
            .map(|(&n, &bf16)| if bf16 { n.div_ceil(2) } else { n })
            .collect();
        let owner = self.shards().owner.clone();
        self.gathered = Some(Shards::from_owner(&words, owner, self.world()));
    }

    /// Whether `rank` holds parameter `i` (visit order) as a bf16 copy, not an fp32 master.
    fn bf16_copy(&self, i: usize, rank: usize) -> bool {
        self.zero1() && self.linear.get(i) == Some(&true) && self.shards().owner[i] != rank
    }

    /// ZeRO-1 in bf16, once the model is built or loaded: the linear weights other ranks
    /// update become bf16 copies; this rank keeps fp32 masters of its own share only.
    pub fn keep_own_masters<B: TrainBackend>(&self, model: Llama<B>) -> Llama<B> {
        if !self.linear.contains(&true) {
            return model;
        }
        let me = self.rank();
        let to_bf16 = |_, master: Tensor<B, 1>| Ok(master.cast(FloatDType::BF16));
        replace_params(model, |i, _| self.bf16_copy(i, me), to_bf16).expect("a cast cannot fail")
    }

    /// Each rank's bytes of model weights, in rank order (the `data_parallel` event: ZeRO-1
    /// in bf16 holds fewer).
    pub fn weight_bytes<B: Backend, M: Module<B>>(&self, model: &M) -> Result<Vec<u64>> {
        struct V(u64);
        impl<B: Backend> ModuleVisitor<B> for V {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                let t = p.val();
                self.0 += (t.shape().num_elements() * t.dtype().size()) as u64;
            }
        }
        let mut v = V(0);
        model.visit(&mut v);
        Ok(self
            .gather_f64(v.0 as f64)?
            .into_iter()
            .map(|b| b as u64)
            .collect())
    }

    /// ZeRO-1: the payload of each step's all-gather of updated weights, in bytes (every
    /// rank's block, its own included; NCCL pads each block to the largest).
    pub fn gathered_bytes(&self) -> Option<u64> {
        let g = self.gathered.as_ref().filter(|_| self.zero1())?;
        Some(4 * g.counts.iter().sum::<usize>() as u64)
    }

    /// ZeRO-1 in bf16, writing a checkpoint: rank 0's model with every fp32 master in it,
    /// sent one parameter at a time by the rank that keeps it (`None` on the other ranks,
    /// which take part). While it writes, rank 0 holds every fp32 master beside its bf16
    /// copies (about 1.5× its training weights; no gradients or activations are alive then).
    /// The seam has no point-to-point send, so each master is broadcast and the other ranks
    /// drop it.
    pub fn masters_on_leader<B: Backend>(&self, model: Llama<B>) -> Result<Option<Llama<B>>> {
        let (owner, me) = (&self.shards().owner, self.rank());
        let from_owner = |i: usize, held: Tensor<B, 1>| {
            let mut values = match me == owner[i] {
                true => host(held.clone().into_data()),
                false => vec![0.0; held.dims()[0]],
            };
            self.coll.broadcast(&mut values, owner[i])?;
            Ok(match me {
                0 => Tensor::from_data(TensorData::new(values, held.dims()), &held.device()),
                _ => held,
            })
        };
        let model = replace_params(model, |i, _| self.bf16_copy(i, 0), from_owner)
            .context("gathering the fp32 master weights for a checkpoint")?;
        Ok(self.is_leader().then_some(model))
    }

    /// Whether this rank keeps the optimizer tensor `name` (`m.<path>` or `v.<path>`).
    pub fn keeps_moment(&self, name: &str) -> bool {
        if !self.zero1() {
            return true;
        }
        let path = name.get(2..).unwrap_or(name);
        self.owner.get(path) == Some(&self.rank())
    }

    /// Drops the update counts of parameters another rank keeps (ZeRO-1).
    pub fn keep_own_counts(&self, state: &mut crate::checkpoint::TrainState) {
        if self.zero1() {
            state
                .param_updates
                .retain(|p, _| self.owner.get(p) == Some(&self.rank()));
        }
    }

    pub fn rank(&self) -> usize {
        self.coll.rank()
    }
    pub fn world(&self) -> usize {
        self.coll.world()
    }
    /// Rank 0 writes the run folder and talks to the budget guard.
    pub fn is_leader(&self) -> bool {
        self.rank() == 0
    }
    pub fn zero1(&self) -> bool {
        self.zero1 && self.world() > 1
    }
    pub fn launch(&self) -> &Launch {
        &self.launch
    }
    pub fn engine(&self) -> &'static str {
        self.coll.engine()
    }
    pub fn collectives(&self) -> &dyn Collectives {
        self.coll.as_ref()
    }

    /// This rank's micro-batches of the step.
    pub fn local<'a>(&self, micro: &'a [Batch]) -> &'a [Batch] {
        let a = self.local_accum;
        &micro[self.rank() * a..(self.rank() + 1) * a]
    }

    /// Averages the ranks' gradients and losses. With ZeRO-1 the gradients returned are this
    /// rank's parameters' only.
    pub fn reduce<B: TrainBackend>(
        &self,
        model: &Llama<B>,
        grads: GradientsParams,
        loss: f64,
    ) -> Result<(GradientsParams, f64)> {
        if self.world() == 1 {
            return Ok((grads, loss));
        }
        let started = Instant::now();
        let out = self.reduce_across(model, grads, loss);
        self.comm_s
            .set(self.comm_s.get() + started.elapsed().as_secs_f64());
        out
    }

    fn reduce_across<B: TrainBackend>(
        &self,
        model: &Llama<B>,
        mut grads: GradientsParams,
        loss: f64,
    ) -> Result<(GradientsParams, f64)> {
        let inner = model.valid();
        let loss = self.gather_f64(loss)?.iter().sum::<f64>() / self.world() as f64;
        let local = take_grads(&inner, &mut grads);
        let grads = if self.zero1() {
            self.reduce_scatter_grads(&inner, local)?
        } else {
            self.all_reduce_grads(&inner, local)?
        };
        Ok((grads, loss))
    }

    /// Plain data parallelism: every rank gets the whole mean gradient, bucket by bucket.
    fn all_reduce_grads<B: Backend, M: Module<B>>(
        &self,
        model: &M,
        local: Vec<Vec<f32>>,
    ) -> Result<GradientsParams> {
        let sizes: Vec<usize> = local.iter().map(Vec::len).collect();
        let mut flat: Vec<f32> = local.concat();
        let buckets = lab_dist::buckets(&sizes, self.bucket);
        lab_dist::all_reduce_bucketed(self.collectives(), &mut flat, &buckets, Reduce::Avg)?;
        Ok(put_grads(model, &flat, &back_to_back(&sizes), |_| true))
    }

    /// ZeRO-1: each rank gets the mean gradient of the parameters it keeps, and only those.
    fn reduce_scatter_grads<B: Backend, M: Module<B>>(
        &self,
        model: &M,
        local: Vec<Vec<f32>>,
    ) -> Result<GradientsParams> {
        let shards = self.shards();
        let mut flat = vec![0.0f32; shards.counts.iter().sum()];
        for (i, g) in local.iter().enumerate() {
            flat[shards.span[i].clone()].copy_from_slice(g);
        }
        let (me, at) = (self.rank(), shards.offset(self.rank()));
        let mut block = vec![0.0f32; shards.counts[me]];
        self.coll
            .reduce_scatter(&flat, &shards.counts, &mut block, Reduce::Avg)?;
        flat[at..at + block.len()].copy_from_slice(&block);
        Ok(put_grads(model, &flat, &shards.span, |i| {
            shards.owner[i] == me
        }))
    }

    /// The global gradient norm. Every rank holds the whole reduced gradient, except under
    /// ZeRO-1, where the ranks' sums of squares are added in rank order.
    pub fn grad_norm<B: TrainBackend>(
        &self,
        model: &Llama<B>,
        grads: &GradientsParams,
    ) -> Result<f64> {
        if !self.zero1() {
            return Ok(crate::optim::grad_norm(model, grads));
        }
        let mine = crate::optim::grad_norm(model, grads).powi(2);
        Ok(self.gather_f64(mine)?.iter().sum::<f64>().sqrt())
    }

    /// ZeRO-1, after the update: every rank takes the other ranks' updated parameters.
    pub fn gather_params<B: TrainBackend>(&self, model: Llama<B>) -> Result<Llama<B>> {
        if !self.zero1() {
            return Ok(model);
        }
        let started = Instant::now();
        let gathered = self.gathered.as_ref().expect("learn_layout runs first");
        let me = self.rank();
        // This rank's parameters, in visit order, which is their order in its block; the
        // linear weights as the bf16 copies the other ranks hold.
        let mine = param_values(
            &model.valid(),
            |i| gathered.owner[i] == me,
            |i| self.linear[i],
        )
        .concat();
        let mut all = vec![0.0f32; gathered.counts.iter().sum()];
        self.coll.all_gather(&mine, &gathered.counts, &mut all)?;
        // The others' parameters, as they sent them.
        let theirs = |i: usize, held: Tensor<B, 1>| {
            let (words, n, device) = (
                &all[gathered.span[i].clone()],
                held.dims()[0],
                held.device(),
            );
            Ok(match self.linear[i] {
                true => Tensor::from_data(
                    TensorData::new(unpack_bf16(words, n), [n]),
                    (&device, DType::BF16),
                ),
                false => Tensor::from_data(TensorData::new(words.to_vec(), [n]), &device),
            })
        };
        let model = replace_params(model, |i, _| gathered.owner[i] != me, theirs)?;
        self.comm_s
            .set(self.comm_s.get() + started.elapsed().as_secs_f64());
        Ok(model)
    }

    /// Seconds spent in gradient and weight collectives (host copies included) since the
    /// last call.
    pub fn take_comm_s(&self) -> f64 {
        self.comm_s.replace(0.0)
    }

    fn shards(&self) -> &Shards {
        self.shards
            .as_ref()
            .expect("learn_layout runs before the first ZeRO-1 step")
    }

    /// Every rank's per-parameter update counts, merged (under ZeRO-1 each rank counts only
    /// the parameters it keeps, and rank 0 writes state.json for all).
    pub fn all_counts(&self, mine: BTreeMap<String, u64>) -> Result<BTreeMap<String, u64>> {
        if !self.zero1() {
            return Ok(mine);
        }
        let mut all = BTreeMap::new();
        for bytes in self.gather_bytes(serde_json::to_vec(&mine)?)? {
            all.extend(serde_json::from_slice::<BTreeMap<String, u64>>(&bytes)?);
        }
        Ok(all)
    }

    /// Every rank's `mine`, in rank order (one broadcast per rank: for small records).
    fn gather_bytes(&self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let mut mine = Some(mine);
        (0..self.world())
            .map(|r| {
                let mut bytes = if r == self.rank() {
                    mine.take().unwrap_or_default()
                } else {
                    Vec::new()
                };
                self.coll.broadcast_bytes(&mut bytes, r)?;
                Ok(bytes)
            })
            .collect()
    }

    /// Rank 0's decision, taken by every rank; a signal any rank caught stops them all.
    pub fn agree(&self, local: Decision) -> Result<Decision> {
        if self.world() == 1 {
            return Ok(local);
        }
        let signal = match &local {
            Decision::Stop(Stop::Interrupted { signal }) => *signal as f64,
            _ => 0.0,
        };
        let caught = self.gather_f64(signal)?.into_iter().fold(0.0, f64::max) as i32;
        let mut bytes = serde_json::to_vec(&local)?;
        self.coll.broadcast_bytes(&mut bytes, 0)?;
        let leader: Decision = serde_json::from_slice(&bytes).context("rank 0's decision")?;
        Ok(match leader {
            Decision::Continue if caught > 0 => {
                Decision::Stop(Stop::Interrupted { signal: caught })
            }
            d => d,
        })
    }

    /// Rank 0's answer to a yes/no question (whether to checkpoint after this step).
    pub fn agree_flag(&self, leader_says: bool) -> Result<bool> {
        let mut v = [leader_says as u8 as f32];
        self.coll.broadcast(&mut v, 0)?;
        Ok(v[0] != 0.0)
    }

    pub fn barrier(&self) -> Result<()> {
        self.coll.barrier()
    }

    /// This rank is leaving on an error of its own: the launcher ends the others at once.
    pub fn abandon(&self) {
        self.coll.abandon()
    }

    /// Every rank's `x`, exactly (the bits travel; the sum is taken on the host in rank
    /// order, so every rank computes the same number).
    fn gather_f64(&self, x: f64) -> Result<Vec<f64>> {
        let bits = x.to_bits();
        let mine = [
            f32::from_bits(bits as u32),
            f32::from_bits((bits >> 32) as u32),
        ];
        let mut all = vec![0.0f32; 2 * self.world()];
        self.coll
            .all_gather(&mine, &vec![2; self.world()], &mut all)?;
        Ok(all
            .chunks(2)
            .map(|w| f64::from_bits(w[0].to_bits() as u64 | (w[1].to_bits() as u64) << 32))
            .collect())
    }
}

/// A float parameter in visit order.
struct Slot {
    path: String,
    dims: Vec<usize>,
}

impl Slot {
    fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

fn back_to_back(sizes: &[usize]) -> Vec<Range<usize>> {
    let mut at = 0;
    sizes
        .iter()
        .map(|&n| {
            at += n;
            at - n..at
        })
        .collect()
}

fn slots<B: Backend, M: Module<B>>(model: &M) -> Vec<Slot> {
    struct V(PathStack, Vec<Slot>);
    impl<B: Backend> ModuleVisitor<B> for V {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.exit();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            // The lazy shape: reading it leaves a parameter not yet drawn undrawn.
            let dims = p.lazy_shape().dims::<D>().to_vec();
            self.1.push(Slot {
                path: self.0.path(),
                dims,
            });
        }
    }
    let mut v = V(PathStack::default(), Vec::new());
    model.visit(&mut v);
    v.1
}

fn host(t: TensorData) -> Vec<f32> {
    t.convert::<f32>().into_vec::<f32>().expect("f32 data")
}

/// Each parameter's gradient in visit order, moved out of `grads` (zeros where it has none:
/// every rank then sends the same layout).
fn take_grads<B: Backend, M: Module<B>>(model: &M, grads: &mut GradientsParams) -> Vec<Vec<f32>> {
    struct V<'a>(&'a mut GradientsParams, Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for V<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let n: usize = p.val().dims().iter().product();
            let g = self.0.remove::<B, D>(p.id);
            self.1.push(
                g.map(|g| host(g.into_data()))
                    .unwrap_or_else(|| vec![0.0; n]),
            );
        }
    }
    let mut v = V(grads, Vec::new());
    model.visit(&mut v);
    v.1
}

/// Gradients of the parameters `keep` selects, read from `flat` at their `spans`.
fn put_grads<B: Backend, M: Module<B>>(
    model: &M,
    flat: &[f32],
    spans: &[Range<usize>],
    keep: impl Fn(usize) -> bool,
) -> GradientsParams {
    struct V<'a, K> {
        flat: &'a [f32],
        spans: &'a [Range<usize>],
        keep: K,
        at: usize,
        out: GradientsParams,
    }
    impl<B: Backend, K: Fn(usize) -> bool> ModuleVisitor<B> for V<'_, K> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let i = self.at;
            self.at += 1;
            if (self.keep)(i) {
                let t = p.val();
                let data = TensorData::new(self.flat[self.spans[i].clone()].to_vec(), t.dims());
                self.out
                    .register::<B, D>(p.id, Tensor::from_data(data, &t.device()));
            }
        }
    }
    let mut v = V {
        flat,
        spans,
        keep,
        at: 0,
        out: GradientsParams::new(),
    };
    model.visit(&mut v);
    v.out
}

/// The values of the parameters `keep` selects, in visit order (empty for the others); those
/// `packed` selects rounded to bf16 on the device and packed two to an f32 word.
fn param_values<B: Backend, M: Module<B>>(
    model: &M,
    keep: impl Fn(usize) -> bool,
    packed: impl Fn(usize) -> bool,
) -> Vec<Vec<f32>> {
    struct V<K, P>(K, P, Vec<Vec<f32>>);
    impl<B: Backend, K: Fn(usize) -> bool, P: Fn(usize) -> bool> ModuleVisitor<B> for V<K, P> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let i = self.2.len();
            let values = match ((self.0)(i), (self.1)(i)) {
                (false, _) => Vec::new(),
                (true, false) => host(p.val().into_data()),
                (true, true) => pack_bf16(p.val().cast(FloatDType::BF16).into_data()),
            };
            self.2.push(values);
        }
    }
    let mut v = V(keep, packed, Vec::new());
    model.visit(&mut v);
    v.2
}

/// bf16 values two to an f32 word (the first in the low half), padded with a zero: the
/// collectives move f32 words bit for bit, as [`DataParallel::gather_f64`]'s words.
fn pack_bf16(data: TensorData) -> Vec<f32> {
    let values = data.as_slice::<burn::tensor::bf16>().expect("bf16 data");
    values
        .chunks(2)
        .map(|p| {
            let hi = p.get(1).map_or(0, |x| x.to_bits());
            f32::from_bits(p[0].to_bits() as u32 | (hi as u32) << 16)
        })
        .collect()
}

/// The `n` bf16 values of [`pack_bf16`]'s words.
fn unpack_bf16(words: &[f32], n: usize) -> Vec<burn::tensor::bf16> {
    let half = |w: &f32, hi: bool| (w.to_bits() >> if hi { 16 } else { 0 }) as u16;
    words
        .iter()
        .flat_map(|w| [half(w, false), half(w, true)])
        .take(n)
        .map(burn::tensor::bf16::from_bits)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::bf16;
    use proptest::prelude::*;

    proptest! {
        /// Packed bf16 words unpack to the same bf16 bits, in order, for odd lengths too (the
        /// last word padded), whatever the bits (NaNs and infinities included).
        #[test]
        fn bf16_values_survive_packing_bit_for_bit(bits in proptest::collection::vec(any::<u16>(), 0..40)) {
            let values: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
            let n = values.len();
            let words = pack_bf16(TensorData::new(values, [n]));
            prop_assert_eq!(words.len(), n.div_ceil(2));
            let back: Vec<u16> = unpack_bf16(&words, n).iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(back, bits);
        }
    }
}
