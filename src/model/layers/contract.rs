//! The layer contract: what every layer kind implements, in its own file.
//!
//! A layer kind is one type implementing [`Layer`] — its PyTorch printout, its parameter
//! tensors and their initialisation, its forward pass on a batch of rows **each at its own
//! point of a training step** (`w_s + t_r·Δw`, [`At`]), its tangent along the step, its
//! backward pass with K cotangents per row and the form of its per-sample parameter gradient
//! ([`Grad`]), its polynomial walk for the kink sweep ([`Poly`]) and its autodiff forward for
//! training — plus one line in the kind list of [`super`] (`layer_kinds!`), which generates the
//! dispatch. The walks over a stack (`super::forward_nodes` and the others) and the kernel
//! engine use only this trait.

use dfdx::prelude::{Device, Merge, NoneTape, Tape, Tensor};
use rand::RngCore;

use super::{Cache, Grad};
use crate::model::conv::Shape4;
use crate::model::param_spec::ParamSpec;
use crate::model::tensors::ParamTensor;

/// Activations between layers in the autodiff forward ([`Layer::autodiff`], `super::autodiff`):
/// a flat `[n, F]`, a map `[n, C, H, W]` or a sequence `[n, T, d]`.
pub(crate) enum Activations<D: Device<f64>, T> {
    /// `[n, F]`.
    Flat(Tensor<(usize, usize), f64, D, T>),
    /// `[n, C, H, W]`.
    Map(Tensor<Shape4, f64, D, T>),
    /// A sequence `[n, T, d]`.
    Seq(Tensor<(usize, usize, usize), f64, D, T>),
}

/// The parameters a batch of rows runs at: row r of the batch at `w + t_r·Δw` (per sample:
/// the K cotangent rows of a sample share its `t`).
///
/// # Shapes
/// `w`, `dw` in storage order (every tensor of the stack); `t` `[n]` for a batch of n samples.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    /// `w_s`.
    pub w: &'a [Vec<f64>],
    /// `Δw`: the step's direction (the tangent's, and the per-row offset's with `t`).
    pub dw: Option<&'a [Vec<f64>]>,
    /// Each sample's `t` (`None`: every row at `w`).
    pub t: Option<&'a [f64]>,
}

impl<'a> At<'a> {
    /// Every row at `w`.
    pub(crate) fn fixed(w: &'a [Vec<f64>]) -> At<'a> {
        At { w, dw: None, t: None }
    }

    /// Tensor `i` at `w_s`.
    pub(crate) fn w(&self, i: usize) -> &'a [f64] {
        &self.w[i]
    }

    /// Tensor `i` of the direction (`None` without one).
    pub(crate) fn dw(&self, i: usize) -> Option<&'a [f64]> {
        self.dw.map(|d| d[i].as_slice())
    }

    /// Tensor `i`'s step with each sample's `t`, when some `t` is not 0: `(Δw_i, t)`.
    pub(crate) fn offset(&self, i: usize) -> Option<(&'a [f64], &'a [f64])> {
        match (self.dw, self.t) {
            (Some(d), Some(t)) if t.iter().any(|&v| v != 0.0) => Some((d[i].as_slice(), t)),
            _ => None,
        }
    }

    /// Tensor `i` at sample `s`'s point, `w_i + t_s·Δw_i` (allocates; for per-sample loops
    /// over small tensors such as a layer norm's γ).
    pub(crate) fn at_sample(&self, i: usize, s: usize) -> std::borrow::Cow<'a, [f64]> {
        match self.offset(i) {
            Some((d, t)) if t[s] != 0.0 => self.w[i].iter().zip(d).map(|(a, b)| a + t[s] * b).collect::<Vec<f64>>().into(),
            _ => self.w[i].as_slice().into(),
        }
    }
}

/// Adds `t_s·y1` to `y0` for each sample s (`per` numbers per sample): the per-row combine of a
/// layer linear in its parameters, `y(w + tΔw) = y(w) + t·y(Δw)`.
pub(crate) fn add_scaled_rows(y0: &mut [f64], y1: &[f64], t: &[f64], per: usize) {
    for ((a, b), &ts) in y0.chunks_exact_mut(per).zip(y1.chunks_exact(per)).zip(t) {
        if ts != 0.0 {
            a.iter_mut().zip(b).for_each(|(u, v)| *u += ts * v);
        }
    }
}

/// The runs of equal consecutive samples of `x` (`per` numbers each): `(first sample, samples)`.
pub(crate) fn sample_runs(x: &[f64], per: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (s, row) in x.chunks_exact(per.max(1)).enumerate() {
        match runs.last_mut() {
            Some((s0, len)) if x[*s0 * per..(*s0 + 1) * per] == *row => *len += 1,
            _ => runs.push((s, 1)),
        }
    }
    runs
}

/// How a layer behaves along a step `w_s + tΔw` with its input a polynomial in t.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Along {
    /// Maps polynomials to polynomials with no kink (dense, conv, pooling by averaging,
    /// flatten).
    Polynomial,
    /// Piecewise linear: its kinks are roots of polynomials the sweep follows (ReLU, leaky ReLU,
    /// max pooling).
    Kinked,
    /// Smooth and not polynomial (tanh, GELU, layer norm, …): the sweep stops here, and kinks
    /// behind it are located by Newton's method on the probe.
    Smooth,
}

/// Coefficients of polynomials in t, `[deg + 1, size]` (coefficient j of unit u at `j·size + u`).
#[derive(Clone)]
pub(crate) struct Poly {
    pub c: Vec<f64>,
    pub size: usize,
}

impl Poly {
    pub(crate) fn deg(&self) -> usize {
        self.c.len() / self.size - 1
    }
    pub(crate) fn at(&self, u: usize, t: f64) -> f64 {
        (0..=self.deg()).rev().fold(0.0, |acc, j| acc * t + self.c[j * self.size + u])
    }
    pub(crate) fn add(mut self, other: &Poly) -> Poly {
        if other.c.len() > self.c.len() {
            self.c.resize(other.c.len(), 0.0);
        }
        self.c.iter_mut().zip(&other.c).for_each(|(a, b)| *a += b);
        self
    }

    /// `W(t)·p(t) + b(t)` for a layer whose map `lin(weights, X)` is linear in both (without
    /// bias); `b` is the bias and its step per output (`[out]` each).
    pub(crate) fn linear(&self, out: usize, lin: &dyn Fn(&[f64], &[f64]) -> Vec<f64>, w0: &[f64], dw: &[f64], b: Option<(&[f64], &[f64])>) -> Poly {
        let deg = self.deg();
        let a0 = lin(w0, &self.c);
        let a1 = lin(dw, &self.c);
        let mut c = vec![0.0; (deg + 2) * out];
        c[..(deg + 1) * out].iter_mut().zip(&a0).for_each(|(x, y)| *x += y);
        c[out..].iter_mut().zip(&a1).for_each(|(x, y)| *x += y);
        if let Some((b0, db)) = b {
            c[..out].iter_mut().zip(b0).for_each(|(x, y)| *x += y);
            c[out..2 * out].iter_mut().zip(db).for_each(|(x, y)| *x += y);
        }
        Poly { c, size: out }
    }
}

/// The kink sweep's state: where the pattern is read (`tm`) and the earliest root seen so far.
pub(crate) struct Sweep {
    pub tm: f64,
    pub next: f64,
}

impl Sweep {
    /// Records the first root of `Σ_j c_j t^j` in `(tm, next)`.
    pub(crate) fn roots(&mut self, c: &[f64]) {
        if self.may_have_root(c) {
            if let Some(&r) = crate::linalg::poly_roots_in(c, self.tm, self.next).first() {
                self.next = r;
            }
        }
    }

    /// Records the first root in `(tm, next)` of unit `u` of `p` minus unit `v` (`None`: unit
    /// `u` alone) — the ReLU's input, or a pool entry's difference to its window's winner —
    /// without allocating where no root can lie there.
    pub(crate) fn roots_of(&mut self, p: &Poly, u: usize, v: Option<usize>) {
        const STACK: usize = 16;
        let n = p.deg() + 1;
        let coef = |j: usize| p.c[j * p.size + u] - v.map_or(0.0, |v| p.c[j * p.size + v]);
        if n <= STACK {
            let mut buf = [0.0; STACK];
            buf.iter_mut().take(n).enumerate().for_each(|(j, b)| *b = coef(j));
            self.roots(&buf[..n]);
        } else {
            let buf: Vec<f64> = (0..n).map(coef).collect();
            self.roots(&buf);
        }
    }

    /// False only where `Σ_j c_j t^j` has no root in `[tm, next]` (`0 ≤ tm`): its value at
    /// `tm` exceeds what it can change by there, `Σ_{j≥1} |c_j| (next^j − tm^j)`, with a margin
    /// for rounding. Most units of a walk are settled by this bound alone.
    fn may_have_root(&self, c: &[f64]) -> bool {
        let (a, b) = (self.tm, self.next);
        if !(a >= 0.0 && b >= a) {
            return true;
        }
        let (mut value, mut reach) = (0.0, 0.0);
        let (mut pa, mut pb) = (1.0, 1.0);
        for (j, &cj) in c.iter().enumerate() {
            value += cj * pa;
            if j > 0 {
                reach += cj.abs() * (pb - pa);
            }
            pa *= a;
            pb *= b;
        }
        let size = c.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        !(value.abs() > reach * (1.0 + 1e-12) + 64.0 * f64::EPSILON * size)
    }
}

/// Probe pairs `(z, dz/dt)` whose sign changes are kinks (see `Stack::kink_inputs`).
pub(crate) type Probe<'p> = Option<&'p mut Vec<(f64, f64)>>;

/// What every layer kind implements. `first` is the index of the layer's first tensor in
/// storage order (its parameters are `w[first..first + count]`).
///
/// # Shapes
/// Per sample PyTorch's layout (`[C, H, W]` row-major, or `[F]`); a batch is `[n, ·]`, and
/// cotangents are `[n, K, ·]`.
pub(crate) trait Layer {
    /// The module as PyTorch prints it (`Linear(400, 120)`).
    fn torch(&self) -> String;

    /// Its parameter tensors, names relative to the layer (`weight`) and shapes, storage order.
    fn tensors(&self) -> Vec<(&'static str, Vec<usize>)> {
        Vec::new()
    }

    /// Its parameters' specs under `prefix` (a composite layer lists its children's).
    fn param_specs(&self, prefix: &str, out: &mut Vec<ParamSpec>) {
        out.extend(self.tensors().into_iter().map(|(name, shape)| ParamSpec { name: format!("{prefix}{name}"), shape }));
    }

    /// PyTorch's default initialisation of its tensors, pushed in storage order.
    fn init(&self, _rng: &mut dyn RngCore, _data: &mut Vec<Vec<f64>>) {}

    /// How it behaves along a step.
    fn along(&self) -> Along {
        Along::Polynomial
    }

    /// Whether every kink from here on can be found by the polynomial sweep, given whether a
    /// smooth layer came before (`smooth_seen`, updated).
    fn reach(&self, smooth_seen: &mut bool) -> bool {
        match self.along() {
            Along::Kinked => !*smooth_seen,
            Along::Smooth => {
                *smooth_seen = true;
                true
            }
            Along::Polynomial => true,
        }
    }

    /// Whether its output is linear in its own parameters (a scale α folds into them).
    fn linear_in_params(&self) -> bool {
        false
    }

    /// Forward pass at `at`; the returned [`Cache`] holds what the backward pass needs (only
    /// when `keep`).
    fn forward(&self, first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache);

    /// Value and tangent along `at.dw` (`xd` `None`: zero input tangent) at `at`; pushes
    /// `(z, dz/dt)` of its kink inputs to `probe` when it has any.
    fn tangent(&self, first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>);

    /// Backward pass from the output cotangents `dy` `[n, K, out]`: pushes its parameter
    /// gradient (with `first`) to `grads`, one per parameter layer as
    /// [`crate::model::param_spec::param_layers`] groups the names (the tensors sharing the prefix before the
    /// last dot: a weight and its bias; the kernel engine pairs them in order), each with the
    /// index of its first tensor; returns the input cotangents when `want_dx`.
    #[allow(clippy::too_many_arguments)]
    fn backward(&self, first: usize, at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64>;

    /// The parameter gradients from the sensitivities `dy` (`[n, K, O]`) of a max-pool right
    /// after it, whose winners `arg` (`[n, O]`, indices into this layer's output) say where
    /// each pooled sensitivity came from, where this layer's input sensitivities are not
    /// wanted; pushes them as [`Layer::backward`] does and returns `true`. The pool's scatter
    /// into a full-size, mostly zero cotangent is skipped (a convolution reads only the
    /// winners' patches). `false`: not offered; the caller scatters and calls `backward`.
    #[allow(clippy::too_many_arguments)]
    fn grads_behind_max_pool(&self, _first: usize, _cache: &Cache, _dy: &[f64], _arg: &[u32], _k: usize, _grads: &mut Vec<(usize, Grad)>) -> bool {
        false
    }

    /// A max-pool's winners, from its forward cache (`None` for every other layer).
    fn max_pool_winners<'a>(&self, _cache: &'a Cache) -> Option<&'a [u32]> {
        None
    }

    /// The polynomial walk of the kink sweep: its output as polynomials in t along
    /// `w + tΔw` with the pattern read at `sw.tm`, recording kinks in `sw`; `None` where the
    /// output is not polynomial ([`Along::Smooth`]).
    fn sweep(&self, first: usize, w: &[Vec<f64>], dw: &[Vec<f64>], p: Poly, sw: &mut Sweep) -> Option<Poly>;

    /// The autodiff forward (training, and the reference Jacobians).
    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, first: usize, p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T>;

    /// Floats of one sample's per-sample gradient in the kernel engine's form for `k` outputs.
    fn gradient_floats(&self, _k: u64) -> u64 {
        0
    }

    /// Floats one sample occupies in its forward pass besides its output (patches).
    fn scratch_floats(&self) -> u64 {
        0
    }

    /// The PyTorch argument that names its input size and that size (`("in_features", 400)`),
    /// checked against an imported module.
    fn torch_input(&self) -> Option<(&'static str, usize)> {
        None
    }

    /// Whether a recorded PyTorch module (its JSON description) is this layer as a residual
    /// shortcut (a projection with a bias).
    fn is_recorded_projection(&self, _m: &serde_json::Value) -> bool {
        false
    }

    /// A composite's branches: the body and the shortcut (`None` for a plain layer).
    fn branches(&self) -> Option<(&[super::Node], Option<&super::Node>)> {
        None
    }

    /// Whether it is a dense layer with a bias (last-layer Laplace's requirement).
    fn is_dense_with_bias(&self) -> bool {
        false
    }

    /// What it is on a backend's GEMMs and kernels (`crate::device`), `None` where the device
    /// program has no op for it yet.
    fn device(&self) -> Option<crate::device::program::Op> {
        None
    }
}

/// A layer kind's configuration as written ([`super::LayerSpec`] holds one of them): its
/// grammar in a layer list and in a PyTorch recording, and its resolution on an input shape.
pub(crate) trait KindSpec: Sized {
    /// The names it is written with in a layer list (`"dense"`, `"linear"`).
    const NAMES: &'static [&'static str];
    /// The PyTorch classes a recording names it by (`"Linear"`).
    const TORCH: &'static [&'static str];

    /// Parses `{ name = arg }` (or `"name"` without `arg`); `at` names the entry in errors.
    fn parse(name: &str, arg: Option<&serde_json::Value>, at: &str) -> Result<Self, String>;

    /// The canonical written form (what the run manifest records; `parse` reads it back).
    fn to_value(&self) -> serde_json::Value;

    /// A short label (`conv2d(6, k5, s1, p2)`) for tables and messages.
    fn label(&self) -> String;

    /// Reads a recorded module of class `class` (one of [`KindSpec::TORCH`]), or says in one
    /// line why it cannot be this kind.
    fn from_torch(class: &str, m: &serde_json::Value, at: &str) -> Result<Self, String>;

    /// The layer on `input` and its output shape; a composite resolves its children and
    /// counts their tensors in `tensors` itself, a plain layer leaves `tensors` alone.
    fn resolve(&self, input: super::Shape, at: &str, prefix: &str, tensors: &mut usize) -> Result<(super::AnyLayer, super::Shape), String>;
}
