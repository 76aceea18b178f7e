//! `layer_norm`: normalisation over the features of a flat vector (PyTorch's
//! `LayerNorm(features)`) or over the channels at each position of a `[C, H, W]` map (the
//! channels-last layer norm of ConvNeXt; `scripts/torch_model.py`'s `ChannelLayerNorm`), with its
//! affine parameters `weight [G]` and `bias [G]` (G the normalised group's size, initialised to
//! 1 and 0).
//!
//! `y = γ ⊙ x̂ + β`, `x̂ = (x − μ) / √(σ² + ε)` with the biased variance. Smooth: the adaptive
//! quadrature converges on it; its per-sample gradients are formed (`2·G` numbers per class).

/// A resolved layer norm: `groups` groups of `g` values each per sample, group j's value i at
/// offset `j·inner_stride…`: flat vectors have one group (stride 1), maps one group per position
/// (values `c·P + pos`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Norm {
    /// Normalised group size G (features, or channels).
    pub g: usize,
    /// Positions per sample (1 for a flat vector, `H·W` for a map).
    pub positions: usize,
    /// ε.
    pub eps: f64,
}

/// What the backward pass needs: `x̂` `[n, size]` and `1/√(σ²+ε)` `[n, positions]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct NormCache {
    pub xhat: Vec<f64>,
    pub rstd: Vec<f64>,
}

impl Norm {
    fn size(&self) -> usize {
        self.g * self.positions
    }

    /// Forward pass.
    ///
    /// # Shapes
    /// `gamma`, `beta` `[G]`, `x` `[n, G·positions]` (value `c·positions + pos`); returns `y` of
    /// the same shape and the cache.
    pub(crate) fn forward(&self, gamma: &[f64], beta: &[f64], x: &[f64]) -> (Vec<f64>, NormCache) {
        let (g, np, size) = (self.g, self.positions, self.size());
        let n = x.len() / size;
        let mut y = vec![0.0; x.len()];
        let mut xhat = vec![0.0; x.len()];
        let mut rstd = vec![0.0; n * np];
        for s in 0..n {
            let xs = &x[s * size..(s + 1) * size];
            for pos in 0..np {
                let mean = (0..g).map(|c| xs[c * np + pos]).sum::<f64>() / g as f64;
                let var = (0..g).map(|c| (xs[c * np + pos] - mean).powi(2)).sum::<f64>() / g as f64;
                let r = 1.0 / (var + self.eps).sqrt();
                rstd[s * np + pos] = r;
                for c in 0..g {
                    let q = s * size + c * np + pos;
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
    pub(crate) fn tangent(&self, gamma: &[f64], dgamma: &[f64], dbeta: &[f64], cache: &NormCache, xdot: Option<&[f64]>) -> Vec<f64> {
        let (g, np, size) = (self.g, self.positions, self.size());
        let n = cache.xhat.len() / size;
        let mut yd = vec![0.0; cache.xhat.len()];
        for s in 0..n {
            for pos in 0..np {
                let r = cache.rstd[s * np + pos];
                let (m1, m2) = match xdot {
                    Some(xd) => {
                        let m1 = (0..g).map(|c| xd[s * size + c * np + pos]).sum::<f64>() / g as f64;
                        let m2 = (0..g).map(|c| xd[s * size + c * np + pos] * cache.xhat[s * size + c * np + pos]).sum::<f64>() / g as f64;
                        (m1, m2)
                    }
                    None => (0.0, 0.0),
                };
                for c in 0..g {
                    let q = s * size + c * np + pos;
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
    pub(crate) fn backward(&self, gamma: &[f64], cache: &NormCache, dy: &[f64], k: usize, need_dx: bool) -> (Vec<f64>, Option<Vec<f64>>) {
        let (g, np, size) = (self.g, self.positions, self.size());
        let n = cache.xhat.len() / size;
        let mut pg = vec![0.0; n * k * 2 * g];
        let mut dx = if need_dx { Some(vec![0.0; n * k * size]) } else { None };
        for s in 0..n {
            let xh = &cache.xhat[s * size..(s + 1) * size];
            for c in 0..k {
                let d = &dy[(s * k + c) * size..(s * k + c + 1) * size];
                let out = &mut pg[(s * k + c) * 2 * g..(s * k + c + 1) * 2 * g];
                for ch in 0..g {
                    for pos in 0..np {
                        let q = ch * np + pos;
                        out[ch] += d[q] * xh[q];
                        out[g + ch] += d[q];
                    }
                }
                if let Some(dx) = dx.as_mut() {
                    let dxs = &mut dx[(s * k + c) * size..(s * k + c + 1) * size];
                    for pos in 0..np {
                        let r = cache.rstd[s * np + pos];
                        let m1 = (0..g).map(|ch| d[ch * np + pos] * gamma[ch]).sum::<f64>() / g as f64;
                        let m2 = (0..g).map(|ch| d[ch * np + pos] * gamma[ch] * xh[ch * np + pos]).sum::<f64>() / g as f64;
                        for ch in 0..g {
                            let q = ch * np + pos;
                            dxs[q] = r * (d[q] * gamma[ch] - m1 - xh[q] * m2);
                        }
                    }
                }
            }
        }
        (pg, dx)
    }
}
