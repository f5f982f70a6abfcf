//! The flash attention kernels against an fp64 host reference and against burn's own
//! decomposed attention under autodiff, on whatever wgpu device the machine has (Mesa's
//! lavapipe in CI: `apt-get install mesa-vulkan-drivers libvulkan1`), or on CUDA in a build
//! with only `--features cuda`.
//!
//! Outputs are poisoned with NaN before each launch, so an element a kernel forgot to write
//! fails the comparison. Shapes include sequence lengths that are not multiples of the
//! kernels' row block, a row block of 21, single rows, and GQA groups of 1, 2 and 3. Tensors
//! come contiguous and in the model's layout (`[B, T, heads, hd]` with the middle axes
//! swapped), and each input and the outputs in a layout of its own (padded rows among them),
//! so a kernel that reads one tensor at another's strides fails.
//!
//! Tolerances, as a fraction of the largest reference magnitude (at least 1):
//! - f32: 2e-5. Every sum runs in f32 over at most T·hd = 4,800 terms of O(1) values; the
//!   softmax rescaling adds a few roundings per key.
//! - f16 storage (f32 arithmetic inside): 4e-3. Inputs are rounded to f16 before the
//!   reference sees them, so only the output's own rounding (2^-11 ≈ 4.9e-4 relative) and
//!   f32 arithmetic remain; 4e-3 leaves room for gradients of magnitude up to ~8 at f16's
//!   absolute spacing there.
//! - bf16 storage (CUDA builds only; lavapipe has no bf16): 3e-2, about the f16 margin scaled
//!   by bf16's coarser rounding (2^-8 ≈ 3.9e-3 relative instead of 2^-11, 8×).
//!
//! The tensor-core kernels (CUDA builds only) also round the probabilities and `dS` to the
//! storage type before their second product, as FlashAttention-2 does: one more rounding of
//! a factor in [0, 1] (or of `dS`) per term, inside the same tolerances.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::backend::Autodiff;
use burn::tensor::{activation::softmax, backend::Backend, DType, Distribution, Tensor};
use lab_kernels::attention::{self, Forward, Grads, Variant};
use proptest::prelude::*;

use crate::common;
use common::{assert_close, device, download, upload, values, Layout, B};

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq: usize,
    head_dim: usize,
}

impl Case {
    fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq, self.head_dim]
    }
    fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.kv_heads, self.seq, self.head_dim]
    }
    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// fp64 reference: `(out, lse, dq, dk, dv)` for upstream gradient `dout`.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

fn reference(c: &Case, q: &[f32], k: &[f32], v: &[f32], dout: &[f32]) -> Reference {
    let (t, hd, group) = (c.seq, c.head_dim, c.heads / c.kv_heads);
    let scale = c.scale() as f64;
    let mut r = Reference {
        out: vec![0.0; q.len()],
        lse: vec![0.0; c.batch * c.heads * t],
        dq: vec![0.0; q.len()],
        dk: vec![0.0; k.len()],
        dv: vec![0.0; v.len()],
    };
    let at = |x: &[f32], row: usize, d: usize| x[row * hd + d] as f64;
    for b in 0..c.batch {
        for h in 0..c.heads {
            let kv = b * c.kv_heads + h / group;
            for i in 0..t {
                let qi = (b * c.heads + h) * t + i;
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        scale
                            * (0..hd)
                                .map(|d| at(q, qi, d) * at(k, kv * t + j, d))
                                .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / l).collect();
                r.lse[qi] = m + l.ln();
                for d in 0..hd {
                    r.out[qi * hd + d] = (0..=i).map(|j| p[j] * at(v, kv * t + j, d)).sum();
                }
                let dp: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..hd)
                            .map(|d| at(dout, qi, d) * at(v, kv * t + j, d))
                            .sum()
                    })
                    .collect();
                let delta: f64 = (0..=i).map(|j| p[j] * dp[j]).sum();
                for j in 0..=i {
                    let ds = p[j] * (dp[j] - delta);
                    for d in 0..hd {
                        r.dq[qi * hd + d] += scale * ds * at(k, kv * t + j, d);
                        r.dk[(kv * t + j) * hd + d] += scale * ds * at(q, qi, d);
                        r.dv[(kv * t + j) * hd + d] += p[j] * at(dout, qi, d);
                    }
                }
            }
        }
    }
    r
}

/// The variant the device runs by default for `dtype`.
fn default_variant(dtype: DType) -> Variant {
    Variant::of(&upload(&[0.0], &[1], dtype))
}

/// Checks the kernels as the device runs them by default.
fn check(c: Case, dtype: DType, seed: u64) {
    check_variant(c, dtype, seed, default_variant(dtype));
}

/// How each tensor of a call is laid out: the inputs `q, k, v, dO` and the outputs (`out`,
/// `dq`, `dk`, `dv`), which must have unit-stride rows.
#[derive(Clone, Copy, Debug)]
struct Layouts {
    q: Layout,
    k: Layout,
    v: Layout,
    d_out: Layout,
    outputs: Layout,
}

const CONTIGUOUS: Layouts = Layouts::all(Layout::Contiguous);

impl Layouts {
    /// `[q, k, v, dO, outputs]`.
    const fn of([q, k, v, d_out, outputs]: [Layout; 5]) -> Self {
        Layouts {
            q,
            k,
            v,
            d_out,
            outputs,
        }
    }

    const fn all(layout: Layout) -> Self {
        Layouts::of([layout; 5])
    }
}

fn check_variant(c: Case, dtype: DType, seed: u64, variant: Variant) {
    check_in(c, dtype, seed, variant, CONTIGUOUS);
}

fn check_in(c: Case, dtype: DType, seed: u64, variant: Variant, layouts: Layouts) {
    let tol = match dtype {
        DType::F32 => 2e-5,
        DType::BF16 => 3e-2,
        _ => 4e-3,
    };
    let nq: usize = c.q_shape().iter().product();
    let nkv: usize = c.kv_shape().iter().product();
    let (q, k, v) = (
        values(nq, seed, dtype),
        values(nkv, seed + 1, dtype),
        values(nkv, seed + 2, dtype),
    );
    let dout = values(nq, seed + 3, dtype);
    let want = reference(&c, &q, &k, &v, &dout);

    let l = layouts;
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let fwd = attention::forward_into(
        l.q.upload(&q, qs, dtype),
        l.k.upload(&k, kvs, dtype),
        l.v.upload(&v, kvs, dtype),
        Forward {
            out: l.outputs.poisoned(qs, dtype),
            lse: common::poisoned(&[c.batch, c.heads, c.seq], DType::F32),
        },
        c.scale(),
        variant,
    );
    let out = download(fwd.out.clone());
    assert_close("out", &out, &want.out, tol);
    assert_close("lse", &download(fwd.lse.clone()), &want.lse, tol);

    let grads = attention::backward_into(
        l.q.upload(&q, qs, dtype),
        l.k.upload(&k, kvs, dtype),
        l.v.upload(&v, kvs, dtype),
        fwd.out,
        fwd.lse,
        l.d_out.upload(&dout, qs, dtype),
        Grads {
            q: l.outputs.poisoned(qs, dtype),
            k: l.outputs.poisoned(kvs, dtype),
            v: l.outputs.poisoned(kvs, dtype),
        },
        c.scale(),
        variant,
    );
    assert_close("dq", &download(grads.q), &want.dq, tol);
    assert_close("dk", &download(grads.k), &want.dk, tol);
    assert_close("dv", &download(grads.v), &want.dv, tol);
}

const CASES: [Case; 5] = [
    Case {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        seq: 1,
        head_dim: 8,
    },
    Case {
        batch: 2,
        heads: 4,
        kv_heads: 2,
        seq: 37,
        head_dim: 16,
    },
    Case {
        batch: 1,
        heads: 3,
        kv_heads: 3,
        seq: 70,
        head_dim: 32,
    },
    Case {
        batch: 1,
        heads: 6,
        kv_heads: 2,
        seq: 65,
        head_dim: 64,
    },
    // A row block of 21 (not a power of two, not a warp).
    Case {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        seq: 50,
        head_dim: 96,
    },
];

#[test]
fn f32_matches_the_fp64_reference() {
    for (n, c) in CASES.into_iter().enumerate() {
        check(c, DType::F32, 10 * n as u64 + 1);
    }
}

/// Every tensor in the model's layout, `[B, T, heads, hd]` read through a swap of the middle
/// axes, as the projections and RoPE give them and the output projection takes them back.
#[test]
fn the_models_layout_matches_the_fp64_reference() {
    let swapped = Layouts::all(Layout::HeadsSwapped);
    for (n, c) in CASES.into_iter().enumerate() {
        check_in(
            c,
            DType::F32,
            10 * n as u64 + 2,
            default_variant(DType::F32),
            swapped,
        );
    }
    for (n, c) in CASES[1..3].iter().enumerate() {
        check_in(
            *c,
            DType::F16,
            10 * n as u64 + 4,
            default_variant(DType::F16),
            swapped,
        );
    }
}

/// Each tensor in a layout of its own, so that reading one at another's strides fails.
#[test]
fn mixed_layouts_match_the_fp64_reference() {
    check_mixed(DType::F32, default_variant(DType::F32));
}

/// `q, k, v, dO` and the outputs in layouts of their own, padded rows among them.
const MIXED: [[Layout; 5]; 4] = {
    use Layout::{Contiguous as C, HeadsSwapped as S, Padded as P, RowsStrided as R};
    [
        [S, C, R, C, S],
        [C, S, C, S, C],
        [R, C, S, R, S],
        [P, S, P, C, P],
    ]
};

fn check_mixed(dtype: DType, variant: Variant) {
    for (n, layouts) in MIXED.into_iter().enumerate() {
        let seed = n as u64 + 40;
        check_in(CASES[1], dtype, seed, variant, Layouts::of(layouts));
    }
}

/// No rows launch nothing: the outputs come back as they were given (an empty tensor's
/// strides may be 0, so its layout is not checked).
#[test]
fn an_empty_sequence_gives_empty_outputs() {
    let c = Case { seq: 0, ..CASES[1] };
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let empty = |shape: [usize; 4]| Layout::HeadsSwapped.upload(&[], shape, DType::F32);
    let fwd = attention::forward(empty(qs), empty(kvs), empty(kvs), c.scale());
    assert_eq!(fwd.out.meta.shape().as_slice(), qs);
    let (out, lse) = (fwd.out, fwd.lse);
    let g = attention::backward(empty(qs), empty(kvs), empty(kvs), out, lse, empty(qs), 1.0);
    assert_eq!(g.q.meta.shape().as_slice(), qs);
    assert_eq!(g.k.meta.shape().as_slice(), kvs);
}

/// The backward's row statistics against fp64: `D = dO·O` summed in f32 from f16 rows, and
/// `lse · log2 e`, the units the tensor cores' register kernels read `lse` in (which only a
/// GPU's tensor cores run: this is their one check without one). 70 rows a head: a whole cube
/// of 64 and part of one; the loop over the head width unrolled and not.
#[test]
fn backward_rows_are_d_and_lse_in_base_2() {
    let (b, h, t, hd) = (2, 3, 70, 48);
    let out = values(b * h * t * hd, 21, DType::F16);
    let d_out = values(b * h * t * hd, 22, DType::F16);
    let lse: Vec<f32> = values(b * h * t, 23, DType::F32)
        .iter()
        .map(|x| 4.0 * x)
        .collect();
    let want_delta: Vec<f64> = (0..b * h * t)
        .map(|r| {
            (r * hd..(r + 1) * hd)
                .map(|i| f64::from(out[i]) * f64::from(d_out[i]))
                .sum()
        })
        .collect();
    let want_lse_log2: Vec<f64> = lse
        .iter()
        .map(|&x| f64::from(x) * std::f64::consts::LOG2_E)
        .collect();
    for unroll in [true, false] {
        let rows = attention::backward_rows(
            upload(&out, &[b, h, t, hd], DType::F16),
            &upload(&d_out, &[b, h, t, hd], DType::F16),
            &upload(&lse, &[b, h, t], DType::F32),
            unroll,
        );
        assert_close("delta", &download(rows.delta), &want_delta, 1e-5);
        assert_close("lse_log2", &download(rows.lse_log2), &want_lse_log2, 1e-6);
    }
}

/// The allocating calls put each output in its input's layout: in the model's layout, the
/// output and the gradients swapped back are contiguous (the merge of heads and RoPE's
/// backward read them with no copy); contiguous inputs give contiguous outputs.
#[test]
fn the_outputs_take_their_inputs_layout() {
    let c = CASES[1];
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    for layout in [Layout::Contiguous, Layout::HeadsSwapped] {
        let input = |shape: [usize; 4], seed| {
            layout.upload(
                &values(shape.iter().product(), seed, DType::F32),
                shape,
                DType::F32,
            )
        };
        let (q, k, v) = (input(qs, 1), input(kvs, 2), input(kvs, 3));
        let fwd = attention::forward(q.clone(), k.clone(), v.clone(), c.scale());
        let d_out = input(qs, 4);
        let grads = attention::backward(q, k, v, fwd.out.clone(), fwd.lse, d_out, c.scale());
        for (name, t) in [
            ("out", &fwd.out),
            ("dq", &grads.q),
            ("dk", &grads.k),
            ("dv", &grads.v),
        ] {
            assert!(
                layout.holds(t),
                "{layout:?}: {name} has strides {:?}",
                t.meta.strides()
            );
        }
    }
}

#[test]
fn f16_matches_the_fp64_reference() {
    common::assert_device_has_f16();
    for (n, c) in CASES.into_iter().enumerate() {
        check(c, DType::F16, 10 * n as u64 + 5);
    }
}

/// The loop variant the device does not run by default (unrolled on wgpu, rolled on CUDA),
/// one unit a row (CUDA's default shares rows among units), so every device checks both;
/// small head widths, since lavapipe compiles unrolled kernels slowly.
#[test]
fn the_other_loop_variant_matches_the_fp64_reference() {
    let default = default_variant(DType::F32);
    let other = Variant {
        unroll: !default.unroll,
        shuffles: false,
        ..default
    };
    for (n, c) in CASES[..2].iter().enumerate() {
        check_variant(*c, DType::F32, 10 * n as u64 + 3, other);
    }
}

/// The training precision on a GPU; only a CUDA build (a GPU host) can run it.
#[cfg(not(feature = "wgpu"))]
#[test]
fn bf16_matches_the_fp64_reference() {
    for (n, c) in CASES.into_iter().enumerate() {
        check(c, DType::BF16, 10 * n as u64 + 7);
    }
}

/// The 7B's and MedGemma's head width, 128, where CUDA's f32 kernels share each row among
/// 2 (forward) and 4 (`dQ`, `dK/dV`) units (`attention::row_lanes`), at f32 and bf16: a
/// partial cube of 16 rows, several cubes, GQA groups of 1 and 3. CUDA builds only (wgpu
/// keeps one unit a row; lavapipe would compile the wide rows slowly).
#[cfg(not(feature = "wgpu"))]
#[test]
fn wide_heads_match_the_fp64_reference() {
    let cases = [(1, 1, 1, 9), (2, 6, 2, 70)].map(|(batch, heads, kv_heads, seq)| Case {
        batch,
        heads,
        kv_heads,
        seq,
        head_dim: 128,
    });
    for (n, dtype) in [DType::F32, DType::BF16].into_iter().enumerate() {
        // The f32 kernels even where `LAB_ATTENTION_MMA=1` (hd 128 fits the tensor cores too).
        let f32_kernels = Variant {
            tensor_cores: false,
            ..default_variant(dtype)
        };
        for (m, c) in cases.into_iter().enumerate() {
            check_variant(c, dtype, 10 * m as u64 + n as u64 + 4, f32_kernels);
        }
    }
}

/// Cases for the tensor-core kernels: their 64-row tiles several times over (one tile, a
/// partial last tile, four tiles), head widths 16, 48, 64 and 128 (where `dK` and `dV` take a
/// launch each), GQA groups of 1 to 3.
#[cfg(not(feature = "wgpu"))]
const TILED_CASES: [Case; 4] = [
    Case {
        batch: 1,
        heads: 2,
        kv_heads: 2,
        seq: 64,
        head_dim: 16,
    },
    Case {
        batch: 2,
        heads: 4,
        kv_heads: 2,
        seq: 130,
        head_dim: 48,
    },
    Case {
        batch: 1,
        heads: 6,
        kv_heads: 2,
        seq: 200,
        head_dim: 64,
    },
    Case {
        batch: 2,
        heads: 3,
        kv_heads: 1,
        seq: 130,
        head_dim: 128,
    },
];

/// The tensor-core forward and backward at f16 and bf16, whatever the default (CUDA builds
/// only: lavapipe has no tensor cores), contiguous, in the model's layout and mixed: the
/// kernels with their row-wise work in registers, under `LAB_ATTENTION_QUERY_BLOCKS=1` those
/// at one block of query rows a warp, under `LAB_ATTENTION_STAGES=1` those loading each key
/// tile without `cp.async`, or under `LAB_ATTENTION_ROWS=bounce` those through shared rows
/// (`scripts/gpu/session.sh` runs all four). Calls that do not fit them (hd 8
/// in `CASES`) take the f32 kernels.
#[cfg(not(feature = "wgpu"))]
#[test]
fn tensor_core_kernels_match_the_fp64_reference() {
    for (n, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        assert!(
            attention::tensor_cores::available(&upload(&[0.0], &[1], dtype)),
            "this CUDA device has no {dtype:?} 16x16x16 products for the tensor-core kernels"
        );
        let on = Variant {
            tensor_cores: true,
            ..default_variant(dtype)
        };
        for (m, c) in CASES.into_iter().chain(TILED_CASES).enumerate() {
            check_variant(c, dtype, 10 * m as u64 + n as u64 + 8, on);
        }
        let swapped = Layouts::all(Layout::HeadsSwapped);
        for (m, c) in TILED_CASES.into_iter().enumerate() {
            check_in(c, dtype, 10 * m as u64 + n as u64 + 9, on, swapped);
        }
        check_mixed(dtype, on);
    }
}

/// Any of the layouts for an input (rows strided are copied first); the outputs in one the
/// kernels write (unit-stride rows, gaps between them or not).
fn layouts() -> impl Strategy<Value = Layouts> {
    let input = || prop::sample::select(Layout::ALL.to_vec());
    let output = prop::sample::select(vec![
        Layout::Contiguous,
        Layout::HeadsSwapped,
        Layout::Padded,
    ]);
    (input(), input(), input(), input(), output)
        .prop_map(|(q, k, v, d_out, outputs)| Layouts::of([q, k, v, d_out, outputs]))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]
    /// Random batch, group, length and layouts (the kernels compile once per head width).
    #[test]
    fn random_shapes_and_layouts_match_the_reference(
        batch in 1usize..3, kv_heads in 1usize..3, group in 1usize..4, seq in 1usize..50,
        seed in 0u64..1000, layouts in layouts(),
    ) {
        let c = Case { batch, heads: kv_heads * group, kv_heads, seq, head_dim: 16 };
        check_in(c, DType::F32, seed, default_variant(DType::F32), layouts);
    }
}

/// A decomposed attention as burn's tensor ops (K/V heads repeated for their group, full
/// scores, causal mask, softmax; the same head mapping as the model's stacked form),
/// differentiated by burn's autodiff on the same device: the kernels'
/// gradients must equal its gradients.
#[test]
fn backward_matches_the_decomposed_attention_under_autodiff() {
    type AD = Autodiff<B>;
    let c = Case {
        batch: 2,
        heads: 4,
        kv_heads: 2,
        seq: 29,
        head_dim: 16,
    };
    let dev = device();
    <AD as Backend>::seed(&dev, 7);
    let leaf = |shape: [usize; 4]| {
        Tensor::<AD, 4>::random(shape, Distribution::Normal(0.0, 1.0), &dev).require_grad()
    };
    let (q, k, v) = (leaf(c.q_shape()), leaf(c.kv_shape()), leaf(c.kv_shape()));
    let dout = Tensor::<AD, 4>::random(c.q_shape(), Distribution::Normal(0.0, 1.0), &dev);

    let group = c.heads / c.kv_heads;
    let repeat = |x: Tensor<AD, 4>| {
        x.unsqueeze_dim::<5>(2)
            .repeat_dim(2, group)
            .reshape(c.q_shape())
    };
    let scores = q.clone().matmul(repeat(k.clone()).swap_dims(2, 3)) * c.scale() as f64;
    let future = Tensor::<AD, 2, burn::tensor::Bool>::tril_mask([c.seq, c.seq], 0, &dev)
        .unsqueeze::<4>()
        .expand([c.batch, c.heads, c.seq, c.seq]);
    let probs = softmax(scores.mask_fill(future, -1e30), 3);
    let out = probs.matmul(repeat(v.clone()));
    let grads = (out.clone() * dout.clone().detach()).sum().backward();
    let host = |t: Tensor<B, 4>| t.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    let want_out = host(out.inner());
    let (want_dq, want_dk, want_dv) = (
        host(q.grad(&grads).unwrap()),
        host(k.grad(&grads).unwrap()),
        host(v.grad(&grads).unwrap()),
    );

    let prim = |t: &Tensor<AD, 4>| t.clone().inner().into_primitive().tensor();
    let fwd = attention::forward(prim(&q), prim(&k), prim(&v), c.scale());
    let got = attention::backward(
        prim(&q),
        prim(&k),
        prim(&v),
        fwd.out.clone(),
        fwd.lse,
        prim(&dout),
        c.scale(),
    );
    let f64s = |x: Vec<f32>| x.into_iter().map(f64::from).collect::<Vec<_>>();
    // The decomposed attention's products run as TF32 on CUDA (`f32_products`).
    let tol = common::f32_products(2e-5);
    assert_close("out", &download(fwd.out), &f64s(want_out), tol);
    assert_close("dq", &download(got.q), &f64s(want_dq), tol);
    assert_close("dk", &download(got.k), &f64s(want_dk), tol);
    assert_close("dv", &download(got.v), &f64s(want_dv), tol);
}
