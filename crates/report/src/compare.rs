//! Several runs' loss curves side by side (`lab compare`): one PNG with the training and the
//! validation loss of each run by step, a CSV of the same points, and a table of the steps
//! every run logged.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use lab_plot::{line_charts_png, Panel, Series};
use lab_run::MetricsRow;

use crate::run_files::RunFiles;

/// One run's metrics under the label it is compared by.
pub struct Curve {
    pub label: String,
    pub rows: Vec<MetricsRow>,
}

/// Reads each `(label, run folder)`.
pub fn read_curves(runs: &[(String, PathBuf)]) -> Result<Vec<Curve>> {
    if runs.is_empty() {
        bail!("nothing to compare: pass --run LABEL=DIR at least once");
    }
    for (i, (label, _)) in runs.iter().enumerate() {
        if runs[..i].iter().any(|(l, _)| l == label) {
            lab_config::bail_usage!(
                "two runs are labelled {label:?}: give each its own --run LABEL=DIR"
            );
        }
    }
    runs.iter()
        .map(|(label, dir)| {
            let files = RunFiles::read(dir)?;
            if files.metrics.is_empty() {
                bail!(
                    "{} holds no metrics.jsonl rows: nothing to draw (a run logs them as it trains; an export keeps them as metrics.csv)",
                    dir.display()
                );
            }
            Ok(Curve {
                label: label.clone(),
                rows: files.metrics,
            })
        })
        .collect()
}

fn series(c: &Curve, val: bool) -> Series {
    let points = c
        .rows
        .iter()
        .filter_map(|r| {
            let y = if val { r.val_loss } else { Some(r.loss) };
            y.map(|y| (r.step as f64, y))
        })
        .collect();
    Series {
        name: c.label.clone(),
        points,
        dots: val,
    }
}

/// Two panels: training loss, validation loss; a line per run.
pub fn write_png(curves: &[Curve], path: &Path) -> Result<()> {
    let panel = |title: &str, val: bool| Panel {
        title: title.into(),
        x_label: "step".into(),
        y_label: "cross-entropy (nats/token)".into(),
        series: curves.iter().map(|c| series(c, val)).collect(),
        ..Default::default()
    };
    line_charts_png(
        path,
        900,
        &[
            panel("Training loss", false),
            panel("Validation loss", true),
        ],
    )
}

/// `run,step,loss,val_loss` (val_loss empty where the step was not evaluated).
pub fn csv(curves: &[Curve]) -> String {
    let mut out = String::from("run,step,loss,val_loss\n");
    for c in curves {
        for r in &c.rows {
            let val = r.val_loss.map(|v| v.to_string()).unwrap_or_default();
            let _ = writeln!(out, "{},{},{},{val}", csv_field(&c.label), r.step, r.loss);
        }
    }
    out
}

/// A label as one CSV field: quoted (quotes doubled) where it holds a comma, quote or newline.
fn csv_field(s: &str) -> String {
    match s.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", s.replace('"', "\"\"")),
        false => s.to_string(),
    }
}

/// A text table of the steps every run logged: each run's loss (and validation loss).
pub fn table(curves: &[Curve]) -> String {
    let mut out = format!("{:>6}", "step");
    for c in curves {
        let _ = write!(out, " | {:>12} {:>10}", format!("{} loss", c.label), "val");
    }
    out.push('\n');
    let steps = curves[0].rows.iter().map(|r| r.step);
    for step in steps.filter(|s| curves.iter().all(|c| row(c, *s).is_some())) {
        let _ = write!(out, "{step:>6}");
        for c in curves {
            let r = row(c, step).expect("filtered above");
            let val = r.val_loss.map_or("–".into(), |v| format!("{v:.4}"));
            let _ = write!(out, " | {:>12.4} {val:>10}", r.loss);
        }
        out.push('\n');
    }
    out
}

fn row(c: &Curve, step: u64) -> Option<&MetricsRow> {
    c.rows.iter().find(|r| r.step == step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(label: &str, pts: &[(u64, f64, Option<f64>)]) -> Curve {
        Curve {
            label: label.into(),
            rows: pts
                .iter()
                .map(|&(step, loss, val_loss)| MetricsRow {
                    step,
                    loss,
                    val_loss,
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn table_and_csv_hold_every_runs_points() {
        let a = curve("swap", &[(10, 5.0, None), (20, 4.0, Some(4.5))]);
        let b = curve(
            "scratch",
            &[(10, 8.0, None), (15, 7.5, None), (20, 7.0, Some(7.2))],
        );
        let curves = [a, b];
        let t = table(&curves);
        assert_eq!(
            t.lines().count(),
            3,
            "header and the shared steps 10, 20: {t}"
        );
        assert!(t.contains("4.0000") && t.contains("7.2000"), "{t}");
        let c = csv(&curves);
        assert!(c.starts_with("run,step,loss,val_loss\nswap,10,5,\n"), "{c}");
        assert!(c.contains("scratch,20,7,7.2\n"), "{c}");
        let quoted = csv(&[curve("lr 3e-4, \"warm\"", &[(10, 5.0, None)])]);
        assert!(
            quoted.ends_with("\n\"lr 3e-4, \"\"warm\"\"\",10,5,\n"),
            "{quoted}"
        );
        let twice = [
            ("a".to_string(), PathBuf::from("x")),
            ("a".to_string(), PathBuf::from("y")),
        ];
        let e = read_curves(&twice).err().expect("refused");
        assert!(
            format!("{e}").contains("two runs are labelled \"a\""),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        write_png(&curves, &dir.path().join("c.png")).unwrap();
        assert!(dir.path().join("c.png").metadata().unwrap().len() > 1000);
    }
}
