//! GPT-2 tokenization is byte-identical to OpenAI's tiktoken: against Python tiktoken when it
//! is installed (run offline from the ranks file), against tiktoken-rs always, and against
//! golden token counts always.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::LazyLock;

use base64::Engine;
use lab_corpus::tokenize::Tokenizer;
use proptest::prelude::*;

fn medquad_texts(limit: usize) -> Vec<String> {
    let raw = zstd::decode_all(std::fs::File::open(lab_corpus::MEDQUAD_ZST).unwrap()).unwrap();
    String::from_utf8(raw)
        .unwrap()
        .lines()
        .take(limit)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn mmlu_texts() -> Vec<String> {
    std::fs::read_to_string(lab_corpus::MMLU_MEDICAL)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let choices: Vec<&str> = v["choices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            format!(
                "{}\n{}",
                v["question"].as_str().unwrap(),
                choices.join("\n")
            )
        })
        .collect()
}

/// Text that stresses the pre-tokenizer and the merges.
fn adversarial() -> Vec<String> {
    vec![
        "Mixed scripts: Привет мир, 你好，世界！ مرحبا بالعالم नमस्ते दुनिया こんにちは 안녕하세요 Γειά σου".into(),
        "Emoji: 👩🏽‍⚕️ treats 🧑‍🤝‍🧑 with 💊💉 — 🏳️‍🌈 👍🏿 🇺🇸🇫🇷 ❤️‍🔥".into(),
        "Controls:\u{0}\u{1}\u{7}\u{8}\u{b}\u{c}\u{1b}[0m\u{7f}\u{85}\u{200b}\u{feff}\u{2028}end".into(),
        format!("Runs:{}x{}y{}z\t\t\t{}", " ".repeat(10_000), "\n".repeat(3_000), " \t\r\n\u{a0}\u{3000}".repeat(500), " ".repeat(7)),
        "Contractions: I'm you're he's they'll we've she'd IT'S Don't 's 't 'll 'LL ''s".into(),
        "Numbers: 3.14159265358979 1,000,000 0x1F4A9 12345678901234567890 ٣٤٥ ⅷ ²³".into(),
        "a".repeat(10_000),
        "é".repeat(4_000) + &"\u{301}".repeat(3_000),
        (0..2000u32).filter_map(|i| char::from_u32(i * 37 % 0x2FFF)).collect(),
        "".into(),
        " ".into(),
        "<|endoftext|> is plain text to encode_ordinary".into(),
    ]
}

/// The GPT-2 ranks in tiktoken's file format ("base64 rank" lines, rank order).
fn ranks_file(tok: &Tokenizer) -> String {
    let mut out = String::new();
    for (id, bytes) in tok.token_bytes().into_iter().enumerate().take(50_256) {
        let b = bytes.expect("every GPT-2 rank has bytes");
        out.push_str(&format!(
            "{} {id}\n",
            base64::engine::general_purpose::STANDARD.encode(b)
        ));
    }
    out
}

#[test]
fn ranks_are_openais_r50k_base_file() {
    let tok = Tokenizer::gpt2().unwrap();
    // sha256 of https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken, as
    // pinned in tiktoken's openai_public.py.
    assert_eq!(
        lab_fsio::sha256_bytes(ranks_file(&tok).as_bytes()),
        "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
    );
}

#[test]
fn golden_token_counts() {
    let tok = Tokenizer::gpt2().unwrap();
    let count = |texts: &[String]| texts.iter().map(|t| tok.encode(t).len()).sum::<usize>();
    let shakespeare = std::fs::read_to_string(lab_corpus::TINYSHAKESPEARE).unwrap();
    let got = (
        tok.encode(&shakespeare).len(),
        count(&medquad_texts(usize::MAX)),
        count(&mmlu_texts()),
        adversarial()
            .iter()
            .map(|t| tok.encode(t).len())
            .collect::<Vec<_>>(),
    );
    println!("golden counts: {got:?}");
    assert_eq!(
        got,
        (
            GOLDEN_SHAKESPEARE,
            GOLDEN_MEDQUAD,
            GOLDEN_MMLU,
            GOLDEN_ADVERSARIAL.to_vec()
        )
    );
    assert_eq!(&tok.encode(&shakespeare)[..4], &[5962, 22307, 25, 198]);
}

// Token counts from OpenAI's tiktoken 0.14 (Python), `encode_ordinary`.
// (Checked equal by `identical_to_python_tiktoken`; 338,025 = nanoGPT's 301,966 + 36,059.)
const GOLDEN_SHAKESPEARE: usize = 338_025;
const GOLDEN_MEDQUAD: usize = 5_000_909;
const GOLDEN_MMLU: usize = 101_593;
const GOLDEN_ADVERSARIAL: [usize; 12] = [98, 71, 23, 14516, 30, 44, 2500, 10000, 5341, 0, 1, 14];

#[test]
fn identical_to_tiktoken_rs_on_corpora_and_adversarial_text() {
    let tok = Tokenizer::gpt2().unwrap();
    let reference = tiktoken_rs::r50k_base().unwrap();
    let mut texts = adversarial();
    texts.extend(medquad_texts(2_000));
    texts.extend(mmlu_texts());
    for t in &texts {
        assert_eq!(
            tok.encode(t),
            reference.encode_ordinary(t),
            "text starting {:?}",
            &t.chars().take(40).collect::<String>()
        );
    }
}

static GPT2: LazyLock<(Tokenizer, tiktoken_rs::CoreBPE)> = LazyLock::new(|| {
    (
        Tokenizer::gpt2().unwrap(),
        tiktoken_rs::r50k_base().unwrap(),
    )
});

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    #[test]
    fn identical_to_tiktoken_rs_on_random_text(s in "(\\PC|[ \\t\\n\\r'sdlmtve0-9]){0,300}") {
        let (tok, reference) = &*GPT2;
        prop_assert_eq!(tok.encode(&s), reference.encode_ordinary(&s));
    }
}

#[test]
fn identical_to_python_tiktoken() {
    let probe = Command::new("python3")
        .args(["-c", "import tiktoken"])
        .output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        println!(
            "skipping: Python tiktoken is not installed (pip install tiktoken to run this check)"
        );
        return;
    }
    let tok = Tokenizer::gpt2().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ranks = dir.path().join("r50k_base.tiktoken");
    std::fs::write(&ranks, ranks_file(&tok)).unwrap();
    let mut texts = vec![std::fs::read_to_string(lab_corpus::TINYSHAKESPEARE).unwrap()];
    texts.extend(adversarial());
    texts.extend(medquad_texts(usize::MAX));
    texts.extend(mmlu_texts());
    let request = serde_json::json!({"ranks": ranks, "texts": texts});
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tiktoken_ref.py");
    let mut child = Command::new("python3")
        .arg(script)
        .env("TIKTOKEN_CACHE_DIR", dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let body = request.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(body.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "python tiktoken failed");
    let expected: Vec<Vec<u32>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(expected.len(), texts.len());
    let mut total = 0;
    for (t, want) in texts.iter().zip(&expected) {
        assert_eq!(
            &tok.encode(t),
            want,
            "text starting {:?}",
            &t.chars().take(40).collect::<String>()
        );
        total += want.len();
    }
    println!(
        "byte-identical to Python tiktoken on {} texts, {total} tokens",
        texts.len()
    );
}
