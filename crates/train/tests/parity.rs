//! Numerical parity with an independent PyTorch implementation (cf. llm.c's `test_gpt2`):
//! `scripts/reference/torch_parity.py` ran the same 2-layer GQA model from lab's initial
//! weights for 10 AdamW steps with global clipping on fixed batches and wrote
//! `fixtures/parity.json`. This checks lab's logits, loss, per-parameter gradient norms,
//! global norms, learning rates, the 10 losses and the final weights against it, in fp32.
//!
//! Tolerances: the two implementations sum in different orders (matmul blocking, softmax,
//! reductions), so fp32 results differ by a few ulps per op and the differences grow with the
//! steps. Measured (`-- --nocapture` prints every error): logits 1.6e-7 absolute, losses 8e-8
//! relative, gradient norms 2.6e-7, final weight norms 1.5e-7. The tolerances are about 10×
//! that: logits 2e-6 absolute, losses 1e-6 and norms 5e-6 relative, leaving room for other
//! CPUs' matmul kernels. A wrong bias correction, decay group, clipping rule, RoPE layout or
//! GQA head mapping moves these numbers by 1e-3 or more.

use std::collections::HashMap;

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::tensor::{Int, Tensor, TensorData};
use lab_config::LabConfig;
use lab_data::Batch;
use lab_model::weights;
use lab_train::optim::{grad_norm, param_norm};
use lab_train::schedule::learning_rate;
use lab_train::state::TrainingState;
use lab_train::step::forward_backward;
use serde_json::Value;

type B = Autodiff<Flex>;

fn fixture() -> (LabConfig, Value) {
    let cfg = LabConfig::from_toml(include_str!("fixtures/parity.toml")).unwrap();
    let json: Value = serde_json::from_str(include_str!("fixtures/parity.json")).unwrap();
    (cfg, json)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Batch `s` of the fixture as one micro-batch.
fn batch(json: &Value, s: usize, seq_len: usize) -> Batch {
    let rows = json["tokens"][s].as_array().unwrap();
    let mut b = Batch {
        inputs: Vec::new(),
        targets: Vec::new(),
        rows: rows.len(),
        seq_len,
    };
    for r in rows {
        let ids: Vec<u32> = r
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        b.inputs.extend_from_slice(&ids[..seq_len]);
        b.targets.extend_from_slice(&ids[1..]);
    }
    b
}

/// Asserts a relative error within `rel` and prints it (`cargo test -- --nocapture` shows the
/// measured errors behind the tolerances).
fn close(what: &str, got: f64, want: f64, rel: f64) {
    let err = (got - want).abs() / want.abs().max(1e-12);
    eprintln!("{what}: relative error {err:.1e}");
    assert!(
        err <= rel,
        "{what}: lab {got} vs PyTorch {want} (relative error {err:.2e} > {rel:.0e})"
    );
}

#[test]
fn lab_matches_pytorch_on_init_logits_gradients_and_ten_adamw_steps() {
    let (cfg, json) = fixture();
    let device = Default::default();
    let mut state = TrainingState::<B>::fresh(&cfg, &device);

    // The same initial weights PyTorch started from (lab's init is part of what is pinned).
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.safetensors");
    weights::save_safetensors(&init, &weights::tensor_map(&state.model), HashMap::new()).unwrap();
    assert_eq!(
        lab_fsio::sha256_file(&init).unwrap(),
        json["init_sha256"].as_str().unwrap(),
        "lab's seed-42 init changed: regenerate the fixture (see the script's docstring)"
    );

    // Step 0 logits of batch 0.
    let t = cfg.model.seq_len;
    let b0 = batch(&json, 0, t);
    let ids: Vec<i32> = b0.inputs.iter().map(|&x| x as i32).collect();
    let tokens = Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids, [b0.rows, t]), &device);
    let logits = state.model.valid().logits(tokens);
    let all: Vec<f32> = logits.into_data().convert::<f32>().into_vec().unwrap();
    let v = cfg.model.vocab_size;
    let row0 = floats(&json["step0"]["logits_row0"]);
    let max_diff = row0
        .iter()
        .zip(&all[..t * v])
        .map(|(w, g)| (w - *g as f64).abs())
        .fold(0.0, f64::max);
    eprintln!("logits of row 0: max abs difference {max_diff:.1e}");
    assert!(
        max_diff < 2e-6,
        "logits of row 0 differ by up to {max_diff:.2e}"
    );
    let n = all.len() as f64;
    let mean = all.iter().map(|&x| x as f64).sum::<f64>() / n;
    let std = (all.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    assert!(
        (mean - json["step0"]["logits_mean"].as_f64().unwrap()).abs() < 1e-6,
        "mean {mean}"
    );
    close(
        "logits std",
        std,
        json["step0"]["logits_std"].as_f64().unwrap(),
        1e-6,
    );

    // Step 0 gradients, parameter by parameter (before clipping).
    let (grads, loss) = forward_backward(&state.model, &[b0], &device, None);
    close(
        "step-0 loss",
        loss,
        json["step0"]["loss"].as_f64().unwrap(),
        1e-6,
    );
    let want_norms = json["step0"]["grad_norms"].as_object().unwrap();
    let params = weights::tensor_map(&state.model);
    assert_eq!(params.len(), want_norms.len());
    for (path, id) in param_ids(&state.model) {
        let g = grads
            .get::<Flex, 2>(id)
            .map(|g| g.into_data())
            .or_else(|| grads.get::<Flex, 1>(id).map(|g| g.into_data()));
        let g: Vec<f32> = g.expect(&path).convert::<f32>().into_vec().unwrap();
        let norm = g.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        close(
            &format!("grad norm of {path}"),
            norm,
            want_norms[&path].as_f64().unwrap(),
            5e-6,
        );
    }
    close(
        "global grad norm",
        grad_norm(&state.model, &grads),
        json["step0"]["global_grad_norm"].as_f64().unwrap(),
        5e-6,
    );

    // Ten steps: warmup-cosine lr, global clipping, AdamW (bias correction, decay groups).
    let (want_losses, want_gnorms, lrs) = (
        floats(&json["losses"]),
        floats(&json["grad_norms"]),
        floats(&json["lrs"]),
    );
    for s in 0..10 {
        let lr = learning_rate(&cfg.train, s);
        assert!(
            (lr - lrs[s]).abs() < 1e-15,
            "lr of step {s}: {lr} vs {}",
            lrs[s]
        );
        let (grads, loss) = forward_backward(&state.model, &[batch(&json, s, t)], &device, None);
        let norm = grad_norm(&state.model, &grads);
        close(&format!("loss of step {s}"), loss, want_losses[s], 1e-6);
        close(
            &format!("grad norm of step {s}"),
            norm,
            want_gnorms[s],
            5e-6,
        );
        let scale = state.optim.clip_scale(norm);
        state = state.apply(grads, lr, scale);
    }
    let finals = json["final_param_norms"].as_object().unwrap();
    for (path, host) in weights::tensor_map(&state.model) {
        let norm = host
            .data
            .iter()
            .map(|&x| (x as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        close(
            &format!("final norm of {path}"),
            norm,
            finals[&path].as_f64().unwrap(),
            5e-6,
        );
    }
    assert!(param_norm(&state.model.valid()) > 0.0);
}

/// Parameter ids by path (gradients are keyed by id).
fn param_ids(model: &lab_model::Llama<B>) -> Vec<(String, burn::module::ParamId)> {
    use burn::module::{Module, ModuleVisitor, Param};
    struct Ids(
        lab_model::weights::PathStack,
        Vec<(String, burn::module::ParamId)>,
    );
    impl ModuleVisitor<B> for Ids {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.exit();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.1.push((self.0.path(), p.id));
        }
    }
    let mut v = Ids(Default::default(), Vec::new());
    model.visit(&mut v);
    v.1
}
