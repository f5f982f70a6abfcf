//! The embedding op: its gradient is burn's own on the CPU, bit for bit (the same node, the
//! same `embedding_backward`), and on the GPU backend (`Autodiff<Fusion<CubeBackend>>`, as the
//! trainer runs it; lavapipe in CI) lab-kernels' kernel gives those same bits: both sum each
//! row's positions in ascending order from zero in f32.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{backend::AutodiffBackend, Int, Tensor, TensorData};

use crate::common;
use common::{bits, floats};

/// `(rows, table's gradient)` of the op, or of burn's `module::embedding` when `burns`, for
/// the loss `Σ rows · weights_of_loss` (a different weight per element, so every position's
/// gradient differs).
fn run<B: AutodiffBackend + lab_ops::FusedEmbedding>(
    [vocab, d]: [usize; 2],
    ids: &[i32],
    [batch, t]: [usize; 2],
    burns: bool,
) -> (Vec<f32>, Vec<f32>) {
    let dev = Default::default();
    let table = Tensor::<B, 1>::from_data(
        TensorData::new(floats(vocab * d, 1, 1.0), [vocab * d]),
        &dev,
    )
    .reshape([vocab, d])
    .require_grad();
    let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids.to_vec(), [batch * t]), &dev)
        .reshape([batch, t]);
    let rows = if burns {
        burn::tensor::module::embedding(table.clone(), ids)
    } else {
        lab_ops::embedding(table.clone(), ids)
    };
    let upstream = Tensor::<B, 1>::from_data(
        TensorData::new(floats(batch * t * d, 2, 1.0), [batch * t * d]),
        &dev,
    )
    .reshape([batch, t, d]);
    let grads = (rows.clone() * upstream).sum().backward();
    let grad = table.grad(&grads).expect("the table's gradient");
    (
        rows.into_data().to_vec().unwrap(),
        grad.into_data().to_vec().unwrap(),
    )
}

/// Ids in `0..vocab`, one in three the same (a frequent word).
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<i32> {
    floats(n, seed, 1.0)
        .iter()
        .enumerate()
        .map(|(i, x)| if i % 3 == 0 { vocab / 2 } else { ((x + 1.0) / 2.0 * vocab as f32) as usize % vocab } as i32)
        .collect()
}

#[test]
fn the_cpu_gradient_is_burns_bit_for_bit() {
    let ids = ids(2 * 37, 50, 3);
    let ours = run::<Autodiff<Flex>>([50, 12], &ids, [2, 37], false);
    let burns = run::<Autodiff<Flex>>([50, 12], &ids, [2, 37], true);
    assert_eq!(bits(&ours.0), bits(&burns.0), "rows");
    assert_eq!(bits(&ours.1), bits(&burns.1), "table's gradient");
    // The frequent word's row sums a third of the positions, not nothing.
    assert!(ours.1[25 * 12..26 * 12].iter().all(|g| *g != 0.0));
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use super::*;
    use proptest::prelude::*;

    type G = Autodiff<common::Gpu>;

    #[test]
    fn the_gpu_kernel_gives_the_cpus_bits() {
        // Three slices of the kernel's 512 rows; 2 × 300 positions (two tiles and a part).
        let (vocab, d) = (1100, 24);
        let ids = ids(600, vocab, 4);
        let cpu = run::<Autodiff<Flex>>([vocab, d], &ids, [2, 300], false);
        let gpu = run::<G>([vocab, d], &ids, [2, 300], false);
        assert_eq!(bits(&gpu.0), bits(&cpu.0), "rows");
        assert_eq!(bits(&gpu.1), bits(&cpu.1), "table's gradient");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(6))]

        #[test]
        fn random_shapes_give_the_cpus_bits(
            vocab in 1usize..1600, // up to 4 of the kernel's slices
            d in 1usize..20,
            batch in 1usize..3,
            t in 1usize..90,
            seed in 0u64..1000,
        ) {
            let ids = ids(batch * t, vocab, seed);
            let cpu = run::<Autodiff<Flex>>([vocab, d], &ids, [batch, t], false);
            let gpu = run::<G>([vocab, d], &ids, [batch, t], false);
            prop_assert_eq!(bits(&gpu.1), bits(&cpu.1));
        }
    }
}
