//! Readings from NVIDIA's management library, loaded at run time (nvml-wrapper opens
//! libnvidia-ml.so when the probe opens; the build needs no driver).

use std::time::Instant;

use anyhow::{Context, Result};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::{Device, Nvml};

use crate::{DeviceInfo, NvmlGpu, Probe, Sample};

pub struct NvmlProbe {
    nvml: Nvml,
    info: DeviceInfo,
    started: Instant,
}

impl NvmlProbe {
    /// The GPU `gpu` names (see [`crate::nvml_gpu`]).
    pub fn open(gpu: &NvmlGpu) -> Result<Self> {
        let nvml = Nvml::init().context(
            "NVML (libnvidia-ml.so) did not load: no NVIDIA driver on this machine, so no GPU health readings",
        )?;
        let index = match gpu {
            NvmlGpu::Index(i) => *i,
            NvmlGpu::Uuid(prefix) => index_of_uuid(&nvml, prefix)?,
        };
        let device = nvml
            .device_by_index(index)
            .with_context(|| format!("NVML has no GPU {index}"))?;
        let info = DeviceInfo {
            index,
            name: device
                .name()
                .unwrap_or_else(|_| "unknown NVIDIA GPU".into()),
            memory_bytes: device.memory_info().map_or(0, |m| m.total),
            driver: nvml.sys_driver_version().ok(),
        };
        Ok(Self {
            nvml,
            info,
            started: Instant::now(),
        })
    }
}

/// NVML's index of the one GPU whose UUID starts with `prefix` (CUDA accepts unique
/// prefixes; a MIG slice's UUID names no whole GPU and is refused). GPUs NVML cannot open
/// (a cgroup hides them) are passed over.
fn index_of_uuid(nvml: &Nvml, prefix: &str) -> Result<u32> {
    let uuid = |i| nvml.device_by_index(i).and_then(|d| d.uuid());
    let found: Vec<u32> = (0..nvml.device_count()?)
        .filter(|&i| uuid(i).is_ok_and(|u| u.starts_with(prefix)))
        .collect();
    match found[..] {
        [i] => Ok(i),
        [] => anyhow::bail!("CUDA_VISIBLE_DEVICES names {prefix}, which is not a whole GPU NVML lists (nvidia-smi -L shows their UUIDs)"),
        _ => anyhow::bail!("CUDA_VISIBLE_DEVICES names {prefix}, a prefix of several GPUs' UUIDs"),
    }
}

/// The utilisation nvidia-smi shows: the share of NVML's last sample period (1/6 to 1 s) in
/// which a kernel ran. The mean of NVML's sample buffer (`nvmlDeviceGetSamples`) read 15 % on
/// an H100 that nvidia-smi showed 100 % busy while x1-50m trained, so it is not used.
fn utilization(device: &Device) -> Result<f64> {
    Ok(device.utilization_rates()?.gpu as f64)
}

impl Probe for NvmlProbe {
    fn describe(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn sample(&mut self) -> Result<Sample> {
        let t_s = self.started.elapsed().as_secs_f64();
        let index = self.info.index;
        let read = || -> Result<Sample> {
            let device = self.nvml.device_by_index(index)?;
            let memory = device.memory_info()?;
            let ecc = |kind| device.total_ecc_errors(kind, EccCounter::Volatile).ok();
            Ok(Sample {
                t_s,
                util_pct: utilization(&device)?,
                mem_used_bytes: memory.used,
                mem_total_bytes: memory.total,
                temp_c: device.temperature(TemperatureSensor::Gpu)?,
                ecc_corrected: ecc(MemoryError::Corrected),
                ecc_uncorrected: ecc(MemoryError::Uncorrected),
            })
        };
        read().with_context(|| format!("reading GPU {index} through NVML"))
    }
}
