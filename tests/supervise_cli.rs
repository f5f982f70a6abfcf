//! `lab supervise` on plain processes (the mpirun cases are in parallel_e2e).

use crate::common::*;

/// A job whose leader dies leaves a process of its group behind (a launcher's rank, here a
/// `sleep`): the supervisor ends it before the restart, which would otherwise meet it (and
/// the run folder's lock it holds). The restarted job exits 7 when it finds it alive.
#[test]
fn a_restart_waits_for_what_the_dead_job_left_running() {
    let tmp = tempfile::tempdir().unwrap();
    let pid_file = tmp.path().join("straggler.pid");
    let job = format!(
        r#"if [ "$LAB_RESTART_COUNT" = 0 ]; then sleep 60 & echo $! > {f}; exit 1; fi
p=$(cat {f}); if [ -e /proc/$p ] && [ "$(cut -d' ' -f3 /proc/$p/stat)" != Z ]; then exit 7; fi"#,
        f = pid_file.display()
    );
    let out = lab()
        .args(["supervise", "--max-restarts", "1", "--backoff-s", "0", "--"])
        .args(["sh", "-c", &job])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("restart 1 of 1"), "{stderr}");
}
