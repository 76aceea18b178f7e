//! Path-kernel attributions of a recorded run: the EPK's and the DPK's (TracIn's) per-training-
//! point terms of the correct class's log-probability, through the kernel engine
//! ([`kernel::compute`], [`machine_contributions`]: what the front door's `Gram::contributions`
//! returns), with the exactness check; and the train-side path Gram of those scalar outputs on
//! the factored gradients (the fast path, tested against the front door's DPK Gram).
//!
//! With log-softmax outputs and mean cross-entropy, `a_i = (ε/M) e_{y_i}` is the same at every
//! step, so `τ(x, i) = (ε/M) G(x, x_i)[y_x, y_i]` with `G = Σ_s K_s`: the EPK's `K_s` integrates
//! the test side along step `s`, the DPK's takes it at the step's start (TracIn with every
//! checkpoint).

use crate::error::{Error, Result};
use crate::kernel::{self, KernelKind, Layout, Points, Request};
use crate::model::Params;
use crate::trajectory::Run;

use super::contributions::{baseline, machine_contributions, require_path_machine};
use super::grads::{directions, Direction, ScalarGrads};
use super::mlp::Mlp1;

/// Attributions and scalar kernel rows of a path kernel at some inputs.
///
/// # Shapes
/// `tau`, `kernel` `[P, M]`; `self_kernel` `[P]` when asked for (row `p` is training point `p`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PathRows {
    /// `τ(x_p, i) = c[p, i, y_p]`, the kernel machine's term of training point `i`.
    pub tau: Vec<f64>,
    /// `G(x_p, x_i)[y_p, y_i]`, the scalar kernel of the log-probabilities (no `ε/M`).
    pub kernel: Vec<f64>,
    /// `max_p |b(x_p) + Σ_i τ(x_p, i) − f^{y_p}(x_p)|`: zero to rounding for the EPK.
    pub max_residual: f64,
    /// `max_p |f^{y_p}(x_p)|`, the scale of that residual.
    pub max_output: f64,
    /// Seconds the computation took.
    pub seconds: f64,
}

/// [`PathRows`] of `kind` (EPK or DPK, on the network's log-softmax outputs, full layout) of the
/// run with states `states` at inputs `x` with labels `labels`, `chunk` rows at a time (the full
/// layout holds `chunk·M·K²` numbers).
///
/// # Shapes
/// `x [P, d]`, `labels [P]`.
///
/// Errors: a kind whose machine is not the path's (NTK, path), and every error of the kernel engine.
pub fn path_rows(run: &Run, states: &[Params], kind: KernelKind, x: &[f64], labels: &[usize], chunk: usize, progress: &dyn Fn(usize, usize)) -> Result<PathRows> {
    let ds = &run.dataset;
    let (d, m) = (ds.dim, ds.n_train());
    let train_labels = ds.train_labels()?;
    let p = labels.len();
    if x.len() != p * d {
        return Err(Error::ShapeMismatch { what: "path_rows: inputs".into(), expected: vec![p, d], got: vec![x.len()] });
    }
    let t = std::time::Instant::now();
    let mut out = PathRows { tau: Vec::with_capacity(p * m), kernel: Vec::with_capacity(p * m), max_residual: 0.0, max_output: 0.0, seconds: 0.0 };
    let mut start = 0;
    while start < p {
        let end = (start + chunk.max(1)).min(p);
        let rows = Points { x: x[start * d..end * d].to_vec(), dim: d };
        let g = kernel::compute(run, states, &rows, &Request::new(kind).layout(Layout::Full), &|_, _| {})?;
        let k = g.k;
        require_path_machine(g.kind)?;
        let c = machine_contributions(&g)?;
        let base = baseline(&g);
        let f = |r: usize, y: usize| g.network[r * k + y];
        for (r, &y) in labels[start..end].iter().enumerate() {
            let row: Vec<f64> = (0..m).map(|i| c[(r * m + i) * k + y]).collect();
            let res = base[r * k + y] + row.iter().sum::<f64>() - f(r, y);
            out.max_residual = out.max_residual.max(res.abs());
            out.max_output = out.max_output.max(f(r, y).abs());
            out.tau.extend(row);
            for (i, &yi) in train_labels.iter().enumerate() {
                // The pair's `K × K` block of the full layout `[P, M, K, K]`, entry (y, y_i).
                out.kernel.push(g.gram[((r * m + i) * k + y) * k + yi]);
            }
        }
        progress(end, p);
        start = end;
    }
    out.seconds = t.elapsed().as_secs_f64();
    Ok(out)
}

/// The DPK (TracIn) between row points and the training points on factored gradients:
/// `G(x_p, x_i) = Σ_{s<N} ⟨∇ log p_{y_p}(x_p; w_s), ∇ log p_{y_i}(x_i; w_s)⟩` `[P, M]` (what
/// [`path_rows`] with [`KernelKind::Dpk`] returns as `kernel`, at a fraction of its cost: the front
/// door's full layout contracts every `K × K` block) and `τ = (ε/M) G`, with the residual of
/// `b + Σ_i τ` against `log p_y` (the DPK is not an exact machine).
///
/// # Shapes
/// `x [P, d]`, `labels [P]`.
///
/// Errors: a run whose architecture the fast path does not cover ([`Mlp1::check_architecture`]).
pub fn dpk_rows_fast(run: &Run, states: &[Params], x: &[f64], labels: &[usize]) -> Result<PathRows> {
    let t = std::time::Instant::now();
    let arch = &run.manifest.architecture;
    let ds = &run.dataset;
    let (xt, yt) = (&ds.x_train, ds.train_labels()?);
    let m = yt.len();
    let kernel = dpk_kernel(arch, states, (x, labels), (xt, yt))?;
    let lr = run.manifest.learning_rates.first().copied().unwrap_or(0.0);
    let tau: Vec<f64> = kernel.iter().map(|g| lr / m as f64 * g).collect();
    let k = ds.num_outputs;
    let (f0, fnn) = (Mlp1::from_params(arch, &states[0])?.forward(x), Mlp1::from_params(arch, states.last().expect("states"))?.forward(x));
    let mut out = PathRows { tau, kernel, max_residual: 0.0, max_output: 0.0, seconds: 0.0 };
    for (r, &y) in labels.iter().enumerate() {
        let res = f0.logp[r * k + y] + out.tau[r * m..(r + 1) * m].iter().sum::<f64>() - fnn.logp[r * k + y];
        out.max_residual = out.max_residual.max(res.abs());
        out.max_output = out.max_output.max(fnn.logp[r * k + y].abs());
    }
    out.seconds = t.elapsed().as_secs_f64();
    Ok(out)
}

/// The DPK of the log-probabilities between row points and column points over the steps of
/// `states` (`w_a … w_b`: the steps `a … b − 1`), on factored gradients:
/// `Σ_s ⟨∇ log p_{y_p}(x_p; w_s), ∇ log p_{y_i}(x_i; w_s)⟩`. A suffix of a run's states gives
/// the path kernel of the last steps only.
///
/// # Shapes
/// `x [P, d]`, `labels [P]`, `xc [M, d]`, `yc [M]` → `[P, M]`.
///
/// Errors: an architecture the fast path does not cover ([`Mlp1::check_architecture`]).
pub fn dpk_kernel(arch: &crate::model::Architecture, states: &[Params], (x, labels): (&[f64], &[usize]), (xc, yc): (&[f64], &[usize])) -> Result<Vec<f64>> {
    let (p, m) = (labels.len(), yc.len());
    let d = x.len() / p.max(1);
    let mut xx = vec![0.0; p * m];
    crate::linalg::gemm(&mut xx, x, false, xc, true, (p, m, d), 1.0, false);
    let mut kernel = vec![0.0; p * m];
    for w in &states[..states.len().saturating_sub(1)] {
        let net = Mlp1::from_params(arch, w)?;
        let (fr, fc) = (net.forward(x), net.forward(xc));
        let gr = ScalarGrads::new(&net, x, &fr, directions(&fr.logp, labels, net.k, Direction::LogProb));
        let gc = ScalarGrads::new(&net, xc, &fc, directions(&fc.logp, yc, net.k, Direction::LogProb));
        let f = |i: usize, j: usize| xx[i * m + j];
        gr.gram_rows(&gc, Some(&f), &mut |i, row| kernel[i * m..(i + 1) * m].iter_mut().zip(row).for_each(|(a, v)| *a += v));
    }
    Ok(kernel)
}

/// The EPK's self-kernel `G(x_i, x_i)[y_i, y_i]` of the training points (test side: the row
/// integrated along each step, the column at the step's start), `chunk` rows at a time: the
/// noisy-label detector's self-attribution (times `ε/M`). Each chunk of training points is
/// computed against those points alone as columns (a column share of the class-diagonal layout),
/// since only the diagonal is read: `chunk²` instead of `chunk·M` pairs per step. # Shapes `[M]`.
///
/// Errors: every error of the kernel engine.
pub fn epk_self(run: &Run, states: &[Params], labels: &[usize], chunk: usize, progress: &dyn Fn(usize, usize)) -> Result<Vec<f64>> {
    let ds = &run.dataset;
    let (d, m) = (ds.dim, ds.n_train());
    if labels.len() != m {
        return Err(Error::ShapeMismatch { what: "epk_self: labels".into(), expected: vec![m], got: vec![labels.len()] });
    }
    let mut out = Vec::with_capacity(m);
    let mut start = 0;
    while start < m {
        let end = (start + chunk.max(1)).min(m);
        let rows = Points { x: ds.x_train[start * d..end * d].to_vec(), dim: d };
        let req = Request::new(KernelKind::Epk).layout(Layout::Diag).columns(Some((start, end)));
        let g = kernel::compute(run, states, &rows, &req, &|_, _| {})?;
        // Class-diagonal layout `[P, M', K]` over the share's M' = end − start columns.
        let (w, k) = (end - start, g.k);
        for r in 0..w {
            out.push(g.gram[(r * w + r) * k + labels[start + r]]);
        }
        progress(end, m);
        start = end;
    }
    Ok(out)
}

/// The train-side path Gram of the log-probabilities, `Σ_{s<N} ⟨∇ log p_{y_i}(x_i; w_s),
/// ∇ log p_{y_j}(x_j; w_s)⟩` (`[M, M]`, when `full`), and its diagonal (`[M]`), on factored
/// gradients: the EPK's train side, which is also the DPK's Gram on the training points.
///
/// # Shapes
/// `x [M, d]`, `labels [M]`; `states` `w_0 … w_N`.
pub fn path_gram(arch: &crate::model::Architecture, states: &[Params], x: &[f64], labels: &[usize], full: bool) -> Result<(Option<Vec<f64>>, Vec<f64>)> {
    let m = labels.len();
    let mut gram = if full { Some(vec![0.0; m * m]) } else { None };
    let mut diag = vec![0.0; m];
    let d = x.len() / m.max(1);
    let mut xx = vec![0.0; if full { m * m } else { 0 }];
    if full {
        crate::linalg::gemm(&mut xx, x, false, x, true, (m, m, d), 1.0, false);
    }
    for w in &states[..states.len().saturating_sub(1)] {
        let net = Mlp1::from_params(arch, w)?;
        let fwd = net.forward(x);
        let g = ScalarGrads::new(&net, x, &fwd, directions(&fwd.logp, labels, net.k, Direction::LogProb));
        if let Some(acc) = gram.as_mut() {
            let f = |i: usize, j: usize| xx[i * m + j];
            g.gram_rows(&g, Some(&f), &mut |i, row| acc[i * m..(i + 1) * m].iter_mut().zip(row).for_each(|(a, v)| *a += v));
        }
        diag.iter_mut().zip(g.sq_norms()).for_each(|(a, v)| *a += v);
    }
    Ok((gram, diag))
}
