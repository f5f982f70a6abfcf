//! The embedding's backward as a cubecl kernel: the gradient of a `[V, d]` table from the
//! gradient of the rows it gave, `grad[v] = Σ dy[i]` over the positions `i` whose id is `v`.
//!
//! burn's kernel (`select_add` on a zeroed table) gives each of the `d` columns one unit, which
//! walks all `N` positions in order: 768 units for x1-50m, each doing 32,768 dependent
//! read-add-writes, which took 11.5 ms of an H100's step. Here the table's rows are also split
//! into slices of [`ROWS_PER_SLICE`], one unit per (slice, column): a unit still walks every
//! position in order, but adds only those whose id falls in its slice. No two units write the
//! same element, so there are no atomics, and each element sums its positions in ascending
//! order from zero, as burn's kernel does: the same bits. Ids are staged through shared
//! memory a tile at a time, read by every unit of the cube.
//!
//! Each unit first zeroes its slice of its column, so every element is written. Ids are read
//! as `u32`: with the backends' `i32` ids, one outside `0..V` (negative ones wrap past
//! 2^31) adds nowhere, where burn's checked launch would clamp it, so the bits match burn's
//! for valid ids only; the data loader refuses others before they reach the model.

use burn::tensor::{DType, Shape};
use burn_cubecl::{
    kernel::into_contiguous, ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor,
    CubeRuntime,
};
use cubecl::prelude::*;

/// Rows of the table per slice: x1-50m's 50,257 words are 99 slices, 76,032 units with its
/// 768 columns.
pub const ROWS_PER_SLICE: usize = 512;

/// Units per cube, each a column; also the ids staged per tile.
pub(crate) const UNITS: usize = 256;

#[cube(launch)]
pub(crate) fn embedding_grad_kernel<F: Float, I: Numeric>(
    dy: &Tensor<F>,
    ids: &Tensor<I>,
    grad: &mut Tensor<F>,
    rows_per_slice: usize,
    #[comptime] units: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (vocab, d, n) = (grad.shape(0), grad.shape(1), ids.shape(0));
    let u = UNIT_POS_X as usize;
    let c = CUBE_POS_X as usize * units + u;
    let lo = CUBE_POS_Y as usize * rows_per_slice;
    let mut hi = lo + rows_per_slice;
    if hi > vocab {
        hi = vocab;
    }
    let (g_row, g_col) = (grad.stride(0), grad.stride(1));
    let (dy_row, dy_col) = (dy.stride(0), dy.stride(1));
    // Units past the last column stay: they load ids and meet the barriers.
    let in_table = c < d;
    if in_table {
        let mut v = lo;
        while v < hi {
            grad[v * g_row + c * g_col] = F::new(0.0);
            v += 1;
        }
    }
    let mut tile = SharedMemory::<u32>::new(units);
    let mut start = 0;
    while start < n {
        if start + u < n {
            tile[u] = u32::cast_from(ids[(start + u) * ids.stride(0)]);
        }
        sync_cube();
        if in_table {
            let mut len = n - start;
            if len > units {
                len = units;
            }
            let mut k = 0;
            while k < len {
                let v = usize::cast_from(tile[k]);
                if v >= lo && v < hi {
                    let at = v * g_row + c * g_col;
                    grad[at] = grad[at] + dy[(start + k) * dy_row + c * dy_col];
                }
                k += 1;
            }
        }
        sync_cube();
        start += units;
    }
}

/// The gradient `[vocab, d]` of an embedding table from `dy [N, d]` (the gradient of the rows
/// it gave, any strides) and `ids [N]` (the rows it gave, an integer tensor), in `dy`'s
/// dtype: a new contiguous tensor.
pub fn embedding_grad<R: CubeRuntime>(
    dy: CubeTensor<R>,
    ids: CubeTensor<R>,
    vocab: usize,
) -> CubeTensor<R> {
    let s = dy.meta.shape();
    assert_eq!(s.num_dims(), 2, "embedding_grad: dy is [N, d]");
    let [n, d] = [s[0], s[1]];
    let grad = empty_device_contiguous_dtype(
        dy.client.clone(),
        dy.device.clone(),
        Shape::new([vocab, d]),
        dy.dtype,
    );
    embedding_grad_into(dy, ids, grad, [n, d])
}

/// [`embedding_grad`] into a table the caller allocated (tests poison it to see unwritten
/// elements): contiguous `[vocab, d]` in `dy`'s dtype.
pub fn embedding_grad_into<R: CubeRuntime>(
    dy: CubeTensor<R>,
    ids: CubeTensor<R>,
    grad: CubeTensor<R>,
    [n, d]: [usize; 2],
) -> CubeTensor<R> {
    assert_eq!(
        ids.meta.shape().as_slice(),
        [n],
        "embedding_grad: ids are not [{n}]"
    );
    let g = grad.meta.shape();
    assert!(
        g.num_dims() == 2 && g[1] == d && grad.is_contiguous(),
        "embedding_grad: the table is not a contiguous [V, {d}]"
    );
    assert_eq!(grad.dtype, dy.dtype, "embedding_grad: table and dy dtypes");
    assert!(
        matches!(dy.dtype, DType::F32 | DType::F16 | DType::BF16),
        "embedding_grad: dy is {:?}",
        dy.dtype
    );
    let vocab = g[0];
    // cubecl indexes with 32-bit addresses: the table's elements, and the farthest element
    // `dy`'s strides reach (a view of a larger buffer can reach past N·d).
    let ds = dy.meta.strides();
    let dy_reach = (n.max(1) as u64 - 1) * ds[0] as u64 + (d.max(1) as u64 - 1) * ds[1] as u64;
    assert!(
        (vocab as u64) * (d as u64) < 1 << 32 && dy_reach < 1 << 32,
        "embedding_grad: 2^32 elements or more"
    );
    if vocab * d == 0 {
        return grad;
    }
    let ids = into_contiguous(ids);
    let slices = vocab.div_ceil(ROWS_PER_SLICE);
    assert!(
        slices <= crate::rows::MAX_GRID,
        "embedding_grad: {vocab} rows"
    );
    let client = grad.client.clone();
    let types = [dy.dtype.into(), ids.dtype.into()];
    embedding_grad_kernel::launch::<R>(
        &client,
        CubeCount::Static(d.div_ceil(UNITS) as u32, slices as u32, 1),
        CubeDim::new_1d(UNITS as u32),
        dy.into_tensor_arg(),
        ids.into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        ROWS_PER_SLICE,
        UNITS,
        types,
    );
    grad
}
