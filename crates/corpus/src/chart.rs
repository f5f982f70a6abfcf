//! The fertility bar chart (PNG). Text is drawn with a bundled font (DejaVu Sans, see
//! assets/DejaVuSans-LICENSE.txt) through plotters' ab_glyph backend, so no system font or
//! fontconfig is needed.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::fertility::FertilityReport;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            panic!("bundled DejaVu Sans is a valid font");
        }
    });
}

const COLORS: [RGBColor; 6] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

/// Grouped bars: one group per document type (and overall, and the term list), one bar per
/// tokenizer, height = tokens per word. Written atomically.
pub fn fertility_chart(report: &FertilityReport, path: &Path) -> Result<()> {
    register();
    let rows: Vec<_> = report.rows.iter().chain(&report.terms).collect();
    let n_tok = report.tokenizers.len();
    let max = rows
        .iter()
        .flat_map(|r| (0..n_tok).map(|i| r.fertility(i)))
        .fold(0.0f64, f64::max)
        * 1.15;
    // plotters writes to a path: draw into a temporary sibling, then persist it atomically.
    let tmp = lab_fsio::temp_sibling(path).with_extension("png");
    let drawn = (|| -> Result<()> {
        let width = (160 + rows.len() * (40 + 28 * n_tok)).max(640) as u32;
        let root = BitMapBackend::new(&tmp, (width, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Tokenizer fertility (tokens per word)", ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..rows.len() as f64, 0.0..max.max(0.1))
            .map_err(|e| anyhow!("{e}"))?;
        let labels: Vec<String> = rows.iter().map(|r| r.doc_type.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(rows.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - i as f64 - 0.5).abs() < 0.01 && i < labels.len() {
                    labels[i].clone()
                } else {
                    String::new()
                }
            })
            .y_desc("tokens / word")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        let bar = 0.8 / n_tok as f64;
        for (t, name) in report.tokenizers.iter().enumerate() {
            let color = COLORS[t % COLORS.len()];
            let label = Path::new(name)
                .file_name()
                .map_or(name.clone(), |n| n.to_string_lossy().into_owned());
            chart
                .draw_series(rows.iter().enumerate().map(|(i, r)| {
                    let x0 = i as f64 + 0.1 + t as f64 * bar;
                    Rectangle::new(
                        [(x0, 0.0), (x0 + bar * 0.92, r.fertility(t))],
                        color.filled(),
                    )
                }))
                .map_err(|e| anyhow!("{e}"))?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        root.present()
            .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
        Ok(())
    })();
    match drawn {
        Ok(()) => lab_fsio::persist(&tmp, path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
