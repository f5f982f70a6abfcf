//! [`DeviceMemory`] on `CubeBackend` (cubecl's pool for this thread's stream) and Fusion.

use burn::tensor::backend::Backend;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use crate::memory::{DeviceBytes, DeviceMemory};

impl<R, F, I, BT> DeviceMemory for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn device_bytes(device: &Self::Device) -> Option<DeviceBytes> {
        let usage = R::client(device).memory_usage().ok()?;
        Some(DeviceBytes {
            in_use: usage.bytes_in_use,
            reserved: usage.bytes_reserved,
        })
    }
}

/// Fusion first runs what it has queued: a tensor only recorded holds no memory yet.
impl<B: FusionBackend + DeviceMemory> DeviceMemory for Fusion<B> {
    fn device_bytes(device: &Self::Device) -> Option<DeviceBytes> {
        Self::sync(device).ok()?;
        B::device_bytes(device)
    }
}
