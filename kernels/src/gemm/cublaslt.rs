//! cuBLASLt through cudarc, on the device memory of cubecl's tensors.
//!
//! cubecl's stream is private, so the product is ordered by waiting on the host: cubecl's
//! queue is drained before cuBLASLt reads the inputs, and cuBLASLt's stream is drained before
//! the output goes back to cubecl. That is two waits per product, where a patched cubecl could
//! order both streams with events; they are the price of reaching cuBLAS without one.
//! The library is loaded at run time (cudarc's dynamic loading), as the rest of CUDA is.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, OnceLock};

use burn::tensor::{bf16, f16, DType};
use burn_cubecl::{ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor};
use cubecl::cuda::CudaRuntime;
use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaContext, CudaStream};

use super::{plan, Plan};

/// One GPU's cuBLASLt handle (with its workspace) and the stream it runs on.
struct Library {
    blas: CudaBlasLT,
    stream: Arc<CudaStream>,
}

/// `a · b` on cuBLASLt, or `None` for dtypes other than f16 and bf16 (f32 would run as TF32
/// there, which cubecl's f32 matmul does not) or layouts [`plan`] refuses.
pub(super) fn matmul(
    a: &CubeTensor<CudaRuntime>,
    b: &CubeTensor<CudaRuntime>,
) -> Option<CubeTensor<CudaRuntime>> {
    if a.dtype != b.dtype || !matches!(a.dtype, DType::BF16 | DType::F16) {
        return None;
    }
    let ((a_shape, a_strides), (b_shape, b_strides)) = (dims(a)?, dims(b)?);
    let plan = plan(a_shape, a_strides, b_shape, b_strides)?;
    let shape = [a_shape[0], b_shape[1]];
    let out =
        empty_device_contiguous_dtype(a.client.clone(), a.device.clone(), shape.into(), a.dtype);
    debug_assert_eq!(
        out.meta.strides().to_vec(),
        vec![shape[1], 1],
        "ldc = N needs it"
    );
    let library = library(a.device.index);
    // The resources first: for a tensor written on another thread's cubecl stream, this
    // queues a wait for it on ours, which the drain below then covers.
    let memory = [a, b, &out].map(|t| {
        t.client
            .get_resource(t.handle.clone())
            .unwrap_or_else(|e| panic!("cuBLASLt: a tensor's device memory: {e:?}"))
    });
    let [a_mem, b_mem, out_mem] = memory
        .each_ref()
        .map(|m| (m.resource().ptr, m.resource().size));
    // cuBLASLt assumes 256-byte aligned operands; cubecl's CUDA pool aligns to 512, so this
    // only guards against a change there.
    if [a_mem, b_mem, out_mem]
        .iter()
        .any(|(ptr, _)| ptr % 256 != 0)
    {
        return None;
    }
    // The inputs are written once cubecl's queue has run.
    cubecl::future::block_on(a.client.sync())
        .unwrap_or_else(|e| panic!("cuBLASLt: waiting for cubecl's queue failed: {e:?}"));
    match a.dtype {
        DType::BF16 => library.run::<bf16>(plan, b_mem, a_mem, out_mem),
        _ => library.run::<f16>(plan, b_mem, a_mem, out_mem),
    }
    Some(out)
}

impl Library {
    /// The call `plan` on device memory `(pointer, bytes)`: `x` and `y` as [`Plan`] names them,
    /// `d` the output. Returns once the product is in `d`.
    fn run<T>(&self, plan: Plan, x: (u64, u64), y: (u64, u64), d: (u64, u64))
    where
        CudaBlasLT: Matmul<T>,
    {
        let config = MatmulConfig {
            transa: plan.x.transpose,
            transb: plan.y.transpose,
            transc: false,
            m: plan.m as u64,
            n: plan.n as u64,
            k: plan.k as u64,
            alpha: 1.0,
            lda: plan.x.ld as i64,
            ldb: plan.y.ld as i64,
            beta: 0.0,
            ldc: plan.m as i64,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            stride_bias: None,
            batch_size: None,
        };
        let elements = |(_, bytes): (u64, u64)| bytes as usize / std::mem::size_of::<T>();
        let context = self.stream.context();
        context
            .bind_to_thread()
            .unwrap_or_else(|e| panic!("cuBLASLt: binding the CUDA context: {e:?}"));
        // SAFETY: the pointers are cubecl's live allocations of at least these sizes (held by
        // `matmul`'s resources until the stream is drained below). The slices are never
        // dropped, not even if cudarc panics: a drop would free memory cubecl owns.
        unsafe {
            let borrow = |(ptr, bytes)| {
                ManuallyDrop::new(
                    self.stream
                        .upgrade_device_ptr::<T>(ptr, elements((ptr, bytes))),
                )
            };
            let (x_slice, y_slice, mut d_slice) = (borrow(x), borrow(y), borrow(d));
            self.blas
                .matmul(config, &*x_slice, &*y_slice, &mut *d_slice, None, None)
                .unwrap_or_else(|e| panic!("cuBLASLt matmul {plan:?}: {e:?}"));
        }
        self.stream
            .synchronize()
            .unwrap_or_else(|e| panic!("cuBLASLt: waiting for the product: {e:?}"));
    }
}

/// The library for GPU `ordinal`, made on first use.
fn library(ordinal: usize) -> Arc<Library> {
    static LIBRARIES: OnceLock<Mutex<HashMap<usize, Arc<Library>>>> = OnceLock::new();
    let mut libraries = LIBRARIES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    libraries
        .entry(ordinal)
        .or_insert_with(|| Arc::new(Library::new(ordinal)))
        .clone()
}

impl Library {
    fn new(ordinal: usize) -> Self {
        let context = CudaContext::new(ordinal)
            .unwrap_or_else(|e| panic!("cuBLASLt: CUDA context of GPU {ordinal}: {e:?}"));
        // The ordering is by waiting (module docs): cudarc's own events would only add work.
        // SAFETY: this context object is lab's alone (cudarc makes a new one per `new`), and
        // every product on it is drained before its memory is used elsewhere.
        unsafe { context.disable_event_tracking() };
        let stream = context
            .new_stream()
            .unwrap_or_else(|e| panic!("cuBLASLt: a CUDA stream on GPU {ordinal}: {e:?}"));
        let blas = CudaBlasLT::new(stream.clone()).unwrap_or_else(|e| {
            panic!("cuBLASLt could not start on GPU {ordinal} ({e:?}): is libcublasLt on LD_LIBRARY_PATH? Unset LAB_MATMUL to use cubecl's matmul")
        });
        Self { blas, stream }
    }
}

/// `[rows, cols]` and their strides of a 2-D tensor.
fn dims(t: &CubeTensor<CudaRuntime>) -> Option<([usize; 2], [usize; 2])> {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    (shape.num_dims() == 2).then(|| ([shape[0], shape[1]], [strides[0], strides[1]]))
}
