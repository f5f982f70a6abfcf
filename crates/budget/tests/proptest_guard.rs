//! Over random spend, rate and time sequences: the guard never lets spend exceed
//! cap + one check interval × rate, and a bad budget.json never outlives its grace period.

use lab_budget::clock::format_utc;
use lab_budget::file::{judge, BudgetUri, Reading};
use lab_budget::{BudgetFile, Guard, GuardSettings, Progress, Verdict};
use proptest::prelude::*;

const T0: f64 = 1_795_000_000.0;

fn budget_json(spent: f64, rate: f64, updated: f64, poll: f64) -> String {
    serde_json::to_string(&BudgetFile {
        spent_usd: spent,
        rate_usd_per_hr: rate,
        hours_elapsed: 0.0,
        projected_total_usd: spent,
        last_update_utc: format_utc(updated),
        provider: Some("meter".into()),
        instance_id: None,
        method: None,
        remaining_hours: None,
        poll_interval_s: Some(poll),
        stale: false,
        error: None,
        consecutive_failures: 0,
        written_utc: None,
        kept_from: None,
    })
    .unwrap()
}

/// Spend is piecewise linear: `segments` of (seconds, USD per hour).
#[derive(Debug, Clone)]
struct Bill {
    segments: Vec<(f64, f64)>,
    start_spend: f64,
}

impl Bill {
    fn end(&self) -> f64 {
        self.segments.iter().map(|s| s.0).sum()
    }
    fn spent(&self, t: f64) -> f64 {
        let mut acc = self.start_spend;
        let mut at = 0.0;
        for &(d, r) in &self.segments {
            let dt = (t - at).clamp(0.0, d);
            acc += r * dt / 3600.0;
            at += d;
        }
        acc
    }
    fn rate(&self, t: f64) -> f64 {
        let mut at = 0.0;
        for &(d, r) in &self.segments {
            if t < at + d {
                return r;
            }
            at += d;
        }
        self.segments.last().map(|s| s.1).unwrap_or(0.0)
    }
    fn max_rate(&self) -> f64 {
        self.segments.iter().map(|s| s.1).fold(0.0, f64::max)
    }
}

fn bills() -> impl Strategy<Value = Bill> {
    (
        prop::collection::vec((1.0f64..7200.0, 0.0f64..40.0), 1..40),
        0.0f64..1.0,
    )
        .prop_map(|(segments, start_frac)| Bill {
            segments,
            // A fraction of the cap, set by each test (a run over cap never launches).
            start_spend: start_frac,
        })
}

fn settings(cap: f64, interval: f64, poll: f64) -> GuardSettings {
    GuardSettings {
        cap_usd: cap,
        alert_usd: Some(cap * 0.8),
        max_price_usd_per_hr: None,
        check_interval_s: interval,
        poll_interval_s: poll,
        grace_s: 600.0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The guard reads exact numbers at every check (an in-process meter).
    #[test]
    fn spend_never_exceeds_cap_plus_one_interval(
        bill in bills(),
        cap in 1.0f64..60.0,
        interval in 10.0f64..3600.0,
        sec_per_step in prop::option::of(0.01f64..100.0),
    ) {
        let mut bill = bill;
        bill.start_spend *= cap;
        let uri = BudgetUri::File("budget.json".into());
        let mut g = Guard::new(settings(cap, interval, 300.0));
        let total_steps = 1_000_000u64;
        let mut t = 0.0;
        let mut checks = 0;
        let end = bill.end();
        loop {
            let spent = bill.spent(t);
            let text = budget_json(spent, bill.rate(t), T0 + t, 300.0);
            let reading = judge(&uri, &text, T0 + t, 300.0);
            prop_assert!(matches!(reading, Reading::Fresh { .. }), "fresh numbers");
            let step = (t / sec_per_step.unwrap_or(1.0)) as u64;
            let p = Progress { step: step.min(total_steps), total_steps, sec_per_step };
            let d = g.evaluate(&reading, Some(&p), T0 + t);
            checks += 1;
            // The bound: never past cap + one interval at the highest rate seen.
            let bound = cap + interval * bill.max_rate() / 3600.0 + 1e-9;
            prop_assert!(spent <= bound, "spent {} cap {} interval {}", spent, cap, interval);
            // Sound: stops only for a reason.
            match d.verdict {
                // `last_update_utc` is written to the millisecond, so the guard may read the
                // numbers as up to 0.5 ms old and add that much spend at the current rate.
                Verdict::StopImmediate => {
                    prop_assert!(spent + bill.rate(t) * 0.000_501 / 3600.0 > cap);
                    break;
                }
                Verdict::StopGraceful => { prop_assert!(d.projected_usd.unwrap() > cap); break; }
                Verdict::Warn => prop_assert!(false, "fresh numbers never warn"),
                _ => prop_assert!(spent <= cap),
            }
            let next = g.next_due() - T0;
            prop_assert!((next - (t + interval)).abs() < 1e-6);
            t = next;
            if t > end || checks > 100_000 { break; }
        }
    }

    /// A sidecar polls every `poll` s and the guard reads whatever file is newest: the lag
    /// adds at most one poll at the highest rate.
    #[test]
    fn lagged_sidecar_adds_at_most_one_poll(
        bill in bills(),
        cap in 1.0f64..60.0,
        interval in 60.0f64..3600.0,
        poll in 1.0f64..300.0,
    ) {
        let mut bill = bill;
        bill.start_spend *= cap;
        let uri = BudgetUri::File("budget.json".into());
        let mut g = Guard::new(settings(cap, interval, poll));
        let mut t = 0.0;
        let end = bill.end();
        for _ in 0..100_000 {
            let polled = (t / poll).floor() * poll; // the newest poll
            let text = budget_json(bill.spent(polled), bill.rate(polled), T0 + polled, poll);
            let d = g.evaluate(&judge(&uri, &text, T0 + t, poll), None, T0 + t);
            let spent = bill.spent(t);
            prop_assert!(spent <= cap + (interval + poll) * bill.max_rate() / 3600.0 + 1e-9);
            if d.verdict.is_stop() || t > end { break; }
            t = g.next_due() - T0;
        }
    }

    /// The file goes bad (disappears or turns to garbage) at a random moment: the run, checking
    /// at step boundaries whenever due, stops within the grace period plus one step.
    #[test]
    fn bad_file_never_outlives_the_grace_period(
        bad_at in 0.0f64..20_000.0,
        step_s in 0.5f64..120.0,
        interval in 10.0f64..3600.0,
        garbage in any::<bool>(),
    ) {
        let uri = BudgetUri::File("budget.json".into());
        let mut g = Guard::new(settings(1e9, interval, 300.0));
        let mut t = 0.0;
        let mut stopped_at = None;
        while t < bad_at + 10_000.0 {
            if g.due(T0 + t) || t == 0.0 {
                let reading = if t < bad_at {
                    judge(&uri, &budget_json(1.0, 1.0, T0 + t, 300.0), T0 + t, 300.0)
                } else if garbage {
                    judge(&uri, "{\"spent_usd\": tru", T0 + t, 300.0)
                } else {
                    lab_budget::read_budget(&BudgetUri::File("/nonexistent/b.json".into()), T0 + t, 300.0)
                };
                let d = g.evaluate(&reading, None, T0 + t);
                if t < bad_at {
                    prop_assert_eq!(d.verdict, Verdict::Continue);
                }
                if d.verdict.is_stop() {
                    prop_assert_eq!(d.verdict, Verdict::StopGraceful);
                    stopped_at = Some(t);
                    break;
                }
            }
            t += step_s;
        }
        let stop = stopped_at.expect("the run stopped");
        // Bad seen no later than one interval (+ a step) after it happened; then the grace.
        prop_assert!(stop <= bad_at + interval + 600.0 + 2.0 * step_s, "stop {} bad {}", stop, bad_at);
        prop_assert!(stop >= bad_at + 600.0 - 1e-9);
    }
}
