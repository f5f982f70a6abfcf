//! The whole model: token embedding → n_layer × (attention, feed-forward) blocks with pre-norm
//! residuals → final RMSNorm → LM head.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Bool, FloatDType, Int, Tensor};
use lab_config::{LmHeadLoss, ModelConfig, Precision};
use lab_ops::{cast_to, AttentionFn, FusedLayers, FusedOps, FusedProjection, FusedSwiglu};

use crate::attention::{Attend, Attention, LayerCache};
use crate::init;
use crate::layers::{is_linear_weight, Linear, RmsNorm, Rope};
use crate::weights::replace_params;

/// SwiGLU: `down(silu(gate(x)) ⊙ up(x))`, gate and up computed as one product ([`FeedForward::gate_up`]).
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    pub gate: Linear<B>,
    pub up: Linear<B>,
    pub down: Linear<B>,
}

impl<B: Backend> FeedForward<B> {
    fn new(cfg: &ModelConfig, seed: u64, path: &str, device: &B::Device) -> Self {
        let (d, ff, std) = (cfg.d_model, cfg.d_ff, cfg.init_std);
        Self {
            gate: Linear::new(seed, &format!("{path}.gate"), d, ff, std, device),
            up: Linear::new(seed, &format!("{path}.up"), d, ff, std, device),
            // Writes into the residual stream: depth-scaled when the config asks.
            down: Linear::new(
                seed,
                &format!("{path}.down"),
                ff,
                d,
                cfg.init_std_residual(),
                device,
            ),
        }
    }
}

impl<B: FusedSwiglu + FusedProjection> FeedForward<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.down.forward(swiglu(self.gate_up(x)))
    }

    /// `x: [n, d]` → `[x·W_gate | x·W_up]`, `[n, 2·d_ff]`: both projections as one product
    /// with the weights side by side (`lab_ops::project_joined`), in `x`'s dtype. In backward
    /// `dx` is one product where two were summed. The parameters, checkpoints and exports keep
    /// `gate` and `up` apart.
    pub fn gate_up(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let dtype = x.dtype().into();
        let weights = vec![self.gate.weight_as(dtype), self.up.weight_as(dtype)];
        lab_ops::project_joined(x, weights)
    }
}

/// SwiGLU's gating, between the projections: `silu(gate) ⊙ up` of `[gate | up]` (lab-ops'
/// one-node op: its backward keeps only its input and returns one gradient for both halves).
pub use lab_ops::swiglu;

/// One pre-norm residual block: `x += attn(norm(x)); x += ffn(norm(x))`.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub attn_norm: RmsNorm<B>,
    pub attn: Attention<B>,
    pub ffn_norm: RmsNorm<B>,
    pub ffn: FeedForward<B>,
}

impl<B: FusedLayers> Block<B> {
    fn forward_cached(
        &self,
        x: Tensor<B, 2>,
        batch: usize,
        rope: &Rope<B>,
        future: &Tensor<B, 2, Bool>,
        cache: &mut LayerCache<B>,
    ) -> Tensor<B, 2> {
        let x = x.clone()
            + self
                .attn
                .forward_cached(self.attn_norm.forward(x), batch, rope, future, cache);
        x.clone() + self.ffn.forward(self.ffn_norm.forward(x))
    }

    /// The residual stream `x` stays in its own dtype (fp32); norms compute in it too and
    /// hand their output to attention and the feed-forward in `compute` (bf16 under mixed
    /// precision), whose results are widened back before the residual add.
    fn forward(
        &self,
        x: Tensor<B, 2>,
        batch: usize,
        rope: &Rope<B>,
        how: &Attend<B>,
        compute: FloatDType,
    ) -> Tensor<B, 2> {
        let residual: FloatDType = x.dtype().into();
        let h = self.attn_norm.forward_to(x.clone(), compute);
        let x = x + cast_to(self.attn.forward(h, batch, rope, how), residual);
        let h = self.ffn_norm.forward_to(x.clone(), compute);
        x + cast_to(self.ffn.forward(h), residual)
    }
}

#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    /// `[vocab, d_model]`.
    pub embed: Param<Tensor<B, 2>>,
    pub blocks: Vec<Block<B>>,
    pub norm: RmsNorm<B>,
    /// `[d_model, vocab]`; `None` when tied to the embedding.
    pub lm_head: Option<Linear<B>>,
    seq_len: usize,
    head_dim: usize,
    rope_base: f64,
    /// Query heads per key/value head.
    group: usize,
    /// The plain LM-head loss instead of the fused one (`train.lm_head_loss = "unfused"`).
    unfused_loss: bool,
    /// The dtype matmuls and activations compute in: bf16 over fp32 weights under
    /// `train.precision = "bf16"`, else f32.
    #[module(skip)]
    compute: FloatDType,
}

impl<B: Backend> Llama<B> {
    /// A freshly initialized model: normal(0, init_std) matrices, unit norm gains, drawn from
    /// the seed on the host (identical on every backend).
    pub fn new(cfg: &ModelConfig, seed: u64, device: &B::Device) -> Self {
        let (v, d, std) = (cfg.vocab_size, cfg.d_model, cfg.init_std);
        let blocks = (0..cfg.n_layer)
            .map(|i| {
                let path = format!("blocks.{i}");
                Block {
                    attn_norm: RmsNorm::new(d, cfg.norm_eps, device),
                    attn: Attention::new(cfg, seed, &format!("{path}.attn"), device),
                    ffn_norm: RmsNorm::new(d, cfg.norm_eps, device),
                    ffn: FeedForward::new(cfg, seed, &format!("{path}.ffn"), device),
                }
            })
            .collect();
        Self {
            embed: init::normal(seed, "embed", [v, d], std, device),
            blocks,
            norm: RmsNorm::new(d, cfg.norm_eps, device),
            lm_head: (!cfg.tie_embeddings).then(|| Linear::new(seed, "lm_head", d, v, std, device)),
            seq_len: cfg.seq_len,
            head_dim: cfg.head_dim(),
            rope_base: cfg.rope_base,
            group: cfg.group_size(),
            unfused_loss: false,
            compute: FloatDType::F32,
        }
    }

    /// Chooses how [`Llama::loss`] computes the LM-head cross-entropy.
    pub fn with_lm_head_loss(mut self, kind: LmHeadLoss) -> Self {
        self.unfused_loss = kind == LmHeadLoss::Unfused;
        self
    }

    /// Sets the precision the forward computes in. bf16 is mixed precision as PyTorch's
    /// autocast does it: the parameters (and so the optimizer and checkpoints) stay fp32;
    /// matmuls, attention and the feed-forward run in bf16 on bf16 copies of the weights;
    /// the residual stream, RMSNorm, softmax and the loss stay fp32.
    pub fn with_precision(self, precision: Precision) -> Self {
        self.with_compute_dtype(compute_dtype(precision))
    }

    /// Sets the dtype matmuls and activations compute in, as [`Llama::with_precision`] does
    /// for its precision. f16 stands in for bf16 where a device has no bf16 (lavapipe): the
    /// same casts and the same bytes kept, so the memory tests count bf16 with it.
    pub fn with_compute_dtype(mut self, dtype: FloatDType) -> Self {
        self.compute = dtype;
        self
    }

    /// The dtype matmuls and activations compute in.
    pub fn compute_dtype(&self) -> FloatDType {
        self.compute
    }

    /// The model one training step runs: its fp32 linear weights cast to the compute dtype
    /// once, as new leaves with the same ids (and the same wish for a gradient), so each
    /// micro-batch's forward does not cast every linear weight again. The leaves' gradients come
    /// in the compute dtype; widened to fp32 before micro-batches are summed, they are what the
    /// cast's backward returned, bit for bit. Linear weights already in the compute dtype
    /// (ZeRO-1's bf16 copies) become new leaves of the same values; other parameters, and
    /// every parameter of an fp32 model, are this model's own tensors.
    pub fn step_copy(&self) -> Self {
        // Weights not drawn yet are drawn here, in this model: a copy would draw its own, and
        // this model would draw them again when the optimizer reads them.
        self.visit(&mut DrawWeights);
        let (copy, dtype) = (self.clone(), self.compute);
        if dtype == FloatDType::F32 {
            return copy;
        }
        let linear = |_, path: &str| is_linear_weight(path);
        replace_params(copy, linear, |_, w| Ok(cast_to(w, dtype))).expect("a cast cannot fail")
    }

    /// How attention runs over `t` tokens: the fused `kernel` where there is one, else the
    /// tensor ops with a causal mask built once and shared by every layer.
    pub fn attend_path(
        &self,
        t: usize,
        kernel: Option<AttentionFn<B>>,
        device: &B::Device,
    ) -> Attend<B> {
        match kernel {
            Some(kernel) => Attend::Fused(kernel),
            None => Attend::Decomposed(crate::attention::causal_mask::<B>(t, self.group, device)),
        }
    }

    /// Logits of final hidden states `[N, d_model]`, in their dtype (a head held as a bf16
    /// copy, under ZeRO-1 in bf16, is widened to them).
    fn head(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        let dtype = hidden.dtype().into();
        hidden.matmul(cast_to(self.head_weight(), dtype))
    }

    /// The LM head as a `[d_model, vocab]` matrix (the transposed embedding when tied).
    pub fn head_weight(&self) -> Tensor<B, 2> {
        match &self.lm_head {
            Some(head) => head.weight.val(),
            None => self.embed.val().transpose(),
        }
    }

    /// A cache for decoding up to `tokens` tokens (prompt and new ones): one [`LayerCache`] per
    /// block, with room for `tokens` rounded up to a power of two (at most `seq_len`), and the
    /// RoPE tables of every position. The rounding keeps the kinds of shapes, and so the
    /// kernels a GPU compiles, to a few, while the buffers stay within twice what is used.
    pub fn new_cache(&self, tokens: usize) -> KvCache<B> {
        let device = self.embed.val().device();
        // Clamped before rounding: a count past 2⁶³ has no power of two in a usize.
        let capacity = tokens
            .min(self.seq_len)
            .next_power_of_two()
            .min(self.seq_len);
        KvCache {
            layers: (0..self.blocks.len())
                .map(|_| LayerCache::with_capacity(capacity))
                .collect(),
            rope: Rope::new(self.seq_len, self.head_dim, self.rope_base, &device),
        }
    }

    /// The longest sequence the model takes.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}

/// Draws every lazily made weight (a resume loads them instead, so none is drawn early).
struct DrawWeights;

impl<B: Backend> ModuleVisitor<B> for DrawWeights {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
        p.val();
    }
}

/// The forward passes: the embedding, RoPE and SwiGLU's gating are lab-ops' ops.
impl<B: FusedLayers> Llama<B> {
    /// `tokens: [B, T]` → their embeddings as `[B·T, d_model]` rows.
    pub fn embed_tokens(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, t] = tokens.dims();
        let x = lab_ops::embedding(self.embed.val(), tokens);
        let d = x.dims()[2];
        x.reshape([batch * t, d])
    }

    /// Final hidden states, `tokens: [B, T]` → `[B·T, d_model]` (after the final norm), with
    /// the tensor-op attention.
    pub fn hidden(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        self.hidden_with(tokens, None)
    }

    /// [`Llama::hidden`] through a fused attention kernel where one is given.
    pub fn hidden_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        kernel: Option<AttentionFn<B>>,
    ) -> Tensor<B, 2> {
        let [batch, t] = tokens.dims();
        assert!(
            t <= self.seq_len,
            "sequence of {t} tokens exceeds seq_len {}",
            self.seq_len
        );
        let device = tokens.device();
        // Position tables, built once per forward and shared by every layer.
        let compute = self.compute_dtype();
        let rope = Rope::new(t, self.head_dim, self.rope_base, &device).cast(compute);
        let how = self.attend_path(t, kernel, &device);
        let mut x = self.embed_tokens(tokens);
        for block in &self.blocks {
            x = block.forward(x, batch, &rope, &how, compute);
        }
        self.norm.forward(x)
    }

    /// Logits `[B, T, vocab]` of `tokens` that follow what `cache` holds, writing their keys
    /// and values into it: incremental decoding, positions and causal mask offset by the cache,
    /// the cache's positions not yet filled masked too.
    pub fn forward_cached(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 3> {
        let [batch, t] = tokens.dims();
        let (offset, capacity) = (cache.len(), cache.capacity());
        assert!(
            offset + t <= capacity,
            "{} tokens exceed the cache's {capacity} (seq_len {})",
            offset + t,
            self.seq_len
        );
        let device = tokens.device();
        let future =
            crate::attention::causal_mask_after::<B>(t, offset, capacity, self.group, &device);
        let mut x = self.embed_tokens(tokens);
        for (block, layer) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = block.forward_cached(x, batch, &cache.rope, &future, layer);
        }
        let logits = self.head(self.norm.forward(x));
        let v = logits.dims()[1];
        logits.reshape([batch, t, v])
    }

    /// Next-token logits, `[B, T, vocab]`.
    pub fn logits(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, t] = tokens.dims();
        let logits = self.head(self.hidden(tokens));
        let v = logits.dims()[1];
        logits.reshape([batch, t, v])
    }
}

/// The dtype a precision computes matmuls and activations in (weights stay fp32).
pub fn compute_dtype(precision: Precision) -> FloatDType {
    match precision {
        Precision::Fp32 => FloatDType::F32,
        Precision::Bf16 => FloatDType::BF16,
    }
}

/// Keys and values of the tokens decoded so far, per layer.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    pub layers: Vec<LayerCache<B>>,
    rope: Rope<B>,
}

impl<B: Backend> KvCache<B> {
    /// Tokens the cache has room for (every layer has the same).
    pub fn capacity(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::capacity)
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The loss needs a backend with lab-ops' fused ops: the LM-head cross-entropy, and the
/// fused attention where the backend has a kernel for it (the GPUs; the CPU keeps the
/// tensor-op attention).
impl<B: FusedOps> Llama<B> {
    /// Per-token cross-entropy `[B, T]` for evaluation, through the same attention and fused
    /// log-sum-exp as [`Llama::loss`] (no `[B·T, V]` logits kept): its mean is the loss.
    pub fn token_losses(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
    ) -> Tensor<B, 2> {
        let [batch, t] = targets.dims();
        let hidden = self.hidden_with(tokens, lab_ops::fused_attention_fn::<B>());
        let head = cast_to(self.head_weight(), hidden.dtype().into());
        lab_ops::lm_head_token_losses(hidden, head, targets.reshape([batch * t]))
            .reshape([batch, t])
    }

    /// Mean next-token cross-entropy over all `B·T` positions.
    pub fn loss(&self, tokens: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let n = targets.dims()[0] * targets.dims()[1];
        let hidden = self.hidden_with(tokens, lab_ops::fused_attention_fn::<B>());
        self.head_loss(hidden, targets.reshape([n]))
    }

    /// The LM head's mean cross-entropy: final hidden states `[N, d_model]` (fp32) against
    /// `targets: [N]`, computed in the compute dtype.
    pub fn head_loss(&self, hidden: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let kind = if self.unfused_loss {
            LmHeadLoss::Unfused
        } else {
            LmHeadLoss::Fused
        };
        let compute = self.compute_dtype();
        crate::loss::lm_head_loss(
            cast_to(hidden, compute),
            cast_to(self.head_weight(), compute),
            targets,
            kind,
        )
    }
}
