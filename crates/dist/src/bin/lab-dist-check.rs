//! `mpirun -np N lab-dist-check [check | hang RANK SECS | bench MB]`: the MPI backend on real
//! processes. `check` compares every collective with the same arithmetic on the host; `hang`
//! has one rank stop answering so the others show the timeout; `bench` times all-reduce
//! through the seam against Open MPI's blocking `MPI_Allreduce` on the same buffer.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use lab_dist::{connect, Collectives, Engine, Launch, Reduce, Timeout};

fn value(rank: usize, i: usize) -> f32 {
    (rank * 1000 + i) as f32 * 0.5 - 3.0
}

fn check(c: &dyn Collectives) -> Result<()> {
    let (rank, world) = (c.rank(), c.world());
    // all_reduce: sum, avg and max of value(r, i) over ranks.
    let n = 1001;
    for op in [Reduce::Sum, Reduce::Avg, Reduce::Max] {
        let mut buf: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
        c.all_reduce(&mut buf, op)?;
        for (i, got) in buf.iter().enumerate() {
            let all: Vec<f64> = (0..world).map(|r| value(r, i) as f64).collect();
            let want = match op {
                Reduce::Sum => all.iter().sum(),
                Reduce::Avg => all.iter().sum::<f64>() / world as f64,
                Reduce::Max => all.iter().cloned().fold(f64::MIN, f64::max),
            };
            ensure!(
                ((*got as f64) - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{op:?}[{i}] = {got}, want {want}"
            );
        }
    }
    // Uneven blocks: rank r holds r + 3 elements.
    let counts: Vec<usize> = (0..world).map(|r| r + 3).collect();
    let total: usize = counts.iter().sum();
    let mine: Vec<f32> = (0..counts[rank]).map(|i| value(rank, i)).collect();
    let mut out = vec![f32::NAN; total];
    c.all_gather(&mine, &counts, &mut out)?;
    let want: Vec<f32> = (0..world)
        .flat_map(|r| (0..counts[r]).map(move |i| value(r, i)))
        .collect();
    ensure!(out == want, "all_gather {out:?} != {want:?}");
    let full: Vec<f32> = (0..total).map(|i| value(rank, i)).collect();
    let mut block = vec![f32::NAN; counts[rank]];
    c.reduce_scatter(&full, &counts, &mut block, Reduce::Sum)?;
    let start: usize = counts[..rank].iter().sum();
    for (k, got) in block.iter().enumerate() {
        let want: f32 = (0..world).map(|r| value(r, start + k)).sum();
        ensure!(*got == want, "reduce_scatter[{k}] = {got}, want {want}");
    }
    let mut b: Vec<f32> = (0..17).map(|i| value(rank, i)).collect();
    c.broadcast(&mut b, world - 1)?;
    ensure!(
        b == (0..17).map(|i| value(world - 1, i)).collect::<Vec<_>>(),
        "broadcast"
    );
    let mut bytes = if rank == 0 {
        b"stop: budget".to_vec()
    } else {
        Vec::new()
    };
    c.broadcast_bytes(&mut bytes, 0)?;
    ensure!(bytes == b"stop: budget", "broadcast_bytes gave {bytes:?}");
    // Nothing to say is a message too (no checkpoint to resume from).
    let mut empty = if rank == 0 {
        Vec::new()
    } else {
        b"stale".to_vec()
    };
    c.broadcast_bytes(&mut empty, 0)?;
    ensure!(empty.is_empty(), "empty broadcast_bytes gave {empty:?}");
    c.barrier()?;
    println!("rank {rank} of {world}: all collectives agree with the host");
    Ok(())
}

fn bench(c: &dyn Collectives, mb: usize) -> Result<()> {
    use mpi::collective::{CommunicatorCollectives, SystemOperation};
    let n = mb * 1024 * 1024 / 4;
    let mut buf = vec![1.0f32; n];
    let rounds = 30;
    let mut seam = Vec::new();
    let mut blocking = Vec::new();
    let world = mpi::topology::SimpleCommunicator::world();
    let mut out = vec![0.0f32; n];
    for _ in 0..rounds {
        c.barrier()?;
        let t = Instant::now();
        c.all_reduce(&mut buf, Reduce::Sum)?;
        seam.push(t.elapsed().as_secs_f64());
        c.barrier()?;
        let t = Instant::now();
        world.all_reduce_into(&buf[..], &mut out[..], SystemOperation::sum());
        blocking.push(t.elapsed().as_secs_f64());
        buf.iter_mut().for_each(|x| *x = 1.0);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (s, b) = (median(&mut seam), median(&mut blocking));
    // Bus bandwidth as nccl-tests defines it: 2(W-1)/W × bytes / time.
    let w = c.world() as f64;
    let bus = |t: f64| 2.0 * (w - 1.0) / w * (n * 4) as f64 / t / 1e9;
    if c.rank() == 0 {
        println!("all_reduce {mb} MiB on {} ranks: seam {:.3} ms ({:.2} GB/s bus), MPI_Allreduce {:.3} ms ({:.2} GB/s bus)", c.world(), s * 1e3, bus(s), b * 1e3, bus(b));
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let timeout = std::env::var("LAB_DIST_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    let result = (|| -> Result<()> {
        let launch = Launch::from_env()?;
        let c = connect(
            &launch,
            Engine::Mpi,
            timeout.map(Timeout).unwrap_or_default(),
        )?;
        match args.first().map(String::as_str).unwrap_or("check") {
            "check" => check(c.as_ref()),
            "hang" => {
                let (who, secs): (usize, u64) = (args[1].parse()?, args[2].parse()?);
                if c.rank() == who {
                    std::thread::sleep(Duration::from_secs(secs));
                    return Ok(());
                }
                c.barrier()
            }
            "bench" => bench(c.as_ref(), args.get(1).map_or(Ok(4), |a| a.parse())?),
            other => anyhow::bail!("unknown mode {other}; use check, hang or bench"),
        }
    })();
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
