//! `scripts/cloud/bootstrap.sh` on a made-up GPU host: the real script, with the host's
//! commands (dpkg, apt-get, rustc, rustup, cargo, nvidia-smi, the `lab` binary) replaced by
//! small scripts on `PATH` that keep their state in files and log every call. What the script
//! then asks `lab` to do and tells the user to run is checked against the real `lab`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;

/// The made-up host: its commands, its state and the log of what the script ran.
struct Host {
    dir: tempfile::TempDir,
}

/// Each command records `name args | CUDARC_CUDA_VERSION | working folder` in `calls`.
const LOG: &str =
    r#"echo "$(basename "$0") $* | ${CUDARC_CUDA_VERSION:-} | $PWD" >>"$STATE/calls""#;

/// The commands, as `(name, body)`; `$STATE` is the host's state folder.
const COMMANDS: &[(&str, &str)] = &[
    // A package is installed when its marker file exists; apt-get creates the markers.
    ("dpkg", r#"[ "$1" = -s ] && [ -e "$STATE/pkg-$2" ]"#),
    (
        "apt-get",
        r#"for a in "$@"; do case "$a" in -*|install|update) ;; *) touch "$STATE/pkg-$a";; esac; done"#,
    ),
    ("sudo", r#"exec env "$@""#),
    ("id", r#"[ "$1" = -u ] && cat "$STATE/uid""#),
    ("curl", "exit 7"),
    ("rustc", r#"echo "rustc $(cat "$STATE/rust") (stub)""#),
    (
        "rustup",
        r#"[ "$1 $2" = "toolchain install" ] && echo 99.0.0 >"$STATE/rust"; true"#,
    ),
    ("cargo", "true"),
    (
        "nvidia-smi",
        r#"[ -e "$STATE/no-gpu" ] && { echo "NVIDIA-SMI has failed"; exit 9; }
case "$1" in
  --query-gpu*) echo "0, NVIDIA A100-SXM4-80GB, 81920 MiB, 570.86.15" ;;
  *) echo "| NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    $(cat "$STATE/cuda-line") |" ;;
esac"#,
    ),
    ("lab", "true"),
];

impl Host {
    /// A root shell on a host with every package, the Rust the workspace asks for, a GPU
    /// whose driver supports CUDA 12.8, and the toolkit's headers under `CUDA_PATH`.
    fn ready() -> Host {
        let host = Host {
            dir: tempfile::tempdir().unwrap(),
        };
        let bin = host.path("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(host.path("state")).unwrap();
        std::fs::create_dir_all(host.path("home")).unwrap();
        std::fs::create_dir_all(host.path("cuda/include")).unwrap();
        std::fs::write(host.path("cuda/include/cuda.h"), "/* stub */\n").unwrap();
        for (name, body) in COMMANDS {
            let script = format!("#!/bin/bash\n{LOG}\n{body}\n");
            let path = bin.join(name);
            std::fs::write(&path, script).unwrap();
            let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
            std::fs::set_permissions(&path, mode).unwrap();
        }
        for pkg in [
            "build-essential",
            "pkg-config",
            "git",
            "curl",
            "ca-certificates",
        ] {
            host.set(&format!("pkg-{pkg}"), "");
        }
        host.set("rust", &format!("{}.0", rust_version()));
        host.set("uid", "0");
        host.set("cuda-line", "CUDA Version: 12.8");
        host
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn set(&self, state: &str, value: &str) {
        std::fs::write(self.path("state").join(state), value).unwrap();
    }

    fn unset(&self, state: &str) {
        std::fs::remove_file(self.path("state").join(state)).unwrap();
    }

    /// `bootstrap.sh args` with the host's commands first on `PATH`; the log is emptied first.
    fn bootstrap(&self, args: &[&str]) -> (Output, Vec<String>) {
        let calls = self.path("state/calls");
        let _ = std::fs::remove_file(&calls);
        let path = format!("{}:/usr/bin:/bin", self.path("bin").display());
        let out = Command::new("bash")
            .arg(repo().join("scripts/cloud/bootstrap.sh"))
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.path("home"))
            .env("STATE", self.path("state"))
            .env("CUDA_PATH", self.path("cuda"))
            .env("LAB", self.path("bin/lab"))
            .output()
            .unwrap();
        let calls = std::fs::read_to_string(&calls).unwrap_or_default();
        (out, calls.lines().map(str::to_owned).collect())
    }
}

/// The workspace's `rust-version`.
fn rust_version() -> String {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let line = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap();
    line.trim_matches('"').to_string()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

/// The calls to `command`, each as `args | CUDARC_CUDA_VERSION | folder`.
fn calls_to<'a>(calls: &'a [String], command: &str) -> Vec<&'a str> {
    let prefix = format!("{command} ");
    calls
        .iter()
        .filter_map(|c| c.strip_prefix(&prefix))
        .collect()
}

fn succeeded(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bootstrap failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Exit 1 with one line on stderr naming `needles`, and `lab` never run.
fn failed_with(out: &Output, calls: &[String], needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "expected {needle:?} in {stderr}");
    }
    assert!(calls_to(calls, "lab").is_empty(), "{calls:?}");
}

/// The words after `lab` (before any `#` comment) on the script's output line with `flag`.
fn printed_lab_args(stdout: &str, lab: &Path, flag: &str) -> Vec<String> {
    let line = stdout
        .lines()
        .find(|l| l.contains(flag))
        .unwrap_or_else(|| panic!("no line with {flag:?} in\n{stdout}"));
    let rest = line.trim().strip_prefix(lab.to_str().unwrap()).unwrap();
    let command = rest.split('#').next().unwrap();
    command.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn a_ready_host_is_only_checked_and_gets_a_lab00_command_that_lab_accepts() {
    let host = Host::ready();
    for run in 1..=2 {
        let (out, calls) = host.bootstrap(&["--no-build"]);
        let stdout = succeeded(&out);
        for installer in ["apt-get", "rustup", "curl", "cargo"] {
            assert!(
                calls_to(&calls, installer).is_empty(),
                "run {run}: {calls:?}"
            );
        }
        let smoke = calls_to(&calls, "lab");
        let want = format!(
            "bench --backend cuda --config configs/tiny-cpu.toml --precision bf16 --steps 2 --warmup 1 | 12080 | {}",
            repo().display()
        );
        assert_eq!(smoke, [want.as_str()], "run {run}");
        assert!(stdout.contains("CUDARC_CUDA_VERSION=12080"), "{stdout}");
        assert!(stdout.contains("NVIDIA A100-SXM4-80GB"), "{stdout}");

        // The real lab parses the smoke test's flags, and plans the printed lab-00 run.
        let bench_args = smoke[0].split(" | ").next().unwrap().split(' ');
        common::run_ok(
            common::lab()
                .current_dir(repo())
                .args(bench_args)
                .arg("--help"),
        );
        let dry_run = printed_lab_args(&stdout, &host.path("bin/lab"), "--dry-run");
        assert_eq!(dry_run[..2], ["run", "configs/lab/lab00-a100.toml"]);
        let plan = common::run_ok(common::lab().current_dir(repo()).args(&dry_run));
        let plan = String::from_utf8_lossy(&plan.stdout);
        assert!(plan.contains("lab00") && plan.contains("DoD"), "{plan}");
    }
}

#[test]
fn a_bare_host_gets_what_it_lacks_once_and_a_cuda_build_for_its_driver() {
    // As root (RunPod's containers: no sudo) and as a user with sudo (Lambda's `ubuntu`).
    for (uid, sudo_calls) in [("0", 0), ("1000", 2)] {
        bare_host_run_twice(uid, sudo_calls);
    }
}

fn bare_host_run_twice(uid: &str, sudo_calls: usize) {
    let host = Host::ready();
    host.set("uid", uid);
    host.unset("pkg-pkg-config");
    host.unset("pkg-curl");
    host.set("rust", "1.80.1");
    host.set("cuda-line", "CUDA Version: 13.0");

    let (out, calls) = host.bootstrap(&[]);
    succeeded(&out);
    assert_eq!(
        calls_to(&calls, "sudo").len(),
        sudo_calls,
        "uid {uid}: {calls:?}"
    );
    let installs: Vec<_> = calls_to(&calls, "apt-get")
        .into_iter()
        .filter(|c| c.contains("install"))
        .collect();
    assert_eq!(installs.len(), 1, "{calls:?}");
    assert!(
        installs[0].starts_with("install -y --no-install-recommends pkg-config curl |"),
        "{}",
        installs[0]
    );
    assert_eq!(
        calls_to(&calls, "rustup").len(),
        2,
        "install, default: {calls:?}"
    );
    let build = format!(
        "build --release -p lab@0.1.0 --features cuda | 13000 | {}",
        repo().display()
    );
    assert_eq!(calls_to(&calls, "cargo"), [build.as_str()]);
    assert_eq!(calls_to(&calls, "lab").len(), 1);

    // Run again: nothing left to install; the build is cargo's to skip.
    let (out, calls) = host.bootstrap(&[]);
    succeeded(&out);
    for installer in ["apt-get", "rustup", "curl"] {
        assert!(calls_to(&calls, installer).is_empty(), "{calls:?}");
    }
    assert_eq!(calls_to(&calls, "cargo"), [build.as_str()]);
}

#[test]
fn a_host_without_a_gpu_a_cuda_version_or_headers_is_told_the_fix_in_one_line() {
    let host = Host::ready();
    host.set("no-gpu", "");
    let (out, calls) = host.bootstrap(&["--no-build"]);
    failed_with(&out, &calls, &["nvidia-smi finds no GPU"]);
    host.unset("no-gpu");

    host.set("cuda-line", "");
    let (out, calls) = host.bootstrap(&["--no-build"]);
    failed_with(&out, &calls, &["no \"CUDA Version", "CUDARC_CUDA_VERSION"]);
    host.set("cuda-line", "CUDA Version: 12.8");

    std::fs::remove_file(host.path("cuda/include/cuda.h")).unwrap();
    let (out, calls) = host.bootstrap(&["--no-build"]);
    let cuda = host.path("cuda");
    let cuda = cuda.to_str().unwrap();
    failed_with(&out, &calls, &[cuda, "cuda-toolkit-12-8", "CUDA_PATH"]);
}
