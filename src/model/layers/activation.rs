//! Element-wise activations: `relu`, `leaky_relu(slope)`, `tanh`, `sigmoid`, `softplus`,
//! `gelu` (the exact erf form, PyTorch's `GELU()`), `silu`.
//!
//! No parameters. ReLU and leaky ReLU are piecewise linear (along a step's path `w_s(t)` the
//! network is piecewise polynomial in t and its kinks are roots); the others are smooth, so the
//! adaptive quadrature converges on them without kinks.

use dfdx::prelude::*;
use serde::{Deserialize, Serialize};

use super::autodiff::Activations;
use serde_json::{json, Value};

use super::contract::{KindSpec, Along, At, Layer, Poly, Probe, Sweep};
use super::recorded::{number, require};
use super::spec::{err, no_options, options};
use super::{AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// An element-wise nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    /// `max(0, z)`.
    Relu,
    /// `z` for `z > 0`, else `slope·z` (PyTorch's `LeakyReLU(slope)`, default 0.01).
    LeakyRelu(f64),
    /// `tanh(z)`.
    Tanh,
    /// `1 / (1 + e^{−z})`.
    Sigmoid,
    /// `ln(1 + e^z)` (β = 1, PyTorch's `Softplus()`; computed without overflow).
    Softplus,
    /// `z·Φ(z) = ½z(1 + erf(z/√2))` (PyTorch's `GELU()`, not the tanh approximation).
    Gelu,
    /// `z·sigmoid(z)` (PyTorch's `SiLU()`).
    Silu,
}

/// `Φ(z)`, the standard normal CDF.
fn phi_cdf(z: f64) -> f64 {
    0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2))
}

/// `erf(x)` to within an ulp (libm's, as dfdx's GELU).
fn erf(x: f64) -> f64 {
    libm::erf(x)
}

fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

impl Act {
    /// The name as written in a `[model] layers` list.
    pub fn name(self) -> &'static str {
        match self {
            Act::Relu => "relu",
            Act::LeakyRelu(_) => "leaky_relu",
            Act::Tanh => "tanh",
            Act::Sigmoid => "sigmoid",
            Act::Softplus => "softplus",
            Act::Gelu => "gelu",
            Act::Silu => "silu",
        }
    }

    /// Whether the activation is piecewise linear (ReLU, leaky ReLU): the source of kinks.
    pub fn piecewise_linear(self) -> bool {
        matches!(self, Act::Relu | Act::LeakyRelu(_))
    }

    /// Whether `σ` is nondecreasing (it then commutes with a max: `max σ(z_i) = σ(max z_i)`).
    pub fn nondecreasing(self) -> bool {
        match self {
            Act::Relu | Act::Tanh | Act::Sigmoid | Act::Softplus => true,
            Act::LeakyRelu(s) => s >= 0.0,
            Act::Gelu | Act::Silu => false,
        }
    }

    /// `σ(z)`.
    #[inline]
    pub fn apply(self, z: f64) -> f64 {
        match self {
            Act::Relu => z.max(0.0),
            Act::LeakyRelu(s) => {
                if z > 0.0 {
                    z
                } else {
                    s * z
                }
            }
            Act::Tanh => z.tanh(),
            Act::Sigmoid => sigmoid(z),
            Act::Softplus => z.max(0.0) + (-z.abs()).exp().ln_1p(),
            Act::Gelu => z * phi_cdf(z),
            Act::Silu => z * sigmoid(z),
        }
    }

    /// `σ'(z)` (ReLU: 1 for z > 0, else 0, as PyTorch).
    #[inline]
    pub fn derivative(self, z: f64) -> f64 {
        match self {
            Act::Relu => {
                if z > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Act::LeakyRelu(s) => {
                if z > 0.0 {
                    1.0
                } else {
                    s
                }
            }
            Act::Tanh => {
                let t = z.tanh();
                1.0 - t * t
            }
            Act::Sigmoid => {
                let s = sigmoid(z);
                s * (1.0 - s)
            }
            Act::Softplus => sigmoid(z),
            Act::Gelu => phi_cdf(z) + z * (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt(),
            Act::Silu => {
                let s = sigmoid(z);
                s * (1.0 + z * (1.0 - s))
            }
        }
    }
}

fn act_on<S: dfdx::shapes::Shape, D: Device<f64>, T: Tape<f64, D> + Merge<T>>(a: Act, x: Tensor<S, f64, D, T>) -> Tensor<S, f64, D, T> {
    match a {
        Act::Relu => x.relu(),
        Act::LeakyRelu(s) => dfdx::tensor_ops::leakyrelu(x, s),
        Act::Tanh => x.tanh(),
        Act::Sigmoid => x.sigmoid(),
        Act::Gelu => {
            // dfdx 0.13's `accurate_gelu` has the right value but a wrong derivative: its
            // `x·φ(x)` term is `x·e^{−x²/2}/√π` instead of `x·e^{−x²/2}/√(2π)`. The difference is
            // the derivative of `−c·e^{−x²/2}` with `c = 1/√π − 1/√(2π)`, so adding
            // `c·e^{−x²/2}` minus its own value (a constant: the output is unchanged bit for bit)
            // makes the derivative exact.
            let c = 1.0 / std::f64::consts::PI.sqrt() - 1.0 / (2.0 * std::f64::consts::PI).sqrt();
            let bump = (x.retaped::<T>().square() * -0.5).exp() * c;
            let frozen = bump.device().tensor_from_vec(bump.as_vec(), *bump.shape());
            x.accurate_gelu() + (bump - frozen)
        }
        Act::Softplus => {
            let r = x.retaped::<T>().relu();
            r + (x.abs().negate().exp() + 1.0).ln()
        }
        Act::Silu => x.retaped::<T>().sigmoid() * x,
    }
}

/// An activation layer: `act` on each of the `size` numbers of a sample.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Activation {
    pub act: Act,
    pub size: usize,
}

impl Layer for Activation {
    fn torch(&self) -> String {
        match self.act {
            Act::Relu => "ReLU()".into(),
            Act::LeakyRelu(s) => format!("LeakyReLU({s})"),
            Act::Tanh => "Tanh()".into(),
            Act::Sigmoid => "Sigmoid()".into(),
            Act::Softplus => "Softplus()".into(),
            Act::Gelu => "GELU()".into(),
            Act::Silu => "SiLU()".into(),
        }
    }

    fn device(&self) -> Option<crate::device::program::Op> {
        let slope = match self.act {
            Act::LeakyRelu(s) => s,
            _ => 0.0,
        };
        crate::device::program::act_code(self.act.name()).map(|kind| crate::device::program::Op::Act { kind, slope })
    }

    fn along(&self) -> Along {
        if self.act.piecewise_linear() {
            Along::Kinked
        } else {
            Along::Smooth
        }
    }

    fn forward(&self, _first: usize, _at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let y = x.iter().map(|&z| self.act.apply(z)).collect();
        (y, if keep { Cache::Input(x) } else { Cache::None })
    }

    fn tangent(&self, _first: usize, _at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        if let (Some(pr), Some(xd)) = (probe, xd.as_deref()) {
            if self.act.piecewise_linear() {
                pr.extend(x.iter().copied().zip(xd.iter().copied()));
            }
        }
        let yd = xd.map(|xd| x.iter().zip(xd).map(|(&z, v)| self.act.derivative(z) * v).collect());
        (x.iter().map(|&z| self.act.apply(z)).collect(), yd)
    }

    /// The derivative once per sample, applied to its K rows.
    fn backward(&self, _first: usize, _at: &At, cache: &Cache, mut dy: Vec<f64>, k: usize, _want_dx: bool, _grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Input(z) = cache else { unreachable!("an activation's cache is its input") };
        let size = self.size;
        let mut der = vec![0.0; size];
        for (s, rows) in dy.chunks_mut(k * size).enumerate() {
            der.iter_mut().zip(&z[s * size..(s + 1) * size]).for_each(|(d, &zv)| *d = self.act.derivative(zv));
            for row in rows.chunks_exact_mut(size) {
                row.iter_mut().zip(&der).for_each(|(v, d)| *v *= d);
            }
        }
        dy
    }

    /// ReLU and leaky ReLU: each input's polynomial's roots are kinks, and the pattern at
    /// `sw.tm` scales it; the smooth ones end the sweep.
    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], p: Poly, sw: &mut Sweep) -> Option<Poly> {
        let slope = match self.act {
            Act::Relu => 0.0,
            Act::LeakyRelu(s) => s,
            _ => return None,
        };
        let size = p.size;
        let mut q = p.clone();
        for u in 0..size {
            sw.roots_of(&p, u, None);
            if p.at(u, sw.tm) <= 0.0 {
                for j in 0..=p.deg() {
                    q.c[j * size + u] *= slope;
                }
            }
        }
        Some(q)
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, _p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        match x {
            Activations::Flat(t) => Activations::Flat(act_on(self.act, t)),
            Activations::Map(t) => Activations::Map(act_on(self.act, t)),
            Activations::Seq(t) => Activations::Seq(act_on(self.act, t)),
        }
    }
}

impl KindSpec for Act {
    const NAMES: &'static [&'static str] = &["relu", "leaky_relu", "tanh", "sigmoid", "softplus", "gelu", "silu"];
    const TORCH: &'static [&'static str] = &["ReLU", "LeakyReLU", "Tanh", "Sigmoid", "Softplus", "GELU", "SiLU"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        if name == "leaky_relu" {
            let slope = match arg {
                None => 0.01,
                Some(Value::Object(m)) => {
                    options(arg.expect("some"), at, name, &["slope"])?;
                    m.get("slope").and_then(Value::as_f64).ok_or_else(|| err(at, "leaky_relu needs a number `slope`"))?
                }
                Some(a) => a.as_f64().ok_or_else(|| err(at, format!("leaky_relu's slope must be a number, got {a}")))?,
            };
            if !slope.is_finite() {
                return Err(err(at, format!("leaky_relu's slope must be finite, got {slope}")));
            }
            return Ok(Act::LeakyRelu(slope));
        }
        no_options(arg, at, name)?;
        Ok(match name {
            "relu" => Act::Relu,
            "tanh" => Act::Tanh,
            "sigmoid" => Act::Sigmoid,
            "softplus" => Act::Softplus,
            "gelu" => Act::Gelu,
            _ => Act::Silu,
        })
    }

    fn to_value(&self) -> Value {
        match self {
            Act::LeakyRelu(s) => json!({ "leaky_relu": s }),
            a => json!(a.name()),
        }
    }

    fn label(&self) -> String {
        match self {
            Act::LeakyRelu(s) => format!("leaky_relu({s})"),
            a => a.name().into(),
        }
    }

    fn from_torch(class: &str, m: &Value, at: &str) -> Result<Self, String> {
        Ok(match class {
            "ReLU" => Act::Relu,
            "Tanh" => Act::Tanh,
            "Sigmoid" => Act::Sigmoid,
            "SiLU" => Act::Silu,
            "GELU" => {
                require(m, "approximate", Value::from("none"), at, "only the exact (erf) GELU is supported")?;
                Act::Gelu
            }
            "Softplus" => {
                require(m, "beta", Value::from(1.0), at, "only Softplus(beta=1) is supported")?;
                Act::Softplus
            }
            _ => Act::LeakyRelu(number(m, "negative_slope", at)?),
        })
    }

    fn resolve(&self, input: Shape, _at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        Ok((AnyLayer::Act(Activation { act: *self, size: input.size() }), input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivatives_match_central_differences() {
        let acts = [Act::Relu, Act::LeakyRelu(0.1), Act::Tanh, Act::Sigmoid, Act::Softplus, Act::Gelu, Act::Silu];
        for a in acts {
            for &z in &[-3.1, -0.7, -0.01, 0.02, 0.4, 2.5, 30.0, -40.0] {
                let h = 1e-6;
                let fd = (a.apply(z + h) - a.apply(z - h)) / (2.0 * h);
                assert!((fd - a.derivative(z)).abs() < 1e-8, "{a:?} at {z}: {fd} vs {}", a.derivative(z));
            }
        }
        // Values PyTorch gives in float64.
        assert!((Act::Gelu.apply(1.0) - 0.8413447460685429).abs() < 1e-15, "{:e}", Act::Gelu.apply(1.0) - 0.8413447460685429);
        assert!((Act::Softplus.apply(-50.0) - 1.9287498479639178e-22).abs() < 1e-36);
        assert!((Act::Silu.apply(-1.5) - -0.2736382857095345).abs() < 1e-15);
    }
}
