//! `lab plan --check-lab FILE`: a lab page's promises (steps × tokens in so many hours on so
//! many GPUs at an MFU, under a dollar cap) checked against the planner's arithmetic.
//!
//! The file names the config the page runs (relative to the file), the promises as the page
//! states them, and optionally a `[plan]` table with the planner inputs the page leaves
//! unsaid (price, overhead, storage), all of which are printed as assumptions.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lab_config::LabConfig;
use serde::{Deserialize, Serialize};

use crate::checks::MAX_CREDIBLE_MFU;
use crate::schedule::Buys;
use crate::units::{group, hours, si, usd};
use crate::{plan, Plan, PlanInputs, PlanRequest};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabPage {
    pub name: String,
    /// The page's title.
    #[serde(default)]
    pub page: Option<String>,
    /// The config the page runs, relative to this file.
    pub config: PathBuf,
    /// What the page promises (required by `--check-lab`).
    #[serde(default)]
    pub promises: Option<Promises>,
    #[serde(default)]
    pub plan: PlanRequest,
    /// How `lab run` runs the page (read by the lab binary, not by the planner).
    #[serde(default)]
    pub run: Option<toml::Table>,
}

/// What the page promises a student.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Promises {
    pub device: String,
    pub gpus: usize,
    pub steps: u64,
    pub tokens_per_step: u64,
    pub hours: f64,
    pub mfu: f64,
    pub budget_usd: f64,
}

/// One promise against the arithmetic.
#[derive(Debug, Clone, Serialize)]
pub struct CheckLine {
    pub promise: &'static str,
    pub page_says: String,
    pub arithmetic_says: String,
    pub holds: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PageCheck {
    pub file: String,
    pub name: String,
    pub page: Option<String>,
    pub config: String,
    pub promises: Promises,
    pub checks: Vec<CheckLine>,
    pub holds: bool,
    /// What the page's hours and budget actually buy at its MFU.
    pub proposal: Option<Buys>,
    pub plan: Plan,
}

impl PageCheck {
    pub fn failed(&self) -> Vec<&CheckLine> {
        self.checks.iter().filter(|c| !c.holds).collect()
    }
}

/// Reads the page file and its config. Errors name the file.
pub fn load(path: &Path) -> Result<(LabPage, LabConfig, PathBuf)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read lab page {}", path.display()))?;
    let page: LabPage = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "lab page {}: {} (expected name, config, [promises], an optional [plan] and [run])",
            path.display(),
            lab_config::toml_error(&text, &e)
        )
    })?;
    let config_path = path.parent().unwrap_or(Path::new(".")).join(&page.config);
    let cfg = LabConfig::load(&config_path).with_context(|| {
        format!(
            "lab page {}: its config = {:?} (resolved relative to the page file)",
            path.display(),
            page.config.display()
        )
    })?;
    Ok((page, cfg, config_path))
}

/// Checks the page at `path`. `overrides` (CLI flags) replace the page's `[plan]` inputs;
/// the promises themselves are never overridden.
pub fn check(path: &Path, overrides: &PlanRequest) -> Result<PageCheck> {
    let (page, cfg, config_path) = load(path)?;
    let Some(p) = &page.promises else {
        anyhow::bail!(
            "lab page {} has no [promises] to check (device, gpus, steps, tokens_per_step, hours, mfu, budget_usd)",
            path.display()
        );
    };
    // The page's own numbers are the page's errors (exit 1, naming the field), not a flag's.
    if !(p.mfu > 0.0 && p.mfu <= 1.0) {
        anyhow::bail!(
            "lab page {}: [promises] mfu = {} must be in (0, 1]",
            path.display(),
            p.mfu
        );
    }
    let mut req = page.plan.clone().merged_with(overrides);
    req.device = Some(p.device.clone());
    req.gpus = Some(p.gpus);
    req.tokens = Some(p.steps as f64 * p.tokens_per_step as f64);
    req.batch_tokens = Some(p.tokens_per_step as f64);
    req.hours = Some(p.hours);
    req.budget_usd = Some(p.budget_usd);
    if req.mfu.is_empty() {
        req.mfu = vec![p.mfu];
    }
    let inputs =
        PlanInputs::resolve(&cfg, &req).with_context(|| format!("lab page {}", path.display()))?;
    let plan = plan(&inputs);

    let mut checks = Vec::new();
    let config_batch = cfg.tokens_per_step() * p.gpus;
    checks.push(CheckLine {
        promise: "recipe",
        page_says: format!(
            "{} steps × {} tokens",
            group(p.steps),
            group(p.tokens_per_step)
        ),
        arithmetic_says: format!(
            "config {}: {} steps × {} tokens",
            cfg.name,
            group(cfg.train.total_steps as u64),
            group(config_batch as u64)
        ),
        holds: cfg.train.total_steps as u64 == p.steps && config_batch as u64 == p.tokens_per_step,
    });

    let at_page_mfu = plan
        .scenarios
        .iter()
        .find(|s| s.mfu == p.mfu)
        .unwrap_or(&plan.scenarios[0]);
    let by_key = |key: &str| plan.flops.iter().find(|f| f.convention.key == key);
    let non_embedding = by_key("6n-non-embedding").expect("always computed");
    let causal = by_key("full-causal").expect("always computed");
    checks.push(CheckLine {
        promise: "throughput",
        page_says: format!(
            "{} tokens/s ({} tokens in {})",
            si(p.steps as f64 * p.tokens_per_step as f64 / (p.hours * 3600.0)),
            si(p.steps as f64 * p.tokens_per_step as f64),
            hours(p.hours)
        ),
        arithmetic_says: format!(
            "{} tokens/s at MFU {:.2} counting LM head + attention ({} with non-embedding 6N)",
            si(at_page_mfu.tokens_per_s),
            at_page_mfu.mfu,
            si(non_embedding.tokens_per_s)
        ),
        holds: at_page_mfu.wall_clock_hours <= p.hours,
    });
    checks.push(CheckLine {
        promise: "time",
        page_says: hours(p.hours),
        arithmetic_says: format!(
            "{} at MFU {:.2} ({} with non-embedding 6N)",
            hours(at_page_mfu.wall_clock_hours),
            at_page_mfu.mfu,
            hours(non_embedding.compute_hours * inputs.overhead)
        ),
        holds: at_page_mfu.wall_clock_hours <= p.hours,
    });
    let required = plan
        .deadline
        .as_ref()
        .map(|d| d.required_mfu)
        .unwrap_or(0.0);
    checks.push(CheckLine {
        promise: "MFU",
        page_says: format!("{:.2}", p.mfu),
        arithmetic_says: format!(
            "needs {:.2} (non-embedding 6N: {:.2}; causal attention skipped: {:.2}); above {MAX_CREDIBLE_MFU} is not credible",
            required,
            non_embedding.mfu_for_deadline.unwrap_or(0.0),
            causal.mfu_for_deadline.unwrap_or(0.0)
        ),
        holds: required <= p.mfu && required <= MAX_CREDIBLE_MFU,
    });
    let first_cost = at_page_mfu.costs.first();
    checks.push(CheckLine {
        promise: "budget",
        page_says: usd(p.budget_usd),
        arithmetic_says: first_cost
            .map(|c| {
                format!(
                    "{} at {} ${:.2}/GPU-h",
                    usd(c.billed_usd),
                    c.price,
                    c.usd_per_gpu_hour
                )
            })
            .unwrap_or_else(|| "no price for this device: pass --price".into()),
        holds: first_cost.is_some_and(|c| c.billed_usd <= p.budget_usd),
    });
    checks.push(CheckLine {
        promise: "memory",
        page_says: format!("fits {} × {}", p.gpus, p.device),
        arithmetic_says: format!(
            "{} of {} GiB per GPU",
            crate::units::gib(plan.memory.chosen.total),
            crate::units::gib(plan.memory.device_memory_bytes)
        ),
        holds: plan.memory.fits,
    });

    Ok(PageCheck {
        file: path.display().to_string(),
        name: page.name.clone(),
        page: page.page.clone(),
        config: config_path.display().to_string(),
        promises: p.clone(),
        holds: checks.iter().all(|c| c.holds),
        checks,
        proposal: plan.proposal.clone(),
        plan,
    })
}

pub fn render(check: &PageCheck) -> String {
    let mut out = format!(
        "lab plan --check-lab {}: {}\n\n",
        check.file,
        check.page.as_deref().unwrap_or(&check.name)
    );
    let mut t = crate::report::Table::new(&["promise", "page says", "arithmetic says", "holds"])
        .left_aligned(&[1, 2]);
    for c in &check.checks {
        t.row(vec![
            c.promise.into(),
            c.page_says.clone(),
            c.arithmetic_says.clone(),
            if c.holds { "yes".into() } else { "NO".into() },
        ]);
    }
    out.push_str(&t.render("  "));
    if let Some(p) = &check.proposal {
        out.push_str(&format!(
            "\n  proposal: at MFU {:.2}, {} and {} buy {} steps × {} tokens = {} tokens: set train.total_steps = {}, or promise {} and {}\n",
            check.promises.mfu,
            hours(check.promises.hours),
            usd(check.promises.budget_usd),
            group(p.steps),
            group(check.promises.tokens_per_step),
            si(p.tokens),
            p.steps,
            hours(check.plan.scenarios[0].wall_clock_hours),
            check.plan.scenarios[0]
                .costs
                .first()
                .map(|c| usd(c.billed_usd))
                .unwrap_or_default()
        ));
    }
    out.push_str(&format!(
        "\n  verdict: {}\n\n",
        if check.holds {
            "the page's promises add up".to_string()
        } else {
            format!(
                "{} of {} promises do not add up ({})",
                check.failed().len(),
                check.checks.len(),
                check
                    .failed()
                    .iter()
                    .map(|c| c.promise)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    ));
    out.push_str(&crate::report::render(&check.plan));
    out
}
