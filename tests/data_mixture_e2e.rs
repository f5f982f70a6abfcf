//! `[data]` mixtures end to end: a run draws its sources to the configured weights, reports
//! each source's epochs, resumes bit-identically, and names an unknown source in one line.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use lab_corpus::reader::{read_documents, ReadOptions};

/// 120 MedQuAD answers from each of three sources, prepared with their source as the type.
fn three_source_data(dir: &Path) -> PathBuf {
    let jsonl = dir.join("three.jsonl");
    let opts = ReadOptions {
        type_field: Some("source".into()),
        ..ReadOptions::default()
    };
    let mut lines = String::new();
    let mut taken = std::collections::BTreeMap::<String, usize>::new();
    for d in read_documents(&[PathBuf::from(lab_corpus::MEDQUAD_ZST)], &opts).unwrap() {
        let n = taken.entry(d.doc_type.clone()).or_default();
        if ["GARD", "GHR", "CDC"].contains(&d.doc_type.as_str()) && *n < 120 {
            *n += 1;
            let line = serde_json::json!({"source": d.doc_type, "text": d.text});
            lines += &format!("{line}\n");
        }
    }
    std::fs::write(&jsonl, lines).unwrap();
    let data = dir.join("data");
    run_ok(
        lab()
            .args([
                "data",
                "prepare",
                "--type-field",
                "source",
                "--val-fraction",
                "0.05",
            ])
            .arg("--input")
            .arg(&jsonl)
            .arg("--output-dir")
            .arg(&data),
    );
    data
}

fn mixture_config(dir: &Path, mixture: &str) -> PathBuf {
    let base = std::fs::read_to_string(micro_config(dir)).unwrap();
    let text = base.replace("total_steps = 60", "total_steps = 20")
        + &format!("[data]\nmixture = {{ {mixture} }}\nmax_epochs = 0.01\n");
    let path = dir.join("mixture.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn train(cfg: &Path, data: &Path, run: &Path) -> Command {
    let mut c = train_on(cfg, data, run);
    c.args(["--ckpt-every", "5"]);
    c
}

fn mixture_event(run: &Path) -> serde_json::Value {
    let first = events(run, "data_mixture").into_iter().next();
    first.expect("a data_mixture event")
}

#[test]
fn a_mixture_draws_to_its_weights_reports_epochs_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let data = three_source_data(tmp.path());
    let cfg = mixture_config(tmp.path(), "GARD = 0.7, GHR = 0.2, CDC = 0.1");
    let a = tmp.path().join("a");
    let out = run_ok(&mut train(&cfg, &data, &a));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("data mixture over 20 steps"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: data source 'GARD' is repeated"),
        "{stderr}"
    );

    // 20 steps × 8 rows = 160 windows, drawn about 0.7 / 0.2 / 0.1 (the sources hold
    // similar token counts, so a uniform draw would give about a third each).
    let event = mixture_event(&a);
    let windows = |name: &str| {
        event["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["source"] == name)
            .unwrap()["windows"]
            .as_u64()
            .unwrap()
    };
    let (gard, ghr, cdc) = (windows("GARD"), windows("GHR"), windows("CDC"));
    assert_eq!(gard + ghr + cdc, 160, "{event}");
    assert!(
        (96..=128).contains(&gard) && (16..=48).contains(&ghr) && cdc <= 32,
        "{event}"
    );

    // Resume from step 10 (the later checkpoints removed): the same final weights.
    let b = tmp.path().join("b");
    run_ok(&mut train(&cfg, &data, &b));
    for step in [15, 20] {
        std::fs::remove_dir_all(b.join(format!("step-{step:08}"))).unwrap();
    }
    run_ok(train(&cfg, &data, &b).arg("--resume-from-latest"));
    assert_eq!(
        sha256(&final_weights(&a, 20)),
        sha256(&final_weights(&b, 20))
    );

    // Another mixture draws other samples.
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let cfg2 = mixture_config(&other, "GARD = 0.1, GHR = 0.2, CDC = 0.7");
    let c = tmp.path().join("c");
    run_ok(&mut train(&cfg2, &data, &c));
    assert_ne!(losses(&a), losses(&c));
}

#[test]
fn an_unknown_source_is_named_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = three_source_data(tmp.path());
    let cfg = mixture_config(tmp.path(), "PubMed = 1.0");
    expect_one_line_error(
        &mut train(&cfg, &data, &tmp.path().join("r")),
        "data source 'PubMed' is not in the prepared data (its sources are: CDC, GARD, GHR)",
    );
    assert!(!tmp.path().join("r").join("step-00000005").exists());
}
