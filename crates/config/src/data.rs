//! `[data]`: the mixture of sources a run draws from, or a curriculum of mixtures.
//!
//! ```toml
//! [data]
//! mixture = { pubmed = 0.20, clinical = 0.20, textbooks = 0.10, pharma = 0.075,
//!             trials = 0.05, coding = 0.025, general = 0.35 }
//! max_epochs = 4          # a source repeated more often is a warning
//!
//! # or, instead of `mixture`, stages by training tokens (the last runs to the end):
//! [[data.curriculum]]
//! until_tokens = 2_000_000_000
//! mixture = { textbooks = 1.0 }
//! [[data.curriculum]]
//! mixture = { pubmed = 0.5, general = 0.5 }
//! ```
//!
//! Sources are the document types of the prepared data (`lab data prepare --type-field`).

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Weight per source; the weights sum to 1.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mixture: BTreeMap<String, f64>,
    /// Mixtures in order, each until a count of training tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curriculum: Vec<CurriculumStage>,
    /// More epochs of one source than this is a warning at the start of training.
    #[serde(default = "default_max_epochs")]
    pub max_epochs: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurriculumStage {
    /// This stage ends after this many training tokens; absent on the last stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_tokens: Option<u64>,
    pub mixture: BTreeMap<String, f64>,
}

/// (source, weight) pairs.
pub type Weights = Vec<(String, f64)>;

fn default_max_epochs() -> f64 {
    4.0
}

impl DataConfig {
    pub fn validate(&self) -> Result<()> {
        match (self.mixture.is_empty(), self.curriculum.is_empty()) {
            (true, true) => bail!("[data] needs `mixture` or `curriculum`"),
            (false, false) => bail!(
                "[data] has both `mixture` and `curriculum`: put the mixture in the curriculum's last stage"
            ),
            _ => {}
        }
        if self.max_epochs.is_nan() || self.max_epochs <= 0.0 {
            bail!("data.max_epochs ({}) must be positive", self.max_epochs);
        }
        check_weights("data.mixture", &self.mixture)?;
        let mut last_until = 0;
        for (i, stage) in self.curriculum.iter().enumerate() {
            let name = format!("data.curriculum[{i}].mixture");
            check_weights(&name, &stage.mixture)?;
            let is_last = i + 1 == self.curriculum.len();
            match stage.until_tokens {
                None if !is_last => bail!(
                    "data.curriculum[{i}] needs until_tokens (only the last stage runs to the end)"
                ),
                Some(t) if t <= last_until => bail!(
                    "data.curriculum[{i}].until_tokens ({t}) must be larger than the stage before ({last_until})"
                ),
                Some(t) => last_until = t,
                None => {}
            }
        }
        Ok(())
    }

    /// The mixture as stages: (until tokens, weights by source).
    pub fn stages(&self) -> Vec<(Option<u64>, Weights)> {
        let weights = |m: &BTreeMap<String, f64>| m.iter().map(|(k, v)| (k.clone(), *v)).collect();
        if self.curriculum.is_empty() {
            vec![(None, weights(&self.mixture))]
        } else {
            self.curriculum
                .iter()
                .map(|s| (s.until_tokens, weights(&s.mixture)))
                .collect()
        }
    }
}

fn check_weights(name: &str, weights: &BTreeMap<String, f64>) -> Result<()> {
    if let Some((k, w)) = weights.iter().find(|(_, w)| !w.is_finite() || **w < 0.0) {
        bail!("{name}.{k} = {w}: a weight must be a finite number ≥ 0");
    }
    let sum: f64 = weights.values().sum();
    if !weights.is_empty() && (sum - 1.0).abs() > 1e-6 {
        bail!("{name}: the weights sum to {sum}; they must sum to 1");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DataConfig> {
        let d: DataConfig = toml::from_str(text)?;
        d.validate()?;
        Ok(d)
    }

    #[test]
    fn the_case_study_mixture_and_a_curriculum_parse() {
        let d = parse(
            "mixture = { pubmed = 0.20, clinical = 0.20, textbooks = 0.10, pharma = 0.075, trials = 0.05, coding = 0.025, general = 0.35 }",
        )
        .unwrap();
        assert_eq!(d.stages().len(), 1);
        assert_eq!(d.max_epochs, 4.0);
        let d = parse(
            "[[curriculum]]\nuntil_tokens = 1000\nmixture = { books = 1.0 }\n[[curriculum]]\nmixture = { books = 0.5, web = 0.5 }",
        )
        .unwrap();
        assert_eq!(
            d.stages()[0],
            (Some(1000), vec![("books".to_string(), 1.0)])
        );
    }

    #[test]
    fn bad_mixtures_name_the_field() {
        let e = parse("mixture = { a = 0.5, b = 0.4 }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("data.mixture: the weights sum to 0.9"), "{e}");
        let e = parse("mixture = { a = -0.5, b = 1.5 }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("data.mixture.a = -0.5"), "{e}");
        let e =
            parse("[[curriculum]]\nmixture = { a = 1.0 }\n[[curriculum]]\nmixture = { a = 1.0 }")
                .unwrap_err()
                .to_string();
        assert!(e.contains("data.curriculum[0] needs until_tokens"), "{e}");
        let e = parse("").unwrap_err().to_string();
        assert!(e.contains("needs `mixture` or `curriculum`"), "{e}");
    }
}
