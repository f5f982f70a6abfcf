//! Typed run configuration for `lab`: the model shape, the training recipe and the hardware,
//! read from TOML presets in `configs/`, validated with errors that name the bad field, and
//! hashed (sha256 over a canonical JSON form) so every checkpoint and export can say exactly
//! which configuration produced it.

pub mod budget;
pub mod data;
pub mod eval;
pub mod hardware;
pub mod model;
pub mod parallel;
pub mod stability;
pub mod train;
pub mod usage;

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use budget::{BudgetConfig, BudgetProvider};
pub use data::{CurriculumStage, DataConfig};
pub use eval::EvalConfig;
pub use hardware::{Hardware, HardwareSpec};
pub use model::{ModelConfig, ParamCount};
pub use parallel::ParallelConfig;
pub use stability::{Escalation, SpikeConfig, SpikeKind, SpikePolicy, Stability, StabilityConfig};
pub use train::{ActivationCheckpointing, LmHeadLoss, Precision, TrainConfig};
pub use usage::Usage;

/// One `configs/*.toml` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabConfig {
    /// Short name of the preset, used for default output folders.
    pub name: String,
    pub model: ModelConfig,
    pub train: TrainConfig,
    #[serde(default)]
    pub hardware: Hardware,
    /// `[budget]`: cap, alert and billing provider; absent means no guard unless flags give a cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetConfig>,
    /// `[stability]`: spike detection and response; absent means the documented defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stability: Option<StabilityConfig>,
    /// `[spike]`: a seeded loss spike injected on purpose (also `--inject-spike-at-step`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spike: Option<SpikeConfig>,
    /// `[eval]`: per-type validation, probes, samples and stop rules at every evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalConfig>,
    /// `[data]`: a mixture of sources (or a curriculum of mixtures); absent means uniform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataConfig>,
    /// `[parallel]`: data-parallel degree, ZeRO stage, collectives; absent means one process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<ParallelConfig>,
}

/// toml's error in one line: the line it points at, that line's text, and what is wrong
/// (toml's own message spans several lines with a source excerpt).
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what: Vec<&str> = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let what = what.join("; ");
    let Some(span) = e.span() else {
        return what;
    };
    let start = span.start.min(text.len());
    let number = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(number - 1).unwrap_or_default().trim();
    let line: String = match line.chars().count() > 60 {
        true => line.chars().take(57).chain("...".chars()).collect(),
        false => line.to_string(),
    };
    format!("line {number} `{line}`: {what}")
}

impl LabConfig {
    /// Reads and validates a TOML config. Every error names the file and the field.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::from_toml(&text).with_context(|| format!("config {}", path.display()))
    }

    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self> {
        let cfg: LabConfig =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", toml_error(text, &e)))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            bail!("`name` must not be empty");
        }
        self.model.validate()?;
        self.train.validate()?;
        self.hardware.validate()?;
        if let Some(b) = &self.budget {
            b.validate()?;
        }
        if let Some(s) = &self.stability {
            s.validate()?;
        }
        if let Some(s) = &self.spike {
            s.validate(self.train.total_steps)?;
        }
        if let Some(e) = &self.eval {
            e.validate()?;
        }
        if let Some(d) = &self.data {
            d.validate()?;
        }
        if let Some(p) = &self.parallel {
            p.validate()?;
        }
        self.check_fits_toml()
    }

    /// TOML's integers are i64: a larger value (a random 64-bit seed, say) could not be
    /// recorded in the run folder's config.toml.
    fn check_fits_toml(&self) -> Result<()> {
        let value = serde_json::to_value(self)?;
        if let Some((path, n)) = past_i64(&value, String::new()) {
            bail!(
                "{path} = {n} is past TOML's largest integer ({}): use a smaller value",
                i64::MAX
            );
        }
        Ok(())
    }

    /// The stability settings this run uses: the config's (or the defaults), windows left out
    /// scaled to its length.
    pub fn stability(&self) -> Stability {
        self.stability
            .clone()
            .unwrap_or_default()
            .resolve(self.train.total_steps)
    }

    /// The effective config as TOML (what a run folder's config.toml holds).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes to TOML")
    }

    /// Canonical serialization: JSON with fields in declaration order, no whitespace.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).expect("config serializes")
    }

    /// sha256 (hex) of the canonical serialization; identical configs hash identically
    /// whatever their TOML formatting, comments or key order.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.canonical_json().as_bytes()))
    }

    /// sha256 of the recipe a run follows: the model, the optimization recipe, the data mixture
    /// and any injected spike. Cadence (log, eval and checkpoint intervals, retention), hardware, budget and the
    /// stability policy are left out, so a run may resume with a new `--log-every`, budget cap
    /// or spike response (a person deciding what to do about a spike; the trainer records the
    /// change as an event), never with a new learning rate or batch.
    pub fn training_sha256(&self) -> String {
        let mut t = self.train.clone();
        (t.log_every, t.eval_every, t.eval_batches, t.ckpt_every) = (0, 0, 0, 0);
        (t.keep_last, t.keep_every) = (0, 0);
        // Recomputing instead of keeping changes no number (and `none` serializes as absent,
        // leaving earlier hashes as they were).
        t.activation_checkpointing = ActivationCheckpointing::None;
        // The mixture decides the samples; absent, it leaves earlier runs' hashes as they were.
        let json = match &self.data {
            None => serde_json::to_string(&(&self.model, &t, &self.spike)),
            Some(d) => {
                // The epoch warning's threshold decides nothing.
                let d = DataConfig {
                    max_epochs: 0.0,
                    ..d.clone()
                };
                serde_json::to_string(&(&self.model, &t, &self.spike, &d))
            }
        }
        .expect("config serializes");
        // The data-parallel degree multiplies the global batch; dp 1 leaves earlier hashes
        // as they were. How many ranks run it (and the ZeRO stage) changes no number.
        let dp = self.parallel().dp;
        let json = if dp == 1 {
            json
        } else {
            format!("{json}|dp={dp}")
        };
        hex::encode(Sha256::digest(json.as_bytes()))
    }

    /// Tokens one data-parallel replica of the planned layout consumes per optimizer step.
    pub fn tokens_per_replica_step(&self) -> usize {
        self.train.micro_batch * self.train.grad_accum * self.model.seq_len
    }

    /// Micro-batches per optimizer step over all replicas (`grad_accum × parallel.dp`).
    pub fn global_micro_batches(&self) -> usize {
        self.train.grad_accum * self.parallel().dp
    }

    /// Tokens consumed by one optimizer step over all data-parallel replicas.
    pub fn tokens_per_step(&self) -> usize {
        self.tokens_per_replica_step() * self.parallel().dp
    }

    /// The `[parallel]` layout (one process when absent).
    pub fn parallel(&self) -> ParallelConfig {
        self.parallel.clone().unwrap_or_default()
    }
}

/// The first integer in `value` past i64's range, and its path (`train.seed`).
fn past_i64(value: &serde_json::Value, path: String) -> Option<(String, u64)> {
    use serde_json::Value;
    let child = |key: &str| match path.is_empty() {
        true => key.to_string(),
        false => format!("{path}.{key}"),
    };
    match value {
        Value::Number(n) => n
            .as_u64()
            .filter(|&n| n > i64::MAX as u64)
            .map(|n| (path, n)),
        Value::Object(m) => m.iter().find_map(|(k, v)| past_i64(v, child(k))),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| past_i64(v, format!("{path}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"
name = "t"
[model]
vocab_size = 50257
n_layer = 2
d_model = 64
n_head = 4
n_kv_head = 2
d_ff = 128
seq_len = 32
[train]
micro_batch = 2
total_steps = 10
warmup_steps = 2
peak_lr = 1e-3
min_lr = 1e-4
"#;

    #[test]
    fn a_toml_mistake_names_its_line_in_one_line() {
        let wrong_type = TINY.replace("micro_batch = 2", "micro_batch = \"2\"");
        let e = LabConfig::from_toml(&wrong_type).unwrap_err().to_string();
        assert!(
            e.starts_with("line 12 `micro_batch = \"2\"`: invalid type: string"),
            "{e}"
        );
        let missing = TINY.replace("seq_len = 32\n", "");
        let e = LabConfig::from_toml(&missing).unwrap_err().to_string();
        assert!(
            e.starts_with("line 3 `[model]`: missing field `seq_len`"),
            "{e}"
        );
        let unclosed = TINY.replace("[train]", "[train");
        let e = LabConfig::from_toml(&unclosed).unwrap_err().to_string();
        assert!(e.starts_with("line 11 `[train`:"), "{e}");
        for e in [wrong_type, missing, unclosed] {
            let e = LabConfig::from_toml(&e).unwrap_err().to_string();
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn parses_minimal_config_with_defaults() {
        let c = LabConfig::from_toml(TINY).unwrap();
        assert_eq!(c.train.seed, 42);
        assert_eq!(c.train.grad_accum, 1);
        assert_eq!(c.model.head_dim(), 16);
        assert_eq!(c.tokens_per_step(), 64);
    }

    #[test]
    fn hash_ignores_formatting_but_not_values() {
        let a = LabConfig::from_toml(TINY).unwrap();
        let b =
            LabConfig::from_toml(&format!("# a comment\n{}", TINY.replace(" = ", "="))).unwrap();
        assert_eq!(a.sha256(), b.sha256());
        let c = LabConfig::from_toml(&TINY.replace("seq_len = 32", "seq_len = 64")).unwrap();
        assert_ne!(a.sha256(), c.sha256());
        assert_ne!(a.training_sha256(), c.training_sha256());
        // Cadence changes the full hash but not the training hash that resume checks.
        let d =
            LabConfig::from_toml(&TINY.replace("min_lr = 1e-4", "min_lr = 1e-4\nlog_every = 3"))
                .unwrap();
        assert_ne!(a.sha256(), d.sha256());
        assert_eq!(a.training_sha256(), d.training_sha256());
        // Freezing is part of the recipe; absent, it leaves every existing hash as it was.
        let f = LabConfig::from_toml(&TINY.replace(
            "min_lr = 1e-4",
            "min_lr = 1e-4\nfreeze_non_embedding_steps = 0",
        ))
        .unwrap();
        assert_eq!(a.sha256(), f.sha256());
        let g = LabConfig::from_toml(&TINY.replace(
            "min_lr = 1e-4",
            "min_lr = 1e-4\nfreeze_non_embedding_steps = 3",
        ))
        .unwrap();
        assert_ne!(a.training_sha256(), g.training_sha256());
    }

    fn err(text: &str) -> String {
        format!("{:#}", LabConfig::from_toml(text).unwrap_err())
    }

    #[test]
    fn errors_name_the_bad_field() {
        let e = err(&TINY.replace("n_kv_head = 2", "n_kv_head = 3"));
        assert!(
            e.contains("model.n_head") && e.contains("model.n_kv_head"),
            "{e}"
        );
        let e = err(&TINY.replace("d_model = 64", "d_model = 66"));
        assert!(e.contains("model.d_model"), "{e}");
        let e = err(&TINY.replace("warmup_steps = 2", "warmup_steps = 20"));
        assert!(e.contains("train.warmup_steps"), "{e}");
        let e = err(&TINY.replace("d_ff = 128", "d_ff = 128\nd_fff = 1"));
        assert!(e.contains("d_fff"), "{e}");
        let e = err(&TINY.replace(
            "min_lr = 1e-4",
            "min_lr = 1e-4\nfreeze_non_embedding_steps = 11",
        ));
        assert!(e.contains("train.freeze_non_embedding_steps (11)"), "{e}");
        let e = err(&TINY.replace("min_lr = 1e-4", "min_lr = 1e-2"));
        assert!(e.contains("train.min_lr"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[cfg(test)]
mod presets {
    use super::*;

    fn preset(name: &str) -> LabConfig {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs")
            .join(name);
        LabConfig::load(&path).unwrap()
    }

    #[test]
    fn every_preset_loads_and_x1_is_the_recipe() {
        let x1 = preset("x1-50m-a100.toml");
        assert_eq!(x1.tokens_per_step(), 512 * 1024);
        assert_eq!(x1.model.head_dim(), 64);
        assert_eq!(x1.model.param_count().total(), 127_539_456);
        assert_eq!(x1.train.precision, Precision::Bf16);
        let budget = x1.budget.as_ref().expect("x1 carries the course budget");
        assert_eq!((budget.cap_usd, budget.alert_usd), (35.0, Some(30.0)));
        assert_eq!(budget.max_price_usd_per_hr, Some(1.40));
        assert_eq!(preset("tiny-cpu.toml").model.d_model, 128);
        assert_eq!(
            preset("med-7b-256xa100.toml").model.param_count().total(),
            6_195_253_248
        );
        assert!(preset("medgemma-27b-320xh200.toml").model.tie_embeddings);
    }
}
