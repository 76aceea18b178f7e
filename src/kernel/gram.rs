//! Gram assembly from structured per-layer factors, without Jacobians.
//!
//! For a dense layer `∇_W f^k(x) = δ[k] aᵀ` and `∇_b f^k(x) = δ[k]`. With row points p whose
//! test-side gradient is a weighted sum over quadrature nodes r (weights `w_r`) and training
//! points i (gradients at `w_s`), one step's Gram is
//! `K_s[p, i, k, k'] = Σ_l Σ_{r∈p} w_r (δ_{r,l}[k]·δ_{i,l}[k']) (a_{r,l}·a_{i,l} + [bias])`.
//!
//! - **Layer 0** sees the point itself (`a_{r,0} = x_p` for every node), so its term is
//!   `(x_p·x_i + 1)(δ̄_p[k]·δ_i[k'])` with `δ̄_p = Σ_r w_r δ_{r,0}`: the δ-products are summed
//!   over all steps with one accumulating GEMM per step, and multiplied by `x_p·x_i + 1` once.
//! - **Deeper layers** first form the t-averaged layer gradient
//!   `J̄[p, k, o, :] = Σ_{r∈p} w_r δ_r[k, o] [a_r, 1]` (only `P·K·out·(in+1)` numbers), then
//!   `T = J̄ · A_trainᵀ` (one GEMM) and `K[p, i, k, k'] += Σ_o T[(p,k,o), i] δ_i[k', o]`.
//!
//! Nothing of size `M·K·W` is ever formed. The accumulator keeps its matrix in the layout
//! `[(p, k), (i, k')]` and permutes to `[P, M, K, K]` at the end.

use rayon::prelude::*;

use super::linalg::{gemm_ab, gemm_abt};

/// One layer's factors for a set of rows.
pub struct LayerFactors<'a> {
    /// Input activations `[R, n_in]`.
    pub acts: &'a [f64],
    /// Sensitivities `[R, K, n_out]`.
    pub deltas: &'a [f64],
    /// Input width.
    pub n_in: usize,
    /// Output width.
    pub n_out: usize,
}

/// Scratch bytes allowed for one block of the deeper-layer contraction.
const BLOCK_BYTES: usize = 64 << 20;

/// Accumulates `Σ_s K_s` over steps.
pub struct GramAccumulator {
    p: usize,
    m: usize,
    k: usize,
    bias: bool,
    /// Deeper layers, layout `[(p, k), (i, k')]`.
    g: Vec<f64>,
    /// Layer-0 δ-products summed over steps, layout `[(p, k), (i, k')]`.
    d0: Vec<f64>,
    /// Scratch reused across steps (J̄ block and T block).
    scratch_j: Vec<f64>,
    scratch_t: Vec<f64>,
}

impl GramAccumulator {
    /// A zero accumulator for P row points, M training points and K outputs.
    pub fn new(p: usize, m: usize, k: usize, bias: bool) -> Self {
        GramAccumulator { p, m, k, bias, g: vec![0.0; p * k * m * k], d0: vec![0.0; p * k * m * k], scratch_j: Vec::new(), scratch_t: Vec::new() }
    }

    /// Adds one step. `layers[l]` pairs the rows' factors (per node, scattered to
    /// `point[r]` with `weight[r]`) with the training points' factors; `colw` (`[M, K]`)
    /// optionally scales every training gradient `∇f^{k'}(x_i)` (Chen's kernel).
    pub fn add_step(&mut self, layers: &[(LayerFactors<'_>, LayerFactors<'_>)], point: &[usize], weight: &[f64], colw: Option<&[f64]>) {
        let (p, m, k) = (self.p, self.m, self.k);
        let mk = m * k;
        for (l, (rows, train)) in layers.iter().enumerate() {
            let no = rows.n_out;
            // Training δ, optionally column-weighted: [(i, k'), o].
            let dtrain: std::borrow::Cow<'_, [f64]> = match colw {
                None => std::borrow::Cow::Borrowed(train.deltas),
                Some(cw) => {
                    let mut v = train.deltas.to_vec();
                    for (c, chunk) in v.chunks_mut(no).enumerate() {
                        let s = cw[c];
                        chunk.iter_mut().for_each(|x| *x *= s);
                    }
                    std::borrow::Cow::Owned(v)
                }
            };
            if l == 0 {
                let mut dbar = vec![0.0; p * k * no];
                for (r, (&pi, &w)) in point.iter().zip(weight).enumerate() {
                    let src = &rows.deltas[r * k * no..(r + 1) * k * no];
                    let dst = &mut dbar[pi * k * no..(pi + 1) * k * no];
                    for (a, b) in dst.iter_mut().zip(src) {
                        *a += w * b;
                    }
                }
                gemm_abt(&mut self.d0, &dbar, &dtrain, p * k, mk, no, 1.0, true);
            } else {
                self.add_formed(rows, train, &dtrain, point, weight);
            }
        }
    }

    fn add_formed(&mut self, rows: &LayerFactors<'_>, train: &LayerFactors<'_>, dtrain: &[f64], point: &[usize], weight: &[f64]) {
        let (p, m, k, bias) = (self.p, self.m, self.k, self.bias);
        let (ni, no) = (rows.n_in, rows.n_out);
        let ne = ni + usize::from(bias);
        let mk = m * k;
        let a_train = train_acts_ext(train, bias);
        let dt = deltas_by_output(dtrain, mk, no);
        // Rows of each point.
        let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); p];
        for (r, &pi) in point.iter().enumerate() {
            rows_of[pi].push(r);
        }
        let pb = (BLOCK_BYTES / 8 / (k * no * m).max(1)).clamp(1, p);
        let mut jbar = std::mem::take(&mut self.scratch_j);
        jbar.resize(pb * k * no * ne, 0.0);
        let mut t = std::mem::take(&mut self.scratch_t);
        for p0 in (0..p).step_by(pb) {
            let nb = pb.min(p - p0);
            let jb = &mut jbar[..nb * k * no * ne];
            jb.iter_mut().for_each(|v| *v = 0.0);
            for pl in 0..nb {
                for &r in &rows_of[p0 + pl] {
                    let w = weight[r];
                    let ar = &rows.acts[r * ni..(r + 1) * ni];
                    for kt in 0..k {
                        let dr = &rows.deltas[(r * k + kt) * no..(r * k + kt + 1) * no];
                        for o in 0..no {
                            let c = w * dr[o];
                            if c == 0.0 {
                                continue;
                            }
                            let base = ((pl * k + kt) * no + o) * ne;
                            let dst = &mut jb[base..base + ne];
                            for (d, a) in dst[..ni].iter_mut().zip(ar) {
                                *d += c * a;
                            }
                            if bias {
                                dst[ni] += c;
                            }
                        }
                    }
                }
            }
            contract_formed(&mut self.g[p0 * k * mk..(p0 + nb) * k * mk], jb, &a_train, &dt, nb * k, m, k, no, ne, &mut t);
        }
        self.scratch_j = jbar;
        self.scratch_t = t;
    }

    /// Finishes: adds the layer-0 term `(x_p·x_i + 1) ∘ D0` and permutes to `[P, M, K, K]`.
    ///
    /// # Shapes
    /// `x_rows` `[P, d]`, `x_train` `[M, d]`; returns `[P, M, K, K]`.
    pub fn finish(mut self, x_rows: &[f64], x_train: &[f64], d: usize) -> Vec<f64> {
        let (p, m, k) = (self.p, self.m, self.k);
        let mk = m * k;
        let mut aa = vec![0.0; p * m];
        gemm_abt(&mut aa, x_rows, x_train, p, m, d, 1.0, false);
        let b = if self.bias { 1.0 } else { 0.0 };
        let d0 = std::mem::take(&mut self.d0);
        let aa = &aa;
        self.g.par_chunks_mut(k * mk).zip(d0.par_chunks(k * mk)).enumerate().for_each(|(pi, (gp, dp))| {
            // Layer 0 term, then permute [(k, (i, k'))] -> [(i, k, k')] within this point.
            let mut tmp = vec![0.0; k * mk];
            for kt in 0..k {
                for i in 0..m {
                    let s = aa[pi * m + i] + b;
                    for ks in 0..k {
                        let src = kt * mk + i * k + ks;
                        tmp[(i * k + kt) * k + ks] = gp[src] + s * dp[src];
                    }
                }
            }
            gp.copy_from_slice(&tmp);
        });
        self.g
    }
}

/// Training activations with the bias column appended when the layer has one: `[M, in(+1)]`.
pub(super) fn train_acts_ext(train: &LayerFactors<'_>, bias: bool) -> Vec<f64> {
    let (m, ni) = (train.acts.len() / train.n_in.max(1), train.n_in);
    if bias {
        let mut v = Vec::with_capacity(m * (ni + 1));
        for i in 0..m {
            v.extend_from_slice(&train.acts[i * ni..(i + 1) * ni]);
            v.push(1.0);
        }
        v
    } else {
        train.acts.to_vec()
    }
}

/// Training sensitivities `[(i, k'), o]` transposed to `[o, (i, k')]`.
pub(super) fn deltas_by_output(dtrain: &[f64], mk: usize, no: usize) -> Vec<f64> {
    let mut dt = vec![0.0; no * mk];
    for c in 0..mk {
        for o in 0..no {
            dt[o * mk + c] = dtrain[c * no + o];
        }
    }
    dt
}

/// Contracts formed row-side layer gradients with the training points' factors:
/// `G[row, (i, k')] += Σ_o (J[(row, o), :]·[a_i, 1]) δ_i[k', o]`, as one GEMM
/// `T = J · A_extᵀ` and a vectorised pass over o.
///
/// # Shapes
/// `g` `[R, M·K]`, `j` `[R·no, ne]`, `a_ext` `[M, ne]`, `dt` `[no, M·K]`; `t` is scratch.
pub(super) fn contract_formed(g: &mut [f64], j: &[f64], a_ext: &[f64], dt: &[f64], r: usize, m: usize, k: usize, no: usize, ne: usize, t: &mut Vec<f64>) {
    let mk = m * k;
    t.resize(r * no * m, 0.0);
    let tb = &mut t[..r * no * m];
    gemm_abt(tb, j, a_ext, r * no, m, ne, 1.0, false);
    let tb = &*tb;
    g[..r * mk].par_chunks_mut(mk).enumerate().for_each_init(
        || vec![0.0; mk],
        |texp, (row, grow)| {
            for o in 0..no {
                let trow = &tb[(row * no + o) * m..(row * no + o + 1) * m];
                let drow = &dt[o * mk..(o + 1) * mk];
                // Expand t over k' so the update is one contiguous, vectorisable pass.
                for (chunk, &tv) in texp.chunks_exact_mut(k).zip(trow) {
                    chunk.iter_mut().for_each(|v| *v = tv);
                }
                for ((g, &tv), &dv) in grow.iter_mut().zip(texp.iter()).zip(drow) {
                    *g += tv * dv;
                }
            }
        },
    );
}

/// One step's kernel-machine prediction in factor form:
/// `Σ_i Σ_{k'} a[i, k'] K_s[p, i, k, k'] = ⟨∇̄f^k(x_p), v⟩` with `v = Σ_i Σ_{k'} a[i,k'] ∇f^{k'}(x_i)`
/// formed per layer as `V_l = Σ_i (Σ_{k'} a[i,k'] δ_{i,l}[k']) [a_{i,l}, 1]ᵀ` (`[out, in+1]`).
///
/// # Shapes
/// `a` `[M, K]`; returns `[P, K]`.
pub fn step_prediction(
    layers: &[(LayerFactors<'_>, LayerFactors<'_>)],
    point: &[usize],
    weight: &[f64],
    a: &[f64],
    p: usize,
    m: usize,
    k: usize,
    bias: bool,
) -> Vec<f64> {
    let mut pred = vec![0.0; p * k];
    for (rows, train) in layers {
        let (ni, no) = (rows.n_in, rows.n_out);
        let ne = ni + usize::from(bias);
        // u_i = Σ_k' a[i,k'] δ_i[k']  [M, out]
        let mut u = vec![0.0; m * no];
        for i in 0..m {
            for ks in 0..k {
                let c = a[i * k + ks];
                if c == 0.0 {
                    continue;
                }
                let di = &train.deltas[(i * k + ks) * no..(i * k + ks + 1) * no];
                for o in 0..no {
                    u[i * no + o] += c * di[o];
                }
            }
        }
        let mut a_ext = Vec::with_capacity(m * ne);
        for i in 0..m {
            a_ext.extend_from_slice(&train.acts[i * ni..(i + 1) * ni]);
            if bias {
                a_ext.push(1.0);
            }
        }
        // V = uᵀ A_ext  [out, ne]
        let mut ut = vec![0.0; no * m];
        for i in 0..m {
            for o in 0..no {
                ut[o * m + i] = u[i * no + o];
            }
        }
        let mut v = vec![0.0; no * ne];
        gemm_ab(&mut v, &ut, &a_ext, no, ne, m, 1.0, false);
        // pred[p, k] += Σ_r w_r δ_r[k]ᵀ V [a_r, 1]
        let mut va = vec![0.0; point.len() * no];
        let mut ar_ext = Vec::with_capacity(point.len() * ne);
        for r in 0..point.len() {
            ar_ext.extend_from_slice(&rows.acts[r * ni..(r + 1) * ni]);
            if bias {
                ar_ext.push(1.0);
            }
        }
        gemm_abt(&mut va, &ar_ext, &v, point.len(), no, ne, 1.0, false);
        for (r, (&pi, &w)) in point.iter().zip(weight).enumerate() {
            for kt in 0..k {
                let dr = &rows.deltas[(r * k + kt) * no..(r * k + kt + 1) * no];
                let s: f64 = dr.iter().zip(&va[r * no..(r + 1) * no]).map(|(x, y)| x * y).sum();
                pred[pi * k + kt] += w * s;
            }
        }
    }
    pred
}

/// Adds each row point's self-kernel over one step to `diag` (`[P, K, K]`):
/// `Σ_{r∈p} w_r Σ_l (δ_{r,l}[k]·δ_{r,l}[k']) (|a_{r,l}|² + [bias])`, i.e. the quadrature of
/// `⟨∇f^k_{w_s(t)}(x), ∇f^{k'}_{w_s(t)}(x)⟩` at the row's own nodes.
pub fn add_self_kernel(diag: &mut [f64], rows: &[LayerFactors<'_>], point: &[usize], weight: &[f64], k: usize, bias: bool) {
    let b = if bias { 1.0 } else { 0.0 };
    for layer in rows {
        let (ni, no) = (layer.n_in, layer.n_out);
        for (r, (&pi, &w)) in point.iter().zip(weight).enumerate() {
            let ar = &layer.acts[r * ni..(r + 1) * ni];
            let aa: f64 = ar.iter().map(|v| v * v).sum::<f64>() + b;
            for kt in 0..k {
                let dt = &layer.deltas[(r * k + kt) * no..(r * k + kt + 1) * no];
                for ks in 0..k {
                    let ds = &layer.deltas[(r * k + ks) * no..(r * k + ks + 1) * no];
                    let dd: f64 = dt.iter().zip(ds).map(|(x, y)| x * y).sum();
                    diag[(pi * k + kt) * k + ks] += w * dd * aa;
                }
            }
        }
    }
}
