//! A run folder read whole: its config, metrics (kept and abandoned) and events.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use lab_config::LabConfig;
use lab_run::{Event, MetricsRow};

#[derive(Clone)]
pub struct RunFiles {
    pub dir: PathBuf,
    /// The effective config the run recorded (config.toml), when present.
    pub config: Option<LabConfig>,
    pub metrics: Vec<MetricsRow>,
    /// Rows of steps a rollback undid; `extra["rollback"]` says which rollback.
    pub abandoned: Vec<MetricsRow>,
    pub events: Vec<Event>,
}

impl RunFiles {
    pub fn read(dir: &Path) -> Result<RunFiles> {
        if !dir.join(lab_run::METRICS).exists() && !dir.join(lab_run::EVENTS).exists() {
            bail!(
                "--run {} holds no metrics.jsonl or events.jsonl: pass the folder `lab train --ckpt-dir` wrote",
                dir.display()
            );
        }
        let config = match std::fs::read_to_string(dir.join(lab_run::CONFIG)) {
            Ok(text) => Some(
                LabConfig::from_toml(&text)
                    .with_context(|| format!("{}", dir.join(lab_run::CONFIG).display()))?,
            ),
            Err(_) => None,
        };
        Ok(RunFiles {
            dir: dir.to_path_buf(),
            config,
            metrics: lab_run::read_metrics(&dir.join(lab_run::METRICS))?,
            abandoned: lab_run::read_metrics(&dir.join(lab_run::ABANDONED_METRICS))?,
            events: lab_run::read_events(dir)?,
        })
    }

    pub fn events_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Event> + 'a {
        self.events.iter().filter(move |e| e.kind == kind)
    }
}
