//! The README's first command, exactly as a student runs it on a fresh machine: `lab run` with
//! no SPEC, from an empty folder, runs the embedded CPU lab end to end (prepare → train with an
//! injected spike under a metered budget → post-mortem → export → Definition of Done).

use crate::common::*;

#[test]
fn lab_run_with_no_spec_ends_with_a_passing_dod_and_every_artifact() {
    let cwd = tempfile::tempdir().unwrap();
    let out = run_ok(lab().arg("run").current_dir(cwd.path()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for stage in [
        "1/5 prepare",
        "2/5 train",
        "3/5 post-mortem",
        "4/5 export",
        "5/5 definition of done",
    ] {
        assert!(stdout.contains(stage), "{stage}:\n{stdout}");
    }
    assert!(stdout.contains("PASS: 8 of 8 checks pass"), "{stdout}");

    // The run learned: from ln(50257) = 10.8 to well below, through the injected spike.
    let run = cwd.path().join("runs/lab-tiny-cpu");
    let l = losses(&run);
    let first = f64::from_bits(l[0].1);
    let last = f64::from_bits(l.last().unwrap().1);
    assert!(first > 10.0 && last < 5.5, "loss {first} → {last}");
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    assert_eq!(
        (status["state"].as_str(), status["step"].as_u64()),
        (Some("done"), Some(300))
    );

    let export = cwd.path().join("experiments/tiny-cpu/seed-42");
    for f in [
        "manifest.json",
        "metrics.csv",
        "final.safetensors",
        "spike-postmortem.md",
        "MODEL_CARD.md",
        "run-uri.txt",
    ] {
        assert!(export.join(f).is_file(), "{f}");
    }
    for png in [
        "loss-curve.png",
        "gradnorm-curve.png",
        "throughput.png",
        "spike-step-60.png",
    ] {
        let path = export.join(png);
        assert!(
            std::fs::metadata(&path).unwrap().len() > 20_000,
            "{png} is too small to be a chart"
        );
        let (ink, colors) = png_ink(&path);
        assert!(
            ink > 0.02 && colors > 8,
            "{png} looks blank: {ink} ink, {colors} colours"
        );
    }
    let dod: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("dod.json")).unwrap()).unwrap();
    assert_eq!(dod["passed"], true);
}
