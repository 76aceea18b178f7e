//! `layer_norm`: normalisation over the features of a flat vector (PyTorch's
//! `LayerNorm(features)`), over the features at each position of a sequence `[T, d]` (PyTorch's
//! `LayerNorm(d)` on `[n, T, d]`) or over the channels at each position of a `[C, H, W]` map (the
//! channels-last layer norm of ConvNeXt; `scripts/torch_model.py`'s `ChannelLayerNorm`), with its
//! affine parameters `weight [G]` and `bias [G]` (G the normalised group's size, initialised to
//! 1 and 0).
//!
//! `y = γ ⊙ x̂ + β`, `x̂ = (x − μ) / √(σ² + ε)` with the biased variance. Smooth: the adaptive
//! quadrature converges on it; its per-sample gradients are formed (`2·G` numbers per class).

use dfdx::prelude::*;

use super::autodiff::Activations;
use serde_json::{json, Value};

use super::contract::{KindSpec, Along, At, Layer, Poly, Probe, Sweep};
use super::recorded::{number, refuse, require};
use super::spec::{err, options};
use super::{AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// A resolved layer norm: `positions` groups of `g` values each per sample: flat vectors have
/// one group, maps one group per position (values `c·P + pos`), sequences one per position
/// (values `pos·G + c`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Norm {
    /// Normalised group size G (features, or channels).
    pub g: usize,
    /// Positions per sample (1 for a flat vector, `H·W` for a map, T for a sequence).
    pub positions: usize,
    /// ε.
    pub eps: f64,
    /// A sequence `[T, d]`: group `pos` is the row `pos` (values `pos·G + c`), not a map's
    /// channel column.
    pub seq: bool,
}

/// What the backward pass needs: `x̂` `[n, size]` and `1/√(σ²+ε)` `[n, positions]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct NormCache {
    pub xhat: Vec<f64>,
    pub rstd: Vec<f64>,
}

impl Norm {
    /// Offset of value `c` of group `pos` in one sample.
    fn at(&self, c: usize, pos: usize) -> usize {
        if self.seq {
            pos * self.g + c
        } else {
            c * self.positions + pos
        }
    }

    fn size(&self) -> usize {
        self.g * self.positions
    }

    /// Forward pass.
    ///
    /// # Shapes
    /// `gamma`, `beta` `[G]`, `x` `[n, G·positions]` (value `c·positions + pos`); returns `y` of
    /// the same shape and the cache.
    pub(crate) fn forward(&self, first: usize, at: &At, x: &[f64]) -> (Vec<f64>, NormCache) {
        let (g, np, size) = (self.g, self.positions, self.size());
        let n = x.len() / size;
        let mut y = vec![0.0; x.len()];
        let mut xhat = vec![0.0; x.len()];
        let mut rstd = vec![0.0; n * np];
        for s in 0..n {
            let (gamma, beta) = (at.at_sample(first, s), at.at_sample(first + 1, s));
            let xs = &x[s * size..(s + 1) * size];
            for pos in 0..np {
                let mean = (0..g).map(|c| xs[self.at(c, pos)]).sum::<f64>() / g as f64;
                let var = (0..g).map(|c| (xs[self.at(c, pos)] - mean).powi(2)).sum::<f64>() / g as f64;
                let r = 1.0 / (var + self.eps).sqrt();
                rstd[s * np + pos] = r;
                for c in 0..g {
                    let q = s * size + self.at(c, pos);
                    xhat[q] = (x[q] - mean) * r;
                    y[q] = gamma[c] * xhat[q] + beta[c];
                }
            }
        }
        (y, NormCache { xhat, rstd })
    }

    /// `x̂`'s tangent for an input tangent `ẋ`: `r(ẋ − mean(ẋ) − x̂·mean(ẋ ⊙ x̂))`, then
    /// `ẏ = γ ⊙ ẋ̂ + Δγ ⊙ x̂ + Δβ`.
    ///
    /// # Shapes
    /// As [`Norm::forward`]; `xdot` `None` is zero.
    pub(crate) fn tangent(&self, first: usize, at: &At, cache: &NormCache, xdot: Option<&[f64]>) -> Vec<f64> {
        let (g, np, size) = (self.g, self.positions, self.size());
        let n = cache.xhat.len() / size;
        let mut yd = vec![0.0; cache.xhat.len()];
        let zero = vec![0.0; g];
        let (dgamma, dbeta) = (at.dw(first).unwrap_or(&zero), at.dw(first + 1).unwrap_or(&zero));
        for s in 0..n {
            let gamma = at.at_sample(first, s);
            for pos in 0..np {
                let r = cache.rstd[s * np + pos];
                let (m1, m2) = match xdot {
                    Some(xd) => {
                        let m1 = (0..g).map(|c| xd[s * size + self.at(c, pos)]).sum::<f64>() / g as f64;
                        let m2 = (0..g).map(|c| xd[s * size + self.at(c, pos)] * cache.xhat[s * size + self.at(c, pos)]).sum::<f64>() / g as f64;
                        (m1, m2)
                    }
                    None => (0.0, 0.0),
                };
                for c in 0..g {
                    let q = s * size + self.at(c, pos);
                    let xh = cache.xhat[q];
                    let xhd = xdot.map_or(0.0, |xd| r * (xd[q] - m1 - xh * m2));
                    yd[q] = gamma[c] * xhd + dgamma[c] * xh + dbeta[c];
                }
            }
        }
        yd
    }

    /// Per-sample parameter gradients `[n, K, 2G]` (`∂/∂γ` then `∂/∂β`) and, when asked, the
    /// input sensitivities `[n, K, size]`.
    ///
    /// # Shapes
    /// `dy` `[n, K, size]`.
    pub(crate) fn backward(&self, first: usize, at: &At, cache: &NormCache, dy: &[f64], k: usize, need_dx: bool) -> (Vec<f64>, Option<Vec<f64>>) {
        let (g, np, size) = (self.g, self.positions, self.size());
        let n = cache.xhat.len() / size;
        let mut pg = vec![0.0; n * k * 2 * g];
        let mut dx = if need_dx { Some(vec![0.0; n * k * size]) } else { None };
        for s in 0..n {
            let gamma = at.at_sample(first, s);
            let xh = &cache.xhat[s * size..(s + 1) * size];
            for c in 0..k {
                let d = &dy[(s * k + c) * size..(s * k + c + 1) * size];
                let out = &mut pg[(s * k + c) * 2 * g..(s * k + c + 1) * 2 * g];
                for ch in 0..g {
                    for pos in 0..np {
                        let q = self.at(ch, pos);
                        out[ch] += d[q] * xh[q];
                        out[g + ch] += d[q];
                    }
                }
                if let Some(dx) = dx.as_mut() {
                    let dxs = &mut dx[(s * k + c) * size..(s * k + c + 1) * size];
                    for pos in 0..np {
                        let r = cache.rstd[s * np + pos];
                        let m1 = (0..g).map(|ch| d[self.at(ch, pos)] * gamma[ch]).sum::<f64>() / g as f64;
                        let m2 = (0..g).map(|ch| d[self.at(ch, pos)] * gamma[ch] * xh[self.at(ch, pos)]).sum::<f64>() / g as f64;
                        for ch in 0..g {
                            let q = self.at(ch, pos);
                            dxs[q] = r * (d[q] * gamma[ch] - m1 - xh[q] * m2);
                        }
                    }
                }
            }
        }
        (pg, dx)
    }
}

impl Layer for Norm {
    fn torch(&self) -> String {
        // PyTorch prints `eps` only when it is not its default 1e-5.
        let eps = if self.eps == 1e-5 { String::new() } else { format!(", eps={}", self.eps) };
        if self.positions == 1 || self.seq {
            format!("LayerNorm({}{eps})", self.g)
        } else {
            format!("ChannelLayerNorm({}{eps})", self.g)
        }
    }

    fn tensors(&self) -> Vec<(&'static str, Vec<usize>)> {
        vec![("weight", vec![self.g]), ("bias", vec![self.g])]
    }

    fn init(&self, _rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) {
        data.push(vec![1.0; self.g]);
        data.push(vec![0.0; self.g]);
    }

    fn along(&self) -> Along {
        Along::Smooth
    }

    fn device(&self) -> Option<crate::device::program::Op> {
        Some(crate::device::program::Op::Norm { g: self.g, positions: self.positions, seq: self.seq, eps: self.eps })
    }

    fn linear_in_params(&self) -> bool {
        true
    }

    fn forward(&self, first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let (y, c) = Norm::forward(self, first, at, &x);
        (y, if keep { Cache::Norm(c) } else { Cache::None })
    }

    fn tangent(&self, first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        let (y, c) = Norm::forward(self, first, at, &x);
        let yd = Norm::tangent(self, first, at, &c, xd.as_deref());
        (y, Some(yd))
    }

    fn backward(&self, first: usize, at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Norm(c) = cache else { unreachable!("a layer norm's cache is its x̂") };
        let (g, dx) = Norm::backward(self, first, at, c, &dy, k, want_dx);
        grads.push((first, Grad::Formed { g, width: 2 * self.g }));
        dx.unwrap_or_default()
    }

    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], _p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        None
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, first: usize, p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        match x {
            Activations::Flat(t) => {
                let shape = *t.shape();
                let y = t.normalize::<Axis<1>>(self.eps);
                let g = p[first].r1().clone().broadcast_like::<(usize, usize), Axis<0>>(&shape);
                let b = p[first + 1].r1().clone().broadcast_like::<(usize, usize), Axis<0>>(&shape);
                Activations::Flat(y * g + b)
            }
            Activations::Seq(t) => {
                let shape = *t.shape();
                let y = t.normalize::<Axis<2>>(self.eps);
                let g = p[first].r1().clone().broadcast_like::<(usize, usize, usize), Axes2<0, 1>>(&shape);
                let b = p[first + 1].r1().clone().broadcast_like::<(usize, usize, usize), Axes2<0, 1>>(&shape);
                Activations::Seq(y * g + b)
            }
            Activations::Map(t) => {
                let shape = *t.shape();
                let y = t.normalize::<Axis<1>>(self.eps);
                let g = p[first].r1().clone().broadcast_like::<crate::model::conv::Shape4, Axes3<0, 2, 3>>(&shape);
                let b = p[first + 1].r1().clone().broadcast_like::<crate::model::conv::Shape4, Axes3<0, 2, 3>>(&shape);
                Activations::Map(y * g + b)
            }
        }
    }

    fn gradient_floats(&self, k: u64) -> u64 {
        k * 2 * self.g as u64
    }
}

/// `"layer_norm"` or `{ layer_norm = { eps } }`: layer norm over the features (flat) or the
/// channels at each position (map).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormSpec {
    /// ε (PyTorch's default 1e-5).
    pub eps: f64,
}

impl KindSpec for LayerNormSpec {
    const NAMES: &'static [&'static str] = &["layer_norm"];
    const TORCH: &'static [&'static str] = &["LayerNorm", "ChannelLayerNorm"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let eps = match arg {
            None => 1e-5,
            Some(a) => {
                let m = options(a, at, name, &["eps"])?;
                m.get("eps").map_or(Ok(1e-5), |e| e.as_f64().ok_or_else(|| err(at, format!("layer_norm.eps must be a number, got {e}"))))?
            }
        };
        if !(eps.is_finite() && eps > 0.0) {
            return Err(err(at, format!("layer_norm.eps must be positive, got {eps}")));
        }
        Ok(LayerNormSpec { eps })
    }

    fn to_value(&self) -> Value {
        json!({ "layer_norm": { "eps": self.eps } })
    }

    fn label(&self) -> String {
        "layer_norm".into()
    }

    fn from_torch(class: &str, m: &Value, at: &str) -> Result<Self, String> {
        if class == "LayerNorm" {
            require(m, "elementwise_affine", Value::Bool(true), at, "a layer norm without its affine parameters is not supported")?;
            require(m, "bias", Value::Bool(true), at, "a layer norm without its bias is not supported")?;
            let shape = m.get("normalized_shape").and_then(Value::as_array).map(Vec::len).unwrap_or(0);
            if shape != 1 {
                return Err(refuse(at, m, "LayerNorm over more than the last dimension is not supported: normalise flat features, or the channels of a map with torch_model.ChannelLayerNorm"));
            }
        }
        Ok(LayerNormSpec { eps: number(m, "eps", at)? })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let norm = match input {
            Shape::Flat(f) => Norm { g: f, positions: 1, eps: self.eps, seq: false },
            Shape::Map(c, h, w) => Norm { g: c, positions: h * w, eps: self.eps, seq: false },
            Shape::Seq(t, d) => Norm { g: d, positions: t, eps: self.eps, seq: true },
            Shape::Tokens(..) => return Err(format!("{at} {}: layer norm on token ids {input}: start with an \"embedding\"", self.label())),
        };
        if norm.g < 2 {
            return Err(format!("{at} {}: normalises over 1 value of {input}: its output would be constant", self.label()));
        }
        Ok((AnyLayer::LayerNorm(norm), input))
    }
}
