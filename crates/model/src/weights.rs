//! Named host tensors and safetensors files: how a model's parameters (and the optimizer's
//! moments, keyed by the same paths) leave and re-enter burn. Paths are the module field
//! paths (`blocks.3.attn.wq.weight`), so files are readable by any safetensors tool.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use safetensors::{tensor::TensorInfo, Dtype, SafeTensors};

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
        self.clone().into_tensor(device)
    }

    pub fn into_tensor<B: Backend, const D: usize>(self, device: &B::Device) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(self.data, self.shape), device)
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

/// Every float parameter of `module`, by path, copied to the host.
pub fn tensor_map<B: Backend, M: Module<B>>(module: &M) -> TensorMap {
    fetch_all(pending_tensors(module))
}

/// Tensors waiting to be written, read whole into host memory.
pub fn fetch_all(pending: Vec<PendingTensor<'_>>) -> TensorMap {
    pending
        .into_iter()
        .map(|t| {
            let data = (t.fetch)(0..t.bytes() / 4).into_owned();
            let shape = t.shape.clone();
            (t.name, HostTensor { shape, data })
        })
        .collect()
}

struct Replace {
    path: PathStack,
    /// Tensors not placed yet: each is moved into the model, not copied.
    source: TensorMap,
    error: Option<String>,
}

impl<B: Backend> ModuleMapper<B> for Replace {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let path = self.path.path();
        // `lazy_*` and `transform_for_load` leave a lazily initialised parameter undrawn.
        let dims = param.lazy_shape().dims::<D>().to_vec();
        match self.source.remove(&path) {
            Some(host) if host.shape == dims => {
                let id = param.id;
                let loaded = host.into_tensor::<B, D>(&param.lazy_device());
                param.transform_for_load(loaded, id)
            }
            Some(host) => {
                self.error.get_or_insert(format!(
                    "{path} has shape {:?} in the file but {dims:?} in the model",
                    host.shape
                ));
                param
            }
            None => {
                self.error
                    .get_or_insert(format!("{path} is missing from the file"));
                param
            }
        }
    }
}

/// `module` with the parameters `pick` selects (by visit index and path) replaced by what
/// `with` makes of their values, flattened; each keeps its shape, id, and whether it wants a
/// gradient, as a new leaf (not a step in the autodiff graph). The first error stops the
/// replacing and is returned.
pub fn replace_params<B: Backend, M: Module<B>>(
    module: M,
    pick: impl Fn(usize, &str) -> bool,
    with: impl FnMut(usize, Tensor<B, 1>) -> Result<Tensor<B, 1>>,
) -> Result<M> {
    let mut mapper = ReplaceParams {
        pick,
        with,
        path: PathStack::default(),
        at: 0,
        error: None,
    };
    let module = module.map(&mut mapper);
    mapper.error.map_or(Ok(module), Err)
}

struct ReplaceParams<P, W> {
    pick: P,
    with: W,
    path: PathStack,
    at: usize,
    error: Option<anyhow::Error>,
}

impl<B, P, W> ModuleMapper<B> for ReplaceParams<P, W>
where
    B: Backend,
    P: Fn(usize, &str) -> bool,
    W: FnMut(usize, Tensor<B, 1>) -> Result<Tensor<B, 1>>,
{
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let i = self.at;
        self.at += 1;
        if self.error.is_some() || !(self.pick)(i, &self.path.path()) {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let (dims, wants_grad) = (tensor.dims(), tensor.is_require_grad());
        // Untracked: the replacement is a new leaf, not a step in the autodiff graph.
        let held = tensor.clone().set_require_grad(false).reshape([-1]);
        let tensor = match (self.with)(i, held) {
            Ok(new) => new.reshape(dims).set_require_grad(wants_grad),
            Err(e) => {
                self.error = Some(e);
                tensor
            }
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Replaces every float parameter of `module` with the tensor of the same path in `source`
/// (parameter ids are kept). Every parameter must be present with its shape, and nothing else.
pub fn load_tensor_map<B: Backend, M: Module<B>>(module: M, source: &TensorMap) -> Result<M> {
    load_tensor_map_owned(module, source.clone())
}

/// [`load_tensor_map`] that moves the tensors in (no second copy of a large state).
pub fn load_tensor_map_owned<B: Backend, M: Module<B>>(module: M, source: TensorMap) -> Result<M> {
    let mut m = Replace {
        path: PathStack::default(),
        source,
        error: None,
    };
    let module = module.map(&mut m);
    if let Some(e) = m.error {
        bail!(e);
    }
    if !m.source.is_empty() {
        bail!(
            "the file holds {} tensors the model does not have",
            m.source.len()
        );
    }
    Ok(module)
}

/// A tensor waiting to be written: its name and shape, and how to fetch a range of its
/// (flattened) fp32 values when its turn comes, so a file is written with one slice of one
/// tensor in host memory at a time (a checkpoint of an x1-50m state is 1.5 GB; holding it
/// all again as bytes would triple it).
pub struct PendingTensor<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    fetch: Box<dyn Fn(Range<usize>) -> Cow<'a, [f32]> + 'a>,
}

/// Values fetched and written at a time: 16 MiB.
const WRITE_CHUNK: usize = 4 << 20;

impl<'a> PendingTensor<'a> {
    pub fn new(
        name: String,
        shape: Vec<usize>,
        fetch: impl Fn(Range<usize>) -> Cow<'a, [f32]> + 'a,
    ) -> Self {
        Self {
            name,
            shape,
            fetch: Box::new(fetch),
        }
    }

    /// A tensor of `module` (or of any burn tensor), read from the device when written.
    pub fn of_tensor<B: Backend, const D: usize>(name: String, t: Tensor<B, D>) -> Self {
        let shape = t.dims().to_vec();
        let flat = t.reshape([-1]);
        Self::new(name, shape, move |r| {
            Cow::Owned(HostTensor::from_tensor(flat.clone().slice(r)).data)
        })
    }

    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}

/// Every float parameter of `module`, by path, to be written lazily.
pub fn pending_tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<PendingTensor<'static>> {
    struct Pending<B: Backend> {
        path: PathStack,
        out: Vec<PendingTensor<'static>>,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: Backend> ModuleVisitor<B> for Pending<B> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.out
                .push(PendingTensor::of_tensor(self.path.path(), param.val()));
        }
    }
    let mut v = Pending::<B> {
        path: PathStack::default(),
        out: Vec::new(),
        _b: std::marker::PhantomData,
    };
    module.visit(&mut v);
    v.out
}

/// Host tensors as pending ones (no copy).
pub fn pending_from_map(tensors: &TensorMap) -> Vec<PendingTensor<'_>> {
    tensors
        .iter()
        .map(|(name, t)| {
            PendingTensor::new(name.clone(), t.shape.clone(), |r| Cow::Borrowed(&t.data[r]))
        })
        .collect()
}

#[cfg(target_endian = "big")]
compile_error!("safetensors files are little-endian; the writer casts f32 slices to bytes");

/// Writes an fp32 safetensors file: the header (tensors in name order, as the safetensors
/// crate orders one dtype, `__metadata__` first, padded to 8 bytes), then each tensor's
/// values, fetched one at a time.
pub fn write_safetensors(
    w: &mut dyn Write,
    tensors: &[PendingTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let mut order: Vec<&PendingTensor> = tensors.iter().collect();
    order.sort_by(|a, b| a.name.cmp(&b.name));
    let mut header = format!("{{\"__metadata__\":{}", serde_json::to_string(metadata)?);
    let mut offset = 0;
    for t in &order {
        let info = TensorInfo {
            dtype: Dtype::F32,
            shape: t.shape.clone(),
            data_offsets: (offset, offset + t.bytes()),
        };
        offset += t.bytes();
        header += &format!(
            ",{}:{}",
            serde_json::to_string(&t.name)?,
            serde_json::to_string(&info)?
        );
    }
    header.push('}');
    let mut header = header.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    w.write_all(&(header.len() as u64).to_le_bytes())?;
    w.write_all(&header)?;
    for t in order {
        let n = t.bytes() / 4;
        for start in (0..n).step_by(WRITE_CHUNK) {
            let r = start..(start + WRITE_CHUNK).min(n);
            let values = (t.fetch)(r.clone());
            if values.len() != r.len() {
                bail!(
                    "{}: {} values fetched for {r:?} of its shape {:?}",
                    t.name,
                    values.len(),
                    t.shape
                );
            }
            w.write_all(bytemuck::cast_slice(&values))?;
        }
    }
    Ok(())
}

/// Writes pending tensors as an fp32 safetensors file, atomically (temp name, fsync,
/// rename), streamed; returns its sha256.
pub fn save_pending(
    path: &Path,
    tensors: &[PendingTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<String> {
    lab_fsio::write_atomic_streamed(path, |w| write_safetensors(w, tensors, metadata))
}

/// Writes tensors as an fp32 safetensors file, atomically, with string metadata.
pub fn save_safetensors(
    path: &Path,
    tensors: &TensorMap,
    metadata: HashMap<String, String>,
) -> Result<()> {
    save_pending(
        path,
        &pending_from_map(tensors),
        &metadata.into_iter().collect(),
    )?;
    Ok(())
}

/// The bytes of an fp32 safetensors file of `tensors` (metadata in key order).
pub fn to_safetensors_bytes(
    tensors: &TensorMap,
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_safetensors(
        &mut out,
        &pending_from_map(tensors),
        &metadata.into_iter().collect(),
    )?;
    Ok(out)
}

/// Reads a safetensors file written by [`save_safetensors`] or any tool (a Hugging Face
/// folder's bf16 and fp16 tensors widen to fp32 exactly).
pub fn load_safetensors(path: &Path) -> Result<(TensorMap, HashMap<String, String>)> {
    load_safetensors_where(path, &|_| true)
}

/// As [`load_safetensors`], copying only the tensors `keep` names (the file is mapped, so
/// the others are never read: a ZeRO-1 rank loads its shard of the optimizer state).
pub fn load_safetensors_where(
    path: &Path,
    keep: &dyn Fn(&str) -> bool,
) -> Result<(TensorMap, HashMap<String, String>)> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    // Mapped, not read: a read of a 1 GB file first page-faults a 1 GB buffer into existence.
    // SAFETY: lab's files are replaced by rename, never written in place, so the mapping
    // does not change under us.
    let bytes = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("cannot read {}", path.display()))?;
    let file = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a valid safetensors file", path.display()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes)?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let mut out = TensorMap::new();
    for (name, view) in file.tensors() {
        if !keep(&name) {
            continue;
        }
        let data = widened(view.data(), view.dtype())
            .with_context(|| format!("{}: tensor {name}", path.display()))?;
        let shape = view.shape().to_vec();
        out.insert(name, HostTensor { shape, data });
    }
    Ok((out, metadata))
}

/// A tensor's bytes as fp32.
fn widened(raw: &[u8], dtype: Dtype) -> Result<Vec<f32>> {
    let halves = |widen: fn(u16) -> f32| {
        raw.chunks_exact(2)
            .map(|b| widen(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    };
    Ok(match dtype {
        Dtype::F32 => bytemuck::pod_collect_to_vec(raw),
        Dtype::BF16 => halves(|h| half::bf16::from_bits(h).to_f32()),
        Dtype::F16 => halves(|h| half::f16::from_bits(h).to_f32()),
        other => bail!("is {other:?}; lab reads F32, BF16 and F16"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use safetensors::tensor::TensorView;

    /// The reference: the safetensors crate's own serializer over the same tensors.
    fn reference(tensors: &TensorMap, metadata: HashMap<String, String>) -> Vec<u8> {
        let raw: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    t.shape.clone(),
                )
            })
            .collect();
        let views: Vec<(&str, TensorView)> = raw
            .iter()
            .map(|(n, b, s)| {
                (
                    n.as_str(),
                    TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, &Some(metadata)).unwrap()
    }

    proptest! {
        /// The streamed writer gives the safetensors crate's bytes (one metadata entry: the
        /// crate writes a map in hash order), and the file reads back.
        #[test]
        fn streamed_files_equal_the_safetensors_crate(
            shapes in proptest::collection::btree_map("[a-z][a-z0-9._]{0,12}", proptest::collection::vec(1usize..5, 1..4), 1..6),
            step in 0u64..1000,
        ) {
            let tensors: TensorMap = shapes.into_iter().enumerate().map(|(i, (name, shape))| {
                let n = shape.iter().product::<usize>();
                (name, HostTensor { shape, data: (0..n).map(|k| (i * 31 + k) as f32 * 0.25 - 3.0).collect() })
            }).collect();
            let meta = HashMap::from([("step".to_string(), step.to_string())]);
            let ours = to_safetensors_bytes(&tensors, meta.clone()).unwrap();
            prop_assert_eq!(&ours, &reference(&tensors, meta));
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.safetensors");
            let sha = save_pending(&path, &pending_from_map(&tensors), &BTreeMap::new()).unwrap();
            prop_assert_eq!(sha, lab_fsio::sha256_file(&path).unwrap());
            prop_assert_eq!(load_safetensors(&path).unwrap().0, tensors);
        }
    }

    /// A device tensor longer than a write chunk is written slice by slice, in order.
    #[test]
    fn device_tensors_are_written_in_chunks_that_add_up() {
        type B = burn::backend::Flex;
        let n = WRITE_CHUNK + 3;
        let values: Vec<f32> = (0..2 * n).map(|k| (k % 1000) as f32 - 0.5).collect();
        let t =
            Tensor::<B, 2>::from_data(TensorData::new(values.clone(), [2, n]), &Default::default());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        save_pending(
            &path,
            &[PendingTensor::of_tensor("w".into(), t)],
            &BTreeMap::new(),
        )
        .unwrap();
        let (back, _) = load_safetensors(&path).unwrap();
        assert_eq!(
            back["w"],
            HostTensor {
                shape: vec![2, n],
                data: values
            }
        );
    }

    #[test]
    fn a_fetch_of_the_wrong_size_fails_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let bad = [PendingTensor::new("x".into(), vec![2, 2], |_| {
            Cow::Owned(vec![1.0; 3])
        })];
        let err = save_pending(&path, &bad, &BTreeMap::new()).unwrap_err();
        assert!(
            format!("{err:#}").contains("x: 3 values fetched for 0..4"),
            "{err:#}"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no file, no temp file"
        );
    }
}
