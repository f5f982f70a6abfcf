//! Times the flash attention kernels, forward and backward, on the GPU device the build has
//! (wgpu: lavapipe on a CPU machine; CUDA in a build with only `--features cuda`):
//!
//!   cargo bench -p lab-kernels --features wgpu --bench attention -- [B H KV T HD [DTYPE [REPS]]]
//!
//! Default shape: x1-50m's attention for one sequence (1 × 12 heads, 4 key/value heads,
//! T = 1024, hd = 64) in f32. Prints the mean time of each direction over REPS launches
//! after one warm-up (which compiles the kernels), and GFLOP/s counting the causal half of
//! the products by FlashAttention-2's convention: 2 forward, 5 backward. The backward runs 7
//! (`dQ` and `dK/dV` each recompute the scores and `dO·vᵀ`), so its figure understates the
//! work done. `LAB_ATTENTION_UNROLL=0|1` picks the loop variant, `LAB_ATTENTION_SHUFFLE=0`
//! one unit a row on CUDA, `LAB_ATTENTION_MMA=1` the tensor-core kernels (CUDA, f16/bf16).
//! lavapipe runs kernels on the CPU, so its figures only compare kernel versions with
//! each other on the same machine.

#![cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused))]

// The kernel tests' device, backend and seeded uploads.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "../tests/common/mod.rs"]
mod common;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod bench {
    use std::time::Instant;

    use burn::tensor::{backend::Backend, DType};
    use lab_kernels::attention;

    use super::common::{device, upload, values, Prim, B};

    /// A bad argument: one line and exit 2, no panic trace.
    fn fail(msg: &str) -> ! {
        eprintln!("attention bench: {msg} (arguments: B H KV T HD [DTYPE [REPS]])");
        std::process::exit(2)
    }

    fn random(shape: [usize; 4], dtype: DType, seed: u64) -> Prim {
        upload(&values(shape.iter().product(), seed, dtype), &shape, dtype)
    }

    pub fn main() {
        let args: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .collect();
        let num = |i: usize, default: usize| {
            args.get(i).map_or(default, |a| {
                a.parse()
                    .unwrap_or_else(|_| fail(&format!("argument {} is {a:?}, not a count", i + 1)))
            })
        };
        let [b, h, kv, t, hd] = [num(0, 1), num(1, 12), num(2, 4), num(3, 1024), num(4, 64)];
        let dtype = match args.get(5).map(String::as_str) {
            None | Some("f32") => DType::F32,
            Some("f16") => DType::F16,
            Some("bf16") => DType::BF16,
            Some(other) => fail(&format!("dtype {other:?}: use f32, f16 or bf16")),
        };
        let reps = num(6, 5);
        let device = device();
        let q = random([b, h, t, hd], dtype, 1);
        let k = random([b, kv, t, hd], dtype, 2);
        let v = random([b, kv, t, hd], dtype, 3);
        let d_out = random([b, h, t, hd], dtype, 4);
        let scale = 1.0 / (hd as f32).sqrt();

        let time = |f: &dyn Fn()| {
            f();
            B::sync(&device).unwrap();
            let start = Instant::now();
            for _ in 0..reps {
                f();
            }
            B::sync(&device).unwrap();
            start.elapsed().as_secs_f64() / reps as f64
        };
        let forward = || attention::forward(q.clone(), k.clone(), v.clone(), scale);
        let fwd_s = time(&|| drop(forward()));
        let fw = forward();
        let bwd_s = time(&|| {
            drop(attention::backward(
                q.clone(),
                k.clone(),
                v.clone(),
                fw.out.clone(),
                fw.lse.clone(),
                d_out.clone(),
                scale,
            ))
        });
        // One causal `[T, T] × hd` product, multiply-adds counted as 2 FLOPs.
        let product = (b * h) as f64 * (t * (t + 1) / 2) as f64 * hd as f64 * 2.0;
        let line = |name: &str, s: f64, products: f64| {
            println!(
                "{name:>8}: {:9.3} ms  {:8.2} GFLOP/s",
                s * 1e3,
                products * product / s / 1e9
            )
        };
        println!("attention B={b} H={h} KV={kv} T={t} hd={hd} {dtype:?}, mean of {reps}");
        line("forward", fwd_s, 2.0);
        line("backward", bwd_s, 5.0);
    }
}

fn main() {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    bench::main();
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    eprintln!("attention bench: build with --features wgpu or --features cuda");
}
