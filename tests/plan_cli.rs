//! `lab plan` end to end: the binary on the real presets, its exit codes and its one-line
//! errors.

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn lab_plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lab"))
        .arg("plan")
        .args(args)
        .current_dir(repo())
        .output()
        .expect("runs lab")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("stdout is JSON")
}

fn within(x: f64, quoted: f64, tol: f64) -> bool {
    (x / quoted - 1.0).abs() <= tol
}

const MED_7B: &[&str] = &[
    "--config",
    "configs/med-7b-256xa100.toml",
    "--gpus",
    "256",
    "--tokens",
    "200B",
    "--mfu",
    "0.45",
    "--price",
    "3",
];

#[test]
fn med_7b_table_shows_the_exact_count_and_fsdp_tp_memory() {
    let mut args = MED_7B.to_vec();
    args.extend(["--tp", "2", "--fsdp", "128"]);
    let o = lab_plan(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for expected in [
        "6,195,253,248",
        "LLaMA-7B",
        "n_kv_head 8 vs 32",
        "vocab_size 64,000 vs 32,000",
        "47,684",
        "DP 128 × TP 2 × PP 1",
        "* ZeRO-3 / 128",
        "Assumptions",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in\n{out}");
    }
    // The GPU-hours beside the dollars are the billed ones the dollars are priced on.
    args.push("--json");
    let billed = json(&lab_plan(&args))["scenarios"][0]["billed_gpu_hours"]
        .as_f64()
        .unwrap()
        .round() as u64;
    let grouped = format!("{},{:03}", billed / 1000, billed % 1000);
    assert!(
        out.contains(&format!("  {grouped} (compute ")),
        "{grouped} in\n{out}"
    );
}

#[test]
fn med_7b_json_with_the_case_study_assumptions() {
    let mut args = MED_7B.to_vec();
    args.extend(["--params", "6.7e9", "--batch-tokens", "4e6", "--json"]);
    let o = lab_plan(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let f = |ptr: &str| v.pointer(ptr).and_then(|x| x.as_f64()).unwrap();
    assert!(within(f("/flops_per_token"), 40.2e9, 0.02));
    assert!(within(f("/total_flops"), 8.04e21, 0.02));
    assert!(within(f("/scenarios/0/compute_gpu_hours"), 15_950.0, 0.02));
    assert!(within(f("/scenarios/0/compute_hours"), 62.0, 0.02));
    assert!(within(
        f("/scenarios/0/costs/0/compute_usd"),
        48_000.0,
        0.02
    ));
    assert_eq!(v["batch"]["steps"], 50_000);
    assert_eq!(v["params"]["total"], 6_195_253_248u64);
    assert_eq!(v["params"]["reference"]["name"], "LLaMA-7B");
    assert!(v["assumptions"].as_array().unwrap().len() >= 8);
}

#[test]
fn medgemma_quote_is_flagged() {
    let o = lab_plan(&[
        "--config",
        "configs/medgemma-27b-320xh200.toml",
        "--gpus",
        "320",
        "--zero",
        "3",
        "--hours",
        "336",
        "--quote",
        "125",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("$42,000") && out.contains("$13,440,000"),
        "{out}"
    );
    assert!(out.contains("[quote] inconsistent quote"), "{out}");
}

#[test]
fn check_lab_fails_with_a_one_line_error_and_a_proposal() {
    let o = lab_plan(&["--check-lab", "configs/lab/lab00-a100.toml"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        out.contains("verdict: 4 of 6 promises do not add up"),
        "{out}"
    );
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: lab page configs/lab/lab00-a100.toml"),
        "{err}"
    );
    assert!(err.contains("steps"), "{err}");

    let o = lab_plan(&["--check-lab", "configs/lab/lab00-a100.toml", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    assert_eq!(v["holds"], false);
    assert!(v["plan"]["deadline"]["required_mfu"].as_f64().unwrap() > 0.9);

    // A page's impossible MFU is the page's error (exit 1, naming its field), not --mfu's.
    let tmp = tempfile::tempdir().unwrap();
    let page = tmp.path().join("page.toml");
    let text = std::fs::read_to_string(repo().join("configs/lab/lab00-a100.toml")).unwrap();
    let config = repo().join("configs/x1-50m-a100.toml");
    let text = text.replace("mfu = 0.48", "mfu = 1.7").replace(
        "\"../x1-50m-a100.toml\"",
        &format!("{:?}", config.display().to_string()),
    );
    std::fs::write(&page, text).unwrap();
    let o = lab_plan(&["--check-lab", page.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("[promises] mfu = 1.7"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_input_is_one_line_exit_1() {
    for (args, names) in [
        (vec!["--config", "configs/nope.toml"], "configs/nope.toml"),
        (
            vec![
                "--config",
                "configs/med-7b-256xa100.toml",
                "--gpus",
                "256",
                "--fsdp",
                "3",
            ],
            "--fsdp 3",
        ),
        (
            vec!["--config", "configs/x1-50m-a100.toml", "--device", "tpu-v9"],
            "--device",
        ),
        (vec!["--check-lab", "configs/x1-50m-a100.toml"], "lab page"),
    ] {
        let o = lab_plan(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("error: ") && err.contains(names),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"));
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec![],
        vec!["--config", "configs/x1-50m-a100.toml", "--zero", "4"],
        vec!["--config", "configs/x1-50m-a100.toml", "--tokens", "lots"],
        vec!["--config", "a.toml", "--check-lab", "b.toml"],
    ] {
        assert_eq!(lab_plan(&args).status.code(), Some(2), "{args:?}");
    }
    // A flag's value out of range: the same exit, one line naming the flag.
    for (flag, value) in [
        ("--gpus", "0"),
        ("--mfu", "2"),
        ("--hours", "0"),
        ("--overhead", "0.5"),
    ] {
        let o = lab_plan(&["--config", "configs/x1-50m-a100.toml", flag, value]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.starts_with(&format!("error: {flag}")) && err.lines().count() == 1,
            "{err}"
        );
    }
}

/// `lab plan … | head`: a reader that stops early ends the printing command as SIGPIPE ends
/// any Unix tool's, without a panic's "internal error".
#[test]
fn a_closed_pipe_ends_a_report_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader); // closed before lab writes a byte
    let out = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(["plan", "--config", "configs/med-7b-256xa100.toml"])
        .current_dir(repo())
        .stdout(writer)
        .output()
        .expect("runs lab");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}
