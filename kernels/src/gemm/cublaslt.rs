//! cuBLASLt through cudarc, on the device memory of cubecl's tensors and on cubecl's own
//! stream.
//!
//! cubecl 0.10 keeps its CUDA stream private; lab's patch of cubecl-cuda (`vendor/cubecl-cuda`,
//! see its LAB-PATCH.md) reports, with a tensor's device memory, the stream whose pool holds it.
//! The product is enqueued on the output's stream (this thread's), behind the kernels that
//! wrote the inputs and ahead of those that will read the output: stream order does what two
//! host waits per product did before, and the host keeps running ahead of the GPU. An input
//! held by another stream's pool is read after that stream's writes (cubecl queues the wait
//! when its memory is taken), and that stream is made to wait for the product before it can
//! reuse the memory.
//!
//! Each stream gets its own handle and workspace (32 MiB on Hopper), kept for the process and
//! not counted by cubecl's pool: one per thread that multiplies, one in lab's trainer. A
//! failure inside a cuBLASLt kernel surfaces at cubecl's next wait, as a kernel's own would.
//! The library is loaded at run time (cudarc's dynamic loading), as the rest of CUDA is.
//!
//! A product cuBLASLt cannot take (no algorithm for it, no memory left to load one: NVIDIA
//! documents that the heuristic query may need some) is declined, with one line the first
//! time, and cubecl's matmul runs it; a handle that cannot start turns cuBLASLt off for the
//! process (also where its workspace does not fit). The trainer checks first that the library
//! is there at all ([`library_present`]).

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, Once, OnceLock};

use burn::tensor::{bf16, f16, DType};
use burn_cubecl::{ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor};
use cubecl::cuda::CudaRuntime;
use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig, Workspace};
use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use super::{plan, Plan};

/// A cuBLASLt handle (with its workspace) on one of cubecl's streams.
struct Library {
    blas: CudaBlasLT,
    stream: Arc<CudaStream>,
}

/// Whether libcublasLt loads on this machine (the trainer's check before it starts with
/// `LAB_MATMUL=cublaslt`: cudarc panics where it finds none).
pub(super) fn library_present() -> bool {
    // SAFETY: loading the library runs its initializers only, as cudarc's own loader does.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// `a · b` on cuBLASLt, or `None` for dtypes other than f16 and bf16, layouts [`plan`]
/// refuses, or a product cuBLASLt declines (module docs). f32 stays with cubecl's matmul,
/// which itself runs f32 on tensor cores as TF32 where its autotune finds that faster
/// (cubek-matmul's `adjust_dtypes`).
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
    // Taking a tensor's memory first queues, on our stream, a wait for any other cubecl
    // stream that wrote it (reading is covered; reuse is `hold_until_done`'s).
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
    // `out` was made just now, on the stream this thread's cubecl work goes to.
    let stream = memory[2].resource().stream;
    let ran = library(a.device.index, stream).and_then(|library| match a.dtype {
        DType::BF16 => library.run::<bf16>(plan, b_mem, a_mem, out_mem),
        _ => library.run::<f16>(plan, b_mem, a_mem, out_mem),
    });
    // Also after an error: one from the launch itself may follow work already enqueued.
    for input in &memory[..2] {
        hold_until_done(input.resource().stream, stream);
    }
    match ran {
        Ok(()) => Some(out),
        Err(why) => {
            declined(&why);
            None
        }
    }
}

/// Says once per process that cuBLASLt declined a product, and why (the later ones are
/// counted by [`super::vendor_counts`]).
fn declined(why: &str) {
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        eprintln!(
            "cuBLASLt declined a product ({why}); cubecl's matmul runs it, \
             and any other it declines"
        );
    });
}

/// Makes `holder`, the stream whose pool holds an input, wait for the work enqueued on
/// `stream` so far: it may reuse the input's memory as soon as the tensor is dropped.
fn hold_until_done(holder: CUstream, stream: CUstream) {
    if holder == stream {
        return; // Stream order already covers it.
    }
    use cudarc::driver::{result, sys};
    // SAFETY: both streams are cubecl's, alive for the process, on the current context; the
    // event is destroyed once the wait is queued (CUDA keeps it until the wait is done).
    unsafe {
        let done =
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).and_then(|event| {
                result::event::record(event, stream)?;
                result::stream::wait_event(
                    holder,
                    event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )?;
                result::event::destroy(event)
            });
        done.unwrap_or_else(|e| panic!("cuBLASLt: ordering another stream's input: {e:?}"));
    }
}

impl Library {
    /// Enqueues the call `plan` on device memory `(pointer, bytes)`: `x` and `y` as [`Plan`]
    /// names them, `d` the output; `Err` where cuBLASLt declines it (before anything is
    /// enqueued, but for an error of the launch itself).
    fn run<T>(&self, plan: Plan, x: (u64, u64), y: (u64, u64), d: (u64, u64)) -> Result<(), String>
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
            .map_err(|e| format!("binding the CUDA context: {e:?}"))?;
        // SAFETY: the pointers are cubecl's allocations of at least these sizes, live while
        // `matmul` holds their resources. Once released, cubecl reuses or frees them only
        // through work on the same stream, which runs after this product. The slices are
        // never dropped, not even if cudarc panics: a drop would free memory cubecl owns.
        unsafe {
            let borrow = |(ptr, bytes)| {
                ManuallyDrop::new(
                    self.stream
                        .upgrade_device_ptr::<T>(ptr, elements((ptr, bytes))),
                )
            };
            let (x_slice, y_slice, mut d_slice) = (borrow(x), borrow(y), borrow(d));
            let ran = self
                .blas
                .matmul(config, &*x_slice, &*y_slice, &mut *d_slice, None, None)
                .map_err(|e| format!("{plan:?}: {e:?}"));
            // Handed back without freeing (event tracking is off: no waits either).
            for slice in [x_slice, y_slice, d_slice] {
                ManuallyDrop::into_inner(slice).leak();
            }
            ran
        }
    }
}

/// The library for GPU `ordinal`'s cubecl stream `stream`, made on first use (one per stream:
/// a handle's workspace must not be shared by two streams); `Err` for good once one could not
/// start.
fn library(ordinal: usize, stream: CUstream) -> Result<Arc<Library>, String> {
    /// Keyed by GPU ordinal and stream address.
    type Libraries = HashMap<(usize, usize), Result<Arc<Library>, String>>;
    static LIBRARIES: OnceLock<Mutex<Libraries>> = OnceLock::new();
    assert!(
        !stream.is_null(),
        "cuBLASLt: cubecl reported no stream (is vendor/cubecl-cuda's patch applied?)"
    );
    let mut libraries = LIBRARIES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(failed) = libraries.values().find_map(|l| l.as_ref().err()) {
        return Err(failed.clone());
    }
    libraries
        .entry((ordinal, stream as usize))
        .or_insert_with(|| Library::new(ordinal, stream).map(Arc::new))
        .clone()
}

impl Library {
    fn new(ordinal: usize, cubecl_stream: CUstream) -> Result<Self, String> {
        if !library_present() {
            return Err("no libcublasLt on the library path".into());
        }
        let context = CudaContext::new(ordinal)
            .map_err(|e| format!("the CUDA context of GPU {ordinal}: {e:?}"))?;
        // Stream order is the only ordering (module docs): cudarc's events would only add work.
        // SAFETY: this context object is lab's alone (cudarc makes a new one per `new`), and
        // everything it runs goes to the one stream cubecl also orders its work on.
        unsafe { context.disable_event_tracking() };
        // SAFETY: cubecl made this stream on the same (primary) context and never destroys it
        // while its server lives, which is as long as the process.
        let stream = unsafe { context.wrap_borrowed_stream(cubecl_stream) };
        // cudarc unwraps the workspace's allocation inside `CudaBlasLT::new`: one made and
        // freed first normally turns a GPU without room for it into an error here, not a panic
        // there. A failed free is kept in the context, and would be unwrapped there too.
        let workspace =
            |e: DriverError| format!("its workspace could not be made on GPU {ordinal}: {e:?}");
        drop(Workspace::new(stream.clone()).map_err(workspace)?);
        context.check_err().map_err(workspace)?;
        let blas = CudaBlasLT::new(stream.clone())
            .map_err(|e| format!("its handle could not start on GPU {ordinal}: {e:?}"))?;
        Ok(Self { blas, stream })
    }
}

/// `[rows, cols]` and their strides of a 2-D tensor.
fn dims(t: &CubeTensor<CudaRuntime>) -> Option<([usize; 2], [usize; 2])> {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    (shape.num_dims() == 2).then(|| ([shape[0], shape[1]], [strides[0], strides[1]]))
}
