//! `hardware.json`: the machine a run trained on (CPU model, cores, memory, host, GPUs) and the
//! job it was part of (world size, nodes, launcher, collectives engine), written by the trainer
//! when it starts so an export made elsewhere still says where the run ran.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub const HARDWARE: &str = "hardware.json";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub name: String,
    pub memory_mib: Option<u64>,
    pub driver: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    pub hostname: String,
    pub cpu_model: String,
    pub cpu_cores: usize,
    pub memory_gib: f64,
    /// What `nvidia-smi` lists (empty without NVIDIA GPUs).
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// The compute backend the run used (`cpu`, `cuda`, `wgpu`).
    #[serde(default)]
    pub backend: String,
    /// What MFU is measured against: the hardware table's device and its peak FLOP/s at the
    /// run's precision (absent in runs from before they were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu_peak: Option<MfuPeak>,
    /// The job of the last launch (absent in runs from before it was recorded). The machine
    /// fields above describe rank 0's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Cluster>,
}

/// The data-parallel job a run trained in: one process is a job of one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    pub world_size: usize,
    /// Distinct hosts the ranks ran on.
    pub nodes: usize,
    /// Each rank's host, in rank order.
    pub rank_hosts: Vec<String>,
    /// `mpirun`, `torchrun`, `srun` or `a single process`.
    pub launcher: String,
    /// The collectives engine: `single`, `mpi` or `nccl`.
    pub engine: String,
    /// ZeRO stage the trainer ran (0 or 1).
    pub zero: u8,
    /// Micro-batches each rank computes per optimizer step.
    pub grad_accum_per_rank: usize,
}

impl Cluster {
    /// "2 ranks on 1 node (mpirun, mpi, ZeRO-1)".
    pub fn summary(&self) -> String {
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        format!(
            "{} on {} ({}, {}, ZeRO-{})",
            plural(self.world_size, "rank"),
            plural(self.nodes, "node"),
            self.launcher,
            self.engine,
            self.zero
        )
    }
}

/// This machine's host name (empty when Linux does not say).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The peak a run's MFU divides by, and the table entry it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MfuPeak {
    /// The hardware table's name (`h100-sxm`, `cpu`, …).
    pub device: String,
    pub peak_bf16_flops: f64,
    pub peak_fp32_flops: f64,
    /// Absent from the hardware.json of runs before lab knew TF32 (read as 0).
    #[serde(default)]
    pub peak_tf32_flops: f64,
    /// The precision the run's products compute in (`bf16`, `fp32`, or `tf32` for fp32 on
    /// CUDA), and the peak MFU uses (the table's for that precision, or the config's
    /// `hardware.peak_flops`).
    pub precision: String,
    pub flops: f64,
}

impl Hardware {
    /// This machine, as far as Linux and `nvidia-smi` tell.
    pub fn detect(backend: &str) -> Hardware {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(
                || std::env::consts::ARCH.to_string(),
                |m| m.trim().to_string(),
            );
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Hardware {
            hostname: hostname(),
            cpu_model,
            cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: (mem_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
            gpus: nvidia_gpus(),
            backend: backend.to_string(),
            mfu_peak: None,
            cluster: None,
        }
    }

    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)? + "\n";
        lab_fsio::write_atomic(&run_dir.join(HARDWARE), text.as_bytes())
    }

    pub fn read(run_dir: &Path) -> Result<Hardware> {
        let path = run_dir.join(HARDWARE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
    }

    /// One line for people: "2 × Intel Xeon … (24 GiB), no GPU".
    pub fn summary(&self) -> String {
        let gpus = match self.gpus.first() {
            None => "no GPU".to_string(),
            Some(g) => format!("{} × {}", self.gpus.len(), g.name),
        };
        let job = match &self.cluster {
            Some(c) if c.world_size > 1 => format!("; {}", c.summary()),
            _ => String::new(),
        };
        format!(
            "{} cores of {} ({} GiB RAM), {gpus}, backend {}{job}",
            self.cpu_cores, self.cpu_model, self.memory_gib, self.backend
        )
    }
}

/// `nvidia-smi --query-gpu=name,memory.total,driver_version` (nothing when it is absent).
fn nvidia_gpus() -> Vec<Gpu> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader,nounits",
        ])
        .output();
    let Some(out) = out.ok().filter(|o| o.status.success()) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            Some(Gpu {
                name: f.first()?.to_string(),
                memory_mib: f.get(1).and_then(|m| m.parse().ok()),
                driver: f.get(2).map(|d| d.to_string()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_is_described_and_round_trips() {
        let h = Hardware::detect("cpu");
        assert!(h.cpu_cores >= 1 && !h.cpu_model.is_empty());
        let dir = tempfile::tempdir().unwrap();
        h.write(dir.path()).unwrap();
        assert_eq!(Hardware::read(dir.path()).unwrap(), h);
        assert!(h.summary().contains("backend cpu"));
    }

    #[test]
    fn a_job_of_several_ranks_is_summarised_and_round_trips() {
        let mut h = Hardware::detect("cuda");
        h.cluster = Some(Cluster {
            world_size: 16,
            nodes: 2,
            rank_hosts: [vec!["gpu001".to_string(); 8], vec!["gpu002".to_string(); 8]].concat(),
            launcher: "srun".into(),
            engine: "nccl".into(),
            zero: 1,
            grad_accum_per_rank: 2,
        });
        assert!(
            h.summary()
                .ends_with("; 16 ranks on 2 nodes (srun, nccl, ZeRO-1)"),
            "{}",
            h.summary()
        );
        let dir = tempfile::tempdir().unwrap();
        h.write(dir.path()).unwrap();
        assert_eq!(Hardware::read(dir.path()).unwrap(), h);
        // hardware.json from before the field still reads.
        let old = r#"{"hostname":"h","cpu_model":"m","cpu_cores":2,"memory_gib":1.0}"#;
        assert_eq!(serde_json::from_str::<Hardware>(old).unwrap().cluster, None);
    }
}
