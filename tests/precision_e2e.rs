//! `lab train --precision bf16` end to end on the CPU backend: the run follows the fp32 run's
//! loss curve within bf16's rounding, keeps fp32 weights and optimizer state in its
//! checkpoints, resumes bit-exactly, and refuses to resume at the other precision.

use std::path::Path;
use std::process::Command;

use crate::common::*;

fn train(cfg: &Path, run: &Path, precision: &str) -> Command {
    let mut c = train_on(cfg, &data_dir(), run);
    c.args(SIGTERM_DRILL_FLAGS).args(["--precision", precision]);
    c
}

fn loss_values(run: &Path) -> Vec<f64> {
    losses(run)
        .iter()
        .map(|(_, b)| f64::from_bits(*b))
        .collect()
}

/// The dtype of every tensor in a safetensors file.
fn dtypes(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    meta.tensors()
        .values()
        .map(|info| format!("{:?}", info.dtype))
        .collect()
}

#[test]
fn bf16_follows_the_fp32_curve_keeps_fp32_state_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let (fp32, bf16) = (tmp.path().join("fp32"), tmp.path().join("bf16"));
    run_ok(&mut train(&cfg, &fp32, "fp32"));
    run_ok(&mut train(&cfg, &bf16, "bf16"));

    // Same curve within bf16's rounding, not the same bits. The runs' weights drift apart
    // step by step (AdamW divides out the size of small gradient differences), so the
    // relative difference grows from ~1e-6 in the first steps to 4.9e-4 by step 40
    // (measured on this config); the bound is 10× that.
    let (a, b) = (loss_values(&fp32), loss_values(&bf16));
    assert_eq!(a.len(), 40);
    assert_ne!(losses(&fp32), losses(&bf16), "bf16 gave the fp32 bits");
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= 5e-3 * x,
            "step {}: fp32 loss {x}, bf16 {y}",
            step + 1
        );
    }
    assert!(b[39] < b[0] - 2.0, "bf16 learned: {} → {}", b[0], b[39]);

    // Master weights and AdamW moments stay fp32 on disk.
    let step40 = bf16.join("step-00000040");
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let kinds = dtypes(&step40.join(file));
        assert!(
            !kinds.is_empty() && kinds.iter().all(|d| d == "F32"),
            "{file}: {kinds:?}"
        );
    }
    let config = std::fs::read_to_string(bf16.join("config.toml")).unwrap();
    assert!(config.contains("precision = \"bf16\""), "{config}");

    // Interrupted (SIGTERM → emergency checkpoint) and resumed: the same final weights.
    let run = tmp.path().join("interrupted");
    let code = sigterm_after_rows(&mut train(&cfg, &run, "bf16"), &run, 3);
    assert_eq!(code, Some(143));
    assert!(
        !final_weights(&run, 40).exists(),
        "interrupted before the end"
    );

    // The other precision is another recipe: refused in one line, nothing written.
    let latest = std::fs::read_to_string(run.join("latest")).unwrap();
    expect_one_line_error(
        train(&cfg, &run, "fp32").arg("--resume-from-latest"),
        "config",
    );
    assert_eq!(std::fs::read_to_string(run.join("latest")).unwrap(), latest);

    run_ok(train(&cfg, &run, "bf16").arg("--resume-from-latest"));
    assert_eq!(
        sha256(&final_weights(&run, 40)),
        sha256(&final_weights(&bf16, 40))
    );
    assert_eq!(losses(&run), losses(&bf16));
}

#[test]
fn the_bench_reports_the_precision_it_ran() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let out = run_ok(
        lab()
            .args(["bench", "--json", "--steps", "1", "--warmup", "0"])
            .args(["--precision", "bf16", "--config"])
            .arg(&cfg),
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["precision"], "bf16");
    assert!(report["tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn selective_checkpointing_recomputes_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let train = |dir: &Path, mode: &str| {
        let mut c = train_on(&cfg, &data_dir(), dir);
        c.args([
            "--total-steps",
            "8",
            "--ckpt-every",
            "8",
            "--log-every",
            "1",
            "--precision",
            "bf16",
            "--activation-checkpointing",
            mode,
        ]);
        c
    };
    let run = |mode: &str| {
        let dir = tmp.path().join(mode);
        run_ok(&mut train(&dir, mode));
        dir
    };
    let (kept, selective) = (run("none"), run("selective"));
    // Recomputed elementwise results are the forward's own bits: same losses, same weights
    // and AdamW moments.
    assert_eq!(losses(&kept).len(), 8);
    assert_eq!(losses(&kept), losses(&selective));
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let at = |run: &Path| sha256(&run.join("step-00000008").join(file));
        assert_eq!(at(&kept), at(&selective), "{file}");
    }
    // The run's config records the mode (and stays silent about the default).
    let recorded = |run: &Path| std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(recorded(&selective).contains("activation_checkpointing = \"selective\""));
    assert!(!recorded(&kept).contains("activation_checkpointing"));
    // Not part of the recipe: a run resumes in the other mode.
    run_ok(train(&kept, "selective").arg("--resume-from-latest"));
}
