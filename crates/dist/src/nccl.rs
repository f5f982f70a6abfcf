//! NCCL through cudarc (loaded at run time, so this builds without CUDA or NCCL installed).
//! The unique id travels from rank 0 through the TCP rendezvous at `MASTER_ADDR:MASTER_PORT`.
//! Buffers are host slices staged through the GPU of `local_rank`; NCCL's all-gather and
//! reduce-scatter take equal blocks, so uneven ones are padded to the largest.
//!
//! The deadline covers every call: the rendezvous has its own, and the communicator's
//! creation and each collective (host call, kernel and copy back) are watched by a
//! [`Watchdog`] thread, which ends the process with one line when a peer never answers.
//!
//! Staging through the host keeps the seam one for every engine, at the cost of copies; a GPU
//! trainer should hand NCCL device buffers (the GPU path of the trainer is not built yet).

use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};

use crate::{
    check_counts, exchange_bytes, Collectives, Launch, Reduce, Rendezvous, Timeout, Watchdog,
};

pub struct Nccl {
    comm: Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    watchdog: Watchdog,
}

fn nccl_err(what: &str) -> impl Fn(cudarc::nccl::result::NcclError) -> anyhow::Error + '_ {
    move |e| anyhow!("NCCL {what} failed: {e:?} (is libnccl.so on LD_LIBRARY_PATH?)")
}

impl Nccl {
    pub fn connect(launch: &Launch, timeout: Timeout) -> Result<Self> {
        let gpu = crate::gpu_index(launch)?;
        let ctx = CudaContext::new(gpu)
            .with_context(|| format!("no CUDA device {gpu} (LOCAL_RANK) for NCCL"))?;
        let stream = ctx.default_stream();
        let id = if launch.world == 1 {
            Id::new().map_err(nccl_err("unique id"))?
        } else {
            let (addr, port) = launch.master.clone().ok_or_else(|| {
                anyhow!("{} started {} ranks but MASTER_ADDR is not set; NCCL needs it for its rendezvous", launch.launcher.name(), launch.world)
            })?;
            let mine = if launch.rank == 0 {
                let id = Id::new().map_err(nccl_err("unique id"))?;
                id.internal().iter().map(|&c| c as u8).collect()
            } else {
                Vec::new()
            };
            // torchrun's own store already listens on MASTER_PORT: ours takes the next port.
            let rdv = Rendezvous {
                addr,
                port: rendezvous_port(port)?,
                rank: launch.rank,
                world: launch.world,
            };
            let bytes = exchange_bytes(&rdv, &mine, timeout)?;
            let mut raw = [0 as std::ffi::c_char; 128];
            anyhow::ensure!(
                bytes.len() == 128,
                "rendezvous sent {} bytes, NCCL ids have 128",
                bytes.len()
            );
            for (r, b) in raw.iter_mut().zip(bytes) {
                *r = b as std::ffi::c_char;
            }
            Id::uninit(raw)
        };
        let who = format!("rank {} of {}", launch.rank, launch.world);
        let watchdog = Watchdog::exiting(who, timeout)?;
        let comm = {
            // Creation connects to every peer: one that died after the rendezvous hangs it.
            let _watched = watchdog.arm("NCCL init");
            Comm::from_rank(stream.clone(), launch.rank, launch.world, id)
                .map_err(nccl_err("init"))?
        };
        Ok(Nccl {
            comm,
            stream,
            rank: launch.rank,
            world: launch.world,
            watchdog,
        })
    }

    fn to_device(&self, host: &[f32]) -> Result<cudarc::driver::CudaSlice<f32>> {
        Ok(self.stream.clone_htod(host)?)
    }

    fn to_host(&self, dev: &cudarc::driver::CudaSlice<f32>, out: &mut [f32]) -> Result<()> {
        self.stream.memcpy_dtoh(dev, out)?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// An all-reduce watched under the name `what` (a barrier is one of a single element).
    fn all_reduce_as(&self, buf: &mut [f32], op: Reduce, what: &'static str) -> Result<()> {
        let _watched = self.watchdog.arm(what);
        let mut dev = self.to_device(buf)?;
        self.comm
            .all_reduce_in_place(&mut dev, &Self::op(op))
            .map_err(nccl_err("all_reduce"))?;
        self.to_host(&dev, buf)
    }

    fn op(op: Reduce) -> ReduceOp {
        match op {
            Reduce::Sum => ReduceOp::Sum,
            Reduce::Avg => ReduceOp::Avg,
            Reduce::Max => ReduceOp::Max,
        }
    }
}

impl Collectives for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn engine(&self) -> &'static str {
        "nccl"
    }

    fn all_reduce(&self, buf: &mut [f32], op: Reduce) -> Result<()> {
        self.all_reduce_as(buf, op, "NCCL all_reduce")
    }

    fn all_gather(&self, mine: &[f32], counts: &[usize], out: &mut [f32]) -> Result<()> {
        let lengths = (out.len(), mine.len());
        check_counts("all_gather", counts, (self.rank, self.world), lengths)?;
        let _watched = self.watchdog.arm("NCCL all_gather");
        let block = *counts.iter().max().unwrap_or(&0);
        let mut padded = mine.to_vec();
        padded.resize(block, 0.0);
        let send = self.to_device(&padded)?;
        let mut recv = self.stream.alloc_zeros::<f32>(block * self.world)?;
        self.comm
            .all_gather(&send, &mut recv)
            .map_err(nccl_err("all_gather"))?;
        let mut all = vec![0.0; block * self.world];
        self.to_host(&recv, &mut all)?;
        let mut at = 0;
        for (r, &n) in counts.iter().enumerate() {
            out[at..at + n].copy_from_slice(&all[r * block..r * block + n]);
            at += n;
        }
        Ok(())
    }

    fn reduce_scatter(
        &self,
        buf: &[f32],
        counts: &[usize],
        out: &mut [f32],
        op: Reduce,
    ) -> Result<()> {
        let lengths = (buf.len(), out.len());
        check_counts("reduce_scatter", counts, (self.rank, self.world), lengths)?;
        let _watched = self.watchdog.arm("NCCL reduce_scatter");
        let block = *counts.iter().max().unwrap_or(&0);
        let mut padded = vec![0.0; block * self.world];
        let mut at = 0;
        for (r, &n) in counts.iter().enumerate() {
            padded[r * block..r * block + n].copy_from_slice(&buf[at..at + n]);
            at += n;
        }
        let send = self.to_device(&padded)?;
        let mut recv = self.stream.alloc_zeros::<f32>(block)?;
        self.comm
            .reduce_scatter(&send, &mut recv, &Self::op(op))
            .map_err(nccl_err("reduce_scatter"))?;
        let mut mine = vec![0.0; block];
        self.to_host(&recv, &mut mine)?;
        out.copy_from_slice(&mine[..counts[self.rank]]);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        let _watched = self.watchdog.arm("NCCL broadcast");
        let mut dev = self.to_device(buf)?;
        self.comm
            .broadcast_in_place(&mut dev, root as i32)
            .map_err(nccl_err("broadcast"))?;
        self.to_host(&dev, buf)
    }

    fn broadcast_bytes(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        // Bytes travel as f32 words (NCCL moves them untouched); the length as two 32-bit halves.
        let n = bytes.len() as u64;
        let mut len = [f32::from_bits(n as u32), f32::from_bits((n >> 32) as u32)];
        self.broadcast(&mut len, root)?;
        let n = (len[0].to_bits() as u64 | (len[1].to_bits() as u64) << 32) as usize;
        let mut words: Vec<f32> = bytes
            .chunks(4)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                f32::from_le_bytes(w)
            })
            .collect();
        words.resize(n.div_ceil(4), 0.0);
        self.broadcast(&mut words, root)?;
        *bytes = words.iter().flat_map(|w| w.to_le_bytes()).take(n).collect();
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.all_reduce_as(&mut [0.0], Reduce::Sum, "NCCL barrier")
    }
}

/// The port of lab's NCCL id rendezvous: `LAB_RDZV_PORT`, else `MASTER_PORT + 1` (torchrun's
/// store holds `MASTER_PORT` itself).
fn rendezvous_port(master_port: u16) -> Result<u16> {
    match std::env::var("LAB_RDZV_PORT") {
        Ok(p) => p
            .trim()
            .parse()
            .with_context(|| format!("LAB_RDZV_PORT={p:?} is not a port number")),
        Err(_) => master_port
            .checked_add(1)
            .context("MASTER_PORT 65535 leaves no port for the rendezvous; set LAB_RDZV_PORT"),
    }
}
