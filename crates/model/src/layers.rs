//! The small building blocks: a bias-free linear map, RMSNorm and rotary position embedding.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, FloatDType, Tensor, TensorData};

use lab_ops::{FusedHeads, FusedProjection, FusedRmsNorm, HeadColumns};

use crate::init;

/// `y = x · W` with `W: [d_in, d_out]` and no bias (Llama has none).
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Linear<B> {
    pub fn new(
        seed: u64,
        path: &str,
        d_in: usize,
        d_out: usize,
        std: f64,
        device: &B::Device,
    ) -> Self {
        Self {
            weight: init::normal(seed, &format!("{path}.weight"), [d_in, d_out], std, device),
        }
    }

    /// The weight in `dtype`: cast where it is another (evaluation's fp32 masters; training
    /// casts them once a step instead, in `Llama::step_copy`).
    pub fn weight_as(&self, dtype: FloatDType) -> Tensor<B, 2> {
        lab_ops::cast_to(self.weight.val(), dtype)
    }
}

impl<B: FusedProjection> Linear<B> {
    /// `x: [n, d_in]` → `[n, d_out]`, computed in `x`'s dtype ([`Linear::weight_as`]). The
    /// product is lab-ops' projection op: burn's matmul unless `LAB_MATMUL` sends it to a GPU's
    /// vendor BLAS.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let weight = self.weight_as(x.dtype().into());
        lab_ops::project(x, weight)
    }
}

/// Whether the parameter at `path` (as [`crate::weights`] names it) is a [`Linear`]'s weight.
/// Training's forward reads each once, through one cast to the compute dtype, so under mixed
/// precision a bf16 copy of it computes the same forward and receives the same gradient as
/// its fp32 master (evaluation casts the head to the hidden states' dtype):
/// ZeRO-1 keeps fp32 masters only of the weights a rank updates. The embedding (a gather, and
/// the tied head) and the RMSNorm gains are not linear weights.
pub fn is_linear_weight(path: &str) -> bool {
    const LINEARS: [&str; 7] = ["wq", "wk", "wv", "wo", "gate", "up", "down"];
    let Some(module) = path.strip_suffix(".weight") else {
        return false;
    };
    let name = module.rsplit('.').next().unwrap_or(module);
    module == "lm_head" || (module.starts_with("blocks.") && LINEARS.contains(&name))
}

/// Root-mean-square normalization with a learned gain (no mean subtraction, no bias).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    pub fn new(d: usize, eps: f64, device: &B::Device) -> Self {
        Self {
            weight: init::ones(d, device),
            eps,
        }
    }
}

impl<B: FusedRmsNorm> RmsNorm<B> {
    /// `x: [n, d]` → `x / sqrt(mean(x²) + eps) · g`, one autodiff node (`lab_ops::rms_norm`).
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        lab_ops::rms_norm(x, self.weight.val(), self.eps)
    }

    /// [`RmsNorm::forward`] stored as `dtype` (the compute dtype the projections read): the
    /// cast after the norm as part of the one node (`lab_ops::rms_norm_to`).
    pub fn forward_to(&self, x: Tensor<B, 2>, dtype: FloatDType) -> Tensor<B, 2> {
        lab_ops::rms_norm_to(x, self.weight.val(), self.eps, dtype)
    }
}

/// Rotary position embedding tables, `[seq_len, head_dim]` each, in the "rotate half"
/// convention of Hugging Face's Llama (so exported weights need no permutation).
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    pub cos: Tensor<B, 2>,
    pub sin: Tensor<B, 2>,
}

impl<B: Backend> Rope<B> {
    pub fn new(seq_len: usize, head_dim: usize, base: f64, device: &B::Device) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(seq_len * head_dim);
        let mut sin = Vec::with_capacity(seq_len * head_dim);
        for t in 0..seq_len {
            for i in 0..head_dim {
                // Frequency j = i mod half: both halves of the head share the same angles.
                let j = (i % half) as f64;
                let angle = t as f64 * base.powf(-2.0 * j / head_dim as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let shape = [seq_len, head_dim];
        Self {
            cos: Tensor::from_data(TensorData::new(cos, shape), device),
            sin: Tensor::from_data(TensorData::new(sin, shape), device),
        }
    }

    /// The tables in `dtype` (the compute dtype of a mixed-precision forward).
    pub fn cast(self, dtype: FloatDType) -> Self {
        Self {
            cos: lab_ops::cast_to(self.cos, dtype),
            sin: lab_ops::cast_to(self.sin, dtype),
        }
    }
}

impl<B: FusedHeads> Rope<B> {
    /// RoPE (`x·cos + rotate_half(x)·sin`, `rotate_half([a, b]) = [-b, a]` over the two halves
    /// of the head dimension) of the heads `at` of the joined q|k|v product `y [B·T, W]`, for
    /// positions `offset..offset + T` (tokens after a KV cache): `[B, heads, T, head_dim]`.
    /// lab-ops' one-node op (`lab_ops::rope_heads`): its backward keeps only the tables and adds
    /// into `y`'s gradient.
    pub fn apply_heads(&self, y: Tensor<B, 2>, at: HeadColumns, offset: usize) -> Tensor<B, 4> {
        let t = y.dims()[0] / at.batch;
        let rows = |table: &Tensor<B, 2>| table.clone().narrow(0, offset, t);
        lab_ops::rope_heads(y, at, rows(&self.cos), rows(&self.sin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The linear weights are exactly the 2-D parameters other than the embedding, in a model
    /// with an untied head (so every kind of Linear is there), and nothing else.
    #[test]
    fn linear_weights_are_the_matrices_besides_the_embedding() {
        type B = burn::backend::Flex;
        let cfg = crate::tiny_test_config();
        let model = crate::Llama::<B>::new(&cfg, 1, &Default::default());
        let tensors = crate::weights::tensor_map(&model);
        assert!(tensors.contains_key("lm_head.weight"));
        for (path, t) in &tensors {
            let want = t.shape.len() == 2 && path != "embed";
            assert_eq!(is_linear_weight(path), want, "{path} {:?}", t.shape);
        }
        assert!(!is_linear_weight("blocks.0.attn.wq"));
        assert!(!is_linear_weight("lm_head.weight.extra"));
    }
}
