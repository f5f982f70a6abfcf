//! lab-model's tests as one binary, each file a module: the backends' generic code is compiled and
//! linked once instead of once per file (on 2 cores that was most of CI's time).

mod common;
mod fused_attention;
mod generate;
mod gpu_memory;
mod mixed_precision;
mod model;
