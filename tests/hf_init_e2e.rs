//! Continued pretraining end to end on the real binary: `lab train --init-from-hf` from a folder
//! `lab export --hf` wrote (the source weights and logits bit for bit), a tokenizer swap (rows
//! copied and composed as recorded), `--freeze-non-embedding-steps`, and one-line errors.

use std::path::{Path, PathBuf};

use crate::common::*;
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use lab_config::LabConfig;
use lab_corpus::tokenize::Tokenizer;
use lab_model::weights::{load_safetensors, load_tensor_map, HostTensor, TensorMap};
use lab_model::Llama;
use serde_json::Value;

/// A 10-step micro run on tinyshakespeare (GPT-2) and its `lab export --hf` folder.
fn source(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let cfg = micro_config(dir);
    let run = dir.join("source");
    run_ok(train_on(&cfg, &data_dir(), &run).args(["--total-steps", "10"]));
    let hf = dir.join("hf");
    run_ok(
        lab()
            .args(["export", "--run"])
            .arg(&run)
            .arg("--hf")
            .arg(&hf),
    );
    (cfg, run, hf)
}

fn weights(path: &Path) -> TensorMap {
    load_safetensors(path).unwrap().0
}

fn checkpoint_file(run: &Path, step: u64, file: &str) -> PathBuf {
    run.join(format!("step-{step:08}")).join(file)
}

fn event(run: &Path, kind: &str) -> Value {
    let first = events(run, kind).into_iter().next();
    first.unwrap_or_else(|| panic!("no {kind} event"))
}

/// The logits of a fixed batch under `tensors`.
fn logits(cfg: &LabConfig, tensors: &TensorMap) -> Vec<f32> {
    let device = Default::default();
    let model = load_tensor_map(Llama::<Flex>::new(&cfg.model, 0, &device), tensors).unwrap();
    let ids: Vec<i32> = (0..32).map(|i| (i * 1543 + 7) % 50257).collect();
    let x = Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids, [2, 16]), &device);
    model.logits(x).into_data().into_vec::<f32>().unwrap()
}

#[test]
fn a_folder_lab_exported_continues_from_the_source_weights_and_logits_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, src, hf) = source(tmp.path());
    let run = tmp.path().join("continued");
    let out = run_ok(
        train_on(&cfg, &data_dir(), &run)
            .arg("--init-from-hf")
            .arg(&hf)
            .args(["--total-steps", "2", "--ckpt-every", "1"]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("same tokenizer as the data: weights as they are"),
        "{stdout}"
    );

    // Step 0 is checkpointed at once: the source's weights, exactly, and no moments yet.
    let source = weights(&final_weights(&src, 10));
    let start = weights(&final_weights(&run, 0));
    assert_eq!(start, source);
    let cfg = LabConfig::load(&cfg).unwrap();
    let (a, b) = (logits(&cfg, &source), logits(&cfg, &start));
    assert_eq!(a.len(), 2 * 16 * 50257);
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(weights(&checkpoint_file(&run, 0, "optimizer.safetensors")).is_empty());
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint_file(&run, 0, "state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["optimizer_updates"], 0);

    // The event names the folder and its file's sha256; no swap.
    let e = event(&run, "init_from_hf");
    assert_eq!(e["step"], 0);
    assert_eq!(
        e["files"]["model.safetensors"],
        sha256(&hf.join("model.safetensors"))
    );
    assert!(e["tokenizer_swap"].is_null(), "{e}");
    // Training went on from there.
    assert_ne!(weights(&final_weights(&run, 2)), source);
}

#[test]
fn frozen_steps_train_only_the_embedding_and_the_head_then_everything_from_t_1() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _, hf) = source(tmp.path());
    let run = tmp.path().join("frozen");
    run_ok(
        train_on(&cfg, &data_dir(), &run)
            .arg("--init-from-hf")
            .arg(&hf)
            .args([
                "--total-steps",
                "3",
                "--ckpt-every",
                "1",
                "--freeze-non-embedding-steps",
                "2",
            ]),
    );
    let step = |s| weights(&final_weights(&run, s));
    let (w0, w2, w3) = (step(0), step(2), step(3));
    for (name, t) in &w2 {
        let trains = name == "embed" || name == "lm_head.weight";
        assert_eq!(*t != w0[name], trains, "{name} after 2 frozen steps");
        assert_ne!(*t, w3[name], "{name} trains at step 3");
    }
    let moments = weights(&checkpoint_file(&run, 2, "optimizer.safetensors"));
    let names: Vec<&str> = moments.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["m.embed", "m.lm_head.weight", "v.embed", "v.lm_head.weight"]
    );
    // The thawed parameters count their own updates: one each, the embedding three.
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint_file(&run, 3, "state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["optimizer_updates"], 3);
    let counts = state["param_updates"].as_object().unwrap();
    assert_eq!(counts.len(), w3.len() - 2, "{counts:?}");
    assert!(counts.values().all(|t| t == 1));
    assert!(!counts.contains_key("embed"));
    let recorded = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        recorded.contains("freeze_non_embedding_steps = 2"),
        "{recorded}"
    );
}

/// Row `i` of a `[rows, d]` matrix.
fn row(t: &HostTensor, i: usize) -> &[f32] {
    let d = t.shape[1];
    &t.data[i * d..(i + 1) * d]
}

/// Column `j` of lab's `[d, vocab]` LM head: the row of token `j`.
fn column(t: &HostTensor, j: usize) -> Vec<f32> {
    let v = t.shape[1];
    (0..t.shape[0]).map(|i| t.data[i * v + j]).collect()
}

fn mean(old: &HostTensor, parts: &[u32]) -> Vec<f32> {
    (0..old.shape[1])
        .map(|k| {
            let s: f64 = parts.iter().map(|&p| row(old, p as usize)[k] as f64).sum();
            (s / parts.len() as f64) as f32
        })
        .collect()
}

#[test]
fn a_tokenizer_swap_copies_shared_rows_composes_new_ones_and_records_the_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _, hf) = source(tmp.path());
    let text = tmp.path().join("shakespeare.txt");
    std::fs::write(&text, lab_data::TINYSHAKESPEARE).unwrap();
    let tok = tmp.path().join("tok600.json");
    run_ok(
        lab()
            .args([
                "tokenizer",
                "train",
                "--quiet",
                "--vocab-size",
                "600",
                "--input",
            ])
            .arg(&text)
            .arg("--output")
            .arg(&tok),
    );
    let data = tmp.path().join("data600");
    run_ok(
        lab()
            .args([
                "data",
                "prepare",
                "--quiet",
                "--split",
                "chars:0.9",
                "--input",
            ])
            .arg(&text)
            .arg("--tokenizer")
            .arg(&tok)
            .arg("--output-dir")
            .arg(&data),
    );
    let cfg600 = tmp.path().join("micro600.toml");
    let text600 = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("vocab_size = 50257", "vocab_size = 600");
    std::fs::write(&cfg600, text600).unwrap();
    let run = tmp.path().join("swapped");
    let out = run_ok(
        train_on(&cfg600, &data, &run)
            .arg("--init-from-hf")
            .arg(&hf)
            .args(["--total-steps", "2"]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("tokenizer swap gpt2 → "), "{stdout}");
    // A perplexity on another tokenizer's tokens is refused, whichever vocabulary is larger.
    let (source_run, gpt2_data) = (tmp.path().join("source"), data_dir());
    for (run, other) in [(&source_run, &data), (&run, &gpt2_data)] {
        let mut eval = lab();
        eval.args(["eval", "--run"])
            .arg(run)
            .arg("--data")
            .arg(other);
        expect_one_line_error(&mut eval, "prepare it with the run's tokenizer");
    }

    let swap = &event(&run, "init_from_hf")["tokenizer_swap"];
    assert_eq!(swap["from"], "gpt2");
    assert_eq!(swap["rows"], 600);
    let count = |k: &str| swap[k].as_u64().unwrap();
    let (copied, composed) = (count("copied"), count("composed"));
    assert_eq!(copied + composed + count("initialised"), 600, "{swap}");
    assert_eq!(count("initialised"), 0, "every id has a token: {swap}");

    let old = weights(&hf.join("model.safetensors"));
    let (old_embed, old_head) = (&old["model.embed_tokens.weight"], &old["lm_head.weight"]);
    let new = weights(&final_weights(&run, 0));
    let (new_embed, new_head) = (&new["embed"], &new["lm_head.weight"]);
    assert_eq!(new_embed.shape, vec![600, 32]);
    let (gpt2, tok) = (
        Tokenizer::gpt2().unwrap(),
        Tokenizer::from_file(&tok).unwrap(),
    );
    let (mut seen_copied, mut seen_composed) = (0, 0);
    for (id, bytes) in tok.token_bytes().into_iter().enumerate() {
        let bytes = bytes.unwrap();
        let expected = if id == tok.eot() as usize {
            row(old_embed, 50256).to_vec() // end-of-text ↔ end-of-text
        } else if let Some(&o) = gpt2.ranks().get(&bytes) {
            seen_copied += 1;
            row(old_embed, o as usize).to_vec()
        } else {
            seen_composed += 1;
            let parts = gpt2.encode(std::str::from_utf8(&bytes).unwrap());
            assert!(parts.len() > 1, "{bytes:?}");
            let head = mean(old_head, &parts);
            assert_eq!(column(new_head, id), head, "head row {id}");
            mean(old_embed, &parts)
        };
        assert_eq!(
            row(new_embed, id),
            expected.as_slice(),
            "row {id} ({bytes:?})"
        );
    }
    assert!(
        seen_copied >= 256,
        "every single byte is in both vocabularies"
    );
    assert!(seen_composed > 0);
    assert_eq!((seen_copied + 1) as u64, copied);
    assert_eq!(seen_composed as u64, composed);

    // The data folder keeps a copy of its tokenizer: generating from the run needs neither
    // the original file nor the folder `data prepare` ran in.
    let tok_file = tmp.path().join("tok600.json");
    std::fs::rename(&tok_file, tok_file.with_extension("moved")).unwrap();
    let out = run_ok(
        lab()
            .current_dir(&data)
            .args([
                "generate",
                "--prompt",
                "ROMEO",
                "--max-new-tokens",
                "4",
                "--run",
            ])
            .arg(&run),
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ROMEO"));
}

#[test]
fn user_mistakes_exit_1_with_one_line_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _, hf) = source(tmp.path());
    let run = tmp.path().join("run");
    let with = |cfg: &Path, dir: &Path| {
        let mut c = train_on(cfg, &data_dir(), &run);
        c.arg("--init-from-hf").arg(dir);
        c
    };
    let variant = |name: &str, from: &str, to: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, std::fs::read_to_string(&cfg).unwrap().replace(from, to)).unwrap();
        p
    };

    let wider = variant("wider.toml", "d_ff = 64", "d_ff = 48");
    expect_one_line_error(
        &mut with(&wider, &hf),
        "config.json intermediate_size = 64 but the training config has model.d_ff = 48",
    );
    let kv = variant("kv.toml", "n_kv_head = 2", "n_kv_head = 4");
    expect_one_line_error(
        &mut with(&kv, &hf),
        "config.json num_key_value_heads = 2 but the training config has model.n_kv_head = 4",
    );
    expect_one_line_error(
        &mut with(&cfg, &tmp.path().join("nowhere")),
        "--init-from-hf",
    );

    // Another vocabulary size and no tokenizer in the folder: no way to map the rows.
    let bare = tmp.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(hf.join(f), bare.join(f)).unwrap();
    }
    let padded = variant("padded.toml", "vocab_size = 50257", "vocab_size = 50304");
    expect_one_line_error(
        &mut with(&padded, &bare),
        "config.json vocab_size = 50257 but the training config has model.vocab_size = 50304, and the folder has no tokenizer",
    );
    expect_one_line_error(
        with(&cfg, &hf).args(["--total-steps", "5", "--freeze-non-embedding-steps", "6"]),
        "train.freeze_non_embedding_steps (6)",
    );
    assert!(!run.exists(), "a refused start wrote nothing");

    // With the tokenizer there, the same padded config loads: every row copied, the padding
    // drawn from the seed.
    let out = run_ok(with(&padded, &hf).args(["--total-steps", "1"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("rows 50257 copied, 0 composed, 47 initialised"),
        "{stdout}"
    );
}
