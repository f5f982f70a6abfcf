//! The GPU backends' fused ops: lab-kernels' cubecl kernels on `CubeBackend` (CUDA, wgpu),
//! and the same passed through burn's Fusion (what `burn::backend::Cuda` and `Wgpu` are) as
//! custom operations, the pattern burn-vision uses for its own kernels.

use burn::tensor::{ops::FloatTensor, DType, Shape};
use burn_fusion::{
    stream::{Operation, OperationStreams},
    FusionBackend, FusionRuntime, FusionTensor,
};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

mod adamw;
mod attention;
mod embedding;
mod heads;
mod loss;
mod memory;
mod projection;
mod rms_norm;
mod rope;
mod square_sums;
mod swiglu;

/// The tensors a Fusion custom operation reads and registers, by id.
type Handles<B> =
    HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// What a custom operation runs on the inner backend when Fusion executes it: its inputs'
/// descriptions in, its outputs in order out.
type Body<B> =
    Box<dyn Fn(&mut Handles<B>, &[TensorIr]) -> Vec<FloatTensor<B>> + Send + Sync + 'static>;

/// One of lab's ops recorded on Fusion's stream as `OperationIr::Custom`, so that Fusion
/// orders it with the fused element-wise work around it.
struct CustomOp<B: FusionBackend> {
    desc: CustomOpIr,
    body: Body<B>,
}

impl<B: FusionBackend> std::fmt::Debug for CustomOp<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomOp")
            .field("desc", &self.desc)
            .finish_non_exhaustive()
    }
}

impl<B: FusionBackend> Operation<B::FusionRuntime> for CustomOp<B> {
    fn execute(&self, h: &mut Handles<B>) {
        let results = (self.body)(h, &self.desc.inputs);
        assert_eq!(results.len(), self.desc.outputs.len(), "{}", self.desc.id);
        for (out, t) in self.desc.outputs.iter().zip(results) {
            h.register_float_tensor::<B>(&out.id, t);
        }
    }
}

/// Records the op `name` on the stream of `inputs`: its `M` outputs are float tensors of the
/// given dtype and shape, which `body` computes from the inputs (read by index from the
/// handles) when Fusion executes the stream.
fn custom_op<B: FusionBackend, const M: usize>(
    name: &'static str,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    outputs: [(DType, Shape); M],
    body: impl Fn(&mut Handles<B>, &[TensorIr]) -> Vec<FloatTensor<B>> + Send + Sync + 'static,
) -> [FusionTensor<B::FusionRuntime>; M] {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outputs =
        outputs.map(|(dtype, shape)| TensorIr::uninit(client.create_empty_handle(), shape, dtype));
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let op = CustomOp::<B> {
        desc: desc.clone(),
        body: Box::new(body),
    };
    let registered = client.register(streams, OperationIr::Custom(desc), op);
    registered
        .try_into()
        .unwrap_or_else(|v: Vec<_>| panic!("{name}: {} outputs, {M} described", v.len()))
}

/// The dtype and shape of `t`, for an output shaped like it.
fn like<R: FusionRuntime>(t: &FusionTensor<R>) -> (DType, Shape) {
    (t.dtype, t.shape.clone())
}
