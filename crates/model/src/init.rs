//! Seeded, backend-independent initialization: every parameter is drawn on the host from a
//! ChaCha stream keyed by (seed, parameter path), so the same seed gives the same weights on
//! every backend and whatever order the modules are built in.

use burn::module::{Param, ParamId};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// A stream of seeded values for one parameter.
fn rng_for(seed: u64, path: &str) -> ChaCha8Rng {
    // FNV-1a of the path, mixed with the seed: a stable key per parameter.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    ChaCha8Rng::seed_from_u64(seed ^ h.rotate_left(17))
}

/// The `n` values of parameter `path` drawn from normal(0, std), in row-major order: what
/// [`normal`] fills the parameter with (a tokenizer swap draws rows it cannot compose).
pub fn normal_values(seed: u64, path: &str, n: usize, std: f64) -> Vec<f32> {
    let mut rng = rng_for(seed, path);
    let dist = Normal::new(0.0f32, std as f32).expect("std > 0");
    (0..n).map(|_| dist.sample(&mut rng)).collect()
}

/// A `[rows, cols]` parameter drawn from normal(0, std), lazily: drawn on first use, so a
/// model whose weights are about to be loaded (a resume) never draws them. The values do not
/// depend on when that happens.
pub fn normal<B: Backend>(
    seed: u64,
    path: &str,
    shape: [usize; 2],
    std: f64,
    device: &B::Device,
) -> Param<Tensor<B, 2>> {
    let path = path.to_string();
    let draw = move |device: &B::Device, require_grad: bool| {
        let values = normal_values(seed, &path, shape[0] * shape[1], std);
        Tensor::from_data(TensorData::new(values, shape), device).set_require_grad(require_grad)
    };
    Param::uninitialized(ParamId::new(), draw, device.clone(), true, shape.into())
}

/// A `[n]` parameter of ones (RMSNorm gains).
pub fn ones<B: Backend>(n: usize, device: &B::Device) -> Param<Tensor<B, 1>> {
    Param::initialized(ParamId::new(), Tensor::ones([n], device).require_grad())
}
