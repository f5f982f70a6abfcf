//! The MPI backend on real processes under `mpirun` (CI installs Open MPI with apt).
#![cfg(feature = "mpi")]

use std::process::Command;

fn mpirun(np: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", &np.to_string()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    cmd.arg(env!("CARGO_BIN_EXE_lab-dist-check"));
    cmd
}

#[test]
fn every_collective_matches_host_arithmetic_on_two_and_three_ranks() {
    for np in [2, 3] {
        let out = mpirun(np).arg("check").output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "np {np}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.matches("all collectives agree").count(),
            np,
            "{stdout}"
        );
    }
}

#[test]
fn a_peer_that_stops_answering_is_a_one_line_error_within_the_timeout() {
    let out = mpirun(2)
        .env("LAB_DIST_TIMEOUT_MS", "1500")
        .args(["hang", "1", "20"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("rank 0 of 2: barrier waited"), "{stderr}");
    // Without the deadline rank 0 would wait out rank 1's 20 s nap and the job would succeed.
}
