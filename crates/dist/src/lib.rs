//! Collectives over flat `f32` buffers, the one seam data-parallel training talks through, and
//! rank discovery from the launchers people use.
//!
//! The engines are ones that exist: [`Single`] (one process, every collective the identity),
//! Open MPI through the `mpi` crate (feature `mpi`), NCCL through cudarc (feature `cuda`). No
//! collective waits forever: each has a deadline ([`Timeout`]), so a dead peer becomes a
//! one-line error and a non-zero exit, never a hang (MPI polls its requests; NCCL's calls are
//! watched by a thread, see `watchdog`).

mod bucket;
mod launch;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "cuda")]
mod nccl;
mod rendezvous;
mod shard;
mod single;
mod watchdog;

use std::time::Duration;

use anyhow::Result;

pub use bucket::{all_reduce_bucketed, buckets};
pub use launch::{Launch, Launcher};
pub use rendezvous::{exchange_bytes, Rendezvous};
pub use shard::{balance, Shards};
pub use single::Single;
pub use watchdog::{Guard, Watchdog};

/// The GPU this rank computes on: `local_rank` modulo the GPUs the process sees (one, when the
/// launcher binds a GPU per task through `CUDA_VISIBLE_DEVICES`).
#[cfg(feature = "cuda")]
pub fn gpu_index(launch: &Launch) -> Result<usize> {
    let n = cudarc::driver::CudaContext::device_count()
        .map_err(|e| anyhow::anyhow!("cannot count CUDA devices: {e:?}"))? as usize;
    anyhow::ensure!(
        n > 0,
        "no CUDA device is visible to rank {} (CUDA_VISIBLE_DEVICES?)",
        launch.rank
    );
    Ok(launch.local_rank % n)
}

/// How an all-reduce combines the ranks' buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    /// The sum divided by the world size.
    Avg,
    Max,
}

/// How long a collective may wait for its peers before the process gives up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeout(pub Duration);

impl Default for Timeout {
    /// Ten minutes (NCCL's default in PyTorch): longer than rank 0's evaluation or checkpoint,
    /// which the others wait for in their next collective. A dead peer is usually noticed much
    /// sooner by the launcher.
    fn default() -> Self {
        Timeout(Duration::from_secs(600))
    }
}

/// What a rank says when `what` has waited out `timeout` for its peers (MPI's and NCCL's one
/// spelling).
fn stuck_peer_message(what: &str, timeout: Timeout) -> String {
    format!(
        "{what} waited {:?} for its peers (a rank died or hangs; [parallel] timeout_s sets the wait); exiting",
        timeout.0
    )
}

/// The collectives data parallelism needs, over flat buffers every rank lays out the same way.
pub trait Collectives {
    /// This process's rank, `0..world()`.
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// The engine's name, for logs and events.
    fn engine(&self) -> &'static str;
    /// Every rank's `buf` becomes the element-wise reduction of all ranks' `buf`.
    fn all_reduce(&self, buf: &mut [f32], op: Reduce) -> Result<()>;
    /// `out` (of length `Σ counts`) becomes every rank's `mine` (of length `counts[rank]`),
    /// concatenated in rank order.
    fn all_gather(&self, mine: &[f32], counts: &[usize], out: &mut [f32]) -> Result<()>;
    /// `out` (of length `counts[rank]`) becomes this rank's block of the reduction of all
    /// ranks' `buf` (of length `Σ counts`, blocks in rank order).
    fn reduce_scatter(
        &self,
        buf: &[f32],
        counts: &[usize],
        out: &mut [f32],
        op: Reduce,
    ) -> Result<()>;
    /// Every rank's `buf` becomes `root`'s.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()>;
    /// Every rank's `bytes` become `root`'s (the length travels first).
    fn broadcast_bytes(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    /// This rank is leaving the job on an error only it may have met: it will not wait for
    /// the others on its way out, so the launcher ends them at once instead of letting them
    /// wait out their timeout.
    fn abandon(&self) {}
}

/// Which engine to connect with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// From the launch: one process is `single`, `mpirun` and Slurm are `mpi`, torchrun is
    /// `nccl`.
    Auto,
    Single,
    Mpi,
    Nccl,
}

impl std::str::FromStr for Engine {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "auto" => Engine::Auto,
            "single" => Engine::Single,
            "mpi" => Engine::Mpi,
            "nccl" => Engine::Nccl,
            other => {
                anyhow::bail!("unknown collectives engine {other:?}; use auto, single, mpi or nccl")
            }
        })
    }
}

/// Connects this process to its peers with `engine` (resolved from `launch` when `Auto`).
pub fn connect(launch: &Launch, engine: Engine, timeout: Timeout) -> Result<Box<dyn Collectives>> {
    let engine = match engine {
        Engine::Auto if launch.world == 1 => Engine::Single,
        Engine::Auto => match launch.launcher {
            Launcher::Torchrun => Engine::Nccl,
            _ => Engine::Mpi,
        },
        e => e,
    };
    match engine {
        Engine::Single | Engine::Auto => {
            anyhow::ensure!(
                launch.world == 1,
                "{} started {} ranks but [parallel] engine = \"single\"; use engine = \"auto\"",
                launch.launcher.name(),
                launch.world
            );
            Ok(Box::new(Single))
        }
        Engine::Mpi => connect_mpi(launch, timeout),
        Engine::Nccl => connect_nccl(launch, timeout),
    }
}

#[cfg(feature = "mpi")]
fn connect_mpi(launch: &Launch, timeout: Timeout) -> Result<Box<dyn Collectives>> {
    Ok(Box::new(mpi::Mpi::connect(launch, timeout)?))
}

#[cfg(not(feature = "mpi"))]
fn connect_mpi(launch: &Launch, _: Timeout) -> Result<Box<dyn Collectives>> {
    anyhow::bail!(
        "{} started {} ranks but this lab was built without MPI; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev)",
        launch.launcher.name(),
        launch.world
    )
}

#[cfg(feature = "cuda")]
fn connect_nccl(launch: &Launch, timeout: Timeout) -> Result<Box<dyn Collectives>> {
    Ok(Box::new(nccl::Nccl::connect(launch, timeout)?))
}

#[cfg(not(feature = "cuda"))]
fn connect_nccl(launch: &Launch, _: Timeout) -> Result<Box<dyn Collectives>> {
    anyhow::bail!(
        "{} started {} ranks, which needs NCCL, but this lab was built without CUDA; rebuild with --features cuda, or launch with mpirun on a build with --features mpi",
        launch.launcher.name(),
        launch.world
    )
}

/// Checks a block collective's lengths (one line naming what is wrong): `counts` has one
/// entry per rank and sums to `total` (the whole buffer), and this rank's own block
/// (`all_gather`'s input, `reduce_scatter`'s output) holds `own` elements, as `counts[rank]`
/// says.
fn check_counts(
    what: &str,
    counts: &[usize],
    (rank, world): (usize, usize),
    (total, own): (usize, usize),
) -> Result<()> {
    // MPI counts and displacements are C ints.
    anyhow::ensure!(
        total <= i32::MAX as usize,
        "{what}: {total} elements exceed one MPI call's limit ({}); lower [parallel] bucket_mb or use ZeRO 0",
        i32::MAX
    );
    anyhow::ensure!(
        counts.len() == world,
        "{what}: {} counts for {world} ranks",
        counts.len()
    );
    let sum: usize = counts.iter().sum();
    anyhow::ensure!(
        sum == total,
        "{what}: counts sum to {sum}, buffer holds {total}"
    );
    anyhow::ensure!(
        own == counts[rank],
        "{what}: this rank's block holds {own} elements, counts say {}",
        counts[rank]
    );
    Ok(())
}
