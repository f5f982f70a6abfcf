//! The device a run's MFU is measured against: the one it computes on, not the one its config
//! was written for. The x1-50m recipe says `a100-80gb`; trained on an H100 its MFU against the
//! A100's 312 TFLOP/s would read 3.2× too high.

use lab_config::{hardware, LabConfig, Precision};
use lab_run::hardware::MfuPeak;

use crate::BackendKind;

/// What the run found it computes on: the GPU's name and memory as its driver reports them
/// (None on the CPU, or where NVML cannot be read).
pub struct Found<'a> {
    pub backend: BackendKind,
    pub gpu: Option<(&'a str, u64)>,
}

/// Points `cfg.hardware.device` at the table's entry for the device `found`, and returns the
/// warning to print when that differs from the config's. A `hardware.peak_flops` the config
/// sets wins: its writer knows the machine. The device is not part of the training recipe
/// (`training_sha256`), so a run may resume on another GPU and measure against that one.
/// On CUDA an fp32 run's products compute as TF32 (cubecl's matmul on tensor cores), so its
/// MFU is against the TF32 peak.
pub fn measure_on(cfg: &mut LabConfig, found: Found) -> Option<String> {
    cfg.hardware.tf32_products =
        found.backend == BackendKind::Cuda && cfg.train.precision == Precision::Fp32;
    if cfg.hardware.peak_flops.is_some() {
        return None;
    }
    let written = cfg.hardware.device.clone();
    let (spec, what) = match (found.backend, found.gpu) {
        (BackendKind::Cpu, _) => (hardware::lookup("cpu")?, "this run computes on the CPU".to_string()),
        (BackendKind::Cuda, Some((name, memory))) => match hardware::from_gpu_name(name, memory) {
            Some(spec) => (spec, format!("this GPU is an {name}")),
            None => {
                return Some(format!(
                    "this GPU ({name}) is not in lab's hardware table: MFU is against hardware.device = \"{written}\"'s peak; set hardware.peak_flops to this GPU's"
                ))
            }
        },
        // No reading of the GPU (NVML missing), or WebGPU's unnamed device: the config's.
        _ => return None,
    };
    if spec.name == written {
        return None;
    }
    cfg.hardware.device = spec.name.to_string();
    let peak = cfg.hardware.peak_flops(cfg.train.precision);
    Some(format!(
        "hardware.device = \"{written}\" but {what}: MFU is against {}'s {} peak, {}",
        spec.name,
        cfg.hardware.products_in(cfg.train.precision).as_str(),
        format_flops(peak)
    ))
}

/// What the run's MFU is measured against, for hardware.json and the `gpu` event.
pub fn mfu_peak(cfg: &LabConfig) -> MfuPeak {
    let spec = cfg.hardware.spec();
    MfuPeak {
        device: spec.name.to_string(),
        peak_bf16_flops: spec.peak_bf16_flops,
        peak_fp32_flops: spec.peak_fp32_flops,
        peak_tf32_flops: spec.peak_tf32_flops,
        precision: cfg
            .hardware
            .products_in(cfg.train.precision)
            .as_str()
            .to_string(),
        flops: cfg.hardware.peak_flops(cfg.train.precision),
    }
}

/// FLOP/s as people read them: `989 TFLOP/s`, `160 GFLOP/s`.
pub fn format_flops(x: f64) -> String {
    if x >= 1e12 {
        format!("{:.0} TFLOP/s", x / 1e12)
    } else {
        format!("{:.0} GFLOP/s", x / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x1() -> LabConfig {
        LabConfig::from_toml(include_str!("../../../configs/x1-50m-a100.toml")).unwrap()
    }

    fn cuda(name: &str) -> Found<'_> {
        Found {
            backend: BackendKind::Cuda,
            gpu: Some((name, 80 << 30)),
        }
    }

    /// A device with no GPU name to go by (the CPU, or NVML missing).
    fn unnamed(backend: BackendKind) -> Found<'static> {
        Found { backend, gpu: None }
    }

    /// The A100 recipe on an H100 measures against the H100's bf16 peak, and says so.
    #[test]
    fn an_a100_config_on_an_h100_measures_against_the_h100() {
        let mut cfg = x1();
        let a100 = cfg.hardware.peak_flops(cfg.train.precision);
        let note = measure_on(&mut cfg, cuda("NVIDIA H100 80GB HBM3")).unwrap();
        assert_eq!(cfg.hardware.device, "h100-sxm");
        assert_eq!(cfg.hardware.peak_flops(cfg.train.precision), 989e12);
        assert_eq!(a100, 312e12);
        assert_eq!(
            note,
            "hardware.device = \"a100-80gb\" but this GPU is an NVIDIA H100 80GB HBM3: MFU is against h100-sxm's bf16 peak, 989 TFLOP/s"
        );
        // The recipe a resume checks is untouched.
        assert_eq!(cfg.training_sha256(), x1().training_sha256());
    }

    #[test]
    fn the_gpu_the_config_names_changes_nothing() {
        let mut cfg = x1();
        assert_eq!(measure_on(&mut cfg, cuda("NVIDIA A100-SXM4-80GB")), None);
        assert_eq!(cfg, x1());
    }

    #[test]
    fn a_gpu_the_table_lacks_keeps_the_config_and_says_how_to_fix_it() {
        let mut cfg = x1();
        let note = measure_on(&mut cfg, cuda("NVIDIA L40S")).unwrap();
        assert_eq!(cfg, x1());
        assert!(
            note.contains("NVIDIA L40S") && note.contains("hardware.peak_flops"),
            "{note}"
        );
    }

    #[test]
    fn a_gpu_config_on_the_cpu_measures_against_the_cpu() {
        let mut cfg = x1();
        let note = measure_on(&mut cfg, unnamed(BackendKind::Cpu)).unwrap();
        assert_eq!(cfg.hardware.device, "cpu");
        assert!(
            note.ends_with("MFU is against cpu's bf16 peak, 160 GFLOP/s"),
            "{note}"
        );
    }

    /// An fp32 run on CUDA multiplies in TF32 (cubecl's matmul on tensor cores): its MFU is
    /// against the TF32 peak, not the CUDA cores' fp32 one, which it could exceed.
    #[test]
    fn fp32_on_cuda_measures_against_the_tf32_peak() {
        let mut cfg = x1();
        cfg.train.precision = Precision::Fp32;
        let note = measure_on(&mut cfg, cuda("NVIDIA H100 80GB HBM3")).unwrap();
        assert_eq!(cfg.hardware.peak_flops(Precision::Fp32), 494.5e12);
        assert!(
            note.ends_with("MFU is against h100-sxm's tf32 peak, 494 TFLOP/s"),
            "{note}"
        );
        let peak = mfu_peak(&cfg);
        assert_eq!((peak.precision.as_str(), peak.flops), ("tf32", 494.5e12));
        // The recipe a resume checks is untouched, and a config file never holds the flag.
        let mut fp32 = x1();
        fp32.train.precision = Precision::Fp32;
        assert_eq!(cfg.training_sha256(), fp32.training_sha256());
        assert!(!cfg.to_toml().contains("tf32"));
    }

    /// fp32 elsewhere (the CPU, WebGPU) multiplies in fp32, and bf16 is bf16 on CUDA too.
    #[test]
    fn other_backends_and_bf16_keep_their_peaks() {
        let mut fp32 = x1();
        fp32.train.precision = Precision::Fp32;
        for (backend, peak) in [(BackendKind::Cpu, 160e9), (BackendKind::Wgpu, 19.5e12)] {
            let mut cfg = fp32.clone();
            measure_on(&mut cfg, unnamed(backend));
            assert_eq!(mfu_peak(&cfg).precision, "fp32", "{backend:?}");
            assert_eq!(
                cfg.hardware.peak_flops(Precision::Fp32),
                peak,
                "{backend:?}"
            );
        }
        let mut bf16 = x1();
        measure_on(&mut bf16, cuda("NVIDIA A100-SXM4-80GB"));
        assert_eq!(
            (mfu_peak(&bf16).precision.as_str(), mfu_peak(&bf16).flops),
            ("bf16", 312e12)
        );
    }

    /// A peak the config sets is its writer's knowledge of the machine: kept, silently.
    #[test]
    fn a_peak_the_config_sets_wins() {
        let mut cfg = x1();
        cfg.hardware.peak_flops = Some(500e12);
        let before = cfg.clone();
        assert_eq!(measure_on(&mut cfg, cuda("NVIDIA H100 80GB HBM3")), None);
        assert_eq!(cfg, before);
    }

    /// No reading of the GPU: the config's device, as before.
    #[test]
    fn without_a_reading_the_config_stands() {
        let mut cfg = x1();
        assert_eq!(measure_on(&mut cfg, unnamed(BackendKind::Cuda)), None);
        assert_eq!(cfg, x1());
    }
}
