//! Causal grouped-query self-attention.
//!
//! GQA without copying K and V: the `group = n_head / n_kv_head` query heads that share a K/V
//! head are stacked along the sequence axis, `[B, KV, group·T, hd]`, so one batched matmul per
//! K/V head computes all their scores. Query head `h` uses K/V head `h / group`.

use burn::module::Module;
use burn::tensor::{activation::softmax, backend::Backend, Bool, Tensor};

use crate::layers::{Linear, Rope};

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

    /// `x: [B·T, d]` → `[B·T, d]`; `future` is [`causal_mask`] for this `T` and group size.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        batch: usize,
        rope: &Rope<B>,
        future: &Tensor<B, 2, Bool>,
    ) -> Tensor<B, 2> {
        let (h, kv, hd) = (self.n_head, self.n_kv_head, self.head_dim);
        let n = x.dims()[0];
        let t = n / batch;
        let group = h / kv;

        // Project and split into heads: [B, heads, T, hd].
        let heads =
            |y: Tensor<B, 2>, n_heads: usize| y.reshape([batch, t, n_heads, hd]).swap_dims(1, 2);
        let q = rope.apply(heads(self.wq.forward(x.clone()), h));
        let k = rope.apply(heads(self.wk.forward(x.clone()), kv));
        let v = heads(self.wv.forward(x), kv);

        // Stack each group's query heads along the sequence: [B, KV, group·T, hd].
        let q = q.reshape([batch, kv, group * t, hd]);
        let scores = q.matmul(k.swap_dims(2, 3)) / (hd as f64).sqrt();
        let future = future
            .clone()
            .unsqueeze::<4>()
            .expand([batch, kv, group * t, t]);
        let scores = scores.mask_fill(future, f32::NEG_INFINITY);
        let probs = softmax(scores, 3);
        let out = probs.matmul(v); // [B, KV, group·T, hd]

        // Back to [B·T, h·hd], query heads in order h = kv·group + g.
        let out = out
            .reshape([batch, h, t, hd])
            .swap_dims(1, 2)
            .reshape([n, h * hd]);
        self.wo.forward(out)
    }
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
