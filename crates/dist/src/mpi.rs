//! Open MPI through the `mpi` crate. Every collective is started non-blocking and polled
//! against a deadline, so a dead or stuck peer ends this process with one line instead of a
//! hang (a blocking MPI call cannot be given up on).

use std::cell::Cell;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

use anyhow::Result;
use mpi::ffi;
use mpi::topology::Communicator;

use crate::{check_counts, Collectives, Launch, Reduce, Timeout};

/// How long a wait polls without sleeping.
const SPIN: Duration = Duration::from_millis(200);

pub struct Mpi {
    /// Dropping it finalizes MPI, which waits for every rank: only a rank that leaves the job
    /// in step with the others drops it (see the `Drop` impl).
    universe: ManuallyDrop<mpi::environment::Universe>,
    /// This rank leaves on an error or a panic of its own (see [`Collectives::abandon`]).
    abandoned: Cell<bool>,
    rank: usize,
    world: usize,
    timeout: Timeout,
    /// The send side of an all-reduce (the `mpi` crate has no `MPI_IN_PLACE`), kept between
    /// calls so each step does not page-fault a fresh copy of the gradient into existence.
    send: std::cell::RefCell<Vec<f32>>,
}

impl Mpi {
    pub fn connect(launch: &Launch, timeout: Timeout) -> Result<Self> {
        let universe = mpi::initialize()
            .ok_or_else(|| anyhow::anyhow!("MPI was already initialized in this process"))?;
        let comm = universe.world();
        let (rank, world) = (comm.rank() as usize, comm.size() as usize);
        if (rank, world) != (launch.rank, launch.world) {
            // Not finalized: a rank that leaves alone must not wait for the others.
            std::mem::forget(universe);
            anyhow::bail!(
                "MPI says rank {rank} of {world} but {} set rank {} of {}; launch with one launcher (under Slurm: srun --mpi=pmix)",
                launch.launcher.name(),
                launch.rank,
                launch.world
            );
        }
        Ok(Mpi {
            universe: ManuallyDrop::new(universe),
            abandoned: Cell::new(false),
            rank,
            world,
            timeout,
            send: Default::default(),
        })
    }

    /// Polls `request` until it completes. Past the deadline the process exits: an MPI
    /// request still in flight cannot be cancelled, and its buffers cannot be freed under it.
    fn wait(&self, mut request: ffi::MPI_Request, what: &str) -> Result<()> {
        let started = Instant::now();
        loop {
            let mut done: i32 = 0;
            // SAFETY: `request` came from a started non-blocking call whose buffers the
            // caller keeps borrowed until this returns.
            unsafe { ffi::MPI_Test(&mut request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            if done != 0 {
                return Ok(());
            }
            let waited = started.elapsed();
            if waited > self.timeout.0 {
                eprintln!(
                    "error: rank {} of {}: {}",
                    self.rank,
                    self.world,
                    crate::stuck_peer_message(what, self.timeout)
                );
                std::process::exit(1);
            }
            // Poll hot while a transfer is plausibly in flight (as MPI's blocking calls do),
            // then politely: a rank waiting out rank 0's evaluation should not burn a core.
            if waited < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    fn op(op: Reduce) -> ffi::MPI_Op {
        // SAFETY: reading MPI's predefined handles.
        unsafe {
            match op {
                Reduce::Sum | Reduce::Avg => ffi::RSMPI_SUM,
                Reduce::Max => ffi::RSMPI_MAX,
            }
        }
    }

    fn finish_avg(&self, buf: &mut [f32], op: Reduce) {
        if op == Reduce::Avg {
            let w = self.world as f32;
            buf.iter_mut().for_each(|x| *x /= w);
        }
    }
}

fn counts_i32(counts: &[usize]) -> (Vec<i32>, Vec<i32>) {
    let c: Vec<i32> = counts.iter().map(|&n| n as i32).collect();
    let d: Vec<i32> = c
        .iter()
        .scan(0, |at, &n| {
            let d = *at;
            *at += n;
            Some(d)
        })
        .collect();
    (c, d)
}

impl Collectives for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn engine(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce(&self, buf: &mut [f32], op: Reduce) -> Result<()> {
        let mut send = self.send.borrow_mut();
        send.clear();
        send.extend_from_slice(buf);
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `send` and `buf` outlive the request, which `wait` completes.
        unsafe {
            ffi::MPI_Iallreduce(
                send.as_ptr() as *const c_void,
                buf.as_mut_ptr() as *mut c_void,
                buf.len() as i32,
                ffi::RSMPI_FLOAT,
                Self::op(op),
                ffi::RSMPI_COMM_WORLD,
                &mut req,
            );
        }
        self.wait(req, "all_reduce")?;
        self.finish_avg(buf, op);
        Ok(())
    }

    fn all_gather(&self, mine: &[f32], counts: &[usize], out: &mut [f32]) -> Result<()> {
        let lengths = (out.len(), mine.len());
        check_counts("all_gather", counts, (self.rank, self.world), lengths)?;
        let (c, d) = counts_i32(counts);
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: every buffer outlives the request, which `wait` completes.
        unsafe {
            ffi::MPI_Iallgatherv(
                mine.as_ptr() as *const c_void,
                mine.len() as i32,
                ffi::RSMPI_FLOAT,
                out.as_mut_ptr() as *mut c_void,
                c.as_ptr(),
                d.as_ptr(),
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_COMM_WORLD,
                &mut req,
            );
        }
        self.wait(req, "all_gather")
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
        let (c, _) = counts_i32(counts);
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: every buffer outlives the request, which `wait` completes.
        unsafe {
            ffi::MPI_Ireduce_scatter(
                buf.as_ptr() as *const c_void,
                out.as_mut_ptr() as *mut c_void,
                c.as_ptr(),
                ffi::RSMPI_FLOAT,
                Self::op(op),
                ffi::RSMPI_COMM_WORLD,
                &mut req,
            );
        }
        self.wait(req, "reduce_scatter")?;
        self.finish_avg(out, op);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buf` outlives the request, which `wait` completes.
        unsafe {
            ffi::MPI_Ibcast(
                buf.as_mut_ptr() as *mut c_void,
                buf.len() as i32,
                ffi::RSMPI_FLOAT,
                root as i32,
                ffi::RSMPI_COMM_WORLD,
                &mut req,
            );
        }
        self.wait(req, "broadcast")
    }

    fn broadcast_bytes(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        let mut len = [bytes.len() as u64];
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `len` and then `bytes` outlive their requests, which `wait` completes.
        unsafe {
            ffi::MPI_Ibcast(
                len.as_mut_ptr() as *mut c_void,
                8,
                ffi::RSMPI_UINT8_T,
                root as i32,
                ffi::RSMPI_COMM_WORLD,
                &mut req,
            );
        }
        self.wait(req, "broadcast")?;
        bytes.resize(len[0] as usize, 0);
        if bytes.is_empty() {
            // An empty Vec<u8>'s pointer is 0x1, which is Open MPI's MPI_IN_PLACE.
            return Ok(());
        }
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        unsafe {
            ffi::MPI_Ibcast(
                bytes.as_mut_ptr() as *mut c_void,
                bytes.len() as i32,
                ffi::RSMPI_UINT8_T,
                root as i32,
                ffi::RSMPI_COMM_WORLD,
                &mut req,
            );
        }
        self.wait(req, "broadcast")
    }

    fn abandon(&self) {
        self.abandoned.set(true);
    }

    fn barrier(&self) -> Result<()> {
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: a barrier holds no buffers.
        unsafe { ffi::MPI_Ibarrier(ffi::RSMPI_COMM_WORLD, &mut req) };
        self.wait(req, "barrier")
    }
}

/// A rank that leaves the job alone (an error or a panic only it met) must not finalize:
/// `MPI_Finalize` would wait for peers that are themselves waiting in a collective for it,
/// until their timeout. Exiting without it makes the launcher (mpirun, or srun with
/// `--kill-on-bad-exit`) end the whole job at once.
impl Drop for Mpi {
    fn drop(&mut self) {
        if !self.abandoned.get() && !std::thread::panicking() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.universe) };
        }
    }
}
