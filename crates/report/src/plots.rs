//! The export's charts: loss (train and val), gradient and weight norms, throughput over
//! wall-clock hours. Spikes and rollbacks are marked.

use std::path::Path;

use anyhow::Result;
use lab_plot::{line_charts_png, Marker, Panel, Series};
use lab_run::MetricsRow;

use crate::run_files::RunFiles;

fn points(rows: &[MetricsRow], f: impl Fn(&MetricsRow) -> Option<f64>) -> Vec<(f64, f64)> {
    rows.iter()
        .filter_map(|r| f(r).map(|v| (r.step as f64, v)))
        .collect()
}

fn markers(files: &RunFiles) -> Vec<Marker> {
    files
        .events
        .iter()
        .filter_map(|e| match e.kind.as_str() {
            "spike_detected" => Some(("spike", e.step)),
            "rollback" => Some(("rollback", e.step)),
            _ => None,
        })
        .map(|(label, step)| Marker {
            x: step as f64,
            label: label.into(),
        })
        .collect()
}

pub fn loss_curve(files: &RunFiles, path: &Path) -> Result<()> {
    let m = &files.metrics;
    let panel = Panel {
        title: "Loss".into(),
        x_label: "step".into(),
        y_label: "cross-entropy (nats/token)".into(),
        series: vec![
            Series {
                name: "train".into(),
                points: points(m, |r| Some(r.loss)),
                dots: false,
            },
            Series {
                name: "validation".into(),
                points: points(m, |r| r.val_loss),
                dots: true,
            },
        ],
        markers: markers(files),
        log_y: false,
        x_range: None,
    };
    line_charts_png(path, 900, &[panel])
}

pub fn gradnorm_curve(files: &RunFiles, path: &Path) -> Result<()> {
    let m = &files.metrics;
    let clip = files.config.as_ref().map_or(0.0, |c| c.train.grad_clip);
    let steps = points(m, |r| Some(r.grad_norm));
    let mut grad = vec![Series {
        name: "gradient norm (before clipping)".into(),
        points: steps.clone(),
        dots: false,
    }];
    if clip > 0.0 && !steps.is_empty() {
        grad.push(Series {
            name: format!("clip threshold {clip}"),
            points: vec![(steps[0].0, clip), (steps[steps.len() - 1].0, clip)],
            dots: false,
        });
    }
    let panels = [
        Panel {
            title: "Global gradient norm".into(),
            x_label: "step".into(),
            y_label: "L2 norm (log scale)".into(),
            series: grad,
            markers: markers(files),
            log_y: true,
            x_range: None,
        },
        Panel {
            title: "Global weight norm".into(),
            x_label: "step".into(),
            y_label: "L2 norm".into(),
            series: vec![Series {
                name: "parameter norm".into(),
                points: points(m, |r| r.param_norm),
                dots: false,
            }],
            markers: Vec::new(),
            log_y: false,
            x_range: None,
        },
    ];
    line_charts_png(path, 900, &panels)
}

pub fn throughput(files: &RunFiles, path: &Path) -> Result<()> {
    let times: Vec<(f64, f64)> = files
        .metrics
        .iter()
        .filter_map(|r| {
            let t = lab_run::clock::parse_utc(r.time_utc.as_deref()?).ok()?;
            Some((t, r.tokens_per_s))
        })
        .collect();
    let t0 = times.first().map_or(0.0, |p| p.0);
    let panel = Panel {
        title: "Training throughput".into(),
        x_label: "wall-clock hours since the first logged step".into(),
        y_label: "tokens / s".into(),
        series: vec![Series {
            name: "tokens/s over each log interval".into(),
            points: times.iter().map(|&(t, v)| ((t - t0) / 3600.0, v)).collect(),
            dots: true,
        }],
        markers: Vec::new(),
        log_y: false,
        x_range: None,
    };
    line_charts_png(path, 900, &[panel])
}
