//! The guard as `lab train` uses it: flags, the pre-launch check, periodic checks with alerts
//! and events, and terminate-on-exit. The trainer calls [`RunGuard::prelaunch`] before the
//! first step, [`RunGuard::check`] when [`RunGuard::due`] and at every checkpoint, and
//! [`EndOfRun::terminate`] (from [`RunGuard::end_of_run`]) at the end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lab_config::{BudgetConfig, BudgetProvider};
use serde_json::json;

use crate::clock::{now_unix, SystemClock};
use crate::file::{read_budget, BudgetFile, BudgetUri, Reading};
use crate::guard::{Decision, Guard, GuardSettings, Verdict};
use crate::meter::Meter;
use crate::notify::post_webhook;
use crate::prelaunch::{prelaunch, PlannedRun, Report};
use crate::provider::EndAction;
use crate::secret::Secret;
use crate::setup::{build_provider, ProviderSettings};
use crate::sidecar::Sidecar;
use crate::status::Progress;
use crate::terminate::end_and_confirm;

/// Budget flags of `lab train` (flatten into its clap `Args`).
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct BudgetFlags {
    /// Hard cap in USD (overrides budget.cap_usd); turns the budget guard on.
    #[arg(long, value_name = "USD")]
    pub budget_cap_usd: Option<f64>,
    /// Alert threshold in USD (overrides budget.alert_usd).
    #[arg(long, value_name = "USD")]
    pub budget_alert_usd: Option<f64>,
    /// budget.json written by `lab budget sidecar` (a path, file:// or http(s)://); without
    /// it the built-in meter (budget.rate_usd_per_hr × wall clock) writes RUN/budget.json.
    #[arg(long, value_name = "URI")]
    pub budget_curr_cost_uri: Option<String>,
    /// Print the budget decision table for the planned run and exit (0 launch, 4 refuse).
    #[arg(long)]
    pub dry_run_budget: bool,
    /// Refuse to launch when the current price is above this (overrides the config).
    #[arg(long, value_name = "USD")]
    pub max_price_usd_per_hr: Option<f64>,
    /// At the end of the run, terminate the instance and write RUN/termination.json.
    #[arg(long)]
    pub terminate_on_exit: bool,
}

enum Source {
    File(BudgetUri),
    /// In-process meter writing RUN/budget.json at every check.
    Meter(Box<Sidecar>, PathBuf),
}

pub struct RunGuard {
    guard: Guard,
    source: Source,
    run_dir: PathBuf,
    config: BudgetConfig,
    webhook: Option<Secret>,
    terminate_on_exit: bool,
    /// Where the run keeps a copy of the numbers it reads elsewhere (see `keep_in_run`):
    /// RUN/budget.json, unless the meter or the sidecar writes there, or this is a dry run.
    keep_at: Option<PathBuf>,
    /// The numbers last kept there.
    last_kept: Option<BudgetFile>,
    dry_run: bool,
    warned: bool,
}

fn check_usd(flag: &str, v: Option<f64>) -> Result<()> {
    if let Some(v) = v {
        if !(v.is_finite() && v >= 0.0) {
            lab_config::bail_usage!("{flag} ({v}) must be a finite number >= 0");
        }
    }
    Ok(())
}

impl RunGuard {
    /// `None` when no cap is set (no flag, no `[budget]`): the run is unguarded.
    pub fn new(
        flags: &BudgetFlags,
        config: Option<&BudgetConfig>,
        run_dir: &Path,
        resume: bool,
    ) -> Result<Option<RunGuard>> {
        check_usd("--budget-cap-usd", flags.budget_cap_usd)?;
        check_usd("--budget-alert-usd", flags.budget_alert_usd)?;
        check_usd("--max-price-usd-per-hr", flags.max_price_usd_per_hr)?;
        let mut c = match (config, flags.budget_cap_usd) {
            (Some(c), _) => c.clone(),
            (None, Some(cap)) => BudgetConfig {
                cap_usd: cap,
                alert_usd: None,
                max_price_usd_per_hr: None,
                ..BudgetConfig::course_default()
            },
            (None, None) => {
                let needs_cap = [
                    (
                        flags.budget_curr_cost_uri.is_some(),
                        "--budget-curr-cost-uri",
                    ),
                    (flags.dry_run_budget, "--dry-run-budget"),
                    (
                        flags.max_price_usd_per_hr.is_some(),
                        "--max-price-usd-per-hr",
                    ),
                    (flags.budget_alert_usd.is_some(), "--budget-alert-usd"),
                    (flags.terminate_on_exit, "--terminate-on-exit"),
                ];
                if let Some((_, flag)) = needs_cap.iter().find(|(set, _)| *set) {
                    lab_config::bail_usage!("{flag} needs a budget: pass --budget-cap-usd or add [budget] cap_usd to the config");
                }
                return Ok(None);
            }
        };
        if let Some(cap) = flags.budget_cap_usd {
            c.cap_usd = cap;
        }
        if let Some(a) = flags.budget_alert_usd {
            c.alert_usd = Some(a);
        }
        if let Some(m) = flags.max_price_usd_per_hr {
            c.max_price_usd_per_hr = Some(m);
        }
        c.validate()?;
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create run folder {}", run_dir.display()))?;
        let source = match &flags.budget_curr_cost_uri {
            Some(uri) => Source::File(BudgetUri::parse(uri)?),
            None => {
                if c.provider != BudgetProvider::Meter {
                    bail!(
                        "budget.provider is {} but no --budget-curr-cost-uri was given; run \
                         `lab budget sidecar` and pass its budget.json",
                        c.provider.as_str()
                    );
                }
                let out = run_dir.join("budget.json");
                // A resumed run's meter starts from what the run already spent, which counts
                // the configured prior spend already (a kept copy of another source's numbers
                // is not the meter's record).
                let before = std::fs::read_to_string(&out)
                    .ok()
                    .filter(|_| resume)
                    .and_then(|t| serde_json::from_str::<BudgetFile>(&t).ok())
                    .filter(|f| f.provider.as_deref() == Some("meter") && f.kept_from.is_none())
                    .map(|f| f.spent_usd);
                let spent = before.unwrap_or(c.prior_spend_usd);
                let meter = Meter::new(c.rate_usd_per_hr, spent, now_unix());
                let sidecar = Sidecar::new(Box::new(meter), out.clone(), None, c.poll_interval_s);
                Source::Meter(Box::new(sidecar), out)
            }
        };
        let webhook = match &c.webhook_url_env {
            Some(var) => Some(Secret::from_env(var, "budget.webhook_url_env")?),
            None => None,
        };
        let kept = run_dir.join("budget.json");
        let keep_at = match &source {
            Source::File(BudgetUri::File(path)) if same_file(path, &kept) => None,
            Source::File(_) if !flags.dry_run_budget => Some(kept),
            _ => None,
        };
        Ok(Some(RunGuard {
            guard: Guard::new(GuardSettings::from_config(&c)),
            source,
            run_dir: run_dir.to_path_buf(),
            config: c,
            webhook,
            terminate_on_exit: flags.terminate_on_exit,
            dry_run: flags.dry_run_budget,
            warned: false,
            keep_at,
            last_kept: None,
        }))
    }

    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    pub fn config(&self) -> &BudgetConfig {
        &self.config
    }

    /// Where alerts go: the Slack-compatible webhook of `budget.webhook_url_env`, if any. The
    /// trainer sends spike, rollback and stop alerts there too.
    pub fn webhook(&self) -> Option<Secret> {
        self.webhook.clone()
    }

    fn source_name(&self) -> String {
        match &self.source {
            Source::File(u) => u.to_string(),
            Source::Meter(_, p) => format!("{} (built-in meter)", p.display()),
        }
    }

    fn read(&mut self, now: f64) -> Reading {
        let poll = self.config.poll_interval_s;
        match &mut self.source {
            Source::File(uri) => {
                let reading = read_budget(uri, now, poll);
                self.keep_in_run(&reading);
                reading
            }
            Source::Meter(sidecar, out) => {
                sidecar.poll_once(now);
                read_budget(&BudgetUri::File(out.clone()), now, poll)
            }
        }
    }

    /// The run folder keeps the last budget numbers read (RUN/budget.json, marked `kept_from`),
    /// so `lab status` and the export's manifest report the spend wherever the sidecar writes:
    /// another path or an http URL. Only when the numbers changed, and never over a file
    /// another writer keeps there (the meter's of an earlier attempt, say).
    fn keep_in_run(&mut self, reading: &Reading) {
        let (Some(kept), Source::File(uri)) = (&self.keep_at, &self.source) else {
            return;
        };
        let (Reading::Fresh { file, .. }
        | Reading::Bad {
            file: Some(file), ..
        }) = reading
        else {
            return;
        };
        let copy = BudgetFile {
            kept_from: Some(uri.to_string()), // redacted: no credentials, no query
            ..file.clone()
        };
        if self.last_kept.as_ref() == Some(&copy) || written_by_another(kept) {
            return;
        }
        if let Err(err) = copy.write(kept) {
            eprintln!(
                "budget warning: cannot keep the budget reading in {}: {err:#}",
                kept.display()
            );
        }
        self.last_kept = Some(copy);
    }

    /// The pre-launch decision for `plan` (the caller prints [`Report::render`] when it
    /// refuses or on `--dry-run-budget`, and exits with [`Report::exit_code`]).
    pub fn prelaunch(&mut self, plan: &PlannedRun) -> Report {
        let mut plan = *plan;
        if plan.planned_hours.is_none() {
            plan.planned_hours = self.config.planned_hours;
        }
        let now = now_unix();
        let reading = self.read(now);
        self.guard.mark_checked(now);
        let report = prelaunch(self.guard.settings(), &reading, &plan, &self.source_name());
        if let Some(why) = &report.refusal {
            if !self.dry_run {
                self.event(plan.start_step, "budget_refused", json!({ "reason": why }));
            }
        }
        report
    }

    /// True when the interval since the last check has passed (or budget.json is bad and the
    /// grace period is ending).
    pub fn due(&self) -> bool {
        self.guard.due(now_unix())
    }

    /// Runs the guard now and reports the decision (stdout, events.jsonl, webhook).
    pub fn check(&mut self, progress: &Progress) -> Decision {
        let now = now_unix();
        let reading = self.read(now);
        let d = self.guard.evaluate(&reading, Some(progress), now);
        let fields = json!({
            "spent_usd": d.spent_usd,
            "projected_usd": d.projected_usd,
            "rate_usd_per_hr": d.rate_usd_per_hr,
            "cap_usd": self.config.cap_usd,
            "reason": d.reason,
        });
        match d.verdict {
            Verdict::Continue => self.warned = false,
            Verdict::Warn => {
                eprintln!("budget warning: {}", d.reason);
                if !self.warned {
                    self.warned = true;
                    self.event(progress.step, "budget_degraded", fields);
                }
            }
            Verdict::Alert => {
                lab_fsio::console::line(&format!("budget alert: {}", d.reason));
                let mut e = fields;
                e["alert_usd"] = json!(self.config.alert_usd);
                self.event(progress.step, "budget_alert", e);
                if let Some(url) = &self.webhook {
                    let text = format!(
                        "lab budget alert ({}): {}",
                        self.run_dir.display(),
                        d.reason
                    );
                    if let Err(err) = post_webhook(url, &text, Duration::from_secs(10)) {
                        eprintln!("budget warning: alert webhook failed: {err:#}");
                    }
                }
            }
            Verdict::StopGraceful | Verdict::StopImmediate => {
                eprintln!(
                    "budget guard: {} (exit {})",
                    d.reason,
                    d.verdict.exit_code().unwrap_or(1)
                );
                let kind = if d.verdict == Verdict::StopGraceful {
                    "budget_stop_graceful"
                } else {
                    "budget_stop_immediate"
                };
                let mut e = fields;
                e["exit_code"] = json!(d.verdict.exit_code());
                self.event(progress.step, kind, e);
            }
        }
        d
    }

    /// With `--terminate-on-exit`: what ends the instance once the run is over (taken before
    /// the guard moves into the trainer).
    pub fn end_of_run(&self) -> Option<EndOfRun> {
        self.terminate_on_exit.then(|| EndOfRun {
            config: self.config.clone(),
            run_dir: self.run_dir.clone(),
        })
    }

    /// Appends `{time_utc, step, kind, ...fields}` to the run's events.jsonl.
    fn event(&self, step: u64, kind: &str, fields: serde_json::Value) {
        if let Err(err) = lab_run::append_event(&self.run_dir, step, kind, fields) {
            eprintln!("budget warning: {err:#}");
        }
    }
}

/// `--terminate-on-exit`, run after training ends (completed or stopped by the guard).
pub struct EndOfRun {
    config: BudgetConfig,
    run_dir: PathBuf,
}

impl EndOfRun {
    /// Ends the instance billed under `config` (the run's `[budget]`), with the proof in
    /// `run_dir/termination.json`.
    pub fn new(config: BudgetConfig, run_dir: &Path) -> EndOfRun {
        EndOfRun {
            config,
            run_dir: run_dir.to_path_buf(),
        }
    }

    /// Terminates the instance, confirms it is gone, writes RUN/termination.json.
    pub fn terminate(self) -> Result<()> {
        let mut provider =
            build_provider(&ProviderSettings::from_config(&self.config), now_unix())?;
        let out = self.run_dir.join("termination.json");
        end_and_confirm(
            provider.as_mut(),
            EndAction::Terminate,
            &out,
            5.0,
            600.0,
            &SystemClock,
        )?;
        lab_fsio::console::line(&format!(
            "budget: {} instance end confirmed; proof in {}",
            provider.name(),
            out.display()
        ));
        Ok(())
    }
}

/// Whether a budget.json that is not a kept copy is at `path` (or one that does not parse).
fn written_by_another(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    serde_json::from_str::<BudgetFile>(&text).map_or(true, |f| f.kept_from.is_none())
}

/// Whether `a` and `b` are one file (the same path, or the same device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let absolute = |p: &Path| std::path::absolute(p).ok();
    if absolute(a).is_some() && absolute(a) == absolute(b) {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::format_utc;

    fn meter(prior_spend_usd: f64) -> BudgetConfig {
        BudgetConfig {
            rate_usd_per_hr: 1.0,
            prior_spend_usd,
            ..BudgetConfig::course_default()
        }
    }

    fn plan() -> PlannedRun {
        PlannedRun {
            total_steps: 10,
            start_step: 0,
            sec_per_step: None,
            planned_hours: Some(0.01),
        }
    }

    fn spent(path: &Path) -> BudgetFile {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn fresh(path: &Path, spent_usd: f64, provider: &str) {
        let file = serde_json::json!({
            "spent_usd": spent_usd, "rate_usd_per_hr": 1.0, "hours_elapsed": 1.0,
            "projected_total_usd": spent_usd, "last_update_utc": format_utc(now_unix()),
            "provider": provider, "poll_interval_s": 300.0,
        });
        std::fs::write(path, file.to_string()).unwrap();
    }

    /// The meter's numbers in `run` after a pre-launch check by a guard with no flags.
    fn meter_reads(run: &Path, prior_spend_usd: f64, resume: bool) -> BudgetFile {
        let mut g = RunGuard::new(
            &BudgetFlags::default(),
            Some(&meter(prior_spend_usd)),
            run,
            resume,
        );
        let g = g.as_mut().unwrap().as_mut().unwrap();
        assert!(g.prelaunch(&plan()).launch());
        spent(&run.join("budget.json"))
    }

    /// The meter's record already holds the configured prior spend; a resume adds it once.
    #[test]
    fn a_resumed_meter_counts_the_prior_spend_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = meter_reads(dir.path(), 2.0, false).spent_usd;
        assert!((2.0..2.01).contains(&first), "{first}");
        let resumed = meter_reads(dir.path(), 2.0, true).spent_usd;
        assert!(
            (first..first + 0.01).contains(&resumed),
            "{resumed} after {first}"
        );
    }

    /// Numbers read elsewhere are kept in the run folder, marked as a copy, and never over a
    /// record another writer keeps there; a resumed meter does not take a copy for its own.
    #[test]
    fn the_run_keeps_a_copy_of_what_it_read_but_no_other_writers_file() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        let kept = run.join("budget.json");
        let sidecar = dir.path().join("sidecar.json");
        fresh(&sidecar, 3.0, "lambda");
        let flags = BudgetFlags {
            budget_cap_usd: Some(35.0),
            budget_curr_cost_uri: Some(sidecar.display().to_string()),
            ..Default::default()
        };
        let check = || {
            let mut g = RunGuard::new(&flags, None, &run, true).unwrap().unwrap();
            assert!(g.prelaunch(&plan()).launch());
        };

        fresh(&kept, 9.0, "meter"); // an earlier attempt's meter
        check();
        assert_eq!(spent(&kept).spent_usd, 9.0);

        std::fs::remove_file(&kept).unwrap();
        check();
        let copy = spent(&kept);
        assert_eq!(copy.spent_usd, 3.0);
        assert_eq!(
            copy.kept_from.as_deref(),
            Some(&*sidecar.display().to_string())
        );

        fresh(&sidecar, 4.0, "lambda");
        check(); // a copy is refreshed
        assert_eq!(spent(&kept).spent_usd, 4.0);

        let own = meter_reads(&run, 0.5, true);
        assert!(
            (0.5..0.51).contains(&own.spent_usd) && own.kept_from.is_none(),
            "{own:?}"
        );
    }
}
