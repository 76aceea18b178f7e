//! The linear datamodeling score (TRAK, Park et al. 2023): for a test point, the Spearman
//! correlation over subsets `S` between the attribution's prediction `Σ_{i∈S} τ(x, i)` and the
//! output of the network retrained on `S`; its mean over test points with a seeded bootstrap
//! 95 % interval; and the AUC of a score at separating flagged points (noisy-label detection).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use statrs::statistics::{Data, OrderStatistics, RankTieBreaker};

use crate::linalg::gemm;
use crate::error::{Error, Result};

/// Spearman rank correlation: Pearson on average ranks (ties share their mean rank). `None` when
/// the lengths differ, there are fewer than two entries, a value is not finite, or either side is
/// constant.
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() < 2 || a.len() != b.len() || a.iter().chain(b).any(|v| !v.is_finite()) {
        return None;
    }
    let ranks = |v: &[f64]| Data::new(v.to_vec()).ranks(RankTieBreaker::Average);
    pearson(&ranks(a), &ranks(b))
}

/// Pearson correlation (`None` when either side is constant).
pub(crate) fn pearson(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa == 0.0 || sbb == 0.0 {
        return None;
    }
    Some(sab / (saa * sbb).sqrt())
}

/// Mean of per-point values with a percentile-bootstrap 95 % interval over points.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Mean.
    pub mean: f64,
    /// 2.5 % bootstrap quantile.
    pub lo: f64,
    /// 97.5 % bootstrap quantile.
    pub hi: f64,
}

impl std::fmt::Display for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} [{:.3}, {:.3}]", self.mean, self.lo, self.hi)
    }
}

/// The mean of `v` and its bootstrap interval (`resamples` resamples of the points, seeded).
pub fn bootstrap_mean(v: &[f64], resamples: usize, seed: u64) -> Interval {
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n.max(1) as f64;
    if n == 0 || resamples == 0 {
        return Interval { mean, lo: mean, hi: mean };
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..resamples).map(|_| (0..n).map(|_| v[rng.gen_range(0..n)]).sum::<f64>() / n as f64).collect();
    means.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| means[((p * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    Interval { mean, lo: q(0.025), hi: q(0.975) }
}

/// Predictions `Σ_{i∈S_s} τ(x_p, i)` for every subset. # Shapes `τ [P, M]` → `[S, P]`.
pub fn subset_predictions(tau: &[f64], m: usize, subsets: &[Vec<usize>]) -> Vec<f64> {
    let p = tau.len() / m;
    let mut member = vec![0.0; subsets.len() * m];
    for (s, idx) in subsets.iter().enumerate() {
        for &i in idx {
            member[s * m + i] = 1.0;
        }
    }
    let mut out = vec![0.0; subsets.len() * p];
    gemm(&mut out, &member, false, tau, true, (subsets.len(), p, m), 1.0, false);
    out
}

/// LDS of each test point: Spearman over the subsets `which` between the predictions and the
/// retrained outputs; a point where either side is constant scores 0 (it predicts nothing).
///
/// # Shapes
/// `tau [P, M]`, `retrained [S_all, P]` (row s = subset s), `subsets` all `S_all` subsets;
/// returns `[P]`.
///
/// Errors: shapes that do not agree.
pub fn lds_per_point(tau: &[f64], m: usize, subsets: &[Vec<usize>], retrained: &[f64], which: &[usize]) -> Result<Vec<f64>> {
    if m == 0 || tau.len() % m != 0 {
        return Err(Error::ShapeMismatch { what: "lds: τ [P, M]".into(), expected: vec![m], got: vec![tau.len()] });
    }
    let p = tau.len() / m;
    if retrained.len() != subsets.len() * p || which.iter().any(|&s| s >= subsets.len()) {
        return Err(Error::ShapeMismatch { what: "lds: retrained outputs [S, P]".into(), expected: vec![subsets.len(), p], got: vec![retrained.len()] });
    }
    let chosen: Vec<Vec<usize>> = which.iter().map(|&s| subsets[s].clone()).collect();
    let pred = subset_predictions(tau, m, &chosen);
    let s = which.len();
    Ok((0..p)
        .map(|q| {
            let a: Vec<f64> = (0..s).map(|t| pred[t * p + q]).collect();
            let b: Vec<f64> = which.iter().map(|&t| retrained[t * p + q]).collect();
            spearman(&a, &b).unwrap_or(0.0)
        })
        .collect())
}

/// Area under the ROC curve of `score` for `positive` against the rest (Mann–Whitney; ties count
/// one half). `None` without both classes.
pub fn auc(score: &[f64], positive: &[bool]) -> Option<f64> {
    let npos = positive.iter().filter(|&&b| b).count();
    let nneg = positive.len() - npos;
    if npos == 0 || nneg == 0 || score.len() != positive.len() {
        return None;
    }
    let ranks = Data::new(score.to_vec()).ranks(RankTieBreaker::Average);
    let rsum: f64 = ranks.iter().zip(positive).filter(|(_, &p)| p).map(|(r, _)| r).sum();
    Some((rsum - (npos * (npos + 1)) as f64 / 2.0) / (npos as f64 * nneg as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks by counting (slow, obvious): 1 + #smaller + (#equal − 1)/2.
    fn slow_spearman(a: &[f64], b: &[f64]) -> f64 {
        let rank = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|x| 1.0 + v.iter().filter(|y| *y < x).count() as f64 + (v.iter().filter(|y| *y == x).count() - 1) as f64 / 2.0)
                .collect()
        };
        pearson(&rank(a), &rank(b)).unwrap()
    }

    #[test]
    fn spearman_matches_counted_ranks_with_ties() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for n in [2, 3, 7, 30] {
            let a: Vec<f64> = (0..n).map(|_| rng.gen_range(0..4) as f64).collect();
            let b: Vec<f64> = (0..n).map(|_| rng.gen_range(0..5) as f64 + 0.5 * a[0]).collect();
            match spearman(&a, &b) {
                Some(r) => assert!((r - slow_spearman(&a, &b)).abs() < 1e-12),
                None => assert!(a.iter().all(|v| *v == a[0]) || b.iter().all(|v| *v == b[0])),
            }
        }
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 35.0]), Some(1.0));
        assert_eq!(spearman(&[1.0, 1.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn auc_matches_a_pairwise_count() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let score: Vec<f64> = (0..200).map(|_| rng.gen_range(0..20) as f64).collect();
        let pos: Vec<bool> = score.iter().map(|s| rng.gen_range(0.0..30.0) < *s).collect();
        let mut wins = 0.0;
        let (mut np, mut nn) = (0.0, 0.0);
        for i in 0..200 {
            for j in 0..200 {
                if pos[i] && !pos[j] {
                    wins += if score[i] > score[j] { 1.0 } else if score[i] == score[j] { 0.5 } else { 0.0 };
                }
            }
            if pos[i] { np += 1.0 } else { nn += 1.0 }
        }
        assert!((auc(&score, &pos).unwrap() - wins / (np * nn)).abs() < 1e-12);
        assert_eq!(auc(&[1.0, 2.0], &[true, true]), None);
    }

    /// A linear ground truth gives LDS 1; attributions unrelated to it give about 0.
    #[test]
    fn lds_is_one_for_the_true_linear_model_and_near_zero_for_noise() {
        let (m, p, s) = (60, 20, 200);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let truth: Vec<f64> = (0..p * m).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let subsets: Vec<Vec<usize>> = (0..s).map(|_| (0..m).filter(|_| rng.gen_bool(0.5)).collect()).collect();
        let out: Vec<f64> = subset_predictions(&truth, m, &subsets).iter().map(|v| 2.0 * v + 1.0).collect();
        let all: Vec<usize> = (0..s).collect();
        let lds = lds_per_point(&truth, m, &subsets, &out, &all).unwrap();
        assert!(lds.iter().all(|&v| (v - 1.0).abs() < 1e-12));
        let noise: Vec<f64> = (0..p * m).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let lds = lds_per_point(&noise, m, &subsets, &out, &all).unwrap();
        let mean = bootstrap_mean(&lds, 500, 0);
        assert!(mean.mean.abs() < 0.05 && mean.lo < 0.0 && mean.hi > 0.0, "{mean}");
    }

    #[test]
    fn bootstrap_interval_brackets_the_mean_and_is_seeded() {
        let v: Vec<f64> = (0..100).map(|i| (i as f64 * 0.37).sin()).collect();
        let a = bootstrap_mean(&v, 1000, 4);
        assert!(a.lo < a.mean && a.mean < a.hi);
        assert_eq!(a, bootstrap_mean(&v, 1000, 4));
        // The interval's half-width is about 1.96 standard errors.
        let sd = (v.iter().map(|x| (x - a.mean).powi(2)).sum::<f64>() / 99.0).sqrt() / 10.0;
        assert!(((a.hi - a.lo) / 2.0 / (1.96 * sd) - 1.0).abs() < 0.15);
    }
}
