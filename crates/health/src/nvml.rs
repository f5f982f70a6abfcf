//! Readings from NVIDIA's management library, loaded at run time (nvml-wrapper opens
//! libnvidia-ml.so when the probe opens; the build needs no driver).

use std::time::Instant;

use anyhow::{Context, Result};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, Sampling, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::{Device, Nvml};

use crate::{DeviceInfo, NvmlGpu, Probe, Sample};

pub struct NvmlProbe {
    nvml: Nvml,
    info: DeviceInfo,
    started: Instant,
    /// The newest utilisation sample read so far (NVML's microsecond timestamp).
    last_seen_us: Option<u64>,
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
            last_seen_us: None,
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

/// Mean utilisation over NVML's own samples since the previous reading (it samples every 1/6
/// to 1 s), so a reading taken between two steps does not see only the gap; the instantaneous
/// rate where the device keeps no samples.
fn utilization(device: &Device, last_seen_us: &mut Option<u64>) -> Result<f64> {
    let samples = device
        .samples(Sampling::GpuUtilization, *last_seen_us)
        .unwrap_or_default();
    let values: Vec<f64> = samples
        .iter()
        .map(|s| match s.value {
            SampleValue::U32(v) => v as f64,
            SampleValue::U64(v) => v as f64,
            SampleValue::F64(v) => v,
            SampleValue::I64(v) => v as f64,
        })
        .collect();
    if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
        *last_seen_us = Some(newest);
    }
    if values.is_empty() {
        return Ok(device.utilization_rates()?.gpu as f64);
    }
    Ok(values.iter().sum::<f64>() / values.len() as f64)
}

impl Probe for NvmlProbe {
    fn describe(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn sample(&mut self) -> Result<Sample> {
        let t_s = self.started.elapsed().as_secs_f64();
        let index = self.info.index;
        let mut read = || -> Result<Sample> {
            let device = self.nvml.device_by_index(index)?;
            let memory = device.memory_info()?;
            let ecc = |kind| device.total_ecc_errors(kind, EccCounter::Volatile).ok();
            Ok(Sample {
                t_s,
                util_pct: utilization(&device, &mut self.last_seen_us)?,
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
