//! The budget guard end to end on the real binary with the meter provider: alert, graceful
//! stop (exit 3, loadable checkpoint), immediate stop (exit 4, no checkpoint; before launch no
//! step either), the fail-safe on a stale or malformed budget.json, the dry-run table, and
//! that no API key ever reaches output or files.

#[path = "../crates/budget/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::data_dir;
use common::{Reply, Server, PLANTED_KEY};
use serde_json::Value;

/// A model that trains in milliseconds per step, plus a `[budget]` section.
fn write_config(dir: &Path, total_steps: u64, budget: &str) -> PathBuf {
    let text = format!(
        r#"name = "budget-tiny"
[model]
vocab_size = 50257
n_layer = 1
d_model = 32
n_head = 2
n_kv_head = 1
d_ff = 64
seq_len = 16
[train]
micro_batch = 2
total_steps = {total_steps}
warmup_steps = 1
peak_lr = 1e-3
min_lr = 1e-4
log_every = 5
eval_every = {total_steps}
eval_batches = 1
ckpt_every = {total_steps}
[budget]
{budget}
"#
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `c` without the providers' API keys of the environment the tests run in.
fn keyless(mut c: Command) -> Command {
    c.env_remove("LAMBDA_API_KEY").env_remove("RUNPOD_API_KEY");
    c
}

fn lab() -> Command {
    keyless(crate::common::lab())
}

/// `lab train` of `config` on the prepared corpus into `run`, without API keys.
fn train_cmd(config: &Path, run: &Path) -> Command {
    keyless(crate::common::train_on(config, &data_dir(), run))
}

fn train(config: &Path, run: &Path, extra: &[&str]) -> Output {
    let out = train_cmd(config, run).args(extra).output().unwrap();
    eprintln!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn events(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn kinds(run: &Path, kind: &str) -> Vec<Value> {
    events(run)
        .into_iter()
        .filter(|e| e["kind"] == kind)
        .collect()
}

fn steps_logged(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .count()
}

/// A Slack-style webhook on loopback that accepts every post to its secret path.
fn webhook() -> Server {
    let hook = Server::start();
    hook.script(
        "POST /services/T0/B0/hook-secret",
        vec![Reply::Body(200, "ok".into())],
    );
    hook
}

fn checkpoints(run: &Path) -> Vec<(u64, PathBuf)> {
    lab_train::checkpoint::list(run).unwrap_or_default()
}

#[test]
fn alert_threshold_reports_once_and_the_run_completes() {
    let hook = webhook();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cfg = write_config(
        dir.path(),
        20,
        "cap_usd = 1000\nalert_usd = 1\nprior_spend_usd = 2\nrate_usd_per_hr = 3.6\ncheck_interval_s = 0.01\nwebhook_url_env = \"LAB_TEST_WEBHOOK\"",
    );
    let out = train_cmd(&cfg, &run)
        .env(
            "LAB_TEST_WEBHOOK",
            format!("{}/services/T0/B0/hook-secret", hook.url()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let all = text(&out);
    assert_eq!(
        all.matches("budget alert: spent $2.00 is past the alert $1.00")
            .count(),
        1,
        "{all}"
    );
    let alerts = kinds(&run, "budget_alert");
    assert_eq!(alerts.len(), 1, "{:?}", events(&run));
    assert!(alerts[0]["spent_usd"].as_f64().unwrap() >= 2.0);
    assert_eq!(alerts[0]["alert_usd"], 1.0);
    let budget: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("budget.json")).unwrap()).unwrap();
    assert_eq!(budget["provider"], "meter");
    assert!(kinds(&run, "done").len() == 1);
    // The webhook got one Slack-style message; its secret URL is printed nowhere.
    let posts: Vec<_> = hook
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1);
    let body: Value = serde_json::from_str(&posts[0].body).unwrap();
    assert!(
        body["text"].as_str().unwrap().contains("budget alert"),
        "{body}"
    );
    assert!(!all.contains("hook-secret"));
}

/// The trainer's stability alerts use the budget guard's webhook: a detected spike, each
/// rollback and the stop that ends a run which keeps rolling back.
#[test]
fn spike_rollback_and_stop_alerts_reach_the_budget_webhook() {
    let hook = webhook();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cfg = write_config(
        dir.path(),
        60,
        "cap_usd = 1000\nrate_usd_per_hr = 0.01\nwebhook_url_env = \"LAB_TEST_WEBHOOK\"\n\
         [stability]\ngrad_norm_ratio = 0",
    );
    // A learning rate at which this small model learns the text within 30 steps.
    let fast = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("peak_lr = 1e-3", "peak_lr = 2e-2");
    std::fs::write(&cfg, fast).unwrap();
    // Eleven spike batches, each rolled back and skipped: one rollback more than allowed.
    let out = train_cmd(&cfg, &run)
        .args(["--inject-spike-at-step", "30", "--spike-batches", "11"])
        .args(["--spike-policy", "rollback"])
        .env(
            "LAB_TEST_WEBHOOK",
            format!("{}/services/T0/B0/hook-secret", hook.url()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let texts: Vec<String> = hook
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| {
            serde_json::from_str::<Value>(&r.body).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let count = |needle: &str| texts.iter().filter(|t| t.contains(needle)).count();
    let detected = texts
        .iter()
        .filter(|t| t.starts_with("loss_spike at step 30: loss"));
    assert_eq!(detected.count(), 11, "{texts:#?}");
    assert_eq!(count(": rollback "), 11, "{texts:#?}");
    assert_eq!(count("stopped by the stability policy"), 1, "{texts:#?}");
    assert_eq!(kinds(&run, "rollback").len(), 11);
    assert!(!text(&out).contains("hook-secret"));
}

#[test]
fn terminate_on_exit_ends_the_instance_and_writes_the_proof() {
    let server = Server::start();
    server.script(
        "POST /api/v1/instance-operations/terminate",
        vec![Reply::Body(
            200,
            r#"{"data":{"terminated_instances":[{"id":"i-1"}]}}"#.into(),
        )],
    );
    server.script(
        "GET /api/v1/instances",
        vec![
            Reply::Body(200, r#"{"data":[{"id":"i-1","status":"active","instance_type":{"price_cents_per_hour":129}}]}"#.into()),
            Reply::Body(200, r#"{"data":[]}"#.into()),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let budget = dir.path().join("budget.json");
    fresh_budget_json(&budget, 1.0, 1.29, 300.0);
    let cfg = write_config(
        dir.path(),
        5,
        &format!(
            "cap_usd = 35\nprovider = \"lambda\"\ninstance_id = \"i-1\"\napi_base_url = \"{}\"\napi_key_env = \"LAB_TEST_LAMBDA_KEY\"",
            server.url()
        ),
    );
    let out = train_cmd(&cfg, &run)
        .args([
            "--budget-curr-cost-uri",
            budget.to_str().unwrap(),
            "--terminate-on-exit",
        ])
        .env("LAB_TEST_LAMBDA_KEY", PLANTED_KEY)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("instance end confirmed"),
        "{}",
        text(&out)
    );
    let proof = std::fs::read_to_string(run.join("termination.json")).unwrap();
    let v: Value = serde_json::from_str(&proof).unwrap();
    assert_eq!(v["confirmed_gone"], true);
    assert_eq!(
        v["response"]["data"]["terminated_instances"][0]["id"],
        "i-1"
    );
    assert!(!proof.contains(PLANTED_KEY) && !text(&out).contains(PLANTED_KEY));
    let post = server
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    assert_eq!(post.body, r#"{"instance_ids":["i-1"]}"#);
}

#[test]
fn projected_over_cap_checkpoints_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // $0.10/s: the plan says 0.36 s ($0.04, launch ok); a million measured steps project far
    // past $5, while the spend at the first check stays far below it even on a loaded machine.
    let cfg = write_config(
        dir.path(),
        1_000_000,
        "cap_usd = 5\nrate_usd_per_hr = 360\nplanned_hours = 0.0001\ncheck_interval_s = 0.3",
    );
    let out = train(&cfg, &run, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("projected total $") && all.contains("exceeds the cap $5.00"),
        "{all}"
    );
    let stops = kinds(&run, "budget_stop_graceful");
    assert_eq!(stops.len(), 1);
    let step = stops[0]["step"].as_u64().unwrap();
    // Stopped at its first checks, not after a long run: counted in steps, not seconds.
    assert!(step > 0 && step < 10_000, "stopped at step {step}");
    assert!(stops[0]["spent_usd"].as_f64().unwrap() <= 5.0);
    // The checkpoint of the stop step is there, verifies and loads.
    let cks = checkpoints(&run);
    assert_eq!(cks.iter().map(|c| c.0).collect::<Vec<_>>(), vec![step]);
    let loaded =
        lab_train::checkpoint::load_latest_good(&run, &lab_train::checkpoint::every, &mut |w| {
            panic!("{w}")
        })
        .unwrap()
        .expect("a loadable checkpoint");
    assert_eq!(loaded.state.step, step);
    assert!(kinds(&run, "checkpoint").len() == 1);

    // Resuming without a budget would train past the cap the run recorded: refused.
    let text = std::fs::read_to_string(&cfg).unwrap();
    let unbudgeted = dir.path().join("no-budget.toml");
    std::fs::write(&unbudgeted, &text[..text.find("[budget]").unwrap()]).unwrap();
    let out = train(&unbudgeted, &run, &["--resume-from-latest"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("ran under a $5.00 budget cap"), "{stderr}");
    assert_eq!(checkpoints(&run).len(), 1, "nothing trained");
    assert_eq!(kinds(&run, "resume").len(), 0);
}

#[test]
fn started_over_cap_exits_4_with_no_step_and_no_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cfg = write_config(
        dir.path(),
        50,
        "cap_usd = 35\nalert_usd = 30\nprior_spend_usd = 40",
    );
    let out = train(&cfg, &run, &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("the cap is already reached: spent $40.00 >= cap $35.00"));
    assert_eq!(steps_logged(&run), 0);
    assert!(checkpoints(&run).is_empty());
    assert!(!run.join("latest").exists());
    assert!(!run.join("status.json").exists());
    assert_eq!(kinds(&run, "budget_refused").len(), 1);
}

#[test]
fn spend_crossing_the_cap_mid_run_exits_4_without_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // $10/s, first check after 0.3 s: spent > $2 already. No planned hours: launch allowed.
    let cfg = write_config(
        dir.path(),
        100_000,
        "cap_usd = 2\nrate_usd_per_hr = 36000\ncheck_interval_s = 0.3",
    );
    let out = train(&cfg, &run, &[]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("exceeds the cap $2.00"),
        "{}",
        text(&out)
    );
    let stops = kinds(&run, "budget_stop_immediate");
    assert_eq!(stops.len(), 1);
    assert!(stops[0]["step"].as_u64().unwrap() > 0, "it did train");
    assert!(
        checkpoints(&run).is_empty(),
        "no checkpoint on an immediate stop"
    );
}

fn fresh_budget_json(path: &Path, spent: f64, rate: f64, poll: f64) {
    let now = lab_budget::clock::now_unix();
    let f = lab_budget::BudgetFile {
        spent_usd: spent,
        rate_usd_per_hr: rate,
        hours_elapsed: 1.0,
        projected_total_usd: spent,
        last_update_utc: lab_budget::clock::format_utc(now),
        provider: Some("lambda".into()),
        instance_id: Some("i-1".into()),
        method: None,
        remaining_hours: None,
        poll_interval_s: Some(poll),
        stale: false,
        error: None,
        consecutive_failures: 0,
        written_utc: None,
        kept_from: None,
    };
    f.write(path).unwrap();
}

#[test]
fn dry_run_prints_the_decision_table_and_trains_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let budget = dir.path().join("budget.json");
    fresh_budget_json(&budget, 3.0, 1.29, 300.0);
    let cfg = write_config(
        dir.path(),
        50,
        "cap_usd = 35\nalert_usd = 30\nplanned_hours = 24",
    );
    let uri = budget.to_str().unwrap();
    let out = train(
        &cfg,
        &run,
        &["--budget-curr-cost-uri", uri, "--dry-run-budget"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let all = text(&out);
    for want in [
        "spent so far",
        "$3.00",
        "projected total",
        "$33.96",
        "decision: launch (exit 0)",
    ] {
        assert!(all.contains(want), "{want}: {all}");
    }
    // Price above the maximum: refuse, exit 4, still nothing trained.
    let out = train(
        &cfg,
        &run,
        &[
            "--budget-curr-cost-uri",
            uri,
            "--dry-run-budget",
            "--max-price-usd-per-hr",
            "1.0",
        ],
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out).contains("above --max-price-usd-per-hr $1.00/h"));
    assert_eq!(steps_logged(&run), 0);
    assert!(checkpoints(&run).is_empty());
    // Same table from `lab budget check`.
    let out = lab()
        .args(["budget", "check", "--uri", uri, "--budget-cap-usd", "2.5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("cap is already reached"));
    let out = lab()
        .args([
            "budget",
            "check",
            "--uri",
            uri,
            "--budget-cap-usd",
            "35",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["launch"], true);
}

#[test]
fn malformed_budget_json_mid_run_stops_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let budget = dir.path().join("budget.json");
    fresh_budget_json(&budget, 1.0, 1.0, 3600.0);
    let cfg = write_config(
        dir.path(),
        1_000_000,
        "cap_usd = 1e9\npoll_interval_s = 3600\ncheck_interval_s = 0.05\ngrace_s = 1.0",
    );
    let child: Child = train_cmd(&cfg, &run)
        .args(["--budget-curr-cost-uri", budget.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it is training, the file turns to garbage.
    let t = Instant::now();
    while steps_logged(&run) == 0 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&budget, "{\"spent_usd\": 1.0, \"rate_").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("malformed") && all.contains("grace period"),
        "{all}"
    );
    // The guard's own record: it stopped no sooner than grace_s (1 s) after it first saw the
    // bad file, and kept training in between.
    let degraded = kinds(&run, "budget_degraded");
    assert_eq!(degraded.len(), 1);
    let stop = &kinds(&run, "budget_stop_graceful")[0];
    let at = |e: &Value| lab_run::clock::parse_utc(e["time_utc"].as_str().unwrap()).unwrap();
    assert!(at(stop) - at(&degraded[0]) >= 0.99, "{degraded:?} {stop:?}");
    assert!(stop["step"].as_u64() > degraded[0]["step"].as_u64());
    assert_eq!(checkpoints(&run).len(), 1);
}

#[test]
fn stale_sidecar_file_stops_the_run_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let budget = dir.path().join("budget.json");
    // A meter sidecar polling every 0.1 s for ~3 s, then gone: its file goes stale.
    let sidecar = lab()
        .args([
            "budget",
            "sidecar",
            "--provider",
            "meter",
            "--rate-usd-per-hr",
            "1",
        ])
        .args(["--poll-interval-s", "0.1", "--max-polls", "30", "--out"])
        .arg(&budget)
        .arg("--run")
        .arg(&run)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !budget.exists() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let cfg = write_config(
        dir.path(),
        1_000_000,
        "cap_usd = 1e9\npoll_interval_s = 0.1\ncheck_interval_s = 0.05\ngrace_s = 1.0",
    );
    let out = train(
        &cfg,
        &run,
        &["--budget-curr-cost-uri", budget.to_str().unwrap()],
    );
    let side = sidecar.wait_with_output().unwrap();
    assert!(side.status.success());
    assert_eq!(
        String::from_utf8_lossy(&side.stdout)
            .matches("budget: meter spent")
            .count(),
        30
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("is stale") && all.contains("grace period"),
        "{all}"
    );
    assert_eq!(checkpoints(&run).len(), 1);
    // The sidecar read the trainer's status.json: its projection covered the planned run.
    let f: Value = serde_json::from_str(&std::fs::read_to_string(&budget).unwrap()).unwrap();
    assert!(f["remaining_hours"].as_f64().is_some(), "{f}");
}

/// A sidecar that serves budget.json over http (or writes it outside the run folder): the run
/// folder keeps the last numbers the guard read, so the export's manifest reports the spend.
#[test]
fn the_run_keeps_the_spend_it_read_from_an_http_sidecar() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let served = dir.path().join("served.json");
    fresh_budget_json(&served, 2.5, 1.29, 300.0);
    let body = std::fs::read_to_string(&served).unwrap();
    server.script("GET /budget.json", vec![Reply::Body(200, body)]);
    let cfg = write_config(dir.path(), 5, "cap_usd = 35");
    let uri = format!("{}/budget.json", server.url());
    let out = train_cmd(&cfg, &run)
        .args(["--budget-curr-cost-uri", &uri])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let kept: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("budget.json")).unwrap()).unwrap();
    assert_eq!(kept["spent_usd"], 2.5, "{kept}");
    assert_eq!(kept["kept_from"], uri.as_str(), "{kept}");

    let export = dir.path().join("export");
    let out = lab()
        .args(["export", "--run"])
        .arg(&run)
        .arg("--output")
        .arg(&export)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(export.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["cost"]["total_usd"], 2.5, "{}", manifest["cost"]);
}

#[test]
fn planted_api_key_appears_in_no_output_or_file() {
    let server = Server::start();
    server.script(
        "GET /api/v1/instances",
        vec![
            Reply::Body(
                200,
                r#"{"data":[{"id":"i-1","status":"active","instance_type":{"price_cents_per_hour":129}}]}"#.into(),
            ),
            Reply::EchoAuth,
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let budget = dir.path().join("budget.json");
    let out = lab()
        .env("LAMBDA_API_KEY", PLANTED_KEY)
        .args([
            "budget",
            "sidecar",
            "--provider",
            "lambda",
            "--instance-id",
            "i-1",
        ])
        .args([
            "--api-base-url",
            &server.url(),
            "--poll-interval-s",
            "0.05",
            "--max-polls",
            "3",
        ])
        .args(["--started-at", "2026-01-01T00:00:00Z", "--out"])
        .arg(&budget)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let all = text(&out);
    assert!(all.contains("<redacted>"), "the server echoed it: {all}");
    assert!(!all.contains(PLANTED_KEY), "{all}");
    let file = std::fs::read_to_string(&budget).unwrap();
    assert!(
        file.contains("\"stale\": true") && !file.contains(PLANTED_KEY),
        "{file}"
    );
    assert!(server
        .requests()
        .iter()
        .all(|r| r.head.contains(PLANTED_KEY)));

    // From a key file, the terminate path: errors and termination.json are clean too.
    let key_file = dir.path().join("lambda.key");
    std::fs::write(&key_file, format!("{PLANTED_KEY}\n")).unwrap();
    server.script(
        "POST /api/v1/instance-operations/terminate",
        vec![Reply::EchoAuth],
    );
    let proof = dir.path().join("termination.json");
    let out = lab()
        .args([
            "budget",
            "terminate",
            "--provider",
            "lambda",
            "--instance-id",
            "i-1",
        ])
        .args([
            "--api-base-url",
            &server.url(),
            "--api-key-env",
            "LAB_TEST_NO_SUCH_VAR",
        ])
        .arg("--api-key-file")
        .arg(&key_file)
        .arg("--out")
        .arg(&proof)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.starts_with("error: lambda: POST") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!text(&out).contains(PLANTED_KEY), "{}", text(&out));
    assert!(!std::fs::read_to_string(&proof)
        .unwrap()
        .contains(PLANTED_KEY));
}

#[test]
fn bad_input_is_one_line_exit_1_and_bad_flags_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cfg = write_config(dir.path(), 10, "cap_usd = 35\nalert_usd = 40");
    let out = train(&cfg, &run, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains("budget.alert_usd") && err.lines().count() == 1,
        "{err}"
    );

    let cfg = write_config(dir.path(), 10, "cap_usd = 35");
    // A flag's value out of range is a usage error: exit 2, the same one line.
    let out = train(&cfg, &run, &["--budget-cap-usd=-3"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: --budget-cap-usd (-3) must be") && err.lines().count() == 1,
        "{err}"
    );

    // `lab budget sidecar ARGS --out b.json`: its exit code and stderr.
    let sidecar = |args: &[&str]| {
        let out = lab()
            .args(["budget", "sidecar"])
            .args(args)
            .arg("--out")
            .arg(dir.path().join("b.json"))
            .env_remove("RUNPOD_POD_ID")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };

    let (code, err) = sidecar(&["--provider", "runpod"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("pod id") && err.lines().count() == 1, "{err}");

    let (code, err) = sidecar(&["--provider", "lambda"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("LAMBDA_API_KEY") && err.lines().count() == 1,
        "{err}"
    );

    // A key given where its variable's name belongs is refused, and not shown.
    let (code, err) = sidecar(&[
        "--provider",
        "runpod",
        "--instance-id",
        "pod1",
        "--api-key-env",
        PLANTED_KEY,
    ]);
    assert_eq!(code, Some(2), "a flag's value: a usage error");
    assert!(
        err.contains("--api-key-env") && err.lines().count() == 1 && !err.contains(PLANTED_KEY),
        "{err}"
    );

    // A provider that does not exist is a usage error: exit 2, the same one line.
    let (code, err) = sidecar(&["--provider", "aws"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("error: --provider \"aws\" is unknown") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!dir.path().join("b.json").exists());
}

/// GPU health (here from recorded readings, `--inject-gpu-telemetry`): every logged row gets
/// the readings; ten minutes under 80 % utilisation and new ECC errors become events and
/// reach the budget guard's webhook, once each.
#[test]
fn gpu_health_readings_reach_the_metrics_and_their_alerts_the_webhook() {
    let hook = webhook();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cfg = write_config(
        dir.path(),
        16,
        "cap_usd = 1000\nrate_usd_per_hr = 0.01\nwebhook_url_env = \"LAB_TEST_WEBHOOK\"",
    );
    // A reading a minute: busy for 3, then 30 %; 2 uncorrected ECC errors from the 13th.
    let readings: String = (0..16)
        .map(|i| {
            let util = if i < 3 { 95.0 } else { 30.0 };
            let ecc = if i < 12 { 0 } else { 2 };
            format!(
                "{{\"t_s\":{},\"util_pct\":{util},\"mem_used_bytes\":{},\"mem_total_bytes\":{},\"temp_c\":{},\"ecc_uncorrected\":{ecc}}}\n",
                60 * i,
                40u64 << 30,
                80u64 << 30,
                60 + i
            )
        })
        .collect();
    let telemetry = dir.path().join("gpu.jsonl");
    std::fs::write(&telemetry, readings).unwrap();
    let train = |telemetry: &Path| {
        let mut c = train_cmd(&cfg, &run);
        c.args(["--log-every", "1", "--inject-gpu-telemetry"])
            .arg(telemetry)
            .env(
                "LAB_TEST_WEBHOOK",
                format!("{}/services/T0/B0/hook-secret", hook.url()),
            );
        c
    };

    // A file that is not readings: one line naming the flag, before any step.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"util\": 5}\n").unwrap();
    let out = train(&bad).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--inject-gpu-telemetry") && stderr.contains("bad.jsonl line 1"));
    assert_eq!(steps_logged(&run), 0);

    let out = train(&telemetry).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let rows: Vec<Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 16);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            row["gpu_util_pct"],
            if i < 3 { 95.0 } else { 30.0 },
            "{row}"
        );
        assert_eq!(row["gpu_temp_c"], 60.0 + i as f64, "{row}");
        assert_eq!(row["gpu_mem_used_gib"], 40.0, "{row}");
    }
    let gpu = kinds(&run, "gpu");
    assert_eq!(gpu.len(), 1);
    assert!(gpu[0]["name"].as_str().unwrap().starts_with("replay of"));
    // With the peak its MFU is measured against: tiny-cpu computes on the CPU, in fp32.
    let mfu = &gpu[0]["mfu"];
    assert_eq!(
        (mfu["device"].as_str(), mfu["precision"].as_str()),
        (Some("cpu"), Some("fp32"))
    );
    assert_eq!(mfu["flops"], 160e9);
    let hardware: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("hardware.json")).unwrap()).unwrap();
    assert_eq!(hardware["mfu_peak"], *mfu);
    // Low from the 4th reading (t = 180 s): ten minutes at the 14th (t = 780 s), step 14.
    let low = kinds(&run, "gpu_low_utilization");
    assert_eq!(low.len(), 1, "{low:?}");
    assert_eq!(
        (low[0]["step"].as_u64(), low[0]["for_s"].as_f64()),
        (Some(14), Some(600.0))
    );
    assert_eq!(low[0]["mean_util_pct"], 30.0);
    let ecc = kinds(&run, "gpu_ecc_errors");
    assert_eq!(ecc.len(), 1, "{ecc:?}");
    assert_eq!(
        (ecc[0]["step"].as_u64(), ecc[0]["new"].as_u64()),
        (Some(13), Some(2))
    );

    let texts: Vec<String> = hook
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| serde_json::from_str::<Value>(&r.body).unwrap()["text"].to_string())
        .collect();
    let count = |needle: &str| texts.iter().filter(|t| t.contains(needle)).count();
    assert_eq!(count("utilisation 30% for 10 min"), 1, "{texts:#?}");
    assert_eq!(count("2 new uncorrected ECC error(s)"), 1, "{texts:#?}");
}
