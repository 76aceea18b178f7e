//! The autodiff forward pass with dfdx, used for training and for the generic per-sample
//! gradient path that every fast kernel path is tested against.
//!
//! Conventions: parameters are tape-free tensors with runtime shapes; the input carries the
//! tape, so gradients of every parameter come out of one backward pass.

use dfdx::prelude::*;

use super::{conv, Architecture, Body, OutputKind, Params};
use crate::error::{Error, Result};

pub use super::tensors::ParamTensor;
pub(crate) use super::tensors::upload;

fn activate<D: Device<f64>, S: Shape, T: Tape<f64, D>>(
    arch: &Architecture,
    z: Tensor<S, f64, D, T>,
) -> Tensor<S, f64, D, T> {
    match arch.activation {
        super::Activation::Relu => z.relu(),
        super::Activation::Tanh => z.tanh(),
    }
}

/// Raw network `g_w(x)` with autodiff.
///
/// # Shapes
/// `x` is `[n, d]`; returns `[n, K]`.
pub fn raw_forward<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(
    arch: &Architecture,
    p: &[ParamTensor<D>],
    x: Tensor<(usize, usize), f64, D, T>,
) -> Tensor<(usize, usize), f64, D, T> {
    let n = x.shape().0;
    match &arch.body {
        Body::Layers { input, .. } => {
            use super::layers::{autodiff, Shape};
            let stack = arch.stack().expect("validated architecture");
            let a = match *input {
                Shape::Flat(_) | Shape::Tokens(..) => autodiff::Activations::Flat(x),
                Shape::Seq(t, d) => autodiff::Activations::Seq(x.reshape_like(&(n, t, d))),
                Shape::Map(c, h, w) => autodiff::Activations::Map(x.reshape_like(&(n, c, h, w))),
            };
            match autodiff::forward_nodes(&stack.nodes, p, a) {
                autodiff::Activations::Flat(y) => y,
                _ => unreachable!("a resolved stack ends flat"),
            }
        }
        Body::Mlp { widths } => {
            let layers = widths.len() - 1;
            let mut a = x;
            let mut j = 0;
            for l in 0..layers {
                let w = p[j].r2().clone();
                j += 1;
                let mut z = a.matmul(w.permute::<(usize, usize), Axes2<1, 0>>());
                if arch.bias {
                    let b = p[j].r1().clone();
                    j += 1;
                    z = z + b.broadcast_like::<(usize, usize), Axis<0>>(&(n, widths[l + 1]));
                }
                a = if l + 1 < layers { activate(arch, z) } else { z };
            }
            a
        }
        Body::Cnn { image, channels, stride, padding, pool, outputs, .. } => {
            let g = arch.cnn_geometry().expect("validated");
            let dev = x.device().clone();
            let xi = x.reshape_like(&(n, image[0], image[1], image[2]));
            let zero_b: Tensor<(usize,), f64, D> = dev.zeros_like(&(*channels,));
            let (cw, cb, dw, db) = if arch.bias {
                (p[0].r4(), p[1].r1().clone(), p[2].r2(), Some(p[3].r1()))
            } else {
                (p[0].r4(), zero_b, p[1].r2(), None)
            };
            let c = conv::conv2d(xi, cw, &cb, *stride, *padding);
            let c = activate(arch, c);
            let pooled = conv::max_pool2d(c, *pool);
            let flat = pooled.reshape_like(&(n, channels * g.hp * g.wp));
            let mut z = flat.matmul(dw.clone().permute::<(usize, usize), Axes2<1, 0>>());
            if let Some(db) = db {
                z = z + db.clone().broadcast_like::<(usize, usize), Axis<0>>(&(n, *outputs));
            }
            z
        }
    }
}

/// `f(x) = out(α (g_w(x) − offset))` with autodiff; `offset` is `g_{w_0}(x)` when the
/// architecture has `zero_output` (a constant: the initial network is frozen).
///
/// # Shapes
/// `x` is `[n, d]`, `offset` `[n, K]`; returns `[n, K]`.
pub fn forward<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(
    arch: &Architecture,
    p: &[ParamTensor<D>],
    x: Tensor<(usize, usize), f64, D, T>,
    offset: Option<&Tensor<(usize, usize), f64, D>>,
) -> Tensor<(usize, usize), f64, D, T> {
    let mut z = raw_forward(arch, p, x);
    if let Some(off) = offset {
        z = z - off.clone();
    }
    if arch.alpha != 1.0 {
        z = z * arch.alpha;
    }
    match arch.output {
        OutputKind::LogSoftmax => z.log_softmax::<Axis<1>>(),
        OutputKind::Identity => z,
    }
}

/// The training objective on a fixed batch, kept on the device between steps.
pub struct Objective<D: Device<f64>> {
    dev: D,
    arch: Architecture,
    x: Tensor<(usize, usize), f64, D>,
    offset: Option<Tensor<(usize, usize), f64, D>>,
    /// One-hot labels (cross-entropy) or target values (MSE), `[n, K]`.
    target: Tensor<(usize, usize), f64, D>,
    loss: LossKind,
    n: usize,
}

/// Which loss is minimised (always the mean over the batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKind {
    /// `L = −(1/n) Σ_i f^{y_i}(x_i)` with f the log-softmax output.
    CrossEntropy,
    /// `L = (1/(n·K)) Σ_i ‖f(x_i) − y_i‖²`.
    Mse,
}

/// Loss, gradient and outputs at one parameter state.
#[derive(Clone, Debug)]
pub struct LossGrad {
    /// Mean loss.
    pub loss: f64,
    /// ∇_w L, same names and shapes as the parameters.
    pub grad: Params,
    /// Network outputs f(x) on the batch, `[n, K]`.
    pub outputs: Vec<f64>,
}

impl<D: Device<f64>> Objective<D> {
    /// Sets up the objective on rows `x` (`[n, d]`) with `targets`: labels for cross-entropy
    /// (`[n]`) or values for MSE (`[n, K]`). `init` is needed when the architecture has
    /// `zero_output`.
    pub fn new(
        dev: D,
        arch: &Architecture,
        x: &[f64],
        labels: Option<&[usize]>,
        values: Option<&[f64]>,
        loss: LossKind,
        init: Option<&Params>,
    ) -> Result<Self> {
        let d = arch.input_dim();
        let k = arch.outputs();
        if d == 0 || x.len() % d != 0 || x.is_empty() {
            return Err(Error::ShapeMismatch { what: "training inputs".into(), expected: vec![d], got: vec![x.len()] });
        }
        let n = x.len() / d;
        let target = match (loss, labels, values) {
            (LossKind::CrossEntropy, Some(y), _) => {
                if y.len() != n {
                    return Err(Error::ShapeMismatch { what: "labels".into(), expected: vec![n], got: vec![y.len()] });
                }
                let mut oh = vec![0.0; n * k];
                for (i, &c) in y.iter().enumerate() {
                    if c >= k {
                        return Err(Error::Data(format!("label {c} at row {i} is out of range for {k} classes")));
                    }
                    oh[i * k + c] = 1.0;
                }
                oh
            }
            (LossKind::Mse, _, Some(v)) => {
                if v.len() != n * k {
                    return Err(Error::ShapeMismatch { what: "regression targets".into(), expected: vec![n, k], got: vec![v.len()] });
                }
                v.to_vec()
            }
            (LossKind::CrossEntropy, None, _) => return Err(Error::Config("cross-entropy needs class labels".into())),
            (LossKind::Mse, _, None) => return Err(Error::Config("mse needs regression targets".into())),
        };
        let offset = if arch.zero_output {
            let init = init.ok_or_else(|| Error::Data("zero_output needs the initial parameters".into()))?;
            Some(dev.tensor_from_vec(arch.raw_forward(init, x), (n, k)))
        } else {
            None
        };
        Ok(Objective {
            x: dev.tensor_from_vec(x.to_vec(), (n, d)),
            target: dev.tensor_from_vec(target, (n, k)),
            offset,
            dev,
            arch: arch.clone(),
            loss,
            n,
        })
    }

    /// The device the objective lives on.
    pub(crate) fn device(&self) -> &D {
        &self.dev
    }

    /// Loss and outputs at `params` without the gradient (one forward pass, no tape): the same
    /// values [`Objective::evaluate`] gives, for steps whose update uses another gradient.
    pub fn values(&self, params: &Params) -> (f64, Vec<f64>) {
        let p = upload(&self.dev, params);
        let f = forward(&self.arch, &p, self.x.clone(), self.offset.as_ref());
        let outputs = f.as_vec();
        let k = self.arch.outputs() as f64;
        let loss = match self.loss {
            LossKind::CrossEntropy => (f * self.target.clone()).sum::<(), _>() * (-1.0 / self.n as f64),
            LossKind::Mse => (f - self.target.clone()).square().sum::<(), _>() * (1.0 / (self.n as f64 * k)),
        };
        (loss.as_vec()[0], outputs)
    }

    /// Loss, gradient and outputs at `params` (one forward and one backward pass).
    pub fn evaluate(&self, params: &Params) -> LossGrad {
        let p = upload(&self.dev, params);
        let x = self.x.leaky_trace();
        let f = forward(&self.arch, &p, x, self.offset.as_ref());
        let outputs = f.retaped::<NoneTape>().as_vec();
        let k = self.arch.outputs() as f64;
        let loss = match self.loss {
            LossKind::CrossEntropy => (f * self.target.clone()).sum::<(), _>() * (-1.0 / self.n as f64),
            LossKind::Mse => (f - self.target.clone()).square().sum::<(), _>() * (1.0 / (self.n as f64 * k)),
        };
        let loss_value = loss.retaped::<NoneTape>().as_vec()[0];
        let grads = loss.backward();
        let data = p.iter().map(|t| t.grad(&grads)).collect();
        LossGrad { loss: loss_value, grad: Params { specs: params.specs.clone(), data }, outputs }
    }
}

/// Generic per-sample Jacobian by autodiff: `J[k, :] = ∇_w f^k(x)` for one input row, flattened
/// in parameter order. One backward pass per output; the reference for every fast path.
///
/// # Shapes
/// `x` is `[d]`; returns `[K, W]`.
pub(crate) fn jacobian<D: Device<f64>>(
    dev: &D,
    arch: &Architecture,
    params: &Params,
    init: Option<&Params>,
    x: &[f64],
) -> Result<Vec<f64>> {
    arch.check_params(params)?;
    let d = arch.input_dim();
    let k = arch.outputs();
    if x.len() != d {
        return Err(Error::ShapeMismatch { what: "input row".into(), expected: vec![d], got: vec![x.len()] });
    }
    let p = upload(dev, params);
    let offset = if arch.zero_output {
        let init = init.ok_or_else(|| Error::Data("zero_output needs the initial parameters".into()))?;
        Some(dev.tensor_from_vec(arch.raw_forward(init, x), (1, k)))
    } else {
        None
    };
    let xt: Tensor<(usize, usize), f64, D> = dev.tensor_from_vec(x.to_vec(), (1, d));
    let mut out = Vec::with_capacity(k * params.numel());
    for c in 0..k {
        let mut sel = vec![0.0; k];
        sel[c] = 1.0;
        let sel: Tensor<(usize, usize), f64, D> = dev.tensor_from_vec(sel, (1, k));
        let f = forward(arch, &p, xt.leaky_trace(), offset.as_ref());
        let s = (f * sel).sum::<(), _>();
        let g = s.backward();
        for t in &p {
            out.extend(t.grad(&g));
        }
    }
    Ok(out)
}
