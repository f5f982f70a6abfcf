//! Judging a run end to end: `lab generate` (KV cache, seeded), `lab eval` (multiple choice,
//! mmlu-medical, perplexity by type, memorization), evaluation during training by document
//! type, stop rules on a real overfitting run with its best checkpoint, and the projection.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use serde_json::Value;

fn json_out(cmd: &mut Command) -> Value {
    serde_json::from_slice(&run_ok(cmd).stdout).unwrap()
}

/// A small corpus learnt by heart: one record with an identifier, repeated.
fn memorable_data(dir: &Path) -> PathBuf {
    let text = "The record number is ZQ-8841-7712, filed with the clinic. The cat sat on the mat. "
        .repeat(200)
        + &lab_data::TINYSHAKESPEARE[..3000];
    let data = dir.join("memorable");
    lab_data::gpt2::prepare_text(&text, "memorable", 0.85, &data).unwrap();
    data
}

#[test]
fn generate_streams_and_is_deterministic_for_a_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    run_ok(&mut train_on(&cfg, &data_dir(), &run));
    let gen = |seed: &str| {
        let out = run_ok(lab().args(["generate", "--run"]).arg(&run).args([
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "20",
            "--temperature",
            "1.0",
            "--top-k",
            "50",
            "--seed",
            seed,
        ]));
        String::from_utf8(out.stdout).unwrap()
    };
    let (a, b, c) = (gen("1"), gen("1"), gen("2"));
    assert!(a.starts_with("ROMEO:") && a.len() > "ROMEO:".len(), "{a}");
    assert_eq!(a, b, "same seed, same text");
    assert_ne!(a, c, "another seed, other text");
    let out = run_ok(
        lab()
            .args(["generate", "--run"])
            .arg(&run)
            .args(["--step", "30", "--prompt", "To be"]),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("checkpoint step 30"));
    // A prompt past the context (32) keeps its end and still gets the tokens asked for.
    let long = "To be, or not to be, that is the question. ".repeat(20);
    let out = run_ok(lab().args(["generate", "--run"]).arg(&run).args([
        "--prompt",
        &long,
        "--max-new-tokens",
        "10",
        "--temperature",
        "0",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("continuing from its last 22")
            && stderr.contains("[10 tokens, stopped at max tokens"),
        "{stderr}"
    );
    // Nothing to continue from is a user mistake (a usage error), not a panic.
    expect_usage_error(
        lab()
            .args(["generate", "--run"])
            .arg(&run)
            .args(["--prompt", ""]),
        "--prompt is empty",
    );
    // A --checkpoint that names no checkpoint is a usage error on every command taking one.
    for command in [
        &["generate", "--prompt", "To be"][..],
        &["eval"],
        &["export", "--output", "unused"],
    ] {
        expect_usage_error(
            lab()
                .current_dir(tmp.path())
                .args(command)
                .args(["--checkpoint", "newest", "--run"])
                .arg(&run),
            "--checkpoint \"newest\": use latest, best",
        );
    }
    assert!(!tmp.path().join("unused").exists());
    for flag in ["--batch", "--limit"] {
        expect_usage_error(
            lab().args(["eval", flag, "0", "--run"]).arg(&run),
            &format!("{flag} 0: give at least 1"),
        );
    }
}

#[test]
fn multiple_choice_prefers_what_the_model_learnt_and_mmlu_medical_runs_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let data = memorable_data(tmp.path());
    let run = tmp.path().join("run");
    run_ok(train_on(&cfg, &data, &run).args(["--total-steps", "150"]));
    let items = tmp.path().join("items.jsonl");
    std::fs::write(
        &items,
        concat!(
            r#"{"ctx": "The cat sat on the", "endings": ["mat.", "moon."], "label": 0}"#, "\n",
            r#"{"ctx": "The record number is ZQ-8841-", "endings": ["3390,", "7712,"], "label": 1}"#, "\n",
        ),
    )
    .unwrap();
    let v = json_out(
        lab()
            .args(["eval", "--run"])
            .arg(&run)
            .arg("--mc")
            .arg(&items)
            .args(["--json", "--no-perplexity"]),
    );
    assert_eq!(v["mc"]["items"], 2);
    assert_eq!(v["mc"]["acc"], 1.0, "the learnt continuations win: {v}");

    let mmlu =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/corpus/corpora/mmlu-medical.jsonl");
    let v = json_out(
        lab()
            .args(["eval", "--run"])
            .arg(&run)
            .arg("--mc")
            .arg(&mmlu)
            .args(["--limit", "40", "--shots", "2", "--json"]),
    );
    assert_eq!(
        (v["mc"]["items"].as_u64(), v["mc"]["shots"].as_u64()),
        (Some(40), Some(2))
    );
    assert_eq!(v["mc"]["chance"], 0.25);
    let acc = v["mc"]["acc"].as_f64().unwrap();
    let (lo, hi) = (
        v["mc"]["acc_ci"][0].as_f64().unwrap(),
        v["mc"]["acc_ci"][1].as_f64().unwrap(),
    );
    assert!(lo <= acc && acc <= hi);
    assert!(v["perplexity"]["overall"]["loss"].as_f64().unwrap() > 0.0);

    // A model that learnt its data by heart reproduces the record's identifier; one it never
    // saw does not come out.
    let probe = tmp.path().join("probe.jsonl");
    std::fs::write(
        &probe,
        concat!(
            r#"{"text": "The record number is ZQ-8841-7712, filed.", "identifier": "ZQ-8841-7712"}"#, "\n",
            r#"{"prompt": "The patient's MRN is", "identifier": "MRN-5521-0093"}"#, "\n",
        ),
    )
    .unwrap();
    let v = json_out(
        lab()
            .args(["eval", "--no-perplexity", "--json", "--run"])
            .arg(&run)
            .arg("--memorization")
            .arg(&probe),
    );
    assert_eq!(
        (
            v["memorization"]["probes"].as_u64(),
            v["memorization"]["leaked"].as_u64()
        ),
        (Some(2), Some(1)),
        "{v}"
    );
    assert_eq!(v["memorization"]["leaks"][0]["identifier"], "ZQ-8841-7712");
}

#[test]
fn training_evaluates_by_document_type_and_the_types_add_up() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("medquad");
    let medquad =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/corpus/corpora/medquad.jsonl.zst");
    run_ok(
        lab()
            .args(["data", "prepare", "--input"])
            .arg(&medquad)
            .args([
                "--type-field",
                "source",
                "--val-fraction",
                "0.02",
                "--output-dir",
            ])
            .arg(&data),
    );
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("meta.json")).unwrap()).unwrap();
    let spans = meta["spans"]["val.bin"].as_array().unwrap();
    assert!(spans.len() > 5 && spans[0]["start"] == 0);
    assert_eq!(
        spans.last().unwrap()["end"],
        meta["files"]["val.bin"]["tokens"],
        "spans cover val.bin"
    );

    let cfg = micro_config(tmp.path());
    let mmlu =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/corpus/corpora/mmlu-medical.jsonl");
    let text = std::fs::read_to_string(&cfg).unwrap()
        + &format!("[eval]\nby_type = true\nprompts = [\"What is\"]\nsample_tokens = 8\nmc_file = {:?}\nmc_items = 8\n", mmlu.display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let run = tmp.path().join("run");
    run_ok(train_on(&cfg, &data, &run).args(["--total-steps", "30"]));
    let rows: Vec<Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = rows.last().unwrap();
    let typed: Vec<&String> = last
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("val_loss."))
        .collect();
    assert!(typed.len() >= 3, "per-type losses in metrics.jsonl: {last}");
    // Token-weighted, the types give back the validation loss of the same windows.
    let eval = events(&run, "eval").pop().unwrap();
    let (mut nll, mut tokens) = (0.0, 0.0);
    for t in eval["by_type"].as_array().unwrap() {
        nll += t["loss"].as_f64().unwrap() * t["tokens"].as_f64().unwrap();
        tokens += t["tokens"].as_f64().unwrap();
    }
    let val = last["val_loss"].as_f64().unwrap();
    assert!(
        (nll / tokens - val).abs() < 1e-4 * val,
        "{} vs {val}",
        nll / tokens
    );
    assert_eq!(
        events(&run, "samples").len(),
        1,
        "one evaluation, one set of samples"
    );
    // And `lab eval` measures the whole val.bin by type.
    let v = json_out(lab().args(["eval", "--json", "--run"]).arg(&run));
    let by_type = v["perplexity"]["by_type"].as_array().unwrap();
    let sum: u64 = by_type.iter().map(|t| t["tokens"].as_u64().unwrap()).sum();
    // Every target of the whole 32-token windows once (the micro config's seq_len).
    let val_tokens = meta["files"]["val.bin"]["tokens"].as_u64().unwrap();
    assert_eq!(sum, (val_tokens - 1) / 32 * 32);
    // The last evaluation reaches the manifest and the model card.
    let out = tmp.path().join("export");
    run_ok(
        lab()
            .args(["export", "--run"])
            .arg(&run)
            .arg("--output")
            .arg(&out),
    );
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    // A run without a spike still gets its post-mortem page, saying so.
    let pm = std::fs::read_to_string(out.join("spike-postmortem.md")).unwrap();
    assert!(pm.contains("No loss spike was detected"), "{pm}");
    let evaluation = m["final_metrics"]["evaluation"].as_object().unwrap();
    assert!(
        evaluation.contains_key("mc_acc")
            && evaluation
                .keys()
                .filter(|k| k.starts_with("val_loss."))
                .count()
                >= 3,
        "{evaluation:?}"
    );
    let card = std::fs::read_to_string(out.join("MODEL_CARD.md")).unwrap();
    assert!(
        card.contains("| validation loss on ")
            && card.contains("| multiple-choice probe, mc_acc |"),
        "{card}"
    );
}

#[test]
fn an_overfitting_run_stops_early_keeps_its_best_checkpoint_and_exports_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = memorable_data(tmp.path());
    let cfg = micro_config(tmp.path());
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("total_steps = 60", "total_steps = 2000")
        .replace("eval_every = 30", "eval_every = 20")
        + "keep_last = 2\n[eval]\noverfit_evals = 3\n";
    std::fs::write(
        &cfg,
        text.replace(
            "ckpt_every = 10\nkeep_last = 2",
            "ckpt_every = 100\nkeep_last = 2",
        ),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let out = run_ok(&mut train_on(&cfg, &data, &run));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("stopped early"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["state"], "stopped_early");
    let rule = events(&run, "stop_rule");
    assert_eq!(rule.len(), 1);
    assert_eq!(rule[0]["rule"], "overfit");
    // The best checkpoint survived retention, and it is the lowest validation loss logged.
    let best: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("best.json")).unwrap()).unwrap();
    let best_step = best["step"].as_u64().unwrap();
    assert!(
        run.join(format!("step-{best_step:08}")).exists(),
        "best checkpoint kept"
    );
    let vals: Vec<(u64, f64)> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|r| Some((r["step"].as_u64()?, r["val_loss"].as_f64()?)))
        .collect();
    let min = vals.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!((best_step, best["val_loss"].as_f64().unwrap()), *min);
    assert!(
        status["step"].as_u64().unwrap() > best_step + 40,
        "stopped after the evaluations that rose"
    );
    run_ok(
        lab()
            .args(["export", "--checkpoint", "best", "--run"])
            .arg(&run)
            .arg("--output")
            .arg(tmp.path().join("best-export")),
    );
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("best-export/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["checkpoint_step"], best_step);
    assert_eq!(m["final_metrics"]["val_loss"], best["val_loss"]);

    // lab status projects the curve of the finished run.
    let s = json_out(lab().args(["status", "--json", "--run"]).arg(&run));
    assert!(s["projection"]["loss"].as_f64().unwrap().is_finite(), "{s}");
    let half = (status["step"].as_u64().unwrap() / 2).to_string();
    let early = json_out(
        lab()
            .args(["status", "--json", "--fit-until", &half, "--run"])
            .arg(&run),
    );
    let (all, first) = (
        s["projection"]["points"].as_u64().unwrap(),
        early["projection"]["points"].as_u64().unwrap(),
    );
    assert!(
        first >= 4 && first < all,
        "{first} of {all} points up to step {half}"
    );
}
