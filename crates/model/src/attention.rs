//! Causal grouped-query self-attention.
//!
//! GQA without copying K and V: the `group = n_head / n_kv_head` query heads that share a K/V
//! head are stacked along the sequence axis, `[B, KV, group·T, hd]`, so one batched matmul per
//! K/V head computes all their scores. Query head `h` uses K/V head `h / group`.

use burn::module::Module;
use burn::tensor::{activation::softmax, backend::Backend, Bool, FloatDType, Tensor};
use lab_ops::{AttentionFn, FusedHeads, FusedProjection, HeadColumns};

use crate::layers::{Linear, Rope};

/// How a forward without a KV cache turns queries, keys and values into outputs.
#[derive(Clone, Debug)]
pub enum Attend<B: Backend> {
    /// burn's tensor ops, full scores; the mask is [`causal_mask`] for this `T` and group
    /// size. Any backend; the only path on the CPU.
    Decomposed(Tensor<B, 2, Bool>),
    /// The backend's fused causal kernel (`lab_ops::fused_attention`): no `T × T` scores.
    Fused(AttentionFn<B>),
}

#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub wq: Linear<B>,
    pub wk: Linear<B>,
    pub wv: Linear<B>,
    pub wo: Linear<B>,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
}

impl<B: Backend> Attention<B> {
    pub fn new(cfg: &lab_config::ModelConfig, seed: u64, path: &str, device: &B::Device) -> Self {
        let (d, hd, std) = (cfg.d_model, cfg.head_dim(), cfg.init_std);
        let lin = |name: &str, d_in, d_out, std| {
            Linear::new(seed, &format!("{path}.{name}"), d_in, d_out, std, device)
        };
        Self {
            wq: lin("wq", d, cfg.n_head * hd, std),
            wk: lin("wk", d, cfg.n_kv_head * hd, std),
            wv: lin("wv", d, cfg.n_kv_head * hd, std),
            // Writes into the residual stream: depth-scaled when the config asks.
            wo: lin("wo", cfg.n_head * hd, d, cfg.init_std_residual()),
            n_head: cfg.n_head,
            n_kv_head: cfg.n_kv_head,
            head_dim: hd,
        }
    }
}

impl<B: FusedHeads + FusedProjection> Attention<B> {
    /// `x: [B·T, d]` → `[B·T, d]`, causal.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        batch: usize,
        rope: &Rope<B>,
        how: &Attend<B>,
    ) -> Tensor<B, 2> {
        let (q, k, v) = self.project(x, batch, rope, 0);
        self.merge_heads(self.attend_heads(q, k, v, how))
    }

    /// The attention proper, between the projections: q `[B, h, T, hd]`, k and v
    /// `[B, kv, T, hd]` (RoPE applied) → `[B, h, T, hd]`, causal, the way `how` says.
    pub fn attend_heads(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        how: &Attend<B>,
    ) -> Tensor<B, 4> {
        match how {
            Attend::Decomposed(future) => self.attend(q, k, v, future),
            Attend::Fused(kernel) => kernel(q, k, v, 1.0 / (self.head_dim as f32).sqrt()),
        }
    }

    /// As [`Attention::forward`] for tokens that follow the `cache` (decoding): their keys and
    /// values (n_kv_head heads, RoPE at their positions) are written into it first. `future` is
    /// [`causal_mask_after`] for the cache's filled length and capacity.
    pub fn forward_cached(
        &self,
        x: Tensor<B, 2>,
        batch: usize,
        rope: &Rope<B>,
        future: &Tensor<B, 2, Bool>,
        cache: &mut LayerCache<B>,
    ) -> Tensor<B, 2> {
        let offset = cache.len();
        let (q, k, v) = self.project(x, batch, rope, offset);
        let (k, v) = cache.append(k, v);
        self.merge_heads(self.attend(q, k, v, future))
    }

    /// `x: [B·T, d]` → `[x·W_q | x·W_k | x·W_v]`, `[B·T, (h + 2·kv)·hd]`: the three projections as
    /// one product with the weights side by side (`lab_ops::project_joined`), in `x`'s dtype.
    /// In backward `dx` is one product where three were summed. The parameters, checkpoints
    /// and exports keep `wq`, `wk` and `wv` apart.
    pub fn qkv(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let dtype = x.dtype().into();
        let weights = [&self.wq, &self.wk, &self.wv].map(|w| w.weight_as(dtype));
        lab_ops::project_joined(x, weights.to_vec())
    }

    /// Where q (`group` 0), k (1) and v (2) lie in [`Attention::qkv`]'s columns.
    pub fn head_columns(&self, group: usize, batch: usize) -> HeadColumns {
        let (h, kv) = (self.n_head, self.n_kv_head);
        let (first_head, heads) = [(0, h), (h, kv), (h + kv, kv)][group];
        HeadColumns {
            first: first_head * self.head_dim,
            heads,
            head_dim: self.head_dim,
            batch,
        }
    }

    /// q `[B, h, T, hd]`, k and v `[B, kv, T, hd]`, rotated for positions `offset..`: column
    /// blocks of [`Attention::qkv`] read as heads (`lab_ops::rope_heads`, `lab_ops::heads`),
    /// whose backward adds each gradient into the product's in place.
    fn project(
        &self,
        x: Tensor<B, 2>,
        batch: usize,
        rope: &Rope<B>,
        offset: usize,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let y = self.qkv(x);
        let at = |group| self.head_columns(group, batch);
        let q = rope.apply_heads(y.clone(), at(0), offset);
        let k = rope.apply_heads(y.clone(), at(1), offset);
        let v = lab_ops::heads(y, at(2));
        (q, k, v)
    }

    /// Causal attention of `q` over keys/values `k`, `v`; `future` marks the keys each stacked
    /// query row may not see. Returns `[B, h, T, hd]`.
    fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        future: &Tensor<B, 2, Bool>,
    ) -> Tensor<B, 4> {
        let (h, kv, hd) = (self.n_head, self.n_kv_head, self.head_dim);
        let [batch, _, t, _] = q.dims();
        let keys = k.dims()[2];
        let group = h / kv;
        // Stack each group's query heads along the sequence: [B, KV, group·T, hd].
        let q = q.reshape([batch, kv, group * t, hd]);
        let dtype = v.dtype().into();
        // Scores in the compute dtype, softmax in fp32 (a no-op cast in fp32 runs).
        let scores = q.matmul(k.swap_dims(2, 3));
        let scores = lab_ops::cast_to(scores, FloatDType::F32) / (hd as f64).sqrt();
        let future = future
            .clone()
            .unsqueeze::<4>()
            .expand([batch, kv, group * t, keys]);
        let scores = scores.mask_fill(future, f32::NEG_INFINITY);
        let probs = lab_ops::cast_to(softmax(scores, 3), dtype);
        // [B, KV, group·T, hd]; query heads in order h = kv·group + g.
        probs.matmul(v).reshape([batch, h, t, hd])
    }

    /// `[B, h, T, hd]` → `[B·T, h·hd]`, then the output projection.
    fn merge_heads(&self, out: Tensor<B, 4>) -> Tensor<B, 2> {
        let [batch, h, t, hd] = out.dims();
        self.wo
            .forward(out.swap_dims(1, 2).reshape([batch * t, h * hd]))
    }
}

/// One layer's cached keys and values, `[B, n_kv_head, capacity, head_dim]` each, the first
/// `len` positions filled: GQA caches the shared key/value heads only, not one per query head.
///
/// The buffers have the capacity a decoding call asks for from its first token on, and
/// attention reads all of them, masking the positions not yet filled ([`causal_mask_after`]).
/// So every decoding step of a call has the same shapes: a GPU backend compiles its kernels
/// once, where a cache that grew by a token a step had new shapes, and new kernels to
/// compile, at every step.
#[derive(Debug, Clone)]
pub struct LayerCache<B: Backend> {
    k: Option<Tensor<B, 4>>,
    v: Option<Tensor<B, 4>>,
    len: usize,
    capacity: usize,
}

impl<B: Backend> LayerCache<B> {
    /// An empty cache for up to `capacity` positions.
    pub fn with_capacity(capacity: usize) -> Self {
        LayerCache {
            k: None,
            v: None,
            len: 0,
            capacity,
        }
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The keys' buffer, `[B, n_kv_head, capacity, head_dim]`, once a token is in.
    pub fn keys(&self) -> Option<&Tensor<B, 4>> {
        self.k.as_ref()
    }

    /// Tokens the buffers have room for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes new keys and values after the filled positions and returns the whole buffers
    /// (the caller, [`crate::Llama::forward_cached`], has checked that they fit).
    fn append(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [batch, heads, t, hd] = k.dims();
        let (start, end) = (self.len, self.len + t);
        // Zeros, not uninitialised memory: a masked position's weight is exactly 0, and 0
        // times a zero value keeps a NaN out of the output.
        let shape = [batch, heads, self.capacity, hd];
        let write = |buffer: Option<Tensor<B, 4>>, new: Tensor<B, 4>| {
            let buffer =
                buffer.unwrap_or_else(|| Tensor::zeros(shape, (&new.device(), new.dtype())));
            buffer.slice_assign([0..batch, 0..heads, start..end, 0..hd], new)
        };
        let k = write(self.k.take(), k);
        let v = write(self.v.take(), v);
        self.k = Some(k.clone());
        self.v = Some(v.clone());
        self.len = end;
        (k, v)
    }
}

/// True where a new query may not see a key, `[group·T, keys]` in the stacked layout, for
/// a cache of `keys` positions: query `i` (position `offset + i`) sees keys `0..=offset + i`,
/// and neither its future nor the cache's unfilled positions.
pub fn causal_mask_after<B: Backend>(
    t: usize,
    offset: usize,
    keys: usize,
    group: usize,
    device: &B::Device,
) -> Tensor<B, 2, Bool> {
    let mut future = Vec::with_capacity(group * t * keys);
    for _ in 0..group {
        for i in 0..t {
            future.extend((0..keys).map(|j| j > offset + i));
        }
    }
    Tensor::from_data(
        burn::tensor::TensorData::new(future, [group * t, keys]),
        device,
    )
}

/// True where a query may not see a key (the key lies in its future), `[group·T, T]` for the
/// stacked layout: row `g·T + i` is query position `i` of group member `g`. Built once per
/// forward pass and shared by every layer.
pub fn causal_mask<B: Backend>(t: usize, group: usize, device: &B::Device) -> Tensor<B, 2, Bool> {
    // tril_mask marks everything above the diagonal: exactly the future keys.
    Tensor::<B, 2, Bool>::tril_mask([t, t], 0, device)
        .unsqueeze::<3>()
        .repeat_dim(0, group)
        .reshape([group * t, t])
}
