//! Must show 4: a BPE tokenizer trained on MedQuAD has lower fertility than GPT-2 on the
//! medical types (and general English is reported beside them); the fast encoder agrees with
//! HF tokenizers on the trained vocabulary; the chart renders without system fonts.
//!
//! The test trains a 32K vocabulary on a 70% sample of MedQuAD to stay fast; the closing
//! note records the full 64K run through the CLI.

use std::path::{Path, PathBuf};

use lab_corpus::bpe_train::{read_special_tokens, train, TrainConfig};
use lab_corpus::fertility::fertility;
use lab_corpus::reader::ReadOptions;
use lab_corpus::tokenize::Tokenizer;

fn corpora(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpora")
        .join(name)
}

#[test]
fn trained_tokenizer_beats_gpt2_on_medical_text() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("med.json");
    let read = ReadOptions {
        type_field: Some("source".into()),
        ..Default::default()
    };
    let trained = train(&TrainConfig {
        inputs: vec![lab_corpus::MEDQUAD_ZST.into()],
        output: out.clone(),
        read: read.clone(),
        vocab_size: 32_000,
        min_frequency: 2,
        special_tokens: read_special_tokens(&corpora("clinical-sections.txt")).unwrap(),
        sample_bytes: Some(15_000_000),
        seed: 42,
        progress: false,
    })
    .unwrap();
    assert_eq!(trained.vocab_size, 32_000);
    // The sample keeps each type's share of the corpus bytes (within sampling noise).
    let (s, c) = (
        trained.sampled.total().bytes as f64,
        trained.corpus.total().bytes as f64,
    );
    assert!((0.6..0.8).contains(&(s / c)), "sampled {s} of {c}");
    for (ty, count) in &trained.corpus.0 {
        let share_corpus = count.bytes as f64 / c;
        let share_sample = trained.sampled.0[ty].bytes as f64 / s;
        assert!(
            (share_sample - share_corpus).abs() < 0.02 + 0.2 * share_corpus,
            "{ty}: {share_sample} vs {share_corpus}"
        );
    }

    let tok = Tokenizer::from_file(&out).unwrap();
    assert_eq!(tok.encode("<pad><s></s><unk>"), vec![0, 1, 2, 3]);
    assert_eq!(tok.eot(), 2, "</s> joins documents");
    let history = tok.encode("[HISTORY]");
    assert_eq!(history.len(), 1, "a section header is one token");
    assert_eq!(
        tok.encode("x [HISTORY] y")
            .iter()
            .filter(|&&t| t == history[0])
            .count(),
        1
    );

    // The fast encoder gives HF's tokens on held-out text.
    let hf = tokenizers::Tokenizer::from_file(&out).unwrap();
    let raw = zstd::decode_all(std::fs::File::open(lab_corpus::MEDQUAD_ZST).unwrap()).unwrap();
    let texts: Vec<String> = String::from_utf8(raw)
        .unwrap()
        .lines()
        .step_by(40)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let same = texts
        .iter()
        .filter(|t| hf.encode(t.as_str(), false).unwrap().get_ids() == tok.encode(t).as_slice())
        .count();
    assert_eq!(
        same,
        texts.len(),
        "fast encoder differs from HF on {} of {} docs",
        texts.len() - same,
        texts.len()
    );

    let report = fertility(
        &[
            lab_corpus::MEDQUAD_ZST.into(),
            lab_corpus::TINYSHAKESPEARE.into(),
        ],
        &read,
        &["gpt2".into(), out.display().to_string()],
        Some(&corpora("medical-terms.txt")),
    )
    .unwrap();
    println!("{}", report.table());
    let row = |ty: &str| report.rows.iter().find(|r| r.doc_type == ty).unwrap();
    for ty in [
        "GARD",
        "GHR",
        "CancerGov",
        "NIDDK",
        "NINDS",
        "NHLBI",
        "MPlusHealthTopics",
    ] {
        let r = row(ty);
        assert!(
            r.fertility(1) < r.fertility(0),
            "{ty}: trained {} vs gpt2 {}",
            r.fertility(1),
            r.fertility(0)
        );
    }
    let terms = report.terms.as_ref().unwrap();
    assert!(terms.fertility(1) < terms.fertility(0));
    // General English is reported too (and a medical vocabulary has no edge there).
    let shakespeare = row("tinyshakespeare");
    assert_eq!(shakespeare.docs, 1);
    assert!(shakespeare.fertility(1) > shakespeare.fertility(0));

    let png = dir.path().join("fertility.png");
    lab_corpus::chart::fertility_chart(&report, &png).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        bytes.len() > 10_000,
        "chart has content ({} bytes)",
        bytes.len()
    );
}
