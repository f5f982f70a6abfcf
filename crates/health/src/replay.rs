//! Readings from a file: one [`Sample`] as JSON per line, handed out in order. For fire
//! drills (`lab train --inject-gpu-telemetry FILE`: see the alerts fire without waiting for
//! a GPU to misbehave) and for tests of everything downstream of a probe.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::{DeviceInfo, Probe, Sample};

pub struct ReplayProbe {
    path: PathBuf,
    info: DeviceInfo,
    samples: std::vec::IntoIter<Sample>,
}

impl ReplayProbe {
    /// Reads and checks the whole file up front: a bad line fails here, naming it.
    pub fn open(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read GPU readings {}", path.display()))?;
        let samples = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str::<Sample>(l).with_context(|| {
                    format!(
                        "{} line {}: not a GPU reading (want t_s, util_pct, mem_used_bytes, mem_total_bytes, temp_c)",
                        path.display(),
                        i + 1
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if samples.is_empty() {
            bail!("{} holds no GPU readings", path.display());
        }
        let info = DeviceInfo {
            index: 0,
            name: format!("replay of {}", path.display()),
            memory_bytes: samples[0].mem_total_bytes,
            driver: None,
        };
        Ok(Self {
            path: path.to_path_buf(),
            info,
            samples: samples.into_iter(),
        })
    }
}

impl Probe for ReplayProbe {
    fn describe(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn sample(&mut self) -> Result<Sample> {
        match self.samples.next() {
            Some(s) => Ok(s),
            None => bail!("{}: no more readings", self.path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_file_in_order_then_says_it_ran_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.jsonl");
        let line = |t: f64, u: f64| {
            format!("{{\"t_s\":{t},\"util_pct\":{u},\"mem_used_bytes\":5,\"mem_total_bytes\":80,\"temp_c\":61,\"ecc_uncorrected\":0}}\n")
        };
        std::fs::write(&path, line(0.0, 90.0) + "\n" + &line(60.0, 12.5)).unwrap();
        let mut p = ReplayProbe::open(&path).unwrap();
        assert_eq!(p.describe().memory_bytes, 80);
        let a = p.sample().unwrap();
        let b = p.sample().unwrap();
        assert_eq!((a.t_s, a.util_pct, a.ecc_corrected), (0.0, 90.0, None));
        assert_eq!(
            (b.t_s, b.util_pct, b.ecc_uncorrected),
            (60.0, 12.5, Some(0))
        );
        assert!(p
            .sample()
            .unwrap_err()
            .to_string()
            .contains("no more readings"));
    }

    #[test]
    fn a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.jsonl");
        std::fs::write(&path, "{\"t_s\": 0}\n").unwrap();
        let e = format!("{:#}", ReplayProbe::open(&path).err().unwrap());
        assert!(e.contains("gpu.jsonl line 1: not a GPU reading"), "{e}");
    }
}
