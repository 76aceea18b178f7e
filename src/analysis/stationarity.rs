//! How far a kernel is from stationary (EPK paper §4.2, Fig. 3): pair matching in
//! displacement space, with a k-d tree for the nearest pairs.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{check_finite, check_len, variance};
use crate::error::{Error, Result};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::testutil::*;

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

}
