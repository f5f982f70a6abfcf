//! The fused LM-head cross-entropy on `CubeBackend` and through Fusion.
//!
//! Per chunk of rows: the backend's matmul makes the logits (tensor cores on a GPU), then
//! lab-kernels' row kernels write the per-row log-sum-exp and loss into `[N]` outputs and turn
//! the logits, in place, into their gradient; two more matmuls give the chunk's share of the
//! hidden and weight gradients. The weight gradient is summed over chunks in fp32 in place
//! (`add_widened`), and chunks are as tall as `device_chunk_rows` allows, so the `[d, V]`
//! product is written once per ~5K rows instead of once per 128 as the generic path does.
//!
//! The products see the vocabulary padded with zero columns to a multiple of
//! [`crate::VOCAB_ALIGN`], and the row kernels a view of the logits without them (see
//! [`padded_vocab`]); the products go through lab's projection op, so `LAB_MATMUL=cublaslt`
//! runs them on cuBLASLt as it does the blocks' projections.

use burn::tensor::{
    ops::{FloatTensor, IntTensor},
    DType, FloatDType, Shape, Tensor, TensorData,
};
use burn_cubecl::{
    ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor, BoolElement, CubeBackend,
    CubeRuntime, FloatElement, IntElement,
};
use burn_fusion::{Fusion, FusionBackend};
use lab_kernels::{gemm::VendorMatmul, join, lm_head};

use super::{custom_op, like};
use crate::generic::{chunks, float, prim};
use crate::{cast_to, device_chunk_rows, padded_vocab, FusedLoss, FusedProjection};

/// What one walk over the rows computes.
#[allow(clippy::large_enum_variant)] // one per loss call, moved once
enum Want<R: CubeRuntime> {
    /// The loss and the per-row log-sum-exp.
    Loss,
    /// The loss and both gradients for an upstream gradient of 1, each chunk's logits once.
    LossAndGrads,
    /// Both gradients from the forward's log-sum-exp and the upstream gradient `[1]`.
    Grads {
        lse: CubeTensor<R>,
        grad_loss: CubeTensor<R>,
    },
}

struct Walked<R: CubeRuntime> {
    loss: Option<CubeTensor<R>>,
    lse: CubeTensor<R>,
    grads: Option<(CubeTensor<R>, CubeTensor<R>)>,
}

fn f32_rows<R: CubeRuntime>(like: &CubeTensor<R>, n: usize) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new([n]),
        DType::F32,
    )
}

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// `a · b` through lab's projection op: the backend's matmul, or the vendor's BLAS where
/// `LAB_MATMUL` asks for it.
fn product<R, F, I, BT>(
    a: Tensor<Cube<R, F, I, BT>, 2>,
    b: Tensor<Cube<R, F, I, BT>, 2>,
) -> Tensor<Cube<R, F, I, BT>, 2>
where
    R: VendorMatmul,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    float(<Cube<R, F, I, BT> as FusedProjection>::project(
        prim(a),
        prim(b),
    ))
}

/// `weight [d, V]` followed by zero columns up to [`padded_vocab`]`(V)`. The logits' extra
/// columns are then exactly 0, the row kernels never see them (they get a view of the first
/// V), so their gradient stays 0 and adds nothing to either product of the backward.
fn padded_weight<R: CubeRuntime>(w: CubeTensor<R>) -> CubeTensor<R> {
    let v = w.meta.shape()[1];
    match padded_vocab(v) {
        padded if padded == v => w,
        padded => join::pad_columns(w, padded),
    }
}

fn walk<R, F, I, BT>(
    hidden: CubeTensor<R>,
    weight: CubeTensor<R>,
    targets: CubeTensor<R>,
    chunk_rows: usize,
    want: Want<R>,
) -> Walked<R>
where
    R: VendorMatmul,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let n = hidden.meta.shape()[0];
    let vocab = weight.meta.shape()[1];
    let weight_dtype: FloatDType = weight.dtype.into();
    let (lse, loss_rows, grad_loss) = match want {
        Want::Loss => (f32_rows(&hidden, n), Some(f32_rows(&hidden, n)), None),
        Want::LossAndGrads => {
            let one = TensorData::new(vec![1f32], [1]);
            let one = prim(Tensor::<Cube<R, F, I, BT>, 1>::from_data(
                one,
                &hidden.device,
            ));
            (f32_rows(&hidden, n), Some(f32_rows(&hidden, n)), Some(one))
        }
        Want::Grads { lse, grad_loss } => {
            let grad_loss = prim(cast_to(
                float::<Cube<R, F, I, BT>, 1>(grad_loss),
                FloatDType::F32,
            ));
            (lse, None, Some(grad_loss))
        }
    };
    let h: Tensor<Cube<R, F, I, BT>, 2> = float(hidden);
    let w: Tensor<Cube<R, F, I, BT>, 2> = float(padded_weight(weight)); // [d, Vp]
    let inv_rows = 1.0 / n as f32;
    let mut grad_hidden = Vec::new(); // per chunk [c, d]
    let mut grad_weight: Option<Tensor<Cube<R, F, I, BT>, 2>> = None; // [d, Vp], fp32 sum
    for (s, e) in chunks(n, chunk_rows) {
        let h_c = h.clone().slice(s..e); // [c, d]
        let logits = prim(product(h_c.clone(), w.clone())); // [c, Vp], in the compute dtype
        let words = lm_head::leading_columns(&logits, vocab); // [c, V], the same memory
        if let Some(loss) = &loss_rows {
            lm_head::row_loss(words.clone(), targets.clone(), &lse, loss, s);
        }
        let Some(grad_loss) = &grad_loss else {
            continue;
        };
        let (t, l, gl) = (targets.clone(), lse.clone(), grad_loss.clone());
        lm_head::softmax_grad_in_place(&words, t, l, gl, inv_rows, s);
        let g: Tensor<Cube<R, F, I, BT>, 2> = float(logits); // [c, Vp], d loss/d logits
        grad_hidden.push(product(g.clone(), w.clone().transpose())); // [c, d]
        let gw = product(h_c.transpose(), g); // [d, Vp]
        grad_weight = Some(match grad_weight.take() {
            None => cast_to(gw, FloatDType::F32),
            Some(acc) => {
                lm_head::add_widened(&prim(acc.clone()), prim(gw));
                acc
            }
        });
    }
    drop(w); // the padded copy, before a narrower weight's gradient is cast
    let grads = grad_loss.map(|_| {
        // One chunk is the whole gradient; burn's concatenation would copy it.
        let gh = match grad_hidden.len() {
            1 => grad_hidden.pop().expect("one chunk"),
            _ => Tensor::cat(grad_hidden, 0),
        };
        // [d, Vp] in f32, then its [d, V] view: the rows keep their stride.
        let gw = prim(grad_weight.expect("at least one chunk"));
        let gw = lm_head::leading_columns(&gw, vocab);
        // An f32 weight takes the view as its gradient: the optimizer and the gradient norm
        // read a matrix at its strides (burn's cast to Flex32 is no copy, so it takes this
        // arm too). A narrower weight's cast reads through the strides.
        let gw = match weight_dtype {
            FloatDType::F32 | FloatDType::Flex32 => gw,
            _ => prim(cast_to(float::<Cube<R, F, I, BT>, 2>(gw), weight_dtype)),
        };
        (prim(gh), gw)
    });
    let loss = loss_rows.map(|rows| prim(float::<Cube<R, F, I, BT>, 1>(rows).mean()));
    Walked { loss, lse, grads }
}

impl<R, F, I, BT> FusedLoss for CubeBackend<R, F, I, BT>
where
    R: VendorMatmul,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn loss_chunk_rows(rows: usize, vocab: usize) -> usize {
        device_chunk_rows(rows, vocab)
    }

    fn lm_head_loss_forward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let w = walk::<R, F, I, BT>(hidden, weight, targets, chunk_rows, Want::Loss);
        (w.loss.expect("a loss"), w.lse)
    }

    fn lm_head_loss_with_grads(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let w = walk::<R, F, I, BT>(hidden, weight, targets, chunk_rows, Want::LossAndGrads);
        let (gh, gw) = w.grads.expect("gradients");
        (w.loss.expect("a loss"), gh, gw)
    }

    fn lm_head_loss_backward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad_loss: FloatTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let want = Want::Grads { lse, grad_loss };
        let w = walk::<R, F, I, BT>(hidden, weight, targets, chunk_rows, want);
        w.grads.expect("gradients")
    }
}

/// Which half of the loss a Fusion custom operation runs.
#[derive(Clone, Copy, Debug)]
enum LossHalf {
    /// Inputs hidden, weight, targets; outputs loss, lse.
    Forward,
    /// Inputs hidden, weight, targets; outputs loss, d hidden, d weight.
    WithGrads,
    /// Inputs hidden, weight, targets, lse, grad_loss; outputs d hidden, d weight.
    Backward,
}

/// Records `half` on the Fusion stream with `outputs` shaped as given (dtype, shape).
fn register<B: FusionBackend + FusedLoss, const M: usize>(
    half: LossHalf,
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: [(DType, Shape); M],
    chunk_rows: usize,
) -> [FloatTensor<Fusion<B>>; M] {
    let name = match half {
        LossHalf::Forward => "lab_lm_head_loss_forward",
        LossHalf::WithGrads => "lab_lm_head_loss_with_grads",
        LossHalf::Backward => "lab_lm_head_loss_backward",
    };
    custom_op::<B, M>(name, inputs, outputs, move |h, t| {
        let (hidden, weight) = (
            h.get_float_tensor::<B>(&t[0]),
            h.get_float_tensor::<B>(&t[1]),
        );
        let targets = h.get_int_tensor::<B>(&t[2]);
        let c = chunk_rows;
        match half {
            LossHalf::Forward => {
                let (loss, lse) = B::lm_head_loss_forward(hidden, weight, targets, c);
                vec![loss, lse]
            }
            LossHalf::WithGrads => {
                let (loss, gh, gw) = B::lm_head_loss_with_grads(hidden, weight, targets, c);
                vec![loss, gh, gw]
            }
            LossHalf::Backward => {
                let lse = h.get_float_tensor::<B>(&t[3]);
                let grad_loss = h.get_float_tensor::<B>(&t[4]);
                let (gh, gw) = B::lm_head_loss_backward(hidden, weight, targets, lse, grad_loss, c);
                vec![gh, gw]
            }
        }
    })
}

impl<B: FusionBackend + FusedLoss> FusedLoss for Fusion<B> {
    fn loss_chunk_rows(rows: usize, vocab: usize) -> usize {
        B::loss_chunk_rows(rows, vocab)
    }

    fn lm_head_loss_forward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let n = hidden.shape[0];
        let outputs = [(DType::F32, Shape::new([1])), (DType::F32, Shape::new([n]))];
        let inputs = vec![hidden, weight, targets];
        let [loss, lse] = register::<B, 2>(LossHalf::Forward, inputs, outputs, chunk_rows);
        (loss, lse)
    }

    fn lm_head_loss_with_grads(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = [(DType::F32, Shape::new([1])), like(&hidden), like(&weight)];
        let inputs = vec![hidden, weight, targets];
        let [loss, gh, gw] = register::<B, 3>(LossHalf::WithGrads, inputs, outputs, chunk_rows);
        (loss, gh, gw)
    }

    fn lm_head_loss_backward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad_loss: FloatTensor<Self>,
        chunk_rows: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = [like(&hidden), like(&weight)];
        let inputs = vec![hidden, weight, targets, lse, grad_loss];
        let [gh, gw] = register::<B, 2>(LossHalf::Backward, inputs, outputs, chunk_rows);
        (gh, gw)
    }
}
