pub const TMA_LOAD_IM2COL: &str = include_str!("tma_load_im2col.cuh");
pub const COPY_ASYNC: &str = include_str!("copy_async.cuh");
// LAB PATCH (LAB-PATCH.md): the arrive apart, as it needs `cuda::barrier`.
pub const COPY_ASYNC_ARRIVE: &str = include_str!("copy_async_arrive.cuh");

mod mma;

pub use mma::*;
