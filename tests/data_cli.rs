//! End-to-end: `lab data prepare`, `lab data shards`, `lab tokenizer train|fertility` as a
//! user runs them, exit codes and one-line errors included.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(args)
        .output()
        .expect("lab runs")
}

fn repo(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(p)
        .display()
        .to_string()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit 1 with exactly one stderr line starting `error:`, no panic.
fn one_line_error(o: &Output) -> String {
    one_line_exit(o, 1)
}

/// A flag's value of the wrong form: the same one line, exit 2 (a usage error).
fn usage_error(o: &Output) -> String {
    one_line_exit(o, 2)
}

fn one_line_exit(o: &Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    lines[0].to_string()
}

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap()
}

#[test]
fn tinyshakespeare_char_split_gives_nanogpts_counts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shk");
    let o = lab(&[
        "data",
        "prepare",
        "--input",
        &repo("crates/data/corpora/tinyshakespeare.txt"),
        "--split",
        "chars:0.9",
        "--output-dir",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = meta(&out);
    assert_eq!(m["files"]["train.bin"]["tokens"], 301_966);
    assert_eq!(m["files"]["val.bin"]["tokens"], 36_059);
    assert_eq!(
        std::fs::metadata(out.join("train.bin")).unwrap().len(),
        2 * 301_966
    );
}

#[test]
fn medquad_prepare_prints_the_per_type_report_then_shards_plan_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("med");
    let o = lab(&[
        "data",
        "prepare",
        "--input",
        &repo("crates/corpus/corpora/medquad.jsonl.zst"),
        "--type-field",
        "source",
        "--all-filters",
        "--decontaminate",
        &repo("crates/corpus/corpora/mmlu-medical.jsonl"),
        "--val-fraction",
        "0.01",
        "--workers",
        "2",
        "--output-dir",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let text = stdout(&o);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for needle in [
        "- dedup-near               GARD",
        "- dedup-exact",
        "- quality-min-tokens",
        "- decontaminate",
        "= kept                     (all)",
        "MB/s",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let m = meta(&out);
    let names: Vec<&str> = m["filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "read",
            "clean",
            "redact-phi",
            "quality-non-alnum",
            "quality-min-tokens",
            "dedup-exact",
            "dedup-near",
            "decontaminate",
            "split"
        ]
    );

    let plan_path = dir.path().join("plan.json");
    let o = lab(&[
        "data",
        "shards",
        "--data-dir",
        out.to_str().unwrap(),
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--global-batch-tokens",
        "65536",
        "--seq-len",
        "1024",
        "--shards-per-rank",
        "3",
        "--output",
        plan_path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout(&o).contains("8 ranks"), "{}", stdout(&o));
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    let shards = plan["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 24);
    let per_rank = |r: u64| {
        shards
            .iter()
            .filter(|s| s["rank"] == r)
            .map(|s| s["tokens"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!((0..8).all(|r| per_rank(r) == per_rank(0)));
    assert_eq!(plan["train_bin_sha256"], m["files"]["train.bin"]["sha256"]);

    let o = lab(&[
        "data",
        "shards",
        "--data-dir",
        out.to_str().unwrap(),
        "--nodes",
        "3",
        "--gpus-per-node",
        "8",
        "--global-batch-tokens",
        "65536",
    ]);
    let e = one_line_error(&o);
    assert!(
        e.contains("--global-batch-tokens 65536") && e.contains("use 49152 or 73728"),
        "{e}"
    );
}

#[test]
fn a_killed_prepare_leaves_no_complete_looking_output_and_reruns_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("med");
    let args = |out: &Path| -> Vec<String> {
        [
            "data",
            "prepare",
            "--input",
            &repo("crates/corpus/corpora/medquad.jsonl.zst"),
            "--all-filters",
            "--workers",
            "1",
            "--val-fraction",
            "0.01",
            "--quiet",
            "--output-dir",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(args(&out))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    child.kill().unwrap(); // SIGKILL: no cleanup code runs
    child.wait().unwrap();
    assert!(
        !out.join("meta.json").exists(),
        "a killed run must not leave meta.json"
    );
    assert!(
        !out.join("train.bin").exists(),
        "a killed run must not leave a train.bin"
    );

    let o = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(args(&out))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let fresh = dir.path().join("fresh");
    assert!(Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(args(&fresh))
        .output()
        .unwrap()
        .status
        .success());
    assert_eq!(meta(&out)["files"], meta(&fresh)["files"]);
    let hidden: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "temp files left: {hidden:?}");
}

#[test]
fn bad_input_gets_one_line_errors_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = one_line_error(&lab(&[
        "data",
        "prepare",
        "--input",
        empty.to_str().unwrap(),
        "--output-dir",
        out,
    ]));
    assert!(e.contains("holds no"), "{e}");

    let mut zst = std::fs::read(repo("crates/corpus/corpora/medquad.jsonl.zst")).unwrap();
    zst.truncate(zst.len() / 3);
    let bad = dir.path().join("bad.jsonl.zst");
    std::fs::write(&bad, zst).unwrap();
    let prepare_bad = |extra: &[&str]| {
        let mut args = vec!["data", "prepare", "--input", bad.to_str().unwrap()];
        args.extend(["--output-dir", out]);
        args.extend(extra);
        lab(&args)
    };
    let e = one_line_error(&prepare_bad(&["--quiet"]));
    assert!(e.contains("bad.jsonl.zst") && e.contains("zstd"), "{e}");
    // A failed prepare leaves no output folder of its own making, and the user's own alone,
    // however the path names it.
    assert!(!Path::new(out).exists(), "{out} left behind");
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "keep").unwrap();
    for path in [mine.clone(), dir.path().join("new/../mine")] {
        let mut args = vec!["data", "prepare", "--input", bad.to_str().unwrap()];
        args.extend(["--output-dir", path.to_str().unwrap(), "--quiet"]);
        one_line_error(&lab(&args));
        assert_eq!(
            std::fs::read_to_string(mine.join("notes.txt")).unwrap(),
            "keep"
        );
    }
    // A prepare that fails on its input leaves a prepared folder as it was, meta.json too.
    let prepared = dir.path().join("prepared");
    std::fs::create_dir(&prepared).unwrap();
    for entry in std::fs::read_dir(crate::common::data_dir()).unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(&from, prepared.join(from.file_name().unwrap())).unwrap();
    }
    let files = |d: &Path| -> Vec<Vec<u8>> {
        ["meta.json", "train.bin", "val.bin"]
            .iter()
            .map(|f| std::fs::read(d.join(f)).unwrap())
            .collect()
    };
    let before = files(&prepared);
    let mut args = vec!["data", "prepare", "--input", bad.to_str().unwrap()];
    args.extend(["--output-dir", prepared.to_str().unwrap(), "--quiet"]);
    one_line_error(&lab(&args));
    assert!(files(&prepared) == before, "the prepared folder changed");
    let e = usage_error(&prepare_bad(&["--split", "half"]));
    assert!(e.contains("--split half"), "{e}");
    let e = usage_error(&prepare_bad(&["--redact", "--anchor-date", "March 2020"]));
    assert!(
        e.contains("--anchor-date March 2020: expected YYYY-MM-DD"),
        "{e}"
    );

    let o = lab(&["data", "prepare", "--output-dir", out]);
    assert_eq!(o.status.code(), Some(2), "usage error");

    let e = one_line_error(&lab(&[
        "data",
        "shards",
        "--data-dir",
        out,
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--global-batch-tokens",
        "1024",
    ]));
    assert!(e.contains("lab data prepare"), "{e}");
}

#[test]
fn tokenizer_train_then_fertility_writes_table_and_chart() {
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("mmlu.json");
    let o = lab(&[
        "tokenizer",
        "train",
        "--input",
        &repo("crates/corpus/corpora/mmlu-medical.jsonl"),
        "--text-field",
        "question",
        "--type-field",
        "subject",
        "--vocab-size",
        "1000",
        "--special-tokens",
        &repo("crates/corpus/corpora/clinical-sections.txt"),
        "--output",
        tok.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout(&o).contains("anatomy"), "{}", stdout(&o));
    assert!(dir.path().join("mmlu.tiktoken").exists());

    let chart = dir.path().join("f.png");
    let o = lab(&[
        "tokenizer",
        "fertility",
        "--tokenizer",
        "gpt2",
        "--tokenizer",
        tok.to_str().unwrap(),
        "--input",
        &repo("crates/corpus/corpora/mmlu-medical.jsonl"),
        "--text-field",
        "question",
        "--type-field",
        "subject",
        "--terms",
        &repo("crates/corpus/corpora/medical-terms.txt"),
        "--chart",
        chart.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = stdout(&o);
    assert!(
        table.contains("(overall)")
            && table.contains("(medical terms)")
            && table.contains("clinical_knowledge"),
        "{table}"
    );
    assert!(std::fs::metadata(&chart).unwrap().len() > 5_000);

    let e = one_line_error(&lab(&[
        "tokenizer",
        "fertility",
        "--tokenizer",
        "nope.json",
        "--input",
        &repo("crates/corpus/corpora/mmlu-medical.jsonl"),
    ]));
    assert!(e.contains("nope.json"), "{e}");
}

#[test]
fn out_of_range_flags_are_usage_errors_and_huge_shard_plans_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out").display().to_string();
    let input = repo("crates/data/corpora/tinyshakespeare.txt");
    for (flag, value, needle) in [
        ("--near-dup-threshold", "2", "--near-dup-threshold 2"),
        ("--near-dup-threshold", "0", "--near-dup-threshold 0"),
        ("--max-non-alnum", "1.5", "--max-non-alnum 1.5"),
        ("--val-fraction", "1.5", "--val-fraction 1.5"),
        ("--workers", "0", "--workers 0"),
    ] {
        let o = lab(&[
            "data", "prepare", "-i", &input, "-o", &out, "--dedup", flag, value,
        ]);
        let line = usage_error(&o);
        assert!(line.contains(needle), "{line}");
        assert!(!tmp.path().join("out/meta.json").exists());
    }
    let data = tmp.path().join("data").display().to_string();
    let o = lab(&[
        "data",
        "prepare",
        "-i",
        &input,
        "-o",
        &data,
        "--split",
        "chars:0.9",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let huge = u64::MAX.to_string();
    let o = lab(&[
        "data",
        "shards",
        "--data-dir",
        &data,
        "--nodes",
        &huge,
        "--gpus-per-node",
        &huge,
        "--global-batch-tokens",
        "1024",
    ]);
    assert!(one_line_error(&o).contains("overflows"));
    // Counts at 0: usage errors naming the flag, in shards and in tokenizer training.
    let shards = |zero: &str| {
        let mut args = vec!["data", "shards", "--data-dir", &data];
        for (flag, v) in [
            ("--nodes", "1"),
            ("--gpus-per-node", "2"),
            ("--seq-len", "32"),
        ] {
            args.extend([flag, if flag == zero { "0" } else { v }]);
        }
        args.extend(["--global-batch-tokens", "1024"]);
        if zero == "--shards-per-rank" {
            args.extend([zero, "0"]);
        }
        lab(&args)
    };
    for flag in ["--nodes", "--seq-len", "--shards-per-rank"] {
        assert!(usage_error(&shards(flag)).contains(&format!("{flag} must be at least 1")));
    }
    let tok = tmp.path().join("tok.json").display().to_string();
    for (flag, value) in [
        ("--vocab-size", "0"),
        ("--sample-bytes", "0"),
        ("--min-frequency", "0"),
    ] {
        let o = lab(&[
            "tokenizer",
            "train",
            "--input",
            &input,
            "--output",
            &tok,
            flag,
            value,
        ]);
        assert!(usage_error(&o).contains(flag));
    }
    assert!(!tmp.path().join("tok.json").exists());

    // A plain text file is one document: the advice is a character split, for either side.
    for extra in [&[][..], &["--val-fraction", "0.5"][..]] {
        let mut args = vec!["data", "prepare", "-i", &input, "-o", &out];
        args.extend(extra);
        let e = one_line_error(&lab(&args));
        assert!(
            e.contains("--split chars:0.9") && !e.contains("ValFraction"),
            "{e}"
        );
    }
}
