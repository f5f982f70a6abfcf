//! Build facts for the export manifest: burn's version (from Cargo.lock), rustc's version and
//! the git commit this binary was built from ("unknown" outside a git checkout).

use std::process::Command;

fn run(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let lock = std::fs::read_to_string("../../Cargo.lock").unwrap_or_default();
    let burn = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"burn\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc = run(&rustc, &["--version"]).unwrap_or_else(|| "unknown".into());
    let commit = run("git", &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LAB_BURN_VERSION={burn}");
    println!("cargo:rustc-env=LAB_RUSTC_VERSION={rustc}");
    println!("cargo:rustc-env=LAB_GIT_COMMIT={commit}");
    for f in [
        "../../Cargo.lock",
        "../../.git/HEAD",
        "../../.git/refs/heads",
        "../../.git/packed-refs",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
}
