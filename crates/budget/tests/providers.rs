//! The sidecar against a real HTTP server on loopback speaking the Lambda and RunPod shapes,
//! including 429, 500, timeouts, truncated JSON and wrong types: it keeps its last good
//! numbers, flags staleness and never crashes. Also terminate-on-exit and key hygiene.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::{Reply, Server, PLANTED_KEY};
use lab_budget::clock::Clock;
use lab_budget::clock::{format_utc, parse_utc};
use lab_budget::file::{judge, BudgetUri, Problem, Reading};
use lab_budget::lambda::Lambda;
use lab_budget::provider::{EndAction, Provider};
use lab_budget::runpod::Runpod;
use lab_budget::sidecar::{Poll, Sidecar};
use lab_budget::terminate::end_and_confirm;
use lab_budget::{BudgetFile, Secret};

const T0: &str = "2026-11-21T12:00:00Z";
const TIMEOUT: Duration = Duration::from_millis(300);

fn key() -> Secret {
    Secret::new(PLANTED_KEY.into(), "test").unwrap()
}

fn lambda_instances(status: &str, price: &str) -> String {
    format!(
        r#"{{"data":[{{"id":"0920582c7ff0","name":"lab","ip":"198.51.100.2","status":"{status}",
        "instance_type":{{"name":"gpu_1x_a100_sxm4","description":"1x A100 (80 GB SXM4)",
        "price_cents_per_hour":{price}}},"region":{{"name":"us-east-1"}}}}]}}"#
    )
}

fn read_file(p: &Path) -> BudgetFile {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn approx(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-6, "{a} != {b}");
}

#[test]
fn lambda_sidecar_keeps_last_good_numbers_through_every_failure() {
    let server = Server::start();
    let good = lambda_instances("active", "129");
    server.script(
        "GET /api/v1/instances",
        vec![
            Reply::Body(200, good.clone()),
            Reply::Body(
                429,
                r#"{"error":{"code":"global/too-many-requests"}}"#.into(),
            ),
            Reply::Body(500, "internal error".into()),
            Reply::Hang(Duration::from_millis(1500)),
            Reply::Body(200, good[..good.len() / 2].to_string()),
            Reply::CutShort(good.clone()),
            Reply::Body(200, lambda_instances("active", "\"129\"")),
            Reply::Body(200, r#"{"data": {"id": 3}}"#.into()),
            Reply::Body(200, good.clone()),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("budget.json");
    let t0 = parse_utc(T0).unwrap();
    let started = t0 - 3600.0; // the instance has run one hour
    let lambda = Lambda::new(&server.url(), key(), None, started, TIMEOUT).unwrap();
    let mut sidecar = Sidecar::new(Box::new(lambda), out.clone(), None, 300.0);

    let Poll::Good(first) = sidecar.poll_once(t0) else {
        panic!("first poll should succeed")
    };
    approx(first.spent_usd, 1.29);
    approx(first.rate_usd_per_hr, 1.29);
    approx(first.hours_elapsed, 1.0);
    assert_eq!(first.instance_id.as_deref(), Some("0920582c7ff0"));
    assert!(first
        .method
        .as_deref()
        .unwrap()
        .contains("lambda reports no spend"));
    assert_eq!(read_file(&out), first);

    let expected = [
        "429",
        "500",
        "timed out",
        "not valid JSON",
        "reading the body",
        "price_cents_per_hour is a string, expected a number",
        "expected a list",
    ];
    for (i, want) in expected.iter().enumerate() {
        let now = t0 + 300.0 * (i + 1) as f64;
        // A hung server ends as "timed out" (the client's timeout fired), not as an answer.
        let Poll::Failed { error, kept } = sidecar.poll_once(now) else {
            panic!("poll {i} should fail ({want})")
        };
        assert!(error.contains(want), "poll {i}: {error}");
        assert!(!error.contains('\n'));
        let kept = kept.expect("the last good numbers are kept");
        let on_disk = read_file(&out);
        assert_eq!(on_disk, kept);
        approx(on_disk.spent_usd, first.spent_usd);
        assert_eq!(
            on_disk.last_update_utc, first.last_update_utc,
            "age keeps growing"
        );
        assert!(on_disk.stale);
        assert_eq!(on_disk.consecutive_failures, (i + 1) as u64);
        assert_eq!(on_disk.error.as_deref(), Some(error.as_str()));
        // The guard's view: fresh for three polls, stale after.
        let text = std::fs::read_to_string(&out).unwrap();
        match judge(&BudgetUri::File(out.clone()), &text, now, 300.0) {
            Reading::Fresh { .. } => assert!(now - t0 <= 900.0, "poll {i}"),
            Reading::Bad {
                problem, reason, ..
            } => {
                assert_eq!(problem, Problem::Stale, "{reason}");
                assert!(now - t0 > 900.0);
                assert!(
                    reason.contains("stale") && reason.contains(want),
                    "{reason}"
                );
            }
        }
    }
    // Recovery: the gap is charged at the price, from the last good poll.
    let now = t0 + 300.0 * 8.0;
    let Poll::Good(back) = sidecar.poll_once(now) else {
        panic!("recovers")
    };
    approx(back.spent_usd, 1.29 + 1.29 * (2400.0 / 3600.0));
    assert!(!back.stale && back.error.is_none());
    assert_eq!(back.last_update_utc, format_utc(now));
    // Every request carried the key as a bearer token, and nowhere else.
    for r in server.requests() {
        assert!(r.head.contains(&format!("Bearer {PLANTED_KEY}")));
        assert!(!r.target.contains(PLANTED_KEY));
    }
}

#[test]
fn lambda_price_change_is_charged_conservatively() {
    let server = Server::start();
    server.script(
        "GET /api/v1/instances",
        vec![
            Reply::Body(200, lambda_instances("active", "100")),
            Reply::Body(200, lambda_instances("active", "200")),
            Reply::Body(200, lambda_instances("active", "150")),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let t0 = parse_utc(T0).unwrap();
    let lambda = Lambda::new(
        &server.url(),
        key(),
        Some("0920582c7ff0".into()),
        t0,
        TIMEOUT,
    )
    .unwrap();
    let mut s = Sidecar::new(Box::new(lambda), dir.path().join("b.json"), None, 300.0);
    let spent = |p: Poll| match p {
        Poll::Good(f) => f.spent_usd,
        other => panic!("{other:?}"),
    };
    approx(spent(s.poll_once(t0)), 0.0);
    approx(spent(s.poll_once(t0 + 3600.0)), 2.0); // the higher of $1 and $2
    approx(spent(s.poll_once(t0 + 7200.0)), 4.0); // the higher of $2 and $1.50
}

#[test]
fn lambda_without_instance_id_refuses_to_guess_between_two() {
    let server = Server::start();
    let two = r#"{"data":[
        {"id":"a","status":"active","instance_type":{"price_cents_per_hour":129}},
        {"id":"b","status":"booting","instance_type":{"price_cents_per_hour":129}},
        {"id":"c","status":"terminated","instance_type":{"price_cents_per_hour":129}}]}"#;
    server.script("GET /api/v1/instances", vec![Reply::Body(200, two.into())]);
    let mut lambda = Lambda::new(&server.url(), key(), None, 0.0, TIMEOUT).unwrap();
    let e = format!("{:#}", lambda.sample(10.0).unwrap_err());
    assert!(
        e.contains("2 live instances") && e.contains("--instance-id"),
        "{e}"
    );
    let mut lambda = Lambda::new(&server.url(), key(), Some("zz".into()), 0.0, TIMEOUT).unwrap();
    let e = format!("{:#}", lambda.sample(10.0).unwrap_err());
    assert!(e.contains("zz") && e.contains("not in"), "{e}");
}

fn runpod_pods(cost: &str) -> String {
    format!(
        r#"[{{"id":"pod1","name":"lab","desiredStatus":"RUNNING","costPerHr":{cost},
        "adjustedCostPerHr":{cost},"lastStartedAt":"{T0}","gpuCount":1}},
        {{"id":"other","desiredStatus":"RUNNING","costPerHr":9.99,"lastStartedAt":"{T0}"}}]"#
    )
}

fn runpod_billing() -> String {
    r#"[{"podId":"pod1","time":"2026-11-21T12:00:00Z","amount":0.79},
        {"podId":"pod1","time":"2026-11-21T13:00:00Z","amount":0.40},
        {"podId":"other","time":"2026-11-21T13:00:00Z","amount":50.0}]"#
        .into()
}

#[test]
fn runpod_spent_is_billed_plus_unbilled_time_and_survives_failures() {
    let server = Server::start();
    server.script(
        "GET /v2/pods",
        vec![
            Reply::Body(200, runpod_pods("0.79")),
            Reply::Body(200, runpod_pods("0.79")),
            Reply::Body(200, runpod_pods("\"0.79\"")),
            Reply::Body(503, "upstream".into()),
            Reply::Body(200, runpod_pods("0.79")),
        ],
    );
    server.script(
        "GET /v2/billing/pods",
        vec![
            Reply::Body(200, runpod_billing()),
            Reply::Body(429, "slow down".into()),
            // (the two failed /v2/pods polls never reach billing)
            Reply::Hang(Duration::from_millis(1500)),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("budget.json");
    let t0 = parse_utc(T0).unwrap();
    let now = t0 + 3600.0 + 40.0 * 60.0; // 13:40; billed through 13:35 (one cycle of lag)
    let rp = Runpod::new(&server.url(), key(), "pod1".into(), TIMEOUT).unwrap();
    let mut s = Sidecar::new(Box::new(rp), out.clone(), None, 300.0);
    let Poll::Good(f) = s.poll_once(now) else {
        panic!("good")
    };
    approx(f.spent_usd, 1.19 + 0.79 * 5.0 / 60.0);
    approx(f.rate_usd_per_hr, 0.79);
    approx(f.hours_elapsed, 100.0 / 60.0);
    assert_eq!(f.instance_id.as_deref(), Some("pod1"));
    let billing = server
        .requests()
        .into_iter()
        .find(|r| r.target.starts_with("/v2/billing/pods"))
        .unwrap();
    assert!(billing.target.contains("podId=pod1") && billing.target.contains("bucketSize=hour"));
    for want in ["429", "costPerHr is a string", "503", "timed out"] {
        let Poll::Failed { error, kept } = s.poll_once(now + 60.0) else {
            panic!("{want}: should fail")
        };
        assert!(error.starts_with("runpod: "), "{error}");
        assert!(error.contains(want), "{want}: {error}");
        approx(kept.unwrap().spent_usd, f.spent_usd);
        assert!(read_file(&out).stale);
    }
}

#[test]
fn sidecar_loop_never_crashes_and_writes_nothing_before_good_numbers() {
    let server = Server::start();
    server.script(
        "GET /api/v1/instances",
        vec![
            Reply::Body(500, "boom".into()),
            Reply::Body(200, "{".into()),
            Reply::Body(200, "null".into()),
            Reply::Body(200, r#"{"data":[{"id":"x","status":"active","instance_type":{"price_cents_per_hour":-5}}]}"#.into()),
            Reply::Body(200, lambda_instances("active", "129")),
            Reply::Body(200, r#"[1, 2, 3]"#.into()),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("budget.json");
    let lambda = Lambda::new(&server.url(), key(), None, 0.0, TIMEOUT).unwrap();
    let mut s = Sidecar::new(Box::new(lambda), out.clone(), None, 0.01);
    let mut lines = Vec::new();
    s.run(Some(8), &AtomicBool::new(false), &mut |l| {
        lines.push(l.to_string())
    });
    assert_eq!(lines.len(), 8, "{lines:#?}");
    assert!(
        lines[..4].iter().all(|l| l.contains("nothing written")),
        "{lines:#?}"
    );
    assert!(lines[3].contains("negative"), "{}", lines[3]);
    assert!(lines[4].contains("spent $"), "{}", lines[4]);
    assert!(lines[5..]
        .iter()
        .all(|l| l.contains("kept the last good numbers")));
    let f = read_file(&out);
    assert!(f.stale && f.consecutive_failures == 3);
}

#[test]
fn terminate_lambda_relists_until_gone_and_writes_the_answer() {
    let server = Server::start();
    server.script(
        "POST /api/v1/instance-operations/terminate",
        vec![Reply::Body(
            200,
            r#"{"data":{"terminated_instances":[{"id":"0920582c7ff0","status":"terminating"}]}}"#
                .into(),
        )],
    );
    server.script(
        "GET /api/v1/instances",
        vec![
            Reply::Body(200, lambda_instances("active", "129")),
            Reply::Body(429, "{}".into()),
            Reply::Body(200, lambda_instances("terminated", "129")),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("termination.json");
    let mut lambda = Lambda::new(
        &server.url(),
        key(),
        Some("0920582c7ff0".into()),
        0.0,
        TIMEOUT,
    )
    .unwrap();
    let rec = end_and_confirm(
        &mut lambda,
        EndAction::Terminate,
        &out,
        0.01,
        5.0,
        &FakeClock::default(),
    )
    .unwrap();
    let on_disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(rec, on_disk);
    assert_eq!(on_disk["confirmed_gone"], true);
    assert_eq!(
        on_disk["response"]["data"]["terminated_instances"][0]["id"],
        "0920582c7ff0"
    );
    let listings = on_disk["listings"].as_array().unwrap();
    assert_eq!(listings.len(), 3);
    assert_eq!(listings[0]["status"], "active");
    assert!(listings[1]["error"].as_str().unwrap().contains("429"));
    assert_eq!(listings[2]["status"], "gone");
    let post = server
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    let body: serde_json::Value = serde_json::from_str(&post.body).unwrap();
    assert_eq!(body, serde_json::json!({"instance_ids": ["0920582c7ff0"]}));
    assert!(!std::fs::read_to_string(&out).unwrap().contains(PLANTED_KEY));
}

#[test]
fn runpod_stop_confirms_exited_and_gives_up_in_bounded_time() {
    let server = Server::start();
    server.script(
        "POST /v2/pods/pod1/action",
        vec![Reply::Body(
            200,
            r#"{"id":"pod1","desiredStatus":"EXITED"}"#.into(),
        )],
    );
    server.script(
        "GET /v2/pods",
        vec![
            Reply::Body(200, runpod_pods("0.79")),
            Reply::Body(200, runpod_pods("0.79").replace("RUNNING", "EXITED")),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("termination.json");
    let mut rp = Runpod::new(&server.url(), key(), "pod1".into(), TIMEOUT).unwrap();
    end_and_confirm(
        &mut rp,
        EndAction::Stop,
        &out,
        0.01,
        5.0,
        &FakeClock::default(),
    )
    .unwrap();
    let post = server
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    assert_eq!(post.body, r#"{"action":"stop"}"#);

    // Terminate, but the pod never goes: an error after max_wait, with the listings on disk.
    server.script("GET /v2/pods", vec![Reply::Body(200, runpod_pods("0.79"))]);
    // On a fake clock: a listing at 0, 0.5, …, 5 s, then the error; no real waiting.
    let clock = FakeClock::default();
    let e = end_and_confirm(&mut rp, EndAction::Terminate, &out, 0.5, 5.0, &clock).unwrap_err();
    assert!(format!("{e:#}").contains("still listed"), "{e:#}");
    let on_disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(on_disk["confirmed_gone"], false);
    assert_eq!(on_disk["listings"].as_array().unwrap().len(), 11);
    assert_eq!(clock.now(), 5.0);
}

#[test]
fn an_echoed_key_never_reaches_errors_or_files() {
    let server = Server::start();
    server.script("GET /api/v1/instances", vec![Reply::EchoAuth]);
    server.script(
        "POST /api/v1/instance-operations/terminate",
        vec![Reply::EchoAuth],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("budget.json");
    let mut lambda = Lambda::new(&server.url(), key(), Some("i".into()), 0.0, TIMEOUT).unwrap();
    // The server really does echo it (so the scrubbing below is what keeps it out).
    let raw = server.requests().len();
    let e = format!(
        "{:#} {:?}",
        lambda.sample(1.0).unwrap_err(),
        lambda.sample(1.0).unwrap_err()
    );
    assert!(server.requests().len() > raw);
    assert!(e.contains("<redacted>") && !e.contains(PLANTED_KEY), "{e}");
    let term = dir.path().join("termination.json");
    let e = end_and_confirm(
        &mut lambda,
        EndAction::Terminate,
        &term,
        0.01,
        0.1,
        &FakeClock::default(),
    )
    .unwrap_err();
    assert!(!format!("{e:#} {e:?}").contains(PLANTED_KEY));
    let mut s = Sidecar::new(Box::new(lambda), out.clone(), None, 300.0);
    let Poll::Failed { error, .. } = s.poll_once(1.0) else {
        panic!()
    };
    assert!(!error.contains(PLANTED_KEY));
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(!text.contains(PLANTED_KEY), "{text}");
    }
    assert!(!format!("{:?} {}", key(), key()).contains(PLANTED_KEY));
}

/// A clock that only moves when slept on.
#[derive(Default)]
struct FakeClock(std::cell::Cell<f64>);

impl Clock for FakeClock {
    fn now(&self) -> f64 {
        self.0.get()
    }
    fn sleep(&self, secs: f64) {
        self.0.set(self.0.get() + secs);
    }
}
