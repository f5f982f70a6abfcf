//! What a GPU backend's memory pool holds: the bytes of live tensors, and what the pool has
//! reserved from the device for them. NVML's reading (what `lab bench` reported on CUDA so
//! far) is the second plus the CUDA context; the first is what `lab plan` models, so the two
//! can be told apart.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;

/// A device's tensor memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBytes {
    /// Held by live tensors, without the pool's padding.
    pub in_use: u64,
    /// Taken from the device by the pool (live tensors, padding and free blocks it keeps).
    pub reserved: u64,
}

/// Reads [`DeviceBytes`] after the work queued so far has run.
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
