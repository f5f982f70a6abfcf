//! `lab budget sidecar|check|terminate`: the billing sidecar that writes budget.json, the
//! one-shot guard check (the pre-launch decision table), and ending an instance by hand.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use lab_budget::clock::{now_unix, parse_utc};
use lab_budget::guard::GuardSettings;
use lab_budget::prelaunch::prelaunch;
use lab_budget::setup::{build_provider, ProviderSettings};
use lab_budget::sidecar::Sidecar;
use lab_budget::status::read_status;
use lab_budget::terminate::end_and_confirm;
use lab_budget::{read_budget, BudgetUri, EndAction, PlannedRun};
use lab_config::{BudgetConfig, BudgetProvider, LabConfig};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Poll the billing provider and rewrite budget.json atomically every poll.
    Sidecar(SidecarArgs),
    /// One-shot guard check of budget.json against a planned run: the decision table;
    /// exit 0 to launch, 4 to refuse.
    Check(CheckArgs),
    /// Terminate (or stop) the instance, re-list until it is gone, write termination.json.
    Terminate(TerminateArgs),
}

/// Which provider, and how to reach it. Defaults come from the config's `[budget]`.
#[derive(clap::Args)]
struct ProviderArgs {
    /// Config whose `[budget]` section gives the defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// meter, lambda or runpod.
    #[arg(long)]
    provider: Option<String>,
    /// Lambda instance id / RunPod pod id (default: LAMBDA_INSTANCE_ID, RUNPOD_POD_ID, or
    /// Lambda's only live instance).
    #[arg(long)]
    instance_id: Option<String>,
    /// API base URL (default: the provider's public API).
    #[arg(long)]
    api_base_url: Option<String>,
    /// Environment variable holding the API key (default LAMBDA_API_KEY / RUNPOD_API_KEY).
    #[arg(long)]
    api_key_env: Option<String>,
    /// File holding the API key (used when the variable is unset).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Meter rate, USD per hour.
    #[arg(long)]
    rate_usd_per_hr: Option<f64>,
    /// Meter: money spent before the meter started.
    #[arg(long)]
    prior_spend_usd: Option<f64>,
    /// When billing started (RFC 3339); Lambda defaults to this machine's boot time.
    #[arg(long)]
    started_at: Option<String>,
    /// Timeout of each provider request, seconds.
    #[arg(long, default_value_t = 10.0)]
    http_timeout_s: f64,
}

#[derive(clap::Args)]
struct SidecarArgs {
    #[command(flatten)]
    provider: ProviderArgs,
    /// Where to write budget.json (usually RUN/budget.json).
    #[arg(long)]
    out: PathBuf,
    /// The run folder whose status.json gives the remaining steps and step time.
    #[arg(long)]
    run: Option<PathBuf>,
    /// Seconds between polls (default budget.poll_interval_s, 300).
    #[arg(long)]
    poll_interval_s: Option<f64>,
    /// Stop after this many polls (default: run until killed).
    #[arg(long)]
    max_polls: Option<u64>,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// budget.json to judge (path, file:// or http(s)://).
    #[arg(long)]
    uri: String,
    /// Config whose `[budget]` and `[train]` give cap, alert, max price, steps.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    budget_cap_usd: Option<f64>,
    #[arg(long)]
    budget_alert_usd: Option<f64>,
    #[arg(long)]
    max_price_usd_per_hr: Option<f64>,
    /// The sidecar's poll interval (budget.json older than 3 of them is stale).
    #[arg(long)]
    poll_interval_s: Option<f64>,
    /// A run folder whose status.json gives the step reached and the measured step time.
    #[arg(long)]
    run: Option<PathBuf>,
    /// Total steps of the planned run (default: status.json, then the config).
    #[arg(long)]
    total_steps: Option<u64>,
    /// Expected wall clock of the whole run when no step time was measured yet.
    #[arg(long)]
    planned_hours: Option<f64>,
    /// text or json.
    #[arg(long, default_value = "text")]
    format: String,
}

#[derive(clap::Args)]
struct TerminateArgs {
    #[command(flatten)]
    provider: ProviderArgs,
    /// terminate, or stop (RunPod only: keeps the volume).
    #[arg(long, default_value = "terminate")]
    action: String,
    /// Where to write the proof.
    #[arg(long, default_value = "termination.json")]
    out: PathBuf,
    /// Give up confirming after this many seconds.
    #[arg(long, default_value_t = 600.0)]
    max_wait_s: f64,
    /// Seconds between listings.
    #[arg(long, default_value_t = 5.0)]
    poll_s: f64,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        Command::Sidecar(a) => sidecar(a),
        Command::Check(a) => check(a),
        Command::Terminate(a) => terminate(a),
    }
}

/// The `[budget]` section of `--config`, if any.
fn budget_section(config: Option<&PathBuf>) -> Result<Option<(BudgetConfig, LabConfig)>> {
    let Some(path) = config else { return Ok(None) };
    let cfg = LabConfig::load(path)?;
    Ok(cfg.budget.clone().map(|b| (b, cfg)))
}

fn provider_settings(p: &ProviderArgs) -> Result<(ProviderSettings, BudgetConfig)> {
    let c = budget_section(p.config.as_ref())?
        .map(|(b, _)| b)
        .unwrap_or_else(BudgetConfig::course_default);
    let mut s = ProviderSettings::from_config(&c);
    if let Some(name) = &p.provider {
        s.provider = match name.as_str() {
            "meter" => BudgetProvider::Meter,
            "lambda" => BudgetProvider::Lambda,
            "runpod" => BudgetProvider::Runpod,
            other => {
                super::bail_usage!("--provider {other:?} is unknown; use meter, lambda or runpod")
            }
        };
    }
    if p.instance_id.is_some() {
        s.instance_id = p.instance_id.clone();
    }
    if let Some(u) = &p.api_base_url {
        if !(u.starts_with("https://") || u.starts_with("http://")) {
            super::bail_usage!("--api-base-url {u:?} must start with https:// or http://");
        }
        s.base_url = Some(u.clone());
    }
    if let Some(env) = &p.api_key_env {
        if let Err(e) = lab_budget::secret::check_env_name(env, "--api-key-env") {
            super::bail_usage!("{e:#}");
        }
        s.api_key_env = Some(env.clone());
    }
    if p.api_key_file.is_some() {
        s.api_key_file = p.api_key_file.clone();
    }
    for (flag, v) in [
        ("--rate-usd-per-hr", p.rate_usd_per_hr),
        ("--prior-spend-usd", p.prior_spend_usd),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0) {
                super::bail_usage!("{flag} ({v}) must be a finite number >= 0");
            }
        }
    }
    if let Some(r) = p.rate_usd_per_hr {
        s.rate_usd_per_hr = r;
    }
    if let Some(r) = p.prior_spend_usd {
        s.prior_spend_usd = r;
    }
    if let Some(t) = &p.started_at {
        s.started_unix = Some(parse_utc(t).context("--started-at")?);
    }
    s.timeout_s = p.http_timeout_s;
    Ok((s, c))
}

fn positive(flag: &str, v: f64) -> Result<f64> {
    if !(v.is_finite() && v > 0.0) {
        super::bail_usage!("{flag} ({v}) must be a finite number > 0");
    }
    Ok(v)
}

fn sidecar(a: SidecarArgs) -> Result<ExitCode> {
    let (settings, c) = provider_settings(&a.provider)?;
    let poll = positive(
        "--poll-interval-s",
        a.poll_interval_s.unwrap_or(c.poll_interval_s),
    )?;
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the folder of --out {}", a.out.display()))?;
    }
    let provider = build_provider(&settings, now_unix())?;
    let status = a.run.map(|r| r.join("status.json"));
    let mut sidecar = Sidecar::new(provider, a.out.clone(), status, poll);
    println!(
        "budget sidecar: provider {}, every {poll} s -> {}",
        sidecar.provider_name(),
        a.out.display()
    );
    let stop = AtomicBool::new(false);
    sidecar.run(a.max_polls, &stop, &mut |line| println!("{line}"));
    Ok(ExitCode::SUCCESS)
}

fn check(a: CheckArgs) -> Result<ExitCode> {
    let uri = BudgetUri::parse(&a.uri)?;
    let section = budget_section(a.config.as_ref())?;
    let lab_cfg = match (&section, &a.config) {
        (Some((_, l)), _) => Some(l.clone()),
        (None, Some(p)) => Some(LabConfig::load(p)?),
        (None, None) => None,
    };
    let mut c = match (section.map(|(b, _)| b), a.budget_cap_usd) {
        (Some(b), _) => b,
        (None, Some(cap)) => BudgetConfig {
            cap_usd: cap,
            alert_usd: None,
            max_price_usd_per_hr: None,
            ..BudgetConfig::course_default()
        },
        (None, None) => {
            super::bail_usage!("no cap: pass --budget-cap-usd or a --config with [budget] cap_usd")
        }
    };
    if let Some(v) = a.budget_cap_usd {
        c.cap_usd = v;
    }
    if let Some(v) = a.budget_alert_usd {
        c.alert_usd = Some(v);
    }
    if let Some(v) = a.max_price_usd_per_hr {
        c.max_price_usd_per_hr = Some(v);
    }
    if let Some(v) = a.poll_interval_s {
        c.poll_interval_s = v;
    }
    if let Some(v) = a.planned_hours {
        if !(v.is_finite() && v > 0.0) {
            super::bail_usage!("--planned-hours ({v}) must be a positive number of hours");
        }
        c.planned_hours = Some(v);
    }
    c.validate()
        .map_err(|e| anyhow::anyhow!("{e} (after command-line overrides)"))?;
    let status = match &a.run {
        Some(r) => Some(read_status(&r.join("status.json"))?),
        None => None,
    };
    let total_steps = a
        .total_steps
        .or(status.map(|s| s.total_steps))
        .or(lab_cfg.map(|l| l.train.total_steps as u64))
        .unwrap_or(0);
    let start_step = status.map(|s| s.step).unwrap_or(0);
    let plan = PlannedRun::new(total_steps, start_step, status, c.planned_hours);
    let reading = read_budget(&uri, now_unix(), c.poll_interval_s);
    let report = prelaunch(
        &GuardSettings::from_config(&c),
        &reading,
        &plan,
        &uri.to_string(),
    );
    match a.format.as_str() {
        "text" => print!("{}", report.render()),
        "json" => println!("{}", serde_json::to_string_pretty(&report.to_json())?),
        other => super::bail_usage!("--format {other:?} is unknown; use text or json"),
    }
    Ok(ExitCode::from(report.exit_code()))
}

fn terminate(a: TerminateArgs) -> Result<ExitCode> {
    let action = match a.action.as_str() {
        "terminate" => EndAction::Terminate,
        "stop" => EndAction::Stop,
        other => super::bail_usage!("--action {other:?} is unknown; use terminate or stop"),
    };
    let (settings, _) = provider_settings(&a.provider)?;
    let mut provider = build_provider(&settings, now_unix())?;
    end_and_confirm(
        provider.as_mut(),
        action,
        &a.out,
        a.poll_s.max(0.0),
        a.max_wait_s.max(0.0),
        &lab_budget::clock::SystemClock,
    )?;
    println!(
        "{}: instance gone; proof in {}",
        provider.name(),
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
