//! `lab dod check DIR --spec F`: the Definition-of-Done verdict on an exported run. Each check
//! is declared in the spec with a name, a threshold and why it exists; each result says what
//! was found and what was expected. Rendered as a table for people, JSON, or JUnit XML for CI.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::export::{read_metrics_csv, FINAL_WEIGHTS};
use crate::manifest::MANIFEST;

/// A DoD spec file (`configs/dod/<lab>.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    #[serde(rename = "check")]
    pub checks: Vec<CheckSpec>,
}

/// One declared check (unknown keys are refused by its kind).
#[derive(Debug, Clone, Deserialize)]
pub struct CheckSpec {
    pub name: String,
    #[serde(flatten)]
    pub kind: Kind,
    /// Why the check exists (printed with every failure).
    pub why: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Kind {
    /// manifest.json exists and holds every dotted field of `require`.
    Manifest { require: Vec<String> },
    /// Every file manifest.json lists under `artifacts` is in the folder with that sha256.
    Artifacts,
    /// The final validation loss (manifest, confirmed by metrics.csv's row of the step it was
    /// measured at) lies in [min, max].
    ValLoss { min: f64, max: f64 },
    /// final.safetensors has the manifest's sha256, loads into the run's model, and saves
    /// back to the same bytes.
    Weights,
    /// Total spend at most the cap (the spec's, else the run's `[budget] cap_usd`).
    Spend {
        #[serde(default)]
        cap_usd: Option<f64>,
    },
    /// spike-postmortem.md names at least one spike, and the run's records confirm each: a
    /// detection event at the step with a loss ratio of at least `min_ratio` (or a
    /// gradient-norm flag), and metrics rows of that step, where logged, agreeing with it.
    Postmortem {
        #[serde(default = "default_ratio")]
        min_ratio: f64,
    },
    /// The shipped weights are the run's end: it finished (or stopped early by its stop
    /// rules), and the final losses were measured at the shipped checkpoint's step.
    Completed,
    /// termination.json proves the instance is gone, or the spec records a waiver.
    Termination {
        #[serde(default)]
        waiver: Option<String>,
    },
}

fn default_ratio() -> f64 {
    1.2
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub passed: bool,
    pub found: String,
    pub expected: String,
    pub why: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub spec: String,
    pub dir: PathBuf,
    pub passed: bool,
    pub checks: Vec<CheckResult>,
}

impl Spec {
    pub fn load(path: &Path) -> Result<Spec> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read DoD spec {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("DoD spec {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Spec> {
        let spec: Spec = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("{}", lab_config::toml_error(text, &e)))?;
        if spec.checks.is_empty() {
            bail!("declares no [[check]]");
        }
        for c in &spec.checks {
            if let Kind::ValLoss { min, max } = c.kind {
                if min > max || min.is_nan() || max.is_nan() {
                    bail!(
                        "check {:?}: min = {min} is above max = {max}; no loss could pass",
                        c.name
                    );
                }
            }
        }
        Ok(spec)
    }
}

/// Runs every check of `spec` on the export folder `dir`. Checks read the manifest's fields
/// they need, so one missing field fails one check, not all.
pub fn check(dir: &Path, spec: &Spec) -> Verdict {
    let manifest = read_manifest(dir);
    let mut hashes = Hashes::default();
    let checks: Vec<CheckResult> = spec
        .checks
        .iter()
        .map(|c| {
            let ran = run_check(dir, &c.kind, manifest.as_ref(), &mut hashes);
            let (passed, found, expected) = match ran {
                Ok(r) => r,
                Err(e) => (false, format!("{e:#}"), expected_of(&c.kind)),
            };
            CheckResult {
                name: c.name.clone(),
                passed,
                found,
                expected,
                why: c.why.clone(),
            }
        })
        .collect();
    Verdict {
        spec: spec.name.clone(),
        dir: dir.to_path_buf(),
        passed: checks.iter().all(|c| c.passed),
        checks,
    }
}

fn expected_of(kind: &Kind) -> String {
    match kind {
        Kind::Manifest { require } => format!("manifest.json with {}", require.join(", ")),
        Kind::Artifacts => "every file manifest.json lists, with its sha256".into(),
        Kind::ValLoss { min, max } => format!("final val loss in [{min}, {max}]"),
        Kind::Weights => "final.safetensors matching the manifest, round-tripping".into(),
        Kind::Spend { cap_usd } => match cap_usd {
            Some(c) => format!("spend <= ${c:.2}"),
            None => "spend <= the run's cap".into(),
        },
        Kind::Postmortem { min_ratio } => {
            format!("a post-mortem naming spikes that events.jsonl records at >= {min_ratio}× the pre-spike mean and the metrics agree with")
        }
        Kind::Termination { .. } => {
            "termination.json confirming the instance is gone, or a waiver".into()
        }
        Kind::Completed => {
            "state done (or stopped_early) and losses measured at the shipped step".into()
        }
    }
}

type Outcome = (bool, String, String);

fn read_manifest(dir: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(dir.join(MANIFEST))
        .with_context(|| format!("no {} in {}", MANIFEST, dir.display()))?;
    serde_json::from_str(&text).context("manifest.json is not valid JSON")
}

/// sha256 of the export's files, each read once however many checks ask: final.safetensors
/// is both the artifacts check's and the weights check's (gigabytes for a 7B model).
#[derive(Default)]
struct Hashes(BTreeMap<PathBuf, String>);

impl Hashes {
    fn of(&mut self, path: &Path) -> Result<String> {
        if let Some(sha) = self.0.get(path) {
            return Ok(sha.clone());
        }
        let sha = lab_fsio::sha256_file(path)?;
        self.0.insert(path.to_path_buf(), sha.clone());
        Ok(sha)
    }
}

fn run_check(
    dir: &Path,
    kind: &Kind,
    manifest: Result<&Value, &anyhow::Error>,
    hashes: &mut Hashes,
) -> Result<Outcome> {
    let expected = expected_of(kind);
    let manifest = || manifest.map_err(|e| anyhow::anyhow!("{e:#}"));
    Ok(match kind {
        Kind::Manifest { require } => {
            let v = manifest()?;
            let missing: Vec<&str> = require
                .iter()
                .filter(|f| f.split('.').try_fold(v, |v, k| v.get(k)).is_none_or(blank))
                .map(String::as_str)
                .collect();
            if missing.is_empty() {
                (
                    true,
                    format!("all {} fields present", require.len()),
                    expected,
                )
            } else {
                (false, format!("missing: {}", missing.join(", ")), expected)
            }
        }
        Kind::ValLoss { min, max } => {
            let Some(val) = manifest()?["final_metrics"]["val_loss"].as_f64() else {
                return Ok((
                    false,
                    "no validation loss in manifest.json".into(),
                    expected,
                ));
            };
            // The row of the step it was measured at: an export of an earlier checkpoint
            // carries the whole run's metrics.
            let at = manifest()?["final_metrics"]["val_step"].as_u64();
            let csv = read_metrics_csv(&dir.join("metrics.csv"))?;
            let logged = csv
                .iter()
                .rev()
                .find(|(step, n, _)| n == "val_loss" && at.is_none_or(|at| *step == at))
                .map(|r| r.2);
            if logged != Some(val) {
                let row = at.map_or("last val_loss".into(), |s| format!("val_loss at step {s}"));
                let logged = logged.map_or("missing".into(), |v| v.to_string());
                return Ok((
                    false,
                    format!("manifest says {val} but metrics.csv's {row} is {logged}"),
                    expected,
                ));
            }
            ((*min..=*max).contains(&val), format!("{val:.4}"), expected)
        }
        Kind::Artifacts => artifacts(dir, manifest()?, expected, hashes),
        Kind::Weights => weights(dir, manifest()?, expected, hashes)?,
        Kind::Spend { cap_usd } => {
            let cost = &manifest()?["cost"];
            let Some(cap) = cap_usd.or(cost["cap_usd"].as_f64()) else {
                return Ok((
                    false,
                    "no cap in the spec or the run's [budget]".into(),
                    expected,
                ));
            };
            match cost["total_usd"].as_f64() {
                Some(spent) => (
                    spent <= cap,
                    format!("${spent:.4}"),
                    format!("<= ${cap:.2}"),
                ),
                None => (
                    false,
                    "no spend on record (manifest cost.total_usd)".into(),
                    format!("<= ${cap:.2}"),
                ),
            }
        }
        Kind::Postmortem { min_ratio } => postmortem(dir, *min_ratio, expected)?,
        Kind::Completed => completed(manifest()?, expected),
        Kind::Termination { waiver } => {
            let proof = std::fs::read_to_string(dir.join("termination.json")).ok();
            match (proof, waiver) {
                (Some(text), _) => {
                    let v: Value = serde_json::from_str(&text)
                        .context("termination.json is not valid JSON")?;
                    let gone = v["confirmed_gone"] == true;
                    let found = format!(
                        "{} {} {}",
                        v["provider"].as_str().unwrap_or("?"),
                        v["instance_id"].as_str().unwrap_or("?"),
                        if gone {
                            "confirmed gone"
                        } else {
                            "NOT confirmed gone"
                        }
                    );
                    (gone, found, expected)
                }
                (None, Some(w)) => (true, format!("waived: {w}"), expected),
                (None, None) => (false, "no termination.json and no waiver".into(), expected),
            }
        }
    })
}

/// A field that says nothing: null, empty, or "unknown".
fn blank(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty() || s == "unknown",
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn completed(m: &Value, expected: String) -> Outcome {
    let state = m["state"].as_str().unwrap_or("?");
    let (ck, total) = (m["checkpoint_step"].as_u64(), m["total_steps"].as_u64());
    let f = &m["final_metrics"];
    let (step, val_step) = (f["step"].as_u64(), f["val_step"].as_u64());
    let show = |v: Option<u64>| v.map_or("?".into(), |s| s.to_string());
    let found = format!(
        "state {state}, weights of step {}, losses at step {} (val at {}) of {}",
        show(ck),
        show(step),
        show(val_step),
        show(total)
    );
    let finished = (state == "done" && ck == total) || state == "stopped_early";
    (
        finished && ck.is_some() && step == ck && val_step == ck,
        found,
        expected,
    )
}

/// The files the manifest vouches for, each hashed again: a file missing or changed since the
/// export fails, named.
fn artifacts(dir: &Path, m: &Value, expected: String, hashes: &mut Hashes) -> Outcome {
    let Some(listed) = m["artifacts"].as_object().filter(|a| !a.is_empty()) else {
        return (false, "manifest.json lists no artifacts".into(), expected);
    };
    let mut problems = Vec::new();
    for (name, sha) in listed {
        let path = dir.join(name);
        match hashes.of(&path) {
            Ok(actual) if Some(actual.as_str()) == sha.as_str() => {}
            Ok(_) => problems.push(format!("{name} changed")),
            Err(_) => problems.push(format!("{name} missing")),
        }
    }
    match problems.is_empty() {
        true => (true, format!("{} files match", listed.len()), expected),
        false => (false, problems.join(", "), expected),
    }
}

fn weights(dir: &Path, m: &Value, expected: String, hashes: &mut Hashes) -> Result<Outcome> {
    let path = dir.join(FINAL_WEIGHTS);
    let actual = hashes.of(&path)?;
    let Some(listed) = m["artifacts"][FINAL_WEIGHTS].as_str() else {
        return Ok((
            false,
            "manifest.json lists no sha256 for final.safetensors".into(),
            expected,
        ));
    };
    if actual != listed {
        return Ok((
            false,
            format!(
                "sha256 {} but the manifest says {}",
                lab_fsio::short_sha256(&actual),
                lab_fsio::short_sha256(listed)
            ),
            expected,
        ));
    }
    let (tensors, meta) = lab_model::weights::load_safetensors(&path)?;
    let cfg: lab_config::LabConfig =
        serde_json::from_value(m["config"].clone()).context("manifest.json's config")?;
    let model = lab_model::Llama::<burn::backend::Flex>::new(
        &cfg.model,
        cfg.train.seed,
        &Default::default(),
    );
    lab_model::weights::load_tensor_map(model, &tensors)
        .context("final.safetensors does not fit the run's model")?;
    let same = lab_model::weights::to_safetensors_bytes(&tensors, meta)? == std::fs::read(&path)?;
    if !same {
        return Ok((
            false,
            "loads, but saving it again gives other bytes".into(),
            expected,
        ));
    }
    Ok((
        true,
        format!(
            "sha256 matches, {} tensors load and round-trip",
            tensors.len()
        ),
        expected,
    ))
}

/// Steps named by `## Spike at step N` headings.
fn named_spikes(md: &str) -> Vec<u64> {
    md.lines()
        .filter_map(|l| l.strip_prefix("## Spike at step ")?.trim().parse().ok())
        .collect()
}

/// Each spike the post-mortem names must be on record: a `spike_detected` event at that step
/// whose numbers make it a spike (a loss ratio to the pre-spike mean of at least `min_ratio`,
/// or a gradient-norm flag), and metrics that agree: the kept metrics row of the step carries
/// the event's loss, unless a later rollback undid the step, in which case the kept row is its
/// replay and the rows set aside by the rollback (if the step was logged before it) must.
fn postmortem(dir: &Path, min_ratio: f64, expected: String) -> Result<Outcome> {
    let md = std::fs::read_to_string(dir.join("spike-postmortem.md"))
        .with_context(|| format!("no spike-postmortem.md in {}", dir.display()))?;
    let steps = named_spikes(&md);
    if steps.is_empty() {
        return Ok((false, "spike-postmortem.md names no spike".into(), expected));
    }
    let events = lab_run::jsonl::read_lines::<lab_run::Event>(&dir.join(lab_run::EVENTS))?;
    let kept = read_metrics_csv(&dir.join("metrics.csv"))?;
    let aside = match dir.join("metrics-abandoned.csv") {
        p if p.exists() => read_metrics_csv(&p)?,
        _ => Vec::new(),
    };
    let losses = |rows: &[(u64, String, f64)], step: u64| -> Vec<f64> {
        rows.iter()
            .filter(|(s, n, _)| *s == step && n == "loss")
            .map(|r| r.2)
            .collect()
    };
    let mut confirmed = Vec::new();
    for step in steps {
        let Some(i) = events
            .iter()
            .position(|e| e.kind == "spike_detected" && e.step == step)
        else {
            let why = format!("names step {step}, but events.jsonl has no spike_detected there");
            return Ok((false, why, expected));
        };
        let e = &events[i];
        let (loss, ratio) = (
            e.f64("loss").unwrap_or(f64::NAN),
            e.f64("ratio").unwrap_or(0.0),
        );
        let flag = e.str("flag").unwrap_or("");
        if flag != "grad_norm_spike" && ratio.partial_cmp(&min_ratio).is_none_or(|o| o.is_lt()) {
            let why =
                format!("step {step}: the event's loss ratio {ratio:.2} is under {min_ratio}");
            return Ok((false, why, expected));
        }
        let undone = events[i + 1..]
            .iter()
            .any(|r| r.kind == "rollback" && r.u64("to_step").is_some_and(|t| t < step));
        let rows = if undone {
            losses(&aside, step)
        } else {
            losses(&kept, step)
        };
        let agrees = |l: &f64| ((l - loss) / loss).abs() <= 1e-6;
        if !undone && rows.is_empty() {
            let why = format!("step {step}: the spike was kept but metrics.csv has no loss there");
            return Ok((false, why, expected));
        }
        if !rows.is_empty() && !rows.iter().any(agrees) {
            let why = format!(
                "step {step}: metrics say loss {:.4}, the event {loss:.4}",
                rows[0]
            );
            return Ok((false, why, expected));
        }
        let seen = if rows.is_empty() {
            "event, undone by a rollback"
        } else {
            "event and metrics"
        };
        confirmed.push(format!("step {step} ({flag}, {ratio:.2}×, {seen})"));
    }
    Ok((
        true,
        format!("confirmed: {}", confirmed.join(", ")),
        expected,
    ))
}

impl Verdict {
    /// The table for people.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Definition of Done: {} on {}",
            self.spec,
            self.dir.display()
        );
        let w = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let _ = writeln!(out, "  {:<w$}  {:<6}  found", "check", "result");
        for c in &self.checks {
            let _ = writeln!(
                out,
                "  {:<w$}  {:<6}  {}",
                c.name,
                if c.passed { "PASS" } else { "FAIL" },
                c.found
            );
            if !c.passed {
                let _ = writeln!(out, "  {:<w$}          expected: {}", "", c.expected);
                let _ = writeln!(out, "  {:<w$}          why: {}", "", c.why);
            }
        }
        let failed = self.checks.iter().filter(|c| !c.passed).count();
        let _ = writeln!(
            out,
            "{}: {} of {} checks pass",
            if self.passed { "PASS" } else { "FAIL" },
            self.checks.len() - failed,
            self.checks.len()
        );
        out
    }

    pub fn render_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("verdict serializes") + "\n"
    }

    /// JUnit XML: one testsuite, one testcase per check, a `<failure>` for each failed one.
    pub fn render_junit(&self) -> String {
        let failures = self.checks.iter().filter(|c| !c.passed).count();
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            x,
            "<testsuites name=\"lab dod\" tests=\"{}\" failures=\"{failures}\">\n  <testsuite name=\"dod.{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\">",
            self.checks.len(),
            xml(&self.spec),
            self.checks.len()
        );
        for c in &self.checks {
            let _ = write!(
                x,
                "    <testcase classname=\"dod.{}\" name=\"{}\"",
                xml(&self.spec),
                xml(&c.name)
            );
            if c.passed {
                let _ = writeln!(x, "><system-out>{}</system-out></testcase>", xml(&c.found));
            } else {
                let _ = writeln!(
                    x,
                    ">\n      <failure message=\"{}\" type=\"dod\">found: {}\nexpected: {}\nwhy: {}</failure>\n    </testcase>",
                    xml(&c.found),
                    xml(&c.found),
                    xml(&c.expected),
                    xml(&c.why)
                );
            }
        }
        x.push_str("  </testsuite>\n</testsuites>\n");
        x
    }
}

fn xml(s: &str) -> String {
    s.chars()
        .filter(|&c| c == '\t' || c == '\n' || c == '\r' || c >= ' ')
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&apos;".to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_with_their_kinds_and_bad_ones_say_why() {
        let s = Spec::parse(
            r#"name = "t"
[[check]]
name = "loss"
kind = "val-loss"
min = 1.0
max = 2.0
why = "the recipe works"
[[check]]
name = "term"
kind = "termination"
waiver = "local"
why = "no leftover bills"
"#,
        )
        .unwrap();
        assert_eq!(s.checks.len(), 2);
        assert!(matches!(
            s.checks[1].kind,
            Kind::Termination { waiver: Some(_) }
        ));
        let e = Spec::parse("name = \"t\"\n[[check]]\nname = \"x\"\nkind = \"nope\"\nwhy = \"\"\n")
            .unwrap_err();
        assert!(format!("{e}").contains("nope"), "{e}");
        let band = "name = \"t\"\n[[check]]\nname = \"v\"\nkind = \"val-loss\"\nmin = 6.0\nmax = 5.0\nwhy = \"w\"\n";
        let e = Spec::parse(band).unwrap_err();
        assert!(format!("{e}").contains("min = 6 is above max = 5"), "{e}");
        assert_eq!(
            named_spikes("# x\n## Spike at step 61\n## Spike at step 7\n"),
            vec![61, 7]
        );
        assert_eq!(xml("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
