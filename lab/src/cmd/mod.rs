//! One module per subcommand: parse flags, call the library, map the outcome to an exit code.

pub mod bench;
pub mod budget;
pub mod compare;
pub mod data;
pub mod deid_probe;
pub mod dod;
pub mod eval;
pub mod export;
pub mod generate;
pub mod plan;
pub mod postmortem;
pub mod run;
pub mod status;
pub mod supervise;
pub mod tokenizer;
pub mod train;

/// Points the config's `hardware.device` at the device this rank computes on (for MFU; see
/// `lab_train::device`), returning the note to print when it moved.
pub fn measure_on_this_device(
    config: &mut lab_config::LabConfig,
    backend: lab_train::BackendKind,
    launch: &lab_dist::Launch,
) -> Option<String> {
    let gpu = gpu_identity(backend, launch);
    let found = lab_train::device::Found {
        backend,
        gpu: gpu.as_ref().map(|(name, memory)| (name.as_str(), *memory)),
    };
    lab_train::device::measure_on(config, found)
}

/// This rank's GPU as NVML names it, with its memory; None without one (or without NVML,
/// which the health readings warn about).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn gpu_identity(
    backend: lab_train::BackendKind,
    launch: &lab_dist::Launch,
) -> Option<(String, u64)> {
    match backend {
        #[cfg(feature = "cuda")]
        lab_train::BackendKind::Cuda => {
            let probe = lab_train::backend::nvml_probe(launch).ok()?;
            let gpu = lab_health::Probe::describe(&probe);
            Some((gpu.name, gpu.memory_bytes))
        }
        _ => None,
    }
}
