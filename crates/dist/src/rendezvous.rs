//! The TCP rendezvous at `MASTER_ADDR:MASTER_PORT` that hands rank 0's bytes (NCCL's unique
//! id) to every other rank, as torchrun's store does. It carries a few bytes once; the
//! collectives themselves run on NCCL.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::Timeout;

/// Where rank 0 listens.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    pub addr: String,
    pub port: u16,
    pub rank: usize,
    pub world: usize,
}

/// Rank 0 sends `root_bytes` to the `world - 1` others; every rank returns them. Gives up
/// with a one-line error when a peer has not shown up before `timeout`.
pub fn exchange_bytes(rdv: &Rendezvous, root_bytes: &[u8], timeout: Timeout) -> Result<Vec<u8>> {
    let deadline = Instant::now() + timeout.0;
    let at = format!("{}:{}", rdv.addr, rdv.port);
    if rdv.rank == 0 {
        let listener = TcpListener::bind(("0.0.0.0", rdv.port)).with_context(|| {
            format!(
                "rank 0 cannot listen on port {} (MASTER_PORT): pick a free port",
                rdv.port
            )
        })?;
        listener.set_nonblocking(true)?;
        let mut served = 0;
        while served + 1 < rdv.world {
            match listener.accept() {
                Ok((mut peer, _)) => {
                    peer.set_nonblocking(false)?;
                    peer.write_all(&(root_bytes.len() as u64).to_le_bytes())?;
                    peer.write_all(root_bytes)?;
                    served += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    wait_or_fail(deadline, || {
                        format!(
                            "rendezvous at {at}: {} of {} ranks arrived within {:?}",
                            served + 1,
                            rdv.world,
                            timeout.0
                        )
                    })?
                }
                Err(e) => return Err(e).context(format!("rendezvous at {at}")),
            }
        }
        return Ok(root_bytes.to_vec());
    }
    let addr = at
        .to_socket_addrs()
        .with_context(|| format!("MASTER_ADDR {} does not resolve", rdv.addr))?
        .next()
        .with_context(|| format!("MASTER_ADDR {} has no address", rdv.addr))?;
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(_) => {
                wait_or_fail(deadline, || {
                    format!("rank {} could not reach rank 0 at {at} within {:?} (MASTER_ADDR/MASTER_PORT)", rdv.rank, timeout.0)
                })?
            }
        }
    };
    stream.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))?;
    let mut len = [0u8; 8];
    stream
        .read_exact(&mut len)
        .with_context(|| format!("rendezvous at {at}"))?;
    let mut bytes = vec![0u8; u64::from_le_bytes(len) as usize];
    stream
        .read_exact(&mut bytes)
        .with_context(|| format!("rendezvous at {at}"))?;
    Ok(bytes)
}

fn wait_or_fail(deadline: Instant, why: impl Fn() -> String) -> Result<()> {
    if Instant::now() >= deadline {
        bail!("{}", why());
    }
    std::thread::sleep(Duration::from_millis(20));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn rank_zero_hands_its_bytes_to_every_rank() {
        let port = free_port();
        let id: Vec<u8> = (0..128).collect();
        let handles: Vec<_> = (0..4)
            .map(|rank| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let rdv = Rendezvous {
                        addr: "127.0.0.1".into(),
                        port,
                        rank,
                        world: 4,
                    };
                    let mine = if rank == 0 { id } else { Vec::new() };
                    exchange_bytes(&rdv, &mine, Timeout(Duration::from_secs(20)))
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap(), id);
        }
    }

    #[test]
    fn a_missing_peer_is_a_timeout_not_a_hang() {
        let rdv = Rendezvous {
            addr: "127.0.0.1".into(),
            port: free_port(),
            rank: 0,
            world: 2,
        };
        let e = exchange_bytes(&rdv, b"id", Timeout(Duration::from_millis(200))).unwrap_err();
        assert!(format!("{e:#}").contains("1 of 2 ranks arrived"), "{e:#}");
    }
}
