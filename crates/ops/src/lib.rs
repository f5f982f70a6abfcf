//! lab-ops: fused training ops that burn does not provide.
//!
//! Today: the LM head and its cross-entropy as one op ([`lm_head_loss`]), causal GQA
//! attention as one op where a GPU kernel exists ([`FusedAttention`]), rotary position
//! embedding as one op with one-pass CPU and GPU kernels ([`rope`]), SwiGLU's gating on the fused
//! gate and up projections as one op that keeps one tensor instead of four ([`swiglu`]), RMSNorm as one op that keeps its input
//! only ([`rms_norm`]), one AdamW update of one parameter in one pass ([`FusedAdamW`]), the sum of squares of
//! many tensors under the gradient norm ([`SumOfSquares`]), the
//! projections' `x · w` as one op that a GPU may run on its vendor's BLAS ([`project`]) and
//! several weights' products as one ([`project_joined`]), the attention's heads read out of
//! the joined q|k|v product with their gradients added back in place ([`rope_heads`],
//! [`heads`]), and
//! the token embedding with a GPU kernel for its backward ([`embedding`]).
//!
//! The plain composition `log_softmax(hidden @ W)` + gather + mean writes several fp32
//! `[N, V]` tensors (logits, shifted, exp, log-probs, and their gradients); autodiff keeps some
//! of them alive until backward. For the tiny config (N = 8 × 128 = 1024 tokens,
//! V = 50257) one such tensor is 206 MB. The fused op walks the rows a chunk at a time, so only
//! one `[chunk_rows, V]` block of logits exists at any moment, and backward recomputes it
//! instead of storing it: what survives from forward to backward is the inputs plus one float
//! per row (the log-sum-exp).
//!
//! Backends: the trait [`FusedLoss`] has a backend-generic default built from burn's ordinary
//! tensor ops (any backend gets it by an empty `impl`); `Autodiff<B>` gets the custom backward
//! (see `autodiff.rs`); `Flex` (the CPU default) overrides both halves with a hand-written kernel
//! (see `flex.rs`); `CubeBackend` (CUDA, wgpu) runs the backend's matmul per chunk and
//! lab-kernels' row kernels for the rest, in chunks sized for the GPU, and Fusion passes it
//! through as a custom op (see `cube/loss.rs`).

use burn::tensor::{
    backend::Backend,
    ops::{FloatTensor, IntTensor},
    FloatDType, Int, Tensor, TensorPrimitive,
};

mod adamw;
mod adamw_flex;
mod attention;
mod autodiff;
#[cfg(feature = "cube")]
mod cube;
mod embedding;
mod flex;
mod flex_tensor;
mod generic;
mod heads;
mod memory;
mod projection;
mod rms_norm;
mod rope;
mod square_sums;
mod swiglu;

pub use adamw::{tensor_ops_update, AdamWStep, AdamWUpdated, FusedAdamW, MomentPair};
pub use attention::{
    fused_attention, fused_attention_fn, AttentionFn, AttentionForward, AttentionGrads,
    FusedAttention,
};
pub use autodiff::{gradients_folded_on_this_thread, projection_node};
pub use embedding::{embedding, FusedEmbedding};
pub use heads::{heads, rope_heads, FusedHeads, HeadColumns};
#[cfg(feature = "cuda")]
pub use lab_kernels::gemm::vendor_library_present;
/// What the GPU backends' projections run on (`LAB_MATMUL`).
#[cfg(feature = "cube")]
pub use lab_kernels::gemm::Choice as MatmulChoice;
#[cfg(feature = "cube")]
pub use lab_kernels::gemm::{vendor_counts, VendorCounts};
pub use memory::{DeviceBytes, DeviceMemory};
pub use projection::{project, project_joined, FusedProjection};
pub use rms_norm::{rms_norm, rms_norm_to, FusedRmsNorm, RmsNormGrads};
pub use rope::{rope, rope_tensor_ops, FusedRope};
pub use square_sums::{tensor_ops_sum_of_squares, SumOfSquares};
pub use swiglu::{swiglu, FusedSwiglu};

/// `x` in `dtype`. A no-op when it already is: burn's cast records an autodiff node even
/// then, and fp32 runs must keep the graph (and the bits) they had before mixed precision.
pub fn cast_to<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    if x.dtype() == dtype.into() {
        x
    } else {
        x.cast(dtype)
    }
}

/// The fused ops inside the model's blocks and its embedding: what a backend must provide to
/// run the forward.
pub trait FusedLayers:
    FusedRmsNorm + FusedHeads + FusedSwiglu + FusedProjection + FusedEmbedding
{
}
impl<B: FusedRmsNorm + FusedHeads + FusedSwiglu + FusedProjection + FusedEmbedding> FusedLayers
    for B
{
}

/// Every fused op the model calls: what a backend must provide to train.
pub trait FusedOps: FusedLoss + FusedAttention + FusedLayers {}
impl<B: FusedLoss + FusedAttention + FusedLayers> FusedOps for B {}

/// Rows of logits computed at once when the caller does not choose.
///
/// 128 rows of a 50257-word vocabulary are a 25.7 MB fp32 block: small next to the
/// 206 MB full logits of the tiny config (8× less), yet tall enough that the weight-gradient
/// product `hidden[chunk]^T @ g` (inner dimension = chunk rows) runs at full matmul speed and
/// the `[d, V]` weight gradient is read and rewritten only N / 128 times per step.
/// Measured on the tiny config (Flex, 2 threads, forward + backward of the op alone):
/// 64 rows ≈ 553 ms, 128 ≈ 440 ms, 256 ≈ 455 ms.
pub const DEFAULT_CHUNK_ROWS: usize = 128;

/// Bytes of one chunk's logits on a GPU, counted at 4 per element whatever their dtype.
///
/// 1 GiB is 5,312 rows of GPT-2's 50,257 words: x1-50m's 32 × 1,024-token micro-batch is
/// 7 chunks, so the weight gradient (`[768, 50257]`, 154 MB in fp32) is produced and summed 7
/// times (≈ 4 GB of traffic) instead of 256 times (≈ 160 GB) with 128-row chunks. The block is
/// ~1 % of an 80 GB GPU.
pub const DEVICE_LOGITS_BYTES: usize = 1 << 30;

/// Rows per loss chunk on a GPU: as many as fit [`DEVICE_LOGITS_BYTES`] (at the
/// [`padded_vocab`] the products see), a multiple of 64 (the matmul's tiles), at least 64, at
/// most `rows`. (`lab plan` sizes the loss's memory by it.)
pub fn device_chunk_rows(rows: usize, vocab: usize) -> usize {
    let fit = DEVICE_LOGITS_BYTES / (4 * padded_vocab(vocab.max(1)));
    (fit / 64 * 64).max(64).min(rows.max(1))
}

/// On a GPU the LM head's products see the vocabulary padded to a multiple of this many
/// columns. At GPT-2's 50,257 words the weight's rows are 50,257 elements apart, and the
/// logits' 50,257 columns are not a multiple of any vector width: cubecl's matmul then loads
/// and stores them one element at a time (its vector width must divide the contiguous axis
/// and the other strides: cubecl-core's `tensor_vector_size_parallel`), and cuBLAS ran the LM
/// head's shape at 128 TFLOP/s on an H100 against 685 at 2,048 columns. nanoGPT pads its vocabulary
/// to 50,304 for this; lab pads inside the loss (`cube/loss.rs`), so the model, its
/// checkpoints and its exports keep 50,257 words.
pub const VOCAB_ALIGN: usize = 64;

/// The vocabulary the GPU loss's products see: `vocab` rounded up to [`VOCAB_ALIGN`].
pub fn padded_vocab(vocab: usize) -> usize {
    vocab.next_multiple_of(VOCAB_ALIGN)
}

/// A backend that can compute the fused LM-head cross-entropy.
///
/// Shapes: `hidden [N, d]`, `weight [d, V]` (burn's row layout: `logits = hidden @ weight`),
/// `targets [N]` (class ids in `0..V`). The loss is the mean over the N rows of
/// `logsumexp(logits[i]) - logits[i, targets[i]]`, returned as a 1-element tensor.
pub trait FusedLoss: Backend {
    /// Rows of logits [`lm_head_loss`] computes at once for `rows` rows of a `vocab`-word
    /// vocabulary: [`DEFAULT_CHUNK_ROWS`] on the CPU, taller on a GPU (see `cube/loss.rs`).
    fn loss_chunk_rows(_rows: usize, _vocab: usize) -> usize {
        DEFAULT_CHUNK_ROWS
    }

    /// The mean cross-entropy, differentiable w.r.t. `hidden` and `weight` on autodiff backends.
    fn lm_head_loss(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> FloatTensor<Self> {
        Self::lm_head_loss_forward(hidden, weight, targets, chunk_rows).0
    }

    /// Forward half: `(mean loss [1], per-row log-sum-exp [N])`.
    /// The log-sum-exp is what backward needs to rebuild the softmax without a second pass.
    fn lm_head_loss_forward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::forward::<Self>(hidden, weight, targets, chunk_rows)
    }

    /// Forward and gradients in one pass, for training, where backward always follows:
    /// `(mean loss [1], d loss/d hidden [N, d], d loss/d weight [d, V])` for an upstream
    /// gradient of 1 (Liger's fused linear cross-entropy: backward then only scales, and the
    /// logits are computed once instead of twice).
    fn lm_head_loss_with_grads(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (loss, lse) =
            Self::lm_head_loss_forward(hidden.clone(), weight.clone(), targets.clone(), chunk_rows);
        let one = Self::float_from_data(
            burn::tensor::TensorData::new(vec![1f32], [1]),
            &Self::float_device(&loss),
        );
        let (gh, gw) = Self::lm_head_loss_backward(hidden, weight, targets, lse, one, chunk_rows);
        (loss, gh, gw)
    }

    /// Backward half: `(d loss/d hidden [N, d], d loss/d weight [d, V])`, given the upstream
    /// gradient of the loss `grad_loss [1]` and the forward's log-sum-exp `lse [N]`.
    fn lm_head_loss_backward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad_loss: FloatTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::backward::<Self>(hidden, weight, targets, lse, grad_loss, chunk_rows)
    }
}

/// Mean cross-entropy of `hidden [N, d] @ weight [d, V]` against `targets [N]`, fused and
/// chunked (the backend's [`FusedLoss::loss_chunk_rows`] rows at a time). Same value and gradients as
/// `log_softmax(hidden.matmul(weight), 1).gather(1, targets).neg().mean()`.
pub fn lm_head_loss<B: FusedLoss>(
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let chunk_rows = B::loss_chunk_rows(hidden.dims()[0], weight.dims()[1]);
    lm_head_loss_chunked(hidden, weight, targets, chunk_rows)
}

/// [`lm_head_loss`] with an explicit chunk height (rows of logits materialised at once).
pub fn lm_head_loss_chunked<B: FusedLoss>(
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    chunk_rows: usize,
) -> Tensor<B, 1> {
    let [n, d] = hidden.dims();
    let [d_w, _v] = weight.dims();
    assert_eq!(
        d, d_w,
        "lm_head_loss: hidden is [{n}, {d}] but weight is [{d_w}, V]"
    );
    assert_eq!(
        targets.dims()[0],
        n,
        "lm_head_loss: {n} rows of hidden but {} targets",
        targets.dims()[0]
    );
    assert!(
        n > 0 && chunk_rows > 0,
        "lm_head_loss: empty input or chunk"
    );
    let loss = B::lm_head_loss(
        hidden.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        targets.into_primitive(),
        chunk_rows,
    );
    Tensor::from_primitive(TensorPrimitive::Float(loss))
}

/// Per-token cross-entropy `[N]` of `hidden [N, d] @ weight [d, V]` against `targets [N]`,
/// for evaluation (no gradient): the mean of the result is [`lm_head_loss`]. Each row's
/// log-sum-exp comes from the backend's fused forward (no `[N, V]` logits kept), and the
/// target's logit is the row's dot product with its target's column, in fp32.
pub fn lm_head_token_losses<B: FusedLoss>(
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let [n, _] = hidden.dims();
    let chunk_rows = B::loss_chunk_rows(n, weight.dims()[1]);
    let target_columns = weight.clone().transpose().select(0, targets.clone()); // [N, d]
    let picked = (cast_to(hidden.clone(), FloatDType::F32)
        * cast_to(target_columns, FloatDType::F32))
    .sum_dim(1)
    .reshape([n]);
    let (_, lse) = B::lm_head_loss_forward(
        hidden.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        targets.into_primitive(),
        chunk_rows,
    );
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(lse)) - picked
}

/// The unfused reference: full `[N, V]` logits, `log_softmax`, gather, mean.
/// Kept for tests and for measuring what the fusion buys (`lab bench` "before").
pub fn lm_head_loss_unfused<B: Backend>(
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let n = targets.dims()[0];
    // Low-precision matmul, fp32 softmax (as autocast does).
    let logits = cast_to(hidden.matmul(weight), FloatDType::F32); // [N, V]
    let logp = burn::tensor::activation::log_softmax(logits, 1); // [N, V]
    let picked = logp.gather(1, targets.reshape([n, 1])); // [N, 1]
    picked.neg().mean() // [1]
}
