//! Element-wise activations: `relu`, `leaky_relu(slope)`, `tanh`, `sigmoid`, `softplus`,
//! `gelu` (the exact erf form, PyTorch's `GELU()`), `silu`.
//!
//! No parameters. ReLU and leaky ReLU are piecewise linear (along a step's path `w_s(t)` the
//! network is piecewise polynomial in t and its kinks are roots); the others are smooth, so the
//! adaptive quadrature converges on them without kinks.

use serde::{Deserialize, Serialize};

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
