//! The embedded default, exactly as a student runs it: `lab train` with no flags, from an
//! empty folder, prepares the bundled corpus and trains the tiny config on the CPU.

mod common;

use common::*;

#[test]
fn default_lab_train_takes_the_loss_from_ln_vocab_to_below_6_5() {
    let cwd = tempfile::tempdir().unwrap();
    let out = run_ok(lab().arg("train").current_dir(cwd.path()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done: step 300"), "{stdout}");

    let run = cwd.path().join("runs/tiny-cpu");
    let l = losses(&run);
    let first = f64::from_bits(l[0].1);
    let last = f64::from_bits(l.last().unwrap().1);
    // ln(50257) = 10.82: an untrained model is near uniform over the vocabulary.
    assert!(first > 10.0, "first logged loss {first}");
    assert!(last < 6.5, "final loss {last}");

    // The run folder holds what DESIGN.md promises.
    for f in ["latest", "metrics.jsonl", "events.jsonl", "status.json"] {
        assert!(run.join(f).exists(), "{f}");
    }
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["state"], "done");
    assert!(cwd
        .path()
        .join("runs/data/tinyshakespeare-gpt2/meta.json")
        .exists());
}
