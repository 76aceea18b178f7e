//! Gram assembly from structured per-layer factors, without Jacobians.
//!
//! For a dense layer `∇_W f^k(x) = δ[k] aᵀ` and `∇_b f^k(x) = δ[k]`. With row points p whose
//! test-side gradient is a weighted sum over quadrature nodes r (weights `w_r`) and training
//! points i (gradients at `w_s`), one step's Gram is
//! `K_s[p, i, k, k'] = Σ_l Σ_{r∈p} w_r (δ_{r,l}[k]·δ_{i,l}[k']) (a_{r,l}·a_{i,l} + [bias])`.
//!
//! - **Layer 0** sees the point itself (`a_{r,0} = x_p` for every node), so its term is
//!   `(x_p·x_i + 1)(δ̄_p[k]·δ_i[k'])` with `δ̄_p = Σ_r w_r δ_{r,0}`: one GEMM per step and block
//!   of row points, scaled by `x_p·x_i + 1` (formed once) and folded into the Gram at once.
//! - **Deeper layers** first form the t-averaged layer gradient
//!   `J̄[p, k, o, :] = Σ_{r∈p} w_r δ_r[k, o] [a_r, 1]` (only `P·K·out·(in+1)` numbers), then
//!   `T = J̄ · A_trainᵀ` (one GEMM) and `K[p, i, k, k'] += Σ_o T[(p,k,o), i] δ_i[k', o]`.
//!
//! Nothing of size `M·K·W` is ever formed. The Gram is accumulated in the layout
//! `[(p, k), (i, k')]`, each row updated once per step (layer 0 and the deeper layers together,
//! from a bounded scratch block of row points), and permuted to `[P, M, K, K]` at the end, so the
//! accumulator holds one Gram-sized array.

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

/// Scratch bytes aimed at for one block of row points (the block's Gram rows in
/// `[(p, k), (i, k')]` layout plus the deeper layers' `J̄` and `T`).
const BLOCK_BYTES: usize = 16 << 20;

/// Fewest row points per block: every block re-reads the training factors (`M·K·out`
/// numbers per layer), so thin blocks turn the GEMMs memory-bound (at M = 10 000, blocks of 2
/// points made a step 1.7× slower per Gram entry than at M = 3000).
const MIN_BLOCK_POINTS: usize = 16;

/// Scratch bytes per row point of a block: its Gram rows and the deepest layer's `J̄` and `T`.
///
/// # Shapes
/// `widths` are the layer widths `[d, h_1, …, K]`.
pub fn scratch_bytes_per_point(widths: &[usize], m: usize, k: usize) -> usize {
    8 * k * (m * k + widths.windows(2).skip(1).map(|w| w[1] * (m + w[0] + 1)).max().unwrap_or(0))
}

/// Accumulates `Σ_s K_s` over steps.
///
/// Memory: the Gram `[P, M, K, K]` itself, the layer-0 scale `x_p·x_i + 1` (`[P, M]`) and a
/// scratch block of at most [`BLOCK_BYTES`] (plus the training factors of the current step).
/// Each step is folded into the Gram block by block of row points, layer 0 included, so no
/// second Gram-sized array is ever held.
pub struct GramAccumulator {
    p: usize,
    m: usize,
    k: usize,
    bias: bool,
    /// `Σ_s K_s`, layout `[(p, k), (i, k')]` (permuted to `[P, M, K, K]` by `finish`).
    g: Vec<f64>,
    /// `x_p·x_i + [bias]` `[P, M]`, formed from the first step's layer-0 factors.
    s0: Option<Vec<f64>>,
    /// Scratch reused across steps: the block's Gram rows, J̄ and T.
    scratch_g: Vec<f64>,
    scratch_j: Vec<f64>,
    scratch_t: Vec<f64>,
}

/// A zero vector whose pages are first touched by a write (a read-first touch of fresh
/// `calloc` pages maps the shared zero page and then pays a copy-on-write fault with a TLB
/// shoot-down on every thread; measured at half the time of an NTK step).
fn zeroed(n: usize) -> Vec<f64> {
    let mut v = vec![0.0; n];
    v.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0));
    v
}

impl GramAccumulator {
    /// A zero accumulator for P row points, M training points and K outputs.
    pub fn new(p: usize, m: usize, k: usize, bias: bool) -> Self {
        GramAccumulator { p, m, k, bias, g: zeroed(p * m * k * k), s0: None, scratch_g: Vec::new(), scratch_j: Vec::new(), scratch_t: Vec::new() }
    }

    /// Adds one step for the row points `points` (a range of `0..P`; call once per chunk of
    /// points to bound the node data held at once). `layers[l]` pairs the rows' factors (per
    /// node, scattered to `point[r]` ∈ `points` with `weight[r]`) with the training points'
    /// factors; `colw` (`[M, K]`) optionally scales every training gradient `∇f^{k'}(x_i)`
    /// (Chen's kernel).
    ///
    /// Layer 0's row activations are the points themselves (`x_rows` `[P, d]`), so
    /// `x_p·x_i + 1` is formed once, at the first call.
    ///
    /// # Panics
    /// If `layers` is empty.
    pub fn add_step(&mut self, layers: &[(LayerFactors<'_>, LayerFactors<'_>)], x_rows: &[f64], point: &[usize], weight: &[f64], colw: Option<&[f64]>, points: std::ops::Range<usize>) {
        let (p, m, k, bias) = (self.p, self.m, self.k, self.bias);
        let mk = m * k;
        let b = if bias { 1.0 } else { 0.0 };
        let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); p];
        for (r, &pi) in point.iter().enumerate() {
            rows_of[pi].push(r);
        }
        let (rows0, train0) = &layers[0];
        let d = rows0.n_in;
        if self.s0.is_none() {
            let mut s0 = vec![0.0; p * m];
            gemm_abt(&mut s0, x_rows, train0.acts, p, m, d, 1.0, false);
            s0.iter_mut().for_each(|v| *v += b);
            self.s0 = Some(s0);
        }
        // Training δ, optionally column-weighted: [(i, k'), o].
        let weighted = |train: &'_ LayerFactors<'_>| -> Vec<f64> {
            let no = train.n_out;
            let mut v = train.deltas.to_vec();
            if let Some(cw) = colw {
                for (c, chunk) in v.chunks_mut(no).enumerate() {
                    let s = cw[c];
                    chunk.iter_mut().for_each(|x| *x *= s);
                }
            }
            v
        };
        // Layer 0: δ̄_p = Σ_{r∈p} w_r δ_r  [(p, k), o].
        let no0 = rows0.n_out;
        let dtrain0: std::borrow::Cow<'_, [f64]> = if colw.is_some() { weighted(train0).into() } else { train0.deltas.into() };
        let mut dbar = vec![0.0; p * k * no0];
        for (r, (&pi, &w)) in point.iter().zip(weight).enumerate() {
            let src = &rows0.deltas[r * k * no0..(r + 1) * k * no0];
            let dst = &mut dbar[pi * k * no0..(pi + 1) * k * no0];
            for (a, x) in dst.iter_mut().zip(src) {
                *a += w * x;
            }
        }
        // Deeper layers: training activations with the bias column [M, ne] and δ transposed
        // per o: [o, (i, k')].
        let deep: Vec<(Vec<f64>, Vec<f64>)> = layers[1..]
            .iter()
            .map(|(_, train)| {
                let a_train = train_acts_ext(train, bias);
                let dtrain = if colw.is_some() { weighted(train) } else { train.deltas.to_vec() };
                let dt = deltas_by_output(&dtrain, mk, train.n_out);
                (a_train, dt)
            })
            .collect();
        let per_point = 8 * k * (mk + layers[1..].iter().map(|(r, _)| r.n_out * (m + r.n_in + 1)).max().unwrap_or(0));
        let (first, last) = (points.start, points.end.min(p));
        let pb = (BLOCK_BYTES / per_point.max(1)).max(MIN_BLOCK_POINTS).min(last - first).max(1);
        let mut gb = std::mem::take(&mut self.scratch_g);
        gb.resize(pb * k * mk, 0.0);
        let mut jbar = std::mem::take(&mut self.scratch_j);
        let mut t = std::mem::take(&mut self.scratch_t);
        let s0 = self.s0.as_deref().expect("formed above");
        for p0 in (first..last).step_by(pb) {
            let nb = pb.min(last - p0);
            let gbb = &mut gb[..nb * k * mk];
            // Layer 0's δ-products D0 of the block; folded in, scaled by x_p·x_i + 1, below.
            gemm_abt(gbb, &dbar[p0 * k * no0..(p0 + nb) * k * no0], &dtrain0, nb * k, mk, no0, 1.0, false);
            let mut folded = false;
            for ((rows, _), (a_train, dt)) in layers[1..].iter().zip(&deep) {
                let (ni, no) = (rows.n_in, rows.n_out);
                let ne = ni + usize::from(bias);
                jbar.resize(pb * k * no * ne, 0.0);
                t.resize(pb * k * no * m, 0.0);
                let jb = &mut jbar[..nb * k * no * ne];
                jb.iter_mut().for_each(|v| *v = 0.0);
                // J̄[p, k, o, :] = Σ_{r∈p} w_r δ_r[k, o] [a_r, 1]
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
                                for (dv, av) in dst[..ni].iter_mut().zip(ar) {
                                    *dv += c * av;
                                }
                                if bias {
                                    dst[ni] += c;
                                }
                            }
                        }
                    }
                }
                // T [(p, k, o), i] = J̄ · A_trainᵀ
                let tb = &mut t[..nb * k * no * m];
                gemm_abt(tb, jb, a_train, nb * k * no, m, ne, 1.0, false);
                // G[(p, k), (i, k')] += Σ_o T[(p, k, o), i] δT[o, (i, k')] (the first deep layer
                // also adds layer 0's (x_p·x_i + 1) ∘ D0, so each Gram row is updated once).
                let tb = &*tb;
                let fold0 = !folded;
                let gb0 = &*gbb;
                self.g[p0 * k * mk..(p0 + nb) * k * mk].par_chunks_mut(mk).enumerate().for_each_init(
                    || vec![0.0; mk],
                    |texp, (row, grow)| {
                        if fold0 {
                            add_scaled_row(grow, &gb0[row * mk..(row + 1) * mk], &s0[(p0 + row / k) * m..(p0 + row / k + 1) * m], k);
                        }
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
                folded = true;
            }
            if !folded {
                let gb0 = &*gbb;
                self.g[p0 * k * mk..(p0 + nb) * k * mk].par_chunks_mut(mk).enumerate().for_each(|(row, grow)| {
                    add_scaled_row(grow, &gb0[row * mk..(row + 1) * mk], &s0[(p0 + row / k) * m..(p0 + row / k + 1) * m], k)
                });
            }
        }
        self.scratch_g = gb;
        self.scratch_j = jbar;
        self.scratch_t = t;
    }

    /// The Gram `Σ_s K_s`, permuted from the accumulation layout `[(p, k), (i, k')]` point by
    /// point in place.
    ///
    /// # Shapes
    /// Returns `[P, M, K, K]`.
    pub fn finish(mut self) -> Vec<f64> {
        let (m, k) = (self.m, self.k);
        let mk = m * k;
        self.g.par_chunks_mut(k * mk).for_each_init(
            || vec![0.0; k * mk],
            |tmp, gp| {
                for kt in 0..k {
                    for i in 0..m {
                        for ks in 0..k {
                            tmp[(i * k + kt) * k + ks] = gp[kt * mk + i * k + ks];
                        }
                    }
                }
                gp.copy_from_slice(tmp);
            },
        );
        self.g
    }
}

/// `row[(i, k')] += s[i] · src[(i, k')]`.
fn add_scaled_row(row: &mut [f64], src: &[f64], s: &[f64], k: usize) {
    for ((chunk, sc), &sv) in row.chunks_exact_mut(k).zip(src.chunks_exact(k)).zip(s) {
        chunk.iter_mut().zip(sc).for_each(|(v, &x)| *v += sv * x);
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

/// The training side of one step's kernel-machine prediction:
/// `v = Σ_i Σ_{k'} a[i,k'] ∇f^{k'}(x_i)` formed per layer as
/// `V_l = Σ_i (Σ_{k'} a[i,k'] δ_{i,l}[k']) [a_{i,l}, 1]ᵀ` (`[out, in(+1)]`).
///
/// # Shapes
/// `a` `[M, K]`; returns one `[out_l, in_l(+1)]` matrix per layer.
pub fn prediction_weights(train: &[LayerFactors<'_>], a: &[f64], m: usize, k: usize, bias: bool) -> Vec<Vec<f64>> {
    train
        .iter()
        .map(|t| {
            let (ni, no) = (t.n_in, t.n_out);
            let ne = ni + usize::from(bias);
            // uᵀ [out, M], u_i = Σ_k' a[i,k'] δ_i[k']
            let mut ut = vec![0.0; no * m];
            for i in 0..m {
                for ks in 0..k {
                    let c = a[i * k + ks];
                    if c == 0.0 {
                        continue;
                    }
                    let di = &t.deltas[(i * k + ks) * no..(i * k + ks + 1) * no];
                    for o in 0..no {
                        ut[o * m + i] += c * di[o];
                    }
                }
            }
            let a_ext = train_acts_ext(t, bias);
            let mut v = vec![0.0; no * ne];
            gemm_ab(&mut v, &ut, &a_ext, no, ne, m, 1.0, false);
            v
        })
        .collect()
}

/// One step's kernel-machine prediction in factor form,
/// `Σ_i Σ_{k'} a[i, k'] K_s[p, i, k, k'] = ⟨∇̄f^k(x_p), v⟩`, added into `pred` for the row
/// points that have nodes here, with `v` from [`prediction_weights`].
///
/// # Shapes
/// `pred` `[P, K]`.
pub fn add_prediction(pred: &mut [f64], rows: &[LayerFactors<'_>], v: &[Vec<f64>], point: &[usize], weight: &[f64], k: usize, bias: bool) {
    for (layer, vl) in rows.iter().zip(v) {
        let (ni, no) = (layer.n_in, layer.n_out);
        let ne = ni + usize::from(bias);
        let mut ar_ext = Vec::with_capacity(point.len() * ne);
        for r in 0..point.len() {
            ar_ext.extend_from_slice(&layer.acts[r * ni..(r + 1) * ni]);
            if bias {
                ar_ext.push(1.0);
            }
        }
        // va[r, o] = V[o, :]·[a_r, 1]
        let mut va = vec![0.0; point.len() * no];
        gemm_abt(&mut va, &ar_ext, vl, point.len(), no, ne, 1.0, false);
        for (r, (&pi, &w)) in point.iter().zip(weight).enumerate() {
            for kt in 0..k {
                let dr = &layer.deltas[(r * k + kt) * no..(r * k + kt + 1) * no];
                let s: f64 = dr.iter().zip(&va[r * no..(r + 1) * no]).map(|(x, y)| x * y).sum();
                pred[pi * k + kt] += w * s;
            }
        }
    }
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
