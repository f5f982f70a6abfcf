//! `[parallel]`: the layout a run is planned and launched with. `lab plan` reads it for its
//! defaults and the trainer for its data-parallel degree, ZeRO stage and collectives, so
//! both read one source of truth.
//!
//! The global batch is `train.micro_batch × train.grad_accum × model.seq_len × dp`. A launch
//! with another number of ranks `W` keeps it: each rank accumulates `grad_accum × dp / W`
//! micro-batches (an elastic restart on fewer or more nodes trains the same recipe).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParallelConfig {
    /// Data-parallel replicas the recipe is written for.
    pub dp: usize,
    /// ZeRO stage: 0 (every rank holds the optimizer state) or 1 (each holds its shard; the
    /// trainer's limit). `lab plan` also plans 2 and 3.
    pub zero: u8,
    /// Tensor- and pipeline-parallel degrees (planned; the trainer runs 1).
    pub tp: usize,
    pub pp: usize,
    /// Collectives engine: "auto" (from the launcher), "single", "mpi" or "nccl".
    pub engine: String,
    /// Gradient bucket size for the all-reduce, MiB.
    pub bucket_mb: f64,
    /// How long a collective waits for a peer before the rank exits with an error, seconds.
    pub timeout_s: f64,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        Self {
            dp: 1,
            zero: 0,
            tp: 1,
            pp: 1,
            engine: "auto".into(),
            bucket_mb: 25.0,
            timeout_s: 600.0,
        }
    }
}

impl ParallelConfig {
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("dp", self.dp), ("tp", self.tp), ("pp", self.pp)] {
            if v == 0 {
                bail!("parallel.{name} must be at least 1");
            }
        }
        if self.zero > 3 {
            bail!(
                "parallel.zero = {} is not a ZeRO stage; use 0, 1, 2 or 3",
                self.zero
            );
        }
        if !["auto", "single", "mpi", "nccl"].contains(&self.engine.as_str()) {
            bail!(
                "parallel.engine = {:?}; use \"auto\", \"single\", \"mpi\" or \"nccl\"",
                self.engine
            );
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.bucket_mb) || !positive(self.timeout_s) {
            bail!("parallel.bucket_mb and parallel.timeout_s must be positive");
        }
        Ok(())
    }

    /// Micro-batches each of `world` ranks accumulates per step so the global batch stays
    /// `grad_accum × dp` micro-batches; a one-line error when it does not divide.
    pub fn local_accum(&self, grad_accum: usize, world: usize) -> Result<usize> {
        let global = grad_accum * self.dp;
        if world == 0 || !global.is_multiple_of(world) {
            bail!(
                "{world} ranks cannot share a global batch of {global} micro-batches (train.grad_accum {grad_accum} × parallel.dp {}); launch a number of ranks that divides {global}",
                self.dp
            );
        }
        Ok(global / world)
    }
}
