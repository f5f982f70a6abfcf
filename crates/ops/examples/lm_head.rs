//! Times the LM head + cross-entropy alone (forward + backward) at the tiny config's shape,
//! fused against the plain composition. Not a test: a tool for profiling this op.
//!
//!     RAYON_NUM_THREADS=2 cargo run --release -p lab-ops --example lm_head -- [N d V chunk reps]

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Distribution, Int, Tensor};
use lab_ops::{lm_head_loss_chunked, lm_head_loss_unfused, DEFAULT_CHUNK_ROWS};
use std::time::Instant;

type B = Autodiff<Flex>;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (n, d, v) = (arg(0, 1024), arg(1, 128), arg(2, 50257));
    let (chunk, reps) = (arg(3, DEFAULT_CHUNK_ROWS), arg(4, 5));
    let dev = Default::default();
    let hidden = Tensor::<B, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &dev);
    let weight = Tensor::<B, 2>::random([d, v], Distribution::Normal(0.0, 0.02), &dev);
    let targets = Tensor::<B, 1, Int>::random([n], Distribution::Uniform(0.0, v as f64), &dev);
    for fused in [true, false] {
        let mut fwd = Vec::new();
        let mut bwd = Vec::new();
        for _ in 0..reps + 1 {
            let h = hidden.clone().require_grad();
            let w = weight.clone().require_grad();
            let t0 = Instant::now();
            let loss = if fused {
                lm_head_loss_chunked(h.clone(), w.clone(), targets.clone(), chunk)
            } else {
                lm_head_loss_unfused(h.clone(), w.clone(), targets.clone())
            };
            let _ = loss.clone().into_scalar();
            let t1 = Instant::now();
            let grads = loss.backward();
            let _ = w.grad(&grads).unwrap().into_data();
            let t2 = Instant::now();
            fwd.push((t1 - t0).as_secs_f64() * 1e3);
            bwd.push((t2 - t1).as_secs_f64() * 1e3);
        }
        let med = |v: &mut Vec<f64>| {
            v.remove(0); // warm-up
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{:8} N={n} d={d} V={v} chunk={chunk}: forward {:7.1} ms  backward {:7.1} ms (median of {reps})",
            if fused { "fused" } else { "unfused" },
            med(&mut fwd),
            med(&mut bwd)
        );
    }
}
