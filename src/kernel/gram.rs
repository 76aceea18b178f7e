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
//! Nothing of size `M·K·W` is ever formed. The Gram is accumulated in a [`GramSink`] of the
//! requested [`Layout`] (`full`, `diag` or `trace`), only the entries of that layout being
//! computed, block by block of row points, and permuted once at the end, so the accumulator holds
//! one Gram-sized array.

use super::layout::{add_dense_scaled, add_formed, add_output_layer, GramSink, Layout, TrainDeltas};
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

/// Accumulates `Σ_s K_s` over steps in one [`Layout`].
///
/// Memory: the Gram itself, the layer-0 scale `x_p·x_i + 1` (`[P, M]`) and a scratch block of
/// at most [`BLOCK_BYTES`] (plus the training factors of the current step).
pub struct GramAccumulator {
    p: usize,
    m: usize,
    k: usize,
    bias: bool,
    /// `Σ_s K_s` in accumulation rows.
    sink: GramSink,
    /// `x_p·x_i + [bias]` `[P, M]`, formed from the first step's layer-0 factors.
    s0: Option<Vec<f64>>,
    /// `Some(α)` when the last layer's sensitivities are `α(δ_ko − q_o)` (log-softmax or
    /// identity output): it is then contracted in its structured form ([`add_output_layer`]).
    output_alpha: Option<f64>,
    /// Scratch reused across steps: layer 0's product, J̄ and T.
    scratch_g: Vec<f64>,
    scratch_j: Vec<f64>,
    scratch_t: Vec<f64>,
}

impl GramAccumulator {
    /// A zero accumulator of the full Gram for P row points, M training points and K outputs.
    pub fn new(p: usize, m: usize, k: usize, bias: bool) -> Self {
        Self::with_layout(Layout::Full, p, m, k, bias)
    }

    /// A zero accumulator in `layout`.
    pub fn with_layout(layout: Layout, p: usize, m: usize, k: usize, bias: bool) -> Self {
        GramAccumulator { p, m, k, bias, sink: GramSink::new(layout, p, m, k), s0: None, output_alpha: None, scratch_g: Vec::new(), scratch_j: Vec::new(), scratch_t: Vec::new() }
    }

    /// Declares the last layer's sensitivities to be `α(δ_ko − q_o)` (every MLP of
    /// [`super::eval::MlpStep`]: log-softmax or identity output scaled by α), so that it is
    /// contracted with K + 1 instead of K² rows per point.
    pub fn with_output_alpha(mut self, alpha: f64) -> Self {
        self.output_alpha = (alpha != 0.0 && self.k >= 2).then_some(alpha);
        self
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
        let layout = self.sink.layout();
        let (first, last) = (points.start, points.end.min(p));
        if first >= last {
            return;
        }
        let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); last - first];
        for (r, &pi) in point.iter().enumerate() {
            rows_of[pi - first].push(r);
        }
        let (rows0, train0) = &layers[0];
        let d = rows0.n_in;
        if self.s0.is_none() {
            let mut s0 = vec![0.0; p * m];
            gemm_abt(&mut s0, x_rows, train0.acts, p, m, d, 1.0, false);
            let b = if bias { 1.0 } else { 0.0 };
            s0.iter_mut().for_each(|v| *v += b);
            self.s0 = Some(s0);
        }
        // Training δ of layer 0, optionally column-weighted: [(i, k'), o].
        let no0 = rows0.n_out;
        let dtrain0: std::borrow::Cow<'_, [f64]> = match colw {
            Some(cw) => {
                let mut v = train0.deltas.to_vec();
                v.chunks_mut(no0).zip(cw).for_each(|(ch, &s)| ch.iter_mut().for_each(|x| *x *= s));
                v.into()
            }
            None => train0.deltas.into(),
        };
        // Layer 0: δ̄_p = Σ_{r∈p} w_r δ_r  [(p, k), o] for the points of the range.
        let mut dbar = vec![0.0; (last - first) * k * no0];
        for (r, (&pi, &w)) in point.iter().zip(weight).enumerate() {
            let src = &rows0.deltas[r * k * no0..(r + 1) * k * no0];
            let dst = &mut dbar[(pi - first) * k * no0..(pi - first + 1) * k * no0];
            for (a, x) in dst.iter_mut().zip(src) {
                *a += w * x;
            }
        }
        // Deeper layers: training activations with the bias column [M, ne] and δ arranged for
        // the layout.
        let deep: Vec<(Vec<f64>, TrainDeltas)> =
            layers[1..].iter().map(|(_, train)| (train_acts_ext(train, bias), TrainDeltas::new(layout, train.deltas, m, k, train.n_out, colw))).collect();
        let per_point = scratch_bytes_per_point_layout(layers, m, k, layout);
        let pb = (BLOCK_BYTES / per_point.max(1)).max(MIN_BLOCK_POINTS).min(last - first).max(1);
        let mut jbar = std::mem::take(&mut self.scratch_j);
        let mut t = std::mem::take(&mut self.scratch_t);
        let mut tmp = std::mem::take(&mut self.scratch_g);
        let s0 = self.s0.as_deref().expect("formed above");
        for p0 in (first..last).step_by(pb) {
            let nb = pb.min(last - p0);
            let out = self.sink.rows_mut(p0..p0 + nb);
            let (b0, b1) = ((p0 - first) * k * no0, (p0 - first + nb) * k * no0);
            add_dense_scaled(layout, out, &dbar[b0..b1], &dtrain0, &s0[p0 * m..(p0 + nb) * m], nb, m, k, no0, &mut tmp);
            for (li, ((rows, _), (a_train, dt))) in layers[1..].iter().zip(&deep).enumerate() {
                let (ni, no) = (rows.n_in, rows.n_out);
                let ne = ni + usize::from(bias);
                if let (Some(alpha), true) = (self.output_alpha, li + 2 == layers.len()) {
                    // [Ā; B̄] per point, q_{r,o} = −δ_r[(o+1) mod K, o]/α.
                    jbar.clear();
                    jbar.resize(nb * (k + 1) * ne, 0.0);
                    for pl in 0..nb {
                        for &r in &rows_of[p0 - first + pl] {
                            let w = weight[r];
                            let ar = &rows.acts[r * ni..(r + 1) * ni];
                            let dr = &rows.deltas[r * k * no..(r + 1) * k * no];
                            for j in 0..=k {
                                let c = if j == 0 { w } else { -w * dr[(j % k) * no + (j - 1)] / alpha };
                                if c == 0.0 {
                                    continue;
                                }
                                let dst = &mut jbar[(pl * (k + 1) + j) * ne..(pl * (k + 1) + j + 1) * ne];
                                for (dv, av) in dst[..ni].iter_mut().zip(ar) {
                                    *dv += c * av;
                                }
                                if bias {
                                    dst[ni] += c;
                                }
                            }
                        }
                    }
                    add_output_layer(out, &jbar, a_train, dt, nb, ne, alpha, &mut t);
                    continue;
                }
                jbar.clear();
                jbar.resize(nb * k * no * ne, 0.0);
                // J̄[p, k, o, :] = Σ_{r∈p} w_r δ_r[k, o] [a_r, 1]
                for pl in 0..nb {
                    for &r in &rows_of[p0 - first + pl] {
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
                                let dst = &mut jbar[base..base + ne];
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
                add_formed(out, &jbar, a_train, dt, nb, ne, &mut t);
            }
        }
        self.scratch_g = tmp;
        self.scratch_j = jbar;
        self.scratch_t = t;
    }

    /// The Gram `Σ_s K_s` in its output layout (`full`: `[P, M, K, K]`).
    pub fn finish(self) -> Vec<f64> {
        self.sink.finish()
    }
}

/// Scratch bytes per row point of one block in `layout`: layer 0's product and the deepest
/// layer's `J̄` and `T`.
fn scratch_bytes_per_point_layout(layers: &[(LayerFactors<'_>, LayerFactors<'_>)], m: usize, k: usize, layout: Layout) -> usize {
    8 * (m * layout.per_pair(k) + k * layers[1..].iter().map(|(r, _)| r.n_out * (m + r.n_in + 1)).max().unwrap_or(0))
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
