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

pub use lab_config::Usage;

/// A message's non-blank lines, trimmed and joined by "; " (errors are one line).
pub fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join("; ")
}

/// `--checkpoint`'s value (latest, best, N or step-N); any other is a [`Usage`] error.
pub fn checkpoint_choice(value: &str) -> anyhow::Result<lab_report::CheckpointChoice> {
    parse_flag(value)
}

/// `--backend`'s value (cpu, cuda, wgpu); any other is a [`Usage`] error.
pub fn backend_kind(value: &str) -> anyhow::Result<lab_train::backend::BackendKind> {
    parse_flag(value)
}

/// A flag's value parsed by its type, whose error names the flag: a [`Usage`] error.
fn parse_flag<T: std::str::FromStr<Err = anyhow::Error>>(value: &str) -> anyhow::Result<T> {
    value
        .parse()
        .map_err(|e: anyhow::Error| anyhow::Error::new(Usage(e.to_string())))
}

pub(crate) use lab_config::bail_usage;

/// This rank's GPU through NVML, opened once: None off CUDA, the error's text where NVML
/// cannot be read. Its description picks MFU's peak and `--fit-micro-batch`'s memory; its
/// readings feed the health policy (train) or the memory gauge (bench).
pub type Gpu = Result<Option<Box<dyn lab_health::Probe>>, String>;

#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub fn open_gpu(backend: lab_train::BackendKind, launch: &lab_dist::Launch) -> Gpu {
    match backend {
        #[cfg(feature = "cuda")]
        lab_train::BackendKind::Cuda => match lab_train::backend::nvml_probe(launch) {
            Ok(p) => Ok(Some(Box::new(p))),
            Err(e) => Err(format!("{e:#}")),
        },
        _ => Ok(None),
    }
}

/// Points the config's `hardware.device` at the device this rank computes on (for MFU; see
/// `lab_train::device`), returning the note to print when it moved.
pub fn measure_on_this_device(
    config: &mut lab_config::LabConfig,
    backend: lab_train::BackendKind,
    gpu: &Gpu,
) -> Option<String> {
    let info = match gpu {
        Ok(Some(probe)) => Some(probe.describe()),
        _ => None,
    };
    let found = lab_train::device::Found {
        backend,
        gpu: info.as_ref().map(|g| (g.name.as_str(), g.memory_bytes)),
    };
    lab_train::device::measure_on(config, found)
}
