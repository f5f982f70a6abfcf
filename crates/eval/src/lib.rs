//! Judging a model between checkpoints and after: perplexity overall and by document type,
//! multiple-choice probes (the HellaSwag / lm-eval recipe), a memorization probe, and the
//! projection of a loss curve to its end.

pub mod mc;
pub mod memorize;
pub mod perplexity;
pub mod project;

pub use mc::{McItem, McOptions, McReport};
pub use perplexity::{Perplexity, TypeLoss};
pub use project::{fit_power_law, PowerLaw, Projection};
