//! The one seam where a compute backend is chosen. Everything else is generic over
//! [`TrainBackend`]; adding or upgrading a backend touches this file only.

use anyhow::{bail, Result};
use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use lab_config::{ActivationCheckpointing, Precision};
use lab_model::FusedOps;
use lab_ops::{DeviceMemory, FusedAdamW, SumOfSquares};

/// What the trainer needs of a backend: automatic differentiation over some inner backend,
/// lab-ops' fused ops on both (the LM-head loss, attention where a kernel exists; the inner
/// one serves evaluation), the inner one's AdamW update and sum of squares (the norms), and a
/// reading of the device's memory pool (`lab bench`).
pub trait TrainBackend:
    AutodiffBackend<InnerBackend: FusedOps + FusedAdamW + SumOfSquares> + FusedOps + DeviceMemory
{
}
impl<B> TrainBackend for B where
    B: AutodiffBackend<InnerBackend: FusedOps + FusedAdamW + SumOfSquares>
        + FusedOps
        + DeviceMemory
{
}

/// The pure-Rust CPU backend: the embedded default, bit-deterministic for a seed.
pub type Cpu<C = NoCheckpointing> = Autodiff<burn::backend::Flex, C>;
#[cfg(feature = "cuda")]
pub type Cuda<C = NoCheckpointing> = Autodiff<burn::backend::Cuda, C>;
#[cfg(feature = "wgpu")]
pub type Wgpu<C = NoCheckpointing> = Autodiff<burn::backend::Wgpu, C>;

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
    /// What the backward pass recomputes instead of keeping: work that trains says what its
    /// config asks; the rest keeps everything.
    fn checkpointing(&self) -> ActivationCheckpointing {
        ActivationCheckpointing::None
    }
    /// The precision the work computes in: work that trains or times says what its config
    /// asks; the rest (evaluation, decoding) computes in fp32.
    fn precision(&self) -> Precision {
        Precision::Fp32
    }
    fn run<B: TrainBackend>(self, device: B::Device) -> Result<Self::Output>;
}

impl BackendKind {
    /// Fails, before any work is prepared, when this build or machine lacks the backend.
    pub fn ensure_available(self) -> Result<()> {
        match self {
            Self::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Self::Cuda => cuda_available()
                .and_then(|()| gpu_settings_valid())
                .and_then(|()| vendor_blas_available()),
            #[cfg(feature = "wgpu")]
            Self::Wgpu => gpu_settings_valid(),
            #[allow(unreachable_patterns)]
            other => bail!(
                "--backend {} needs a lab built with `--features {}`",
                other.name(),
                other.name()
            ),
        }
    }

    /// With `LAB_MATMUL=cublaslt` on CUDA, the products cuBLASLt ran and declined (cubecl's
    /// matmul ran those) in this process so far, so that a timing says what it timed.
    pub fn vendor_blas_counts(self) -> Option<(u64, u64)> {
        match self {
            #[cfg(feature = "cuda")]
            Self::Cuda if lab_ops::MatmulChoice::current() == lab_ops::MatmulChoice::Vendor => {
                let counts = lab_ops::vendor_counts();
                Some((counts.ran, counts.declined))
            }
            _ => None,
        }
    }

    /// Runs `work` on this backend, or says why it cannot. The backward pass keeps or
    /// recomputes activations as the work says (burn's autodiff takes it as a type parameter).
    pub fn dispatch<W: OnBackend>(self, work: W) -> Result<W::Output> {
        match work.checkpointing() {
            ActivationCheckpointing::None => self.run_with::<NoCheckpointing, W>(work),
            ActivationCheckpointing::Selective => self.run_with::<BalancedCheckpointing, W>(work),
        }
    }

    fn run_with<C: CheckpointStrategy, W: OnBackend>(self, work: W) -> Result<W::Output> {
        self.ensure_available()?;
        match self {
            Self::Cpu => self.run_on::<Cpu<C>, W>(work, Default::default()),
            #[cfg(feature = "cuda")]
            Self::Cuda => {
                crate::gpu_pools::set_cuda_pools()?;
                self.run_on::<Cuda<C>, W>(work, cuda_device()?)
            }
            #[cfg(feature = "wgpu")]
            Self::Wgpu => {
                crate::gpu_pools::set_wgpu_pools()?;
                self.run_on::<Wgpu<C>, W>(work, Default::default())
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("ensure_available refused it"),
        }
    }

    /// Runs `work` on `device` once the device is known to compute in the work's precision
    /// (WebGPU, and Vulkan without its bf16 extension, have no bf16: without this check the
    /// first bf16 kernel panics deep inside wgpu).
    fn run_on<B: TrainBackend, W: OnBackend>(
        self,
        work: W,
        device: B::Device,
    ) -> Result<W::Output> {
        let precision = work.precision();
        let dtype = lab_model::compute_dtype(precision).into();
        if !B::supports_dtype(&device, dtype) {
            bail!(
                "--precision {p} (or train.precision = \"{p}\"): this {} device has no {dtype:?} arithmetic; use --precision fp32 here, or --backend cuda or cpu for {p}",
                self.name(),
                p = precision.as_str(),
            );
        }
        work.run::<B>(device)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
        }
    }
}

/// The GPU of this rank: its local rank among the GPUs it sees (device 0 alone). Its kernels
/// are kept on disk between runs (`kernel_cache`).
#[cfg(feature = "cuda")]
fn cuda_device() -> Result<burn::backend::cuda::CudaDevice> {
    let launch = lab_dist::Launch::from_env()?;
    let index = lab_dist::gpu_index(&launch)?;
    crate::kernel_cache::use_kernel_cache(index);
    Ok(burn::backend::cuda::CudaDevice { index })
}

/// NVML's reader of this rank's GPU: the GPU `CUDA_VISIBLE_DEVICES` puts behind the CUDA
/// device this rank computes on (NVML numbers every GPU of the node by PCI bus; CUDA only the
/// visible ones, in the same order on a node of one GPU model).
#[cfg(feature = "cuda")]
pub fn nvml_probe(launch: &lab_dist::Launch) -> Result<lab_health::nvml::NvmlProbe> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let gpu = lab_health::nvml_gpu(visible.as_deref(), lab_dist::gpu_index(launch)?)?;
    lab_health::nvml::NvmlProbe::open(&gpu)
}

/// `LAB_MATMUL` (what the GPU backends' projections run on) and `LAB_GPU_POOLS` (how their
/// memory pools hold memory) are each one of their values: an unknown one stops the run with
/// one line instead of falling back silently.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn gpu_settings_valid() -> Result<()> {
    lab_ops::MatmulChoice::from_env().map_err(anyhow::Error::msg)?;
    crate::gpu_pools::GpuPools::from_env()?;
    Ok(())
}

/// `LAB_MATMUL=cublaslt` needs libcublasLt, loaded at run time: without it, one line now
/// instead of cudarc's panic at the first product.
#[cfg(feature = "cuda")]
fn vendor_blas_available() -> Result<()> {
    vendor_blas_found(
        lab_ops::MatmulChoice::from_env(),
        lab_ops::vendor_library_present,
    )
}

/// `Err` where `choice` is cuBLASLt and `present` (asked only then) finds no library.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn vendor_blas_found(
    choice: Result<lab_ops::MatmulChoice, String>,
    present: impl FnOnce() -> bool,
) -> Result<()> {
    if choice == Ok(lab_ops::MatmulChoice::Vendor) && !present() {
        bail!("LAB_MATMUL=cublaslt: libcublasLt was not found on the library path or does not load (it comes with the CUDA toolkit's lib64, or pip's nvidia-cublas-cu12); add its folder to LD_LIBRARY_PATH, or unset LAB_MATMUL for cubecl's matmul");
    }
    Ok(())
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
    let cuda_path = std::env::var("CUDA_PATH").ok();
    if cuda_headers(cuda_path.as_deref(), &|p| p.exists()).is_none() {
        bail!("--backend cuda: no CUDA toolkit headers (include/cuda.h under CUDA_PATH, /usr/local/cuda or /opt/cuda): cubecl compiles its kernels at run time with NVRTC and needs them; install the CUDA toolkit or set CUDA_PATH");
    }
    Ok(())
}

/// The CUDA toolkit's include folder, looked up where cubecl-cuda looks for the toolkit
/// (`CUDA_PATH`, then `/usr/local/cuda`, `/opt/cuda`, `/usr` with `/usr/bin/nvcc`), provided
/// it holds `cuda.h`: without it cubecl panics on its first kernel.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn cuda_headers(
    cuda_path: Option<&str>,
    exists: &dyn Fn(&std::path::Path) -> bool,
) -> Option<std::path::PathBuf> {
    use std::path::{Path, PathBuf};
    let root = match cuda_path {
        Some(p) => PathBuf::from(p),
        None => ["/usr/local/cuda", "/opt/cuda"]
            .iter()
            .map(PathBuf::from)
            .find(|p| exists(p))
            .or_else(|| exists(Path::new("/usr/bin/nvcc")).then(|| PathBuf::from("/usr")))?,
    };
    let include = root.join("include");
    exists(&include.join("cuda.h")).then_some(include)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Only `LAB_MATMUL=cublaslt` looks for libcublasLt, and without it says what to do.
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    #[test]
    fn cublaslt_without_its_library_is_one_line_naming_the_fix() {
        use lab_ops::MatmulChoice::{Backend, Op, Vendor};
        let asked = std::cell::Cell::new(0);
        let missing = || {
            asked.set(asked.get() + 1);
            false
        };
        for choice in [Ok(Backend), Ok(Op), Err("LAB_MATMUL=\"x\"".to_string())] {
            assert!(vendor_blas_found(choice, missing).is_ok());
        }
        assert_eq!(asked.get(), 0, "only cublaslt needs the library");
        assert!(vendor_blas_found(Ok(Vendor), || true).is_ok());
        let error = vendor_blas_found(Ok(Vendor), missing)
            .unwrap_err()
            .to_string();
        assert_eq!(asked.get(), 1);
        assert!(!error.contains('\n'), "{error}");
        for part in [
            "LAB_MATMUL=cublaslt",
            "libcublasLt",
            "LD_LIBRARY_PATH",
            "unset LAB_MATMUL",
        ] {
            assert!(error.contains(part), "{part}: {error}");
        }
    }

    /// Work that asks for `.0` and reports which backend type it was given.
    struct BackendTypeName(ActivationCheckpointing);

    impl OnBackend for BackendTypeName {
        type Output = &'static str;
        fn checkpointing(&self) -> ActivationCheckpointing {
            self.0
        }
        fn run<B: TrainBackend>(self, _device: B::Device) -> Result<&'static str> {
            Ok(std::any::type_name::<B>())
        }
    }

    /// The same, saying nothing about checkpointing.
    struct Silent;

    impl OnBackend for Silent {
        type Output = &'static str;
        fn run<B: TrainBackend>(self, _device: B::Device) -> Result<&'static str> {
            Ok(std::any::type_name::<B>())
        }
    }

    #[test]
    fn selective_checkpointing_trains_on_burns_balanced_strategy() {
        let on = |ac| BackendKind::Cpu.dispatch(BackendTypeName(ac)).unwrap();
        let selective = on(ActivationCheckpointing::Selective);
        assert!(selective.contains("BalancedCheckpointing"), "{selective}");
        let kept = on(ActivationCheckpointing::None);
        // (type_name leaves out the default NoCheckpointing.)
        assert!(!kept.contains("Balanced"), "{kept}");
        assert_eq!(
            BackendKind::Cpu.dispatch(Silent).unwrap(),
            kept,
            "work that does not say keeps everything"
        );
    }

    /// Work that computes in bf16 and reports that it ran.
    struct Bf16Work;

    impl OnBackend for Bf16Work {
        type Output = ();
        fn precision(&self) -> Precision {
            Precision::Bf16
        }
        fn run<B: TrainBackend>(self, _device: B::Device) -> Result<()> {
            Ok(())
        }
    }

    /// The CPU computes in bf16 (flex widens it for its matmuls), so bf16 work runs there.
    #[test]
    fn bf16_work_runs_on_the_cpu() {
        BackendKind::Cpu.dispatch(Bf16Work).unwrap();
    }

    /// WebGPU has no bf16 (nor has lavapipe's Vulkan): bf16 work is refused in one line
    /// naming the flag and the fix, before any kernel runs.
    #[cfg(feature = "wgpu")]
    #[test]
    fn bf16_work_on_a_device_without_bf16_is_refused_in_one_line() {
        use burn::tensor::{backend::Backend, DType};
        let has_bf16 = <Wgpu as Backend>::supports_dtype(&Default::default(), DType::BF16);
        // CI runs this on lavapipe, which has no bf16: there the refusal must happen.
        if std::env::var_os("LAB_EXPECT_NO_BF16").is_some() {
            assert!(
                !has_bf16,
                "LAB_EXPECT_NO_BF16 is set but this device reports bf16"
            );
        }
        match BackendKind::Wgpu.dispatch(Bf16Work) {
            Ok(()) => assert!(has_bf16, "bf16 work ran on a device without bf16"),
            Err(e) => {
                let e = e.to_string();
                assert!(!has_bf16, "refused on a device with bf16: {e}");
                assert!(e.starts_with("--precision bf16 (or train.precision"), "{e}");
                assert!(e.contains("this wgpu device has no BF16"), "{e}");
                assert!(
                    e.contains("use --precision fp32") && !e.contains('\n'),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn cuda_headers_are_found_where_cubecl_looks_and_only_with_cuda_h() {
        let on_disk = |files: &'static [&'static str]| {
            move |p: &Path| files.iter().any(|f| Path::new(f).starts_with(p))
        };
        let toolkit = on_disk(&["/usr/local/cuda/include/cuda.h"]);
        assert_eq!(
            cuda_headers(None, &toolkit),
            Some(Path::new("/usr/local/cuda/include").to_path_buf())
        );
        // CUDA_PATH wins, and must hold the headers itself.
        assert_eq!(cuda_headers(Some("/opt/other"), &toolkit), None);
        // A driver-only host (libcuda, no toolkit).
        assert_eq!(cuda_headers(None, &on_disk(&["/usr/lib/libcuda.so"])), None);
        // The distribution's nvcc package puts the headers under /usr/include.
        let distro = on_disk(&["/usr/bin/nvcc", "/usr/include/cuda.h"]);
        assert_eq!(
            cuda_headers(None, &distro),
            Some(Path::new("/usr/include").to_path_buf())
        );
    }
}
