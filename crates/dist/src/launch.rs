//! Who this process is in a job: its rank, the world size and the launcher that started it,
//! read from the environment each launcher sets.

use anyhow::{bail, Context, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Started by hand: one rank.
    Alone,
    /// `mpirun` / `mpiexec` (Open MPI's `OMPI_COMM_WORLD_*`).
    Mpirun,
    /// `torchrun --no-python lab train …` (`RANK`, `WORLD_SIZE`, …).
    Torchrun,
    /// Slurm `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, …).
    Slurm,
}

impl Launcher {
    pub fn name(&self) -> &'static str {
        match self {
            Launcher::Alone => "a single process",
            Launcher::Mpirun => "mpirun",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "srun",
        }
    }
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: usize,
    pub world: usize,
    /// The rank among the processes on this node (picks the GPU).
    pub local_rank: usize,
    /// `MASTER_ADDR:MASTER_PORT`, where a rendezvous listens (NCCL's unique id).
    pub master: Option<(String, u16)>,
    /// How many times the job was relaunched (`lab supervise` or torchrun's `--max-restarts`).
    pub restarts: u32,
}

impl Launch {
    /// One process on its own.
    pub fn alone() -> Self {
        Launch {
            launcher: Launcher::Alone,
            rank: 0,
            world: 1,
            local_rank: 0,
            master: None,
            restarts: 0,
        }
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the launch from `var` (the environment, or a map in tests). Open MPI's variables
    /// win (an `mpirun` inside a Slurm allocation also sees Slurm's), then torchrun's, then
    /// Slurm's.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let (launcher, [rank, world, local]) = if var("OMPI_COMM_WORLD_SIZE").is_some() {
            let names = [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ];
            (Launcher::Mpirun, names)
        } else if var("WORLD_SIZE").is_some() && var("RANK").is_some() {
            (Launcher::Torchrun, ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
        } else if var("SLURM_STEP_ID").is_some() && var("SLURM_NTASKS").is_some() {
            // Only an `srun` step is a launch: a batch script also sees SLURM_NTASKS, and a
            // bare `lab train` in it is one process.
            (
                Launcher::Slurm,
                ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"],
            )
        } else {
            half_a_torchrun_launch(&var)?;
            let mut alone = Self::alone();
            alone.restarts = restarts(&var)?;
            return Ok(alone);
        };
        let number = |name: &str, default: Option<usize>| -> Result<usize> {
            match (var(name), default) {
                (Some(v), _) => v.trim().parse().with_context(|| {
                    format!(
                        "{} set {name}={v:?}, which is not a number",
                        launcher.name()
                    )
                }),
                (None, Some(d)) => Ok(d),
                (None, None) => bail!("{} did not set {name}", launcher.name()),
            }
        };
        let (rank, world) = (number(rank, None)?, number(world, None)?);
        if world == 0 || rank >= world {
            bail!(
                "{} set rank {rank} in a world of {world}; a rank must be below the world size",
                launcher.name()
            );
        }
        Ok(Launch {
            launcher,
            rank,
            world,
            local_rank: number(local, Some(0))?,
            master: master(&var, launcher)?,
            restarts: restarts(&var)?,
        })
    }
}

/// `MASTER_ADDR:MASTER_PORT`; under Slurm without them, the first node of the job and a port
/// derived from the job id (as torchtitan's Slurm scripts do).
fn master(
    var: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
) -> Result<Option<(String, u16)>> {
    let port = match var("MASTER_PORT") {
        Some(p) => Some(p.trim().parse::<u16>().with_context(|| {
            format!("MASTER_PORT={p:?} is not a port number; set it to a free port such as 29500")
        })?),
        None => None,
    };
    if let Some(addr) = var("MASTER_ADDR") {
        return Ok(Some((addr, port.unwrap_or(29500))));
    }
    if launcher != Launcher::Slurm {
        return Ok(None);
    }
    let host = var("SLURM_JOB_NODELIST")
        .or_else(|| var("SLURM_NODELIST"))
        .and_then(|list| first_host(&list));
    let job_port = var("SLURM_JOB_ID")
        .and_then(|id| id.parse::<u32>().ok())
        .map(|id| 20000 + (id % 10000) as u16);
    Ok(host.map(|h| (h, port.or(job_port).unwrap_or(29500))))
}

/// The first host of a Slurm node list: `gpu[003-005,010],cpu01` → `gpu003`.
fn first_host(list: &str) -> Option<String> {
    let first = list.split(',').next()?.trim();
    match first.split_once('[') {
        None => (!first.is_empty()).then(|| first.to_string()),
        Some((prefix, rest)) => {
            let range = rest.split([',', ']']).next()?;
            let start = range.split('-').next()?;
            Some(format!("{prefix}{start}"))
        }
    }
}

/// RANK without WORLD_SIZE, or WORLD_SIZE without RANK: a launcher set half of torchrun's
/// variables, and N copies would each train alone. Refused, unless what is set says one
/// process (RANK=0, WORLD_SIZE=1).
fn half_a_torchrun_launch(var: &impl Fn(&str) -> Option<String>) -> Result<()> {
    let (rank, world) = (var("RANK"), var("WORLD_SIZE"));
    let (set, missing) = match (&rank, &world) {
        (Some(r), None) if r.trim() != "0" => ("RANK", "WORLD_SIZE"),
        (None, Some(w)) if w.trim() != "1" => ("WORLD_SIZE", "RANK"),
        _ => return Ok(()),
    };
    bail!("{set} is set but {missing} is not: a torchrun-style launch needs both; set both, or unset {set} for one process")
}

/// The relaunch count: `lab supervise` sets `LAB_RESTART_COUNT`, torchrun
/// `TORCHELASTIC_RESTART_COUNT`.
fn restarts(var: &impl Fn(&str) -> Option<String>) -> Result<u32> {
    match var("LAB_RESTART_COUNT").or_else(|| var("TORCHELASTIC_RESTART_COUNT")) {
        Some(v) => v
            .trim()
            .parse()
            .with_context(|| format!("restart count {v:?} is not a number")),
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(pairs: &[(&str, &str)]) -> Result<Launch> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_vars(|k| env.get(k).cloned())
    }

    #[test]
    fn torchrun_variables() {
        let l = launch(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.2"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ])
        .unwrap();
        assert_eq!(l.launcher, Launcher::Torchrun);
        assert_eq!((l.rank, l.world, l.local_rank, l.restarts), (3, 8, 1, 2));
        assert_eq!(l.master, Some(("10.0.0.2".into(), 29400)));
    }

    #[test]
    fn mpirun_wins_over_slurm_inside_an_allocation() {
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap();
        assert_eq!(l.launcher, Launcher::Mpirun);
        assert_eq!((l.rank, l.world, l.local_rank), (1, 2, 1));
        assert_eq!(l.master, None);
    }

    #[test]
    fn slurm_variables_and_the_first_node_as_master() {
        let l = launch(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "256"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_LOCALID", "5"),
            ("SLURM_JOB_NODELIST", "gpu[003-005,010],cpu01"),
            ("SLURM_JOB_ID", "123456"),
        ])
        .unwrap();
        assert_eq!(l.launcher, Launcher::Slurm);
        assert_eq!((l.rank, l.world, l.local_rank), (5, 256, 5));
        assert_eq!(l.master, Some(("gpu003".into(), 23456)));
    }

    #[test]
    fn nothing_set_is_one_process_and_supervise_counts_restarts() {
        assert_eq!(launch(&[]).unwrap(), Launch::alone());
        // The batch script of an sbatch job is not a job step.
        let batch = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "256"),
            ("SLURM_JOB_ID", "7"),
        ];
        assert_eq!(launch(&batch).unwrap(), Launch::alone());
        assert_eq!(launch(&[("LAB_RESTART_COUNT", "4")]).unwrap().restarts, 4);
    }

    #[test]
    fn half_a_torchrun_environment_is_refused_unless_it_says_one_process() {
        for vars in [[("RANK", "1")], [("WORLD_SIZE", "2")]] {
            let e = launch(&vars).unwrap_err();
            assert!(format!("{e:#}").contains("set both"), "{e:#}");
        }
        assert_eq!(launch(&[("RANK", "0")]).unwrap(), Launch::alone());
        assert_eq!(launch(&[("WORLD_SIZE", "1")]).unwrap(), Launch::alone());
    }

    #[test]
    fn bad_values_are_one_line_errors_naming_the_variable() {
        let e = launch(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(format!("{e:#}").contains("RANK=\"x\""), "{e:#}");
        let e = launch(&[("RANK", "2"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(format!("{e:#}").contains("below the world size"), "{e:#}");
        let e = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "99999"),
        ])
        .unwrap_err();
        assert!(format!("{e:#}").contains("MASTER_PORT"), "{e:#}");
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("node01").as_deref(), Some("node01"));
        assert_eq!(first_host("a[7,9]").as_deref(), Some("a7"));
        assert_eq!(first_host(""), None);
    }
}
