//! Kernel values and GP uncertainty far from the training data (EPK paper Fig. 5): points
//! along rays from the data, their distance to the nearest training point, and binned profiles
//! with a rank correlation.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;
use statrs::statistics::{Data, OrderStatistics, RankTieBreaker};

use super::{check_finite, check_len, numel};
use crate::error::{Error, Result};

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
    use crate::analysis::testutil::*;
    use rand::Rng;
    use crate::analysis::variance;

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
