//! The joined q|k|v product's heads (`lab_ops::rope_heads`, `lab_ops::heads`): their values
//! and the gradient they give the product, against burn's own slicing of it (narrow,
//! reshape, swap, then lab's RoPE op) bit for bit, on the CPU (f32, bf16, with and without
//! selective checkpointing) and, with `wgpu`, through Fusion on lavapipe (f32, f16).
//!
//! burn's slices each write their gradient into zeros of the product's shape and autodiff sums
//! the three; the heads add theirs into one tensor in place. Every element of the product's
//! gradient is then one group's value plus exact zeros, so the two agree to the bit. The
//! groups after the first must find the gradient registered so far (the count of folded
//! gradients grows), and where the product has another use besides the heads its gradient is
//! added to, not overwritten.

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{backend::AutodiffBackend, FloatDType, Tensor, TensorData};
use lab_ops::{FusedHeads, HeadColumns};

use crate::common::{bits, floats};

/// `batch` sequences of `t` positions; `h` query heads and `kv` key/value heads of `hd`.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    t: usize,
    h: usize,
    kv: usize,
    hd: usize,
}

impl Case {
    fn rows(&self) -> usize {
        self.batch * self.t
    }

    fn width(&self) -> usize {
        (self.h + 2 * self.kv) * self.hd
    }

    /// q (group 0), k (1) or v (2), as the model's attention places them.
    fn at(&self, group: usize) -> HeadColumns {
        let (first_head, heads) =
            [(0, self.h), (self.h, self.kv), (self.h + self.kv, self.kv)][group];
        HeadColumns {
            first: first_head * self.hd,
            heads,
            head_dim: self.hd,
            batch: self.batch,
        }
    }
}

const CASES: [Case; 3] = [
    Case {
        batch: 1,
        t: 1,
        h: 1,
        kv: 1,
        hd: 2,
    },
    Case {
        batch: 2,
        t: 5,
        h: 3,
        kv: 1,
        hd: 4,
    },
    Case {
        batch: 3,
        t: 7,
        h: 4,
        kv: 2,
        hd: 6,
    },
];

/// How the heads are read out of `y`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// `lab_ops::rope_heads` and `lab_ops::heads`.
    Heads,
    /// burn's narrow, reshape and swap, then `lab_ops::rope`.
    Slices,
}

/// q, k and v's values and `y`'s gradient for the upstream `Σ q·s_q + Σ k·s_k + Σ v·s_v`
/// (`+ Σ y·s_y` where `y_used_too`), with `y` and the tables in `dtype`.
fn run<A: AutodiffBackend + FusedHeads>(
    c: Case,
    dtype: FloatDType,
    path: Path,
    y_used_too: bool,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let device = Default::default();
    let matrix = |seed, [r, w]: [usize; 2]| -> Tensor<A, 2> {
        Tensor::<A, 1>::from_data(TensorData::new(floats(r * w, seed, 1.0), [r * w]), &device)
            .reshape([r, w])
            .cast(dtype)
    };
    let y = matrix(1, [c.rows(), c.width()]).require_grad();
    let (cos, sin) = (matrix(2, [c.t, c.hd]), matrix(3, [c.t, c.hd]));
    let view = |at: HeadColumns| {
        y.clone()
            .narrow(1, at.first, at.heads * at.head_dim)
            .reshape([c.batch, c.t, at.heads, c.hd])
            .swap_dims(1, 2)
    };
    let rotated = |group| match path {
        Path::Heads => lab_ops::rope_heads(y.clone(), c.at(group), cos.clone(), sin.clone()),
        Path::Slices => lab_ops::rope(view(c.at(group)), cos.clone(), sin.clone()),
    };
    let (q, k) = (rotated(0), rotated(1));
    let v = match path {
        Path::Heads => lab_ops::heads(y.clone(), c.at(2)),
        Path::Slices => view(c.at(2)),
    };
    let upstream = |t: &Tensor<A, 4>, seed| {
        let dims = t.dims();
        let n = dims.iter().product();
        Tensor::<A, 1>::from_data(TensorData::new(floats(n, seed, 1.0), [n]), &device)
            .reshape(dims)
            .cast(dtype)
    };
    let mut loss = (q.clone() * upstream(&q, 4)).sum()
        + (k.clone() * upstream(&k, 5)).sum()
        + (v.clone() * upstream(&v, 6)).sum();
    if y_used_too {
        loss = loss + (y.clone() * matrix(7, [c.rows(), c.width()])).sum();
    }
    let grads = loss.backward();
    let f32s = |t: Tensor<A::InnerBackend, 2>| {
        t.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap()
    };
    let values = [q, k, v].map(|t| {
        let dims = t.dims();
        f32s(t.inner().reshape([dims[0] * dims[1] * dims[2], dims[3]]))
    });
    (values.to_vec(), f32s(y.grad(&grads).unwrap()))
}

/// The heads against burn's slices on `A`, bit for bit, with the fold count checked. Where the
/// product has another use (`y_used_too`), its gradient and the heads' meet in one add: on a
/// GPU within `other_use_tol` of burn's (relative to the larger of the value and 1), since its
/// compiler may contract RoPE's products and that add into fused multiply-adds.
fn same_as_slices<A: AutodiffBackend + FusedHeads>(dtype: FloatDType, other_use_tol: f32) {
    for c in CASES {
        for y_used_too in [false, true] {
            let what = format!("{c:?} {dtype:?} y used too: {y_used_too}");
            let (want_values, want_grad) = run::<A>(c, dtype, Path::Slices, y_used_too);
            let folded = lab_ops::gradients_folded_on_this_thread();
            let (values, grad) = run::<A>(c, dtype, Path::Heads, y_used_too);
            // Three groups: at least the two after the first find a gradient to add to.
            assert!(
                lab_ops::gradients_folded_on_this_thread() >= folded + 2,
                "{what}: the heads did not fold into the gradient registered so far"
            );
            for (group, (got, want)) in values.iter().zip(&want_values).enumerate() {
                assert_eq!(bits(got), bits(want), "{what}: group {group}'s values");
            }
            if y_used_too && other_use_tol > 0.0 {
                for (i, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
                    let err = (g - w).abs();
                    let bound = other_use_tol * w.abs().max(1.0);
                    assert!(err <= bound, "{what}: y's gradient [{i}]: {g} vs {w}");
                }
            } else {
                assert_eq!(bits(&grad), bits(&want_grad), "{what}: y's gradient");
            }
        }
    }
}

#[test]
fn the_cpus_heads_are_burns_slices_bit_for_bit() {
    for dtype in [FloatDType::F32, FloatDType::BF16] {
        same_as_slices::<Autodiff<Flex>>(dtype, 0.0);
    }
}

/// Under selective checkpointing (RoPE's node keeps its tables, the copy nothing) the same.
#[test]
fn selective_checkpointing_gives_the_same_bits() {
    for dtype in [FloatDType::F32, FloatDType::BF16] {
        same_as_slices::<Autodiff<Flex, BalancedCheckpointing>>(dtype, 0.0);
    }
}

/// Through Fusion on the GPU device: the adds are lab-kernels' in place (f16 standing in for
/// bf16 on lavapipe). A contracted product and add rounds once where two roundings were: an
/// ulp of f32, or of f16 (2^-10 relative).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn the_gpus_heads_match_burns_slices() {
    for (dtype, tol) in [(FloatDType::F32, 2e-7), (FloatDType::F16, 1e-3)] {
        same_as_slices::<Autodiff<crate::common::Gpu>>(dtype, tol);
    }
}

/// A gradient that another tensor still holds is not written in place: the heads are added
/// into a copy of it (one in a flat buffer, which the kernels' view of the heads needs), and
/// the holder keeps its values. Through Fusion the op then gets the gradient read-only.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn a_shared_gradient_is_added_into_a_copy() {
    type G = crate::common::Gpu;
    let c = Case {
        batch: 2,
        t: 3,
        h: 2,
        kv: 1,
        hd: 4,
    };
    let (rows, width, at) = (c.rows(), c.width(), c.at(1));
    let device = Default::default();
    let before = floats(rows * width, 1, 1.0);
    let value = floats(c.batch * at.heads * c.t * c.hd, 2, 1.0);
    let acc = Tensor::<G, 2>::from_data(TensorData::new(before.clone(), [rows, width]), &device);
    let dims = [c.batch, at.heads, c.t, c.hd];
    let added = Tensor::<G, 4>::from_data(TensorData::new(value.clone(), dims), &device);
    let kept = acc.clone();
    let out = <G as FusedHeads>::add_heads_into(
        acc.into_primitive().tensor(),
        at,
        added.into_primitive().tensor(),
    );
    let out = Tensor::<G, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(out));
    let host = |t: Tensor<G, 2>| t.into_data().to_vec::<f32>().unwrap();
    // Row `b·T + t`, column `first + h·hd + i` gains value[b, h, t, i].
    let mut want = before.clone();
    for (k, v) in value.iter().enumerate() {
        let (i, t, h, b) = (
            k % c.hd,
            k / c.hd % c.t,
            k / (c.hd * c.t) % at.heads,
            k / (c.hd * c.t * at.heads),
        );
        want[(b * c.t + t) * width + at.first + h * c.hd + i] += v;
    }
    assert_eq!(bits(&host(out)), bits(&want), "the heads added");
    assert_eq!(bits(&host(kept)), bits(&before), "the holder's values");
}
