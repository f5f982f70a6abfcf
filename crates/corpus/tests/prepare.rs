//! The prepare pipeline on real corpora: MedQuAD with every filter, nanoGPT's shakespeare
//! split, determinism across worker counts, restart after a killed run, and a prepare spread
//! over parts that equals one process.

use std::path::{Path, PathBuf};

use lab_corpus::prepare::{prepare, prepare_stage, PrepareConfig, PrepareOutcome, Split, Stage};
use lab_data::{Meta, TokenFile};

fn medquad_config(out: &Path, workers: usize) -> PrepareConfig {
    let mut cfg = PrepareConfig::new(vec![lab_corpus::MEDQUAD_ZST.into()], out.to_path_buf());
    cfg.read.type_field = Some("source".into());
    cfg.split = Split::ValFraction(0.01);
    cfg.workers = workers;
    cfg.clean = true;
    cfg.redact = true;
    cfg.dedup = true;
    cfg.min_tokens = Some(50);
    cfg.max_non_alnum = Some(0.5);
    cfg.decontaminate = vec![lab_corpus::MMLU_MEDICAL.into()];
    cfg
}

fn filter<'m>(meta: &'m Meta, name: &str) -> &'m serde_json::Value {
    meta.filters
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("meta.json has no filter {name}: {:#?}", meta.filters))
}

fn sha(dir: &Path, name: &str) -> String {
    lab_fsio::sha256_file(&dir.join(name)).unwrap()
}

/// Must show 1 and 3: full MedQuAD with dedup + redaction + decontamination, reported per
/// type; and the same bytes with 1 and 2 workers.
#[test]
fn medquad_full_prepare_reports_removals_per_type_and_is_worker_independent() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("w1"), dir.path().join("w2"));
    let out: PrepareOutcome = prepare(medquad_config(&two, 2)).unwrap();
    println!("{}\n{:.1} MB/s", out.report, out.mb_per_s());
    let meta = &out.meta;

    let input = &filter(meta, "read")["input_by_type"];
    let total_docs: u64 = input
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["docs"].as_u64().unwrap())
        .sum();
    assert_eq!(total_docs, 16_407);
    assert_eq!(input.as_object().unwrap().len(), 9, "nine MedQuAD sources");

    // The dedup stages find MedQuAD's shared-boilerplate answers: exact copies plus near
    // copies (mostly GARD's templated answers), 6-7% of all documents after the length filter.
    let near = filter(meta, "dedup-near");
    let near_docs = near["removed_docs"].as_u64().unwrap();
    let exact_docs = filter(meta, "dedup-exact")["removed_docs"]
        .as_u64()
        .unwrap();
    let share = (near_docs + exact_docs) as f64 / total_docs as f64;
    assert!(
        (0.05..0.15).contains(&share),
        "dedup removed {near_docs} + {exact_docs} ({share:.3})"
    );
    assert!(
        near_docs as f64 > 0.025 * total_docs as f64,
        "near-dup removed {near_docs}"
    );
    assert!(
        near["removed_by_type"]["GARD"]["docs"].as_u64().unwrap() > 300,
        "{near}"
    );
    assert!(
        filter(meta, "quality-min-tokens")["removed_docs"]
            .as_u64()
            .unwrap()
            > 0
    );
    let _ = filter(meta, "decontaminate")["removed_docs"]
        .as_u64()
        .unwrap();
    let redact = filter(meta, "redact-phi");
    assert!(
        redact["replaced"]["[PHONE]"].as_u64().unwrap() > 0,
        "{redact}"
    );

    // The files are what meta.json says, and readable by the trainer.
    for name in ["train.bin", "val.bin"] {
        let f = TokenFile::open(&two, name, meta).unwrap();
        assert_eq!(f.len() as u64, meta.files[name].tokens);
        assert_eq!(sha(&two, name), meta.files[name].sha256);
    }
    let val_share = meta.files["val.bin"].tokens as f64 / meta.files["train.bin"].tokens as f64;
    assert!((0.003..0.03).contains(&val_share), "val/train {val_share}");

    prepare(medquad_config(&one, 1)).unwrap();
    for name in ["train.bin", "val.bin", "meta.json"] {
        assert_eq!(
            sha(&one, name),
            sha(&two, name),
            "{name} differs between 1 and 2 workers"
        );
    }
}

#[test]
fn char_split_of_tinyshakespeare_matches_nanogpt() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = PrepareConfig::new(vec![lab_corpus::TINYSHAKESPEARE.into()], dir.path().into());
    cfg.split = Split::Chars {
        train_fraction: 0.9,
    };
    let meta = prepare(cfg).unwrap().meta;
    assert_eq!(meta.files["train.bin"].tokens, 301_966);
    assert_eq!(meta.files["val.bin"].tokens, 36_059);
    // Byte-identical to lab-data's nanoGPT-style prepare that the trainer's default uses.
    let reference = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(lab_corpus::TINYSHAKESPEARE).unwrap();
    let r = lab_data::gpt2::prepare_text(&text, "tinyshakespeare", 0.9, reference.path()).unwrap();
    assert_eq!(meta.files["train.bin"].sha256, r.files["train.bin"].sha256);
    assert_eq!(meta.files["val.bin"].sha256, r.files["val.bin"].sha256);
}

#[test]
fn a_document_copying_an_eval_item_is_dropped_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let mmlu = std::fs::read_to_string(lab_corpus::MMLU_MEDICAL).unwrap();
    let item: serde_json::Value = serde_json::from_str(mmlu.lines().nth(3).unwrap()).unwrap();
    let copied = format!(
        "Practice question. {} Options: {}. Answer below.",
        item["question"].as_str().unwrap(),
        item["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect::<Vec<_>>()
            .join("; ")
    );
    let copied = copied.replace("Options: ", "");
    let input = dir.path().join("docs.jsonl");
    let mut lines: Vec<String> = (0..40)
        .map(|i| serde_json::json!({"text": format!("Ordinary note number {i} about hydration, sleep and exercise for adults of every age.")}).to_string())
        .collect();
    lines.push(serde_json::json!({ "text": copied }).to_string());
    std::fs::write(&input, lines.join("\n")).unwrap();
    let mut cfg = PrepareConfig::new(vec![input], dir.path().join("out"));
    cfg.split = Split::ValFraction(0.2);
    cfg.decontaminate = vec![PathBuf::from(lab_corpus::MMLU_MEDICAL)];
    let meta = prepare(cfg).unwrap().meta;
    let d = filter(&meta, "decontaminate");
    assert_eq!(d["removed_docs"], 1, "{d}");
    assert!(
        d["settings"]["examples"][0]
            .as_str()
            .unwrap()
            .ends_with(":4"),
        "{d}"
    );
}

#[test]
fn a_rerun_after_a_killed_run_starts_over_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut cfg = PrepareConfig::new(vec![lab_corpus::TINYSHAKESPEARE.into()], out.clone());
    cfg.split = Split::Chars {
        train_fraction: 0.9,
    };
    let clean = prepare(cfg.clone()).unwrap().meta;
    // What a kill leaves: temp files from the writers, a train.bin from an older run and
    // (if the kill came between runs) an old meta.json.
    std::fs::write(out.join(".train.bin.tmp-999-0"), b"partial").unwrap();
    std::fs::write(out.join("train.bin"), b"old").unwrap();
    // The trainer refuses the stale train.bin: its size does not match meta.json.
    assert!(TokenFile::open(&out, "train.bin", &clean).is_err());
    let again = prepare(cfg).unwrap().meta;
    assert_eq!(again, clean);
    let leftovers: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

// A prepare spread over N parts (part → dedup → finalize) writes the same bytes as one
// process: MedQuAD with every filter (dedup across parts, redaction, decontamination).

fn staged(out: &Path, stage: Stage) -> PrepareConfig {
    let mut cfg = medquad_config(out, 2);
    cfg.stage = stage;
    cfg
}

fn bytes(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

#[test]
fn parts_then_dedup_then_finalize_equal_one_process_for_n_1_2_3() {
    let tmp = tempfile::tempdir().unwrap();
    let single = tmp.path().join("single");
    prepare(staged(&single, Stage::All)).unwrap();
    for of in 1..=3 {
        let out = tmp.path().join(format!("of{of}"));
        // The parts in reverse order: they are independent.
        for part in (0..of).rev() {
            prepare_stage(staged(&out, Stage::Part { part, of })).unwrap();
        }
        let summary = prepare_stage(staged(&out, Stage::Dedup { of })).unwrap();
        // MedQuAD's boilerplate answers repeat across the parts: the dedup stage sees them.
        assert!(!summary.contains(" 0 duplicates"), "{summary}");
        prepare(staged(&out, Stage::Finalize { of })).unwrap();
        for name in ["train.bin", "val.bin", "meta.json"] {
            assert!(
                bytes(&single, name) == bytes(&out, name),
                "N = {of}: {name} differs"
            );
        }
    }
}

#[test]
fn a_missing_part_or_other_flags_are_refused_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let mut small = staged(&out, Stage::Part { part: 0, of: 2 });
    small.read.max_doc_bytes = 1 << 20;
    prepare_stage(small).unwrap();
    let err = prepare_stage(staged(&out, Stage::Dedup { of: 2 }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("part 0 was made with other flags"), "{err}");
    prepare_stage(staged(&out, Stage::Part { part: 0, of: 2 })).unwrap();
    let err = format!(
        "{:#}",
        prepare_stage(staged(&out, Stage::Dedup { of: 2 })).unwrap_err()
    );
    assert!(err.contains("--stage part --part 1 --of 2"), "{err}");
    let err = match prepare(staged(&out, Stage::Finalize { of: 1 })) {
        Ok(_) => panic!("finalize without its part and dedup decisions"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("--stage part --part 0 --of 1") || err.contains("--stage dedup"),
        "{err}"
    );
    assert!(!out.join("meta.json").exists());
    let err = prepare_stage(staged(&out, Stage::Part { part: 2, of: 2 }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("numbered 0 to N-1"), "{err}");
}
