//! lab-ops' tests as one binary, each file a module: the backends' generic code is compiled and
//! linked once instead of once per file (on 2 cores that was most of CI's time).

mod common;
mod cube_adamw;
mod cube_loss;
mod cube_square_sums;
mod embedding;
mod fused_loss;
mod heads;
mod projection;
mod rms_norm;
mod rope;
mod swiglu;
