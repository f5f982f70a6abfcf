//! The language-modelling loss at the end of the network.

use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor};

/// Mean cross-entropy of `hidden · head` against `targets`.
/// `hidden: [N, d]`, `head: [d, V]`, `targets: [N]`.
///
/// FUSED-LOSS-HOOK: this plain composition materializes the full `[N, V]` logits (and
/// autodiff keeps them for backward); the fused, chunked op of `lab-ops` replaces it.
pub fn lm_head_loss<B: Backend>(
    hidden: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let n = targets.dims()[0];
    let log_probs = log_softmax(hidden.matmul(head), 1);
    log_probs.gather(1, targets.reshape([n, 1])).mean().neg()
}
