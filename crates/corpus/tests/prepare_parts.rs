//! A prepare spread over N parts (part → dedup → finalize) writes the same bytes as one
//! process: MedQuAD with every filter (dedup across parts, redaction, decontamination), N = 1, 2, 3.

use std::path::Path;

use lab_corpus::prepare::{prepare, prepare_stage, PrepareConfig, Split, Stage};

fn medquad_config(out: &Path, stage: Stage) -> PrepareConfig {
    let mut cfg = PrepareConfig::new(vec![lab_corpus::MEDQUAD_ZST.into()], out.to_path_buf());
    cfg.read.type_field = Some("source".into());
    cfg.split = Split::ValFraction(0.01);
    cfg.workers = 2;
    cfg.clean = true;
    cfg.redact = true;
    cfg.dedup = true;
    cfg.min_tokens = Some(50);
    cfg.max_non_alnum = Some(0.5);
    cfg.decontaminate = vec![lab_corpus::MMLU_MEDICAL.into()];
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
    prepare(medquad_config(&single, Stage::All)).unwrap();
    for of in 1..=3 {
        let out = tmp.path().join(format!("of{of}"));
        // The parts in reverse order: they are independent.
        for part in (0..of).rev() {
            prepare_stage(medquad_config(&out, Stage::Part { part, of })).unwrap();
        }
        let summary = prepare_stage(medquad_config(&out, Stage::Dedup { of })).unwrap();
        // MedQuAD's boilerplate answers repeat across the parts: the dedup stage sees them.
        assert!(!summary.contains(" 0 duplicates"), "{summary}");
        prepare(medquad_config(&out, Stage::Finalize { of })).unwrap();
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
    let mut small = medquad_config(&out, Stage::Part { part: 0, of: 2 });
    small.read.max_doc_bytes = 1 << 20;
    prepare_stage(small).unwrap();
    let err = prepare_stage(medquad_config(&out, Stage::Dedup { of: 2 }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("part 0 was made with other flags"), "{err}");
    prepare_stage(medquad_config(&out, Stage::Part { part: 0, of: 2 })).unwrap();
    let err = format!(
        "{:#}",
        prepare_stage(medquad_config(&out, Stage::Dedup { of: 2 })).unwrap_err()
    );
    assert!(err.contains("--stage part --part 1 --of 2"), "{err}");
    let err = match prepare(medquad_config(&out, Stage::Finalize { of: 1 })) {
        Ok(_) => panic!("finalize without its part and dedup decisions"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("--stage part --part 0 --of 1") || err.contains("--stage dedup"),
        "{err}"
    );
    assert!(!out.join("meta.json").exists());
    let err = prepare_stage(medquad_config(&out, Stage::Part { part: 2, of: 2 }))
        .unwrap_err()
        .to_string();
    assert!(err.contains("numbered 0 to N-1"), "{err}");
}
