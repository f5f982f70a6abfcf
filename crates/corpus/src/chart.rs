//! The fertility bar chart (PNG), drawn by lab-plot: one group per document type (and overall,
//! and the term list), one bar per tokenizer, height = tokens per word.

use std::path::Path;

use anyhow::Result;
use lab_plot::{grouped_bars_png, BarGroup};

use crate::fertility::FertilityReport;

/// Writes the chart atomically.
pub fn fertility_chart(report: &FertilityReport, path: &Path) -> Result<()> {
    let n_tok = report.tokenizers.len();
    let groups: Vec<BarGroup> = report
        .rows
        .iter()
        .chain(&report.terms)
        .map(|r| BarGroup {
            label: r.doc_type.clone(),
            values: (0..n_tok).map(|i| r.fertility(i)).collect(),
        })
        .collect();
    let names: Vec<String> = report
        .tokenizers
        .iter()
        .map(|name| {
            Path::new(name)
                .file_name()
                .map_or(name.clone(), |n| n.to_string_lossy().into_owned())
        })
        .collect();
    grouped_bars_png(
        path,
        "Tokenizer fertility (tokens per word)",
        "tokens / word",
        &names,
        &groups,
    )
}
