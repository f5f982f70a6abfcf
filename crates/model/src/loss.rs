//! The language-modelling loss at the end of the network.

use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor};
use lab_ops::FusedLoss;

/// Mean cross-entropy of `hidden · head` against `targets`.
/// `hidden: [N, d]`, `head: [d, V]`, `targets: [N]`.
///
/// FUSED-LOSS-HOOK: the fused, chunked op of `lab-ops`: logits are built a chunk of rows
/// at a time and never kept for backward (which recomputes them). `LAB_LOSS=unfused` selects
/// the plain composition below instead, for before/after measurements (`lab bench --loss`).
pub fn lm_head_loss<B: FusedLoss>(
    hidden: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    if unfused_selected() {
        lm_head_loss_unfused(hidden, head, targets)
    } else {
        lab_ops::lm_head_loss(hidden, head, targets)
    }
}

/// The plain composition: full `[N, V]` logits, `log_softmax`, gather, mean; autodiff keeps
/// the `[N, V]` intermediates for backward.
pub fn lm_head_loss_unfused<B: Backend>(
    hidden: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let n = targets.dims()[0];
    let log_probs = log_softmax(hidden.matmul(head), 1);
    log_probs.gather(1, targets.reshape([n, 1])).mean().neg()
}

/// `LAB_LOSS=unfused`, read once per process.
fn unfused_selected() -> bool {
    static UNFUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *UNFUSED.get_or_init(|| std::env::var("LAB_LOSS").is_ok_and(|v| v == "unfused"))
}
