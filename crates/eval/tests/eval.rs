//! Perplexity by document type adds up; multiple-choice scores equal a direct computation.

use std::collections::BTreeMap;

use burn::backend::Flex;
use burn::tensor::{activation::log_softmax, Int, Tensor, TensorData};
use lab_config::ModelConfig;
use lab_corpus::tokenize::Tokenizer;
use lab_data::{meta::push_span, Meta, TokenDtype, TokenFile, TokenWriter};
use lab_eval::mc::{self, McItem, McOptions};
use lab_model::Llama;

type B = Flex;

fn model() -> Llama<B> {
    let cfg = ModelConfig {
        init_std: 0.05,
        ..ModelConfig::llama(50257, 1, 32, 4, 2, 48, 24)
    };
    Llama::new(&cfg, 5, &Default::default())
}

/// log p(tokens[i+1] | tokens[..=i]) summed over `from..`, from full logits in f64.
fn direct_loglik(model: &Llama<B>, ids: &[u32], from: usize) -> f64 {
    let x: Vec<i32> = ids[..ids.len() - 1].iter().map(|&t| t as i32).collect();
    let t = Tensor::<B, 2, Int>::from_data(
        TensorData::new(x.clone(), [1, x.len()]),
        &Default::default(),
    );
    let logp: Vec<f32> = log_softmax(model.logits(t), 2)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap();
    let v = 50257;
    (from..ids.len() - 1)
        .map(|i| logp[i * v + ids[i + 1] as usize] as f64)
        .sum()
}

#[test]
fn multiple_choice_scores_equal_a_direct_computation() {
    let model = model();
    let tok = Tokenizer::gpt2().unwrap();
    let items = vec![
        McItem {
            context: "The cat sat on the".into(),
            choices: vec![" mat".into(), " moon and the stars".into()],
            answer: 0,
        },
        McItem {
            context: "Question: 2 + 2?\nAnswer:".into(),
            choices: vec![" 3".into(), " 4".into(), " five".into()],
            answer: 1,
        },
    ];
    // Batches of 2 sequences: padding shares batches between items of different lengths.
    let opts = McOptions {
        shots: 0,
        dev: None,
        limit: None,
        batch_rows: 2,
    };
    let (report, scores) = mc::score(&model, &tok, &items, &opts).unwrap();
    for (item, score) in items.iter().zip(&scores) {
        for (c, choice) in item.choices.iter().enumerate() {
            let ctx = tok.encode(&item.context);
            let ids = [ctx.clone(), tok.encode(choice)].concat();
            let want = direct_loglik(&model, &ids, ctx.len() - 1);
            assert!(
                (score.loglik[c] - want).abs() < 1e-4,
                "{} vs {want}",
                score.loglik[c]
            );
            assert!((score.per_byte[c] - want / choice.len() as f64).abs() < 1e-4);
        }
        let best = (0..item.choices.len())
            .max_by(|&a, &b| score.loglik[a].total_cmp(&score.loglik[b]))
            .unwrap();
        assert_eq!(score.pred, best);
    }
    assert_eq!(report.items, 2);
    assert!((report.chance - (0.5 + 1.0 / 3.0) / 2.0).abs() < 1e-12);
    let right = scores.iter().filter(|s| s.pred == s.answer).count() as f64;
    assert_eq!(report.acc, right / 2.0);
}

#[test]
fn perplexity_by_type_adds_up_to_the_overall_and_equals_a_direct_computation() {
    let dir = tempfile::tempdir().unwrap();
    let tok = Tokenizer::gpt2().unwrap();
    let texts = [
        ("poetry", "Shall I compare thee to a summer's day? Thou art more lovely and more temperate."),
        ("medicine", "Hypertension is a condition in which the blood pressure in the arteries is persistently elevated."),
        ("poetry", "Rough winds do shake the darling buds of May, and summer's lease hath all too short a date."),
    ];
    let mut w = TokenWriter::create(&dir.path().join("val.bin"), TokenDtype::Uint16).unwrap();
    let mut spans = Vec::new();
    let mut type_of_token = Vec::new();
    for _ in 0..4 {
        for (ty, text) in texts {
            let start = w.tokens();
            w.write(&tok.encode(text)).unwrap();
            w.write(&[50256]).unwrap();
            push_span(&mut spans, ty, start, w.tokens());
            type_of_token.resize(w.tokens() as usize, ty);
        }
    }
    let info = w.finish().unwrap();
    let meta = Meta {
        tokenizer: "gpt2".into(),
        vocab_size: 50257,
        eot_token: 50256,
        dtype: TokenDtype::Uint16,
        files: BTreeMap::from([("val.bin".to_string(), info)]),
        sources: vec![],
        filters: vec![],
        spans: BTreeMap::from([("val.bin".to_string(), spans)]),
    };
    let file = TokenFile::open(dir.path(), "val.bin", &meta).unwrap();
    let model = model();
    let p = lab_eval::perplexity::perplexity(&model, &file, &meta, "val.bin", 24, 3).unwrap();
    let names: Vec<&str> = p.by_type.iter().map(|t| t.doc_type.as_str()).collect();
    assert_eq!(names, ["medicine", "poetry"]);
    // Each type is scored on exactly its own targets: tokens 1 ..= the last whole window.
    let covered = (file.len() - 1) / 24 * 24;
    for t in &p.by_type {
        let own = type_of_token[1..=covered]
            .iter()
            .filter(|ty| **ty == t.doc_type)
            .count();
        assert_eq!(t.tokens, own as u64, "{}", t.doc_type);
    }
    assert_eq!(
        p.overall.tokens,
        ((file.len() - 1) / 24 * 24) as u64,
        "every target once"
    );
    // The overall figure equals the plain mean over the same windows.
    let mut direct = 0.0;
    for w in 0..(file.len() - 1) / 24 {
        let mut ids = Vec::new();
        file.read_into(w * 24, 25, &mut ids).unwrap();
        direct -= direct_loglik(&model, &ids, 0);
    }
    assert!(
        (p.overall.nll_sum - direct).abs() / direct < 1e-5,
        "{} vs {direct}",
        p.overall.nll_sum
    );
}
