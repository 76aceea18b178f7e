//! Output layouts of a Gram, the one accumulator every step model writes into, and the three
//! contractions they are all built from.
//!
//! A Gram between P row points and M training points with K outputs has `K²` numbers per pair.
//! What is stored is what the question needs ([`Layout`]):
//!
//! - `full`: every class block, `[P, M, K, K]` (`G[p, i, k, k']`);
//! - `diag`: the class-diagonal blocks `K^{cc}`, `[P, M, K]` (per-class GPs, the SVM);
//! - `trace`: `Σ_c K^{cc}`, `[P, M]` (attribution summaries, stationarity).
//!
//! Every step model produces row-side and training-side features in one of three forms and
//! hands them to `add_dense`, `add_dense_scaled` or `add_formed`, which compute only the
//! entries of the layout: `diag` costs about `1/K` of `full` for a dense block and `trace` one
//! GEMM with a K-times longer inner dimension. `GramSink` holds the accumulation rows
//! (`[(p, k), (i, k')]`, `[(p, c), i]` or `[p, i]`) and is the one place they are permuted into
//! the output layout.

use std::ops::Range;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::linalg::gemm_abt;
use crate::error::{Error, Result};

/// Which blocks of a Gram are computed and stored (`--layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Every class block: `[P, M, K, K]`.
    #[default]
    Full,
    /// The class-diagonal blocks `K^{cc}`: `[P, M, K]`.
    Diag,
    /// Their sum `Σ_c K^{cc}`: `[P, M]`.
    Trace,
}

impl Layout {
    /// Accumulation rows per row point: K (`full`, `diag`) or 1 (`trace`).
    pub fn rows_per_point(self, k: usize) -> usize {
        match self {
            Layout::Full | Layout::Diag => k,
            Layout::Trace => 1,
        }
    }

    /// Columns per training point in one accumulation row: K (`full`) or 1.
    pub fn cols_per_train(self, k: usize) -> usize {
        match self {
            Layout::Full => k,
            Layout::Diag | Layout::Trace => 1,
        }
    }

    /// Numbers stored per (row point, training point) pair: K², K or 1.
    pub fn per_pair(self, k: usize) -> usize {
        self.rows_per_point(k) * self.cols_per_train(k)
    }

    /// The output shape for P row points, M training points and K outputs.
    pub fn shape(self, p: usize, m: usize, k: usize) -> Vec<usize> {
        match self {
            Layout::Full => vec![p, m, k, k],
            Layout::Diag => vec![p, m, k],
            Layout::Trace => vec![p, m],
        }
    }

    /// Whether a Gram in this layout holds every entry of `need` (full ⊇ diag ⊇ trace).
    pub fn provides(self, need: Layout) -> bool {
        matches!((self, need), (Layout::Full, _) | (Layout::Diag, Layout::Diag | Layout::Trace) | (Layout::Trace, Layout::Trace))
    }

    /// Extracts this layout from a full Gram `[P, M, K, K]` (the slow, obvious reference).
    pub fn from_full(self, full: &[f64], p: usize, m: usize, k: usize) -> Vec<f64> {
        match self {
            Layout::Full => full.to_vec(),
            Layout::Diag => (0..p * m).flat_map(|pm| (0..k).map(move |c| full[(pm * k + c) * k + c])).collect(),
            Layout::Trace => (0..p * m).map(|pm| (0..k).map(|c| full[(pm * k + c) * k + c]).sum()).collect(),
        }
    }
}

impl Layout {
    /// Extracts this layout from a Gram stored in layout `from`.
    ///
    /// # Panics
    /// If `from` does not provide this layout ([`Layout::provides`]) or `g` has the wrong size.
    pub fn from_layout(self, from: Layout, g: &[f64], p: usize, m: usize, k: usize) -> Vec<f64> {
        assert!(from.provides(self), "a {from} Gram does not hold the {self} blocks");
        assert_eq!(g.len(), p * m * from.per_pair(k), "Gram has the wrong size");
        match (from, self) {
            (Layout::Full, _) => self.from_full(g, p, m, k),
            (Layout::Diag, Layout::Trace) => g.chunks_exact(k).map(|c| c.iter().sum()).collect(),
            _ => g.to_vec(),
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "full" => Ok(Layout::Full),
            "diag" => Ok(Layout::Diag),
            "trace" => Ok(Layout::Trace),
            _ => Err(Error::Config(format!("--layout `{s}`: expected full, diag or trace"))),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Full => "full",
            Layout::Diag => "diag",
            Layout::Trace => "trace",
        })
    }
}

/// A zero vector whose pages are first touched by a write (a read-first touch of fresh
/// `calloc` pages maps the shared zero page and then pays a copy-on-write fault with a TLB
/// shoot-down on every thread; measured at half the time of an NTK step).
pub(crate) fn zeroed(n: usize) -> Vec<f64> {
    let mut v = vec![0.0; n];
    v.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0));
    v
}

/// The accumulation rows of a Gram in one layout.
///
/// Rows are `(p, k)` for `full` and `diag` and `p` for `trace`; a row holds `(i, k')` (`full`)
/// or `i` (`diag`, `trace`). [`GramSink::finish`] permutes to the output layout.
pub(crate) struct GramSink {
    layout: Layout,
    p: usize,
    m: usize,
    k: usize,
    g: Vec<f64>,
}

impl GramSink {
    /// A zero Gram for P row points, M training points and K outputs.
    pub(crate) fn new(layout: Layout, p: usize, m: usize, k: usize) -> Self {
        GramSink { layout, p, m, k, g: zeroed(p * m * layout.per_pair(k)) }
    }

    /// `(P, M, K)`.
    pub(crate) fn dims(&self) -> (usize, usize, usize) {
        (self.p, self.m, self.k)
    }

    /// The layout.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Numbers in one accumulation row.
    pub(crate) fn row_len(&self) -> usize {
        self.m * self.layout.cols_per_train(self.k)
    }

    /// Numbers per row point (its accumulation rows).
    pub(crate) fn point_len(&self) -> usize {
        self.row_len() * self.layout.rows_per_point(self.k)
    }

    /// The accumulation rows of the row points `points`.
    pub(crate) fn rows_mut(&mut self, points: Range<usize>) -> &mut [f64] {
        let n = self.point_len();
        &mut self.g[points.start * n..points.end * n]
    }

    /// `self += other` (same layout and shape).
    ///
    /// # Panics
    /// If the two differ in layout or shape.
    pub(crate) fn add(&mut self, other: &GramSink) {
        assert_eq!((self.layout, self.p, self.m, self.k), (other.layout, other.p, other.m, other.k), "sinks differ");
        self.g.par_iter_mut().zip(&other.g).for_each(|(a, b)| *a += b);
    }

    /// `self *= c`.
    pub(crate) fn scale(&mut self, c: f64) {
        self.g.par_iter_mut().for_each(|v| *v *= c);
    }

    /// The Gram in its output layout ([`Layout::shape`]), permuted point by point in place.
    pub(crate) fn finish(mut self) -> Vec<f64> {
        let (m, k) = (self.m, self.k);
        match self.layout {
            Layout::Full => {
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
            }
            Layout::Diag => {
                self.g.par_chunks_mut(k * m).for_each_init(
                    || vec![0.0; k * m],
                    |tmp, gp| {
                        for c in 0..k {
                            for i in 0..m {
                                tmp[i * k + c] = gp[c * m + i];
                            }
                        }
                        gp.copy_from_slice(tmp);
                    },
                );
            }
            Layout::Trace => {}
        }
        self.g
    }
}

/// Dense features on both sides: `out += α · ⟨rows[(p, k)], train[(i, k')]⟩` for the entries of
/// the layout (`diag`: k = k'; `trace`: summed over k = k').
///
/// # Shapes
/// `out` the accumulation rows of `nb` points (`[nb·K, M·K]`, `[nb·K, M]` or `[nb, M]`),
/// `rows` `[nb·K, dim]`, `train` `[M·K, dim]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_dense(layout: Layout, out: &mut [f64], rows: &[f64], train: &[f64], nb: usize, m: usize, k: usize, dim: usize, alpha: f64) {
    assert_eq!(rows.len(), nb * k * dim, "row features have the wrong size");
    assert_eq!(train.len(), m * k * dim, "training features have the wrong size");
    assert_eq!(out.len(), nb * m * layout.per_pair(k), "output rows have the wrong size");
    if nb == 0 || m == 0 || dim == 0 {
        return;
    }
    match layout {
        Layout::Full => gemm_abt(out, rows, train, nb * k, m * k, dim, alpha, true),
        // Σ_c rows[(p,c), :]·train[(i,c), :] is one product with inner dimension K·dim.
        Layout::Trace => gemm_abt(out, rows, train, nb, m, k * dim, alpha, true),
        Layout::Diag => {
            // Per class: its rows on both sides (every K-th) against each other, added into the
            // rows (p, c) in place — strided GEMMs, no gathered copies.
            for c in 0..k {
                crate::linalg::gemm_abt_strided_add(&mut out[c * m..], k * m, &rows[c * dim..], k * dim, &train[c * dim..], k * dim, nb, m, dim, alpha);
            }
        }
    }
}

/// [`add_dense`] with every pair scaled by `s[p, i]`: the form of an MLP's first layer, whose
/// gradient is `δ[k] ⊗ [x, 1]` on both sides, so that `⟨·,·⟩ = (δ_p[k]·δ_i[k'])(x_p·x_i + 1)`
/// and `s = x_p·x_i + 1` is formed once for all steps. `tmp` is scratch.
///
/// # Shapes
/// As [`add_dense`], and `s` `[nb, M]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_dense_scaled(layout: Layout, out: &mut [f64], rows: &[f64], train: &[f64], s: &[f64], nb: usize, m: usize, k: usize, dim: usize, tmp: &mut Vec<f64>) {
    assert_eq!(s.len(), nb * m, "scale has the wrong size");
    tmp.clear();
    tmp.resize(out.len(), 0.0);
    add_dense(layout, tmp, rows, train, nb, m, k, dim, 1.0);
    let cols = layout.cols_per_train(k);
    let row_len = m * cols;
    let rpp = layout.rows_per_point(k);
    out.par_chunks_mut(row_len).zip(tmp.par_chunks(row_len)).enumerate().for_each(|(row, (orow, trow))| {
        let srow = &s[(row / rpp) * m..(row / rpp + 1) * m];
        for ((oc, tc), &sv) in orow.chunks_exact_mut(cols).zip(trow.chunks_exact(cols)).zip(srow) {
            oc.iter_mut().zip(tc).for_each(|(o, t)| *o += sv * t);
        }
    });
}

/// The training points' sensitivities of one layer, arranged for [`add_formed`] in one layout.
pub(crate) struct TrainDeltas {
    layout: Layout,
    /// `full`: `[o, (i, k')]`; `diag`/`trace`: `[(c, o), i]`.
    data: Vec<f64>,
    m: usize,
    k: usize,
    no: usize,
    /// `diag`/`trace` of an output layer whose training sensitivities are
    /// `δ_i[c, o] = α w_{ic}(δ_co − q_{io})` ([`TrainDeltas::output`]).
    soft: Option<SoftTrain>,
}

/// The training side of an output layer in its structured form: `q` `[o, i]` (softmax, or zero
/// for an identity output) and the optional per-(i, c) weights `w` `[c, i]` (Chen's kernel).
struct SoftTrain {
    alpha: f64,
    q: Vec<f64>,
    w: Option<Vec<f64>>,
}

impl TrainDeltas {
    /// Arranges `δ_i[k', o]` (`[(i, k'), o]`, optionally scaled per `(i, k')` by `colw`).
    ///
    /// # Shapes
    /// `deltas` `[M·K, no]`, `colw` `[M·K]`.
    pub(crate) fn new(layout: Layout, deltas: &[f64], m: usize, k: usize, no: usize, colw: Option<&[f64]>) -> Self {
        assert_eq!(deltas.len(), m * k * no, "training sensitivities have the wrong size");
        let w = |c: usize| colw.map_or(1.0, |cw| cw[c]);
        let mut data = vec![0.0; no * m * k];
        match layout {
            Layout::Full => {
                let mk = m * k;
                for c in 0..mk {
                    let wc = w(c);
                    for o in 0..no {
                        data[o * mk + c] = wc * deltas[c * no + o];
                    }
                }
            }
            Layout::Diag | Layout::Trace => {
                for i in 0..m {
                    for c in 0..k {
                        let wc = w(i * k + c);
                        for o in 0..no {
                            data[(c * no + o) * m + i] = wc * deltas[(i * k + c) * no + o];
                        }
                    }
                }
            }
        }
        TrainDeltas { layout, data, m, k, no, soft: None }
    }

    /// [`TrainDeltas::new`] for an output layer whose training sensitivities are
    /// `δ_i[c, o] = α(δ_co − q_{io})` (every MLP and CNN of [`super::mlp::step`]: log-softmax or
    /// identity output scaled by α), weighted per (i, c) by `colw`. `diag` and `trace` then keep
    /// `q_{io} = −δ_i[(o+1) mod K, o]/α` and the weights instead of the K² sensitivities, and
    /// [`add_output_layer`] contracts them in O(K) passes per row point instead of O(K²).
    ///
    /// # Shapes
    /// `deltas` `[M·K, K]`, `colw` `[M·K]`.
    ///
    /// # Panics
    /// If `alpha` is 0 or K < 2 (q cannot be read off the sensitivities).
    pub(crate) fn output(layout: Layout, deltas: &[f64], m: usize, k: usize, colw: Option<&[f64]>, alpha: f64) -> Self {
        assert!(alpha != 0.0 && k >= 2, "the structured output layer needs α ≠ 0 and K ≥ 2");
        if layout == Layout::Full {
            return Self::new(layout, deltas, m, k, k, colw);
        }
        assert_eq!(deltas.len(), m * k * k, "training sensitivities have the wrong size");
        let mut q = vec![0.0; k * m];
        for i in 0..m {
            for o in 0..k {
                q[o * m + i] = -deltas[(i * k + (o + 1) % k) * k + o] / alpha;
            }
        }
        let w = colw.map(|cw| {
            assert_eq!(cw.len(), m * k, "column weights have the wrong size");
            let mut w = vec![0.0; k * m];
            for i in 0..m {
                for c in 0..k {
                    w[c * m + i] = cw[i * k + c];
                }
            }
            w
        });
        TrainDeltas { layout, data: Vec::new(), m, k, no: k, soft: Some(SoftTrain { alpha, q, w }) }
    }
}

/// What a [`TrainDeltas`] holds, for a backend that contracts it elsewhere
/// ([`super::backend::resident`]).
pub(crate) enum TrainParts<'a> {
    /// `full`: `[o, (i, k')]`; `diag`/`trace`: `[(c, o), i]`.
    Formed { data: &'a [f64], no: usize },
    /// The structured output layer ([`TrainDeltas::output`]): its α, `q` `[o, i]` and the
    /// optional weights `w` `[c, i]`.
    Soft { alpha: f64, q: &'a [f64], w: Option<&'a [f64]> },
}

impl TrainDeltas {
    /// The layout it was arranged for.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Its numbers.
    pub(crate) fn parts(&self) -> TrainParts<'_> {
        match &self.soft {
            Some(s) => TrainParts::Soft { alpha: s.alpha, q: &s.q, w: s.w.as_deref() },
            None => TrainParts::Formed { data: &self.data, no: self.no },
        }
    }
}

/// Formed row-side layer gradients against the training points' factors:
/// `out[(p, k), (i, k')] += Σ_o (J[(p, k, o), :]·a_i) δ_i[k', o]` for the entries of the layout,
/// as one GEMM `T = J·Aᵀ` (`[(p, k, o), i]`) and a vectorised pass over o. `t` is scratch.
///
/// # Shapes
/// `out` the accumulation rows of `nb` points, `j` `[nb·K·no, ne]`, `a_ext` `[M, ne]`.
///
/// # Panics
/// If `dt` was arranged for another layout or shape.
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_formed(out: &mut [f64], j: &[f64], a_ext: &[f64], dt: &TrainDeltas, nb: usize, ne: usize, t: &mut Vec<f64>) {
    let (layout, m, k, no) = (dt.layout, dt.m, dt.k, dt.no);
    assert_eq!(out.len(), nb * m * layout.per_pair(k), "output rows have the wrong size");
    t.resize(nb * k * no * m, 0.0);
    let tb = &mut t[..nb * k * no * m];
    gemm_abt(tb, j, a_ext, nb * k * no, m, ne, 1.0, false);
    fold_formed(out, tb, dt, nb);
}

/// [`add_formed`] after its GEMM: `out[(p, k), (i, k')] += Σ_o T[(p, k, o), i] δ_i[k', o]` for
/// the entries of the layout (the contraction backend forms `T`, see [`super::backend`]).
///
/// # Shapes
/// `out` the accumulation rows of `nb` points, `tb` `[nb·K·no, M]`.
///
/// # Panics
/// If the shapes disagree with `dt`.
pub(crate) fn fold_formed(out: &mut [f64], tb: &[f64], dt: &TrainDeltas, nb: usize) {
    let (layout, m, k, no) = (dt.layout, dt.m, dt.k, dt.no);
    assert_eq!(out.len(), nb * m * layout.per_pair(k), "output rows have the wrong size");
    assert_eq!(tb.len(), nb * k * no * m, "T has the wrong size");
    let mk = m * k;
    let d = &dt.data;
    match layout {
        Layout::Full => out.par_chunks_mut(mk).enumerate().for_each_init(
            || vec![0.0; mk],
            |texp, (row, grow)| {
                for o in 0..no {
                    let trow = &tb[(row * no + o) * m..(row * no + o + 1) * m];
                    let drow = &d[o * mk..(o + 1) * mk];
                    // Expand t over k' so the update is one contiguous, vectorisable pass.
                    for (chunk, &tv) in texp.chunks_exact_mut(k).zip(trow) {
                        chunk.iter_mut().for_each(|v| *v = tv);
                    }
                    for ((g, &tv), &dv) in grow.iter_mut().zip(texp.iter()).zip(drow) {
                        *g += tv * dv;
                    }
                }
            },
        ),
        Layout::Diag => out.par_chunks_mut(m).enumerate().for_each(|(row, grow)| {
            let c = row % k;
            for o in 0..no {
                let trow = &tb[(row * no + o) * m..(row * no + o + 1) * m];
                let drow = &d[(c * no + o) * m..(c * no + o + 1) * m];
                for ((g, &tv), &dv) in grow.iter_mut().zip(trow).zip(drow) {
                    *g += tv * dv;
                }
            }
        }),
        Layout::Trace => out.par_chunks_mut(m).enumerate().for_each(|(pl, grow)| {
            for c in 0..k {
                let row = pl * k + c;
                for o in 0..no {
                    let trow = &tb[(row * no + o) * m..(row * no + o + 1) * m];
                    let drow = &d[(c * no + o) * m..(c * no + o + 1) * m];
                    for ((g, &tv), &dv) in grow.iter_mut().zip(trow).zip(drow) {
                        *g += tv * dv;
                    }
                }
            }
        }),
    }
}

/// [`add_formed`] for an output layer whose sensitivities are `δ[k, o] = α(δ_ko − q_o)` on the
/// row side (log-softmax: q = softmax; identity: q = 0). The rows' formed gradient
/// `J̄[p, k, o, :] = α(δ_ko Ā_p − B̄_p[o])` then has only K + 1 distinct rows per point,
/// `Ā_p = Σ_r w_r [a_r, 1]` and `B̄_p[o] = Σ_r w_r q_{r,o} [a_r, 1]`, so the GEMM shrinks from
/// `K·K` to `K + 1` rows per point (`T = [Ā; B̄]·Aᵀ`), and
/// `G[(p, k), (i, k')] += α(T_A δ_i[k', k] − Σ_o T_B[o] δ_i[k', o])`.
///
/// # Shapes
/// `out` the accumulation rows of `nb` points, `ab` `[nb·(K+1), ne]` (per point `Ā` then the
/// K rows `B̄[o]`), `a_ext` `[M, ne]`.
///
/// # Panics
/// If `dt` does not have `no = K` (an output layer).
pub(crate) fn add_output_layer(out: &mut [f64], ab: &[f64], a_ext: &[f64], dt: &TrainDeltas, nb: usize, ne: usize, alpha: f64, t: &mut Vec<f64>) {
    let (layout, m, k, no) = (dt.layout, dt.m, dt.k, dt.no);
    assert_eq!(no, k, "an output layer has K outputs");
    assert_eq!(out.len(), nb * m * layout.per_pair(k), "output rows have the wrong size");
    let k1 = k + 1;
    t.resize(nb * k1 * m, 0.0);
    let tb = &mut t[..nb * k1 * m];
    gemm_abt(tb, ab, a_ext, nb * k1, m, ne, 1.0, false);
    fold_output_layer(out, tb, dt, nb, alpha);
}

/// [`add_output_layer`] after its GEMM `T = [Ā; B̄]·Aᵀ`: the element-wise passes into the
/// accumulation rows (the contraction backend forms `T`, see [`super::backend`]).
///
/// # Shapes
/// `out` the accumulation rows of `nb` points, `tb` `[nb·(K+1), M]`.
///
/// # Panics
/// If the shapes disagree with `dt` or `dt` is not an output layer.
pub(crate) fn fold_output_layer(out: &mut [f64], tb: &[f64], dt: &TrainDeltas, nb: usize, alpha: f64) {
    let (layout, m, k, no) = (dt.layout, dt.m, dt.k, dt.no);
    assert_eq!(no, k, "an output layer has K outputs");
    assert_eq!(out.len(), nb * m * layout.per_pair(k), "output rows have the wrong size");
    let k1 = k + 1;
    let mk = m * k;
    assert_eq!(tb.len(), nb * k1 * m, "T has the wrong size");
    if let Some(soft) = &dt.soft {
        soft_output_rows(out, tb, soft, layout, m, k, alpha);
        return;
    }
    let d = &dt.data;
    // Row point pl's T_A and T_B[o], each [M].
    let ta = |pl: usize| &tb[pl * k1 * m..(pl * k1 + 1) * m];
    let tbo = |pl: usize, o: usize| &tb[(pl * k1 + 1 + o) * m..(pl * k1 + 2 + o) * m];
    match layout {
        Layout::Full => out.par_chunks_mut(mk).enumerate().for_each_init(
            || vec![0.0; mk],
            |texp, (row, grow)| {
                let (pl, kt) = (row / k, row % k);
                expand_add(grow, texp, ta(pl), &d[kt * mk..(kt + 1) * mk], alpha, k);
                for o in 0..k {
                    expand_add(grow, texp, tbo(pl, o), &d[o * mk..(o + 1) * mk], -alpha, k);
                }
            },
        ),
        Layout::Diag => out.par_chunks_mut(m).enumerate().for_each(|(row, grow)| {
            let (pl, c) = (row / k, row % k);
            diag_output_row(grow, ta(pl), &|o| tbo(pl, o), &d[c * no * m..(c + 1) * no * m], c, k, m, alpha);
        }),
        Layout::Trace => out.par_chunks_mut(m).enumerate().for_each(|(pl, grow)| {
            for c in 0..k {
                diag_output_row(grow, ta(pl), &|o| tbo(pl, o), &d[c * no * m..(c + 1) * no * m], c, k, m, alpha);
            }
        }),
    }
}

/// [`add_output_layer`] in `diag`/`trace` against a structured training side
/// ([`TrainDeltas::output`]): with `δ_i[c, o] = α w_{ic}(δ_co − q_{io})`,
/// `G[(p, c), i] += α·α_r w_{ic}(T_A[i](1 − q_{ic}) − T_B[c][i] + S[i])` where
/// `S[i] = Σ_o q_{io} T_B[o][i]` is shared by every class: 2K passes over M per row point.
///
/// # Shapes
/// `out` the accumulation rows of the block's points, `tb` `[nb·(K+1), M]` (per point T_A, then
/// T_B[0..K]).
fn soft_output_rows(out: &mut [f64], tb: &[f64], soft: &SoftTrain, layout: Layout, m: usize, k: usize, alpha: f64) {
    let k1 = k + 1;
    let scale = alpha * soft.alpha;
    assert!(layout != Layout::Full, "the full layout keeps the formed sensitivities");
    out.par_chunks_mut(m * layout.per_pair(k)).enumerate().for_each_init(
        || vec![0.0; m],
        |s, (pl, rows)| {
            let t = &tb[pl * k1 * m..(pl + 1) * k1 * m];
            let (ta, tbs) = t.split_at(m);
            s.iter_mut().for_each(|v| *v = 0.0);
            for o in 0..k {
                let (qo, tbo) = (&soft.q[o * m..(o + 1) * m], &tbs[o * m..(o + 1) * m]);
                for ((sv, &qv), &tv) in s.iter_mut().zip(qo).zip(tbo) {
                    *sv += qv * tv;
                }
            }
            for c in 0..k {
                let grow = match layout {
                    Layout::Diag => &mut rows[c * m..(c + 1) * m],
                    _ => &mut rows[..],
                };
                let (qc, tbc) = (&soft.q[c * m..(c + 1) * m], &tbs[c * m..(c + 1) * m]);
                match &soft.w {
                    None => {
                        for ((((g, &a), &qv), &b), &sv) in grow.iter_mut().zip(ta).zip(qc).zip(tbc).zip(s.iter()) {
                            *g += scale * (a * (1.0 - qv) - b + sv);
                        }
                    }
                    Some(w) => {
                        let wc = &w[c * m..(c + 1) * m];
                        for (((((g, &a), &qv), &b), &sv), &wv) in grow.iter_mut().zip(ta).zip(qc).zip(tbc).zip(s.iter()).zip(wc) {
                            *g += scale * wv * (a * (1.0 - qv) - b + sv);
                        }
                    }
                }
            }
        },
    );
}

/// `grow[(i, k')] += c · trow[i] · drow[(i, k')]`, with `trow` expanded over k' into `texp` so the
/// update is one contiguous, vectorisable pass.
fn expand_add(grow: &mut [f64], texp: &mut [f64], trow: &[f64], drow: &[f64], c: f64, k: usize) {
    for (chunk, &tv) in texp.chunks_exact_mut(k).zip(trow) {
        chunk.iter_mut().for_each(|v| *v = c * tv);
    }
    for ((g, &tv), &dv) in grow.iter_mut().zip(texp.iter()).zip(drow) {
        *g += tv * dv;
    }
}

/// `grow[i] += α(T_A[i] δ_i[c, c] − Σ_o T_B[o][i] δ_i[c, o])` with `dc` `[o, i]` = δ_i[c, o].
#[allow(clippy::too_many_arguments)]
fn diag_output_row<'a>(grow: &mut [f64], ta: &[f64], tbo: &dyn Fn(usize) -> &'a [f64], dc: &[f64], c: usize, k: usize, m: usize, alpha: f64) {
    for ((g, &a), &dv) in grow.iter_mut().zip(ta).zip(&dc[c * m..(c + 1) * m]) {
        *g += alpha * a * dv;
    }
    for o in 0..k {
        for ((g, &b), &dv) in grow.iter_mut().zip(tbo(o)).zip(&dc[o * m..(o + 1) * m]) {
            *g -= alpha * b * dv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rand_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
        (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
    }

    const LAYOUTS: [Layout; 3] = [Layout::Full, Layout::Diag, Layout::Trace];

    fn max_rel(a: &[f64], b: &[f64]) -> f64 {
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-300);
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
    }

    /// Obvious full Gram `[P, M, K, K]` of dense features.
    fn full_dense(rows: &[f64], train: &[f64], p: usize, m: usize, k: usize, dim: usize, s: Option<&[f64]>) -> Vec<f64> {
        let mut g = vec![0.0; p * m * k * k];
        for pi in 0..p {
            for i in 0..m {
                for a in 0..k {
                    for b in 0..k {
                        let r = &rows[(pi * k + a) * dim..(pi * k + a + 1) * dim];
                        let t = &train[(i * k + b) * dim..(i * k + b + 1) * dim];
                        let v: f64 = r.iter().zip(t).map(|(x, y)| x * y).sum();
                        g[((pi * m + i) * k + a) * k + b] = v * s.map_or(1.0, |s| s[pi * m + i]);
                    }
                }
            }
        }
        g
    }

    #[test]
    fn dense_layouts_match_the_full_gram() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (p, m, k, dim) = (5, 7, 3, 4);
        let rows = rand_vec(&mut rng, p * k * dim);
        let train = rand_vec(&mut rng, m * k * dim);
        let s = rand_vec(&mut rng, p * m);
        for scaled in [false, true] {
            let full = full_dense(&rows, &train, p, m, k, dim, if scaled { Some(&s) } else { None });
            for layout in LAYOUTS {
                let mut sink = GramSink::new(layout, p, m, k);
                // Two blocks of points, as the engines call it.
                let mut tmp = Vec::new();
                for (a, b) in [(0, 2), (2, 5)] {
                    let out = sink.rows_mut(a..b);
                    let (r, sb) = (&rows[a * k * dim..b * k * dim], &s[a * m..b * m]);
                    if scaled {
                        add_dense_scaled(layout, out, r, &train, sb, b - a, m, k, dim, &mut tmp);
                    } else {
                        add_dense(layout, out, r, &train, b - a, m, k, dim, 1.0);
                    }
                }
                let got = sink.finish();
                assert_eq!(got.len(), layout.shape(p, m, k).iter().product::<usize>());
                let want = layout.from_full(&full, p, m, k);
                assert!(max_rel(&got, &want) < 1e-14, "{layout} scaled={scaled}");
            }
        }
    }

    #[test]
    fn formed_layouts_match_the_full_gram() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let (p, m, k, no, ne) = (4, 6, 3, 5, 3);
        let j = rand_vec(&mut rng, p * k * no * ne);
        let a = rand_vec(&mut rng, m * ne);
        let delta = rand_vec(&mut rng, m * k * no);
        let colw = rand_vec(&mut rng, m * k);
        let mut full = vec![0.0; p * m * k * k];
        for pi in 0..p {
            for i in 0..m {
                for kt in 0..k {
                    for ks in 0..k {
                        let mut v = 0.0;
                        for o in 0..no {
                            let jr = &j[((pi * k + kt) * no + o) * ne..((pi * k + kt) * no + o + 1) * ne];
                            let ja: f64 = jr.iter().zip(&a[i * ne..(i + 1) * ne]).map(|(x, y)| x * y).sum();
                            v += ja * delta[(i * k + ks) * no + o] * colw[i * k + ks];
                        }
                        full[((pi * m + i) * k + kt) * k + ks] = v;
                    }
                }
            }
        }
        for layout in LAYOUTS {
            let dt = TrainDeltas::new(layout, &delta, m, k, no, Some(&colw));
            let mut sink = GramSink::new(layout, p, m, k);
            let mut t = Vec::new();
            for (a0, b0) in [(0, 1), (1, 4)] {
                add_formed(sink.rows_mut(a0..b0), &j[a0 * k * no * ne..b0 * k * no * ne], &a, &dt, b0 - a0, ne, &mut t);
            }
            let got = sink.finish();
            assert!(max_rel(&got, &layout.from_full(&full, p, m, k)) < 1e-14, "{layout}");
        }
    }

    #[test]
    fn structured_output_layer_matches_the_formed_contraction() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (p, m, k, ne, alpha) = (3, 5, 4, 3, 0.7);
        let colw = rand_vec(&mut rng, m * k);
        let a = rand_vec(&mut rng, m * ne);
        let delta = rand_vec(&mut rng, m * k * k);
        // Rows with a few nodes each: J̄[p,k,o,:] = Σ_r w_r α(δ_ko − q_ro) a_r, and [Ā; B̄].
        let mut j = vec![0.0; p * k * k * ne];
        let mut ab = vec![0.0; p * (k + 1) * ne];
        for pi in 0..p {
            for _ in 0..3 {
                let w: f64 = rng.gen_range(0.1..1.0);
                let ar = rand_vec(&mut rng, ne);
                let q: Vec<f64> = (0..k).map(|_| rng.gen_range(0.0..1.0)).collect();
                for kt in 0..k {
                    for o in 0..k {
                        let dl = alpha * (if kt == o { 1.0 } else { 0.0 } - q[o]);
                        for e in 0..ne {
                            j[((pi * k + kt) * k + o) * ne + e] += w * dl * ar[e];
                        }
                    }
                }
                for e in 0..ne {
                    ab[pi * (k + 1) * ne + e] += w * ar[e];
                    for o in 0..k {
                        ab[(pi * (k + 1) + 1 + o) * ne + e] += w * q[o] * ar[e];
                    }
                }
            }
        }
        for layout in LAYOUTS {
            let dt = TrainDeltas::new(layout, &delta, m, k, k, Some(&colw));
            let (mut g1, mut g2) = (GramSink::new(layout, p, m, k), GramSink::new(layout, p, m, k));
            let mut t = Vec::new();
            add_formed(g1.rows_mut(0..p), &j, &a, &dt, p, ne, &mut t);
            add_output_layer(g2.rows_mut(0..p), &ab, &a, &dt, p, ne, alpha, &mut t);
            let (x, y) = (g2.finish(), g1.finish());
            assert!(max_rel(&x, &y) < 1e-13, "{layout}: {:e}", max_rel(&x, &y));
        }
    }

    /// The structured training side ([`TrainDeltas::output`]) against the formed one, with and
    /// without Chen's weights, for training sensitivities of the softmax form.
    #[test]
    fn structured_training_side_matches_the_formed_one() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (p, m, k, ne, alpha) = (4, 7, 5, 3, 0.8);
        let a = rand_vec(&mut rng, m * ne);
        let ab = rand_vec(&mut rng, p * (k + 1) * ne);
        let mut delta = vec![0.0; m * k * k];
        for i in 0..m {
            let z: Vec<f64> = rand_vec(&mut rng, k).iter().map(|v| v.exp()).collect();
            let zs: f64 = z.iter().sum();
            for c in 0..k {
                for o in 0..k {
                    delta[(i * k + c) * k + o] = alpha * (if c == o { 1.0 } else { 0.0 } - z[o] / zs);
                }
            }
        }
        let colw = rand_vec(&mut rng, m * k);
        for layout in LAYOUTS {
            for cw in [None, Some(&colw[..])] {
                let (formed, soft) = (TrainDeltas::new(layout, &delta, m, k, k, cw), TrainDeltas::output(layout, &delta, m, k, cw, alpha));
                assert_eq!(soft.soft.is_some(), layout != Layout::Full);
                let (mut g1, mut g2) = (GramSink::new(layout, p, m, k), GramSink::new(layout, p, m, k));
                let mut t = Vec::new();
                add_output_layer(g1.rows_mut(0..p), &ab, &a, &formed, p, ne, 1.3, &mut t);
                add_output_layer(g2.rows_mut(0..p), &ab, &a, &soft, p, ne, 1.3, &mut t);
                let (x, y) = (g2.finish(), g1.finish());
                assert!(max_rel(&x, &y) < 1e-13, "{layout} {}: {:e}", cw.is_some(), max_rel(&x, &y));
            }
        }
    }

    #[test]
    fn layouts_parse_print_and_nest() {
        for l in LAYOUTS {
            assert_eq!(l.to_string().parse::<Layout>().unwrap(), l);
            assert!(Layout::Full.provides(l));
            assert!(l.provides(Layout::Trace));
        }
        assert!(!Layout::Diag.provides(Layout::Full));
        assert!(!Layout::Trace.provides(Layout::Diag));
        assert!("blocks".parse::<Layout>().is_err());
    }
}
