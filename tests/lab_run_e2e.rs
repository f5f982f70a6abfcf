//! `lab run` and what it leaves, on a micro lab page: the export and its evidence, the
//! Definition-of-Done checker on good and crafted bad runs, Hugging Face and MLflow layouts,
//! `lab status`, and a kill -9 at each stage followed by a rerun that finishes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const EXPORT: &str = "experiments/micro/seed-42";
const RUN: &str = "runs/lab-micro";

fn lab_run(dir: &Path) -> Command {
    let mut c = lab();
    c.args(["run", "page.toml"]).current_dir(dir);
    c
}

/// A finished micro lab, run once per test process and shared by the tests that read it and
/// export from it, each into a folder of its own (seven tests, ~8 s of CPU a lab). It lives
/// under cargo's per-build temporary folder, named by the process id; the labs of processes
/// that are gone (earlier runs) are removed first, so only the last processes' labs stay
/// behind (one under `cargo test`; under nextest, those still running when the last started).
fn finished_lab() -> &'static Path {
    static LAB: OnceLock<PathBuf> = OnceLock::new();
    LAB.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("finished-micro-labs");
        remove_labs_of_gone_processes(&root);
        let dir = root.join(std::process::id().to_string());
        // A reused id's lab from an earlier run would be resumed, not run afresh.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        micro_lab(&dir);
        let out = run_ok(&mut lab_run(&dir));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("PASS: 8 of 8 checks pass"), "{text}");
        dir
    })
}

fn remove_labs_of_gone_processes(root: &Path) {
    for lab in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if !Path::new("/proc").join(lab.file_name()).exists() {
            let _ = std::fs::remove_dir_all(lab.path());
        }
    }
}

fn dod(dir: &Path, export: &Path, spec: &Path, format: &str) -> Output {
    lab()
        .args(["dod", "check"])
        .arg(export)
        .arg("--spec")
        .arg(spec)
        .args(["--format", format])
        .current_dir(dir)
        .output()
        .unwrap()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_export_holds_every_artifact_and_metrics_csv_equals_metrics_jsonl() {
    let lab = finished_lab();
    let export = lab.join(EXPORT);
    for f in [
        "manifest.json",
        "metrics.csv",
        "loss-curve.png",
        "gradnorm-curve.png",
        "throughput.png",
        "final.safetensors",
        "spike-postmortem.md",
        "MODEL_CARD.md",
        "run-uri.txt",
        "events.jsonl",
        "config.toml",
    ] {
        assert!(export.join(f).is_file(), "{f} missing");
    }
    for png in ["loss-curve.png", "gradnorm-curve.png", "throughput.png"] {
        let (ink, colors) = png_ink(&export.join(png));
        assert!(
            ink > 0.02 && colors > 8,
            "{png} looks blank: {ink} ink, {colors} colours"
        );
    }
    // Every artifact's sha256 is in the manifest, and right.
    let m = json(&export.join("manifest.json"));
    let artifacts = m["artifacts"].as_object().unwrap();
    assert!(artifacts.len() >= 12);
    for (name, sha) in artifacts {
        assert_eq!(&sha256(&export.join(name)), sha.as_str().unwrap(), "{name}");
    }
    assert_eq!(m["seed"], 42);
    assert_eq!(m["stability"]["spikes_detected"], 1);
    // The cluster spec: the embedded lab is a job of one process.
    let job = &m["hardware"]["cluster"];
    assert_eq!(
        (
            &job["world_size"],
            &job["nodes"],
            &job["engine"],
            &job["zero"]
        ),
        (&1.into(), &1.into(), &"single".into(), &0.into()),
        "{job}"
    );
    let card = std::fs::read_to_string(export.join("MODEL_CARD.md")).unwrap();
    assert!(card.contains("not a medical device") && card.contains("tinyshakespeare"));

    // metrics.csv: every number of metrics.jsonl, in order, exactly.
    let rows: Vec<Value> = std::fs::read_to_string(lab.join(RUN).join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut expected = Vec::new();
    for r in &rows {
        for (k, v) in r.as_object().unwrap() {
            if let Some(x) = v.as_f64().filter(|_| k != "step") {
                expected.push((r["step"].as_u64().unwrap(), k.clone(), x));
            } else if v == &Value::Bool(true) {
                expected.push((r["step"].as_u64().unwrap(), k.clone(), 1.0));
            }
        }
    }
    let mut got: Vec<(u64, String, f64)> = csv_rows(&export.join("metrics.csv"));
    expected.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    got.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g, e, "metrics.csv differs from metrics.jsonl");
    }
}

fn csv_rows(path: &Path) -> Vec<(u64, String, f64)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("step,name,value"));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[0].parse().unwrap(),
                f[1].to_string(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn final_weights_reload_byte_for_byte_and_are_the_weights_the_val_loss_was_measured_on() {
    use burn::backend::Flex;
    use lab_model::{weights, Llama};

    let done = finished_lab();
    let path = done.join(EXPORT).join("final.safetensors");
    let (tensors, meta) = weights::load_safetensors(&path).unwrap();
    let resaved = done.join("resaved.safetensors");
    weights::save_safetensors(&resaved, &tensors, meta).unwrap();
    assert_eq!(
        std::fs::read(&resaved).unwrap(),
        std::fs::read(&path).unwrap()
    );

    // The shipped weights give exactly the validation loss the manifest reports (the trainer's
    // own evaluation on the same windows): they are the weights that were evaluated.
    let cfg = lab_config::LabConfig::load(&done.join("micro.toml")).unwrap();
    let model = weights::load_tensor_map(
        Llama::<Flex>::new(&cfg.model, 7, &Default::default()),
        &tensors,
    )
    .unwrap();
    let data = done.join("runs/data/tinyshakespeare-gpt2");
    let meta = lab_data::Meta::load(&data).unwrap();
    let val = lab_data::TokenFile::open(&data, "val.bin", &meta).unwrap();
    let loss = lab_train::eval::evaluate(&model, &val, &cfg).unwrap();
    let m = json(&done.join(EXPORT).join("manifest.json"));
    assert_eq!(m["final_metrics"]["val_loss"].as_f64(), Some(loss));
    assert_eq!(
        (
            m["final_metrics"]["val_step"].as_u64(),
            m["checkpoint_step"].as_u64()
        ),
        (Some(60), Some(60))
    );
}

#[test]
fn exporting_an_earlier_checkpoint_fails_the_completed_check() {
    let done = finished_lab();
    run_ok(
        lab()
            .args([
                "export",
                "--run",
                RUN,
                "--output",
                "early",
                "--checkpoint",
                "40",
            ])
            .current_dir(done),
    );
    let out = dod(done, &done.join("early"), &done.join("dod.toml"), "json");
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "completed")
        .unwrap()
        .clone();
    assert_eq!(c["passed"], false, "{c}");
    assert!(
        c["found"].as_str().unwrap().contains("weights of step 40"),
        "{c}"
    );
    // The loss check reads metrics.csv's row of step 40, not the run's last evaluation.
    let val = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "final-val-loss")
        .unwrap();
    assert!(
        !val["found"].as_str().unwrap().contains("metrics.csv"),
        "{val}"
    );
}

#[test]
fn a_lab_whose_spike_is_rolled_back_still_passes_its_dod() {
    let dir = tempfile::tempdir().unwrap();
    let page = micro_lab(dir.path());
    let text = std::fs::read_to_string(&page).unwrap().replace(
        "spike_batches = 5",
        "spike_batches = 2\nspike_policy = \"rollback\"",
    );
    std::fs::write(&page, text).unwrap();
    let out = run_ok(&mut lab_run(dir.path()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("PASS: 8 of 8 checks pass"), "{stdout}");
    assert!(
        stdout.contains("confirmed: step 30 (loss_spike"),
        "{stdout}"
    );
}

#[test]
fn dod_fails_each_crafted_bad_run_with_a_precise_message() {
    let dir = finished_lab();
    let good = dir.join(EXPORT);
    let spec = dir.join("dod.toml");
    assert_eq!(dod(dir, &good, &spec, "text").status.code(), Some(0));

    // JUnit XML parses and names every check.
    let out = dod(dir, &good, &spec, "junit");
    let xml = String::from_utf8(out.stdout).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let cases: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|n| n.attribute("name").unwrap())
        .collect();
    assert_eq!(
        cases,
        [
            "manifest",
            "artifacts",
            "completed",
            "final-val-loss",
            "final-weights",
            "spend",
            "spike-postmortem",
            "termination"
        ]
    );
    assert_eq!(
        doc.descendants()
            .filter(|n| n.has_tag_name("failure"))
            .count(),
        0
    );

    let copy = |name: &str| -> PathBuf {
        let to = dir.join("bad").join(name);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        to
    };
    let edit_manifest = |d: &Path, f: &dyn Fn(&mut Value)| {
        let mut m = json(&d.join("manifest.json"));
        f(&mut m);
        std::fs::write(d.join("manifest.json"), m.to_string()).unwrap();
    };
    // `check` fails, saying `needle`; so does `artifacts` where a listed file was edited.
    let fails_with = |d: &Path, spec: &Path, check: &str, needle: &str, edited: bool| {
        let out = dod(dir, d, spec, "json");
        assert_eq!(out.status.code(), Some(1), "{check} should fail");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let c = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == check)
            .unwrap()
            .clone();
        assert_eq!(c["passed"], false, "{c}");
        assert!(
            c["found"].as_str().unwrap().contains(needle),
            "{check}: {c}"
        );
        assert!(
            !c["expected"].as_str().unwrap().is_empty() && !c["why"].as_str().unwrap().is_empty()
        );
        let failed: Vec<&str> = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["passed"] == false)
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        let want = if edited {
            vec!["artifacts", check]
        } else {
            vec![check]
        };
        assert_eq!(failed, want, "{v}");
    };
    let fails = |d: &Path, spec: &Path, check: &str, needle: &str| {
        fails_with(d, spec, check, needle, false)
    };
    let fails_edited =
        |d: &Path, check: &str, needle: &str| fails_with(d, &spec, check, needle, true);

    let d = copy("no-seed");
    edit_manifest(&d, &|m| {
        m.as_object_mut().unwrap().remove("seed");
    });
    fails(&d, &spec, "manifest", "missing: seed");

    let narrow = dir.join("narrow.toml");
    std::fs::write(
        &narrow,
        std::fs::read_to_string(&spec)
            .unwrap()
            .replace("min = 6.5", "min = 1.0")
            .replace("max = 8.5", "max = 2.0"),
    )
    .unwrap();
    fails(&copy("band"), &narrow, "final-val-loss", "7.");

    let d = copy("flipped");
    let mut bytes = std::fs::read(d.join("final.safetensors")).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0x01;
    std::fs::write(d.join("final.safetensors"), bytes).unwrap();
    fails_edited(&d, "final-weights", "but the manifest says");

    let d = copy("spent");
    edit_manifest(&d, &|m| m["cost"]["total_usd"] = 1.5.into());
    fails(&d, &spec, "spend", "$1.5000");

    let d = copy("no-postmortem");
    std::fs::remove_file(d.join("spike-postmortem.md")).unwrap();
    fails_edited(&d, "spike-postmortem", "no spike-postmortem.md");

    let d = copy("wrong-step");
    let md = std::fs::read_to_string(d.join("spike-postmortem.md")).unwrap();
    std::fs::write(
        d.join("spike-postmortem.md"),
        md.replace("## Spike at step 30", "## Spike at step 12"),
    )
    .unwrap();
    fails_edited(&d, "spike-postmortem", "step 12");

    // Files the manifest lists, gone or edited after the export.
    let d = copy("tampered");
    std::fs::remove_file(d.join("throughput.png")).unwrap();
    let card = std::fs::read_to_string(d.join("MODEL_CARD.md")).unwrap();
    std::fs::write(d.join("MODEL_CARD.md"), card + "Edited.\n").unwrap();
    fails(
        &d,
        &spec,
        "artifacts",
        "MODEL_CARD.md changed, throughput.png missing",
    );
}

#[test]
fn hugging_face_folder_has_llama_config_names_and_shapes() {
    let done = finished_lab();
    let hf = done.join("hf");
    run_ok(
        lab()
            .args(["export", "--run", RUN, "--hf", "hf"])
            .current_dir(done),
    );
    let c = json(&hf.join("config.json"));
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    for (k, v) in [
        ("num_key_value_heads", 2.0),
        ("num_attention_heads", 4.0),
        ("head_dim", 8.0),
        ("hidden_size", 32.0),
        ("intermediate_size", 64.0),
        ("rope_theta", 10000.0),
        ("rms_norm_eps", 1e-5),
    ] {
        assert_eq!(c[k].as_f64(), Some(v), "{k}");
    }
    assert_eq!(c["tie_word_embeddings"], false);
    assert_eq!(c["torch_dtype"], "float32");
    let (tensors, meta) =
        lab_model::weights::load_safetensors(&hf.join("model.safetensors")).unwrap();
    assert_eq!(meta.get("format").map(String::as_str), Some("pt"));
    let shape = |n: &str| tensors[n].shape.clone();
    assert_eq!(shape("model.embed_tokens.weight"), [50257, 32]);
    assert_eq!(shape("lm_head.weight"), [50257, 32]);
    assert_eq!(shape("model.layers.1.self_attn.q_proj.weight"), [32, 32]);
    assert_eq!(shape("model.layers.1.self_attn.k_proj.weight"), [16, 32]);
    assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), [32, 64]);
    assert_eq!(shape("model.layers.0.input_layernorm.weight"), [32]);
    assert_eq!(shape("model.norm.weight"), [32]);
    assert_eq!(tensors.len(), 1 + 2 * 9 + 2);
    for f in [
        "generation_config.json",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "lab_parity.json",
    ] {
        assert!(hf.join(f).is_file(), "{f}");
    }
    let parity = json(&hf.join("lab_parity.json"));
    assert_eq!(parity["greedy_ids"].as_array().unwrap().len(), 20);
}

#[test]
fn mlflow_file_store_layout_is_written() {
    let done = finished_lab();
    run_ok(
        lab()
            .args([
                "export",
                "--run",
                RUN,
                "--output",
                "again",
                "--mlflow-uri",
                "mlruns",
            ])
            .current_dir(done),
    );
    let root = done.join("mlruns");
    assert!(root.join(".trash").is_dir() && root.join("0/meta.yaml").is_file());
    let exp = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            std::fs::read_to_string(p.join("meta.yaml"))
                .is_ok_and(|m| m.contains("name: \"micro\""))
        })
        .expect("experiment micro");
    let run = std::fs::read_dir(&exp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("meta.yaml").is_file())
        .unwrap();
    let meta = std::fs::read_to_string(run.join("meta.yaml")).unwrap();
    assert!(
        meta.contains("status: 3") && meta.contains("run_name: \"lab-micro\""),
        "{meta}"
    );
    for sub in ["metrics", "params", "artifacts", "tags"] {
        assert!(run.join(sub).is_dir(), "{sub}");
    }
    assert_eq!(
        std::fs::read_to_string(run.join("params/train.seed")).unwrap(),
        "42"
    );
    let loss = std::fs::read_to_string(run.join("metrics/loss")).unwrap();
    let first: Vec<&str> = loss.lines().next().unwrap().split(' ').collect();
    assert_eq!(first.len(), 3, "<ms> <value> <step>");
    assert!(first[0].parse::<i64>().unwrap() > 1_700_000_000_000 && first[2] == "5");
    assert!(run.join("artifacts/manifest.json").is_file());
}

#[test]
fn status_reads_a_run_in_progress_and_a_finished_one() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    let mut child = train_on(&cfg, &data_dir(), &run)
        .args(["--total-steps", "100000", "--log-every", "1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let metrics = run.join("metrics.jsonl");
    assert!(
        wait_until(&mut child, &|| line_count(&metrics) >= 12),
        "run ended early"
    );
    let out = run_ok(lab().args(["status", "--json", "--run"]).arg(&run));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["state"], "running");
    assert!(s["step"].as_u64().unwrap() >= 1 && s["total_steps"] == 100000);
    assert!(s["loss_trend"].is_f64() && s["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(s["eta_s"].as_f64().unwrap() > 0.0);
    let text = String::from_utf8(run_ok(lab().args(["status", "--run"]).arg(&run)).stdout).unwrap();
    assert!(text.contains("(running)") && text.contains("ETA"), "{text}");
    child.kill().unwrap();
    child.wait().unwrap();
    // Killed: status.json still says running, but nobody holds the run folder.
    let s: Value =
        serde_json::from_slice(&run_ok(lab().args(["status", "--json", "--run"]).arg(&run)).stdout)
            .unwrap();
    assert_eq!(s["state"], "stopped (process gone)");
    // status.json ahead of the last logged row (a stop between logs): tokens at its step.
    let text = std::fs::read_to_string(&metrics).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let (row_step, row_tokens) = (
        last["step"].as_u64().unwrap(),
        last["tokens"].as_f64().unwrap(),
    );
    let mut st = json(&run.join("status.json"));
    st["step"] = (row_step + 3).into();
    std::fs::write(run.join("status.json"), st.to_string()).unwrap();
    let s: Value =
        serde_json::from_slice(&run_ok(lab().args(["status", "--json", "--run"]).arg(&run)).stdout)
            .unwrap();
    let want = row_tokens * (row_step + 3) as f64 / row_step as f64;
    assert!(
        (s["tokens"].as_f64().unwrap() / want - 1.0).abs() < 1e-9,
        "{s}"
    );

    let done = tmp.path().join("done");
    run_ok(train_on(&cfg, &data_dir(), &done).args(["--inject-spike-at-step", "30"]));
    let s: Value = serde_json::from_slice(
        &run_ok(lab().args(["status", "--json", "--run"]).arg(&done)).stdout,
    )
    .unwrap();
    assert_eq!(s["state"], "done");
    assert_eq!(
        (s["step"].as_u64(), s["percent"].as_f64()),
        (Some(60), Some(100.0))
    );
    assert!(s["recent"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "spike_detected"));
    assert!(s["eta_s"].is_null());

    // A damaged status.json is named as damaged, not as missing.
    std::fs::write(done.join("status.json"), "{\"step\":").unwrap();
    let out = lab().args(["status", "--run"]).arg(&done).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("status.json") && !stderr.contains("no status.json"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");

    // A refresh interval no sleep can take is a usage error, not a panic.
    for interval in ["inf", "NaN", "0"] {
        let mut c = lab();
        c.args(["status", "--watch", "--interval", interval, "--run"])
            .arg(&done);
        expect_usage_error(&mut c, "--interval");
    }
}

/// Processes whose command line mentions `needle` (orphans would keep billing files fresh).
fn processes_mentioning(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(needle))
        .count()
}

#[test]
fn kill_9_at_each_stage_then_lab_run_again_finishes_and_passes() {
    let reference = finished_lab();
    let want = sha256(&reference.join(EXPORT).join("final.safetensors"));
    let dir = tempfile::tempdir().unwrap();
    micro_lab(dir.path());
    let run = dir.path().join(RUN);
    // Kill points: the trainer started (budget.json), a checkpoint mid-run, training done
    // (post-mortem/export under way).
    let stages: [(&str, &dyn Fn() -> bool); 3] = [
        ("training started", &|| run.join("budget.json").exists()),
        ("checkpoint 40", &|| run.join("step-00000040").exists()),
        ("training done", &|| {
            std::fs::read_to_string(run.join("status.json")).is_ok_and(|s| s.contains("\"done\""))
        }),
    ];
    for (what, reached) in stages {
        let mut child = lab_run(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Finished before the kill point is fine too: the next rerun must still pass.
        let _reached = wait_until(&mut child, reached);
        child.kill().unwrap();
        child.wait().unwrap();
        // The billing sidecar died with its parent.
        let mut left = processes_mentioning(&run.join("budget.json").display().to_string());
        for _ in 0..100 {
            if left == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            left = processes_mentioning(&run.join("budget.json").display().to_string());
        }
        assert_eq!(left, 0, "an orphan sidecar after killing at {what}");
    }
    let out = run_ok(&mut lab_run(dir.path()));
    assert!(String::from_utf8_lossy(&out.stdout).contains("PASS: 8 of 8 checks pass"));
    assert_eq!(
        sha256(&dir.path().join(EXPORT).join("final.safetensors")),
        want,
        "resumed = uninterrupted"
    );
}

/// Where to export is a usage question: neither --output nor --hf exits 2 with clap's usage
/// line naming both, before the run folder is read.
#[test]
fn export_without_a_destination_is_a_usage_error() {
    let out = lab()
        .args(["export", "--run", "/nonexistent/run"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--output") && stderr.contains("--hf"),
        "{stderr}"
    );
    assert!(!stderr.contains("nonexistent"), "{stderr}");
}

/// A page whose data dir is not prepared yet names its corpus in `[run.prepare]`: `lab run`
/// runs `lab data prepare` with those flags into `[run] data`, then the lab as usual; the
/// next dry run finds the data prepared. Bad flags there are one line before anything runs.
#[test]
fn a_page_with_run_prepare_goes_from_raw_text_to_a_passing_dod() {
    let dir = tempfile::tempdir().unwrap();
    let page = micro_lab(dir.path());
    let text =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/data/corpora/tinyshakespeare.txt");
    let micro = std::fs::read_to_string(&page).unwrap();
    let with_prepare = |args: &str| {
        micro.replace("data = \"tinyshakespeare\"", "data = \"data/shakespeare\"")
            + &format!("[run.prepare]\nargs = [{args}]\n")
    };
    let good = format!(
        "\"--input\", {:?}, \"--split\", \"chars:0.9\", \"--quiet\"",
        text.display().to_string()
    );

    std::fs::write(&page, with_prepare("\"--inputt\", \"x\"")).unwrap();
    expect_one_line_error(
        &mut lab_run(dir.path()),
        "[run.prepare] args: unexpected argument '--inputt'",
    );
    assert!(!dir.path().join("runs").exists(), "nothing trained");
    for (args, needle) in [
        (
            "",
            "[run.prepare] args: the following required arguments were not provided: --input",
        ),
        (
            "\"-o\", \"elsewhere\"",
            "[run.prepare] args: -o has no place here",
        ),
    ] {
        std::fs::write(&page, with_prepare(args)).unwrap();
        expect_one_line_error(&mut lab_run(dir.path()), needle);
    }
    // A flag's value of the wrong form is the page's error (exit 1), not a usage error.
    std::fs::write(
        &page,
        with_prepare("\"--input\", \"x\", \"--split\", \"half\""),
    )
    .unwrap();
    expect_one_line_error(&mut lab_run(dir.path()), "[run.prepare] args: --split half");
    // toml's two-line message about a page stays one line.
    std::fs::write(&page, with_prepare("") + "[run.prepare]\nargs = []\n").unwrap();
    expect_one_line_error(
        &mut lab_run(dir.path()),
        "invalid table header; duplicate key",
    );

    std::fs::write(&page, with_prepare(&good)).unwrap();
    let dry = run_ok(lab_run(dir.path()).arg("--dry-run"));
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains("(lab data prepare --input"),
        "{}",
        String::from_utf8_lossy(&dry.stdout)
    );
    let out = run_ok(&mut lab_run(dir.path()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("PASS: 8 of 8 checks pass"), "{stdout}");
    // The same tokens as the bundled corpus `data = "tinyshakespeare"` prepares.
    let prepared = dir.path().join("data/shakespeare");
    let bundled = dir.path().join("bundled");
    lab_data::gpt2::ensure_tinyshakespeare(&bundled).unwrap();
    for f in ["train.bin", "val.bin"] {
        assert_eq!(sha256(&prepared.join(f)), sha256(&bundled.join(f)), "{f}");
    }
    let dry = run_ok(lab_run(dir.path()).arg("--dry-run"));
    assert!(String::from_utf8_lossy(&dry.stdout).contains("data/shakespeare (prepared)"));
    // A data dir whose meta.json does not load is reported, never prepared over.
    let train_bin = std::fs::metadata(prepared.join("train.bin"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::write(prepared.join("meta.json"), "{").unwrap();
    expect_one_line_error(&mut lab_run(dir.path()), "meta.json");
    let after = std::fs::metadata(prepared.join("train.bin"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(train_bin, after);
}

#[test]
fn an_export_replaces_only_an_earlier_export_and_never_the_users_files() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = micro_config(tmp.path());
    let run = tmp.path().join("run");
    run_ok(train_on(&cfg, &data_dir(), &run).args(["--total-steps", "10"]));
    let export = |out: &Path, flag: &str| {
        let mut c = lab();
        c.current_dir(tmp.path())
            .args(["export", "--run"])
            .arg(&run)
            .arg(flag)
            .arg(out);
        c
    };
    let listing = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };

    // The run folder itself, a folder of notes, a file, the working folder: refused, untouched.
    let run_files = listing(&run);
    expect_one_line_error(&mut export(&run, "--output"), "is not an earlier export");
    assert_eq!(listing(&run), run_files);
    let notes = tmp.path().join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("todo.txt"), "mine").unwrap();
    for flag in ["--output", "--hf"] {
        expect_one_line_error(&mut export(&notes, flag), "is not an earlier export");
    }
    assert_eq!(
        std::fs::read_to_string(notes.join("todo.txt")).unwrap(),
        "mine"
    );
    let file = tmp.path().join("file.txt");
    std::fs::write(&file, "mine").unwrap();
    expect_one_line_error(&mut export(&file, "--output"), "is a file");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    expect_one_line_error(&mut export(Path::new("."), "--output"), "names no folder");
    let litter: Vec<_> = listing(tmp.path())
        .into_iter()
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(litter.is_empty(), "{litter:?}");

    // Another tool's manifest.json does not make a folder an export.
    let site = tmp.path().join("site");
    std::fs::create_dir(&site).unwrap();
    std::fs::write(site.join("manifest.json"), r#"{"name": "my web app"}"#).unwrap();
    expect_one_line_error(&mut export(&site, "--output"), "is not an earlier export");
    assert!(site.join("manifest.json").is_file());

    // Both destinations are checked before either is written.
    let out = tmp.path().join("out");
    let mut both = export(&out, "--output");
    both.arg("--hf").arg(&notes);
    expect_one_line_error(&mut both, "is not an earlier export");
    assert!(!out.exists());
    // A --budget file that is missing, or holds no spend, is refused, not recorded as none.
    for budget in [tmp.path().join("missing.json"), file.clone()] {
        let mut c = export(&out, "--output");
        c.arg("--budget").arg(&budget);
        expect_one_line_error(&mut c, "--budget");
    }
    assert!(!out.exists());

    // An earlier export, and an empty folder, are replaced; so is an earlier HF folder.
    std::fs::create_dir(&out).unwrap();
    run_ok(&mut export(&out, "--output"));
    run_ok(&mut export(&out, "--output"));
    assert!(out.join("manifest.json").is_file());
    let hf = tmp.path().join("hf");
    run_ok(&mut export(&hf, "--hf"));
    run_ok(&mut export(&hf, "--hf"));
    assert!(hf.join("lab_parity.json").is_file());
}

#[test]
fn a_lab_page_naming_a_missing_config_or_an_unknown_backend_fails_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let page = std::fs::read_to_string(micro_lab(tmp.path())).unwrap();
    for (from, to, needle) in [
        (
            "config = \"micro.toml\"",
            "config = \"nope.toml\"",
            "config = \"nope.toml\"",
        ),
        (
            "[run.budget]",
            "backend = \"tpu\"\n[run.budget]",
            "backend = \"tpu\" is unknown",
        ),
    ] {
        std::fs::write(tmp.path().join("page.toml"), page.replace(from, to)).unwrap();
        expect_one_line_error(&mut lab_run(tmp.path()), needle);
        assert!(!tmp.path().join("runs").exists(), "{needle}: work was done");
    }
    // A page's TOML mistake names its line.
    std::fs::write(
        tmp.path().join("page.toml"),
        page.replace("cap_usd = 1.0", "cap_usd = \"one\""),
    )
    .unwrap();
    expect_one_line_error(&mut lab_run(tmp.path()), "`cap_usd = \"one\"`");
}

#[test]
fn dod_check_on_a_folder_without_a_manifest_is_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("dod.toml");
    std::fs::write(&spec, include_str!("../configs/dod/tiny-cpu.toml")).unwrap();
    expect_one_line_error(
        lab()
            .args(["dod", "check"])
            .arg(tmp.path())
            .arg("--spec")
            .arg(&spec),
        "is not an export folder (no manifest.json)",
    );
}

#[test]
fn an_export_passed_where_a_run_folder_belongs_is_named_as_one() {
    let done = finished_lab();
    let export = done.join(EXPORT);
    let mut eval = lab();
    eval.args(["eval", "--run"]).arg(&export);
    expect_one_line_error(&mut eval, "is an export, not a run folder");
    let mut compare = lab();
    compare
        .current_dir(done)
        .args(["compare", "--output", "unused.png", "--run"])
        .arg(format!("a={}", export.display()));
    expect_one_line_error(&mut compare, "holds no metrics.jsonl rows");
    assert!(!done.join("unused.png").exists());
}
