//! The guard's thresholds, its fail-safe grace period, and the pre-launch decision table.

use lab_budget::clock::format_utc;
use lab_budget::file::{judge, BudgetUri, Problem, Reading};
use lab_budget::prelaunch::{prelaunch, Outcome};
use lab_budget::{BudgetFile, Guard, GuardSettings, PlannedRun, Progress, Verdict};

const NOW: f64 = 1_795_000_000.0;

fn settings() -> GuardSettings {
    GuardSettings {
        cap_usd: 35.0,
        alert_usd: Some(30.0),
        max_price_usd_per_hr: Some(1.40),
        check_interval_s: 1800.0,
        poll_interval_s: 300.0,
        grace_s: 600.0,
    }
}

fn file(spent: f64, rate: f64, updated: f64) -> BudgetFile {
    BudgetFile {
        spent_usd: spent,
        rate_usd_per_hr: rate,
        hours_elapsed: 1.0,
        projected_total_usd: spent,
        last_update_utc: format_utc(updated),
        provider: Some("meter".into()),
        instance_id: None,
        method: None,
        remaining_hours: None,
        poll_interval_s: Some(300.0),
        stale: false,
        error: None,
        consecutive_failures: 0,
        written_utc: None,
        kept_from: None,
    }
}

fn uri() -> BudgetUri {
    BudgetUri::File("/run/budget.json".into())
}

fn read(f: &BudgetFile, now: f64) -> Reading {
    judge(&uri(), &serde_json::to_string(f).unwrap(), now, 300.0)
}

fn progress(step: u64, total: u64, sec: f64) -> Progress {
    Progress {
        step,
        total_steps: total,
        sec_per_step: Some(sec),
    }
}

#[test]
fn the_three_thresholds() {
    let p = progress(100, 1000, 3.6); // 0.9 h left
    let mut g = Guard::new(settings());
    let d = g.evaluate(&read(&file(10.0, 1.29, NOW), NOW), Some(&p), NOW);
    assert_eq!(d.verdict, Verdict::Continue, "{}", d.reason);

    // spent > alert: alert once, then keep going quietly.
    let d = g.evaluate(&read(&file(30.5, 1.29, NOW), NOW), Some(&p), NOW);
    assert_eq!(d.verdict, Verdict::Alert, "{}", d.reason);
    assert!(d.over_alert && d.reason.contains("alert $30.00"));
    let d = g.evaluate(&read(&file(31.0, 1.29, NOW), NOW), Some(&p), NOW);
    assert_eq!(d.verdict, Verdict::Continue);
    assert!(d.over_alert);

    // projected > cap: 31 + 1.29 × (900 steps × 10 s = 2.5 h) = 34.2 ok; at 20 s/step 37.45.
    let d = g.evaluate(
        &read(&file(31.0, 1.29, NOW), NOW),
        Some(&progress(100, 1000, 10.0)),
        NOW,
    );
    assert_eq!(d.verdict, Verdict::Continue, "{}", d.reason);
    let d = g.evaluate(
        &read(&file(31.0, 1.29, NOW), NOW),
        Some(&progress(100, 1000, 20.0)),
        NOW,
    );
    assert_eq!(d.verdict, Verdict::StopGraceful, "{}", d.reason);
    assert_eq!(d.verdict.exit_code(), Some(3));
    assert!((d.projected_usd.unwrap() - (31.0 + 1.29 * 5.0)).abs() < 1e-9);

    // The sidecar's own projection counts too.
    let mut f = file(31.0, 1.29, NOW);
    f.projected_total_usd = 36.0;
    let d = Guard::new(settings()).evaluate(&read(&f, NOW), None, NOW);
    assert_eq!(d.verdict, Verdict::StopGraceful);

    // spent > cap: immediate, even when the file is a few minutes old and said 34.
    let d = g.evaluate(&read(&file(35.01, 1.29, NOW), NOW), Some(&p), NOW);
    assert_eq!(d.verdict, Verdict::StopImmediate);
    assert_eq!(d.verdict.exit_code(), Some(4));
    let d = Guard::new(settings()).evaluate(&read(&file(34.0, 12.0, NOW - 600.0), NOW), None, NOW);
    assert_eq!(d.verdict, Verdict::StopImmediate, "{}", d.reason); // 34 + 12 × 1/6 h = 36
}

#[test]
fn missing_or_malformed_file_stops_after_exactly_the_grace_period() {
    let s = settings();
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("does not exist", None),
        ("malformed", Some("{\"spent_usd\": 1.0, \"rate_usd_per_hr\"")),
        ("malformed", Some("{\"spent_usd\": \"12\", \"rate_usd_per_hr\": 1, \"hours_elapsed\": 1, \"projected_total_usd\": 1, \"last_update_utc\": \"2026-11-21T12:00:00Z\"}")),
        ("malformed", Some("{\"spent_usd\": -1, \"rate_usd_per_hr\": 1, \"hours_elapsed\": 1, \"projected_total_usd\": 1, \"last_update_utc\": \"2026-11-21T12:00:00Z\"}")),
        ("malformed", Some("{\"spent_usd\": 5, \"rate_usd_per_hr\": 1, \"hours_elapsed\": 1, \"projected_total_usd\": 1, \"last_update_utc\": \"2026-11-21T12:00:00Z\"}")),
        ("malformed", Some("{\"spent_usd\": 1, \"rate_usd_per_hr\": 1, \"hours_elapsed\": 1, \"projected_total_usd\": 1, \"last_update_utc\": \"noon\"}")),
        ("malformed", Some("[]")),
    ];
    for (want, text) in cases {
        let reading = match text {
            Some(t) => judge(&uri(), t, NOW, 300.0),
            None => lab_budget::read_budget(
                &BudgetUri::File("/nonexistent/budget.json".into()),
                NOW,
                300.0,
            ),
        };
        let Reading::Bad { reason, .. } = &reading else {
            panic!("{text:?} should be bad")
        };
        assert!(reason.contains(want), "{reason}");
        assert!(!reason.contains('\n'));
        let mut g = Guard::new(s.clone());
        let d = g.evaluate(&reading, None, NOW);
        assert_eq!(d.verdict, Verdict::Warn, "{}", d.reason);
        assert!(d.reason.contains("stops in 600 s"), "{}", d.reason);
        // While bad, the next check is due no later than the end of the grace period.
        assert_eq!(g.next_due(), NOW + 600.0);
        assert_eq!(
            g.evaluate(&reading, None, NOW + 599.0).verdict,
            Verdict::Warn
        );
        let d = g.evaluate(&reading, None, NOW + 600.0);
        assert_eq!(d.verdict, Verdict::StopGraceful, "{}", d.reason);
        assert!(
            d.reason.contains("grace period") && d.reason.contains(want),
            "{}",
            d.reason
        );
    }
}

#[test]
fn recovery_resets_the_grace_period() {
    let mut g = Guard::new(settings());
    let bad = judge(&uri(), "{", NOW, 300.0);
    assert_eq!(g.evaluate(&bad, None, NOW).verdict, Verdict::Warn);
    let good = read(&file(1.0, 1.0, NOW + 500.0), NOW + 500.0);
    assert_eq!(
        g.evaluate(&good, None, NOW + 500.0).verdict,
        Verdict::Continue
    );
    assert_eq!(g.next_due(), NOW + 500.0 + 1800.0);
    assert_eq!(g.evaluate(&bad, None, NOW + 700.0).verdict, Verdict::Warn);
    assert_eq!(g.evaluate(&bad, None, NOW + 1299.0).verdict, Verdict::Warn);
    assert_eq!(
        g.evaluate(&bad, None, NOW + 1300.0).verdict,
        Verdict::StopGraceful
    );
}

#[test]
fn stale_file_grace_starts_when_it_went_stale_and_numbers_still_count() {
    // Updated at NOW with 300 s polls: stale from NOW + 900, stop at NOW + 1500.
    let f = file(10.0, 1.29, NOW);
    assert!(matches!(read(&f, NOW + 900.0), Reading::Fresh { .. }));
    let r = read(&f, NOW + 901.0);
    let Reading::Bad {
        problem, reason, ..
    } = &r
    else {
        panic!()
    };
    assert_eq!(*problem, Problem::Stale);
    assert!(
        reason.contains("stale") && reason.contains("is the sidecar running"),
        "{reason}"
    );
    let mut g = Guard::new(settings());
    assert_eq!(
        g.evaluate(&read(&f, NOW + 1499.0), None, NOW + 1499.0)
            .verdict,
        Verdict::Warn
    );
    assert_eq!(
        g.evaluate(&read(&f, NOW + 1500.0), None, NOW + 1500.0)
            .verdict,
        Verdict::StopGraceful
    );
    // A guard that first looks long after: stops at once.
    let d = Guard::new(settings()).evaluate(&read(&f, NOW + 86_400.0 * 0.01), None, NOW + 864.0);
    assert_eq!(d.verdict, Verdict::Continue); // 864 s old: still fresh
    let d = Guard::new(settings()).evaluate(&read(&f, NOW + 7200.0), None, NOW + 7200.0);
    assert_eq!(d.verdict, Verdict::StopGraceful, "{}", d.reason);
    // Inside the grace, the last good numbers extrapolated at their rate still stop at the cap.
    let hot = file(34.5, 30.0, NOW); // $30/h: + $7.5 by NOW + 900
    let d = Guard::new(settings()).evaluate(&read(&hot, NOW + 1000.0), None, NOW + 1000.0);
    assert_eq!(d.verdict, Verdict::StopImmediate, "{}", d.reason);
    assert!(d.reason.contains("extrapolated"), "{}", d.reason);
    // The smaller poll interval wins: a file claiming 1 h polls is still stale after 15 min.
    let mut lazy = file(1.0, 1.0, NOW);
    lazy.poll_interval_s = Some(3600.0);
    assert!(matches!(
        read(&lazy, NOW + 901.0),
        Reading::Bad {
            problem: Problem::Stale,
            ..
        }
    ));
}

#[test]
fn future_file_is_untrusted_beyond_clock_skew() {
    let f = file(1.0, 1.0, NOW + 30.0);
    assert!(
        matches!(read(&f, NOW), Reading::Fresh { .. }),
        "30 s skew tolerated"
    );
    let f = file(1.0, 1.0, NOW + 3600.0);
    let r = read(&f, NOW);
    let Reading::Bad {
        problem, reason, ..
    } = &r
    else {
        panic!()
    };
    assert_eq!(*problem, Problem::Future);
    assert!(
        reason.contains("future") && reason.contains("clock"),
        "{reason}"
    );
    let mut g = Guard::new(settings());
    assert_eq!(g.evaluate(&r, None, NOW).verdict, Verdict::Warn);
    assert_eq!(
        g.evaluate(&r, None, NOW + 600.0).verdict,
        Verdict::StopGraceful
    );
}

#[test]
fn prelaunch_refuses_for_each_reason_and_prints_the_table() {
    let s = settings();
    let plan = PlannedRun {
        total_steps: 1000,
        start_step: 0,
        sec_per_step: Some(86.4), // 24 h
        planned_hours: None,
    };
    let ok = prelaunch(&s, &read(&file(0.0, 1.29, NOW), NOW), &plan, "b.json");
    assert!(ok.launch(), "{}", ok.render());
    assert_eq!(ok.exit_code(), 0);
    let table = ok.render();
    assert!(
        table.contains("projected total  $30.96") || table.contains("$30.96"),
        "{table}"
    );
    assert!(table.contains("decision: launch (exit 0)"), "{table}");
    // Columns line up, multi-byte text ("×") included.
    let lines: Vec<&str> = table.lines().collect();
    let col = lines[1].chars().count() - "result".len();
    for line in &lines[2..lines.len() - 1] {
        let tail: String = line.chars().skip(col).collect();
        assert!(["ok", "note", "REFUSE"].contains(&tail.as_str()), "{table}");
    }
    let planned = PlannedRun {
        sec_per_step: None,
        planned_hours: Some(24.0),
        ..plan
    };
    let table = prelaunch(&s, &read(&file(0.0, 1.29, NOW), NOW), &planned, "b.json").render();
    assert!(table.contains("24 × 1000/1000 steps left"), "{table}");
    let col = table.lines().nth(1).unwrap().chars().count() - "result".len();
    assert!(table
        .lines()
        .all(|l| !l.contains('×') || l.chars().skip(col).collect::<String>() == "ok"));

    let cases = [
        (file(35.0, 1.29, NOW), plan, "cap is already reached"),
        (file(5.0, 1.29, NOW), plan, "projected at $35.96"),
        (file(0.0, 1.50, NOW), plan, "above --max-price-usd-per-hr"),
        (file(0.0, 1.29, NOW - 3600.0), plan, "stale"),
    ];
    for (f, p, want) in cases {
        let r = prelaunch(&s, &read(&f, NOW), &p, "b.json");
        assert!(!r.launch());
        assert_eq!(r.exit_code(), 4);
        let why = r.refusal.clone().unwrap();
        assert!(why.contains(want), "{want}: {why}");
        assert!(r.rows.iter().any(|row| row.outcome == Outcome::Refuse));
        assert!(r.render().contains("refuse to launch (exit 4)"));
        assert_eq!(r.to_json()["exit_code"], 4);
    }
    // No step time and no planned hours: the projection is unknown, not a refusal.
    let r = prelaunch(
        &s,
        &read(&file(0.0, 1.29, NOW), NOW),
        &PlannedRun::default(),
        "b.json",
    );
    assert!(r.launch());
    assert!(r.render().contains("unknown"));
    // The sidecar's own projection over the cap refuses too, with or without a plan.
    let over = BudgetFile {
        projected_total_usd: 36.0,
        ..file(0.5, 1.29, NOW)
    };
    for p in [PlannedRun::default(), plan] {
        let r = prelaunch(&s, &read(&over, NOW), &p, "b.json");
        assert_eq!(r.exit_code(), 4, "{}", r.render());
        let why = r.refusal.unwrap();
        assert!(why.contains("projects a total of $36.00"), "{why}");
    }
    // planned_hours scaled by the steps left when resuming.
    let resume = PlannedRun {
        total_steps: 100,
        start_step: 50,
        sec_per_step: None,
        planned_hours: Some(60.0),
    };
    let r = prelaunch(&s, &read(&file(0.0, 1.0, NOW), NOW), &resume, "b.json");
    assert!(r.launch(), "30 h at $1/h fits: {}", r.render());
}
