//! The projection op `x · w`: its autodiff node against burn's matmul node (bit for bit on
//! the CPU, where both run Flex's matmul) and against fp64 host math, with inputs that want
//! gradients or not and inputs that are transposed views (as the backward passes them). With
//! `wgpu`, the op as the GPU backends run it (its node, its Fusion custom op, cubecl's matmul)
//! under `LAB_MATMUL=op`'s choice, on lavapipe in CI; built with `cuda` alone, on a GPU host,
//! the same on cuBLASLt (`LAB_MATMUL=cublaslt`'s choice), bf16 included. The joined product
//! `x · [a | b]` and `x · [a | b | c]` (`project_joined`: the feed-forward's gate and up, the
//! attention's q, k and v) against burn's matmul of the joined weight, and its gradients to
//! each weight.

use burn::backend::{autodiff::checkpoint::strategy::NoCheckpointing, Autodiff, Flex};
use burn::tensor::{
    backend::{AutodiffBackend, Backend},
    DType, FloatDType, Tensor, TensorData, TensorPrimitive,
};
use lab_ops::{cast_to, projection_node, FusedProjection};
use proptest::prelude::*;

use crate::common;
use common::{assert_close, bits, floats};

type B = Autodiff<Flex>;
const F32: FloatDType = FloatDType::F32;

/// `x · w` through lab's node, whatever the backend would choose.
fn node(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    let y = projection_node::<Flex, NoCheckpointing>(
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
    );
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

fn tensor<Be: Backend>(values: &[f32], shape: [usize; 2], device: &Be::Device) -> Tensor<Be, 2> {
    Tensor::from_data(TensorData::new(values.to_vec(), shape), device)
}

fn values<Be: Backend>(t: Tensor<Be, 2>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// Products of `[n, k] · [k, m]` row-major matrices in fp64: `x·w`, `g·wᵀ`, `xᵀ·g`.
struct Reference {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
}

fn reference(x: &[f32], w: &[f32], g: &[f32], [n, k, m]: [usize; 3]) -> Reference {
    let at = |v: &[f32], i: usize| v[i] as f64;
    let sum = |len: usize, f: &dyn Fn(usize) -> f64| (0..len).map(f).sum::<f64>();
    Reference {
        y: (0..n * m)
            .map(|o| sum(k, &|l| at(x, o / m * k + l) * at(w, l * m + o % m)))
            .collect(),
        dx: (0..n * k)
            .map(|o| sum(m, &|j| at(g, o / k * m + j) * at(w, o % k * m + j)))
            .collect(),
        dw: (0..k * m)
            .map(|o| sum(n, &|i| at(x, i * k + o / m) * at(g, i * m + o % m)))
            .collect(),
    }
}

/// Seeded `x [n, k]`, `w [k, m]` and an upstream gradient `g [n, m]`.
fn inputs([n, k, m]: [usize; 3], seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        floats(n * k, seed, 1.0),
        floats(k * m, seed + 1, 0.5),
        floats(n * m, seed + 2, 1.0),
    )
}

/// `y`, `dx` and `dw` of `product(x, w)` for the upstream gradient `g`, every tensor in
/// `dtype`, with `x` given as the transposed view of its transpose when `x_as_view`.
fn run<Be: AutodiffBackend>(
    product: impl Fn(Tensor<Be, 2>, Tensor<Be, 2>) -> Tensor<Be, 2>,
    (x, w, g): (&[f32], &[f32], &[f32]),
    [n, k, m]: [usize; 3],
    dtype: FloatDType,
    x_as_view: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let device = Default::default();
    let stored = |v: &[f32], shape| cast_to(tensor::<Be>(v, shape, &device), dtype);
    let x = if x_as_view {
        let xt: Vec<f32> = (0..k * n).map(|o| x[o % n * k + o / n]).collect();
        stored(&xt, [k, n]).require_grad()
    } else {
        stored(x, [n, k]).require_grad()
    };
    let w = stored(w, [k, m]).require_grad();
    let x_used = if x_as_view {
        x.clone().transpose()
    } else {
        x.clone()
    };
    let y = product(x_used, w.clone());
    assert_eq!(y.dtype(), DType::from(dtype));
    let grads = (y.clone() * stored(g, [n, m])).sum().backward();
    let dx = x.grad(&grads).expect("x's gradient");
    let dx = if x_as_view { dx.transpose() } else { dx };
    (
        values(y),
        values(dx),
        values(w.grad(&grads).expect("w's gradient")),
    )
}

/// `product`'s `y`, `dx` and `dw` have the bits of burn's matmul and are within 1e-5 of fp64,
/// with `x` stored and as a transposed view.
fn assert_burns_bits_and_fp64(
    product: impl Fn(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2>,
    dims: [usize; 3],
    seed: u64,
) {
    for x_as_view in [false, true] {
        let (x, w, g) = inputs(dims, seed);
        let ours = run::<B>(&product, (&x, &w, &g), dims, F32, x_as_view);
        let burns = run::<B>(|x, w| x.matmul(w), (&x, &w, &g), dims, F32, x_as_view);
        assert_eq!(bits(&ours.0), bits(&burns.0), "y of {dims:?}");
        assert_eq!(bits(&ours.1), bits(&burns.1), "dx of {dims:?}");
        assert_eq!(bits(&ours.2), bits(&burns.2), "dw of {dims:?}");
        let want = reference(&x, &w, &g, dims);
        assert_close("y", &ours.0, &want.y, 1e-5);
        assert_close("dx", &ours.1, &want.dx, 1e-5);
        assert_close("dw", &ours.2, &want.dw, 1e-5);
    }
}

#[test]
fn the_node_matches_burns_matmul_bit_for_bit_and_fp64() {
    for (dims, seed) in [
        ([1, 1, 1], 1),
        ([5, 7, 3], 2),
        ([33, 64, 17], 3),
        ([8, 96, 130], 4),
    ] {
        assert_burns_bits_and_fp64(node, dims, seed);
    }
}

#[test]
fn only_tracked_inputs_get_gradients() {
    let dims @ [n, k, m] = [4, 6, 5];
    let (x, w, g) = inputs(dims, 9);
    let want = reference(&x, &w, &g, dims);
    let device = Default::default();
    // A frozen weight: x's gradient only.
    let xt = tensor::<B>(&x, [n, k], &device).require_grad();
    let y = node(xt.clone(), tensor::<B>(&w, [k, m], &device));
    let grads = (y * tensor::<B>(&g, [n, m], &device)).sum().backward();
    assert_close("dx", &values(xt.grad(&grads).unwrap()), &want.dx, 1e-5);
    // A constant input (the first layer's tokens, say): w's gradient only.
    let wt = tensor::<B>(&w, [k, m], &device).require_grad();
    let y = node(tensor::<B>(&x, [n, k], &device), wt.clone());
    let grads = (y * tensor::<B>(&g, [n, m], &device)).sum().backward();
    assert_close("dw", &values(wt.grad(&grads).unwrap()), &want.dw, 1e-5);
}

#[test]
fn the_cpu_keeps_burns_own_matmul_node() {
    // Flex has no vendor BLAS: its projections stay burn's matmul whatever LAB_MATMUL says.
    assert!(!<Flex as FusedProjection>::projects_on_op());
    assert!(!<B as FusedProjection>::projects_on_op());
}

/// `x · w` as `project_joined` of `w`'s column blocks cut at `cuts` (increasing, inside `w`):
/// `w`'s gradient is its blocks' gradients joined back by the narrows' backward (zeros added,
/// exactly).
fn joined(cuts: Vec<usize>) -> impl Fn(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2> {
    move |x, w| lab_ops::project_joined(x, blocks(&w, &cuts))
}

/// `w`'s column blocks between `0`, `cuts` and its width.
fn blocks<Bk: Backend>(w: &Tensor<Bk, 2>, cuts: &[usize]) -> Vec<Tensor<Bk, 2>> {
    let m = w.dims()[1];
    let edges: Vec<usize> = [&[0][..], cuts, &[m]].concat();
    edges
        .windows(2)
        .map(|e| w.clone().narrow(1, e[0], e[1] - e[0]))
        .collect()
}

#[test]
fn the_joined_product_is_burns_matmul_of_the_joined_weight_bit_for_bit() {
    for (dims, seed, cuts) in [
        ([1, 1, 2], 1, vec![1]),
        ([5, 7, 3], 2, vec![2]),
        ([5, 7, 3], 5, vec![1, 2]),
        ([33, 64, 17], 3, vec![9]),
        ([8, 96, 130], 4, vec![65]),
        // The attention's q, k and v at x1-50m's proportions (12 : 4 : 4 heads).
        ([8, 96, 120], 6, vec![72, 96]),
    ] {
        assert_burns_bits_and_fp64(joined(cuts), dims, seed);
    }
}

/// Which of `x` and the weights want a gradient decides which get one, each the right one:
/// `x` all of `g · wᵀ`, each weight its columns of `xᵀ · g`; with two weights and with three.
#[test]
fn the_joined_product_gives_each_tracked_input_its_gradient() {
    let dims @ [n, k, m] = [4, 6, 5];
    let (x, w, g) = inputs(dims, 11);
    let want = reference(&x, &w, &g, dims);
    let device = Default::default();
    let columns = |from: usize, to: usize| -> Vec<f32> {
        (0..k)
            .flat_map(|r| w[r * m + from..r * m + to].to_vec())
            .collect()
    };
    let want_columns = |from: usize, to: usize| -> Vec<f64> {
        let width = to - from;
        (0..k * width)
            .map(|o| want.dw[o / width * m + from + o % width])
            .collect()
    };
    let leaf = |v: &[f32], shape, wants: bool| {
        let t = tensor::<B>(v, shape, &device);
        if wants {
            t.require_grad()
        } else {
            t
        }
    };
    let cases: [(&[usize], &[bool]); 7] = [
        (&[0, 2, 5], &[true, false, false]),
        (&[0, 2, 5], &[false, true, false]),
        (&[0, 2, 5], &[false, false, true]),
        (&[0, 2, 5], &[true, true, true]),
        (&[0, 1, 3, 5], &[false, false, false, true]),
        (&[0, 1, 3, 5], &[false, true, false, true]),
        (&[0, 1, 3, 5], &[true, true, true, true]),
    ];
    for (edges, wants) in cases {
        let xt = leaf(&x, [n, k], wants[0]);
        let weights: Vec<_> = edges
            .windows(2)
            .zip(&wants[1..])
            .map(|(e, &w)| leaf(&columns(e[0], e[1]), [k, e[1] - e[0]], w))
            .collect();
        let y = lab_ops::project_joined(xt.clone(), weights.clone());
        let grads = (y * tensor::<B>(&g, [n, m], &device)).sum().backward();
        let what = format!("edges {edges:?} tracked {wants:?}");
        assert_eq!(xt.grad(&grads).is_some(), wants[0], "{what}");
        if let Some(dx) = xt.grad(&grads) {
            assert_close(&format!("dx {what}"), &values(dx), &want.dx, 1e-5);
        }
        for (i, (w, e)) in weights.iter().zip(edges.windows(2)).enumerate() {
            assert_eq!(w.grad(&grads).is_some(), wants[i + 1], "weight {i} {what}");
            if let Some(dw) = w.grad(&grads) {
                let want_w = want_columns(e[0], e[1]);
                assert_close(&format!("dw {i} {what}"), &values(dw), &want_w, 1e-5);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn the_joined_product_matches_fp64_on_any_shape(
        n in 1usize..12, k in 1usize..12, m in 3usize..12, cut in 1usize..100,
        second_cut in proptest::option::of(1usize..100), seed in 0u64..1000, view: bool,
    ) {
        // One cut in 1..m (two weights), or two distinct ones (three).
        let mut cuts = vec![1 + cut % (m - 1)];
        cuts.extend(second_cut.map(|c| 1 + c % (m - 1)).filter(|c| *c != cuts[0]));
        cuts.sort_unstable();
        let (x, w, g) = inputs([n, k, m], seed);
        let (y, dx, dw) = run::<B>(joined(cuts), (&x, &w, &g), [n, k, m], F32, view);
        let want = reference(&x, &w, &g, [n, k, m]);
        assert_close("y", &y, &want.y, 1e-5);
        assert_close("dx", &dx, &want.dx, 1e-5);
        assert_close("dw", &dw, &want.dw, 1e-5);
    }


    #[test]
    fn the_node_matches_fp64_on_any_shape(
        n in 1usize..12, k in 1usize..12, m in 1usize..12, seed in 0u64..1000, view: bool,
    ) {
        let (x, w, g) = inputs([n, k, m], seed);
        let (y, dx, dw) = run::<B>(node, (&x, &w, &g), [n, k, m], F32, view);
        let want = reference(&x, &w, &g, [n, k, m]);
        assert_close("y", &y, &want.y, 1e-5);
        assert_close("dx", &dx, &want.dx, 1e-5);
        assert_close("dw", &dw, &want.dw, 1e-5);
    }
}

/// The op on the GPU backend: `Autodiff<Fusion<CubeBackend>>`, as the trainer runs it.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu {
    use super::*;
    use lab_kernels::gemm::Choice;

    type G = Autodiff<common::Gpu>;

    #[test]
    fn the_op_through_fusion_matches_fp64() {
        // On wgpu the op around cubecl's matmul; built for CUDA alone (a GPU host), cuBLASLt.
        let want = if cfg!(feature = "wgpu") {
            Choice::Op
        } else {
            Choice::Vendor
        };
        assert_eq!(
            common::choose_products(),
            want,
            "this binary's products run through the op"
        );
        assert!(<G as FusedProjection>::projects_on_op(), "the op is taken");
        // f16 keeps ~11 bits, bf16 ~8; sums of up to 64 terms below 1 in f32 accumulators. f32
        // computes as TF32 on CUDA, whose cuBLASLt route declines f32 (`f32_products`).
        // Few cases: each new shape and layout compiles kernels, slowly on lavapipe.
        let f32_tol = common::f32_products(1e-4);
        let mut cases = vec![
            (FloatDType::F32, f32_tol, [5, 7, 3], false),
            (FloatDType::F32, f32_tol, [5, 7, 3], true),
            (FloatDType::F32, f32_tol, [33, 64, 17], false),
            (FloatDType::F16, 2e-2, [33, 64, 17], true),
        ];
        if cfg!(not(feature = "wgpu")) {
            cases.push((FloatDType::BF16, 6e-2, [33, 64, 17], true));
        }
        let vendor = want == Choice::Vendor;
        for (seed, (dtype, tol, dims, x_as_view)) in cases.into_iter().enumerate() {
            let (x, w, g) = inputs(dims, seed as u64);
            let ran = lab_kernels::gemm::vendor_counts().ran;
            let (y, dx, dw) = run::<G>(lab_ops::project, (&x, &w, &g), dims, dtype, x_as_view);
            let want = reference(&x, &w, &g, dims);
            let what = format!("{dtype:?} {dims:?} view {x_as_view}");
            // y, dx and dw: three products on cuBLASLt at f16 and bf16, where one it declined
            // would run on cubecl's matmul, pass, and leave a GPU timing of cubecl. The count is
            // the process's, which other tests add to: this shows that the op's products reach
            // cuBLASLt through Fusion and autodiff; gemm.rs checks each product by itself.
            let ran_here = lab_kernels::gemm::vendor_counts().ran - ran;
            if vendor && dtype != FloatDType::F32 {
                assert!(
                    ran_here >= 3,
                    "{what}: cuBLASLt ran {ran_here} of its 3 products"
                );
            }
            assert_close(&format!("y {what}"), &y, &want.y, tol);
            assert_close(&format!("dx {what}"), &dx, &want.dx, tol);
            assert_close(&format!("dw {what}"), &dw, &want.dw, tol);
        }
    }

    /// The joined product through Fusion, of two weights (the feed-forward's gate and up) and
    /// of three (the attention's q, k and v): the weights joined on the device, forward and
    /// again in backward, the gradient's column blocks to each.
    #[test]
    fn the_joined_product_through_fusion_matches_fp64() {
        // Its products go through the op too: fix the process's choice before the first.
        common::choose_products();
        let f32_tol = common::f32_products(1e-4);
        for (seed, (dtype, tol, x_as_view, cuts)) in [
            (FloatDType::F32, f32_tol, false, vec![5]),
            (FloatDType::F16, 2e-2, true, vec![5]),
            (FloatDType::F32, f32_tol, true, vec![5, 11]),
            (FloatDType::F16, 2e-2, false, vec![9, 13]),
        ]
        .into_iter()
        .enumerate()
        {
            let split = move |x: Tensor<G, 2>, w: Tensor<G, 2>| {
                lab_ops::project_joined(x, blocks(&w, &cuts))
            };
            let dims = [33, 64, 17];
            let (x, w, g) = inputs(dims, 20 + seed as u64);
            let (y, dx, dw) = run::<G>(split, (&x, &w, &g), dims, dtype, x_as_view);
            let want = reference(&x, &w, &g, dims);
            let what = format!("{dtype:?} {dims:?} view {x_as_view}");
            assert_close(&format!("y {what}"), &y, &want.y, tol);
            assert_close(&format!("dx {what}"), &dx, &want.dx, tol);
            assert_close(&format!("dw {what}"), &dw, &want.dw, tol);
        }
    }
}
