//! `lab run [SPEC]`: the whole lab, end to end, from a lab page (`configs/lab/*.toml`; with no
//! SPEC the embedded CPU lab): prepare → train (seeded spike, billing sidecar as a child
//! process) → post-mortem → export → Definition of Done. Running it again resumes where it
//! stopped: each stage knows whether its output is complete.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lab_budget::BudgetFlags;
use lab_report::dod::{self, Spec};
use lab_report::{CheckpointChoice, ExportOptions};
use lab_train::backend::BackendKind;
use serde::Deserialize;

use super::train::{self, Ended, SpikeFlags, SpikePolicyArg};

pub const TINY_PAGE: &str = include_str!("../../../configs/lab/tiny-cpu.toml");
pub const TINY_DOD: &str = include_str!("../../../configs/dod/tiny-cpu.toml");

#[derive(clap::Args)]
pub struct Args {
    /// A lab page (configs/lab/*.toml with a [run] section). Default: the embedded CPU lab.
    pub spec: Option<PathBuf>,
    /// Print the stages and what each would do, and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// Also log the run and its export to an MLflow file store (`file:///…/mlruns`).
    #[arg(long, value_name = "URI")]
    pub mlflow_uri: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Page {
    name: String,
    #[serde(default)]
    page: Option<String>,
    config: PathBuf,
    #[serde(default)]
    #[allow(dead_code)]
    promises: Option<toml::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    plan: Option<toml::Value>,
    run: RunSection,
}

/// `[run]` of a lab page.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunSection {
    /// `tinyshakespeare` (the bundled corpus) or a data dir, relative to the page: prepared,
    /// or made by `[run.prepare]`.
    data: String,
    run_dir: PathBuf,
    export_dir: PathBuf,
    dod: PathBuf,
    #[serde(default)]
    inject_spike_at_step: Option<u64>,
    #[serde(default)]
    spike_batches: Option<u64>,
    /// wait (default), rollback, skip or kill.
    #[serde(default)]
    spike_policy: Option<String>,
    #[serde(default = "cpu")]
    backend: String,
    #[serde(default)]
    terminate_on_exit: bool,
    #[serde(default)]
    mlflow_uri: Option<String>,
    budget: Sidecar,
    /// How to make `data` when it is not prepared yet.
    #[serde(default)]
    prepare: Option<Prepare>,
}

/// `[run.prepare]`: `lab data prepare`'s flags (its `--output-dir` is `[run] data`), so a
/// page names its corpus once and `lab run` goes from raw text to the DoD verdict. Paths in
/// them are as the shell sees them from where `lab run` starts.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Prepare {
    args: Vec<String>,
}

impl Prepare {
    /// `lab data prepare`'s flags as a shell would take them (quoted where they hold spaces
    /// or quotes), `--output-dir` last.
    fn command_line(&self, data_dir: &Path) -> String {
        let quote = |a: &String| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"\\$".contains(c)) {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a.clone()
            }
        };
        let out = ["--output-dir".to_string(), data_dir.display().to_string()];
        let flags: Vec<String> = self.args.iter().chain(&out).map(quote).collect();
        flags.join(" ")
    }
}

/// The page's `[run.prepare]` when its data dir has no meta.json yet. A data dir with one is
/// never prepared over: a meta.json that does not load is reported, not silently redone.
fn to_prepare(lab: &Lab) -> Option<&Prepare> {
    let prepare = lab.page.run.prepare.as_ref()?;
    (!lab.data_dir.join("meta.json").exists()).then_some(prepare)
}

fn cpu() -> String {
    "cpu".into()
}

/// `[run.budget]`: the billing sidecar and, when the config has no `[budget]`, the cap.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sidecar {
    provider: String,
    #[serde(default)]
    rate_usd_per_hr: Option<f64>,
    #[serde(default)]
    cap_usd: Option<f64>,
    #[serde(default)]
    alert_usd: Option<f64>,
    #[serde(default = "five")]
    poll_interval_s: f64,
}

fn five() -> f64 {
    5.0
}

/// A page with its files resolved: the config (a path, or the embedded default) and the DoD spec.
struct Lab {
    page: Page,
    /// The page's `[run] backend`.
    backend: BackendKind,
    /// `None`: the embedded configs/tiny-cpu.toml.
    config: Option<PathBuf>,
    data_dir: PathBuf,
    dod: Spec,
}

fn load(spec: Option<&Path>) -> Result<Lab> {
    let Some(path) = spec else {
        let page: Page = toml::from_str(TINY_PAGE).context("embedded lab page")?;
        return Ok(Lab {
            backend: page.run.backend.parse()?,
            data_dir: PathBuf::from("runs/data/tinyshakespeare-gpt2"),
            dod: Spec::parse(TINY_DOD)?,
            config: None,
            page,
        });
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read lab page {}", path.display()))?;
    let page: Page = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "lab page {}: {} (lab run needs name, config and a [run] section with [run.budget])",
            path.display(),
            lab_config::toml_error(&text, &e)
        )
    })?;
    let here = path.parent().unwrap_or(Path::new("."));
    // The page's mistakes surface now, before data is prepared or a sidecar started.
    let config = here.join(&page.config);
    lab_config::LabConfig::load(&config).with_context(|| {
        format!(
            "lab page {}: config = {:?}",
            path.display(),
            page.config.display().to_string()
        )
    })?;
    let Ok(backend) = page.run.backend.parse() else {
        bail!(
            "lab page {}: [run] backend = {:?} is unknown; use cpu, cuda or wgpu",
            path.display(),
            page.run.backend
        );
    };
    let data_dir = match page.run.data.as_str() {
        "tinyshakespeare" => PathBuf::from("runs/data/tinyshakespeare-gpt2"),
        d => here.join(d),
    };
    Ok(Lab {
        backend,
        config: Some(config),
        dod: Spec::load(&here.join(&page.run.dod))?,
        data_dir,
        page,
    })
}

pub fn run(args: Args) -> Result<ExitCode> {
    // What goes wrong comes from the page (its spike keys, its [run.prepare] flags), not from
    // the command line: an error, never a usage error (exit 1, not 2).
    run_page(args).map_err(|e| anyhow::anyhow!("{e:#}"))
}

fn run_page(args: Args) -> Result<ExitCode> {
    let lab = load(args.spec.as_deref())?;
    let r = &lab.page.run;
    super::export::check_mlflow_uri(args.mlflow_uri.as_deref().or(r.mlflow_uri.as_deref()), true)?;
    lab_fsio::console::line(&format!(
        "lab run: {}{}",
        lab.page.name,
        lab.page
            .page
            .as_ref()
            .map(|p| format!(" ({p})"))
            .unwrap_or_default()
    ));
    if args.dry_run {
        return dry_run(&lab);
    }
    lab.backend.ensure_available().context("[run] backend")?;
    stage(
        "1/5 prepare",
        &format!("data in {}", lab.data_dir.display()),
    );
    prepare(&lab)?;
    stage("2/5 train", &format!("run folder {}", r.run_dir.display()));
    if let Some(code) = train_stage(&lab)? {
        // Stopped (budget, stability, signal): a rented instance stops paying all the same.
        terminate(&lab)?;
        return Ok(code);
    }
    stage("3/5 post-mortem", "");
    let pm = lab_report::write_postmortem(&r.run_dir, None)?;
    lab_fsio::console::line(&format!("  {}", pm.display()));
    stage("4/5 export", &format!("to {}", r.export_dir.display()));
    export(&lab)?;
    // Only now that the evidence is on disk may the machine go; its proof joins the export.
    if terminate(&lab)? {
        export(&lab)?;
    }
    if let Some(uri) = args.mlflow_uri.as_ref().or(r.mlflow_uri.as_ref()) {
        super::export::log_mlflow(uri, &r.run_dir, Some(&r.export_dir));
    }
    stage("5/5 definition of done", &format!("spec {}", lab.dod.name));
    let verdict = dod::check(&r.export_dir, &lab.dod);
    print!("{}", verdict.render_text());
    lab_fsio::write_atomic(
        &r.run_dir.join("dod.json"),
        verdict.render_json().as_bytes(),
    )?;
    Ok(if verdict.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn export(lab: &Lab) -> Result<()> {
    let r = &lab.page.run;
    let m = lab_report::export(&ExportOptions {
        run: r.run_dir.clone(),
        output: r.export_dir.clone(),
        checkpoint: CheckpointChoice::Latest,
        budget: None,
    })?;
    for name in m.artifacts.keys() {
        lab_fsio::console::line(&format!("  {}", r.export_dir.join(name).display()));
    }
    lab_fsio::console::line(&format!(
        "  {}",
        r.export_dir.join("manifest.json").display()
    ));
    Ok(())
}

/// `terminate_on_exit`: ends the rented instance (proof in RUN/termination.json). Returns
/// whether it did.
fn terminate(lab: &Lab) -> Result<bool> {
    let r = &lab.page.run;
    if !r.terminate_on_exit {
        return Ok(false);
    }
    let config = lab_config::LabConfig::from_toml(&std::fs::read_to_string(
        r.run_dir.join(lab_run::CONFIG),
    )?)?;
    let Some(budget) = config.budget else {
        anyhow::bail!(
            "terminate_on_exit: the run recorded no [budget] to say which instance to end"
        );
    };
    lab_budget::EndOfRun::new(budget, &r.run_dir)
        .terminate()
        .context("terminate_on_exit")?;
    Ok(true)
}

fn stage(name: &str, what: &str) {
    lab_fsio::console::line(&format!(
        "== {name}{}",
        if what.is_empty() {
            String::new()
        } else {
            format!(": {what}")
        }
    ));
}

fn dry_run(lab: &Lab) -> Result<ExitCode> {
    let r = &lab.page.run;
    let config = lab
        .config
        .as_ref()
        .map_or("the embedded configs/tiny-cpu.toml".into(), |p| {
            p.display().to_string()
        });
    let source = if r.data == "tinyshakespeare" {
        "the bundled tinyshakespeare, GPT-2 BPE".to_string()
    } else {
        match (to_prepare(lab), lab_data::Meta::load(&lab.data_dir)) {
            (Some(p), _) => format!("lab data prepare {}", p.command_line(&lab.data_dir)),
            (None, Ok(_)) => "prepared".to_string(),
            (None, Err(e)) => format!("{e:#}"),
        }
    };
    lab_fsio::console::line(&format!(
        "  1 prepare  {} ({source})",
        lab.data_dir.display()
    ));
    lab_fsio::console::line(&format!(
        "  2 train    {config} on {} into {}{}, sidecar {} every {} s, {}",
        r.backend,
        r.run_dir.display(),
        r.inject_spike_at_step
            .map(|s| format!(", spike at step {s}"))
            .unwrap_or_default(),
        r.budget.provider,
        r.budget.poll_interval_s,
        if r.terminate_on_exit {
            "terminate the instance at the end"
        } else {
            "no termination"
        }
    ));
    lab_fsio::console::line(&format!(
        "  3 post-mortem {}",
        r.run_dir.join("spike-postmortem.md").display()
    ));
    lab_fsio::console::line(&format!("  4 export   {}", r.export_dir.display()));
    lab_fsio::console::line(&format!(
        "  5 DoD      {} ({} checks)",
        lab.dod.name,
        lab.dod.checks.len()
    ));
    Ok(ExitCode::SUCCESS)
}

fn prepare(lab: &Lab) -> Result<()> {
    if lab.page.run.data == "tinyshakespeare" {
        let meta = lab_data::gpt2::ensure_tinyshakespeare(&lab.data_dir)?;
        lab_fsio::console::line(&format!(
            "  tinyshakespeare: {} train / {} val tokens",
            meta.file("train.bin")?.tokens,
            meta.file("val.bin")?.tokens
        ));
        return Ok(());
    }
    if let Some(p) = to_prepare(lab) {
        lab_fsio::console::line(&format!(
            "  lab data prepare {}",
            p.command_line(&lab.data_dir)
        ));
        super::data::prepare_into(&p.args, &lab.data_dir).context("[run.prepare] args")?;
    }
    let meta = lab_data::Meta::load(&lab.data_dir).with_context(|| {
        format!(
            "[run] data = {:?}: add [run.prepare] args = [\"--input\", …] to the page, or prepare it with `lab data prepare --output-dir {}`",
            lab.page.run.data,
            lab.data_dir.display()
        )
    })?;
    for f in ["train.bin", "val.bin"] {
        lab_data::TokenFile::open(&lab.data_dir, f, &meta)?;
    }
    lab_fsio::console::line(&format!(
        "  {} ({}): complete",
        lab.data_dir.display(),
        meta.tokenizer
    ));
    Ok(())
}

/// Trains unless the run is already complete; `Some(code)` when training stopped the lab.
fn train_stage(lab: &Lab) -> Result<Option<ExitCode>> {
    let r = &lab.page.run;
    let status = lab_run::Status::read(&r.run_dir).ok();
    let finished = |s: &&lab_run::Status| {
        (s.state == "done" && s.step == s.total_steps) || s.state == "stopped_early"
    };
    if let Some(s) = status.as_ref().filter(finished) {
        lab_fsio::console::line(&format!("  complete: step {} of {}", s.step, s.total_steps));
        return Ok(None);
    }
    let resume = !lab_train::checkpoint::list(&r.run_dir)
        .unwrap_or_default()
        .is_empty();
    std::fs::create_dir_all(&r.run_dir)
        .with_context(|| format!("cannot create {}", r.run_dir.display()))?;
    let budget_json = std::path::absolute(r.run_dir.join("budget.json"))?;
    let mut sidecar = start_sidecar(lab, &budget_json)?;
    let args = train::Args {
        config: lab.config.clone(),
        data_dir: Some(lab.data_dir.clone()),
        ckpt_dir: Some(r.run_dir.clone()),
        total_steps: None,
        ckpt_every: None,
        eval_every: None,
        log_every: None,
        resume_from_latest: resume,
        extend_to_steps: None,
        seed: None,
        backend: r.backend.clone(),
        precision: None,
        activation_checkpointing: None,
        fit_micro_batch: None,
        inject_gpu_telemetry: None,
        mlflow_uri: None,
        spike: SpikeFlags {
            inject_spike_at_step: r.inject_spike_at_step,
            spike_batches: r.spike_batches,
            spike_policy: r
                .spike_policy
                .as_deref()
                .map(SpikePolicyArg::parse)
                .transpose()?,
            ..Default::default()
        },
        init: Default::default(),
        budget: BudgetFlags {
            budget_cap_usd: r.budget.cap_usd,
            budget_alert_usd: r.budget.alert_usd,
            budget_curr_cost_uri: Some(budget_json.display().to_string()),
            // lab run ends the instance itself, once the evidence is exported.
            terminate_on_exit: false,
            ..Default::default()
        },
    };
    let ended = train::train(&args);
    let _ = sidecar.kill();
    let _ = sidecar.wait();
    Ok(match ended? {
        Ended::Refused(code) => Some(code),
        Ended::Trained(lab_train::Outcome::Completed { .. }) => None,
        Ended::Trained(lab_train::Outcome::StoppedEarly { .. }) => None,
        Ended::Trained(other) => {
            eprintln!("lab run: training did not finish; run `lab run` again to resume");
            Some(train::exit_code(&other))
        }
    })
}

/// Starts `lab budget sidecar` writing `out`, as a child that dies with this process, and waits
/// for its first budget.json (the guard refuses to launch without one).
fn start_sidecar(lab: &Lab, out: &Path) -> Result<Child> {
    let b = &lab.page.run.budget;
    // A restarted meter continues from what the lab already spent, checkpoint or not.
    let prior = std::fs::read_to_string(out)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["spent_usd"].as_f64());
    let before = std::fs::metadata(out).and_then(|m| m.modified()).ok();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["budget", "sidecar", "--provider", &b.provider])
        .arg("--out")
        .arg(out)
        .arg("--run")
        .arg(std::path::absolute(&lab.page.run.run_dir)?)
        .args(["--poll-interval-s", &b.poll_interval_s.to_string()])
        .stdout(std::process::Stdio::null());
    if let Some(c) = &lab.config {
        cmd.arg("--config").arg(c);
    }
    if let Some(rate) = b.rate_usd_per_hr {
        cmd.args(["--rate-usd-per-hr", &rate.to_string()]);
    }
    if let Some(p) = prior {
        cmd.args(["--prior-spend-usd", &p.to_string()]);
    }
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().context("cannot start the budget sidecar")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let fresh = std::fs::metadata(out).and_then(|m| m.modified()).ok();
        if fresh.is_some() && fresh != before {
            lab_fsio::console::line(&format!(
                "  billing sidecar ({}) writing {}",
                b.provider,
                out.display()
            ));
            return Ok(child);
        }
        if let Some(status) = child.try_wait()? {
            bail!("the budget sidecar exited ({status}) before writing {}; run `lab budget sidecar` by hand to see why", out.display());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the budget sidecar wrote no {} within 60 s", out.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child gets SIGTERM when this process dies, even by kill -9: no orphan sidecar keeps
/// billing files fresh for a run nobody trains.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // Safety: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}
