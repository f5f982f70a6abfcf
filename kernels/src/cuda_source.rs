//! Every cubecl kernel of the crate as CUDA C++, written on a machine without a GPU, for
//! `scripts/cuda-source-check.sh` to compile with NVRTC and report ptxas's registers and
//! spills: a kernel that does not compile for CUDA fails here, not in a GPU host's first call.
//! (The attention's tensor-core kernels also run on a CPU emulation of CUDA,
//! `attention::cuda_source`, and so do the kernels that read 16-byte vectors, here:
//! [`vector_kernels_match_fp64_on_the_cuda_emulation`].)
//!
//! Each kernel is defined as a launch would define it, through a wgpu client (lavapipe), and
//! compiled by cubecl's CUDA C++ compiler, as `cubecl-cuda` does before it calls NVRTC. The
//! definition sees wgpu's device properties, not a CUDA device's; the kernels here do not
//! branch on them.

use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use burn::tensor::DType;
use cubecl::prelude::*;
use cubecl::Compiler as _;
use cubecl_cpp::cuda::{mma::CudaWmmaCompiler, CudaDialect};
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};

use crate::attention::cuda_source::{delta_kernel, tensor_core_kernels, unit_kernels};
use crate::attention::tensor_cores::{self, RowWork};
use crate::attention::Variant;
use crate::cuda_emulation::{defines, emulate_all, Emulation, STORAGES};

pub(crate) type Client = ComputeClient<WgpuRuntime>;

/// A kernel's CUDA C++, as `cubecl-cuda` hands it to NVRTC on an A100 or H100 with CUDA 13
/// (32-bit indices, the options below), in execution mode `mode`: `Checked` as `launch` runs a
/// kernel, `Unchecked` as `launch_unchecked` does, `Validate` with a `printf` of each
/// out-of-bounds access instead (cubecl's own check of unchecked kernels), for the CUDA
/// emulation.
pub(crate) fn cuda_cpp_in(kernel: &impl CubeKernel, mode: ExecutionMode) -> String {
    let address =
        cubecl::ir::StorageType::Scalar(cubecl::ir::ElemType::UInt(cubecl::ir::UIntKind::U32));
    CppCompiler::<CudaDialect<CudaWmmaCompiler>>::default()
        .compile(kernel.define(), &compilation_options(), mode, address)
        .expect("cubecl's CUDA compiler rejected a kernel")
        .to_string()
}

/// What `cubecl-cuda` (runtime.rs) sets for sm_80 and newer with CUDA ≥ 12.8: the kernel's
/// info as a `__grid_constant__` argument, fast math. (sm_90 adds clusters and `elect_sync`,
/// which these kernels do not use.)
fn compilation_options() -> CompilationOptions {
    CompilationOptions {
        warp_size: 32,
        supports_features: CppSupportedFeatures {
            grid_constants: true,
            fast_math: true,
            fast_tanh: true,
            ..Default::default()
        },
    }
}

/// A tensor argument, as a launch registers one that is not written in place.
pub(crate) fn tensor() -> TensorCompilationArg {
    TensorCompilationArg { inplace: None }
}

pub(crate) fn settings(cube_dim: CubeDim) -> KernelSettings {
    KernelSettings::default().cube_dim(cube_dim)
}

/// RMSNorm's kernels as bf16 training runs them (`x` and the gain f32, `y` and `dy` in
/// `output`: bf16, or f16 standing in) at `d` columns, compiled in `mode` (`Checked` as they
/// are launched): the backward keeps a column sum a unit per column it owns in registers.
#[rustfmt::skip]
fn rms_norm_kernels(client: &Client, d: usize, output: DType, mode: ExecutionMode) -> [(&'static str, String); 4] {
    use crate::rms_norm::{
        backward_blocks_kernel, backward_units, forward_kernel, gain_sums_kernel, ROW_UNITS,
        SUM_COLUMNS, SUM_LANES,
    };
    let (c, t) = (client, tensor);
    let rows = settings(CubeDim::new_1d(ROW_UNITS as u32));
    let types = [DType::F32.into(), output.into(), DType::F32.into()];
    // x f32 in vectors of 4 (16 bytes), y bf16 (8 bytes): every width here is whole vectors.
    let forward = forward_kernel::ForwardKernel::new(
        rows, c.clone(), t(), t(), t(), (), (), 4, ROW_UNITS, types);
    let units = backward_units(d);
    let blocks = |adds_skip| backward_blocks_kernel::BackwardBlocksKernel::new(
        settings(CubeDim::new_1d(units as u32)), c.clone(), t(), t(), t(), t(), t(), t(), (), (),
        (), units, d.div_ceil(units), adds_skip, types);
    let lanes = settings(CubeDim::new_2d(SUM_COLUMNS as u32, SUM_LANES as u32));
    let sums = gain_sums_kernel::GainSumsKernel::new(
        lanes, c.clone(), t(), t(), SUM_COLUMNS, SUM_LANES, [DType::F32.into(), DType::F32.into()]);
    [("forward", cuda_cpp_in(&forward, mode)), ("backward_blocks", cuda_cpp_in(&blocks(false), mode)),
     ("backward_blocks_skip", cuda_cpp_in(&blocks(true), mode)), ("gain_sums", cuda_cpp_in(&sums, mode))]
}

/// The kernels that copy or add in the storage type, at `dtype` (bf16 in training), compiled in
/// `mode`: the weights' joins of two and three parts, the LM head's padding of its weight
/// (the join of one part), and the v gradient's add into its heads.
#[rustfmt::skip]
fn copy_kernels(client: &Client, dtype: DType, mode: ExecutionMode) -> [(&'static str, String); 4] {
    use crate::{accumulate, join};
    let (c, t) = (client, tensor);
    let join = |parts| join::join_columns_kernel::JoinColumnsKernel::new(
        settings(CubeDim::new_1d(join::UNITS)), c.clone(), t(), t(), t(), t(), parts, dtype.into());
    let add_into = accumulate::add_into_kernel::AddIntoKernel::new(
        settings(CubeDim::new_1d(accumulate::UNITS)), c.clone(), t(), t(), (),
        [dtype.into(), DType::F32.into()]);
    [("join_columns", cuda_cpp_in(&join(2), mode)), ("join_three_columns", cuda_cpp_in(&join(3), mode)),
     ("pad_columns", cuda_cpp_in(&join(1), mode)), ("add_into", cuda_cpp_in(&add_into, mode))]
}

/// The training step's kernels that [`vector_kernels`], [`copy_kernels`] and the attention's
/// leave, compiled in `mode`: the embedding's backward (fp32 gradient, i32 ids), AdamW (fp32
/// masters; from moments or, at the first update, without, with the gradient flat or a matrix
/// at its strides) and the gradient norm's sums of squares (partial sums of a flat
/// tensor and of a matrix, of f32 and of bf16 (the weights' bf16 copies under `zero = 1`), and
/// their sum).
#[rustfmt::skip]
fn step_kernels(client: &Client, mode: ExecutionMode) -> [(&'static str, String); 10] {
    use crate::{adamw, embedding, square_sums};
    let (c, t) = (client, tensor);
    let (f32, i32) = (DType::F32.into(), DType::I32.into());
    let embedding = embedding::embedding_grad_kernel::EmbeddingGradKernel::new(
        settings(CubeDim::new_1d(embedding::UNITS as u32)), c.clone(), t(), t(), t(), (),
        embedding::UNITS, [f32, i32]);
    let constants = adamw::ConstantsCompilationArg {
        clip_scale: (), beta1: (), one_minus_beta1: (), beta2: (), one_minus_beta2: (),
        bias1: (), bias2: (), eps: (), lr: (), decay: (),
    };
    let adamw = |first, grad_is_matrix| cuda_cpp_in(&adamw::adamw_kernel::AdamwKernel::new(
        settings(CubeDim::new_1d(adamw::UNITS)), c.clone(), t(), t(), t(), t(), t(), t(), t(),
        constants.clone(), first, grad_is_matrix, f32), mode);
    let units = settings(CubeDim::new_1d(square_sums::UNITS));
    let squares = |x: DType, x_is_matrix| cuda_cpp_in(
        &square_sums::partial_squares_kernel::PartialSquaresKernel::new(
            units.clone(), c.clone(), t(), t(), (), square_sums::UNITS as usize, x_is_matrix,
            [x.into(), f32]), mode);
    let sums = square_sums::sum_partials_kernel::SumPartialsKernel::new(
        units.clone(), c.clone(), t(), t(), (), square_sums::UNITS as usize, f32);
    [("embedding_grad", cuda_cpp_in(&embedding, mode)), ("adamw", adamw(false, false)),
     ("adamw_first", adamw(true, false)), ("adamw_matrix_grad", adamw(false, true)),
     ("adamw_first_matrix_grad", adamw(true, true)),
     ("partial_squares", squares(DType::F32, false)), ("partial_squares_matrix", squares(DType::F32, true)),
     ("partial_squares_bf16", squares(DType::BF16, false)),
     ("partial_squares_bf16_matrix", squares(DType::BF16, true)),
     ("sum_partials", cuda_cpp_in(&sums, mode))]
}

/// The other kernels, at bf16 training's dtypes: [`copy_kernels`] at bf16 and
/// [`step_kernels`]. The kernels that read vectors are [`vector_kernels`].
fn other_kernels(client: &Client) -> Vec<(String, String)> {
    let copies = copy_kernels(client, DType::BF16, ExecutionMode::Checked)
        .map(|(name, cpp)| (format!("{name}-bf16"), cpp));
    let steps = step_kernels(client, ExecutionMode::Checked).map(|(name, cpp)| (name.into(), cpp));
    copies.into_iter().chain(steps).collect()
}

/// The kernels that read vectors ([`crate::vectors`]) at storage type `dtype`, `n` elements a
/// vector (8 for bf16 and f16, 4 for f32: 16 bytes; x1-50m's rows are whole vectors). Each
/// storage type has its own vector type in CUDA C++ (`__nv_bfloat16_8`, `float_4`, `__half_8`),
/// with its own conversions: bf16 is training's, f32 fp32 training's, f16 the kernel tests'.
/// Compiled in `mode`: `Checked` as they are launched, `Validate` for the CUDA emulation.
#[rustfmt::skip]
fn vector_kernels(client: &Client, dtype: DType, n: usize, mode: ExecutionMode) -> Vec<(&'static str, String)> {
    use crate::{lm_head, rms_norm, rope, swiglu};
    let (c, t) = (client, tensor);
    let (e, f32, i32) = (dtype.into(), DType::F32.into(), DType::I32.into());
    let units = |n: u32| settings(CubeDim::new_1d(n));
    let rows = || units(lm_head::ROW_UNITS as u32);
    let rope = |transposed_added| rope::rope_kernel::RopeKernel::new(
        units(rope::UNITS), c.clone(), t(), t(), t(), t(), (), n, transposed_added,
        transposed_added, [e, f32]);
    vec![
        ("swiglu", cuda_cpp_in(&swiglu::swiglu_kernel::SwigluKernel::new(
            units(swiglu::UNITS), c.clone(), t(), t(), n, [e, f32]), mode)),
        ("swiglu_backward", cuda_cpp_in(&swiglu::swiglu_backward_kernel::SwigluBackwardKernel::new(
            units(swiglu::UNITS), c.clone(), t(), t(), t(), n, [e, f32]), mode)),
        // The logits' rows, padded to 50,304 columns: the last vector masked.
        ("lm_head-row_loss", cuda_cpp_in(&lm_head::row_loss_kernel::RowLossKernel::new(
            rows(), c.clone(), t(), t(), t(), t(), (), n, lm_head::ROW_UNITS, [e, i32, f32]), mode)),
        ("lm_head-softmax_grad", cuda_cpp_in(&lm_head::softmax_grad_kernel::SoftmaxGradKernel::new(
            rows(), c.clone(), t(), t(), t(), t(), (), (), n, lm_head::ROW_UNITS, [e, i32, f32]), mode)),
        // The f32 accumulator takes 4 a vector (16 bytes) whatever the addend.
        ("lm_head-add_widened", cuda_cpp_in(&lm_head::add_widened_kernel::AddWidenedKernel::new(
            units(lm_head::ADD_UNITS), c.clone(), t(), t(), 4, [e, f32]), mode)),
        ("rope", cuda_cpp_in(&rope(false), mode)),
        ("rope_transposed_added", cuda_cpp_in(&rope(true), mode)),
        // x and y in one dtype (bf16 training's norm of an f32 x is in `rms_norm_kernels`).
        ("rmsnorm-forward", cuda_cpp_in(&rms_norm::forward_kernel::ForwardKernel::new(
            units(rms_norm::ROW_UNITS as u32), c.clone(), t(), t(), t(), (), (), n,
            rms_norm::ROW_UNITS, [e, e, f32]), mode)),
    ]
}

/// The head widths the tensor-core kernels take (16 to 128 but 112).
fn tensor_core_widths() -> impl Iterator<Item = usize> {
    (1..=tensor_cores::MAX_HEAD_DIM).filter(|&hd| tensor_cores::fits(hd))
}

/// Every kernel's CUDA C++ by name: the tensor-core kernels at f16 and bf16 at every head
/// width they take ([`tensor_core_widths`]), the f32-arithmetic kernels at bf16 in each
/// layout (below), RMSNorm's at x1-50m's width (768), the 7B's (4096) and MedGemma-27B's
/// (5376), the kernels that read vectors at bf16, f32 and f16 ([`vector_kernels`]), and the
/// others once ([`other_kernels`]).
fn all_sources(client: &Client) -> Vec<(String, String)> {
    let mut sources = Vec::new();
    for (name, dtype) in [("f16", DType::F16), ("bf16", DType::BF16)] {
        for hd in tensor_core_widths() {
            let rows = RowWork::default();
            let (blocks, stages) = (rows.default_query_blocks(hd), rows.default_tile_stages());
            let kernels = |blocks, stages| {
                tensor_core_kernels(
                    client,
                    dtype,
                    hd,
                    rows,
                    blocks,
                    stages,
                    ExecutionMode::Unchecked,
                )
            };
            for (kernel, cpp) in kernels(blocks, stages) {
                sources.push((format!("mma-{kernel}-{name}-hd{hd}"), cpp));
            }
            // Every kernel loading one tile at a time (`LAB_ATTENTION_STAGES=1`), and the
            // forward and `dQ` at one block of query rows a plane where the default is two
            // (`LAB_ATTENTION_QUERY_BLOCKS=1`).
            for (kernel, cpp) in kernels(blocks, 1) {
                sources.push((format!("mma-{kernel}_one_stage-{name}-hd{hd}"), cpp));
            }
            if blocks > 1 {
                for (kernel, cpp) in kernels(1, stages) {
                    if kernel == "forward" || kernel == "grad_q" {
                        sources.push((format!("mma-{kernel}_one_block-{name}-hd{hd}"), cpp));
                    }
                }
            }
            // The kernels through shared rows (`LAB_ATTENTION_ROWS=bounce`).
            let bounce = tensor_core_kernels(
                client,
                dtype,
                hd,
                RowWork::Bounce,
                1,
                1,
                ExecutionMode::Unchecked,
            );
            for (kernel, cpp) in bounce {
                sources.push((format!("mma-{kernel}_bounce-{name}-hd{hd}"), cpp));
            }
        }
    }
    // The f32-arithmetic kernels as each `attention::Variant` lays them out: rolled (wgpu's
    // default), unrolled one unit a row, unrolled with rows shared among units (CUDA's
    // default; also at the 7B's and MedGemma's head width, 128), and rolled with shared
    // rows (CUDA with `LAB_ATTENTION_UNROLL=0`).
    let unit_variants = [
        (64, "rolled", false, false),
        (64, "unrolled", true, false),
        (64, "lanes", true, true),
        (128, "lanes", true, true),
        (64, "rolled-lanes", false, true),
    ];
    for (hd, name, unroll, shuffles) in unit_variants {
        let variant = Variant {
            unroll,
            tensor_cores: false,
            shuffles,
        };
        for (kernel, cpp) in
            unit_kernels(client, DType::BF16, hd, variant, ExecutionMode::Unchecked)
        {
            sources.push((format!("unit-{kernel}-bf16-hd{hd}-{name}"), cpp));
        }
    }
    for d in [768, 4096, 5376] {
        for (kernel, cpp) in rms_norm_kernels(client, d, DType::BF16, ExecutionMode::Checked) {
            sources.push((format!("rmsnorm-{kernel}-bf16-d{d}"), cpp));
        }
    }
    sources.extend(other_kernels(client));
    for (name, dtype, n) in [
        ("bf16", DType::BF16, 8),
        ("f32", DType::F32, 4),
        ("f16", DType::F16, 8),
    ] {
        for (kernel, cpp) in vector_kernels(client, dtype, n, ExecutionMode::Checked) {
            sources.push((format!("{kernel}-{name}"), cpp));
        }
    }
    sources
}

/// cubecl's CUDA compiler takes every kernel: each source has its entry point (in CI, on every
/// run; NVRTC itself runs in `scripts/cuda-source-check.sh`).
#[test]
fn every_kernel_compiles_to_cuda_cpp() {
    let sources = all_sources(&WgpuRuntime::client(&WgpuDevice::default()));
    for (name, cpp) in &sources {
        assert!(
            cpp.contains("extern \"C\" __global__"),
            "{name}: no kernel entry in {cpp}"
        );
    }
}

/// The kernels that read 16-byte vectors, as CUDA runs them at bf16 and f16 (8 elements a
/// vector, where lavapipe takes 4 at most and has no bf16), run as their CUDA C++ on the CPU
/// emulation against fp64 references (`kernels/cuda-emu/rows.cpp`): SwiGLU forward and
/// backward on pitched rows, the LM head's loss and gradient on GPT-2's odd vocabulary in
/// padded rows (padding excluded from the sums and left unchanged) at a chunk's offset,
/// `add_widened` on rows whose last vector is part padding, RoPE and its transpose added into
/// the heads of a wider tensor in the model's swapped layout, RMSNorm's forward at 768 columns
/// (contiguous and pitched) and at more vectors than units; and RMSNorm as bf16 training runs
/// it (`x` f32, `y` and `dy` bf16; f16 standing in at f16) at 768 columns, forward and
/// backward (with and without the skip connection's gradient, in 3 blocks of rows, the last
/// one partial, and in 40), against fp64; at bf16 also at the 7B's 4,096 columns and
/// MedGemma's 5,376 (the backward's cube of 256 units), the widths its kernels are compiled
/// for apart (`-DONLY_NORM_TRAINING`). And [`copy_kernels`], which read one element at a time
/// but in the storage type (bf16 in training, which lavapipe has not): the joins of two and
/// three parts (one column-major) and the padding, the same bits; `add_into` into the third
/// part's heads in the swapped layout, one f32 sum rounded (the same bits as fp64's sum so
/// rounded), the other heads unchanged. Outputs start as NaN; the kernels are compiled in
/// cubecl's `Validate` mode, so an access past a buffer's end fails too.
#[test]
fn vector_kernels_match_fp64_on_the_cuda_emulation() {
    use crate::{accumulate, join, lm_head, rms_norm, rope, swiglu};
    let client = WgpuRuntime::client(&WgpuDevice::default());
    // How lab launches the kernels, for rows.cpp to launch them alike, with RMSNorm's backward
    // compiled for `norm_width` columns.
    let launches = |norm_width| {
        [
            ("SWIGLU_UNITS", swiglu::UNITS as usize),
            ("ROPE_UNITS", rope::UNITS as usize),
            ("ADD_UNITS", lm_head::ADD_UNITS as usize),
            ("JOIN_UNITS", join::UNITS as usize),
            ("ADD_INTO_UNITS", accumulate::UNITS as usize),
            ("LOSS_UNITS", lm_head::ROW_UNITS),
            ("NORM_UNITS", rms_norm::ROW_UNITS),
            ("NORM_BACKWARD_UNITS", rms_norm::backward_units(norm_width)),
            ("NORM_WIDTH", norm_width),
            ("SUM_COLUMNS", rms_norm::SUM_COLUMNS),
            ("SUM_LANES", rms_norm::SUM_LANES),
        ]
    };
    let bf16 = STORAGES[1];
    let builds = STORAGES
        .map(|storage| (storage, 768, false))
        .into_iter()
        .chain([(bf16, 4096, true), (bf16, 5376, true)]);
    // `rms_norm_kernels`' four, in its order, as rows.cpp includes them.
    let norm_names = [
        "rms_norm_mixed",
        "rms_norm_backward",
        "rms_norm_backward_skip",
        "rms_norm_gain_sums",
    ];
    let emulations = builds
        .map(
            |((suffix, storage, dtype), norm_width, only_norms)| Emulation {
                driver: "rows.cpp",
                kernels: vector_kernels(&client, dtype, 8, ExecutionMode::Validate)
                    .into_iter()
                    .map(|(name, cpp)| (emulated_name(name), cpp))
                    .chain(
                        norm_names.into_iter().zip(
                            rms_norm_kernels(&client, norm_width, dtype, ExecutionMode::Validate)
                                .map(|(_, cpp)| cpp),
                        ),
                    )
                    .chain(copy_kernels(&client, dtype, ExecutionMode::Validate))
                    .collect(),
                storage,
                suffix,
                label: format!("8 a vector, d {norm_width}"),
                defines: defines(launches(norm_width))
                    .into_iter()
                    .chain(only_norms.then(|| "-DONLY_NORM_TRAINING".into()))
                    .collect(),
            },
        )
        .collect();
    emulate_all(emulations);
}

/// The training step's other kernels ([`step_kernels`]) as their CUDA C++ on the CPU emulation
/// (`kernels/cuda-emu/step.cpp`), against fp64: the embedding's backward over two slices of the
/// table, two cubes of columns and three tiles of ids (each element the same bits as its
/// positions' sum in order); the gradient norm's sums of squares of f32 and of bf16, of flat
/// tensors (to the most cubes lab gives one, where some units take two elements) and of
/// matrices read at their strides (column-major, and every other row of a wider buffer, as the
/// feed-forward's joined gate|up gives them), through their partial sums at offsets; AdamW
/// from moments and at its first update, with the gradient flat or a matrix of either layout;
/// and
/// the attention's `D = dO·O` with `lse` in base 2, from bf16 rows (`O` in the model's layout,
/// `dO` contiguous) at head widths 64 and 128.
/// lavapipe runs them too, as WGSL, where a race on their shared memory (the tiles of ids, the
/// sums' tree) shows only if its order of running the units makes a result wrong; the
/// emulation's race detector names one whatever the order.
#[test]
fn step_kernels_match_fp64_on_the_cuda_emulation() {
    use crate::{adamw, embedding, square_sums};
    // x1-50m's head width and the 7B's, for the attention's `D`.
    const DELTA_HEAD_DIM: usize = 64;
    const DELTA_WIDE_HEAD_DIM: usize = 128;
    let client = WgpuRuntime::client(&WgpuDevice::default());
    // How lab launches them, for step.cpp to launch them alike.
    let launches = [
        ("EMBEDDING_UNITS", embedding::UNITS),
        ("ROWS_PER_SLICE", embedding::ROWS_PER_SLICE),
        ("SQUARE_UNITS", square_sums::UNITS as usize),
        ("MOST_SQUARE_CUBES", square_sums::cubes_for(usize::MAX)),
        ("ADAMW_UNITS", adamw::UNITS as usize),
        ("DELTA_HEAD_DIM", DELTA_HEAD_DIM),
        ("DELTA_WIDE_HEAD_DIM", DELTA_WIDE_HEAD_DIM),
        ("DELTA_UNITS", crate::attention::DELTA_UNITS as usize),
    ];
    // Unrolled, as CUDA runs it (`attention::unrolls`).
    let delta = |hd| delta_kernel(&client, DType::BF16, hd, true, ExecutionMode::Validate);
    emulate_all(vec![Emulation {
        driver: "step.cpp",
        kernels: step_kernels(&client, ExecutionMode::Validate)
            .into_iter()
            .chain([
                ("delta", delta(DELTA_HEAD_DIM)),
                ("delta_wide", delta(DELTA_WIDE_HEAD_DIM)),
            ])
            .collect(),
        storage: "float",
        suffix: "f32",
        label: "step".into(),
        defines: defines(launches),
    }]);
}

/// A [`vector_kernels`] name as `rows.cpp` includes the kernel (`NAME.cu`, entry `NAME_kernel`):
/// a C++ identifier.
fn emulated_name(name: &'static str) -> &'static str {
    match name {
        "rmsnorm-forward" => "rms_norm",
        name => name.trim_start_matches("lm_head-"),
    }
}

/// A kernel's shared arrays get the same offsets in every compile: cubecl-opt (vendored,
/// patched) lays them out in the order of their ids, not in a hash set's order, which changed
/// from one process to the next and moved ptxas's registers and spills with it
/// (BENCHMARKS.md). The bounce `dK/dV` has seven shared arrays, the register one four, the
/// register forward and `dQ` one (a key tile and a value tile in one array; one array has
/// nothing to reorder, so for them the test checks only that it is there); at hd 128 each
/// `dK/dV` takes two launches of other layouts. (The order in which cubecl declares local
/// variables still varies, from cubecl-ir's pool of them; ptxas gave the same figures through
/// it.)
#[test]
fn a_kernels_shared_arrays_take_the_same_offsets_in_every_compile() {
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let layouts = || {
        [64, 128]
            .into_iter()
            .flat_map(|hd| [RowWork::Registers, RowWork::Bounce].map(|rows| (hd, rows)))
            .flat_map(|(hd, rows)| {
                let blocks = rows.default_query_blocks(hd);
                let stages = rows.default_tile_stages();
                tensor_core_kernels(
                    &client,
                    DType::BF16,
                    hd,
                    rows,
                    blocks,
                    stages,
                    ExecutionMode::Unchecked,
                )
            })
            .map(|(kernel, cpp)| (kernel, shared_layout(&cpp)))
            .collect::<Vec<_>>()
    };
    let first = layouts();
    assert!(
        first.iter().all(|(_, layout)| !layout.is_empty())
            && first.iter().any(|(_, layout)| layout.len() >= 7),
        "{first:?}"
    );
    for _ in 0..8 {
        assert_eq!(layouts(), first, "another layout of the shared arrays");
    }
}

/// Every tensor-core kernel, register and bounce, leaves room for two cubes an SM on an A100
/// (164 KiB of shared memory an SM, 1 KiB of it reserved a cube): at hd 128 the bounce `dQ`
/// and `dK` needed 91 KiB, one cube an SM, until their accumulators went through the shared
/// rows in halves.
#[test]
fn tensor_core_kernels_fit_two_cubes_an_sm_on_an_a100() {
    const A100_SHARED_PER_SM: usize = 164 * 1024;
    for (hd, _, kernel, cpp) in default_tensor_core_kernels() {
        let bytes = shared_bytes(&cpp);
        assert!(bytes > 0, "{kernel} at hd {hd}: no shared arrays in {cpp}");
        assert!(
            2 * (bytes + RESERVED_PER_CUBE) <= A100_SHARED_PER_SM,
            "{kernel} at hd {hd}: {bytes} bytes of shared memory, one cube an SM on an A100"
        );
    }
}

/// The register `dK/dV` launches from hd 64 on ask ptxas for three cubes an SM
/// (`__launch_bounds__(128, 3)`, from their comment `lab: cubes an SM 3` through the vendored
/// cubecl-cpp's patch), which their shared memory leaves room for on an H100; every other
/// tensor-core kernel compiles with the thread count alone.
#[test]
fn register_grad_kv_kernels_ask_for_three_cubes_an_sm() {
    const H100_SHARED_PER_SM: usize = 228 * 1024;
    let mut bounded = 0;
    for (hd, rows, kernel, cpp) in default_tensor_core_kernels() {
        let three = rows == RowWork::Registers && kernel.starts_with("grad_kv") && hd >= 64;
        let bounds = if three { "(128, 3)" } else { "(128)" };
        assert!(
            cpp.contains(&format!("__global__ void __launch_bounds__{bounds}")),
            "{kernel} ({rows:?}) at hd {hd}: not __launch_bounds__{bounds}"
        );
        if three {
            bounded += 1;
            let bytes = shared_bytes(&cpp);
            let room = 3 * (bytes + RESERVED_PER_CUBE) <= H100_SHARED_PER_SM;
            assert!(
                room,
                "{kernel} at hd {hd}: {bytes} bytes, under 3 cubes an SM"
            );
        }
    }
    // hd 64's one launch, 80's, 96's and 128's two each.
    assert_eq!(bounded, 7);
}

/// Shared memory a CUDA SM reserves for each cube.
const RESERVED_PER_CUBE: usize = 1024;

/// Every tensor-core kernel, register and bounce, at bf16 and every head width they take, as
/// their launches define them by default: `(hd, rows, kernel, source)`.
fn default_tensor_core_kernels() -> Vec<(usize, RowWork, &'static str, String)> {
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let families = tensor_core_widths()
        .flat_map(|hd| [RowWork::Registers, RowWork::Bounce].map(|rows| (hd, rows)));
    families
        .flat_map(|(hd, rows)| {
            let kernels = tensor_core_kernels(
                &client,
                DType::BF16,
                hd,
                rows,
                rows.default_query_blocks(hd),
                rows.default_tile_stages(),
                ExecutionMode::Unchecked,
            );
            kernels
                .into_iter()
                .map(move |(kernel, cpp)| (hd, rows, kernel, cpp))
        })
        .collect()
}

/// The end of a kernel's last shared array: cubecl writes each array's size in a comment
/// (`// Shared array size: N, BYTES bytes`) above its line `T *shared_memory_N = …[OFFSET]`.
fn shared_bytes(cpp: &str) -> usize {
    let lines: Vec<&str> = cpp.lines().collect();
    let number = |text: &str| -> usize {
        let digits: String = text.chars().filter(char::is_ascii_digit).collect();
        digits.parse().expect("a number")
    };
    lines
        .windows(2)
        .filter_map(|pair| {
            let size = pair[0].strip_prefix("// Shared array size: ")?;
            let bytes = number(size.split(", ").nth(1)?);
            let offset = pair[1]
                .split("dynamic_shared_mem[")
                .nth(1)?
                .split(']')
                .next()?;
            Some(number(offset) + bytes)
        })
        .max()
        .unwrap_or(0)
}

/// A kernel's shared arrays as cubecl declares them: `T *shared_memory_N = … [OFFSET]`, sorted.
fn shared_layout(cpp: &str) -> Vec<String> {
    let mut arrays: Vec<String> = cpp
        .lines()
        .filter(|line| line.contains("*shared_memory_") && line.contains("dynamic_shared_mem["))
        .map(str::to_string)
        .collect();
    arrays.sort_unstable();
    arrays
}

/// Writes [`all_sources`] as `NAME.cu` files into `LAB_CUDA_SOURCE_DIR`.
#[test]
#[ignore = "writes files for scripts/cuda-source-check.sh"]
fn writes_the_cuda_sources() {
    let dir = std::env::var("LAB_CUDA_SOURCE_DIR")
        .expect("LAB_CUDA_SOURCE_DIR: set it to the folder for the .cu files");
    for (name, cpp) in all_sources(&WgpuRuntime::client(&WgpuDevice::default())) {
        std::fs::write(format!("{dir}/{name}.cu"), cpp).expect("LAB_CUDA_SOURCE_DIR: writable");
    }
}
