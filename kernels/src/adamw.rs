//! One AdamW update of one flat parameter in one pass, as a cubecl kernel.
//!
//! burn's tensor-op form of the update (lab-ops' `tensor_ops_update`) is about a dozen ops
//! per parameter, each a kernel launch and a fresh parameter-sized tensor; on an H100 the
//! optimizer took 57 ms of a 557 ms x1-50m step where the update's memory traffic (28 bytes
//! a parameter: read `p, g, m, v`, write `p, m, v`) needs about 1.2 ms. Here one unit owns
//! one element and does the whole update in registers:
//!
//! `g ← s·g; m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
//! p ← p·(1 − lr·wd) − lr · (m / (1−β1ᵗ)) / (sqrt(v / (1−β2ᵗ)) + ε)`
//!
//! in the same order of operations as the tensor-op form, in f32 whatever the storage type.
//! The outputs are new tensors (the inputs may be shared; wgpu forbids binding one buffer
//! both read-only and writable in a launch). On a parameter's first update the moments start
//! at zero and are not read.

use burn_cubecl::{
    kernel::into_contiguous, ops::numeric::empty_device_contiguous_dtype, tensor::CubeTensor,
    CubeRuntime,
};
use cubecl::prelude::*;

use crate::layout::{matrix_at_its_strides, row_major_at};

/// Units per cube.
pub(crate) const UNITS: u32 = 256;

/// The update's scalars, rounded once to f32 on the host; the kernel reads them as they are.
#[derive(CubeLaunch, CubeType, Clone, Copy, Debug, PartialEq)]
pub struct Constants {
    /// Global-norm clipping factor of the gradient.
    pub clip_scale: f32,
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    /// `1 − β1ᵗ`.
    pub bias1: f32,
    /// `1 − β2ᵗ`.
    pub bias2: f32,
    pub eps: f32,
    pub lr: f32,
    /// `1 − lr·wd`, the decoupled weight decay's factor.
    pub decay: f32,
}

impl Constants {
    /// The constants of update `t` (from 1), computed in f64 and each rounded to f32 once,
    /// as burn's scalar ops round the tensor-op form's.
    pub fn new(
        clip_scale: f64,
        [beta1, beta2]: [f64; 2],
        eps: f64,
        lr: f64,
        wd: f64,
        t: u64,
    ) -> Self {
        let f = |x: f64| x as f32;
        let t = t as i32;
        Self {
            clip_scale: f(clip_scale),
            beta1: f(beta1),
            one_minus_beta1: f(1.0 - beta1),
            beta2: f(beta2),
            one_minus_beta2: f(1.0 - beta2),
            bias1: f(1.0 - beta1.powi(t)),
            bias2: f(1.0 - beta2.powi(t)),
            eps: f(eps),
            lr: f(lr),
            decay: f(1.0 - lr * wd),
        }
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn adamw_kernel<F: Float>(
    param: &Tensor<F>,
    grad: &Tensor<F>,
    m_in: &Tensor<F>,
    v_in: &Tensor<F>,
    param_out: &mut Tensor<F>,
    m_out: &mut Tensor<F>,
    v_out: &mut Tensor<F>,
    c: Constants,
    #[comptime] first: bool,
    #[comptime] grad_is_matrix: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i < param.len() {
        let g = f32::cast_from(grad[row_major_at(grad, i, grad_is_matrix)]) * c.clip_scale;
        // The tensor-op form's terms: `β·m + (1−β)·g`, and `(1−β)·g²` with `g²` first (a
        // sum of two terms rounds the same in either order).
        let mut m = g * c.one_minus_beta1;
        let mut v = g * g * c.one_minus_beta2;
        if !first {
            m += f32::cast_from(m_in[i]) * c.beta1;
            v += f32::cast_from(v_in[i]) * c.beta2;
        }
        let update = (m / c.bias1) / ((v / c.bias2).sqrt() + c.eps);
        param_out[i] = F::cast_from(f32::cast_from(param[i]) * c.decay - update * c.lr);
        m_out[i] = F::cast_from(m);
        v_out[i] = F::cast_from(v);
    }
}

/// The updated `(param, m, v)`, each a new contiguous tensor shaped and typed as `param`.
pub struct Updated<R: CubeRuntime> {
    pub param: CubeTensor<R>,
    pub m: CubeTensor<R>,
    pub v: CubeTensor<R>,
}

/// One AdamW update of `param` by `grad` (the same dtype and number of elements, in row-major
/// order; `grad` may keep the parameter's own shape, and a matrix `grad` is read at its
/// strides, so a view into a wider gradient is not copied first), from the moments `(m, v)`
/// (shaped as `param`), or from zero moments on the first update (`None`).
pub fn update<R: CubeRuntime>(
    param: CubeTensor<R>,
    grad: CubeTensor<R>,
    moments: Option<(CubeTensor<R>, CubeTensor<R>)>,
    c: &Constants,
) -> Updated<R> {
    let new = || {
        empty_device_contiguous_dtype(
            param.client.clone(),
            param.device.clone(),
            param.meta.shape().clone(),
            param.dtype,
        )
    };
    let out = Updated {
        param: new(),
        m: new(),
        v: new(),
    };
    update_into(param, grad, moments, c, out)
}

/// [`update`] into outputs the caller allocated (tests poison them to see unwritten
/// elements): contiguous, shaped and typed as `param`.
pub fn update_into<R: CubeRuntime>(
    param: CubeTensor<R>,
    grad: CubeTensor<R>,
    moments: Option<(CubeTensor<R>, CubeTensor<R>)>,
    c: &Constants,
    out: Updated<R>,
) -> Updated<R> {
    let shape = param.meta.shape().clone();
    assert_eq!(
        grad.meta.shape().num_elements(),
        shape.num_elements(),
        "adamw: gradient {:?} for a parameter {shape:?}",
        grad.meta.shape()
    );
    assert_eq!(grad.dtype, param.dtype, "adamw: gradient dtype");
    for (name, t) in [("param", &out.param), ("m", &out.m), ("v", &out.v)] {
        assert_eq!(t.meta.shape(), &shape, "adamw: output {name} shape");
        assert_eq!(t.dtype, param.dtype, "adamw: output {name} dtype");
        assert!(t.is_contiguous(), "adamw: output {name} is contiguous");
    }
    let n = shape.num_elements();
    if n == 0 {
        return out;
    }
    let first = moments.is_none();
    // The first update reads no moments: the parameter stands in for them as a binding.
    let (m, v) = moments.unwrap_or_else(|| (param.clone(), param.clone()));
    for (name, t) in [("m", &m), ("v", &v)] {
        assert_eq!(t.meta.shape(), &shape, "adamw: moment {name} shape");
        assert_eq!(t.dtype, param.dtype, "adamw: moment {name} dtype");
    }
    let [param, m, v] = [param, m, v].map(into_contiguous);
    let (grad, grad_is_matrix) = matrix_at_its_strides(grad);
    let client = param.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    let dtype = param.dtype;
    adamw_kernel::launch::<R>(
        &client,
        cubecl::calculate_cube_count_elemwise(&client, n, cube_dim),
        cube_dim,
        param.into_tensor_arg(),
        grad.into_tensor_arg(),
        m.into_tensor_arg(),
        v.into_tensor_arg(),
        out.param.clone().into_tensor_arg(),
        out.m.clone().into_tensor_arg(),
        out.v.clone().into_tensor_arg(),
        ConstantsLaunch::new(
            c.clip_scale,
            c.beta1,
            c.one_minus_beta1,
            c.beta2,
            c.one_minus_beta2,
            c.bias1,
            c.bias2,
            c.eps,
            c.lr,
            c.decay,
        ),
        first,
        grad_is_matrix,
        dtype.into(),
    );
    out
}
