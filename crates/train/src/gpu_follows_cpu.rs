//! `lab train`'s loop on the GPU backend against the same loop on the CPU, step for step.
//!
//! Each kernel has its own test against fp64 (lab-kernels, lab-ops), and the CPU's loop is
//! held against PyTorch (`tests/parity.rs`). What neither shows is the GPU's kernels wired into
//! the whole loop: the fused attention, norms, RoPE, SwiGLU and LM-head loss through Fusion,
//! the gradient norm and clipping, the flat AdamW update, the schedule, checkpoints written
//! from and read back onto the device, and a non-finite gradient caught by the GPU's norm and
//! rolled back. Here the real dispatch (`BackendKind`) trains a small model for a dozen steps
//! on each backend from the same seed and data, and every number the run logs must agree.

use std::path::Path;

use lab_config::LabConfig;
use serde_json::Value;

use crate::{BackendKind, Outcome, TrainOptions};

const STEPS: u64 = 12;
/// The fire drill's step: its gradient is made NaN after the backward, its loss left finite,
/// so the run rolls back to the checkpoint of step 3 and skips that step's data.
const NAN_GRAD_STEP: u64 = 5;

/// Relative agreement of the losses, weight norm and learning rate. Both backends compute in
/// f32 and differ in the order of their sums (the GPU's tiles against the CPU's loops): each
/// op is off by a few units in the last place, ~1e-7. Measured over the dozen steps on
/// lavapipe: at most 1.8e-7 (a loss) and 2.1e-7 (the weight norm). Skipping the weight decay
/// in the GPU's AdamW moves the weight norm by 8.9e-5 at the first step.
const TOLERANCE: f64 = 1e-5;

/// Relative agreement of the gradient norm and the clipping scale taken from it: the gradients
/// are sums with cancellation, so their rounding shows more. Measured: at most 9.7e-6.
const GRAD_TOLERANCE: f64 = 1e-4;

/// tiny-cpu's recipe at a size lavapipe trains in seconds: 2 layers, GQA 4:2, 64 tokens a
/// step, every step logged, a checkpoint every 3 steps, one evaluation at the end.
fn small_config() -> LabConfig {
    let mut cfg = LabConfig::from_toml(include_str!("../../../configs/tiny-cpu.toml")).unwrap();
    let m = &mut cfg.model;
    (m.n_layer, m.d_model, m.d_ff, m.seq_len) = (2, 64, 192, 32);
    let t = &mut cfg.train;
    (t.micro_batch, t.total_steps, t.warmup_steps) = (2, STEPS as usize, 3);
    (t.log_every, t.eval_every, t.eval_batches, t.ckpt_every) = (1, 100, 1, 3);
    cfg
}

/// What a run leaves: its outcome, metrics.jsonl, metrics-abandoned.jsonl and events.jsonl.
struct Logged {
    outcome: Outcome,
    metrics: Vec<Value>,
    abandoned: Vec<Value>,
    events: Vec<Value>,
}

/// Trains `cfg` on `backend` in a fresh run folder, with the NaN-gradient drill.
fn train_on(backend: BackendKind, cfg: &LabConfig, data: &Path) -> Logged {
    let run = tempfile::tempdir().unwrap();
    let dir = run.path().join("run");
    let opts = TrainOptions {
        config: cfg.clone(),
        data_dir: data.to_path_buf(),
        run_dir: dir.clone(),
        resume: false,
        backend,
        progress: false,
        policies: Vec::new(),
        alert: None,
        nan_grad_at_step: Some(NAN_GRAD_STEP),
        crash_in_rollback: false,
        extend_to_steps: None,
        init_from_hf: None,
        launch: lab_dist::Launch::alone(),
    };
    let outcome = backend.dispatch(opts).unwrap();
    let rows = |name: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    Logged {
        outcome,
        metrics: rows(lab_run::METRICS),
        abandoned: rows(lab_run::ABANDONED_METRICS),
        events: rows("events.jsonl"),
    }
}

/// Every number two metrics rows hold agrees within [`TOLERANCE`]; the rest is equal.
fn assert_rows_agree(cpu: &Value, gpu: &Value) {
    let step = &cpu["step"];
    for key in [
        "loss",
        "lr",
        "grad_norm",
        "clip_scale",
        "param_norm",
        "val_loss",
    ] {
        let (c, g) = (&cpu[key], &gpu[key]);
        let tolerance = match key {
            "grad_norm" | "clip_scale" => GRAD_TOLERANCE,
            _ => TOLERANCE,
        };
        match (c.as_f64(), g.as_f64()) {
            (Some(c), Some(g)) => assert!(
                (g - c).abs() <= tolerance * c.abs(),
                "{key} at step {step}: gpu {g} against cpu {c} (relative {:.1e})",
                (g - c).abs() / c.abs()
            ),
            _ => assert_eq!(c, g, "{key} at step {step}: one side has no number"),
        }
    }
    for key in [
        "step",
        "samples",
        "tokens",
        "rollback",
        "injected",
        "update_skipped",
    ] {
        assert_eq!(cpu[key], gpu[key], "{key} at step {step}");
    }
}

/// `(kind, step)` of each event: checkpoints, the drill, the rollback, the best, the end.
fn event_trail(events: &[Value]) -> Vec<(&str, u64)> {
    let step = |e: &Value| e["step"].as_u64().unwrap();
    events
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), step(e)))
        .collect()
}

#[test]
fn the_gpu_backend_trains_step_for_step_as_the_cpu_does() {
    let data = tempfile::tempdir().unwrap();
    lab_data::gpt2::ensure_tinyshakespeare(data.path()).unwrap();
    let cfg = small_config();
    let cpu = train_on(BackendKind::Cpu, &cfg, data.path());
    let gpu = train_on(BackendKind::Wgpu, &cfg, data.path());

    // The drill rolled both back from step 5 to step 3's checkpoint, once.
    let rollbacks = |l: &Logged| -> Vec<Value> {
        let r = l.events.iter().filter(|e| e["kind"] == "rollback");
        r.map(|e| serde_json::json!([e["from_step"], e["to_step"], e["reason"]]))
            .collect()
    };
    assert_eq!(
        rollbacks(&cpu),
        [serde_json::json!([
            5,
            3,
            "non-finite gradient norm at step 5"
        ])]
    );
    assert_eq!(rollbacks(&gpu), rollbacks(&cpu));
    assert_eq!(event_trail(&gpu.events), event_trail(&cpu.events));

    let steps =
        |rows: &[Value]| -> Vec<u64> { rows.iter().map(|r| r["step"].as_u64().unwrap()).collect() };
    assert_eq!(steps(&cpu.metrics), (1..=STEPS).collect::<Vec<_>>());
    assert_eq!(steps(&cpu.abandoned), [4]);
    assert_eq!(steps(&gpu.metrics), steps(&cpu.metrics));
    assert_eq!(steps(&gpu.abandoned), steps(&cpu.abandoned));
    for (c, g) in cpu.metrics.iter().zip(&gpu.metrics) {
        assert_rows_agree(c, g);
    }
    assert_rows_agree(&cpu.abandoned[0], &gpu.abandoned[0]);

    let losses = |o: &Outcome| match o {
        Outcome::Completed {
            step,
            train_loss,
            val_loss,
        } => (*step, *train_loss, val_loss.unwrap()),
        other => panic!("{other:?}"),
    };
    let ((cs, ct, cv), (gs, gt, gv)) = (losses(&cpu.outcome), losses(&gpu.outcome));
    assert_eq!((cs, gs), (STEPS, STEPS));
    assert!((gt - ct).abs() <= TOLERANCE * ct && (gv - cv).abs() <= TOLERANCE * cv);
}
