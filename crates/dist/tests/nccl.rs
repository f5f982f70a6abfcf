//! NCCL on a GPU host (world size 1): `cargo test --release -p lab-dist --features cuda --
//! --ignored`. Ignored elsewhere: a machine without a GPU has nothing to run it on (CI only
//! checks that the NCCL backend compiles, which needs neither CUDA nor NCCL installed).
#![cfg(feature = "cuda")]

use lab_dist::{connect, Engine, Launch, Reduce, Timeout};

#[test]
#[ignore = "needs a GPU and libnccl.so"]
fn nccl_world_of_one_returns_its_input() {
    let c = connect(&Launch::alone(), Engine::Nccl, Timeout::default()).unwrap();
    assert_eq!((c.engine(), c.world()), ("nccl", 1));
    let input: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25 - 7.0).collect();
    for op in [Reduce::Sum, Reduce::Avg, Reduce::Max] {
        let mut buf = input.clone();
        c.all_reduce(&mut buf, op).unwrap();
        assert_eq!(buf, input, "{op:?}");
    }
    let mut out = vec![f32::NAN; 5];
    c.all_gather(&input[..5], &[5], &mut out).unwrap();
    assert_eq!(out, input[..5]);
    let mut bytes = b"rank 0 decides".to_vec();
    c.broadcast_bytes(&mut bytes, 0).unwrap();
    assert_eq!(bytes, b"rank 0 decides");
}
