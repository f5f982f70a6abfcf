//! Named host tensors and safetensors files: how a model's parameters (and the optimizer's
//! moments, keyed by the same paths) leave and re-enter burn. Paths are the module field
//! paths (`blocks.3.attn.wq.weight`), so files are readable by any safetensors tool.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{bail, Context, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use safetensors::{tensor::TensorView, Dtype, SafeTensors};

/// An fp32 tensor in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn from_tensor<B: Backend, const D: usize>(t: Tensor<B, D>) -> Self {
        let shape = t.dims().to_vec();
        let data = t
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("fp32 data");
        Self { shape, data }
    }

    pub fn to_tensor<B: Backend, const D: usize>(&self, device: &B::Device) -> Tensor<B, D> {
        Tensor::from_data(
            TensorData::new(self.data.clone(), self.shape.clone()),
            device,
        )
    }
}

/// Parameters by path, in path order.
pub type TensorMap = BTreeMap<String, HostTensor>;

/// Tracks the dotted path of the parameter being visited (for visitors and mappers that
/// key things by parameter path).
#[derive(Default)]
pub struct PathStack(Vec<String>);

impl PathStack {
    pub fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }
    pub fn exit(&mut self) {
        self.0.pop();
    }
    pub fn path(&self) -> String {
        self.0.join(".")
    }
}

struct Collect {
    path: PathStack,
    out: TensorMap,
}

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out
            .insert(self.path.path(), HostTensor::from_tensor(param.val()));
    }
}

/// Every float parameter of `module`, by path.
pub fn tensor_map<B: Backend, M: Module<B>>(module: &M) -> TensorMap {
    let mut v = Collect {
        path: PathStack::default(),
        out: TensorMap::new(),
    };
    module.visit(&mut v);
    v.out
}

struct Replace<'a> {
    path: PathStack,
    source: &'a TensorMap,
    error: Option<String>,
    used: usize,
}

impl<B: Backend> ModuleMapper<B> for Replace<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let path = self.path.path();
        let (id, tensor, mapper) = param.consume();
        let tensor = match self.source.get(&path) {
            Some(host) if host.shape == tensor.dims() => {
                self.used += 1;
                let mut loaded = host.to_tensor::<B, D>(&tensor.device());
                if tensor.is_require_grad() {
                    loaded = loaded.require_grad();
                }
                loaded
            }
            Some(host) => {
                self.error.get_or_insert(format!(
                    "{path} has shape {:?} in the file but {:?} in the model",
                    host.shape,
                    tensor.dims()
                ));
                tensor
            }
            None => {
                self.error
                    .get_or_insert(format!("{path} is missing from the file"));
                tensor
            }
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Replaces every float parameter of `module` with the tensor of the same path in `source`
/// (parameter ids are kept). Every parameter must be present with its shape, and nothing else.
pub fn load_tensor_map<B: Backend, M: Module<B>>(module: M, source: &TensorMap) -> Result<M> {
    let mut m = Replace {
        path: PathStack::default(),
        source,
        error: None,
        used: 0,
    };
    let module = module.map(&mut m);
    if let Some(e) = m.error {
        bail!(e);
    }
    if m.used != source.len() {
        bail!(
            "the file holds {} tensors the model does not have",
            source.len() - m.used
        );
    }
    Ok(module)
}

/// Writes tensors as an fp32 safetensors file, atomically, with string metadata.
pub fn save_safetensors(
    path: &Path,
    tensors: &TensorMap,
    metadata: HashMap<String, String>,
) -> Result<()> {
    lab_fsio::write_atomic(path, &to_safetensors_bytes(tensors, metadata)?)
}

/// The bytes of an fp32 safetensors file of `tensors` (deterministic for at most one
/// metadata entry: safetensors writes a map in hash order).
pub fn to_safetensors_bytes(
    tensors: &TensorMap,
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(name, t)| {
            let raw = t.data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name.clone(), raw, t.shape.clone())
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, raw, shape)| {
            Ok((
                name.as_str(),
                TensorView::new(Dtype::F32, shape.clone(), raw)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    Ok(safetensors::serialize(views, &Some(metadata))?)
}

/// Reads an fp32 safetensors file written by [`save_safetensors`] (or any tool).
pub fn load_safetensors(path: &Path) -> Result<(TensorMap, HashMap<String, String>)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a valid safetensors file", path.display()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes)?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let mut out = TensorMap::new();
    for (name, view) in file.tensors() {
        if view.dtype() != Dtype::F32 {
            bail!(
                "{}: tensor {name} is {:?}, expected F32",
                path.display(),
                view.dtype()
            );
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.insert(
            name,
            HostTensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok((out, metadata))
}
