//! `dense`: a fully connected layer, PyTorch's `Linear(in, out)`, on a flat feature vector or
//! position-wise on a sequence `[T, in]` (the same map at every position, as `Linear` applies
//! to the last dimension).
//!
//! Parameters `weight [out, in]` and `bias [out]` (optional). Linear in its input and in its
//! parameters, so along a step's path `w_s(t)` its output's degree in t rises by one, and a
//! batch of rows each at its own `t` is two GEMMs (`X W_sᵀ` and `X ΔWᵀ`, a sequence's positions
//! as rows) and a combine by `t`. On a flat input its per-sample gradient factors as
//! `δ[k] ⊗ [a, 1]` (input activations `a`, output sensitivities `δ`): the kernel engine
//! contracts the two factors separately, never the `out × in` product. On a sequence it is a
//! sum over positions, `Σ_τ δ_τ[k] ⊗ [a_τ, 1]`, no longer one outer product: it is formed,
//! `[n, K, out·in (+ out)]`.

use dfdx::prelude::*;

use super::autodiff::{flat, Activations};
use serde_json::{json, Value};

use super::contract::{add_scaled_rows, sample_runs, At, KindSpec, Layer, Poly, Probe, Sweep};
use super::recorded::{boolean, uint};
use super::spec::{as_bool, as_size, err, need, options};
use super::{uniform, AnyLayer, Cache, Grad, Shape};
use crate::linalg::{gemm, gemm_abt};
use crate::model::tensors::ParamTensor;

/// A resolved dense layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Dense {
    pub n_in: usize,
    pub n_out: usize,
    pub bias: bool,
    /// Positions of the sequence it applies to each of (1: a flat vector).
    pub positions: usize,
}

fn add_bias(y: &mut [f64], b: &[f64]) {
    let out = b.len();
    y.chunks_exact_mut(out).for_each(|r| r.iter_mut().zip(b).for_each(|(v, bv)| *v += bv));
}

impl Dense {
    /// `y = x Wᵀ + b`.
    ///
    /// # Shapes
    /// `w` `[out, in]`, `b` `[out]`, `x` `[n, in]`; returns `[n, out]`.
    pub(crate) fn forward_at(&self, w: &[f64], b: Option<&[f64]>, x: &[f64]) -> Vec<f64> {
        let n = x.len() / self.n_in;
        let mut y = vec![0.0; n * self.n_out];
        gemm_abt(&mut y, x, w, n, self.n_out, self.n_in, 1.0, false);
        if let Some(b) = b {
            add_bias(&mut y, b);
        }
        y
    }

    fn bias<'a>(&self, at: &At<'a>, first: usize) -> Option<&'a [f64]> {
        self.bias.then(|| at.w(first + 1))
    }

    /// `x W(t)ᵀ (+ b(t))` with each sample at its own t; `x1` is `x ΔWᵀ (+ Δb)` when the
    /// caller has it already.
    fn apply(&self, first: usize, at: &At, x: &[f64], bias: bool, x1: Option<&[f64]>) -> Vec<f64> {
        let b = if bias { self.bias(at, first) } else { None };
        let per = self.positions * self.n_in;
        if x1.is_none() {
            // A point's node rows enter the first layer with one input: its products once
            // per run of equal consecutive samples, combined by each sample's t.
            let runs = sample_runs(x, per);
            if 2 * runs.len() <= x.len() / per.max(1) {
                return self.apply_runs(first, at, x, b, bias, &runs);
            }
        }
        let mut y = self.forward_at(at.w(first), b, x);
        if let Some((dw, t)) = at.offset(first) {
            let y1 = match x1 {
                Some(y1) => std::borrow::Cow::Borrowed(y1),
                None => {
                    let db = if bias && self.bias { at.offset(first + 1).map(|o| o.0) } else { None };
                    std::borrow::Cow::Owned(self.forward_at(dw, db, x))
                }
            };
            add_scaled_rows(&mut y, &y1, t, self.positions * self.n_out);
        }
        y
    }

    /// [`Dense::apply`] with `x W_sᵀ` and `x ΔWᵀ` formed once per run of equal samples.
    fn apply_runs(&self, first: usize, at: &At, x: &[f64], b: Option<&[f64]>, bias: bool, runs: &[(usize, usize)]) -> Vec<f64> {
        let (per, out) = (self.positions * self.n_in, self.positions * self.n_out);
        let firsts: Vec<f64> = runs.iter().flat_map(|&(s0, _)| x[s0 * per..(s0 + 1) * per].iter().copied()).collect();
        let y0 = self.forward_at(at.w(first), b, &firsts);
        let step = at.offset(first).map(|(dw, t)| {
            let db = if bias && self.bias { at.offset(first + 1).map(|o| o.0) } else { None };
            (self.forward_at(dw, db, &firsts), t)
        });
        let n: usize = runs.iter().map(|r| r.1).sum();
        let mut y = Vec::with_capacity(n * out);
        for (r, &(s0, len)) in runs.iter().enumerate() {
            let base = &y0[r * out..(r + 1) * out];
            for s in s0..s0 + len {
                match &step {
                    Some((y1, t)) if t[s] != 0.0 => y.extend(base.iter().zip(&y1[r * out..(r + 1) * out]).map(|(a, b)| a + t[s] * b)),
                    _ => y.extend_from_slice(base),
                }
            }
        }
        y
    }

    /// The per-sample gradient on a sequence, `Σ_τ δ_τ[k] ⊗ [a_τ, 1]`, formed.
    ///
    /// # Shapes
    /// `a` `[n, T, in]`, `dy` `[n, K, T, out]`; returns `[n, K, out·in (+ out)]`.
    fn formed(&self, a: &[f64], dy: &[f64], k: usize) -> Grad {
        let (t, ni, no) = (self.positions, self.n_in, self.n_out);
        let width = no * ni + if self.bias { no } else { 0 };
        let n = a.len() / (t * ni);
        let mut g = vec![0.0; n * k * width];
        for s in 0..n {
            let acts = &a[s * t * ni..(s + 1) * t * ni];
            for c in 0..k {
                let d = &dy[(s * k + c) * t * no..(s * k + c + 1) * t * no];
                let out = &mut g[(s * k + c) * width..(s * k + c + 1) * width];
                gemm(&mut out[..no * ni], d, true, acts, false, (no, ni, t), 1.0, false);
                if self.bias {
                    for row in d.chunks_exact(no) {
                        out[no * ni..].iter_mut().zip(row).for_each(|(b, v)| *b += v);
                    }
                }
            }
        }
        Grad::Formed { g, width }
    }
}

impl Layer for Dense {
    fn torch(&self) -> String {
        format!("Linear({}, {}{})", self.n_in, self.n_out, if self.bias { "" } else { ", bias=False" })
    }

    fn tensors(&self) -> Vec<(&'static str, Vec<usize>)> {
        let mut v = vec![("weight", vec![self.n_out, self.n_in])];
        if self.bias {
            v.push(("bias", vec![self.n_out]));
        }
        v
    }

    fn init(&self, rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) {
        uniform(rng, self.n_out * self.n_in, self.n_in, data);
        if self.bias {
            uniform(rng, self.n_out, self.n_in, data);
        }
    }

    fn linear_in_params(&self) -> bool {
        true
    }

    fn forward(&self, first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let y = self.apply(first, at, &x, true, None);
        (y, if keep { Cache::Input(x) } else { Cache::None })
    }

    /// `ẏ = ẋ W(t)ᵀ + x ΔWᵀ + Δb`.
    fn tangent(&self, first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        // `x ΔWᵀ + Δb` is both the tangent's direction term and the per-row offset of `y`.
        let mut yd = match at.dw(first) {
            Some(dw) => self.forward_at(dw, if self.bias { at.dw(first + 1) } else { None }, &x),
            None => vec![0.0; x.len() / self.n_in * self.n_out],
        };
        let y = self.apply(first, at, &x, true, at.dw.map(|_| yd.as_slice()));
        if let Some(xd) = xd {
            let t = self.apply(first, at, &xd, false, None);
            yd.iter_mut().zip(&t).for_each(|(a, b)| *a += b);
        }
        (y, Some(yd))
    }

    /// `dx[s, k] = dy[s, k] W(t_s)`.
    fn backward(&self, first: usize, at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Input(a) = cache else { unreachable!("a dense layer's cache is its input") };
        let dx = if want_dx {
            let rows = dy.len() / self.n_out;
            let mut dx = vec![0.0; rows * self.n_in];
            match at.offset(first) {
                None => gemm(&mut dx, &dy, false, at.w(first), false, (rows, self.n_in, self.n_out), 1.0, false),
                // `dy·W_s + t·(dy·ΔW)` as one product `[dy, t·dy] × [W_s; ΔW]`: one output
                // buffer instead of two (a node row's K cotangents share its t).
                Some((dw, t)) => {
                    let per = k * self.positions;
                    let mut dy2 = Vec::with_capacity(2 * dy.len());
                    for (r, row) in dy.chunks_exact(self.n_out).enumerate() {
                        let ts = t[r / per];
                        dy2.extend_from_slice(row);
                        dy2.extend(row.iter().map(|v| ts * v));
                    }
                    let w2 = [at.w(first), dw].concat();
                    gemm(&mut dx, &dy2, false, &w2, false, (rows, self.n_in, 2 * self.n_out), 1.0, false);
                }
            }
            dx
        } else {
            Vec::new()
        };
        let grad = if self.positions == 1 { Grad::Factor { acts: a.clone(), deltas: dy, n_in: self.n_in, n_out: self.n_out, bias: self.bias } } else { self.formed(a, &dy, k) };
        grads.push((first, grad));
        dx
    }

    fn sweep(&self, first: usize, w: &[Vec<f64>], dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        // The bias at every position (borrowed as it is on a flat input).
        fn tile(b: &[f64], positions: usize) -> std::borrow::Cow<'_, [f64]> {
            if positions == 1 {
                b.into()
            } else {
                b.iter().copied().cycle().take(positions * b.len()).collect::<Vec<f64>>().into()
            }
        }
        let b = self.bias.then(|| (tile(&w[first + 1], self.positions), tile(&dw[first + 1], self.positions)));
        Some(p.linear(self.positions * self.n_out, &|wt, x| self.forward_at(wt, None, x), &w[first], &dw[first], b.as_ref().map(|(b0, db)| (&**b0, &**db))))
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, first: usize, p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        // A sequence's positions as rows.
        let (a, n) = match x {
            Activations::Seq(s) => {
                let (n, t, d) = *s.shape();
                (s.reshape_like(&(n * t, d)), Some(n))
            }
            other => (flat(other), None),
        };
        let rows = a.shape().0;
        let mut z = a.matmul(p[first].r2().clone().permute::<(usize, usize), Axes2<1, 0>>());
        if self.bias {
            z = z + p[first + 1].r1().clone().broadcast_like::<(usize, usize), Axis<0>>(&(rows, self.n_out));
        }
        match n {
            Some(n) => Activations::Seq(z.reshape_like(&(n, self.positions, self.n_out))),
            None => Activations::Flat(z),
        }
    }

    fn gradient_floats(&self, k: u64) -> u64 {
        if self.positions == 1 {
            (self.n_in + 1) as u64 + k * self.n_out as u64
        } else {
            k * (self.n_out * (self.n_in + usize::from(self.bias))) as u64
        }
    }

    fn torch_input(&self) -> Option<(&'static str, usize)> {
        Some(("in_features", self.n_in))
    }

    fn is_recorded_projection(&self, m: &serde_json::Value) -> bool {
        m.get("type").and_then(serde_json::Value::as_str) == Some("Linear") && m.get("bias").and_then(serde_json::Value::as_bool) == Some(true)
    }

    fn is_dense_with_bias(&self) -> bool {
        self.bias
    }

    fn device(&self) -> Option<crate::device::program::Op> {
        // The device program has no position-wise form (nor the attention it would follow).
        (self.positions == 1).then_some(crate::device::program::Op::Dense { n_in: self.n_in, n_out: self.n_out, bias: self.bias })
    }
}

/// `{ dense = features }` or `{ dense = { features, bias } }`: `Linear(in, features, bias)` on a
/// flat input, or at every position of a sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseSpec {
    /// Output features.
    pub features: usize,
    /// Whether it has a bias.
    pub bias: bool,
}

impl KindSpec for DenseSpec {
    const NAMES: &'static [&'static str] = &["dense", "linear"];
    const TORCH: &'static [&'static str] = &["Linear"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let a = need(arg, at, name)?;
        if a.is_number() {
            return Ok(DenseSpec { features: as_size(a, at, "dense")?, bias: true });
        }
        let m = options(a, at, name, &["features", "bias"])?;
        let features = as_size(m.get("features").ok_or_else(|| err(at, "dense needs `features`"))?, at, "dense.features")?;
        let bias = m.get("bias").map_or(Ok(true), |b| as_bool(b, at, "dense.bias"))?;
        Ok(DenseSpec { features, bias })
    }

    fn to_value(&self) -> Value {
        json!({ "dense": { "features": self.features, "bias": self.bias } })
    }

    fn label(&self) -> String {
        format!("dense({})", self.features)
    }

    fn from_torch(_class: &str, m: &Value, at: &str) -> Result<Self, String> {
        Ok(DenseSpec { features: uint(m, "out_features", at)?, bias: boolean(m, "bias", at)? })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        match input {
            Shape::Flat(n_in) => Ok((AnyLayer::Dense(Dense { n_in, n_out: self.features, bias: self.bias, positions: 1 }), Shape::Flat(self.features))),
            Shape::Seq(t, d) => Ok((AnyLayer::Dense(Dense { n_in: d, n_out: self.features, bias: self.bias, positions: t }), Shape::Seq(t, self.features))),
            _ => Err(format!("{at} {}: needs a flat input or a sequence of feature vectors, got {}", self.label(), super::not_flat(input))),
        }
    }
}
