//! Which GPU NVML should read for the CUDA device a rank computes on. CUDA numbers only the
//! GPUs `CUDA_VISIBLE_DEVICES` lets it see (Slurm's `--gpus-per-task` and most launchers bind
//! one per rank that way, so every rank computes on CUDA device 0), while NVML always numbers
//! every GPU of the node: reading NVML's GPU 0 would watch rank 0's GPU from every rank.

use anyhow::{bail, Result};

/// A GPU as NVML finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlGpu {
    /// NVML's index (as `nvidia-smi` numbers the GPUs).
    Index(u32),
    /// A UUID or a unique prefix of one (`GPU-8f2a…`), as CUDA accepts them.
    Uuid(String),
}

/// The NVML GPU behind CUDA device `cuda_ordinal`, given `CUDA_VISIBLE_DEVICES` (`visible`).
/// Unset, CUDA and NVML count the same GPUs (by PCI bus on nodes of one GPU model).
pub fn nvml_gpu(visible: Option<&str>, cuda_ordinal: usize) -> Result<NvmlGpu> {
    let Some(visible) = visible else {
        return Ok(NvmlGpu::Index(cuda_ordinal as u32));
    };
    let listed: Vec<&str> = visible.split(',').map(str::trim).collect();
    let Some(entry) = listed.get(cuda_ordinal).filter(|e| !e.is_empty()) else {
        bail!(
            "CUDA_VISIBLE_DEVICES={visible:?} lists no GPU for CUDA device {cuda_ordinal}; set it to the GPUs this rank may use (e.g. 0,1) or unset it"
        );
    };
    if let Ok(index) = entry.parse::<i64>() {
        return match u32::try_from(index) {
            Ok(index) => Ok(NvmlGpu::Index(index)),
            // CUDA stops reading the list at a negative entry.
            Err(_) => bail!(
                "CUDA_VISIBLE_DEVICES={visible:?} hides CUDA device {cuda_ordinal} and any after it ({entry})"
            ),
        };
    }
    if entry.starts_with("GPU-") || entry.starts_with("MIG-") {
        return Ok(NvmlGpu::Uuid(entry.to_string()));
    }
    bail!(
        "CUDA_VISIBLE_DEVICES={visible:?}: {entry:?} is neither a GPU index nor a GPU UUID (GPU-…)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cuda_devices_map_to_the_gpus_the_launcher_bound() {
        assert_eq!(nvml_gpu(None, 3).unwrap(), NvmlGpu::Index(3));
        // Slurm's --gpus-per-task=1 on the node's fourth GPU: CUDA device 0 is NVML's 3.
        assert_eq!(nvml_gpu(Some("3"), 0).unwrap(), NvmlGpu::Index(3));
        assert_eq!(nvml_gpu(Some("2, 5"), 1).unwrap(), NvmlGpu::Index(5));
        assert_eq!(
            nvml_gpu(Some("GPU-8f2a61c4,GPU-1b"), 0).unwrap(),
            NvmlGpu::Uuid("GPU-8f2a61c4".into())
        );
        // A MIG slice is looked up by its UUID (and found in no whole GPU's: no health readings).
        assert_eq!(
            nvml_gpu(Some("MIG-4f1e"), 0).unwrap(),
            NvmlGpu::Uuid("MIG-4f1e".into())
        );
    }

    #[test]
    fn a_list_without_this_device_is_a_one_line_error() {
        for (visible, ordinal, needle) in [
            ("", 0, "lists no GPU for CUDA device 0"),
            ("4", 1, "lists no GPU for CUDA device 1"),
            ("-1", 0, "hides CUDA device 0 and any after it"),
            ("0,,1", 1, "lists no GPU for CUDA device 1"),
            ("NoDevFiles", 0, "neither a GPU index nor a GPU UUID"),
        ] {
            let e = nvml_gpu(Some(visible), ordinal).unwrap_err().to_string();
            assert!(e.contains(needle) && !e.contains('\n'), "{visible:?}: {e}");
        }
    }

    proptest! {
        /// Any list of indices: CUDA device i is the i-th listed GPU.
        #[test]
        fn the_ith_cuda_device_is_the_ith_listed_gpu(
            gpus in proptest::collection::vec(0u32..16, 1..8),
            pick in 0usize..8,
        ) {
            let visible = gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let got = nvml_gpu(Some(&visible), pick);
            match gpus.get(pick) {
                Some(&g) => prop_assert_eq!(got.unwrap(), NvmlGpu::Index(g)),
                None => prop_assert!(got.is_err()),
            }
        }
    }
}
