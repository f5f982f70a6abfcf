//! Memory per GPU under data parallelism with ZeRO stages 0–3 (FSDP), tensor parallelism and
//! pipeline parallelism.
//!
//! Model states follow the ZeRO paper (Rajbhandari et al. 2020): mixed-precision Adam keeps
//! 2 + 2 + 12 bytes per parameter (bf16 weights, bf16 gradients, fp32 master weights and the
//! two fp32 moments); stage 1 shards the 12, stage 2 also the gradients, stage 3 also the
//! weights, each over the sharding degree. Activations are what lab's model keeps for
//! backward under burn's autodiff, counted op by op ([`block_bytes_per_token`], measured on
//! the CPU) with the GPU trainer's flash attention (no T×T score matrix stored), following
//! the bookkeeping of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
//! Transformer Models"), and the LM-head loss as lab's fused, chunked loss holds it (no
//! `[tokens, V]` logits).

use lab_config::{ModelConfig, Precision};
use serde::Serialize;

/// How the GPUs are arranged: gpus = dp × tp × pp, ZeRO `stage` sharded over `shard` of the
/// `dp` data-parallel ranks (`shard` = dp is FSDP's full sharding, less is HSDP).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Layout {
    pub gpus: usize,
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    pub zero_stage: u8,
    pub shard: usize,
    /// Sequences per forward/backward on one model replica.
    pub micro_batch: usize,
    /// Micro-batches per optimizer step on one replica (bounds the pipeline's in-flight count).
    pub grad_accum: usize,
    pub activation_checkpointing: bool,
}

/// Bytes per parameter of each model state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StateBytes {
    pub weights: f64,
    pub grads: f64,
    pub master: f64,
    pub moments: f64,
    /// Bytes per stored activation element.
    pub activation: f64,
}

pub fn state_bytes(precision: Precision) -> StateBytes {
    match precision {
        // ZeRO's 2 + 2 + 12.
        Precision::Bf16 => StateBytes {
            weights: 2.0,
            grads: 2.0,
            master: 4.0,
            moments: 8.0,
            activation: 2.0,
        },
        // The weights are the master copy.
        Precision::Fp32 => StateBytes {
            weights: 4.0,
            grads: 4.0,
            master: 0.0,
            moments: 8.0,
            activation: 4.0,
        },
    }
}

/// One GPU's memory, in bytes. `total` uses the layout's activation-checkpointing choice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryBreakdown {
    pub zero_stage: u8,
    pub shard: usize,
    pub params: f64,
    pub grads: f64,
    pub master: f64,
    pub moments: f64,
    /// Collective buffers: two buckets of one transformer block's parameters at 4 bytes each
    /// (one being filled while the other is in flight) when there is more than one replica.
    pub comm_buffers: f64,
    /// Activations kept for the backward pass, the LM-head loss's included.
    pub activations: f64,
    /// The same with selective activation checkpointing (`train.activation_checkpointing =
    /// "selective"`): elementwise results recomputed in backward.
    pub activations_checkpointed: f64,
    pub total: f64,
    pub total_without_checkpointing: f64,
    pub total_with_checkpointing: f64,
}

/// The model's parameters as one GPU sees them.
#[derive(Debug, Clone, Copy)]
struct StageParams {
    /// Parameters held by the heaviest pipeline stage, divided by the TP degree.
    per_gpu: f64,
    /// One transformer block's parameters divided by the TP degree.
    block: f64,
    /// Transformer blocks on the heaviest stage.
    layers: usize,
}

/// `params_used` lets a plan scale the model states to a quoted count (`--params`); the
/// shape (and so the activations) stays the config's.
fn stage_params(model: &ModelConfig, params_used: f64, layout: &Layout) -> StageParams {
    let p = model.param_count();
    let scale = params_used / p.total() as f64;
    let l = model.n_layer as f64;
    let block = (p.attention + p.ffn + p.norms - model.d_model as u64) as f64 / l;
    let layers = model.n_layer.div_ceil(layout.pp);
    // Without pipelining one GPU holds everything; with it the heaviest stage holds its blocks
    // and the larger of the two ends (embedding on the first, final norm + head on the last; a
    // tied head is a second copy of the embedding there).
    let ends = if layout.pp == 1 {
        (p.embedding + p.lm_head + model.d_model as u64) as f64
    } else {
        let head = if model.tie_embeddings {
            p.embedding
        } else {
            p.lm_head
        };
        p.embedding.max(head + model.d_model as u64) as f64
    };
    let tp = layout.tp as f64;
    StageParams {
        per_gpu: (block * layers as f64 + ends) * scale / tp,
        block: block * scale / tp,
        layers,
    }
}

/// Which attention a block runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// lab-kernels' flash attention (the GPU backends): no `T × T` tensor kept.
    Flash,
    /// The tensor-op attention (the CPU backend): full `T × T` scores.
    Scores,
}

/// Bytes one transformer block of lab's model keeps for backward, per token, before tensor
/// parallelism: what burn's autodiff holds for lab-model's ops, counted op by op. `selective`
/// is `train.activation_checkpointing = "selective"` (burn's balanced checkpointing).
///
/// Korthikanti et al.'s count for this block would be 4h + 2·d_attn + 2·kv + 3·d_ff elements:
/// lab keeps about 1.2× that without checkpointing (x1-50m in bf16), because the residual
/// stream and the norms' inputs stay fp32 (and on the CPU the heads are merged by a copy).
/// crates/plan/tests/activation_memory.rs measures the `Scores` counts on the CPU with a
/// counting allocator at fp32 and bf16; crates/model/tests/gpu_memory.rs the `Flash` counts
/// (the kernel keeps its output and log-sum-exp) in a GPU backend's pool: at fp32 on lavapipe
/// in CI, bf16 too on a CUDA host.
pub fn block_bytes_per_token(
    model: &ModelConfig,
    precision: Precision,
    attention: AttentionKind,
    selective: bool,
) -> f64 {
    let h = model.d_model as f64;
    let a = model.d_attn() as f64;
    let kv = (model.n_kv_head * model.head_dim()) as f64;
    let ff = model.d_ff as f64;
    let heads = model.n_head as f64;
    let t = model.seq_len as f64;
    // Compute dtype (matmuls, activations) and fp32 (residual stream, norms, softmax).
    let c = state_bytes(precision).activation;
    let f32 = 4.0;
    let mixed = c != f32;
    // Per attention row the softmax sum or the flash log-sum-exp (RMSNorm is one op that
    // recomputes its per-row rms in backward).
    let rows = heads * f32;
    if !selective {
        // Each RMSNorm (one op): its fp32 input, and its output in the compute dtype (the
        // projections' input).
        let norms = 2.0 * (h * f32 + h * c);
        // q and k after RoPE, v, and the heads merged for the output projection.
        let qkv_merged = (2.0 * a + 2.0 * kv) * c;
        // SwiGLU: gate and up side by side (lab-ops' one-node op keeps only its input) and
        // their product (the down projection's input). The two weights are joined for one
        // product, and joined again in backward: the joined copy is not kept.
        let ffn = 3.0 * ff * c;
        let attend = match attention {
            // Nothing more: the kernel writes its output in the projections' layout, so the
            // merged heads above are that output itself, not a copy of it.
            AttentionKind::Flash => 0.0,
            // Shifted scores and their exp in fp32, the probabilities in the compute dtype.
            AttentionKind::Scores => heads * t * (2.0 * f32 + c),
        };
        norms + qkv_merged + ffn + attend + rows
    } else {
        // Kept: the outputs of matmuls, casts and kernels; elementwise results are recomputed.
        // The two branch outputs widened into the fp32 residual stream (the matmul outputs
        // themselves in fp32 runs). The norms' outputs are recomputed: in mixed precision the
        // cast to the compute dtype is part of the norm op (`lab_ops::rms_norm_to`).
        let residual = 2.0 * h * f32;
        // q and k after RoPE, v, the attention output. The joined q|k|v product's output is
        // not kept: q and k are read out of it by RoPE's op, which keeps only its tables, and
        // v is a copy of its columns (lab-ops' `heads`). (When q, k and v were three products
        // split into heads by burn's reshapes, those memory-bound view nodes had q's and k's
        // products kept for their recomputation, (a + kv)·c more.)
        let attention_side = (2.0 * a + 2.0 * kv) * c;
        // SwiGLU's gate and up.
        let ffn = 2.0 * ff * c;
        let attend = match attention {
            AttentionKind::Flash => 0.0,
            // The scores, their fp32 cast in mixed precision, and the masked scores.
            AttentionKind::Scores => heads * t * (c + if mixed { f32 } else { 0.0 } + f32),
        };
        residual + attention_side + ffn + attend + rows
    }
}

/// What lab's fused LM-head loss (lab-ops) holds on one GPU for one micro-batch of `tokens`
/// tokens, at `act` bytes per element of the compute dtype, with the vocabulary split over
/// `tp` ranks and the tokens too (sequence parallelism). It computes both gradients with the
/// loss and keeps them for backward: d hidden `[tokens, h]` and d head `[h, V]`. While it runs
/// it also holds one chunk of logits (`lab_ops::device_chunk_rows` rows of the local
/// vocabulary, overwritten in place by their gradient), one chunk's d head and their fp32 sum
/// (an upper bound: a single chunk needs no sum), all over the vocabulary padded to a
/// multiple of 64 (`lab_ops::padded_vocab`), and the head's padded copy if it needed padding. No `[tokens, V]`
/// tensor exists, so the loss grows with the tokens only by `h` per token.
pub fn lm_head_loss_bytes(model: &ModelConfig, act: f64, tokens: usize, tp: usize) -> f64 {
    let local_vocab = model.vocab_size.div_ceil(tp.max(1));
    let (h, v) = (model.d_model as f64, local_vocab as f64);
    let padded = lab_ops::padded_vocab(local_vocab) as f64;
    // A narrower vocabulary slice fits more rows in a chunk: the chunk does not shrink with TP.
    let rows = lab_ops::device_chunk_rows(tokens, local_vocab) as f64;
    let kept = (tokens as f64 * h / tp as f64 + h * v) * act;
    let copy = if padded > v { h * padded * act } else { 0.0 }; // an aligned head is not copied
    let while_running = rows * padded * act + h * padded * (act + 4.0) + copy;
    kept + while_running
}

/// One GPU's memory when its trainer runs the flash attention (the GPU backends).
pub fn per_gpu(
    model: &ModelConfig,
    precision: Precision,
    params_used: f64,
    layout: &Layout,
) -> MemoryBreakdown {
    per_device(model, precision, params_used, layout, AttentionKind::Flash)
}

/// [`per_gpu`] for a device running `attention`.
pub fn per_device(
    model: &ModelConfig,
    precision: Precision,
    params_used: f64,
    layout: &Layout,
    attention: AttentionKind,
) -> MemoryBreakdown {
    let bytes = state_bytes(precision);
    let sp = stage_params(model, params_used, layout);
    let shard = layout.shard.max(1) as f64;
    let sharded_if = |stage: u8| {
        if layout.zero_stage >= stage {
            shard
        } else {
            1.0
        }
    };
    let params = sp.per_gpu * bytes.weights / sharded_if(3);
    let grads = sp.per_gpu * bytes.grads / sharded_if(2);
    let master = sp.per_gpu * bytes.master / sharded_if(1);
    let moments = sp.per_gpu * bytes.moments / sharded_if(1);
    let comm_buffers = if layout.dp > 1 {
        2.0 * 4.0 * sp.block
    } else {
        0.0
    };

    // Tokens of one micro-batch; with sequence parallelism every activation is split over TP.
    let tokens = (layout.micro_batch * model.seq_len) as f64;
    let tp = layout.tp as f64;
    let block =
        |selective| block_bytes_per_token(model, precision, attention, selective) * tokens / tp;
    // 1F1B: the first stage holds up to `pp` micro-batches in flight (Korthikanti §4.2.3).
    let in_flight = layout.pp.min(layout.grad_accum.max(1)) as f64;
    let layers = sp.layers as f64;
    // The LM-head loss, split over TP by a vocabulary-parallel head. (An upper bound under PP:
    // the first stage's activations plus the last stage's loss.)
    let loss = lm_head_loss_bytes(
        model,
        bytes.activation,
        layout.micro_batch * model.seq_len,
        layout.tp,
    );
    let activations = block(false) * layers * in_flight + loss;
    let activations_checkpointed = block(true) * layers * in_flight + loss;

    let states = params + grads + master + moments + comm_buffers;
    let total_without_checkpointing = states + activations;
    let total_with_checkpointing = states + activations_checkpointed;
    MemoryBreakdown {
        zero_stage: layout.zero_stage,
        shard: layout.shard,
        params,
        grads,
        master,
        moments,
        comm_buffers,
        activations,
        activations_checkpointed,
        total: if layout.activation_checkpointing {
            total_with_checkpointing
        } else {
            total_without_checkpointing
        },
        total_without_checkpointing,
        total_with_checkpointing,
    }
}

/// The memory table: ZeRO stages 0–3 for the chosen TP × PP × DP (stages 1–3 sharded over the
/// chosen degree, or over all DP ranks when the chosen stage is 0).
pub fn stage_table(
    model: &ModelConfig,
    precision: Precision,
    params_used: f64,
    layout: &Layout,
) -> Vec<MemoryBreakdown> {
    (0..=3u8)
        .map(|stage| {
            let shard = match stage {
                0 => 1,
                _ if layout.zero_stage == 0 => layout.dp,
                _ => layout.shard,
            };
            let l = Layout {
                zero_stage: stage,
                shard,
                ..*layout
            };
            per_gpu(model, precision, params_used, &l)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;

    fn med7b() -> ModelConfig {
        ModelConfig::llama(64000, 32, 4096, 32, 8, 11008, 4096)
    }

    fn layout(gpus: usize, tp: usize, pp: usize, stage: u8, shard: usize) -> Layout {
        Layout {
            gpus,
            dp: gpus / (tp * pp),
            tp,
            pp,
            zero_stage: stage,
            shard,
            micro_batch: 1,
            grad_accum: 8,
            activation_checkpointing: false,
        }
    }

    #[test]
    fn single_gpu_states_are_16_bytes_per_parameter() {
        let m = med7b();
        let n = m.param_count().total() as f64;
        let mem = per_gpu(&m, Precision::Bf16, n, &layout(1, 1, 1, 0, 1));
        let states = mem.params + mem.grads + mem.master + mem.moments;
        assert!((states / n - 16.0).abs() < 1e-9);
        assert_eq!(mem.comm_buffers, 0.0);
        let fp32 = per_gpu(&m, Precision::Fp32, n, &layout(1, 1, 1, 0, 1));
        assert!(((fp32.params + fp32.grads + fp32.master + fp32.moments) / n - 16.0).abs() < 1e-9);
        assert!(fp32.activations > mem.activations);
    }

    #[test]
    fn fsdp_128_by_tp_2_shards_states_and_splits_activations() {
        let m = med7b();
        let n = m.param_count().total() as f64;
        let mem = per_gpu(&m, Precision::Bf16, n, &layout(256, 2, 1, 3, 128));
        let states = mem.params + mem.grads + mem.master + mem.moments;
        assert!((states - 16.0 * n / 256.0).abs() / states < 1e-9);
        // Per token per layer, bf16 with flash attention (h = d_attn = 4,096, kv 1,024, ff
        // 11,008, 32 heads): two norms' fp32 input plus bf16 output 2 × (4h + 2h); q, k, v and
        // the merged heads (the kernel's output itself) 2 × (2·4,096 + 2·1,024); SwiGLU's three
        // 2 × 3·ff; the log-sum-exp per head at 4 bytes.
        let per_token_layer = 2.0 * (4.0 * 4096.0 + 2.0 * 4096.0)
            + 2.0 * (2.0 * 4096.0 + 2.0 * 1024.0)
            + 2.0 * 3.0 * 11008.0
            + 4.0 * 32.0;
        assert_eq!(per_token_layer, 135_808.0);
        // Selective: the branch outputs in fp32 2·4h (the norms, their cast to bf16 included,
        // are recomputed); q and k after RoPE, v and the attention output
        // 2 × (2·4,096 + 2·1,024); SwiGLU's gate and up 2 × 2·ff; the same log-sum-exp.
        let selective_token_layer = 2.0 * 4.0 * 4096.0
            + 2.0 * (2.0 * 4096.0 + 2.0 * 1024.0)
            + 2.0 * 2.0 * 11008.0
            + 4.0 * 32.0;
        assert_eq!(selective_token_layer, 97_408.0);
        // Both split over TP 2, plus the fused loss over half the vocabulary and half the
        // tokens: d hidden and d head kept (2 bytes), one chunk of logits (all 4,096 rows: 8,384
        // fit in 1 GiB of 32,000 words) at 2 bytes, one chunk's d head at 2 and their fp32 sum
        // at 4: exactly half the TP-1 loss here.
        let (h, v, tokens) = (4096.0, 64000.0, 4096.0);
        let loss = (tokens * h + h * v) * 2.0 + tokens * v * 2.0 + h * v * 6.0;
        let expect = |per: f64| (32.0 * per * tokens + loss) / 2.0;
        assert!((mem.activations - expect(per_token_layer)).abs() < 1.0);
        assert!((mem.activations_checkpointed - expect(selective_token_layer)).abs() < 1.0);
        assert!(mem.total / GIB < 16.0, "{}", mem.total / GIB);
    }

    #[test]
    fn the_loss_holds_no_logits_for_the_whole_micro_batch() {
        // x1-50m: d 768, GPT-2's 50,257 words, 1,024-token sequences.
        let m = ModelConfig::llama(50257, 8, 768, 12, 4, 2048, 1024);
        let n = m.param_count().total() as f64;
        let at = |micro_batch| {
            let l = Layout {
                micro_batch,
                ..layout(1, 1, 1, 0, 1)
            };
            per_gpu(&m, Precision::Bf16, n, &l).activations
        };
        // 32 → 64 sequences: both past the 5,312-row chunk, so the loss adds only d hidden's
        // 768 × 2 bytes per token; full logits would add 50,257 × 6 bytes per token.
        let per_layer = block_bytes_per_token(&m, Precision::Bf16, AttentionKind::Flash, false);
        let per_token = 8.0 * per_layer + 768.0 * 2.0;
        assert!((at(64) - at(32) - 32.0 * 1024.0 * per_token).abs() < 1.0);
        // The loss's share of a 32-sequence micro-batch stays under 1 GiB (full logits and their
        // fp32 copy would be 9.9 GB).
        let loss = lm_head_loss_bytes(&m, 2.0, 32 * 1024, 1);
        assert!(loss < GIB, "{}", loss / GIB);
    }

    #[test]
    fn pipeline_stages_hold_their_layers_and_in_flight_micro_batches() {
        let m = med7b();
        let n = m.param_count().total() as f64;
        let one = per_gpu(&m, Precision::Bf16, n, &layout(4, 1, 1, 0, 1));
        let four = per_gpu(&m, Precision::Bf16, n, &layout(4, 1, 4, 0, 1));
        // The heaviest stage, the last: 8 blocks + the LM head + the final norm.
        let block = (n - 2.0 * 64000.0 * 4096.0 - 4096.0) / 32.0;
        assert!((four.params - 2.0 * (8.0 * block + 64000.0 * 4096.0 + 4096.0)).abs() < 1.0);
        // 1F1B: 8 layers × 4 micro-batches in flight = the activations of all 32 layers.
        assert!((four.activations - one.activations).abs() < 1.0);
    }
}
