//! `mean_tokens`: the mean over a sequence's positions, `[T, d]` to `[d]` (PyTorch's
//! `x.mean(dim=1)`, the pooled read-out of encoder classifiers).
//!
//! Linear in its input, no parameters, polynomial along a step.

use dfdx::prelude::*;

use super::autodiff::{seq, Activations};
use serde_json::{json, Value};

use super::contract::{KindSpec, At, Layer, Poly, Probe, Sweep};
use super::spec::no_options;
use super::{AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// A resolved mean over `t` positions of `d` features.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MeanTokens {
    pub t: usize,
    pub d: usize,
}

impl MeanTokens {
    /// Each row's mean position.
    ///
    /// # Shapes
    /// `x` `[rows, T, d]`; returns `[rows, d]`.
    fn mean(&self, x: &[f64]) -> Vec<f64> {
        let (t, d) = (self.t, self.d);
        let inv = 1.0 / t as f64;
        let mut y = vec![0.0; x.len() / t];
        for (out, r) in y.chunks_exact_mut(d).zip(x.chunks_exact(t * d)) {
            for pos in r.chunks_exact(d) {
                out.iter_mut().zip(pos).for_each(|(a, b)| *a += b);
            }
            out.iter_mut().for_each(|a| *a *= inv);
        }
        y
    }
}

impl Layer for MeanTokens {
    fn torch(&self) -> String {
        "MeanTokens()".into()
    }

    fn forward(&self, _first: usize, _at: &At, x: Vec<f64>, _keep: bool) -> (Vec<f64>, Cache) {
        (self.mean(&x), Cache::None)
    }

    fn tangent(&self, _first: usize, _at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        (self.mean(&x), xd.map(|v| self.mean(&v)))
    }

    /// `dx[t] = dy / T` at every position.
    fn backward(&self, _first: usize, _at: &At, _cache: &Cache, dy: Vec<f64>, _k: usize, want_dx: bool, _grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        if !want_dx {
            return Vec::new();
        }
        let (t, d) = (self.t, self.d);
        let inv = 1.0 / t as f64;
        let mut dx = vec![0.0; dy.len() * t];
        for (out, g) in dx.chunks_exact_mut(t * d).zip(dy.chunks_exact(d)) {
            for pos in out.chunks_exact_mut(d) {
                pos.iter_mut().zip(g).for_each(|(a, b)| *a = inv * b);
            }
        }
        dx
    }

    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        Some(Poly { c: self.mean(&p.c), size: self.d })
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, _p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        let x = seq(x);
        let s: Tensor<(usize, usize), f64, D, T> = x.sum::<(usize, usize), Axis<1>>();
        Activations::Flat(s * (1.0 / self.t as f64))
    }
}

/// `"mean_tokens"`: the mean over a sequence's positions, `[T, d]` to `[d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MeanTokensSpec;

impl KindSpec for MeanTokensSpec {
    const NAMES: &'static [&'static str] = &["mean_tokens"];
    /// `scripts/torch_model.py`'s `MeanTokens` (`x.mean(dim=1)`).
    const TORCH: &'static [&'static str] = &["MeanTokens"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        no_options(arg, at, name)?;
        Ok(MeanTokensSpec)
    }

    fn to_value(&self) -> Value {
        json!("mean_tokens")
    }

    fn label(&self) -> String {
        "mean_tokens".into()
    }

    fn from_torch(_class: &str, _m: &Value, _at: &str) -> Result<Self, String> {
        Ok(MeanTokensSpec)
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let Shape::Seq(t, d) = input else {
            return Err(format!("{at} {}: needs a sequence [T, d] (after an embedding or attention), got {input}", self.label()));
        };
        Ok((AnyLayer::MeanTokens(MeanTokens { t, d }), Shape::Flat(d)))
    }
}
