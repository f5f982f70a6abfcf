//! Line charts (one or more panels stacked vertically, optional log scale, vertical markers)
//! and grouped bar charts, as PNG files.

use std::ops::Range;
use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, bail, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            panic!("bundled DejaVu Sans is a valid font");
        }
    });
}

pub const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(90, 90, 90),
];

/// One named line.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Draw a dot at every point as well (for sparse series such as validation loss).
    pub dots: bool,
}

/// A vertical line at `x` with a short label (a spike, a rollback, a checkpoint).
#[derive(Debug, Clone)]
pub struct Marker {
    pub x: f64,
    pub label: String,
}

/// One chart: title, axis labels with units, lines, markers.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
    pub log_y: bool,
    /// Fixed x range; by default the data's.
    pub x_range: Option<(f64, f64)>,
}

/// Bars of one group (one per series), e.g. the fertility of each tokenizer on one type.
#[derive(Debug, Clone)]
pub struct BarGroup {
    pub label: String,
    pub values: Vec<f64>,
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("{e}")
}

/// Draws into a temporary sibling of `path`, then persists it atomically; nothing is left
/// behind when drawing fails.
fn write_png(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<BitMapBackend, Shift>) -> Result<()>,
) -> Result<()> {
    register();
    let tmp = lab_fsio::temp_sibling(path).with_extension("png");
    let drawn = (|| -> Result<()> {
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present()
            .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))
    })();
    match drawn {
        Ok(()) => lab_fsio::persist(&tmp, path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Panels stacked vertically in one PNG, `width` pixels wide, 360 pixels per panel.
pub fn line_charts_png(path: &Path, width: u32, panels: &[Panel]) -> Result<()> {
    if panels.is_empty() {
        bail!("no chart to draw for {}", path.display());
    }
    let height = 360 * panels.len() as u32;
    write_png(path, (width, height), |root| {
        let areas = root.split_evenly((panels.len(), 1));
        for (panel, area) in panels.iter().zip(&areas) {
            draw_panel(area, panel)?;
        }
        Ok(())
    })
}

/// Finite points (and, on a log axis, positive ones) of every series.
fn visible(panel: &Panel) -> Vec<Series> {
    panel
        .series
        .iter()
        .map(|s| Series {
            points: s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite() && (!panel.log_y || *y > 0.0))
                .collect(),
            ..s.clone()
        })
        .collect()
}

fn padded(lo: f64, hi: f64, log: bool) -> Range<f64> {
    if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
        return if log { 0.1..1.0 } else { 0.0..1.0 };
    }
    if log {
        let (lo, hi) = (lo.max(f64::MIN_POSITIVE), hi.max(lo * 1.01));
        return lo / 1.2..hi * 1.2;
    }
    let span = (hi - lo).max(hi.abs() * 1e-3).max(1e-12);
    lo - span * 0.05..hi + span * 0.05
}

fn draw_panel(area: &DrawingArea<BitMapBackend, Shift>, panel: &Panel) -> Result<()> {
    let series = visible(panel);
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    let x = match panel.x_range {
        Some((a, b)) => a..b.max(a + 1e-9),
        None => padded(x0, x1, false),
    };
    let y = padded(y0, y1, panel.log_y);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&panel.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70);
    if panel.log_y {
        let chart = builder.build_cartesian_2d(x, y.log_scale()).map_err(err)?;
        finish(chart, panel, &series)
    } else {
        let chart = builder.build_cartesian_2d(x, y).map_err(err)?;
        finish(chart, panel, &series)
    }
}

fn finish<'a, Y>(
    mut chart: ChartContext<
        'a,
        BitMapBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
    panel: &Panel,
    series: &[Series],
) -> Result<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let whole = |x: &f64| {
        if x.fract() == 0.0 || x.abs() >= 10.0 {
            format!("{x:.0}")
        } else {
            format!("{x:.2}")
        }
    };
    let tidy = |y: &f64| {
        if y.abs() >= 100.0 {
            format!("{y:.0}")
        } else if y.abs() >= 1.0 {
            format!("{y:.1}")
        } else {
            format!("{y:.3}")
        }
    };
    chart
        .configure_mesh()
        .x_label_formatter(&whole)
        .y_label_formatter(&tidy)
        .x_desc(&panel.x_label)
        .y_desc(&panel.y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let (y_lo, y_hi) = {
        let r = chart.y_range();
        (r.start, r.end)
    };
    for m in &panel.markers {
        let grey = RGBColor(120, 120, 120);
        chart
            .draw_series(LineSeries::new(
                [(m.x, y_lo), (m.x, y_hi)],
                grey.stroke_width(1),
            ))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                m.label.clone(),
                (m.x, y_hi),
                ("sans-serif", 13).into_font().color(&grey),
            )))
            .map_err(err)?;
    }
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        if s.dots {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
    }
    if series.iter().any(|s| !s.name.is_empty()) {
        draw_legend(&mut chart)?;
    }
    Ok(())
}

/// The legend, upper right on a light box, as every chart here draws it.
fn draw_legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)
}

/// Grouped bars: one group per label, one bar per series name.
pub fn grouped_bars_png(
    path: &Path,
    title: &str,
    y_label: &str,
    series_names: &[String],
    groups: &[BarGroup],
) -> Result<()> {
    let n = series_names.len().max(1);
    let max = groups
        .iter()
        .flat_map(|g| g.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.15;
    let width = (160 + groups.len() * (40 + 28 * n)).max(640) as u32;
    write_png(path, (width, 520), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..groups.len() as f64, 0.0..max.max(0.1))
            .map_err(err)?;
        let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - i as f64 - 0.5).abs() < 0.01 && i < labels.len() {
                    labels[i].clone()
                } else {
                    String::new()
                }
            })
            .y_desc(y_label)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        let bar = 0.8 / n as f64;
        for (t, name) in series_names.iter().enumerate() {
            let color = COLORS[t % COLORS.len()];
            chart
                .draw_series(groups.iter().enumerate().map(|(i, g)| {
                    let x0 = i as f64 + 0.1 + t as f64 * bar;
                    let v = g.values.get(t).copied().unwrap_or(0.0);
                    Rectangle::new([(x0, 0.0), (x0 + bar * 0.92, v)], color.filled())
                }))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
        }
        draw_legend(&mut chart)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct colours and non-white pixels: the PNG is a drawn chart, not a blank canvas.
    pub fn ink(path: &Path) -> (u32, u32, usize, usize) {
        let img = image::open(path).unwrap().to_rgb8();
        let mut colors = std::collections::HashSet::new();
        let mut inked = 0;
        for p in img.pixels() {
            colors.insert(p.0);
            if p.0 != [255, 255, 255] {
                inked += 1;
            }
        }
        (img.width(), img.height(), colors.len(), inked)
    }

    #[test]
    fn line_charts_draw_every_panel_with_log_scale_and_markers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loss.png");
        let loss = Series {
            name: "train".into(),
            points: (1..100)
                .map(|s| (s as f64, 10.0 / (s as f64).sqrt()))
                .collect(),
            dots: false,
        };
        let panels = [
            Panel {
                title: "loss".into(),
                x_label: "step".into(),
                y_label: "nats/token".into(),
                series: vec![loss.clone()],
                markers: vec![Marker {
                    x: 50.0,
                    label: "spike".into(),
                }],
                log_y: true,
                x_range: None,
            },
            Panel {
                title: "grad norm".into(),
                x_label: "step".into(),
                y_label: "L2".into(),
                series: vec![Series {
                    name: "".into(),
                    points: vec![(1.0, f64::NAN)],
                    dots: true,
                }],
                ..Default::default()
            },
        ];
        line_charts_png(&p, 800, &panels).unwrap();
        let (w, h, colors, inked) = ink(&p);
        assert_eq!((w, h), (800, 720));
        assert!(
            colors > 4 && inked > 5_000,
            "{colors} colours, {inked} inked pixels"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp left"
        );
    }

    #[test]
    fn grouped_bars_and_a_failed_draw_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bars.png");
        let groups = vec![
            BarGroup {
                label: "GARD".into(),
                values: vec![1.4, 1.2],
            },
            BarGroup {
                label: "GHR".into(),
                values: vec![1.3, 1.1],
            },
        ];
        grouped_bars_png(
            &p,
            "fertility",
            "tokens / word",
            &["gpt2".into(), "med".into()],
            &groups,
        )
        .unwrap();
        assert!(ink(&p).3 > 2_000);
        let bad = dir.path().join("missing/dir/x.png");
        assert!(line_charts_png(&bad, 400, &[Panel::default()]).is_err());
        assert!(!dir.path().join("missing").exists());
    }
}
