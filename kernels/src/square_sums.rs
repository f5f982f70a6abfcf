//! `Σ x²` over every element of many tensors, in one launch per non-empty tensor and one more:
//! the global gradient norm's sum of squares.
//!
//! Written with burn's tensor ops, each parameter's share of the norm is a cast, a square, two
//! or three reduction passes and an addition to the running total: about 360 of the ~909
//! launches of an x1-50m step at one micro-batch (`scripts/launches.sh`), each costing the
//! host its issue time whatever the kernel's size. Here each tensor is one launch (a matrix is
//! read at its strides; any other strided tensor is copied contiguous first) whose cubes each
//! write the sum of their units' squares to their own slot of one buffer of partial
//! sums, and one last launch of a single cube sums that buffer.
//!
//! Every slot is written by exactly one cube, and every sum runs in a fixed order (strided per
//! unit, then a tree over shared memory), so the result is the same bits on every run on the
//! same device, whatever the timing. Squares are summed in f32 whatever the storage type.

use burn::tensor::{DType, Shape};
use burn_cubecl::{ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor, CubeRuntime};
use cubecl::prelude::*;

use crate::layout::{matrix_at_its_strides, row_major_at};

/// Units per cube.
pub(crate) const UNITS: u32 = 256;
// The tree in `cube_sum` halves the cube's width down to one unit.
const _: () = assert!(UNITS.is_power_of_two());

/// The most cubes one tensor gets: enough to keep a GPU's memory busy, few enough that the
/// last launch (one cube) sums every tensor's partials quickly.
const MAX_CUBES: usize = 1024;

/// The cubes (and partial sums) a tensor of `n` elements gets.
pub fn cubes_for(n: usize) -> usize {
    n.div_ceil(UNITS as usize).min(MAX_CUBES)
}

/// The slots of partial sums tensors of these element counts need together.
pub fn partials_len(numels: impl IntoIterator<Item = usize>) -> usize {
    numels.into_iter().map(cubes_for).sum()
}

/// The sum of every unit's `x`, in a tree over shared memory (the same order on every run).
#[cube]
fn cube_sum<A: Float>(x: A, #[comptime] units: usize) -> A {
    let u = UNIT_POS_X as usize;
    let mut sums = SharedMemory::<A>::new(units);
    sums[u] = x;
    sync_cube();
    // Halving from the cube's width, a runtime value: cubecl cannot mutate a comptime one.
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if u < stride {
            let other = sums[u + stride];
            sums[u] += other;
        }
        sync_cube();
        stride /= 2;
    }
    sums[0]
}

/// `partials[offset + c] = Σ x[i]²` over the elements cube `c` owns: unit `u` of cube `c`
/// takes every element `(c · units + u) + k · (cubes · units)`, so consecutive units read
/// consecutive elements.
#[cube(launch)]
pub(crate) fn partial_squares_kernel<F: Float, A: Float>(
    x: &Tensor<F>,
    partials: &mut Tensor<A>,
    offset: usize,
    #[comptime] units: usize,
    #[comptime] x_is_matrix: bool,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    // The count of elements, whatever the strides.
    let n = x.len();
    let stride = CUBE_COUNT_X as usize * CUBE_DIM_X as usize;
    let mut i = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    let mut sum = A::new(0.0);
    while i < n {
        let v = A::cast_from(x[row_major_at(x, i, x_is_matrix)]);
        sum += v * v;
        i += stride;
    }
    let total = cube_sum::<A>(sum, units);
    if UNIT_POS_X == 0 {
        partials[offset + CUBE_POS_X as usize] = total;
    }
}

/// `out[0] = Σ partials[j]` over the first `count` slots, by one cube.
#[cube(launch)]
pub(crate) fn sum_partials_kernel<A: Float>(
    partials: &Tensor<A>,
    out: &mut Tensor<A>,
    count: usize,
    #[comptime] units: usize,
    #[define(A)] _dtype: StorageType,
) {
    let mut j = UNIT_POS_X as usize;
    let mut sum = A::new(0.0);
    while j < count {
        sum += partials[j];
        j += CUBE_DIM_X as usize;
    }
    let total = cube_sum::<A>(sum, units);
    if UNIT_POS_X == 0 {
        out[0] = total;
    }
}

fn new_f32<R: CubeRuntime>(like: &CubeTensor<R>, len: usize) -> CubeTensor<R> {
    let shape = Shape::new([len]);
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, DType::F32)
}

/// Whether the kernels take tensors of this dtype.
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// `Σ x²` over every element of every tensor of `xs` (any shapes and strides; f32, f16 or bf16,
/// see [`supports`]; on one device; at least one tensor), as a new f32 tensor of shape `[1]`.
pub fn sum_of_squares<R: CubeRuntime>(xs: Vec<CubeTensor<R>>) -> CubeTensor<R> {
    let first = xs.first().expect("sum_of_squares: no tensors");
    let count = partials_len(xs.iter().map(|x| x.meta.shape().num_elements()));
    // A buffer of no bytes cannot be bound on every runtime: one slot at least.
    let partials = new_f32(first, count.max(1));
    let out = new_f32(first, 1);
    sum_of_squares_into(xs, partials, out)
}

/// [`sum_of_squares`] with the partial sums' buffer and the output the caller allocated (tests
/// poison them to see unwritten slots): f32 and contiguous, `partials` of at least
/// [`partials_len`] slots (only those are read), `out` of shape `[1]`.
pub fn sum_of_squares_into<R: CubeRuntime>(
    xs: Vec<CubeTensor<R>>,
    partials: CubeTensor<R>,
    out: CubeTensor<R>,
) -> CubeTensor<R> {
    let count = partials_len(xs.iter().map(|x| x.meta.shape().num_elements()));
    for (name, t) in [("partials", &partials), ("out", &out)] {
        assert_eq!(t.dtype, DType::F32, "sum_of_squares: {name} is not f32");
        assert!(
            t.is_contiguous(),
            "sum_of_squares: {name} is not contiguous"
        );
    }
    assert!(
        partials.meta.shape().num_elements() >= count,
        "sum_of_squares: {count} partial sums need as many slots"
    );
    assert_eq!(
        out.meta.shape().num_elements(),
        1,
        "sum_of_squares: out is not [1]"
    );
    let client = out.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    let mut offset = 0;
    for x in xs {
        let n = x.meta.shape().num_elements();
        if n == 0 {
            continue;
        }
        assert!(supports(x.dtype), "sum_of_squares: {:?} tensors", x.dtype);
        let cubes = cubes_for(n);
        let types = [x.dtype.into(), DType::F32.into()];
        let (x, x_is_matrix) = matrix_at_its_strides(x);
        partial_squares_kernel::launch::<R>(
            &client,
            CubeCount::Static(cubes as u32, 1, 1),
            cube_dim,
            x.into_tensor_arg(),
            partials.clone().into_tensor_arg(),
            offset,
            UNITS as usize,
            x_is_matrix,
            types,
        );
        offset += cubes;
    }
    sum_partials_kernel::launch::<R>(
        &client,
        CubeCount::Static(1, 1, 1),
        cube_dim,
        partials.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        count,
        UNITS as usize,
        DType::F32.into(),
    );
    out
}
