//! `scripts/gpu/session.sh lease` on a made-up GPU host. A GPU is lent rarely, for 15 minutes
//! in all, and the lease is one call of this script: its plumbing is checked here, where a
//! mistake costs nothing. The real session.sh and bench.sh run from a folder laid out as the
//! repository (so that its `.bin/` is the test's); `nvidia-smi`, `ldconfig`, lab, the CUDA
//! test binaries, PyTorch's python and launches.sh are small scripts that log each call with
//! the environment it ran in.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Each stub records `name args | the switches | ld=LD_LIBRARY_PATH | cache=LAB_KERNEL_CACHE`
/// in `$STATE/calls`, and prints the same line (so that a step's log shows it).
const LOG: &str = r#"line="$(basename "$0") $* | mma=${LAB_ATTENTION_MMA:-} matmul=${LAB_MATMUL:-} rows=${LAB_ATTENTION_ROWS:-} blocks=${LAB_ATTENTION_QUERY_BLOCKS:-} stages=${LAB_ATTENTION_STAGES:-} shuffle=${LAB_ATTENTION_SHUFFLE:-} | ld=${LD_LIBRARY_PATH:-} | cache=${LAB_KERNEL_CACHE:-}"
echo "$line" >>"$STATE/calls"; echo "$line""#;

/// lab: makes what the lease reads (the prepared data's `meta.json`, bench's JSON and token
/// stream, a run folder), from the flags it is given.
const LAB: &str = r#"value() { local want="$1"; shift; while [ $# -gt 1 ]; do [ "$1" = "$want" ] && { echo "$2"; return; }; shift; done; }
case "$1" in
  data) dir="$(value --output-dir "$@")"; mkdir -p "$dir" && echo '{}' >"$dir/meta.json" ;;
  bench)
    tokens="$(value --tokens-out "$@")"; [ -n "$tokens" ] && echo tokens >"$tokens"
    case " $* " in *" --matmul "*) echo '[]' ;; *" --json "*) echo '{"tokens_per_s": 1}' ;; esac ;;
  train) dir="$(value --ckpt-dir "$@")"; mkdir -p "$dir" && echo '{}' >"$dir/metrics.jsonl" ;;
esac"#;

/// The test modules of each test binary: `newmod` is one the lease does not name, `precision`
/// one it names as `mixed_precision` (renamed since, say).
const MODULES: &[(&str, &[&str])] = &[
    ("kernels", &["attention", "gemm", "newmod", "rms_norm"]),
    ("ops", &["projection", "rope"]),
    ("model", &["fused_attention", "gpu_memory", "precision"]),
];

/// The test binary that cannot list its tests (a library it cannot load, say).
const UNLISTED: &str = "ops";

/// The library path the lease is called with.
const CALLER_LD: &str = "/caller/lib";

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let host = Host {
            dir: tempfile::tempdir().unwrap(),
        };
        for dir in [
            "bin",
            "state",
            "home",
            "repo/scripts/gpu",
            "repo/.bin/tests",
        ] {
            std::fs::create_dir_all(host.path(dir)).unwrap();
        }
        for script in ["session.sh", "bench.sh"] {
            let from = repo().join("scripts/gpu").join(script);
            let to = host.path("repo/scripts/gpu").join(script);
            std::fs::copy(from, to).unwrap();
        }
        std::fs::write(
            host.path("repo/x1.toml"),
            "grad_accum = 16\neval_batches = 8\n",
        )
        .unwrap();
        let logged = |body: &str| format!("{LOG}\n{body}");
        host.stub(
            "bin/nvidia-smi",
            &logged("echo '0, NVIDIA H100 80GB HBM3, 81559 MiB, 580.00'"),
        );
        // No system NCCL: session.sh puts CUDA's lib folder first on the library path.
        host.stub("bin/ldconfig", "true");
        host.stub(
            "bin/python",
            &logged(r#"[ "$1" = - ] && cat >/dev/null; echo '{"tokens_per_s": 2}'"#),
        );
        host.stub("repo/.bin/lab", &logged(LAB));
        host.stub("repo/scripts/launches.sh", &logged("true"));
        for (binary, modules) in MODULES {
            host.stub(
                &format!("repo/.bin/tests/{binary}"),
                &test_binary(binary, modules),
            );
        }
        host
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn stub(&self, rel: &str, body: &str) {
        let path = self.path(rel);
        std::fs::write(&path, format!("#!/bin/bash\n{body}\n")).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&path, mode).unwrap();
    }

    /// `session.sh lease --budget BUDGET`, the stubs first on `PATH`: its output, its summary's
    /// lines and the stubs' calls.
    fn lease(&self, budget: &str) -> (Output, Vec<String>, Vec<String>) {
        let _ = std::fs::remove_file(self.path("state/calls"));
        let out = Command::new("bash")
            .arg(self.path("repo/scripts/gpu/session.sh"))
            .args(["lease", "--config"])
            .arg(self.path("repo/x1.toml"))
            .arg("--out")
            .arg(self.path("out"))
            .args(["--budget", budget])
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.path("bin").display()),
            )
            .env("HOME", self.path("home"))
            .env("STATE", self.path("state"))
            .env("WORK", self.path("work"))
            .env("PYTHON", self.path("bin/python"))
            .env("LD_LIBRARY_PATH", CALLER_LD)
            .env("TESTS_TOGETHER", "3")
            .output()
            .unwrap();
        let read = |rel: &str| -> Vec<String> {
            let text = std::fs::read_to_string(self.path(rel)).unwrap_or_default();
            text.lines().map(str::to_owned).collect()
        };
        (out, read("out/summary-lease.txt"), read("state/calls"))
    }
}

/// A CUDA test binary with `modules`: it lists them (unless it is [`UNLISTED`]), unlogged; a
/// filter runs a test where it names a module, or is `::` (every test), as libtest says; the
/// gemm tests fail.
fn test_binary(binary: &str, modules: &[&str]) -> String {
    let list: String = if binary == UNLISTED {
        "exit 1\n".into()
    } else {
        modules
            .iter()
            .map(|m| format!("echo '{m}::a: test'\n"))
            .collect()
    };
    let run = format!(
        r#"{LOG}
case " {} :: " in *" ${{1%%::*}} "*|*" $1 "*) echo 'running 1 test' ;; *) echo 'running 0 tests' ;; esac
[ "$1" != gemm:: ] || exit 3"#,
        modules.join(" ")
    );
    format!("if [ \"$1\" = --list ]; then\n{list}exit 0\nfi\n{run}")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

/// The steps in the order a lease runs them, with the modules above.
const STEPS: &[&str] = &[
    "prepare",
    "gpu",
    "compare-new",
    "test-kernels-attention-tensor_core",
    "test-kernels-gemm",
    "test-ops-projection",
    "test-kernels-attention-tensor_core-rows-bounce",
    "test-kernels-attention-tensor_core-query_blocks-1",
    "test-kernels-attention-tensor_core-stages-1",
    "test-model-fused_attention",
    "test-model-mixed_precision",
    "test-kernels-attention",
    "test-kernels-newmod",
    "test-kernels-rms_norm",
    "test-ops",
    "test-model-gpu_memory",
    "test-model-precision",
    "split-mma",
    "split-mma-bounce",
    "split-mma-one-block",
    "split-mma-one-stage",
    "split",
    "kernel-times",
    "train-new",
    "split-one-lane",
    "pools-sliced",
    "pools-exclusive",
];

/// A summary line's step name (`ok NAME`, `FAILED NAME (…)`, `SKIPPED NAME (…)`).
fn step_name(line: &str) -> &str {
    line.split_whitespace().nth(1).unwrap_or("")
}

/// The calls whose line starts with `prefix`.
fn calls_with<'a>(calls: &'a [String], prefix: &str) -> Vec<&'a str> {
    calls
        .iter()
        .filter(|c| c.starts_with(prefix))
        .map(String::as_str)
        .collect()
}

#[test]
fn a_lease_runs_every_step_in_order_each_test_variant_with_its_switch_and_log() {
    let host = Host::new();
    let (out, summary, calls) = host.lease("520");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!(
        "stdout:\n{stdout}\nstderr:\n{stderr}\ncalls:\n{}",
        calls.join("\n")
    );

    // Every step once, in order; the failed gemm tests are said and the rest still run, as
    // is a filter that no test matches any more.
    let names: Vec<&str> = summary.iter().map(|l| step_name(l)).collect();
    assert_eq!(names, STEPS, "{context}");
    for line in &summary {
        let want = match step_name(line) {
            "test-kernels-gemm" => "FAILED test-kernels-gemm (exit 3)".to_string(),
            "test-model-mixed_precision" => {
                "FAILED test-model-mixed_precision (no test matches)".to_string()
            }
            name => format!("ok {name}"),
        };
        assert!(line.starts_with(&want), "{line}\n{context}");
    }
    assert_eq!(out.status.code(), Some(1), "{context}");

    // Each test module once, one test at a time; the tensor-core attention's also under each
    // switch, each with a log of its own that shows it.
    let mut got: Vec<String> = calls
        .iter()
        .filter(|c| {
            ["kernels ", "ops ", "model "]
                .iter()
                .any(|b| c.starts_with(b))
        })
        .map(|c| c.split(" | ").take(2).collect::<Vec<_>>().join(" | "))
        .collect();
    let quiet = "mma= matmul= rows= blocks= stages= shuffle=";
    let tensor_cores = "kernels attention::tensor_core --test-threads 1";
    let mut want = vec![
        format!("{tensor_cores} | {quiet}"),
        format!("{tensor_cores} | mma= matmul= rows=bounce blocks= stages= shuffle="),
        format!("{tensor_cores} | mma= matmul= rows= blocks=1 stages= shuffle="),
        format!("{tensor_cores} | mma= matmul= rows= blocks= stages=1 shuffle="),
        format!("kernels attention:: --test-threads 1 --skip attention::tensor_core | {quiet}"),
    ];
    // Every other module of the lists, `newmod` and `precision` included; all of the binary
    // that lists none.
    for module in [
        "kernels gemm::",
        "kernels newmod::",
        "kernels rms_norm::",
        "ops projection::",
        "ops ::",
        "model fused_attention::",
        "model gpu_memory::",
        "model mixed_precision::",
        "model precision::",
    ] {
        want.push(format!("{module} --test-threads 1 | {quiet}"));
    }
    got.sort();
    want.sort();
    assert_eq!(got, want, "{context}");
    for (name, switch) in [
        ("rows-bounce", "rows=bounce"),
        ("query_blocks-1", "blocks=1"),
        ("stages-1", "stages=1"),
    ] {
        let log = host.path(&format!(
            "work/logs-lease/test-kernels-attention-tensor_core-{name}.log"
        ));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains(switch), "{}: {text}", log.display());
    }

    // The timed splits: the four tensor-core variants, then lab as it trains by default, then
    // the f32 attention one unit a row.
    let splits: Vec<&str> = calls_with(&calls, "lab bench --backend cuda")
        .into_iter()
        .filter(|c| c.contains("--steps 5 --warmup 2 --split"))
        .map(|c| c.split(" | ").nth(1).unwrap())
        .collect();
    assert_eq!(
        splits,
        [
            "mma=1 matmul= rows= blocks= stages= shuffle=",
            "mma=1 matmul= rows=bounce blocks= stages= shuffle=",
            "mma=1 matmul= rows= blocks=1 stages= shuffle=",
            "mma=1 matmul= rows= blocks= stages=1 shuffle=",
            quiet,
            "mma= matmul= rows= blocks= stages= shuffle=0",
        ],
        "{context}"
    );
    // The headline comparison runs lab with both opt-in paths.
    let headline = calls_with(&calls, "lab bench")
        .into_iter()
        .find(|c| c.contains("--tokens-out"))
        .unwrap_or_else(|| panic!("no bench with a token stream\n{context}"));
    assert!(headline.contains("| mma=1 matmul=cublaslt "), "{headline}");

    // lab runs with CUDA's libraries first and a kernel cache in the work folder; PyTorch
    // with the caller's library path.
    let cache = format!("cache={}", host.path("work/kernel-cache").display());
    for call in calls_with(&calls, "lab ") {
        let ld = call.split(" | ").nth(2).unwrap();
        assert!(ld.starts_with("ld=/usr/local/cuda/lib64:"), "{call}");
        assert!(ld.ends_with(CALLER_LD), "{call}");
        assert!(call.ends_with(&cache), "{call}");
    }
    let python = calls_with(&calls, "python ");
    assert_eq!(
        python.len(),
        3,
        "eager, cuBLAS's products, the table: {python:?}"
    );
    for call in python {
        assert!(call.contains(&format!("| ld={CALLER_LD} |")), "{call}");
    }

    // What comes back: the summary and one archive with every step's log.
    let archive = Command::new("tar")
        .arg("-tzf")
        .arg(host.path("out/lease.tar.gz"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&archive.stdout);
    for step in STEPS {
        assert!(
            listed.contains(&format!("logs-lease/{step}.log")),
            "{step}: {listed}"
        );
    }
    let returned = std::fs::read_dir(host.path("out")).unwrap().count();
    assert!(
        returned <= 8,
        "a device call returns at most 8 files: {returned}"
    );
}

#[test]
fn a_lease_out_of_time_lists_every_step_as_skipped_and_runs_nothing() {
    let host = Host::new();
    let (out, summary, calls) = host.lease("0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let names: Vec<&str> = summary.iter().map(|l| step_name(l)).collect();
    // The data, never prepared, is asked for again by the training run.
    let mut want = STEPS.to_vec();
    let train = want.iter().position(|s| *s == "train-new").unwrap();
    want.insert(train, "prepare");
    assert_eq!(names, want, "{stderr}");
    for line in &summary {
        assert!(line.starts_with("SKIPPED"), "{line}");
    }
    assert!(calls.is_empty(), "{calls:?}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
