//! The one seam where a compute backend is chosen. Everything else is generic over
//! [`TrainBackend`]; adding or upgrading a backend touches this file only.

use anyhow::{bail, Result};
use burn::tensor::backend::AutodiffBackend;
use lab_model::FusedOps;
use lab_ops::FusedAdamW;

/// What the trainer needs of a backend: automatic differentiation over some inner backend,
/// lab-ops' fused ops on both (the LM-head loss, attention where a kernel exists; the inner
/// one serves evaluation), and the inner one's AdamW update.
pub trait TrainBackend: AutodiffBackend<InnerBackend: FusedOps + FusedAdamW> + FusedOps {}
impl<B: AutodiffBackend<InnerBackend: FusedOps + FusedAdamW> + FusedOps> TrainBackend for B {}

/// The pure-Rust CPU backend: the embedded default, bit-deterministic for a seed.
pub type Cpu = burn::backend::Autodiff<burn::backend::Flex>;
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Autodiff<burn::backend::Cuda>;
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Autodiff<burn::backend::Wgpu>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
    Wgpu,
}

impl std::str::FromStr for BackendKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "cpu" => Self::Cpu,
            "cuda" => Self::Cuda,
            "wgpu" => Self::Wgpu,
            other => bail!("--backend {other:?} is unknown; use cpu, cuda or wgpu"),
        })
    }
}

/// Work to run on whichever backend was chosen at run time.
pub trait OnBackend {
    type Output;
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<Self::Output>;
}

impl BackendKind {
    /// Fails, before any work is prepared, when this build or machine lacks the backend.
    pub fn ensure_available(self) -> Result<()> {
        match self {
            Self::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Self::Cuda => cuda_available(),
            #[cfg(feature = "wgpu")]
            Self::Wgpu => Ok(()),
            #[allow(unreachable_patterns)]
            other => bail!(
                "--backend {} needs a lab built with `--features {}`",
                other.name(),
                other.name()
            ),
        }
    }

    /// Runs `work` on this backend, or says why it cannot.
    pub fn dispatch<W: OnBackend>(self, work: W) -> Result<W::Output> {
        self.ensure_available()?;
        match self {
            Self::Cpu => work.run::<Cpu>(Default::default()),
            #[cfg(feature = "cuda")]
            Self::Cuda => work.run::<Cuda>(cuda_device()?),
            #[cfg(feature = "wgpu")]
            Self::Wgpu => work.run::<Wgpu>(Default::default()),
            #[allow(unreachable_patterns)]
            _ => unreachable!("ensure_available refused it"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
        }
    }
}

/// The GPU of this rank: its local rank among the GPUs it sees (device 0 alone).
#[cfg(feature = "cuda")]
fn cuda_device() -> Result<burn::backend::cuda::CudaDevice> {
    let launch = lab_dist::Launch::from_env()?;
    Ok(burn::backend::cuda::CudaDevice {
        index: lab_dist::gpu_index(&launch)?,
    })
}

/// CUDA is loaded at run time: without a driver, fail with one clear line instead of a panic
/// deep inside cudarc.
#[cfg(feature = "cuda")]
fn cuda_available() -> Result<()> {
    let found = ["libcuda.so.1", "libcuda.so"].iter().any(|lib| {
        // Safety: loading the driver library runs its initializers only.
        unsafe { libloading::Library::new(lib) }.is_ok()
    });
    if !found {
        bail!("--backend cuda: no CUDA driver (libcuda.so) found on this machine; use --backend cpu or run on a GPU host");
    }
    Ok(())
}
