//! Analyses of kernel Gram matrices: which training points drive a prediction (EPK paper
//! Fig. 6), how far a kernel is from stationary (§4.2, Fig. 3) and how kernel values or GP
//! uncertainty behave far from the training data (Fig. 5).
//!
//! Conventions: a kernel output Gram is `gram [P, M, K, K]` row-major with
//! `gram[((p*M + i)*K + k)*K + k'] = K(x_p, x_i)[k, k']` (`k` the row point's output class, `k'`
//! the training point's). The kernel machine is
//! `f^k(x_p) = bias[p,k] + Σ_i Σ_k' a[i,k'] · gram[p,i,k,k']` with `a [M, K]`; with per-step
//! coefficients it is `bias + Σ_s Σ_i Σ_k' a[s,i,k'] · gram_steps[s,p,i,k,k']`.
//!
//! Everything here is pure, single-threaded Rust on slices and deterministic (seeded where
//! random).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};
use statrs::statistics::{Data, OrderStatistics, RankTieBreaker, Statistics};

use crate::error::{Error, Result};

// ---------------------------------------------------------------------------------------------
// Shape helpers
// ---------------------------------------------------------------------------------------------

/// Product of `dims`, or a configuration error on overflow.
fn numel(what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Config(format!("{what}: shape {dims:?} overflows usize")))
}

/// Checks that a flat slice of length `len` holds a tensor of shape `dims`.
fn check_len(what: &str, len: usize, dims: &[usize]) -> Result<()> {
    let n = numel(what, dims)?;
    if len != n {
        return Err(Error::ShapeMismatch {
            what: format!("{what} (flat length of shape {dims:?})"),
            expected: vec![n],
            got: vec![len],
        });
    }
    Ok(())
}

/// First non-finite entry of `v`, as a data error naming `what`.
fn check_finite(what: &str, v: &[f64]) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::Data(format!("{what}: non-finite value {} at flat index {i}", v[i]))),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Attribution (EPK paper Fig. 6)
// ---------------------------------------------------------------------------------------------

/// Per-training-point contributions of a single kernel machine:
/// `c[p, i, k] = Σ_k' a[i, k'] · gram[p, i, k, k']`, so that
/// `f^k(x_p) = bias[p, k] + Σ_i c[p, i, k]`.
///
/// # Shapes
/// `gram [P, M, K, K]`, `a [M, K]` → `[P, M, K]`.
///
/// # Errors
/// [`Error::ShapeMismatch`] when a slice length does not match its shape.
pub fn contributions(gram: &[f64], a: &[f64], p: usize, m: usize, k: usize) -> Result<Vec<f64>> {
    check_len("contributions: gram [P, M, K, K]", gram.len(), &[p, m, k, k])?;
    check_len("contributions: a [M, K]", a.len(), &[m, k])?;
    let mut out = vec![0.0; p * m * k];
    for pi in 0..p {
        for i in 0..m {
            let ai = &a[i * k..(i + 1) * k];
            for kk in 0..k {
                let row = &gram[((pi * m + i) * k + kk) * k..][..k];
                out[(pi * m + i) * k + kk] = row.iter().zip(ai).map(|(g, a)| g * a).sum();
            }
        }
    }
    Ok(out)
}

/// Per-training-point contributions of the ensemble (per-step) kernel machine:
/// `c[p, i, k] = Σ_s Σ_k' a[s, i, k'] · gram_steps[s, p, i, k, k']`, so that
/// `f^k(x_p) = bias[p, k] + Σ_i c[p, i, k]`. Steps are summed in order `s = 0, 1, …`.
///
/// # Shapes
/// `gram_steps [S, P, M, K, K]`, `a_steps [S, M, K]` → `[P, M, K]`.
///
/// # Errors
/// [`Error::ShapeMismatch`] when a slice length does not match its shape.
pub fn contributions_per_step(
    gram_steps: &[f64],
    a_steps: &[f64],
    s: usize,
    p: usize,
    m: usize,
    k: usize,
) -> Result<Vec<f64>> {
    check_len("contributions_per_step: gram_steps [S, P, M, K, K]", gram_steps.len(), &[s, p, m, k, k])?;
    check_len("contributions_per_step: a_steps [S, M, K]", a_steps.len(), &[s, m, k])?;
    let mut out = vec![0.0; p * m * k];
    let step_len = p * m * k * k;
    for si in 0..s {
        let g = &gram_steps[si * step_len..(si + 1) * step_len];
        let a = &a_steps[si * m * k..(si + 1) * m * k];
        for pi in 0..p {
            for i in 0..m {
                let ai = &a[i * k..(i + 1) * k];
                for kk in 0..k {
                    let row = &g[((pi * m + i) * k + kk) * k..][..k];
                    let v: f64 = row.iter().zip(ai).map(|(g, a)| g * a).sum();
                    out[(pi * m + i) * k + kk] += v;
                }
            }
        }
    }
    Ok(out)
}

/// How one output `f^class(x_point)` decomposes over the training points.
///
/// # Shapes
/// Scalars for one (point, class); `supporters` and `opponents` hold at most `top`
/// `(training index i, contribution c[point, i, class])` pairs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attribution {
    /// Row point index `p` (into the `P` rows of the Gram).
    pub point: usize,
    /// Output class `k` of the row point.
    pub class: usize,
    /// The network's output `f^k(x_p)` (as given, e.g. the logit or log-probability).
    pub output: f64,
    /// The kernel machine's bias `b[p, k]` (the network at the initial weights).
    pub bias: f64,
    /// `Σ_i c[p, i, k]`: what the training points contribute in total.
    pub total: f64,
    /// `output − bias − total`: zero (to rounding) when the kernel machine is exact.
    pub residual: f64,
    /// Up to `top` strictly positive contributions, largest first (ties: lower index first).
    pub supporters: Vec<(usize, f64)>,
    /// Up to `top` strictly negative contributions, most negative first (ties: lower index first).
    pub opponents: Vec<(usize, f64)>,
}

/// For the chosen row points and every class: total contribution of the training points, the
/// residual against the network output, and the `top` strongest supporters and opponents.
///
/// Results are ordered point-major (the order of `points`), then by class `0..K`.
///
/// # Shapes
/// `contrib [P, M, K]` (from [`contributions`] or [`contributions_per_step`]), `bias [P, K]`,
/// `network [P, K]`, `points` indices into `0..P` → `len(points) · K` attributions.
///
/// # Errors
/// [`Error::ShapeMismatch`] for wrong lengths, [`Error::Config`] for a point index out of range,
/// [`Error::Data`] for non-finite values in the rows used.
#[allow(clippy::too_many_arguments)]
pub fn attribute(
    contrib: &[f64],
    bias: &[f64],
    network: &[f64],
    points: &[usize],
    p: usize,
    m: usize,
    k: usize,
    top: usize,
) -> Result<Vec<Attribution>> {
    check_len("attribute: contrib [P, M, K]", contrib.len(), &[p, m, k])?;
    check_len("attribute: bias [P, K]", bias.len(), &[p, k])?;
    check_len("attribute: network [P, K]", network.len(), &[p, k])?;
    let mut out = Vec::with_capacity(points.len() * k);
    for &pt in points {
        if pt >= p {
            return Err(Error::Config(format!("attribute: point index {pt} out of range (P = {p})")));
        }
        let rows = &contrib[pt * m * k..(pt + 1) * m * k];
        check_finite(&format!("attribute: contributions of point {pt}"), rows)?;
        check_finite(&format!("attribute: bias of point {pt}"), &bias[pt * k..(pt + 1) * k])?;
        check_finite(&format!("attribute: network output of point {pt}"), &network[pt * k..(pt + 1) * k])?;
        for class in 0..k {
            let c = |i: usize| rows[i * k + class];
            let total: f64 = (0..m).map(c).sum();
            let mut pos: Vec<(usize, f64)> = (0..m).map(|i| (i, c(i))).filter(|&(_, v)| v > 0.0).collect();
            pos.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
            pos.truncate(top);
            let mut neg: Vec<(usize, f64)> = (0..m).map(|i| (i, c(i))).filter(|&(_, v)| v < 0.0).collect();
            neg.sort_by(|x, y| x.1.total_cmp(&y.1).then(x.0.cmp(&y.0)));
            neg.truncate(top);
            let output = network[pt * k + class];
            let b = bias[pt * k + class];
            out.push(Attribution {
                point: pt,
                class,
                output,
                bias: b,
                total,
                residual: output - b - total,
                supporters: pos,
                opponents: neg,
            });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Stationarity (EPK paper §4.2)
// ---------------------------------------------------------------------------------------------

/// Options of [`stationarity`].
///
/// # Shapes
/// Scalars.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StationarityOptions {
    /// Bins per axis of the displacement grid (d ≤ 3) or of the distance axis (d > 3) used by
    /// the binned diagnostics (`binned_r2`, `relative_spread`, `bins_used`); the headline score
    /// does not bin. Default 24 (see [`Stationarity::binned_r2`] for why not fewer).
    pub bins: usize,
    /// Bins with fewer pairs are left out of the binned diagnostics. Default 5.
    pub min_pairs_per_bin: usize,
    /// When the `N(N−1)/2` unordered pairs exceed this, a seeded uniform sample of this many
    /// distinct pairs is analysed. Default 200 000 (all pairs up to N = 632).
    pub max_pairs: usize,
    /// Seed of the pair subsample (ChaCha8).
    pub seed: u64,
}

impl Default for StationarityOptions {
    fn default() -> Self {
        Self { bins: 24, min_pairs_per_bin: 5, max_pairs: 200_000, seed: 0 }
    }
}

/// How far a scalar kernel on a point set is from stationary (a function of `x' − x` only).
///
/// **Definition.** Take unordered pairs `i < j` (the diagonal is excluded), the symmetrised value
/// `v_ij = (G[i,j] + G[j,i]) / 2` and the displacement `δ_ij = x_j − x_i`, sign-canonicalised so
/// that its first non-zero component is positive (`(x, x')` and `(x', x)` coincide). The part of
/// `v` that no function of the displacement can explain is estimated by *pair matching*: each
/// pair is predicted from its nearest pairs in displacement space that share no point with it
/// (a local-linear fit on the `2(q+1)` nearest such pairs in the `q`-dimensional feature space;
/// in one dimension, linear interpolation between the nearest such pair on either side), and
/// `σ²_loc = mean_t (v_t − v̂_t)² / (1 + Σ_c w_tc²)` where `w_tc` are the fit's weights on the
/// neighbours (the divisor makes `σ²_loc` unbiased for the location-driven scatter). Then
///
/// - `R² = 1 − σ²_loc / Var(v)`: the share of the variance of kernel values explained by the
///   displacement (`displacement_r2`) or by the distance `|x − x'|` (`distance_r2`),
/// - **`score = 1 − sqrt(1 − R²)`** (clamped to `[0, 1]`), i.e. one minus the RMS error of the
///   best stationary fit relative to the standard deviation of the kernel values, with
///   `R² = displacement_r2` for `d ≤ 3` and `distance_r2` for `d > 3`.
///
/// The square root makes the score discriminative: a kernel whose location dependence carries
/// 30 % of its variance (the linear kernel on centred data, `x·x' = |c|² − |δ|²/4` with
/// `c` the pair's midpoint) scores ≈ 0.45, not 0.7. A constant kernel scores 1.
///
/// Because the matching adapts to the density of pairs, the score is not limited by a binning
/// resolution; it does need the kernel's variation with displacement to be resolved by the
/// pairs (length scales not far below the typical nearest-neighbour spacing of the points).
///
/// # Shapes
/// Scalars; `bins_used` and `pairs_used` are counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stationarity {
    /// Headline, in `[0, 1]`, 1 = stationary: `1 − sqrt(1 − R²)` (see the type's docs).
    pub score: f64,
    /// Pair-matched share of variance explained by the displacement (`d ≤ 3`; NaN, serialised
    /// as `null` by serde_json, when `d > 3`). May be negative for kernels with no displacement
    /// structure at all.
    pub displacement_r2: f64,
    /// Pair-matched share of variance explained by the distance `|x − x'|` (all `d`).
    pub distance_r2: f64,
    /// Binned diagnostic on the same feature as the score (displacement for `d ≤ 3`, distance
    /// for `d > 3`): adjusted R² of the bin means,
    /// `1 − (SS_within / (n − B)) / (SS_total / (n − 1))` over the `n` pairs in the `B` bins with
    /// at least `min_pairs_per_bin` pairs. It is limited by the bin width (for an RBF kernel of
    /// length scale 0.1 on the unit square it is ≈ 0.85 at 12 bins per axis, 0.96 at 24, 0.99 at
    /// 48), which is why the headline uses pair matching. NaN when no bin qualifies.
    pub binned_r2: f64,
    /// Binned diagnostic: `sqrt(SS_within / Σ v²)` over the used bins, the pooled within-bin
    /// RMS deviation relative to the RMS kernel value, in `[0, 1]` (0 = the value is the same at
    /// every location for a given displacement, up to bin width). NaN when no bin qualifies.
    pub relative_spread: f64,
    /// Number of bins with at least `min_pairs_per_bin` pairs.
    pub bins_used: usize,
    /// Number of pairs analysed (all `N(N−1)/2`, or `max_pairs` sampled ones).
    pub pairs_used: usize,
}

impl std::fmt::Display for Stationarity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stationarity score {:.3} (1 = a function of x' − x only); share of variance explained: by the displacement {:.3}, by the distance {:.3}; {} pairs",
            self.score, self.displacement_r2, self.distance_r2, self.pairs_used
        )
    }
}

/// Stationarity of a scalar kernel on `N` points: see [`Stationarity`] for the definition.
///
/// `gram` may be asymmetric (as the EPK is); its symmetric part is analysed.
///
/// # Shapes
/// `x [N, d]`, `gram [N, N]` (a scalar kernel on the N points, e.g. one class block or the trace
/// over classes) → one [`Stationarity`].
///
/// # Errors
/// [`Error::Config`] for `d = 0`, `bins = 0` or `max_pairs < 4`; [`Error::ShapeMismatch`] for
/// wrong lengths; [`Error::Data`] for fewer than 4 points or non-finite values.
pub fn stationarity(x: &[f64], gram: &[f64], n: usize, d: usize, opts: &StationarityOptions) -> Result<Stationarity> {
    if d == 0 {
        return Err(Error::Config("stationarity: dimension d must be positive".into()));
    }
    if opts.bins == 0 || opts.bins > (1 << 20) {
        return Err(Error::Config(format!("stationarity: bins must be in 1..=2^20, got {}", opts.bins)));
    }
    if opts.max_pairs < 4 {
        return Err(Error::Config(format!("stationarity: max_pairs must be at least 4, got {}", opts.max_pairs)));
    }
    check_len("stationarity: x [N, d]", x.len(), &[n, d])?;
    check_len("stationarity: gram [N, N]", gram.len(), &[n, n])?;
    if n < 4 {
        return Err(Error::Data(format!("stationarity: need at least 4 points, got {n}")));
    }
    if n > u32::MAX as usize {
        return Err(Error::Data(format!("stationarity: too many points ({n})")));
    }
    check_finite("stationarity: x", x)?;
    check_finite("stationarity: gram", gram)?;

    let pairs = select_pairs(n, opts.max_pairs, opts.seed);
    let np = pairs.len();
    let mut values = Vec::with_capacity(np);
    let mut dist = Vec::with_capacity(np);
    let q = if d <= 3 { d } else { 0 };
    let mut disp = Vec::with_capacity(np * q);
    let mut delta = vec![0.0; d];
    for &[i, j] in &pairs {
        let (i, j) = (i as usize, j as usize);
        values.push(0.5 * (gram[i * n + j] + gram[j * n + i]));
        for (a, dl) in delta.iter_mut().enumerate() {
            *dl = x[j * d + a] - x[i * d + a];
        }
        dist.push(delta.iter().map(|v| v * v).sum::<f64>().sqrt());
        if q > 0 {
            let flip = delta.iter().find(|v| **v != 0.0).is_some_and(|v| *v < 0.0);
            disp.extend(delta.iter().map(|v| if flip { -v } else { *v }));
        }
    }

    let var = variance(&values);
    let scale = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    // A kernel constant up to rounding is trivially stationary.
    let constant = var <= (1e-14 * scale).powi(2);
    let r2 = |sigma2: f64| if constant { 1.0 } else { 1.0 - sigma2 / var };

    let distance_r2 = r2(matched_residual_1d(&dist, &values, &pairs)?);
    let displacement_r2 = match q {
        0 => f64::NAN,
        1 => distance_r2, // in 1-D the canonical displacement is the distance
        _ => r2(matched_residual_kd(&disp, q, &values, &pairs)?),
    };
    let primary = if q > 0 { displacement_r2 } else { distance_r2 };
    let score = (1.0 - (1.0 - primary).max(0.0).sqrt()).clamp(0.0, 1.0);

    let (feat, fq) = if q > 0 { (&disp, q) } else { (&dist, 1) };
    let binned = binned_stats(feat, fq, &values, opts.bins, opts.min_pairs_per_bin.max(1));
    Ok(Stationarity {
        score,
        displacement_r2,
        distance_r2,
        binned_r2: if constant && binned.bins_used > 0 { 1.0 } else { binned.r2 },
        relative_spread: binned.relative_spread,
        bins_used: binned.bins_used,
        pairs_used: np,
    })
}

/// Unordered pairs `i < j`: all of them in row-major order, or a seeded sample of `max_pairs`
/// distinct ones (sorted) when there are more.
fn select_pairs(n: usize, max_pairs: usize, seed: u64) -> Vec<[u32; 2]> {
    let total = n * (n - 1) / 2;
    if total <= max_pairs {
        let mut out = Vec::with_capacity(total);
        for i in 0..n {
            for j in i + 1..n {
                out.push([i as u32, j as u32]);
            }
        }
        return out;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut lin = rand::seq::index::sample(&mut rng, total, max_pairs).into_vec();
    lin.sort_unstable();
    // Row i starts at off(i) = i·n − i(i+1)/2 in the row-major upper triangle.
    let off = |i: usize| i * n - i * (i + 1) / 2;
    lin.into_iter()
        .map(|l| {
            let (mut lo, mut hi) = (0usize, n - 1); // largest i with off(i) <= l
            while lo + 1 < hi {
                let mid = (lo + hi) / 2;
                if off(mid) <= l {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            let i = lo;
            let j = l - off(i) + i + 1;
            [i as u32, j as u32]
        })
        .collect()
}

/// Population variance `Σ (v − v̄)² / n` (statrs; NaN for no values).
fn variance(v: &[f64]) -> f64 {
    Statistics::population_variance(v)
}

fn disjoint(a: [u32; 2], b: [u32; 2]) -> bool {
    a[0] != b[0] && a[0] != b[1] && a[1] != b[0] && a[1] != b[1]
}

/// How far to look, in sorted order, for a neighbour that shares no point with the query.
const SCAN_1D: usize = 256;

/// Location-driven variance by linear interpolation along a scalar feature between the nearest
/// point-disjoint pair on either side (one side only at the ends: nearest-neighbour prediction).
fn matched_residual_1d(f: &[f64], v: &[f64], pairs: &[[u32; 2]]) -> Result<f64> {
    let mut order: Vec<usize> = (0..f.len()).collect();
    order.sort_by(|&a, &b| f[a].total_cmp(&f[b]).then(a.cmp(&b)));
    let (mut acc, mut cnt) = (0.0, 0usize);
    for r in 0..order.len() {
        let t = order[r];
        let left = (r.saturating_sub(SCAN_1D)..r).rev().map(|s| order[s]).find(|&c| disjoint(pairs[t], pairs[c]));
        let right =
            (r + 1..(r + 1 + SCAN_1D).min(order.len())).map(|s| order[s]).find(|&c| disjoint(pairs[t], pairs[c]));
        let (pred, norm) = match (left, right) {
            (Some(l), Some(h)) => {
                let span = f[h] - f[l];
                let wl = if span > 0.0 { (f[h] - f[t]) / span } else { 0.5 };
                let wh = 1.0 - wl;
                (wl * v[l] + wh * v[h], 1.0 + wl * wl + wh * wh)
            }
            (Some(c), None) | (None, Some(c)) => (v[c], 2.0),
            (None, None) => continue,
        };
        acc += (v[t] - pred).powi(2) / norm;
        cnt += 1;
    }
    if cnt == 0 {
        return Err(Error::Data("stationarity: no pair has a point-disjoint neighbour".into()));
    }
    Ok(acc / cnt as f64)
}

/// Location-driven variance by a leave-one-out local-linear fit on the `2(q+1)` nearest
/// point-disjoint pairs in the `q`-dimensional feature space (q = 2 or 3).
fn matched_residual_kd(f: &[f64], q: usize, v: &[f64], pairs: &[[u32; 2]]) -> Result<f64> {
    let kn = 2 * (q + 1);
    let tree = KdTree::new(f, q);
    let mut found: Vec<(f64, usize)> = Vec::with_capacity(kn + 1);
    let mut w: Vec<f64> = Vec::with_capacity(kn);
    let (mut acc, mut cnt) = (0.0, 0usize);
    for t in 0..v.len() {
        let ft = &f[t * q..(t + 1) * q];
        tree.knn(ft, kn, |c| c != t && disjoint(pairs[t], pairs[c]), &mut found);
        if found.is_empty() {
            continue;
        }
        local_linear_weights(f, q, ft, &found, &mut w);
        let pred: f64 = found.iter().zip(&w).map(|(&(_, c), wc)| wc * v[c]).sum();
        let norm = 1.0 + w.iter().map(|x| x * x).sum::<f64>();
        acc += (v[t] - pred).powi(2) / norm;
        cnt += 1;
    }
    if cnt == 0 {
        return Err(Error::Data("stationarity: no pair has a point-disjoint neighbour".into()));
    }
    Ok(acc / cnt as f64)
}

/// Weights `w` of the local-linear prediction at `ft` from the neighbours `found`
/// (value at ft = Σ w_c v_c): intercept of a least-squares plane in the neighbours' features
/// centred at `ft` and scaled to unit radius, with a tiny ridge on the slopes. Falls back to the
/// plain mean when the neighbours are too few or all at the query's position.
#[allow(clippy::needless_range_loop)] // small dense matrix algebra reads best with indices
fn local_linear_weights(f: &[f64], q: usize, ft: &[f64], found: &[(f64, usize)], w: &mut Vec<f64>) {
    w.clear();
    let nf = found.len();
    let radius = found.iter().fold(0.0f64, |m, &(d2, _)| m.max(d2)).sqrt();
    let uniform = |w: &mut Vec<f64>| {
        w.clear();
        w.resize(nf, 1.0 / nf as f64);
    };
    if nf < q + 1 || radius <= 0.0 {
        return uniform(w);
    }
    let p = q + 1;
    let row = |c: usize, a: usize| if a == 0 { 1.0 } else { (f[c * q + a - 1] - ft[a - 1]) / radius };
    // M = AᵀA + λ·diag(0, 1, …, 1); solve M z = e0.
    let mut mtx = [[0.0f64; 5]; 4];
    for &(_, c) in found {
        for a in 0..p {
            for b in 0..p {
                mtx[a][b] += row(c, a) * row(c, b);
            }
        }
    }
    let lambda = 1e-6 * nf as f64;
    for (a, r) in mtx.iter_mut().enumerate().take(p).skip(1) {
        r[a] += lambda;
    }
    mtx[0][p] = 1.0;
    // Gaussian elimination with partial pivoting on the augmented p × (p+1) system.
    for col in 0..p {
        let piv = (col..p).max_by(|&a, &b| mtx[a][col].abs().total_cmp(&mtx[b][col].abs())).unwrap_or(col);
        if mtx[piv][col].abs() < 1e-12 {
            return uniform(w);
        }
        mtx.swap(col, piv);
        for r in 0..p {
            if r != col {
                let fct = mtx[r][col] / mtx[col][col];
                for c2 in col..=p {
                    mtx[r][c2] -= fct * mtx[col][c2];
                }
            }
        }
    }
    let z: Vec<f64> = (0..p).map(|a| mtx[a][p] / mtx[a][a]).collect();
    for &(_, c) in found {
        w.push((0..p).map(|a| row(c, a) * z[a]).sum());
    }
    if w.iter().any(|x| !x.is_finite()) {
        uniform(w);
    }
}

/// Binned diagnostics of [`Stationarity`].
struct Binned {
    r2: f64,
    relative_spread: f64,
    bins_used: usize,
}

/// Bins the `q`-dimensional features on a `bins^q` grid over their range and reports the
/// adjusted R² of the bin means and the pooled relative within-bin spread over bins with at
/// least `min_pairs` pairs.
fn binned_stats(f: &[f64], q: usize, v: &[f64], bins: usize, min_pairs: usize) -> Binned {
    let n = v.len();
    let mut lo = vec![f64::INFINITY; q];
    let mut hi = vec![f64::NEG_INFINITY; q];
    for t in 0..n {
        for a in 0..q {
            lo[a] = lo[a].min(f[t * q + a]);
            hi[a] = hi[a].max(f[t * q + a]);
        }
    }
    let mut keyed: Vec<(u64, usize)> = (0..n)
        .map(|t| {
            let mut key = 0u64;
            for a in 0..q {
                let span = hi[a] - lo[a];
                let idx = if span > 0.0 { (((f[t * q + a] - lo[a]) / span) * bins as f64) as usize } else { 0 };
                key = key * bins as u64 + idx.min(bins - 1) as u64;
            }
            (key, t)
        })
        .collect();
    keyed.sort_unstable();
    // Per used bin: Welford mean and M2; pooled sums over used pairs.
    let (mut ss_within, mut sum_sq, mut used_pairs, mut bins_used) = (0.0, 0.0, 0usize, 0usize);
    let mut used_vals: Vec<f64> = Vec::new();
    let mut start = 0;
    while start < n {
        let mut end = start;
        while end < n && keyed[end].0 == keyed[start].0 {
            end += 1;
        }
        if end - start >= min_pairs {
            let (mut mean, mut m2) = (0.0, 0.0);
            for (cnt, &(_, t)) in keyed[start..end].iter().enumerate() {
                let x = v[t];
                let dlt = x - mean;
                mean += dlt / (cnt + 1) as f64;
                m2 += dlt * (x - mean);
                sum_sq += x * x;
                used_vals.push(x);
            }
            ss_within += m2;
            used_pairs += end - start;
            bins_used += 1;
        }
        start = end;
    }
    if bins_used == 0 {
        return Binned { r2: f64::NAN, relative_spread: f64::NAN, bins_used: 0 };
    }
    let ss_total = variance(&used_vals) * used_pairs as f64;
    let r2 = if ss_total <= 0.0 {
        1.0
    } else if used_pairs > bins_used {
        1.0 - (ss_within / (used_pairs - bins_used) as f64) / (ss_total / (used_pairs - 1) as f64)
    } else {
        f64::NAN
    };
    let relative_spread = if sum_sq > 0.0 { (ss_within / sum_sq).max(0.0).sqrt() } else { 0.0 };
    Binned { r2, relative_spread, bins_used }
}

/// Static k-d tree over `n` points of dimension `q` stored row-major in `f` (median splits,
/// cycling axes, leaves of up to [`KdTree::LEAF`] points).
struct KdTree<'a> {
    f: &'a [f64],
    q: usize,
    idx: Vec<u32>,
}

impl<'a> KdTree<'a> {
    const LEAF: usize = 8;

    fn new(f: &'a [f64], q: usize) -> Self {
        let n = f.len() / q;
        let mut idx: Vec<u32> = (0..n as u32).collect();
        Self::build(f, q, &mut idx, 0);
        Self { f, q, idx }
    }

    fn build(f: &[f64], q: usize, idx: &mut [u32], depth: usize) {
        if idx.len() <= Self::LEAF {
            return;
        }
        let mid = idx.len() / 2;
        let dim = depth % q;
        idx.select_nth_unstable_by(mid, |&a, &b| {
            f[a as usize * q + dim].total_cmp(&f[b as usize * q + dim]).then(a.cmp(&b))
        });
        let (l, r) = idx.split_at_mut(mid);
        Self::build(f, q, l, depth + 1);
        Self::build(f, q, &mut r[1..], depth + 1);
    }

    /// The `k` nearest accepted points to `qp`, as (squared distance, index), nearest first.
    fn knn(&self, qp: &[f64], k: usize, accept: impl Fn(usize) -> bool, out: &mut Vec<(f64, usize)>) {
        out.clear();
        if k > 0 {
            self.search(0, self.idx.len(), 0, qp, k, &accept, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        lo: usize,
        hi: usize,
        depth: usize,
        qp: &[f64],
        k: usize,
        accept: &impl Fn(usize) -> bool,
        out: &mut Vec<(f64, usize)>,
    ) {
        if hi - lo <= Self::LEAF {
            for &p in &self.idx[lo..hi] {
                self.consider(p as usize, qp, k, accept, out);
            }
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let p = self.idx[mid] as usize;
        let dim = depth % self.q;
        let diff = qp[dim] - self.f[p * self.q + dim];
        self.consider(p, qp, k, accept, out);
        let (first, second) = if diff < 0.0 { ((lo, mid), (mid + 1, hi)) } else { ((mid + 1, hi), (lo, mid)) };
        self.search(first.0, first.1, depth + 1, qp, k, accept, out);
        if out.len() < k || diff * diff <= out[out.len() - 1].0 {
            self.search(second.0, second.1, depth + 1, qp, k, accept, out);
        }
    }

    fn consider(&self, p: usize, qp: &[f64], k: usize, accept: &impl Fn(usize) -> bool, out: &mut Vec<(f64, usize)>) {
        let d2: f64 = (0..self.q).map(|a| (self.f[p * self.q + a] - qp[a]).powi(2)).sum();
        if out.len() == k {
            let worst = out[k - 1];
            if d2 > worst.0 || (d2 == worst.0 && p > worst.1) {
                return;
            }
        }
        if !accept(p) {
            return;
        }
        let pos = out.partition_point(|&(e, i)| e < d2 || (e == d2 && i < p));
        out.insert(pos, (d2, p));
        out.truncate(k);
    }
}

// ---------------------------------------------------------------------------------------------
// Far field (EPK paper Fig. 5)
// ---------------------------------------------------------------------------------------------

/// Points along rays from the training data's centroid: `n_dirs` unit directions (for `d = 2`
/// evenly spaced angles `2π r / n_dirs`, starting along +x; for `d = 1` alternately +1 and −1;
/// for `d ≥ 3` seeded Gaussian vectors, normalised, ChaCha8 with `seed`), at distances
/// `r_j = r0 · growth^j` for `j = 0..n_steps` (exclusive: `n_steps` radii per ray), where
/// `r0 = sqrt(mean_i |x_i − centroid|²)` is the data's RMS radius.
///
/// Rows are ray-major: row `r · n_steps + j` is step `j` of ray `r`. `growth > 1` walks outwards.
///
/// # Shapes
/// `x_train [M, d]` → (`points [R, d]`, `ray [R]` ray index, `radius [R]` distance from the
/// centroid), `R = n_dirs · n_steps`.
///
/// # Errors
/// [`Error::Config`] for `d = 0`, `n_dirs = 0`, `n_steps = 0` or a non-finite or non-positive
/// `growth`; [`Error::ShapeMismatch`] for a wrong length; [`Error::Data`] for no points,
/// non-finite coordinates or all points identical (`r0 = 0`).
#[allow(clippy::type_complexity)]
pub fn ray_points(
    x_train: &[f64],
    m: usize,
    d: usize,
    n_dirs: usize,
    n_steps: usize,
    growth: f64,
    seed: u64,
) -> Result<(Vec<f64>, Vec<usize>, Vec<f64>)> {
    if d == 0 || n_dirs == 0 || n_steps == 0 {
        return Err(Error::Config(format!(
            "ray_points: d, n_dirs and n_steps must be positive (got {d}, {n_dirs}, {n_steps})"
        )));
    }
    if !(growth.is_finite() && growth > 0.0) {
        return Err(Error::Config(format!("ray_points: growth must be finite and positive, got {growth}")));
    }
    check_len("ray_points: x_train [M, d]", x_train.len(), &[m, d])?;
    if m == 0 {
        return Err(Error::Data("ray_points: no training points".into()));
    }
    check_finite("ray_points: x_train", x_train)?;
    let mut centroid = vec![0.0; d];
    for row in x_train.chunks_exact(d) {
        for (c, v) in centroid.iter_mut().zip(row) {
            *c += v;
        }
    }
    centroid.iter_mut().for_each(|c| *c /= m as f64);
    let ms: f64 = x_train
        .chunks_exact(d)
        .map(|row| row.iter().zip(&centroid).map(|(v, c)| (v - c) * (v - c)).sum::<f64>())
        .sum::<f64>()
        / m as f64;
    let r0 = ms.sqrt();
    if r0 <= 0.0 {
        return Err(Error::Data("ray_points: all training points coincide (RMS radius 0)".into()));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let r_total = numel("ray_points: R", &[n_dirs, n_steps])?;
    let mut points = Vec::with_capacity(r_total * d);
    let mut ray = Vec::with_capacity(r_total);
    let mut radius = Vec::with_capacity(r_total);
    for r in 0..n_dirs {
        let dir: Vec<f64> = match d {
            1 => vec![if r % 2 == 0 { 1.0 } else { -1.0 }],
            2 => {
                let th = 2.0 * std::f64::consts::PI * r as f64 / n_dirs as f64;
                vec![th.cos(), th.sin()]
            }
            _ => loop {
                let g: Vec<f64> = (0..d).map(|_| StandardNormal.sample(&mut rng)).collect();
                let norm = g.iter().map(|v| v * v).sum::<f64>().sqrt();
                if norm > 1e-12 {
                    break g.into_iter().map(|v| v / norm).collect();
                }
            },
        };
        for j in 0..n_steps {
            let rad = r0 * growth.powi(j as i32);
            points.extend(centroid.iter().zip(&dir).map(|(c, u)| c + rad * u));
            ray.push(r);
            radius.push(rad);
        }
    }
    Ok((points, ray, radius))
}

/// Euclidean distance from each point to its nearest training point (brute force, `O(R·M·d)`).
///
/// # Shapes
/// `points [R, d]`, `x_train [M, d]` → `[R]`.
///
/// # Errors
/// [`Error::Config`] for `d = 0`; [`Error::ShapeMismatch`] when a length is not a multiple of
/// `d`; [`Error::Data`] for no training points or non-finite coordinates.
pub fn nearest_distance(points: &[f64], x_train: &[f64], d: usize) -> Result<Vec<f64>> {
    if d == 0 {
        return Err(Error::Config("nearest_distance: dimension d must be positive".into()));
    }
    for (what, v) in [("nearest_distance: points [R, d]", points), ("nearest_distance: x_train [M, d]", x_train)] {
        if v.len() % d != 0 {
            return Err(Error::ShapeMismatch {
                what: format!("{what} (flat length must be a multiple of d = {d})"),
                expected: vec![v.len() / d * d, d],
                got: vec![v.len()],
            });
        }
    }
    if x_train.is_empty() {
        return Err(Error::Data("nearest_distance: no training points".into()));
    }
    check_finite("nearest_distance: points", points)?;
    check_finite("nearest_distance: x_train", x_train)?;
    Ok(points
        .chunks_exact(d)
        .map(|p| {
            x_train
                .chunks_exact(d)
                .map(|t| p.iter().zip(t).map(|(a, b)| (a - b) * (a - b)).sum::<f64>())
                .fold(f64::INFINITY, f64::min)
                .sqrt()
        })
        .collect())
}

/// One bin of a [`Profile`].
///
/// # Shapes
/// Scalars.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProfileRow {
    /// Lower bin edge (0 for the first bin when some distance is 0).
    pub lo: f64,
    /// Upper bin edge.
    pub hi: f64,
    /// Number of points in the bin.
    pub count: usize,
    /// Mean value in the bin (NaN when `count = 0`).
    pub mean: f64,
    /// Smallest value in the bin (NaN when `count = 0`).
    pub min: f64,
    /// Largest value in the bin (NaN when `count = 0`).
    pub max: f64,
}

/// A per-point value binned against distance (see [`profile`]).
///
/// # Shapes
/// `rows [bins]` (or 1 row when all distances are equal).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Profile {
    /// Log-spaced bins, increasing distance; empty bins are kept (count 0).
    pub rows: Vec<ProfileRow>,
    /// Spearman rank correlation between distance and value (average ranks for ties): > 0 when
    /// the value grows far from the data, < 0 when it shrinks. NaN when either is constant.
    pub spearman: f64,
}

/// Binned profile of a per-point value (e.g. kernel diagonal, GP std) against a per-point
/// distance (e.g. [`nearest_distance`] or the ray radius).
///
/// Bins are log-spaced: edges `e_b = lo · (hi/lo)^(b/bins)`, `b = 0..=bins`, between the smallest
/// positive distance `lo` and the largest `hi`; a point falls in bin `b` when
/// `e_b ≤ distance < e_{b+1}` (the last bin includes `hi`); zero distances go to the first bin,
/// whose lower edge is then reported as 0. When all distances are equal there is one bin.
///
/// # Shapes
/// `distance [R]`, `value [R]` → [`Profile`] with `bins` rows.
///
/// # Errors
/// [`Error::Config`] for `bins = 0`; [`Error::ShapeMismatch`] for different lengths;
/// [`Error::Data`] for no points, non-finite values or negative distances.
pub fn profile(distance: &[f64], value: &[f64], bins: usize) -> Result<Profile> {
    if bins == 0 {
        return Err(Error::Config("profile: bins must be positive".into()));
    }
    if distance.len() != value.len() {
        return Err(Error::ShapeMismatch {
            what: "profile: value [R] against distance [R]".into(),
            expected: vec![distance.len()],
            got: vec![value.len()],
        });
    }
    if distance.is_empty() {
        return Err(Error::Data("profile: no points".into()));
    }
    check_finite("profile: distance", distance)?;
    check_finite("profile: value", value)?;
    if let Some(i) = distance.iter().position(|&x| x < 0.0) {
        return Err(Error::Data(format!("profile: negative distance {} at index {i}", distance[i])));
    }
    let hi = distance.iter().copied().fold(0.0f64, f64::max);
    let lo_pos = distance.iter().copied().filter(|&x| x > 0.0).fold(f64::INFINITY, f64::min);
    let has_zero = distance.contains(&0.0);
    let single = !lo_pos.is_finite() || lo_pos >= hi;
    let nb = if single { 1 } else { bins };
    let edges: Vec<f64> = if single {
        vec![if has_zero { 0.0 } else { hi }, hi]
    } else {
        let ratio = hi / lo_pos;
        (0..=nb)
            .map(|b| match b {
                0 if has_zero => 0.0,
                0 => lo_pos,
                b if b == nb => hi,
                b => lo_pos * ratio.powf(b as f64 / nb as f64),
            })
            .collect()
    };
    let mut rows: Vec<ProfileRow> = (0..nb)
        .map(|b| ProfileRow {
            lo: edges[b],
            hi: edges[b + 1],
            count: 0,
            mean: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        })
        .collect();
    for (&x, &v) in distance.iter().zip(value) {
        let b = if single || x <= lo_pos {
            0
        } else {
            // partition_point on the interior edges: number of edges e_1..e_{nb-1} that are <= x.
            edges[1..nb].partition_point(|&e| e <= x)
        };
        let row = &mut rows[b];
        row.count += 1;
        row.mean += v;
        row.min = row.min.min(v);
        row.max = row.max.max(v);
    }
    for row in &mut rows {
        if row.count == 0 {
            row.mean = f64::NAN;
            row.min = f64::NAN;
            row.max = f64::NAN;
        } else {
            row.mean /= row.count as f64;
        }
    }
    Ok(Profile { rows, spearman: spearman(distance, value) })
}

/// Spearman rank correlation: the Pearson correlation of the ranks `1..=n`, tied values sharing
/// their average rank (statrs's `ranks` with [`RankTieBreaker::Average`]). NaN when either input
/// is constant, has fewer than 2 entries or holds a non-finite value, or when the lengths differ.
pub(crate) fn spearman(a: &[f64], b: &[f64]) -> f64 {
    if a.len() < 2 || a.len() != b.len() || a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let ranks = |v: &[f64]| Data::new(v.to_vec()).ranks(RankTieBreaker::Average);
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa == 0.0 || sbb == 0.0 {
        return f64::NAN;
    }
    sab / (saa * sbb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn rng(seed: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(seed)
    }
    fn uniform(n: usize, d: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
        let mut r = rng(seed);
        (0..n * d).map(|_| r.gen_range(lo..hi)).collect()
    }
    fn gram_of(x: &[f64], n: usize, d: usize, f: impl Fn(&[f64], &[f64]) -> f64) -> Vec<f64> {
        let mut g = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                g[i * n + j] = f(&x[i * d..(i + 1) * d], &x[j * d..(j + 1) * d]);
            }
        }
        g
    }
    fn sq(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
    }
    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
    fn norm(a: &[f64]) -> f64 {
        dot(a, a).sqrt()
    }
    fn rbf(l: f64) -> impl Fn(&[f64], &[f64]) -> f64 {
        move |a, b| (-sq(a, b) / (2.0 * l * l)).exp()
    }
    /// Grows with the distance from the origin: (1 + |x||x'|) · exp(−|x − x'|² / s).
    fn growing(s: f64) -> impl Fn(&[f64], &[f64]) -> f64 {
        move |a, b| (1.0 + norm(a) * norm(b)) * (-sq(a, b) / s).exp()
    }
    fn score(x: &[f64], g: &[f64], n: usize, d: usize) -> Stationarity {
        stationarity(x, g, n, d, &StationarityOptions::default()).unwrap()
    }

    // ----- attribution -----

    #[test]
    fn contributions_reproduce_the_kernel_machine() {
        let (p, m, k) = (4, 9, 3);
        let mut r = rng(1);
        let gram: Vec<f64> = (0..p * m * k * k).map(|_| r.gen_range(-2.0..2.0)).collect();
        let a: Vec<f64> = (0..m * k).map(|_| r.gen_range(-1.0..1.0)).collect();
        let bias: Vec<f64> = (0..p * k).map(|_| r.gen_range(-1.0..1.0)).collect();
        // The kernel machine, written out independently: f = b + Σ_i Σ_k' a[i,k'] G[p,i,k,k'].
        let mut network = bias.clone();
        for pi in 0..p {
            for kk in 0..k {
                for kp in 0..k {
                    for i in 0..m {
                        network[pi * k + kk] += a[i * k + kp] * gram[pi * m * k * k + i * k * k + kk * k + kp];
                    }
                }
            }
        }
        let c = contributions(&gram, &a, p, m, k).unwrap();
        assert_eq!(c.len(), p * m * k);
        let att = attribute(&c, &bias, &network, &[0, 1, 2, 3], p, m, k, 3).unwrap();
        assert_eq!(att.len(), p * k);
        for at in &att {
            let total: f64 = (0..m).map(|i| c[(at.point * m + i) * k + at.class]).sum();
            assert_eq!(at.total, total);
            assert!((at.total - (network[at.point * k + at.class] - bias[at.point * k + at.class])).abs() < 1e-12);
            assert!(at.residual.abs() < 1e-12, "residual {}", at.residual);
            assert_eq!(at.output, network[at.point * k + at.class]);
        }
    }

    #[test]
    fn per_step_contributions_reproduce_the_ensemble_machine() {
        let (s, p, m, k) = (5, 3, 6, 2);
        let mut r = rng(2);
        let gs: Vec<f64> = (0..s * p * m * k * k).map(|_| r.gen_range(-2.0..2.0)).collect();
        let a_s: Vec<f64> = (0..s * m * k).map(|_| r.gen_range(-1.0..1.0)).collect();
        let bias: Vec<f64> = (0..p * k).map(|_| r.gen_range(-1.0..1.0)).collect();
        let idx = |si: usize, pi: usize, i: usize, kk: usize, kp: usize| (((si * p + pi) * m + i) * k + kk) * k + kp;
        let mut network = bias.clone();
        for si in 0..s {
            for pi in 0..p {
                for kk in 0..k {
                    for i in 0..m {
                        for kp in 0..k {
                            network[pi * k + kk] += a_s[(si * m + i) * k + kp] * gs[idx(si, pi, i, kk, kp)];
                        }
                    }
                }
            }
        }
        let c = contributions_per_step(&gs, &a_s, s, p, m, k).unwrap();
        let att = attribute(&c, &bias, &network, &[2, 0], p, m, k, 2).unwrap();
        assert_eq!(att.iter().map(|a| (a.point, a.class)).collect::<Vec<_>>(), vec![(2, 0), (2, 1), (0, 0), (0, 1)]);
        for at in &att {
            assert!(at.residual.abs() < 1e-12, "residual {}", at.residual);
        }
        // With the same coefficients at every step the ensemble equals the single machine on Σ_s G_s.
        let a1: Vec<f64> = a_s[..m * k].to_vec();
        let a_rep: Vec<f64> = (0..s).flat_map(|_| a1.iter().copied()).collect();
        let c_rep = contributions_per_step(&gs, &a_rep, s, p, m, k).unwrap();
        let step = p * m * k * k;
        let gsum: Vec<f64> = (0..step).map(|e| (0..s).map(|si| gs[si * step + e]).sum()).collect();
        let c_sum = contributions(&gsum, &a1, p, m, k).unwrap();
        for (x, y) in c_rep.iter().zip(&c_sum) {
            assert!((x - y).abs() < 1e-12);
        }
    }

    #[test]
    fn attribute_orders_supporters_and_opponents_and_reports_the_residual() {
        // One point, M = 6, K = 2; class 0 contributions known, class 1 all zero.
        let (p, m, k) = (1, 6, 2);
        let c0 = [0.5, -1.0, 2.0, 0.0, -3.0, 0.5];
        let mut contrib = vec![0.0; p * m * k];
        for (i, v) in c0.iter().enumerate() {
            contrib[i * k] = *v;
        }
        let bias = [0.25, -1.0];
        let network = [0.25 + (-1.0) + 0.5, -1.0]; // class 0 off by +0.5 from b + Σc = -0.75
        let att = attribute(&contrib, &bias, &network, &[0], p, m, k, 2).unwrap();
        let a0 = &att[0];
        assert_eq!(a0.total, -1.0);
        assert!((a0.residual - 0.5).abs() < 1e-15);
        assert_eq!(a0.supporters, vec![(2, 2.0), (0, 0.5)]); // tie 0.5: lower index first
        assert_eq!(a0.opponents, vec![(4, -3.0), (1, -1.0)]);
        let all = attribute(&contrib, &bias, &network, &[0], p, m, k, 10).unwrap();
        assert_eq!(all[0].supporters, vec![(2, 2.0), (0, 0.5), (5, 0.5)]);
        assert_eq!(all[0].opponents.len(), 2);
        assert!(all[1].supporters.is_empty() && all[1].opponents.is_empty());
        assert_eq!(all[1].residual, 0.0);
    }

    #[test]
    fn attribution_rejects_bad_shapes_and_indices() {
        let e = contributions(&[0.0; 7], &[0.0; 6], 1, 2, 2).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let e = contributions(&[0.0; 8], &[0.0; 5], 1, 2, 2).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let e = contributions_per_step(&[0.0; 16], &[0.0; 7], 2, 1, 2, 2).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let c = vec![0.0; 2 * 3 * 2];
        let e = attribute(&c, &[0.0; 3], &[0.0; 4], &[0], 2, 3, 2, 1).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let e = attribute(&c, &[0.0; 4], &[0.0; 4], &[2], 2, 3, 2, 1).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let mut bad = c.clone();
        bad[7] = f64::NAN;
        let e = attribute(&bad, &[0.0; 4], &[0.0; 4], &[1], 2, 3, 2, 1).unwrap_err();
        assert!(matches!(e, Error::Data(_)), "{e}");
        assert!(attribute(&bad, &[0.0; 4], &[0.0; 4], &[0], 2, 3, 2, 1).is_ok());
    }

    // ----- stationarity -----

    #[test]
    fn rbf_is_stationary_in_2d_at_several_length_scales() {
        let (n, d) = (200, 2);
        for (lo, hi) in [(0.0, 1.0), (-1.0, 1.0)] {
            let x = uniform(n, d, lo, hi, 11);
            for l in [0.2, 0.5, 1.0, 3.0] {
                let s = score(&x, &gram_of(&x, n, d, rbf(l)), n, d);
                assert!(s.score >= 0.95, "RBF l={l} on [{lo},{hi}]^2: {s:?}");
                assert!(s.displacement_r2 > 0.99 && s.distance_r2 > 0.99, "{s:?}");
                assert_eq!(s.pairs_used, n * (n - 1) / 2);
            }
        }
    }

    #[test]
    fn rbf_is_stationary_by_distance_in_10d() {
        let (n, d) = (200, 10);
        let x = uniform(n, d, 0.0, 1.0, 12);
        for l in [0.2, 0.5, 1.0, 3.0] {
            let l = l * (d as f64 / 2.0).sqrt();
            let s = score(&x, &gram_of(&x, n, d, rbf(l)), n, d);
            assert!(s.score >= 0.95, "RBF l={l} in 10-D: {s:?}");
            assert!(s.displacement_r2.is_nan());
        }
    }

    #[test]
    fn linear_polynomial_and_growing_kernels_are_not_stationary() {
        let (n, d) = (200, 2);
        let x01 = uniform(n, d, 0.0, 1.0, 13);
        let xc = uniform(n, d, -1.0, 1.0, 13);
        let lin = |a: &[f64], b: &[f64]| dot(a, b);
        let poly = |a: &[f64], b: &[f64]| (1.0 + dot(a, b)).powi(2);
        type Kernel = Box<dyn Fn(&[f64], &[f64]) -> f64>;
        let cases: [(&str, &[f64], Kernel, f64); 5] = [
            ("linear [0,1]^2", &x01, Box::new(lin), 0.2),
            // Centred data: x·x' = |c|² − |δ|²/4, 70 % of the variance is displacement-driven.
            ("linear [-1,1]^2", &xc, Box::new(lin), 0.5),
            ("poly [-1,1]^2", &xc, Box::new(poly), 0.45),
            ("growing [0,1]^2", &x01, Box::new(growing(1.0)), 0.5),
            ("growing/d [0,1]^2", &x01, Box::new(growing(d as f64)), 0.3),
        ];
        for (name, x, f, max) in cases {
            let s = score(x, &gram_of(x, n, d, f), n, d);
            assert!(s.score <= max, "{name}: {s:?}");
        }
        let (n, d) = (200, 10);
        let x = uniform(n, d, 0.0, 1.0, 14);
        let s = score(&x, &gram_of(&x, n, d, lin), n, d);
        assert!(s.score <= 0.2, "linear 10-D: {s:?}");
        let s = score(&x, &gram_of(&x, n, d, growing(d as f64)), n, d);
        assert!(s.score <= 0.2, "growing 10-D: {s:?}");
    }

    #[test]
    fn score_falls_as_location_dependence_grows() {
        // k = RBF(x, x') · (1 + ε u(x) u(x')) with u(x) = x_0 + x_1: stationary only at ε = 0.
        let (n, d) = (200, 2);
        let x = uniform(n, d, -1.0, 1.0, 15);
        let scores: Vec<f64> = [0.0, 0.05, 0.2, 1.0]
            .iter()
            .map(|&eps| {
                let f = move |a: &[f64], b: &[f64]| rbf(0.5)(a, b) * (1.0 + eps * (a[0] + a[1]) * (b[0] + b[1]));
                score(&x, &gram_of(&x, n, d, f), n, d).score
            })
            .collect();
        assert!(scores[0] > 0.99, "{scores:?}");
        assert!(scores.windows(2).all(|w| w[1] < w[0] - 0.02), "{scores:?}");
        assert!(scores[3] < 0.6, "{scores:?}");
    }

    #[test]
    fn binned_diagnostic_is_resolution_limited_but_the_score_is_not() {
        let (n, d) = (200, 2);
        let x = uniform(n, d, -1.0, 1.0, 16);
        let g = gram_of(&x, n, d, rbf(0.2));
        let at = |bins| stationarity(&x, &g, n, d, &StationarityOptions { bins, ..Default::default() }).unwrap();
        let (s12, s24, s48) = (at(12), at(24), at(48));
        assert!(s12.binned_r2 < s24.binned_r2 && s24.binned_r2 < s48.binned_r2, "{s12:?} {s24:?} {s48:?}");
        assert!(s12.binned_r2 < 0.95, "{s12:?}");
        assert!(s12.relative_spread > s48.relative_spread);
        assert_eq!(s12.score, s48.score);
        assert!(s12.score > 0.99);
        assert!(s12.bins_used > 0 && s12.bins_used < s48.bins_used);
    }

    #[test]
    fn stationarity_is_deterministic_for_a_seed_and_subsamples_pairs() {
        let (n, d) = (300, 2);
        let x = uniform(n, d, -1.0, 1.0, 17);
        let g = gram_of(&x, n, d, growing(1.0));
        let opts = StationarityOptions { max_pairs: 5000, seed: 3, ..Default::default() };
        let a = stationarity(&x, &g, n, d, &opts).unwrap();
        let b = stationarity(&x, &g, n, d, &opts).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(a.pairs_used, 5000);
        let c = stationarity(&x, &g, n, d, &StationarityOptions { seed: 4, ..opts.clone() }).unwrap();
        assert_ne!(a.score, c.score);
        assert!((a.score - c.score).abs() < 0.1, "{a:?} {c:?}");
        // A subsample still recognises the RBF as stationary.
        let s = stationarity(&x, &gram_of(&x, n, d, rbf(0.5)), n, d, &opts).unwrap();
        assert!(s.score > 0.95, "{s:?}");
        // Sampled pairs are distinct, ordered and in range.
        let pairs = select_pairs(n, 5000, 3);
        assert!(pairs.windows(2).all(|w| w[0] < w[1]));
        assert!(pairs.iter().all(|&[i, j]| i < j && (j as usize) < n));
    }

    #[test]
    fn stationarity_edge_cases_and_errors() {
        let (n, d) = (50, 1);
        let x = uniform(n, d, -1.0, 1.0, 18);
        let s = score(&x, &vec![2.5; n * n], n, d);
        assert_eq!(s.score, 1.0);
        let s = score(&x, &gram_of(&x, n, d, rbf(0.3)), n, d);
        assert!(s.score > 0.95 && s.displacement_r2 == s.distance_r2, "{s:?}");
        let s = score(&x, &gram_of(&x, n, d, |a: &[f64], b: &[f64]| a[0] * b[0]), n, d);
        assert!(s.score < 0.6, "{s:?}"); // x·x' = c² − δ²/4 on centred data: mostly displacement-driven
                                         // Asymmetric Gram: only the symmetric part counts.
        let g = gram_of(&x, n, d, rbf(0.3));
        let mut asym = g.clone();
        for i in 0..n {
            for j in 0..n {
                asym[i * n + j] += if i < j {
                    0.7
                } else if i > j {
                    -0.7
                } else {
                    0.0
                };
            }
        }
        assert_eq!(score(&x, &asym, n, d).score, score(&x, &g, n, d).score);
        let o = StationarityOptions::default();
        assert!(matches!(stationarity(&x, &g, n, 0, &o), Err(Error::Config(_))));
        assert!(matches!(stationarity(&x, &g[1..], n, d, &o), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(stationarity(&x[..n - 1], &g, n, d, &o), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(stationarity(&x[..3], &g[..9], 3, 1, &o), Err(Error::Data(_))));
        let mut gn = g.clone();
        gn[5] = f64::INFINITY;
        assert!(matches!(stationarity(&x, &gn, n, d, &o), Err(Error::Data(_))));
        let bad = StationarityOptions { bins: 0, ..Default::default() };
        assert!(matches!(stationarity(&x, &g, n, d, &bad), Err(Error::Config(_))));
    }

    #[test]
    fn kd_tree_matches_brute_force() {
        let q = 3;
        let f = uniform(500, q, -1.0, 1.0, 19);
        let tree = KdTree::new(&f, q);
        let mut out = Vec::new();
        for t in [0usize, 17, 250, 499] {
            let qp = &f[t * q..(t + 1) * q];
            let accept = |c: usize| c != t && c % 3 != 0;
            tree.knn(qp, 8, accept, &mut out);
            let mut brute: Vec<(f64, usize)> =
                (0..500).filter(|&c| accept(c)).map(|c| (sq(&f[c * q..(c + 1) * q], qp), c)).collect();
            brute.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            brute.truncate(8);
            assert_eq!(out, brute);
        }
    }

    // ----- far field -----

    #[test]
    fn ray_points_have_the_documented_geometry() {
        for d in [2usize, 5] {
            let m = 40;
            let x = uniform(m, d, 1.0, 3.0, 20 + d as u64);
            let (n_dirs, n_steps, growth) = (6, 4, 2.0);
            let (pts, ray, rad) = ray_points(&x, m, d, n_dirs, n_steps, growth, 9).unwrap();
            assert_eq!((pts.len(), ray.len(), rad.len()), (n_dirs * n_steps * d, n_dirs * n_steps, n_dirs * n_steps));
            let centroid: Vec<f64> = (0..d).map(|a| (0..m).map(|i| x[i * d + a]).sum::<f64>() / m as f64).collect();
            let r0 = ((0..m).map(|i| sq(&x[i * d..(i + 1) * d], &centroid)).sum::<f64>() / m as f64).sqrt();
            for r in 0..n_dirs {
                let first = &pts[r * n_steps * d..(r * n_steps + 1) * d];
                let u: Vec<f64> = first.iter().zip(&centroid).map(|(p, c)| (p - c) / r0).collect();
                assert!((norm(&u) - 1.0).abs() < 1e-12);
                if d == 2 {
                    let th = 2.0 * std::f64::consts::PI * r as f64 / n_dirs as f64;
                    assert!((u[0] - th.cos()).abs() < 1e-12 && (u[1] - th.sin()).abs() < 1e-12);
                }
                for j in 0..n_steps {
                    let row = r * n_steps + j;
                    assert_eq!(ray[row], r);
                    let want = r0 * growth.powi(j as i32);
                    assert!((rad[row] - want).abs() < 1e-12 * want);
                    let p = &pts[row * d..(row + 1) * d];
                    assert!((sq(p, &centroid).sqrt() - want).abs() < 1e-10 * want);
                    let v: Vec<f64> = p.iter().zip(&centroid).map(|(p, c)| (p - c) / want).collect();
                    assert!(sq(&v, &u) < 1e-20, "ray {r} step {j} leaves its direction");
                }
            }
            // Seeded: same seed, same points; another seed moves the d ≥ 3 directions.
            let again = ray_points(&x, m, d, n_dirs, n_steps, growth, 9).unwrap();
            assert_eq!(again.0, pts);
            let other = ray_points(&x, m, d, n_dirs, n_steps, growth, 10).unwrap();
            assert_eq!(other.0 == pts, d == 2);
        }
        let x = uniform(10, 2, 0.0, 1.0, 1);
        assert!(matches!(ray_points(&x, 10, 2, 0, 3, 2.0, 0), Err(Error::Config(_))));
        assert!(matches!(ray_points(&x, 10, 2, 3, 3, f64::NAN, 0), Err(Error::Config(_))));
        assert!(matches!(ray_points(&x, 9, 2, 3, 3, 2.0, 0), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(ray_points(&[1.0; 6], 3, 2, 3, 3, 2.0, 0), Err(Error::Data(_))));
    }

    #[test]
    fn nearest_distance_matches_brute_force() {
        let d = 3;
        let pts = uniform(57, d, -5.0, 5.0, 30);
        let tr = uniform(23, d, -1.0, 1.0, 31);
        let nd = nearest_distance(&pts, &tr, d).unwrap();
        assert_eq!(nd.len(), 57);
        for (r, got) in nd.iter().enumerate() {
            let p = &pts[r * d..(r + 1) * d];
            let mut best = f64::INFINITY;
            for i in 0..23 {
                best = best.min(sq(p, &tr[i * d..(i + 1) * d]).sqrt());
            }
            assert!((got - best).abs() < 1e-12);
        }
        assert_eq!(nearest_distance(&tr, &tr, d).unwrap(), vec![0.0; 23]);
        assert!(matches!(nearest_distance(&pts[..5], &tr, d), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(nearest_distance(&pts, &[], d), Err(Error::Data(_))));
        assert!(matches!(nearest_distance(&pts, &tr, 0), Err(Error::Config(_))));
    }

    /// The hand-written average ranks that statrs's `ranks(RankTieBreaker::Average)` replaced.
    fn average_ranks_reference(v: &[f64]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let mut ranks = vec![0.0; v.len()];
        let mut s = 0;
        while s < order.len() {
            let mut e = s + 1;
            while e < order.len() && v[order[e]] == v[order[s]] {
                e += 1;
            }
            for &o in &order[s..e] {
                ranks[o] = (s + e + 1) as f64 / 2.0;
            }
            s = e;
        }
        ranks
    }

    #[test]
    fn statrs_ranks_and_variance_match_the_definitions() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for n in [2usize, 3, 10, 257] {
            // Values on a coarse lattice so that ties (runs of 2..many) are common.
            let a: Vec<f64> = (0..n).map(|_| (rng.gen_range(0..(n / 3).max(2)) as f64) * 0.25 - 1.0).collect();
            let b: Vec<f64> = (0..n).map(|_| rng.gen::<f64>()).collect();
            assert_eq!(Data::new(a.clone()).ranks(RankTieBreaker::Average), average_ranks_reference(&a), "n = {n}");
            let rho = spearman(&a, &b);
            let (ra, rb) = (average_ranks_reference(&a), average_ranks_reference(&b));
            let mean = |r: &[f64]| r.iter().sum::<f64>() / n as f64;
            let (ma, mb) = (mean(&ra), mean(&rb));
            let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
            let (va, vb): (f64, f64) = (ra.iter().map(|x| (x - ma).powi(2)).sum(), rb.iter().map(|y| (y - mb).powi(2)).sum());
            if va == 0.0 {
                assert!(rho.is_nan());
            } else {
                assert_eq!(rho, cov / (va * vb).sqrt(), "n = {n}");
            }
            // Population variance: statrs's one-pass update against the two-pass definition.
            let two_pass = {
                let m = b.iter().sum::<f64>() / n as f64;
                b.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64
            };
            assert!((variance(&b) - two_pass).abs() <= 1e-14 * two_pass, "n = {n}: {} vs {two_pass}", variance(&b));
        }
        assert_eq!(variance(&[3.0; 7]), 0.0);
        assert!(variance(&[]).is_nan());
        // NaN-loud: a non-finite input has no rank correlation (statrs's ranks would panic on NaN).
        assert!(spearman(&[1.0, f64::NAN, 3.0], &[1.0, 2.0, 3.0]).is_nan());
        assert!(spearman(&[1.0, 2.0, 3.0], &[1.0, 2.0, f64::INFINITY]).is_nan());
        assert!(spearman(&[1.0, 2.0], &[1.0, 2.0, 3.0]).is_nan());
        assert_eq!(spearman(&[3.0, 2.0, 1.0], &[1.0, 2.0, 3.0]), -1.0);
    }

    #[test]
    fn profile_bins_counts_and_spearman_sign() {
        // Distances 1, 2^1.5, …, 2^8.5, 2^9: 9 log bins with edges at the powers of two, one point
        // in the middle of each bin, plus both ends (the last bin includes the largest distance).
        let dist: Vec<f64> =
            (0..10).map(|j| if j == 0 || j == 9 { 2f64.powi(j) } else { 2f64.powf(j as f64 + 0.5) }).collect();
        let up: Vec<f64> = dist.iter().map(|x| x.sqrt()).collect();
        let down: Vec<f64> = dist.iter().map(|x| 1.0 / x).collect();
        let p = profile(&dist, &up, 9).unwrap();
        assert_eq!(p.rows.len(), 9);
        assert_eq!(p.rows.iter().map(|r| r.count).sum::<usize>(), 10);
        assert_eq!(p.rows.iter().map(|r| r.count).collect::<Vec<_>>(), vec![1, 1, 1, 1, 1, 1, 1, 1, 2]);
        for (b, row) in p.rows.iter().enumerate() {
            assert!((row.lo - 2f64.powi(b as i32)).abs() < 1e-9 && (row.hi - 2f64.powi(b as i32 + 1)).abs() < 1e-9);
        }
        let last = &p.rows[8];
        assert_eq!((last.min, last.max), (up[8], up[9]));
        assert!((last.mean - 0.5 * (up[8] + up[9])).abs() < 1e-12);
        assert!((p.spearman - 1.0).abs() < 1e-12);
        assert!((profile(&dist, &down, 4).unwrap().spearman + 1.0).abs() < 1e-12);
        // Zero distances go to the first bin, reported from 0; empty bins are kept with NaN stats.
        let p = profile(&[0.0, 1.0, 1.5, 100.0], &[1.0, 2.0, 3.0, 4.0], 4).unwrap();
        assert_eq!(p.rows[0].lo, 0.0);
        assert_eq!(p.rows.iter().map(|r| r.count).collect::<Vec<_>>(), vec![3, 0, 0, 1]);
        assert!(p.rows[1].mean.is_nan());
        // Ties get average ranks; a constant value has no rank correlation.
        assert!((spearman(&[1.0, 2.0, 2.0, 3.0], &[1.0, 2.0, 2.0, 3.0]) - 1.0).abs() < 1e-12);
        assert!(profile(&dist, &[1.0; 10], 3).unwrap().spearman.is_nan());
        assert_eq!(profile(&[2.0; 3], &[1.0, 2.0, 3.0], 5).unwrap().rows.len(), 1);
        assert!(matches!(profile(&dist, &up[..3], 3), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(profile(&[-1.0], &[0.0], 3), Err(Error::Data(_))));
        assert!(matches!(profile(&dist, &up, 0), Err(Error::Config(_))));
        assert!(matches!(profile(&[], &[], 3), Err(Error::Data(_))));
    }
}
