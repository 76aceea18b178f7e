//! The one-hidden-layer ReLU MLP with log-softmax outputs as four plain matrices, its batched
//! forward pass on faer GEMMs, and the row-major GEMM helper the other files of the benchmark
//! use. Everything fast in `attribution` and the benchmark (`datamodels`: the retrainer, the
//! per-example gradients, the GGN) is written against this view; each is tested against the
//! crate's dfdx network.


use crate::error::{Error, Result};
use crate::linalg::gemm;
use crate::model::{Activation, Architecture, Body, OutputKind, Params};

/// A `d-h-K` ReLU MLP with biases and log-softmax outputs: `z = W2 relu(W1 x + b1) + b2`,
/// `f = log_softmax(z)`.
///
/// # Shapes
/// `w1 [h, d]`, `b1 [h]`, `w2 [K, h]`, `b2 [K]` (PyTorch's `[out, in]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp1 {
    /// Input dimension d.
    pub d: usize,
    /// Hidden width h.
    pub h: usize,
    /// Outputs K.
    pub k: usize,
    /// First-layer weights `[h, d]`.
    pub w1: Vec<f64>,
    /// First-layer bias `[h]`.
    pub b1: Vec<f64>,
    /// Output weights `[K, h]`.
    pub w2: Vec<f64>,
    /// Output bias `[K]`.
    pub b2: Vec<f64>,
}

/// The batched forward pass of [`Mlp1`].
///
/// # Shapes
/// `pre`, `hid` `[n, h]`; `logits`, `logp` `[n, K]`.
#[derive(Clone, Debug)]
pub struct Forward {
    /// Pre-activations `W1 x + b1`.
    pub pre: Vec<f64>,
    /// Hidden activations `relu(pre)`.
    pub hid: Vec<f64>,
    /// Logits `z`.
    pub logits: Vec<f64>,
    /// Log-probabilities `log_softmax(z)`.
    pub logp: Vec<f64>,
}

impl Mlp1 {
    /// Checks that `arch` is a one-hidden-layer ReLU MLP with biases, log-softmax outputs, α = 1
    /// and no output offset (what the fast paths implement).
    pub fn check_architecture(arch: &Architecture) -> Result<(usize, usize, usize)> {
        let widths = match &arch.body {
            Body::Mlp { widths } if widths.len() == 3 => widths,
            _ => return Err(Error::Config("the datamodels benchmark needs a one-hidden-layer MLP (hidden = [h])".into())),
        };
        if arch.activation != Activation::Relu || !arch.bias || arch.alpha != 1.0 || arch.zero_output || arch.output != OutputKind::LogSoftmax {
            return Err(Error::Config(
                "the datamodels benchmark needs a ReLU MLP with biases, log-softmax outputs (cross-entropy), alpha = 1 and zero_output = false".into(),
            ));
        }
        Ok((widths[0], widths[1], widths[2]))
    }

    /// The network of `arch` at `params`.
    ///
    /// Errors: an architecture [`Mlp1::check_architecture`] refuses, and parameters of another shape.
    pub fn from_params(arch: &Architecture, params: &Params) -> Result<Mlp1> {
        let (d, h, k) = Self::check_architecture(arch)?;
        arch.check_params(params)?;
        Ok(Mlp1 { d, h, k, w1: params.data[0].clone(), b1: params.data[1].clone(), w2: params.data[2].clone(), b2: params.data[3].clone() })
    }

    /// The crate's [`Params`] (names and order of `arch.param_specs()`).
    pub fn to_params(&self, arch: &Architecture) -> Params {
        Params { specs: arch.param_specs(), data: vec![self.w1.clone(), self.b1.clone(), self.w2.clone(), self.b2.clone()] }
    }

    /// Number of parameters W = h(d + 1) + K(h + 1).
    pub fn numel(&self) -> usize {
        self.h * (self.d + 1) + self.k * (self.h + 1)
    }

    /// The parameters as one flat vector in the crate's order `[W1, b1, W2, b2]`. # Shapes `[W]`.
    pub fn flat(&self) -> Vec<f64> {
        [&self.w1[..], &self.b1, &self.w2, &self.b2].concat()
    }

    /// Forward pass at rows `x`. # Shapes `x [n, d]`.
    pub fn forward(&self, x: &[f64]) -> Forward {
        let (d, h, k) = (self.d, self.h, self.k);
        let n = x.len() / d;
        let mut pre = vec![0.0; n * h];
        gemm(&mut pre, x, false, &self.w1, true, (n, h, d), 1.0, false);
        for row in pre.chunks_exact_mut(h) {
            row.iter_mut().zip(&self.b1).for_each(|(v, b)| *v += b);
        }
        let hid: Vec<f64> = pre.iter().map(|&v| v.max(0.0)).collect();
        let mut logits = vec![0.0; n * k];
        gemm(&mut logits, &hid, false, &self.w2, true, (n, k, h), 1.0, false);
        for row in logits.chunks_exact_mut(k) {
            row.iter_mut().zip(&self.b2).for_each(|(v, b)| *v += b);
        }
        let mut logp = logits.clone();
        crate::model::log_softmax_rows(&mut logp, k);
        Forward { pre, hid, logits, logp }
    }
}

/// The correct class's log-probability and the logit margin `z_y − max_{c≠y} z_c` of each row.
///
/// # Shapes
/// `fwd` of `n` rows, `labels [n]` → two `[n]` vectors.
pub fn outputs_at_labels(fwd: &Forward, labels: &[usize], k: usize) -> (Vec<f64>, Vec<f64>) {
    let logp = labels.iter().enumerate().map(|(i, &y)| fwd.logp[i * k + y]).collect();
    let margin = labels
        .iter()
        .enumerate()
        .map(|(i, &y)| {
            let z = &fwd.logits[i * k..(i + 1) * k];
            let other = (0..k).filter(|&c| c != y).map(|c| z[c]).fold(f64::NEG_INFINITY, f64::max);
            z[y] - other
        })
        .collect();
    (logp, margin)
}

/// A small `d-h-k` architecture of the benchmark's kind, for the unit tests.
#[cfg(test)]
pub(crate) fn small_arch(d: usize, h: usize, k: usize) -> Architecture {
        Architecture {
            body: Body::Mlp { widths: vec![d, h, k] },
            activation: Activation::Relu,
            bias: true,
            zero_last: false,
            alpha: 1.0,
            zero_output: false,
            output: OutputKind::LogSoftmax,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_matches_the_crates_network() {
        let arch = small_arch(5, 7, 3);
        let p = arch.init(3);
        let x: Vec<f64> = (0..4 * 5).map(|i| ((i as f64) * 0.71).sin()).collect();
        let net = Mlp1::from_params(&arch, &p).unwrap();
        let f = net.forward(&x);
        let want = arch.forward(&p, None, &x).unwrap();
        for (a, b) in f.logp.iter().zip(&want) {
            assert!((a - b).abs() < 1e-14, "{a} vs {b}");
        }
        assert_eq!(net.to_params(&arch), p);
        assert_eq!(net.flat(), p.flat());
    }

    #[test]
    fn gemm_transposes_match_loops() {
        let (m, n, k) = (3, 4, 5);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.3).cos()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.2).sin()).collect();
        let at: Vec<f64> = (0..k * m).map(|j| a[(j % m) * k + j / m]).collect(); // [k, m]
        let bt: Vec<f64> = (0..n * k).map(|j| b[(j % k) * n + j / k]).collect(); // [n, k]
        let want: Vec<f64> = (0..m * n).map(|ij| (0..k).map(|l| a[(ij / n) * k + l] * b[l * n + ij % n]).sum()).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut c = vec![0.0; m * n];
            gemm(&mut c, if ta { &at } else { &a }, ta, if tb { &bt } else { &b }, tb, (m, n, k), 1.0, false);
            for (x, y) in c.iter().zip(&want) {
                assert!((x - y).abs() < 1e-14);
            }
        }
    }
}
