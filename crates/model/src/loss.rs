//! The language-modelling loss at the end of the network.

use burn::tensor::{Int, Tensor};
use lab_config::LmHeadLoss;
use lab_ops::FusedLoss;

/// Mean cross-entropy of `hidden · head` against `targets`.
/// `hidden: [N, d]`, `head: [d, V]`, `targets: [N]`.
///
/// `Fused` is lab-ops' chunked op (logits are built a chunk of rows at a time and never kept
/// for backward, which recomputes them); `Unfused` the plain composition, for before/after
/// measurements (`train.lm_head_loss`, `lab bench --loss`).
pub fn lm_head_loss<B: FusedLoss>(
    hidden: Tensor<B, 2>,
    head: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    kind: LmHeadLoss,
) -> Tensor<B, 1> {
    match kind {
        LmHeadLoss::Fused => lab_ops::lm_head_loss(hidden, head, targets),
        LmHeadLoss::Unfused => lab_ops::lm_head_loss_unfused(hidden, head, targets),
    }
}
