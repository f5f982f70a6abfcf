//! What a GPU backend's memory pool holds: the bytes of live tensors, and what the pool has
//! reserved from the device for them. The first is what `lab plan` models; NVML's reading on
//! CUDA adds to the second the CUDA context, cuBLASLt's workspaces and any other stream's pool.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;

/// The tensor memory of this thread's pool on a device (cubecl keeps one per stream), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBytes {
    /// Held by live tensors, without the pool's padding.
    pub in_use: u64,
    /// Taken from the device by the pool (live tensors, padding and free blocks it keeps).
    pub reserved: u64,
}

/// Reads [`DeviceBytes`], counting every tensor made by the work asked for so far (a backend
/// that defers work, Fusion, runs it first: a tensor only recorded holds no memory yet).
pub trait DeviceMemory: Backend {
    /// `None` where tensors live in the process's own memory (the CPU).
    fn device_bytes(_device: &Self::Device) -> Option<DeviceBytes> {
        None
    }
}

impl DeviceMemory for burn::backend::flex::Flex {}

impl<B: DeviceMemory, C: CheckpointStrategy> DeviceMemory for Autodiff<B, C> {
    fn device_bytes(device: &Self::Device) -> Option<DeviceBytes> {
        B::device_bytes(device)
    }
}
