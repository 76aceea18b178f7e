//! `embedding`: token ids to vectors, PyTorch's `Embedding(vocab, dim)` with its output scaled by
//! a constant (ExPLAIND's transformer scales by √d).
//!
//! Parameter `weight [vocab, dim]` (initialised N(0, 1), PyTorch's default) and, with
//! `positions`, a learned position embedding `position [T, dim]` (N(0, 1)). On a sequence of T
//! token ids `[T]` it gives `[T, dim]`: row t is `scale · weight[x_t] (+ position[t])`. Linear in
//! its parameters and constant in its input (token ids carry no tangent and no cotangent), so
//! along a step's path its output's degree in t is one. Its per-sample gradient is formed
//! (`(vocab + T)·dim` numbers per class, zero outside the rows of the sample's tokens).

use dfdx::prelude::*;
use rand_distr::{Distribution, StandardNormal};

use super::autodiff::{flat, Activations};
use serde_json::{json, Value};

use super::contract::{KindSpec, At, Layer, Poly, Probe, Sweep};
use super::recorded::{number, refuse, uint};
use super::spec::{as_bool, as_size, err, need, options};
use super::{AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// A resolved embedding on sequences of `t` tokens.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Embedding {
    pub vocab: usize,
    pub dim: usize,
    pub t: usize,
    pub scale: f64,
    /// A learned position embedding `[T, dim]` added.
    pub positions: bool,
}

impl Embedding {
    /// The token id at `x`.
    ///
    /// # Panics
    /// If `x` is not a token id in `0..vocab` (inputs are checked where they enter:
    /// [`crate::data::Dataset`]'s validation and `Stack::check_input`).
    fn token(&self, x: f64) -> usize {
        assert!(x >= 0.0 && x.fract() == 0.0 && x < self.vocab as f64, "token id {x} is not in 0..{} (unchecked input)", self.vocab);
        x as usize
    }

    /// `scale · w[x_t]` for every token of every sample, each sample's `w` its own
    /// (`w + t_s·Δw` when `dw` is given).
    ///
    /// # Shapes
    /// `w`, `dw` `[vocab, dim]`, `x` `[n, T]`; returns `[n, T, dim]`.
    fn lookup(&self, w: &[f64], dw: Option<(&[f64], &[f64])>, x: &[f64]) -> Vec<f64> {
        let d = self.dim;
        let mut y = Vec::with_capacity(x.len() * d);
        for (r, &v) in x.iter().enumerate() {
            let tok = self.token(v);
            let row = &w[tok * d..(tok + 1) * d];
            match dw {
                Some((dw, t)) if t[r / self.t] != 0.0 => {
                    let ts = t[r / self.t];
                    y.extend(row.iter().zip(&dw[tok * d..(tok + 1) * d]).map(|(a, b)| self.scale * (a + ts * b)));
                }
                _ => y.extend(row.iter().map(|a| self.scale * a)),
            }
        }
        y
    }

    /// Adds the position embedding `p + t_s·Δp` (`Δp` when `dp` is given) to every sample's rows.
    ///
    /// # Shapes
    /// `p`, `dp` `[T, dim]`, `y` `[n, T, dim]`.
    fn add_positions(&self, y: &mut [f64], p: &[f64], dp: Option<(&[f64], &[f64])>) {
        for (s, ys) in y.chunks_exact_mut(self.t * self.dim).enumerate() {
            ys.iter_mut().zip(p).for_each(|(a, b)| *a += b);
            if let Some((dp, t)) = dp {
                if t[s] != 0.0 {
                    ys.iter_mut().zip(dp).for_each(|(a, b)| *a += t[s] * b);
                }
            }
        }
    }

    /// The output at `at`: `scale · w(t_s)[x_t] (+ p(t_s)[t])`.
    fn apply(&self, first: usize, at: &At, x: &[f64]) -> Vec<f64> {
        let mut y = self.lookup(at.w(first), at.offset(first), x);
        if self.positions {
            self.add_positions(&mut y, at.w(first + 1), at.offset(first + 1));
        }
        y
    }
}

impl Layer for Embedding {
    /// `Embedding(vocab, dim)`, or `scripts/torch_model.py`'s `ScaledEmbedding(vocab, dim,
    /// scale=…)` when the scale is not 1.
    fn torch(&self) -> String {
        match (self.scale == 1.0, self.positions) {
            (true, false) => format!("Embedding({}, {})", self.vocab, self.dim),
            (_, false) => format!("ScaledEmbedding({}, {}, scale={})", self.vocab, self.dim, self.scale),
            (_, true) => format!("ScaledEmbedding({}, {}, scale={}, positions={})", self.vocab, self.dim, self.scale, self.t),
        }
    }

    fn tensors(&self) -> Vec<(&'static str, Vec<usize>)> {
        let mut v = vec![("weight", vec![self.vocab, self.dim])];
        if self.positions {
            v.push(("position", vec![self.t, self.dim]));
        }
        v
    }

    fn init(&self, rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) {
        data.push((0..self.vocab * self.dim).map(|_| StandardNormal.sample(rng)).collect());
        if self.positions {
            data.push((0..self.t * self.dim).map(|_| StandardNormal.sample(rng)).collect());
        }
    }

    fn linear_in_params(&self) -> bool {
        true
    }

    fn forward(&self, first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let y = self.apply(first, at, &x);
        (y, if keep { Cache::Input(x) } else { Cache::None })
    }

    /// `ẏ = scale · Δw[x_t] (+ Δp[t])` (token ids have no tangent).
    fn tangent(&self, first: usize, at: &At, x: Vec<f64>, _xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        let y = self.apply(first, at, &x);
        let yd = at.dw(first).map(|dw| {
            let mut yd = self.lookup(dw, None, &x);
            if let Some(dp) = at.dw(first + 1).filter(|_| self.positions) {
                self.add_positions(&mut yd, dp, None);
            }
            yd
        });
        (y, yd)
    }

    /// `∂f^k/∂w[v] = scale · Σ_{t: x_t = v} dy[k, t]`, `∂f^k/∂p[t] = dy[k, t]`; token ids have
    /// no cotangent (zeros).
    fn backward(&self, first: usize, _at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Input(x) = cache else { unreachable!("an embedding's cache is its token ids") };
        let (d, t) = (self.dim, self.t);
        let n = x.len() / t;
        let width = (self.vocab + if self.positions { t } else { 0 }) * d;
        let mut g = vec![0.0; n * k * width];
        for s in 0..n {
            for c in 0..k {
                let out = &mut g[(s * k + c) * width..(s * k + c + 1) * width];
                let dys = &dy[(s * k + c) * t * d..(s * k + c + 1) * t * d];
                for (pos, &v) in x[s * t..(s + 1) * t].iter().enumerate() {
                    let tok = self.token(v);
                    out[tok * d..(tok + 1) * d].iter_mut().zip(&dys[pos * d..(pos + 1) * d]).for_each(|(a, b)| *a += self.scale * b);
                }
                if self.positions {
                    out[self.vocab * d..].copy_from_slice(dys);
                }
            }
        }
        grads.push((first, Grad::Formed { g, width }));
        if want_dx {
            vec![0.0; n * k * t]
        } else {
            Vec::new()
        }
    }

    /// The input is constant in t (degree 0): `scale · (w + tΔw)[x_t] (+ (p + tΔp)[t])`, degree 1.
    fn sweep(&self, first: usize, w: &[Vec<f64>], dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        let x = &p.c[..p.size];
        let size = x.len() * self.dim;
        let mut c0 = self.lookup(&w[first], None, x);
        let mut c1 = self.lookup(&dw[first], None, x);
        if self.positions {
            self.add_positions(&mut c0, &w[first + 1], None);
            self.add_positions(&mut c1, &dw[first + 1], None);
        }
        c0.extend(c1);
        debug_assert_eq!(c0.len(), 2 * size);
        Some(Poly { c: c0, size })
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, first: usize, p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        // The token ids carry the tape (they are the traced input); it moves to the weight, the
        // only thing here with a gradient.
        let (ids, tape) = flat(x).split_tape();
        let n = ids.shape().0;
        let idx: Vec<usize> = ids.as_vec().into_iter().map(|v| self.token(v)).collect();
        let idx = ids.device().tensor_from_vec(idx, (n, self.t));
        let w = p[first].r2().clone().put_tape(tape);
        let y: Tensor<(usize, usize, usize), f64, D, T> = w.gather(idx);
        let y = y * self.scale;
        if !self.positions {
            return Activations::Seq(y);
        }
        let shape = *y.shape();
        Activations::Seq(y + p[first + 1].r2().clone().broadcast_like::<(usize, usize, usize), Axis<0>>(&shape))
    }

    /// With positions, the sequence length (`ScaledEmbedding(…, positions=T)`).
    fn torch_input(&self) -> Option<(&'static str, usize)> {
        self.positions.then_some(("positions", self.t))
    }

    fn gradient_floats(&self, k: u64) -> u64 {
        k * ((self.vocab + if self.positions { self.t } else { 0 }) * self.dim) as u64
    }
}

/// `{ embedding = { vocab, dim, scale, positions } }`: `Embedding(vocab, dim)` on token ids, its
/// output times `scale` (a number, or `"sqrt_dim"` for √dim; default 1), plus a learned position
/// embedding when `positions` (default false).
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingSpec {
    /// Vocabulary size (token ids `0..vocab`).
    pub vocab: usize,
    /// Output features per token.
    pub dim: usize,
    /// The output's constant factor.
    pub scale: f64,
    /// A learned position embedding added.
    pub positions: bool,
}

impl KindSpec for EmbeddingSpec {
    const NAMES: &'static [&'static str] = &["embedding"];
    const TORCH: &'static [&'static str] = &["Embedding", "ScaledEmbedding"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let a = need(arg, at, name)?;
        let m = options(a, at, name, &["vocab", "dim", "scale", "positions"])?;
        let vocab = as_size(m.get("vocab").ok_or_else(|| err(at, "embedding needs `vocab`"))?, at, "embedding.vocab")?;
        let dim = as_size(m.get("dim").ok_or_else(|| err(at, "embedding needs `dim`"))?, at, "embedding.dim")?;
        let scale = match m.get("scale") {
            None => 1.0,
            Some(Value::String(s)) if s == "sqrt_dim" => (dim as f64).sqrt(),
            Some(v) => v.as_f64().filter(|s| s.is_finite() && *s != 0.0).ok_or_else(|| err(at, format!("embedding.scale must be a finite non-zero number or \"sqrt_dim\", got {v}")))?,
        };
        let positions = m.get("positions").map_or(Ok(false), |b| as_bool(b, at, "embedding.positions"))?;
        Ok(EmbeddingSpec { vocab, dim, scale, positions })
    }

    fn to_value(&self) -> Value {
        json!({ "embedding": { "vocab": self.vocab, "dim": self.dim, "scale": self.scale, "positions": self.positions } })
    }

    fn label(&self) -> String {
        format!("embedding({}, {})", self.vocab, self.dim)
    }

    fn from_torch(class: &str, m: &Value, at: &str) -> Result<Self, String> {
        for key in ["padding_idx", "max_norm"] {
            if m.get(key).is_some_and(|v| !v.is_null()) {
                return Err(refuse(at, m, format!("an Embedding with `{key}` is not supported")));
            }
        }
        let scale = if class == "ScaledEmbedding" { number(m, "scale", at)? } else { 1.0 };
        if !(scale.is_finite() && scale != 0.0) {
            return Err(refuse(at, m, format!("scale = {scale}: it must be finite and non-zero")));
        }
        let positions = m.get("positions").is_some_and(|v| !v.is_null());
        Ok(EmbeddingSpec { vocab: uint(m, "num_embeddings", at)?, dim: uint(m, "embedding_dim", at)?, scale, positions })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let Shape::Tokens(t, vocab) = input else {
            return Err(format!("{at} {}: needs token ids (the first layer on token data, e.g. data.kind = \"modular\"), got {input}", self.label()));
        };
        if vocab > self.vocab {
            return Err(format!("{at} {}: the data's tokens range over 0..{vocab}, more than its vocabulary of {}", self.label(), self.vocab));
        }
        Ok((AnyLayer::Embedding(Embedding { vocab: self.vocab, dim: self.dim, scale: self.scale, t, positions: self.positions }), Shape::Seq(t, self.dim)))
    }
}
