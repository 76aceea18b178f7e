//! A layer stack on one training step `w_s(t) = w_s + t·Δw`: the network's values, their
//! t-derivative (forward mode) and per-sample gradients at any points and times — a block of
//! rows goes through each layer together, each row at its own t ([`At`]: `W_s` and `ΔW`
//! products combined by t, no weight copy per row) — and the kinks along t (see
//! [`super::kinks`]).

use crate::error::{Error, Result};
use crate::model::layers::{At, Grad, Stack};
use crate::model::{Architecture, OutputKind, Params};

/// Rows evaluated at once (bounds a batch's caches: a LeNet-5 row holds ~60 000 numbers, and
/// its K = 10 cotangents 47 040 at the first max-pool: 12 MiB per 32 rows, below glibc's 32 MiB
/// mmap threshold, so that the buffers are reused instead of mapped and zero-faulted anew).
pub(crate) const EVAL_CHUNK: usize = 32;

/// One step of a layer stack.
pub(crate) struct StackStep<'a> {
    pub(crate) arch: &'a Architecture,
    pub(crate) stack: Stack,
    pub(crate) state: &'a Params,
    /// `Δw = w_{s+1} − w_s` (absent at t = 0 only).
    pub(crate) dir: Option<Vec<Vec<f64>>>,
    pub(crate) k: usize,
    pub(crate) d: usize,
    /// The node evaluations on a device backend ([`StackStep::on_device`]); `None`: here.
    pub(crate) nodes: Option<Box<dyn crate::device::StepNodes>>,
    /// The first error of a device evaluation (the rows were then computed here, and the step
    /// fails at [`StackStep::device_result`]).
    device_error: std::sync::Mutex<Option<Error>>,
}

/// One parameter layer's gradients for a set of rows, in row order.
pub(crate) enum RowGrad {
    /// `acts` with the bias column `[R, ne]`, `deltas` `[R, K, out]`.
    Factor { acts: Vec<f64>, deltas: Vec<f64>, ne: usize, out: usize },
    /// `[R, K, width]`.
    Formed { g: Vec<f64>, width: usize },
}

impl<'a> StackStep<'a> {
    pub(crate) fn new(arch: &'a Architecture, state: &'a Params, next: Option<&Params>) -> Result<Self> {
        let stack = arch.stack()?;
        let dir = match next {
            Some(n) => {
                if n.specs != state.specs {
                    return Err(Error::Data("consecutive states with different parameters".into()));
                }
                Some(state.data.iter().zip(&n.data).map(|(a, b)| a.iter().zip(b).map(|(x, y)| y - x).collect()).collect())
            }
            None => None,
        };
        Ok(StackStep { arch, k: arch.outputs(), d: arch.input_dim(), stack, state, dir, nodes: None, device_error: Default::default() })
    }

    /// The step with its gradient evaluations on `backend` (the stack lowered by
    /// [`Architecture::device_program`], the step's weights uploaded once). Forward-mode
    /// evaluations (the node search) and the kink sweep stay here.
    pub(crate) fn on_device(mut self, backend: &dyn crate::device::NodeBackend) -> Result<Self> {
        let program = self.arch.device_program()?;
        self.nodes = Some(backend.step(&program, &self.state.data, self.dir.as_deref())?);
        Ok(self)
    }

    /// The first device error of the step, if any (its rows were computed here instead).
    pub(crate) fn device_result(&self) -> Result<()> {
        match self.device_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Rows per block of a gradient evaluation: the device's, else [`EVAL_CHUNK`].
    pub(crate) fn block_rows(&self) -> usize {
        self.nodes.as_ref().map_or(EVAL_CHUNK, |n| n.block_rows().max(1))
    }

    /// `w_s + t·Δw` (the tests' reference for the per-row points).
    #[cfg(test)]
    pub(crate) fn params_at(&self, t: f64) -> Vec<Vec<f64>> {
        match (&self.dir, t) {
            (Some(dir), t) if t != 0.0 => self.state.data.iter().zip(dir).map(|(a, b)| a.iter().zip(b).map(|(x, y)| x + t * y).collect()).collect(),
            _ => self.state.data.clone(),
        }
    }

    /// `f = out(α(g − off))` in place on raw outputs `g` `[R, K]`, and the sensitivities
    /// `∂f^k/∂g` `[R, K, K]` (log-softmax: `α(e_k − p)`, identity: `α e_k`). With `q` (`[R, K]`),
    /// a row's softmax `p` in the sensitivities is its row of `q` where that is not NaN (a
    /// reduced rule's stand-in, [`crate::kernel::quadrature::reduce`]).
    fn output_map(&self, g: &mut [f64], off: Option<&[f64]>, q: Option<&[f64]>) -> Vec<f64> {
        let (k, alpha) = (self.k, self.arch.alpha);
        self.map_rows(g, off);
        let rows = g.len() / k;
        let mut seeds = vec![0.0; rows * k * k];
        let mut p = vec![0.0; k];
        for r in 0..rows {
            let z = &g[r * k..(r + 1) * k];
            let s = &mut seeds[r * k * k..(r + 1) * k * k];
            if self.arch.output == OutputKind::LogSoftmax {
                // The softmax once per row (K exponentials, not K²).
                match q.map(|q| &q[r * k..(r + 1) * k]).filter(|q| !q[0].is_nan()) {
                    Some(q) => p.copy_from_slice(q),
                    None => p.iter_mut().zip(z).for_each(|(a, v)| *a = v.exp()),
                }
                for c in 0..k {
                    for o in 0..k {
                        s[c * k + o] = alpha * (f64::from(c == o) - p[o]);
                    }
                }
            } else {
                (0..k).for_each(|c| s[c * k + c] = alpha);
            }
        }
        seeds
    }

    /// `f = out(α(g − off))` in place on raw outputs `g` `[R, K]`.
    fn map_rows(&self, g: &mut [f64], off: Option<&[f64]>) {
        if let Some(off) = off {
            g.iter_mut().zip(off).for_each(|(a, b)| *a -= b);
        }
        g.iter_mut().for_each(|v| *v *= self.arch.alpha);
        if self.arch.output == OutputKind::LogSoftmax {
            crate::model::log_softmax_rows(g, self.k);
        }
    }

    /// Whether the output map has a softmax (log-softmax outputs).
    pub(crate) fn has_softmax(&self) -> bool {
        self.arch.output == OutputKind::LogSoftmax
    }

    /// The output map's softmax at rows of raw outputs `g` (`[R, K]`; `off` `[K]`, one point's
    /// offsets, for every row), as the sensitivities of [`StackStep::output_map`] take it;
    /// `None` for outputs without one.
    pub(crate) fn softmax_at(&self, g: &[f64], off: Option<&[f64]>) -> Option<Vec<f64>> {
        if !self.has_softmax() {
            return None;
        }
        let mut z = g.to_vec();
        if let Some(off) = off {
            z.chunks_exact_mut(self.k).for_each(|row| row.iter_mut().zip(off).for_each(|(a, b)| *a -= b));
        }
        self.map_rows(&mut z, None);
        z.iter_mut().for_each(|v| *v = v.exp());
        Some(z)
    }

    /// The inputs (and output offsets) of rows `idx`.
    fn gather(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize]) -> (Vec<f64>, Option<Vec<f64>>) {
        let (d, k) = (self.d, self.k);
        let xs: Vec<f64> = idx.iter().flat_map(|&i| x[i * d..(i + 1) * d].iter().copied()).collect();
        let os = off.map(|o| idx.iter().flat_map(|&i| o[i * k..(i + 1) * k].iter().copied()).collect());
        (xs, os)
    }

    /// The points of the step rows at times `t` run at.
    fn at<'s>(&'s self, t: &'s [f64]) -> At<'s> {
        At { w: &self.state.data, dw: self.dir.as_deref(), t: Some(t) }
    }

    /// `f` and `df/dt` at rows `idx` of `x` (`[·, d]`) and times `t`.
    ///
    /// # Shapes
    /// `off` `[·, K]`; returns `[R, K]` twice.
    pub(crate) fn jvp(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let k = self.k;
        let mut f = Vec::with_capacity(idx.len() * k);
        let mut fd = Vec::with_capacity(idx.len() * k);
        for (ib, tb) in idx.chunks(EVAL_CHUNK).zip(t.chunks(EVAL_CHUNK)) {
            let (xs, os) = self.gather(x, off, ib);
            let (g, gd) = self.stack.tangent_at(&self.at(tb), xs);
            let (a, b) = self.map_outputs(g, &gd, os.as_deref(), None);
            f.extend_from_slice(&a);
            fd.extend_from_slice(&b);
        }
        (f, fd)
    }

    /// `f` and `df/dt` from the raw outputs `g` and their t-derivatives `gd` through the output
    /// map (the forward mode's last step, and the node search's on the sweep's polynomials).
    ///
    /// # Shapes
    /// `g`, `gd`, `off` `[R, K]`; returns `[R, K]` twice.
    pub(crate) fn map_outputs(&self, mut g: Vec<f64>, gd: &[f64], off: Option<&[f64]>, q: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        let k = self.k;
        let seeds = self.output_map(&mut g, off, q);
        let mut fd = Vec::with_capacity(g.len());
        for r in 0..g.len() / k {
            for c in 0..k {
                fd.push((0..k).map(|o| seeds[(r * k + c) * k + o] * gd[r * k + o]).sum());
            }
        }
        (g, fd)
    }

    /// [`StackStep::jvp`] in blocks of [`EVAL_CHUNK`] rows on every core (the node search of
    /// few row points: one point's thousands of search rows, each at its own time).
    pub(crate) fn par_jvp(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> (Vec<f64>, Vec<f64>) {
        use rayon::prelude::*;
        let parts: Vec<(Vec<f64>, Vec<f64>)> = idx.par_chunks(EVAL_CHUNK).zip(t.par_chunks(EVAL_CHUNK)).map(|(i, tt)| self.jvp(x, off, i, tt)).collect();
        let (mut f, mut fd) = (Vec::with_capacity(idx.len() * self.k), Vec::with_capacity(idx.len() * self.k));
        for (a, b) in parts {
            f.extend_from_slice(&a);
            fd.extend_from_slice(&b);
        }
        (f, fd)
    }

    /// `(z, dz/dt)` at the inputs of the piecewise-linear activations for the point `xp`
    /// (`[d]`) at time `t` (empty at t = 0 only steps).
    fn kink_inputs(&self, xp: &[f64], t: f64) -> Vec<(f64, f64)> {
        match &self.dir {
            Some(_) => self.stack.kink_inputs(&self.at(&[t]), xp),
            None => Vec::new(),
        }
    }

    /// A kink of the point `xp` in `(a, b)` that the polynomial sweep cannot reach (a ReLU
    /// behind a smooth layer): of the activation inputs whose sign differs at `a` and `b`, the
    /// one whose secant root is earliest, refined by Newton's method on its `(z, dz/dt)`,
    /// safeguarded by bisection of its sign bracket, to rounding. Returns the time (`None`
    /// when no input changes sign between `a` and `b`) and the forward-mode evaluations spent.
    pub(crate) fn locate_kink(&self, xp: &[f64], a: f64, b: f64) -> (Option<f64>, usize) {
        let (za, zb) = (self.kink_inputs(xp, a), self.kink_inputs(xp, b));
        let mut evals = 2;
        // An input that changes sign within a hair of an endpoint is a kink already split at
        // (the sweep's 1e-9): following it again would only shave that endpoint, piece after
        // piece, and never reach the kink that made the piece fail; bisection finds that one.
        let hair = 1e-9 * (b - a);
        let mut best: Option<(usize, f64)> = None;
        for (u, (&(fa, _), &(fb, _))) in za.iter().zip(&zb).enumerate() {
            if (fa < 0.0 && fb > 0.0) || (fa > 0.0 && fb < 0.0) {
                let t = a + (b - a) * fa / (fa - fb);
                if t - a > hair && b - t > hair && best.is_none_or(|(_, bt)| t < bt) {
                    best = Some((u, t));
                }
            }
        }
        let Some((u, mut t)) = best else { return (None, evals) };
        let (mut lo, mut hi, neg_at_lo) = (a, b, za[u].0 < 0.0);
        for _ in 0..60 {
            let (f, fd) = self.kink_inputs(xp, t)[u];
            evals += 1;
            if f == 0.0 {
                break;
            }
            if (f < 0.0) == neg_at_lo {
                lo = t;
            } else {
                hi = t;
            }
            let newton = t - f / fd;
            let next = if newton > lo && newton < hi { newton } else { 0.5 * (lo + hi) };
            let done = (next - t).abs() <= 2.0 * f64::EPSILON * t.abs() || hi - lo <= 2.0 * f64::EPSILON * hi.abs();
            t = next;
            if done {
                break;
            }
        }
        ((t - a > hair && b - t > hair).then_some(t), evals)
    }

    /// [`StackStep::grads`] in blocks of [`EVAL_CHUNK`] rows on every core, block by block (rows
    /// `EVAL_CHUNK·b..` in block b; not concatenated: the node rows are summed as they are).
    pub(crate) fn par_grads(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> Vec<Vec<RowGrad>> {
        use rayon::prelude::*;
        if self.nodes.is_some() {
            let b = self.block_rows();
            return idx.chunks(b).zip(t.chunks(b)).map(|(i, tt)| self.block_grads(x, off, i, tt)).collect();
        }
        idx.par_chunks(EVAL_CHUNK).zip(t.par_chunks(EVAL_CHUNK)).map(|(i, tt)| self.block_grads(x, off, i, tt)).collect()
    }

    /// [`StackStep::par_grads`] with the rows' stand-ins `q` (`[R, K]`) for their softmax in
    /// the output map's sensitivities ([`StackStep::output_map`]); here, not on a device.
    pub(crate) fn par_grads_q(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], q: Option<&[f64]>) -> Vec<Vec<RowGrad>> {
        use rayon::prelude::*;
        let Some(q) = q else { return self.par_grads(x, off, idx, t) };
        assert!(self.nodes.is_none(), "stand-ins for the softmax are evaluated here");
        idx.par_chunks(EVAL_CHUNK).zip(t.par_chunks(EVAL_CHUNK)).zip(q.par_chunks(EVAL_CHUNK * self.k)).map(|((i, tt), qq)| self.cpu_block_grads(x, off, i, tt, Some(qq))).collect()
    }

    /// [`StackStep::par_grads`] on the device with each formed layer's rows summed there, times
    /// their weights `w`, over each run of equal points of each block of [`StackStep::block_rows`]
    /// rows (`crate::device::runs`): a part's `RowGrad::Formed` then holds `[runs, K, width]`, the
    /// dense layers' factors stay per row; with `self_kernel`, each formed layer's `Σ w g gᵀ` per
    /// run (`[runs, K, K]`, `None` for the dense layers). `None` without a device, or after a
    /// device error (the caller then takes [`StackStep::par_grads`]; the step fails at
    /// [`StackStep::device_result`]).
    #[allow(clippy::type_complexity)]
    pub(crate) fn par_grads_weighted(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], w: &[f64], self_kernel: bool) -> Option<Vec<(Vec<RowGrad>, Vec<Option<Vec<f64>>>)>> {
        let nodes = self.nodes.as_ref()?;
        let b = self.block_rows();
        let mut parts = Vec::with_capacity(idx.len().div_ceil(b));
        for ((i, tt), ww) in idx.chunks(b).zip(t.chunks(b)).zip(w.chunks(b)) {
            match nodes.block_grads(x, off, i, tt, Some(ww), self_kernel) {
                Ok(g) => parts.push(g.into_iter().map(row_grad).unzip()),
                Err(e) => {
                    self.device_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                    return None;
                }
            }
        }
        Some(parts)
    }

    /// [`StackStep::par_grads`] into buffers from `take(capacity)` (a pool reused across steps:
    /// the training side of a LeNet-5 on 2 000 images is ~0.5 GB a step, and fresh buffers that
    /// size are mapped and zero-faulted by the kernel every time).
    pub(crate) fn par_grads_in(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], take: &mut dyn FnMut(usize) -> Vec<f64>) -> Vec<RowGrad> {
        let parts = self.par_grads(x, off, idx, t);
        let Some(first) = parts.first() else { return Vec::new() };
        // One allocation per layer for all rows (growing by doubling would map and fault the
        // training side's hundreds of MB several times per step).
        let mut out: Vec<RowGrad> = first
            .iter()
            .map(|g| match g {
                RowGrad::Factor { ne, out, .. } => RowGrad::Factor { acts: take(idx.len() * ne), deltas: take(idx.len() * self.k * out), ne: *ne, out: *out },
                RowGrad::Formed { width, .. } => RowGrad::Formed { g: take(idx.len() * self.k * width), width: *width },
            })
            .collect();
        for part in parts {
            for (dst, src) in out.iter_mut().zip(part) {
                match (dst, src) {
                    (RowGrad::Factor { acts, deltas, .. }, RowGrad::Factor { acts: a, deltas: d, .. }) => {
                        acts.extend_from_slice(&a);
                        deltas.extend_from_slice(&d);
                    }
                    (RowGrad::Formed { g, .. }, RowGrad::Formed { g: h, .. }) => g.extend_from_slice(&h),
                    _ => unreachable!("the same stack gives the same layer kinds"),
                }
            }
        }
        out
    }

    /// Per-sample gradients of `f` at rows `idx` and times `t`, one [`RowGrad`] per parameter
    /// layer (storage order), rows in `idx` order.
    pub(crate) fn grads(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> Vec<RowGrad> {
        self.grads_q(x, off, idx, t, None)
    }

    /// [`StackStep::grads`] with each row's stand-in for its softmax `q` (`[R, K]`, NaN rows:
    /// the row's own; as in [`StackStep::par_grads_q`]), on the CPU engine.
    pub(crate) fn grads_q(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], q: Option<&[f64]>) -> Vec<RowGrad> {
        let rows = self.block_rows();
        let block_grads = |ib: &[usize], tb: &[f64], b0: usize| match q {
            Some(q) => {
                assert!(self.nodes.is_none(), "stand-ins for the softmax are evaluated here");
                self.cpu_block_grads(x, off, ib, tb, Some(&q[b0 * self.k..(b0 + ib.len()) * self.k]))
            }
            None => self.block_grads(x, off, ib, tb),
        };
        if idx.len() <= rows {
            return block_grads(idx, t, 0);
        }
        let mut out: Vec<RowGrad> = Vec::new();
        for (bi, (ib, tb)) in idx.chunks(rows).zip(t.chunks(rows)).enumerate() {
            let block = block_grads(ib, tb, bi * rows);
            if out.is_empty() {
                let n = idx.len();
                out = block
                    .iter()
                    .map(|g| match g {
                        RowGrad::Factor { ne, out, .. } => RowGrad::Factor { acts: Vec::with_capacity(n * ne), deltas: Vec::with_capacity(n * self.k * out), ne: *ne, out: *out },
                        RowGrad::Formed { width, .. } => RowGrad::Formed { g: Vec::with_capacity(n * self.k * width), width: *width },
                    })
                    .collect();
            }
            for (src, dst) in block.into_iter().zip(out.iter_mut()) {
                match (src, dst) {
                    (RowGrad::Factor { acts, deltas, .. }, RowGrad::Factor { acts: da, deltas: dd, .. }) => {
                        da.extend_from_slice(&acts);
                        dd.extend_from_slice(&deltas);
                    }
                    (RowGrad::Formed { g, .. }, RowGrad::Formed { g: dg, .. }) => dg.extend_from_slice(&g),
                    _ => unreachable!("the same stack gives the same layer kinds"),
                }
            }
        }
        out
    }

    /// [`StackStep::grads`] of one block of at most [`StackStep::block_rows`] rows: on the device
    /// when the step has one, else here ([`StackStep::cpu_block_grads`]).
    pub(crate) fn block_grads(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> Vec<RowGrad> {
        if let Some(nodes) = &self.nodes {
            match nodes.block_grads(x, off, idx, t, None, false) {
                Ok(grads) => return grads.into_iter().map(|g| row_grad(g).0).collect(),
                Err(e) => {
                    self.device_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                }
            }
        }
        self.cpu_block_grads(x, off, idx, t, None)
    }

    /// [`StackStep::block_grads`] here (the CPU engine), the layers' buffers moved, not copied (a
    /// dense layer's acts get their bias column); `q` as in [`StackStep::par_grads_q`].
    pub(crate) fn cpu_block_grads(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], q: Option<&[f64]>) -> Vec<RowGrad> {
        let (xs, os) = self.gather(x, off, idx);
        let at = self.at(t);
        let (mut g, caches) = self.stack.forward_cached_at(&at, xs);
        let seeds = self.output_map(&mut g, os.as_deref(), q);
        drop(g);
        row_grads(self.stack.backward_at(&at, &caches, seeds, self.k))
    }

    /// The gradients of `Σ_k c[i, k] f^k(x_i)` (one cotangent per row instead of K) at rows
    /// `idx` at `w_s`, one [`RowGrad`] per parameter layer with `K = 1`: the cotangent is
    /// contracted into the output map's sensitivities before the backward pass, so it costs one
    /// backward pass per row where [`StackStep::grads`] costs K (what a data gradient
    /// `Σ_i ∂L/∂f(x_i)·∇f(x_i)` needs).
    ///
    /// # Shapes
    /// `c` `[R, K]` in `idx` order (`R = idx.len()`); each factor's rows are the R rows.
    pub(crate) fn contracted_grads(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], c: &[f64]) -> Vec<RowGrad> {
        let k = self.k;
        assert_eq!(c.len(), idx.len() * k, "one cotangent of K outputs per row");
        let (xs, os) = self.gather(x, off, idx);
        let t = vec![0.0; idx.len()];
        let at = self.at(&t);
        let (mut g, caches) = self.stack.forward_cached_at(&at, xs);
        let seeds = self.output_map(&mut g, os.as_deref(), None);
        drop(g);
        // dy[i, o] = Σ_k c[i, k] ∂f^k/∂g_o.
        let mut dy = vec![0.0; idx.len() * k];
        for (i, row) in dy.chunks_exact_mut(k).enumerate() {
            for kk in 0..k {
                let ci = c[i * k + kk];
                if ci != 0.0 {
                    row.iter_mut().zip(&seeds[(i * k + kk) * k..(i * k + kk + 1) * k]).for_each(|(a, b)| *a += ci * b);
                }
            }
        }
        row_grads(self.stack.backward_at(&at, &caches, dy, 1))
    }
}

/// A backward pass's per-layer gradients as [`RowGrad`]s (a dense layer's acts get their bias
/// column), the buffers moved, not copied.
fn row_grads(grads: Vec<(usize, Grad)>) -> Vec<RowGrad> {
    grads
        .into_iter()
        .map(|(_, gr)| match gr {
            Grad::Factor { acts, deltas, n_in, n_out, bias } => {
                let acts = if bias {
                    let mut a = Vec::with_capacity(acts.len() / n_in.max(1) * (n_in + 1));
                    for row in acts.chunks_exact(n_in) {
                        a.extend_from_slice(row);
                        a.push(1.0);
                    }
                    a
                } else {
                    acts
                };
                RowGrad::Factor { acts, deltas, ne: n_in + usize::from(bias), out: n_out }
            }
            Grad::Formed { g, width } => RowGrad::Formed { g, width },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::{RowGrad, StackStep};
    use crate::train::{train_to_dir, RunConfig, TrainOptions};
    use crate::trajectory::Run;

    /// One cotangent per row folded in before the backward pass gives, per row and layer, the
    /// K per-output gradients contracted with it afterwards (the slow obvious reference), to
    /// rounding: ExPLAIND's transformer block (embedding, shared-qkv attention, residual MLP).
    #[test]
    fn contracted_grads_are_the_per_output_grads_contracted() {
        let dir = tempfile::tempdir().unwrap();
        let toml = include_str!("../../../tests/data/transformer/modular-addition.toml").replace("steps = 12", "steps = 3");
        let cfg = RunConfig::from_toml(&toml, Path::new("test.toml")).unwrap();
        train_to_dir(&cfg, dir.path(), &TrainOptions { progress: false, force: false, base_dir: PathBuf::from("."), memory_budget: None }).unwrap();
        let run = Run::open(dir.path()).unwrap();
        let states = run.load_all().unwrap();
        let arch = &run.manifest.architecture;
        let x = &run.dataset.x_train;
        let st = StackStep::new(arch, &states[2], None).unwrap();
        let k = st.k;
        let idx: Vec<usize> = (0..x.len() / st.d).collect();
        let c: Vec<f64> = (0..idx.len() * k).map(|j| ((j * 7 + 3) as f64).sin()).collect();
        let full = st.grads(x, None, &idx, &vec![0.0; idx.len()]);
        let one = st.contracted_grads(x, None, &idx, &c);
        assert_eq!(full.len(), one.len());
        let mut worst: f64 = 0.0;
        let mut compared = 0;
        for (a, b) in full.iter().zip(&one) {
            match (a, b) {
                (RowGrad::Factor { acts, deltas, ne, out }, RowGrad::Factor { acts: a1, deltas: d1, ne: n1, out: o1 }) => {
                    assert_eq!((ne, out), (n1, o1));
                    assert_eq!(acts, a1, "the forward pass is the same");
                    for i in 0..idx.len() {
                        for o in 0..*out {
                            let want: f64 = (0..k).map(|kk| c[i * k + kk] * deltas[(i * k + kk) * out + o]).sum();
                            worst = worst.max((want - d1[i * out + o]).abs() / want.abs().max(1.0));
                            compared += 1;
                        }
                    }
                }
                (RowGrad::Formed { g, width }, RowGrad::Formed { g: g1, width: w1 }) => {
                    assert_eq!(width, w1);
                    for i in 0..idx.len() {
                        for j in 0..*width {
                            let want: f64 = (0..k).map(|kk| c[i * k + kk] * g[(i * k + kk) * width + j]).sum();
                            worst = worst.max((want - g1[i * width + j]).abs() / want.abs().max(1.0));
                            compared += 1;
                        }
                    }
                }
                _ => panic!("the same layer kinds"),
            }
        }
        assert!(compared > 1000, "{compared} entries compared");
        assert!(worst <= 1e-13, "contracted vs per-output gradients: {worst:e}");
    }
}

/// A device's gradients in the engine's form (a run-summed formed layer as a formed one, with
/// its runs' self-kernel terms; see [`StackStep::par_grads_weighted`]).
fn row_grad(g: crate::device::Downloaded) -> (RowGrad, Option<Vec<f64>>) {
    match g {
        crate::device::Downloaded::Factor { acts, deltas, ne, out } => (RowGrad::Factor { acts, deltas, ne, out }, None),
        crate::device::Downloaded::Formed { g, width } => (RowGrad::Formed { g, width }, None),
        crate::device::Downloaded::Summed { g, width, gram } => (RowGrad::Formed { g, width }, gram),
    }
}
