//! The model on a GPU backend (wgpu, lavapipe in CI; CUDA when built with only `--features
//! cuda`, on a GPU host) trains through the fused attention kernel (lab-kernels, wired by
//! lab-ops as an autodiff node and a Fusion custom op), and gives the loss and gradients of
//! the tensor-op attention it replaces.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::backend::Autodiff;
use burn::module::Param;
use burn::tensor::{backend::Backend, Int, Tensor};
use lab_config::{LmHeadLoss, ModelConfig};
use lab_model::Llama;

use crate::common;
use common::small_config;

#[cfg(feature = "wgpu")]
type B = Autodiff<burn::backend::Wgpu>;
#[cfg(not(feature = "wgpu"))]
type B = Autodiff<burn::backend::Cuda>;

fn cfg() -> ModelConfig {
    // Longer than the kernels' row block (32 rows at head width 8): several blocks.
    small_config(40, 0.2)
}

fn ids(batch: usize, t: usize, salt: usize) -> Tensor<B, 2, Int> {
    common::ids::<B>(batch, t, salt)
}

fn host<const D: usize>(
    t: Tensor<<B as burn::tensor::backend::AutodiffBackend>::InnerBackend, D>,
) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

fn assert_close(name: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let scale = want.iter().fold(1e-3f32, |a, x| a.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // Written so that a NaN on either side fails.
        let close = (g - w).abs() <= tol * scale;
        assert!(
            close,
            "{name}[{i}]: got {g}, want {w} (tolerance {:.3e})",
            tol * scale
        );
    }
}

#[test]
fn training_loss_and_gradients_equal_the_tensor_op_attention() {
    let _gpu = common::gpu_alone();
    assert!(
        lab_ops::fused_attention_fn::<B>().is_some(),
        "the GPU backend must have the fused attention"
    );
    let device = Default::default();
    let model = Llama::<B>::new(&cfg(), 3, &device);
    let (tokens, targets) = (ids(2, 40, 0), ids(2, 40, 1));
    let n = 2 * 40;

    // What training runs: Llama::loss, through the kernel.
    let fused = model.loss(tokens.clone(), targets.clone());
    // The same loss through the tensor-op attention.
    let reference = lab_model::loss::lm_head_loss(
        model.hidden(tokens),
        model.head_weight(),
        targets.reshape([n]),
        LmHeadLoss::Fused,
    );
    let (g_fused, g_ref) = (fused.backward(), reference.backward());
    // The tensor-op attention's products run as TF32 on CUDA (`common::f32_products`).
    let tol = |t: f64| common::f32_products(t) as f32;
    assert_close(
        "loss",
        &host(fused.inner()),
        &host(reference.inner()),
        tol(1e-5),
    );

    let grad = |p: &Param<Tensor<B, 2>>, g| host(p.val().grad(g).expect("a gradient"));
    let attn = &model.blocks[0].attn;
    for (name, p) in [
        ("blocks.0.attn.wq", &attn.wq.weight),
        ("blocks.0.attn.wk", &attn.wk.weight),
        ("blocks.0.attn.wv", &attn.wv.weight),
        ("blocks.1.attn.wo", &model.blocks[1].attn.wo.weight),
        ("embed", &model.embed),
    ] {
        assert_close(name, &grad(p, &g_fused), &grad(p, &g_ref), tol(1e-4));
    }
    <B as Backend>::sync(&device).unwrap();
}
