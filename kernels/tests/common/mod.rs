//! What the kernel tests share: seeded host values, upload and download on the GPU device
//! (wgpu, lavapipe in CI; CUDA when built with only `--features cuda`, on a GPU host),
//! NaN-poisoned outputs, and a comparison against fp64 references.
#![allow(dead_code)] // each test file uses its own subset

use burn::tensor::{backend::Backend, DType, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::{tensor::CubeTensor, CubeBackend};

// The same `#[cube]` source runs on both; wgpu wins when both are built, as in CI.
#[cfg(feature = "wgpu")]
pub use burn::backend::wgpu::{WgpuDevice as Device, WgpuRuntime as Runtime};
#[cfg(not(feature = "wgpu"))]
pub use {burn::backend::cuda::CudaDevice as Device, cubecl::cuda::CudaRuntime as Runtime};

pub type B = CubeBackend<Runtime, f32, i32, u32>;
pub type Prim = CubeTensor<Runtime>;

pub fn device() -> Device {
    Device::default()
}

/// Panics unless the device stores f16 (lavapipe does): the f16 kernel tests would
/// otherwise check nothing.
pub fn assert_device_has_f16() {
    assert!(
        B::supports_dtype(&device(), DType::F16),
        "this wgpu device has no f16 (lavapipe has it): the f16 kernels cannot be checked"
    );
}

/// Seeded host values, N(0, 1), rounded to `dtype` so the reference sees what the
/// GPU sees.
pub fn values(n: usize, seed: u64, dtype: DType) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            let x = ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32;
            rounded(x, dtype)
        })
        .collect()
}

/// `x` as `dtype` would store it.
pub fn rounded(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => burn::tensor::f16::from_f32(x).to_f32(),
        DType::BF16 => burn::tensor::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// `data` on the device as a contiguous tensor of `shape` (1 to 4 dims) in `dtype`, on every
/// runtime. CUDA's allocator pitches the rows of a new tensor (cubecl's
/// `PitchedMemoryLayoutPolicy`: a row of 512 bytes or more padded to a multiple of 512, a
/// shorter one to a power of two), so burn's `from_data` and `cast` give a 69-column f32
/// matrix rows 128 elements apart there; `into_contiguous` copies such a tensor into an
/// unpadded buffer (and leaves a contiguous one as it is), so that the layouts the tests build
/// from it are the layouts they say. An empty tensor is made with no launch: CUDA pads even
/// an empty tensor's rows, and refuses a launch of no cubes (the copy's, or a cast's).
pub fn upload(data: &[f32], shape: &[usize], dtype: DType) -> Prim {
    if shape.contains(&0) {
        let client = <Runtime as cubecl::Runtime>::client(&device());
        let shape = shape.to_vec().into();
        return burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
            client,
            device(),
            shape,
            dtype,
        );
    }
    let data = TensorData::new(data.to_vec(), shape.to_vec());
    fn on_device<const D: usize>(data: TensorData, dtype: DType) -> Prim {
        let t = Tensor::<B, D>::from_data(data, &device());
        let t = if dtype == DType::F32 {
            t
        } else {
            t.cast(dtype)
        };
        burn_cubecl::kernel::into_contiguous(t.into_primitive().tensor())
    }
    // Built in its shape, not reshaped: burn reads a 0 in a reshape as "keep this axis",
    // so an empty tensor's `[cols, 0]` would not be a shape there.
    match shape.len() {
        1 => on_device::<1>(data, dtype),
        2 => on_device::<2>(data, dtype),
        3 => on_device::<3>(data, dtype),
        4 => on_device::<4>(data, dtype),
        _ => panic!("upload: 1 to 4 dims, got {shape:?}"),
    }
}

/// A `[rows, cols]` input's shape, and whether it is stored `[cols, rows]` and read through a
/// transposed view: strided rows, as a gradient through a matmul's transpose arrives.
#[derive(Clone, Copy, Debug)]
pub struct Matrix {
    pub shape: [usize; 2],
    pub transposed: bool,
}

pub const fn matrix(shape: [usize; 2], transposed: bool) -> Matrix {
    Matrix { shape, transposed }
}

impl Matrix {
    /// `data` (`rows × cols`, row-major) on the device in this layout.
    pub fn upload(&self, data: &[f32], dtype: DType) -> Prim {
        let [rows, cols] = self.shape;
        if !self.transposed {
            return upload(data, &self.shape, dtype);
        }
        let stored: Vec<f32> = (0..rows * cols)
            .map(|k| data[(k % rows) * cols + k / rows])
            .collect();
        let t = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(upload(
            &stored,
            &[cols, rows],
            dtype,
        )));
        t.transpose().into_primitive().tensor()
    }
}

/// How a test hands a `[rows, cols]` input to a kernel: contiguous, as the transpose of a
/// stored `[cols, rows]` tensor (strided rows, as a gradient through a matmul's transpose
/// arrives), padded (rows of `cols + 3` elements, the last 3 NaN, as CUDA pads a product's
/// output), or at an offset (the right-hand columns of a wider tensor, after
/// [`OFFSET_COLUMNS`] NaN columns a row, as the up weight's gradient is the right half of the
/// joined gate and up product's: a view that starts inside its buffer).
#[derive(Clone, Copy, Debug)]
pub enum Input {
    Contiguous,
    Transposed,
    Padded,
    Offset,
}

/// The NaN columns before an [`Input::Offset`] view's: 256, so that its start, 512 bytes into
/// the buffer in f16 and bf16 and 1,024 in f32, is a multiple of every device's alignment
/// (CUDA's is 512 bytes), and burn's slice gives a view, not a copy.
pub const OFFSET_COLUMNS: usize = 256;

impl Input {
    /// `data` (row-major) on the device in this layout.
    pub fn upload(self, data: &[f32], shape: [usize; 2], dtype: DType) -> Prim {
        match self {
            Input::Contiguous => matrix(shape, false).upload(data, dtype),
            Input::Transposed => matrix(shape, true).upload(data, dtype),
            Input::Padded => padded(data, shape, 3, dtype).0,
            Input::Offset => at_an_offset(data, shape, dtype),
        }
    }

    /// Any of the four, for proptest.
    pub fn any() -> impl proptest::strategy::Strategy<Value = Input> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Input::Contiguous),
            Just(Input::Transposed),
            Just(Input::Padded),
            Just(Input::Offset)
        ]
    }
}

/// How a test lays out a logical `[B, H, T, hd]` tensor (attention's and RoPE's heads) on
/// the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Contiguous,
    /// Stored `[B, T, H, hd]`, the middle axes swapped: the model's projections as the
    /// attention reads them.
    HeadsSwapped,
    /// Stored `[B, H, hd, T]`, the last axes swapped: rows are strided.
    RowsStrided,
    /// Stored `[B, H, T, hd + PAD]` with NaN in the padding, read through a view of `hd` columns:
    /// every row starts `hd + PAD` elements after the last, as in a padded matmul output.
    Padded,
}

/// The padding columns of [`Layout::Padded`].
const PAD: usize = 3;

impl Layout {
    pub const ALL: [Layout; 4] = [
        Layout::Contiguous,
        Layout::HeadsSwapped,
        Layout::RowsStrided,
        Layout::Padded,
    ];

    /// The axes of `[B, H, T, hd]` in the order they are stored.
    fn stored_axes(self) -> [usize; 4] {
        match self {
            Layout::Contiguous | Layout::Padded => [0, 1, 2, 3],
            Layout::HeadsSwapped => [0, 2, 1, 3],
            Layout::RowsStrided => [0, 1, 3, 2],
        }
    }

    /// The shape of the buffer behind a tensor of the logical `shape`.
    fn stored_shape(self, shape: [usize; 4]) -> [usize; 4] {
        let mut stored = self.stored_axes().map(|a| shape[a]);
        if self == Layout::Padded {
            stored[3] += PAD;
        }
        stored
    }

    /// `data` (row-major in the logical `shape`) on the device in this layout.
    pub fn upload(self, data: &[f32], shape: [usize; 4], dtype: DType) -> Prim {
        let axes = self.stored_axes();
        let stored_shape = self.stored_shape(shape);
        let (logical, steps) = (row_major_strides(shape), row_major_strides(stored_shape));
        // Element `k` of the buffer, at index `k / steps[i] % stored_shape[i]` along its axes.
        let stored: Vec<f32> = (0..stored_shape.iter().product())
            .map(|k| {
                let index = [0, 1, 2, 3].map(|i| k / steps[i] % stored_shape[i]);
                if index[3] >= shape[axes[3]] {
                    return f32::NAN; // padding
                }
                data[(0..4).map(|i| index[i] * logical[axes[i]]).sum::<usize>()]
            })
            .collect();
        let t = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(upload(
            &stored,
            &stored_shape,
            dtype,
        )));
        // Each of these orders is its own inverse.
        let mut t: Prim = t.permute(axes).into_primitive().tensor();
        // The padding out of sight: a view with the buffer's strides (burn's `narrow` copies).
        t.meta.shape_mut()[3] = shape[3];
        assert!(
            self.holds(&t),
            "{self:?}: uploaded with strides {:?}",
            t.meta.strides()
        );
        t
    }

    /// A tensor of `shape` in this layout filled with NaN: what the kernels must overwrite.
    pub fn poisoned(self, shape: [usize; 4], dtype: DType) -> Prim {
        self.upload(&vec![f32::NAN; shape.iter().product()], shape, dtype)
    }

    /// Whether `t` is laid out as this layout stores it (axes of size 1 aside, and empty
    /// tensors, whose strides mean nothing).
    pub fn holds(self, t: &Prim) -> bool {
        let s = t.meta.shape();
        let shape = [s[0], s[1], s[2], s[3]];
        let axes = self.stored_axes();
        let stored = row_major_strides(self.stored_shape(shape));
        let mut want = [0; 4];
        for (i, a) in axes.into_iter().enumerate() {
            want[a] = stored[i];
        }
        let empty = shape.contains(&0);
        empty || (0..4).all(|a| shape[a] == 1 || t.meta.strides()[a] == want[a])
    }
}

fn row_major_strides(shape: [usize; 4]) -> [usize; 4] {
    [
        shape[1] * shape[2] * shape[3],
        shape[2] * shape[3],
        shape[3],
        1,
    ]
}

/// `data` (`rows × cols`, row-major) on the device as a padded view: each row followed by
/// `pad` NaN columns, as CUDA pads a matmul's output and the loss pads its vocabulary (a view
/// from `leading_columns`, for any `pad`). Returns (the `[rows, cols]` view, the whole `[rows, cols + pad]` buffer).
pub fn padded(data: &[f32], [rows, cols]: [usize; 2], pad: usize, dtype: DType) -> (Prim, Prim) {
    let width = cols + pad;
    let mut full = vec![f32::NAN; rows * width];
    for r in 0..rows {
        full[r * width..][..cols].copy_from_slice(&data[r * cols..][..cols]);
    }
    let whole = upload(&full, &[rows, width], dtype);
    (lab_kernels::lm_head::leading_columns(&whole, cols), whole)
}

/// `data` (`rows × cols`, row-major) on the device as [`Input::Offset`] lays it out; panics if
/// burn's slice copied a non-empty one instead of viewing it.
fn at_an_offset(data: &[f32], [rows, cols]: [usize; 2], dtype: DType) -> Prim {
    let width = OFFSET_COLUMNS + cols;
    let mut full = vec![f32::NAN; rows * width];
    for r in 0..rows {
        full[r * width + OFFSET_COLUMNS..][..cols].copy_from_slice(&data[r * cols..][..cols]);
    }
    let whole = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(upload(
        &full,
        &[rows, width],
        dtype,
    )));
    let view = whole
        .slice([0..rows, OFFSET_COLUMNS..width])
        .into_primitive()
        .tensor();
    // burn gives an empty slice as a new empty tensor: there is nothing in it to read.
    if rows * cols > 0 {
        assert_eq!(
            view.meta.strides()[0],
            width,
            "burn copied the slice: the offset is not aligned for this device"
        );
    }
    view
}

/// Panics if a kernel wrote any padding column of [`padded`]'s whole buffer.
pub fn assert_padding_untouched(whole: Prim, cols: usize) {
    let width = whole.meta.shape()[1];
    for (i, x) in download(whole).iter().enumerate() {
        assert!(i % width < cols || x.is_nan(), "padding [{i}] written: {x}");
    }
}

/// The widest vector of f32 the device of `t` reads in one access (`lab_kernels::vectors`
/// takes no wider), checked to be more than one element: a test of the vector paths would
/// otherwise test one element a unit.
pub fn widest_f32_vector(t: &Prim) -> usize {
    let widest = t.client.io_optimized_vector_sizes(4).max().unwrap_or(1);
    assert!(widest > 1, "the device loads one f32 an access");
    widest
}

/// A tensor of `shape` filled with NaN in `dtype`: what the kernels must overwrite.
pub fn poisoned(shape: &[usize], dtype: DType) -> Prim {
    upload(&vec![f32::NAN; shape.iter().product()], shape, dtype)
}

/// The tensor's elements as f32 on the host, after every launched kernel has finished.
pub fn download(t: Prim) -> Vec<f32> {
    B::sync(&device()).expect("a kernel failed");
    fn data<const D: usize>(t: Prim) -> TensorData {
        Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t)).into_data()
    }
    let data = match t.meta.shape().num_dims() {
        1 => data::<1>(t),
        2 => data::<2>(t),
        3 => data::<3>(t),
        _ => data::<4>(t),
    };
    data.convert::<f32>().to_vec::<f32>().unwrap()
}

mod close;
use close::assert_close_from;
#[allow(unused_imports)] // the benches include this file too
pub use close::f32_products;

/// Every element within `tol` × the largest reference magnitude (at least 1); NaN fails.
pub fn assert_close(name: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_close_from(name, got, want, tol, 1.0);
}

/// Every element within `tol` × `scale` (or × the largest reference magnitude, if larger):
/// for values whose size is known to be at most `scale` and may be far below 1 (a softmax
/// gradient is at most 1/N), where [`assert_close`] would turn the tolerance absolute.
pub fn assert_close_to_scale(name: &str, got: &[f32], want: &[f64], tol: f64, scale: f64) {
    assert_close_from(name, got, want, tol, scale);
}
