//! How cubecl's memory pools hold a GPU's memory (`LAB_GPU_POOLS`), chosen once per process
//! before the device starts.
//!
//! cubecl's default layout (`sliced`) cuts tensors out of pages of up to a quarter of the
//! device (about 20 GB on an 80 GB card; a 320 MB tensor takes a slice of a 5 GB page) and
//! never returns a page. On an H100, x1-50m held 15.6 to 16.8 GiB where `lab plan` counts 9.4
//! (BENCHMARKS, "First figures on an H100"); how much of that the pool keeps, `lab bench`
//! reports (`memory pool` against `device tensors`). `exclusive` gives each tensor a page of
//! its own, in size classes, and returns pages left unused for a while: on lavapipe at x1-50m's
//! structure with small widths the pool peaked at 0.48 GiB against 0.55 (BENCHMARKS, "The
//! gradient norm in one launch a parameter…"). Which is better on a GPU, for memory and speed,
//! is for a GPU to say; until then the default stays cubecl's.

use anyhow::{bail, Result};

/// A layout of cubecl's memory pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPools {
    /// cubecl's default: tensors as slices of large pages, kept for the process's life.
    Sliced,
    /// A page per tensor in size classes; pages unused for a while go back to the device.
    Exclusive,
}

impl GpuPools {
    /// The layout `LAB_GPU_POOLS` names, or `None` when it is unset (the backend starts the
    /// device itself, in cubecl's default).
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var("LAB_GPU_POOLS") {
            Ok(v) => Self::parse(&v).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => bail!("LAB_GPU_POOLS: {e}; use sliced or exclusive"),
        }
    }

    /// A value of `LAB_GPU_POOLS` (empty: cubecl's default).
    pub fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "" | "sliced" => Self::Sliced,
            "exclusive" => Self::Exclusive,
            other => bail!(
                "LAB_GPU_POOLS={other:?} is unknown; use sliced (cubecl's default) or exclusive"
            ),
        })
    }

    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    fn memory_configuration(self) -> burn::cubecl::MemoryConfiguration {
        match self {
            Self::Sliced => burn::cubecl::MemoryConfiguration::SubSlices,
            Self::Exclusive => burn::cubecl::MemoryConfiguration::ExclusivePages,
        }
    }
}

/// Gives the CUDA devices this process starts the layout `LAB_GPU_POOLS` names. The first
/// call decides; later ones (the device has started by then) change nothing.
#[cfg(feature = "cuda")]
pub fn set_cuda_pools() -> Result<()> {
    if let Some(pools) = GpuPools::from_env()? {
        let _ = burn::cubecl::cuda::set_memory_configuration(pools.memory_configuration());
    }
    Ok(())
}

/// Starts the default wgpu device with the layout `LAB_GPU_POOLS` names, once per process
/// (wgpu takes a layout only when its device starts). With the variable unset, burn starts
/// the device itself, as it always has.
#[cfg(feature = "wgpu")]
pub fn set_wgpu_pools() -> Result<()> {
    use burn::backend::wgpu::{graphics::AutoGraphicsApi, init_setup, RuntimeOptions};
    static STARTED: std::sync::Once = std::sync::Once::new();
    if let Some(pools) = GpuPools::from_env()? {
        STARTED.call_once(|| {
            let options = RuntimeOptions {
                memory_config: pools.memory_configuration(),
                ..Default::default()
            };
            init_setup::<AutoGraphicsApi>(&Default::default(), options);
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_one_of_two_layouts_or_says_what_it_takes() {
        assert_eq!(GpuPools::parse("").unwrap(), GpuPools::Sliced);
        assert_eq!(GpuPools::parse("sliced").unwrap(), GpuPools::Sliced);
        assert_eq!(GpuPools::parse("exclusive").unwrap(), GpuPools::Exclusive);
        let e = GpuPools::parse("Exclusive").unwrap_err().to_string();
        assert_eq!(
            e,
            "LAB_GPU_POOLS=\"Exclusive\" is unknown; use sliced (cubecl's default) or exclusive"
        );
    }
}
