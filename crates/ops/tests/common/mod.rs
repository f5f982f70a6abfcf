//! What the elementwise-op tests (RoPE, SwiGLU, RMSNorm) share: seeded inputs and weights, a
//! comparison against fp64 references, and bit patterns; and the GPU tests' backend.
#![allow(dead_code)] // each test file uses some of these

/// The GPU backend of the GPU tests: wgpu (lavapipe in CI) when built, else CUDA.
#[cfg(feature = "wgpu")]
pub type Gpu = burn::backend::Wgpu;
#[cfg(all(feature = "cuda", not(feature = "wgpu")))]
pub type Gpu = burn::backend::Cuda;

/// Sets the route of this process's products, before a test runs one: lab's op around cubecl's
/// matmul on wgpu and, built for CUDA alone (a GPU host), cuBLASLt. A process chooses once,
/// so every test that multiplies through the op (the projections, the LM-head loss) calls
/// this first. Returns the choice in force.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn choose_products() -> lab_kernels::gemm::Choice {
    use lab_kernels::gemm::Choice;
    let want = if cfg!(feature = "wgpu") {
        Choice::Op
    } else {
        Choice::Vendor
    };
    want.set().map_or_else(|c| c, |()| want)
}

/// xorshift64*: values in `[-scale, scale)` that do not depend on burn's global RNG.
pub fn floats(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32;
            (u * 2.0 - 1.0) * scale
        })
        .collect()
}

#[path = "../../../../kernels/tests/common/close.rs"]
mod close;
#[allow(unused_imports)] // the GPU tests' only
pub use close::f32_products;

/// Every element within `tol · (1 + |want|)`; NaN fails.
pub fn assert_close(name: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{name}[{i}]: {g} vs {w} (tolerance {tol})"
        );
    }
}

/// Every element within `tol` times the largest reference magnitude (no floor: for tensors
/// whose values are all small, such as the loss's gradients, ~1/N); NaN fails.
pub fn assert_close_to_peak(name: &str, got: &[f32], want: &[f64], tol: f64) {
    close::assert_close_from(name, got, want, tol, f64::MIN_POSITIVE);
}

/// Per row of `hidden [N, d] @ weight [d, V]`, `logsumexp(logits) − logits[target]` in fp64.
pub fn token_losses_fp64(
    hidden: &[f32],
    weight: &[f32],
    targets: impl IntoIterator<Item = usize>,
    v: usize,
) -> Vec<f64> {
    let d = weight.len() / v;
    targets
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let logit = |j: usize| -> f64 {
                (0..d)
                    .map(|k| hidden[i * d + k] as f64 * weight[k * v + j] as f64)
                    .sum()
            };
            let logits: Vec<f64> = (0..v).map(logit).collect();
            let m = logits.iter().cloned().fold(f64::MIN, f64::max);
            let lse = m + logits.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            lse - logits[t]
        })
        .collect()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A `[rows, cols]` weight of seeded values in ±0.5 that wants its gradient.
pub fn weight<A: burn::tensor::backend::AutodiffBackend>(
    seed: u64,
    shape: [usize; 2],
) -> burn::tensor::Tensor<A, 2> {
    let v = floats(shape[0] * shape[1], seed, 0.5);
    burn::tensor::Tensor::from_data(burn::tensor::TensorData::new(v, shape), &Default::default())
        .require_grad()
}

/// The small block's input: `[6, 8]` seeded values in ±1, no gradient wanted.
pub fn block_input<A: burn::tensor::backend::AutodiffBackend>() -> burn::tensor::Tensor<A, 2> {
    let v = floats(6 * 8, 1, 1.0);
    burn::tensor::Tensor::from_data(
        burn::tensor::TensorData::new(v, [6, 8]),
        &Default::default(),
    )
}
