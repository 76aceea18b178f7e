//! `last_token`: the read-out of a sequence's last position, `[T, d]` to `[d]` (PyTorch's
//! `x[:, -1]`; ExPLAIND's transformer reads its `=` token there).
//!
//! A selection: linear in its input, no parameters, polynomial along a step.

use dfdx::prelude::*;

use super::autodiff::{seq, Activations};
use serde_json::{json, Value};

use super::contract::{KindSpec, At, Layer, Poly, Probe, Sweep};
use super::spec::no_options;
use super::{AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// A resolved read-out of the last of `t` positions of `d` features.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LastToken {
    pub t: usize,
    pub d: usize,
}

impl LastToken {
    /// Each row's last position.
    ///
    /// # Shapes
    /// `x` `[rows, T, d]`; returns `[rows, d]`.
    fn pick(&self, x: &[f64]) -> Vec<f64> {
        let (t, d) = (self.t, self.d);
        x.chunks_exact(t * d).flat_map(|r| r[(t - 1) * d..].iter().copied()).collect()
    }
}

impl Layer for LastToken {
    fn torch(&self) -> String {
        "LastToken()".into()
    }

    fn forward(&self, _first: usize, _at: &At, x: Vec<f64>, _keep: bool) -> (Vec<f64>, Cache) {
        (self.pick(&x), Cache::None)
    }

    fn tangent(&self, _first: usize, _at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        (self.pick(&x), xd.map(|v| self.pick(&v)))
    }

    /// `dx[t] = dy` at the last position, 0 elsewhere.
    fn backward(&self, _first: usize, _at: &At, _cache: &Cache, dy: Vec<f64>, _k: usize, want_dx: bool, _grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        if !want_dx {
            return Vec::new();
        }
        let (t, d) = (self.t, self.d);
        let mut dx = vec![0.0; dy.len() * t];
        for (out, g) in dx.chunks_exact_mut(t * d).zip(dy.chunks_exact(d)) {
            out[(t - 1) * d..].copy_from_slice(g);
        }
        dx
    }

    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        Some(Poly { c: self.pick(&p.c), size: self.d })
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, _p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        let x = seq(x);
        let (n, t, d) = *x.shape();
        let idx: Vec<usize> = (0..n).map(|s| s * t + t - 1).collect();
        let idx = x.device().tensor_from_vec(idx, (n,));
        let rows = x.reshape_like(&(n * t, d));
        Activations::Flat(rows.gather::<(usize, usize), (usize,)>(idx))
    }
}

/// `"last_token"`: a sequence's last position, `[T, d]` to `[d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct LastTokenSpec;

impl KindSpec for LastTokenSpec {
    const NAMES: &'static [&'static str] = &["last_token"];
    /// `scripts/torch_model.py`'s `LastToken` (`x[:, -1]`).
    const TORCH: &'static [&'static str] = &["LastToken"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        no_options(arg, at, name)?;
        Ok(LastTokenSpec)
    }

    fn to_value(&self) -> Value {
        json!("last_token")
    }

    fn label(&self) -> String {
        "last_token".into()
    }

    fn from_torch(_class: &str, _m: &Value, _at: &str) -> Result<Self, String> {
        Ok(LastTokenSpec)
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let Shape::Seq(t, d) = input else {
            return Err(format!("{at} {}: needs a sequence [T, d] (after an embedding or attention), got {input}", self.label()));
        };
        Ok((AnyLayer::LastToken(LastToken { t, d }), Shape::Flat(d)))
    }
}
