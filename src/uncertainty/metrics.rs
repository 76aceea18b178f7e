//! Metrics of predicted class probabilities: accuracy, negative log-likelihood, Brier score,
//! expected calibration error, and the OOD AUROC (Mann–Whitney).
//!
//! Every function takes a probability matrix `[N, K]` (row-major), whatever produced it (the
//! network's softmax, a temperature-scaled softmax, a Monte-Carlo average, an ensemble, a GP).
//! Inputs are checked first (`check_probs`): a NaN, an entry outside `[0, 1]` or a row that does
//! not sum to 1 is an [`Error::Data`], never a number. Conventions:
//! - **arg-max** ties go to the lowest class index;
//! - **NLL** is `−ln p_y` unclamped: a true class given probability exactly 0 makes it `+∞`;
//! - **ECE** uses `B` equal-width bins of the top-label confidence `c = max_k p_k` with edges
//!   `e_j = j / B` (computed as an f64 division); bin `j` holds `e_j < c ≤ e_{j+1}`, and `c = 0`
//!   falls in the first bin. `ECE = Σ_j (n_j / N) |acc_j − conf_j|` over non-empty bins;
//! - **AUROC** is `P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)`, computed from average ranks.

use crate::error::{Error, Result};

/// How far a probability row's sum may be from 1.
pub(crate) const ROW_SUM_TOL: f64 = 1e-8;

/// Number of ECE bins of the benchmark protocol.
pub(crate) const ECE_BINS: usize = 15;

/// Checks a probability matrix and returns its number of rows `N`: `K ≥ 1`, a length that is a
/// multiple of `K`, every entry finite and in `[0, 1]`, every row summing to 1 within
/// [`ROW_SUM_TOL`]. The error names the first offending point and class.
///
/// # Shapes
/// `probs: [N, K]`.
pub(crate) fn check_probs(probs: &[f64], k: usize) -> Result<usize> {
    if k == 0 {
        return Err(Error::Data("probabilities with K = 0 classes".into()));
    }
    if probs.len() % k != 0 {
        return Err(Error::ShapeMismatch {
            what: format!("probability matrix [N, K = {k}]: length not a multiple of K"),
            expected: vec![probs.len() / k * k],
            got: vec![probs.len()],
        });
    }
    for (i, row) in probs.chunks_exact(k).enumerate() {
        if let Some(c) = row.iter().position(|p| !(0.0..=1.0).contains(p)) {
            return Err(Error::Data(format!(
                "probability [{i}, {c}] = {} is not in [0, 1]",
                row[c]
            )));
        }
        let s: f64 = row.iter().sum();
        if (s - 1.0).abs() > ROW_SUM_TOL {
            return Err(Error::Data(format!(
                "probabilities of point {i} sum to {s}, not 1"
            )));
        }
    }
    Ok(probs.len() / k)
}

fn check_labels(n: usize, labels: &[usize], k: usize) -> Result<()> {
    if labels.len() != n {
        return Err(Error::ShapeMismatch {
            what: "labels vs probability rows".into(),
            expected: vec![n],
            got: vec![labels.len()],
        });
    }
    if let Some(i) = labels.iter().position(|&y| y >= k) {
        return Err(Error::Data(format!(
            "label {i} is {}, not < K = {k}",
            labels[i]
        )));
    }
    if n == 0 {
        return Err(Error::Data("no points: a metric over 0 points is undefined".into()));
    }
    Ok(())
}

pub(crate) use crate::data::argmax;

pub use crate::model::softmax_rows;
pub(crate) use crate::model::softmax_in_place;

/// Fraction of points whose arg-max class (first on ties) is the label.
///
/// # Shapes
/// `probs: [N, K]`, `labels: [N]`.
pub fn accuracy(probs: &[f64], labels: &[usize], k: usize) -> Result<f64> {
    let n = check_probs(probs, k)?;
    check_labels(n, labels, k)?;
    let hits = probs
        .chunks_exact(k)
        .zip(labels)
        .filter(|(row, &y)| argmax(row) == y)
        .count();
    Ok(hits as f64 / n as f64)
}

/// Mean negative log-likelihood `(1/N) Σ_i −ln p_{i, y_i}` (natural log). Nothing is clamped: a
/// true class with probability exactly 0 gives `+∞`.
///
/// # Shapes
/// `probs: [N, K]`, `labels: [N]`.
pub fn nll(probs: &[f64], labels: &[usize], k: usize) -> Result<f64> {
    let n = check_probs(probs, k)?;
    check_labels(n, labels, k)?;
    let s: f64 = probs.chunks_exact(k).zip(labels).map(|(row, &y)| -row[y].ln()).sum();
    Ok(s / n as f64)
}

/// Mean Brier score `(1/N) Σ_i Σ_k (p_{ik} − [y_i = k])²` (summed over classes, in `[0, 2]`).
///
/// # Shapes
/// `probs: [N, K]`, `labels: [N]`.
pub fn brier(probs: &[f64], labels: &[usize], k: usize) -> Result<f64> {
    let n = check_probs(probs, k)?;
    check_labels(n, labels, k)?;
    let s: f64 = probs
        .chunks_exact(k)
        .zip(labels)
        .map(|(row, &y)| {
            row.iter()
                .enumerate()
                .map(|(c, &p)| {
                    let d = p - if c == y { 1.0 } else { 0.0 };
                    d * d
                })
                .sum::<f64>()
        })
        .sum();
    Ok(s / n as f64)
}

/// The ECE bin of a confidence `c ∈ [0, 1]`: the `j` with `j/B < c ≤ (j+1)/B`, and 0 for `c = 0`.
///
/// # Panics
/// If `bins == 0`.
pub(crate) fn ece_bin(c: f64, bins: usize) -> usize {
    assert!(bins > 0, "ece_bin: bins must be >= 1");
    let b = bins as f64;
    let edge = |j: usize| j as f64 / b;
    let mut j = ((c * b).ceil() as usize).saturating_sub(1).min(bins - 1);
    while j > 0 && c <= edge(j) {
        j -= 1;
    }
    while j + 1 < bins && c > edge(j + 1) {
        j += 1;
    }
    j
}

/// One bin of a reliability diagram: the points whose top-label confidence falls in
/// `(lo, hi]` (the first bin also holds `c = 0`; see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReliabilityBin {
    /// Lower edge `j / B`.
    pub lo: f64,
    /// Upper edge `(j + 1) / B`.
    pub hi: f64,
    /// Points in the bin.
    pub count: usize,
    /// Mean top-label confidence of those points (NaN for an empty bin).
    pub confidence: f64,
    /// Fraction of those points whose arg-max is the label (NaN for an empty bin).
    pub accuracy: f64,
}

/// The reliability diagram's bins: `bins` equal-width bins of the top-label confidence
/// (conventions in the module docs), with their counts, mean confidences and accuracies.
/// [`ece`] is `Σ_j (n_j / N) |acc_j − conf_j|` over these bins.
///
/// # Shapes
/// `probs: [N, K]`, `labels: [N]`; returns `[bins]`.
pub fn reliability(probs: &[f64], labels: &[usize], k: usize, bins: usize) -> Result<Vec<ReliabilityBin>> {
    let n = check_probs(probs, k)?;
    check_labels(n, labels, k)?;
    if bins == 0 {
        return Err(Error::Config("a reliability diagram needs at least 1 bin".into()));
    }
    let mut conf = vec![0.0; bins];
    let mut hits = vec![0.0; bins];
    let mut count = vec![0usize; bins];
    for (row, &y) in probs.chunks_exact(k).zip(labels) {
        let top = argmax(row);
        let c = row[top];
        let j = ece_bin(c, bins);
        conf[j] += c;
        hits[j] += if top == y { 1.0 } else { 0.0 };
        count[j] += 1;
    }
    let b = bins as f64;
    Ok((0..bins)
        .map(|j| {
            let m = count[j] as f64;
            let (confidence, accuracy) = if count[j] > 0 { (conf[j] / m, hits[j] / m) } else { (f64::NAN, f64::NAN) };
            ReliabilityBin { lo: j as f64 / b, hi: (j + 1) as f64 / b, count: count[j], confidence, accuracy }
        })
        .collect())
}

/// Expected calibration error with `bins` equal-width bins of the top-label confidence
/// (conventions in the module docs); `bins = 15` (`ECE_BINS`) in the benchmark.
///
/// # Shapes
/// `probs: [N, K]`, `labels: [N]`.
pub fn ece(probs: &[f64], labels: &[usize], k: usize, bins: usize) -> Result<f64> {
    if bins == 0 {
        return Err(Error::Config("ece needs at least 1 bin".into()));
    }
    let rel = reliability(probs, labels, k, bins)?;
    let n = labels.len() as f64;
    let mut e = 0.0;
    for r in rel.iter().filter(|r| r.count > 0) {
        e += (r.count as f64 / n) * (r.accuracy - r.confidence).abs();
    }
    Ok(e)
}

/// The top-label confidence `max_k p_k` of every point (the maximum softmax probability score).
///
/// # Shapes
/// `probs: [N, K]`; returns `[N]`.
pub fn max_prob(probs: &[f64], k: usize) -> Result<Vec<f64>> {
    check_probs(probs, k)?;
    Ok(probs.chunks_exact(k).map(|row| row[argmax(row)]).collect())
}

/// Average ranks (1-based) of `v` in ascending order; tied values share the mean of their ranks.
/// Sorting uses `total_cmp`; ties are decided by `==` (so `-0.0` ties with `0.0`).
///
/// # Shapes
/// `v: [n]`; returns `[n]`.
pub(crate) fn average_ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut ranks = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i + 1;
        while j < idx.len() && v[idx[j]] == v[idx[i]] {
            j += 1;
        }
        // Ranks i+1 ..= j share their mean.
        let r = (i + 1 + j) as f64 / 2.0;
        for &t in &idx[i..j] {
            ranks[t] = r;
        }
        i = j;
    }
    ranks
}

/// Area under the ROC curve of a score that should be larger on `positive` than on `negative`:
/// `P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)`, computed as the Mann–Whitney statistic from average ranks,
/// `(R⁺ − n⁺(n⁺+1)/2) / (n⁺ n⁻)`. Both sets must be non-empty and free of NaN (±∞ are ranked).
///
/// # Shapes
/// `positive: [n⁺]`, `negative: [n⁻]`.
pub fn auroc(positive: &[f64], negative: &[f64]) -> Result<f64> {
    if positive.is_empty() || negative.is_empty() {
        return Err(Error::Data(format!(
            "auroc needs both sets non-empty (got {} positive, {} negative)",
            positive.len(),
            negative.len()
        )));
    }
    for (name, v) in [("positive", positive), ("negative", negative)] {
        if let Some(i) = v.iter().position(|s| s.is_nan()) {
            return Err(Error::Data(format!("auroc: {name} score {i} is NaN")));
        }
    }
    let pooled: Vec<f64> = positive.iter().chain(negative).copied().collect();
    let ranks = average_ranks(&pooled);
    let r_pos: f64 = ranks[..positive.len()].iter().sum();
    let (np, nn) = (positive.len() as f64, negative.len() as f64);
    Ok((r_pos - np * (np + 1.0) / 2.0) / (np * nn))
}

/// Which way an OOD score points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScoreDirection {
    /// Larger means more in-distribution (the maximum softmax probability).
    HigherIsInDistribution,
    /// Larger means more out-of-distribution (a posterior logit variance).
    HigherIsOod,
}

/// OOD detection AUROC of a score evaluated on in-distribution points and on OOD points: the
/// probability that the score ranks a random in/OOD pair the right way round (ties count ½),
/// so 1 is perfect separation and 0.5 chance, whichever `direction` the score has.
/// [`ScoreDirection::HigherIsInDistribution`] is `auroc(in, ood)`,
/// [`ScoreDirection::HigherIsOod`] is `auroc(ood, in)`.
///
/// # Shapes
/// `in_scores: [N_in]`, `ood_scores: [N_ood]`.
pub fn ood_auroc(in_scores: &[f64], ood_scores: &[f64], direction: ScoreDirection) -> Result<f64> {
    match direction {
        ScoreDirection::HigherIsInDistribution => auroc(in_scores, ood_scores),
        ScoreDirection::HigherIsOod => auroc(ood_scores, in_scores),
    }
}

/// The four labelled-set metrics of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ClassificationMetrics {
    /// Number of points N.
    pub n: usize,
    /// [`accuracy`].
    pub accuracy: f64,
    /// [`nll`].
    pub nll: f64,
    /// [`brier`].
    pub brier: f64,
    /// [`ece`] with [`ECE_BINS`] bins.
    pub ece: f64,
}

/// Accuracy, NLL, Brier and 15-bin ECE of `probs` against `labels`.
///
/// # Shapes
/// `probs: [N, K]`, `labels: [N]`.
pub(crate) fn classification_metrics(probs: &[f64], labels: &[usize], k: usize) -> Result<ClassificationMetrics> {
    Ok(ClassificationMetrics {
        n: labels.len(),
        accuracy: accuracy(probs, labels, k)?,
        nll: nll(probs, labels, k)?,
        brier: brier(probs, labels, k)?,
        ece: ece(probs, labels, k, ECE_BINS)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    // Three points, K = 3, by hand.
    const P: [f64; 9] = [0.7, 0.2, 0.1, 0.1, 0.3, 0.6, 0.25, 0.5, 0.25];
    const Y: [usize; 3] = [0, 1, 1];

    #[test]
    fn hand_values() {
        // Arg-maxes 0, 2, 1: points 0 and 2 right.
        assert_eq!(accuracy(&P, &Y, 3).unwrap(), 2.0 / 3.0);
        let want = -(0.7f64.ln() + 0.3f64.ln() + 0.5f64.ln()) / 3.0;
        assert!((nll(&P, &Y, 3).unwrap() - want).abs() < 1e-15);
        // (0.09 + 0.04 + 0.01) + (0.01 + 0.49 + 0.36) + (0.0625 + 0.25 + 0.0625) = 0.14 + 0.86 + 0.375
        assert!((brier(&P, &Y, 3).unwrap() - 1.375 / 3.0).abs() < 1e-15);
        // Confidences 0.7 (bin 10: 10/15 < 0.7 <= 11/15, right), 0.6 (bin 8: 8/15 < 0.6 <= 9/15,
        // wrong), 0.5 (bin 7: 7/15 < 0.5 <= 8/15, right).
        assert_eq!([ece_bin(0.7, 15), ece_bin(0.6, 15), ece_bin(0.5, 15)], [10, 8, 7]);
        let want = (0.3 + 0.6 + 0.5) / 3.0;
        assert!((ece(&P, &Y, 3, 15).unwrap() - want).abs() < 1e-15);
        // One bin: |mean accuracy − mean confidence| = |2/3 − 0.6|.
        assert!((ece(&P, &Y, 3, 1).unwrap() - (2.0 / 3.0 - 0.6)).abs() < 1e-15);
        let m = classification_metrics(&P, &Y, 3).unwrap();
        assert_eq!(m.n, 3);
        assert_eq!(m.accuracy, accuracy(&P, &Y, 3).unwrap());
        assert_eq!(max_prob(&P, 3).unwrap(), vec![0.7, 0.6, 0.5]);
    }

    #[test]
    fn ece_bin_edges() {
        // Edges belong to the bin below; 0 to the first bin; 1 to the last.
        assert_eq!(ece_bin(0.0, 15), 0);
        assert_eq!(ece_bin(1e-300, 15), 0);
        assert_eq!(ece_bin(1.0 / 15.0, 15), 0);
        assert_eq!(ece_bin(f64::from_bits((1.0f64 / 15.0).to_bits() + 1), 15), 1);
        for j in 1..=15 {
            let e = j as f64 / 15.0;
            assert_eq!(ece_bin(e, 15), j - 1, "edge {j}/15");
            if j < 15 {
                assert_eq!(ece_bin(f64::from_bits(e.to_bits() + 1), 15), j);
            }
        }
        assert_eq!(ece_bin(1.0, 15), 14);
        assert_eq!(ece_bin(0.5, 2), 0);
        assert_eq!(ece_bin(0.5000001, 2), 1);
        // Against the obvious linear scan on random confidences.
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..10_000 {
            let c: f64 = if rng.gen_bool(0.1) { rng.gen_range(0..=15) as f64 / 15.0 } else { rng.gen() };
            let want = (0..15).find(|&j| c <= (j + 1) as f64 / 15.0).unwrap();
            assert_eq!(ece_bin(c, 15), want, "c = {c}");
        }
    }

    #[test]
    fn ece_against_obvious_two_pass() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let (n, k) = (500, 4);
        let mut p = Vec::new();
        let mut y = Vec::new();
        for _ in 0..n {
            let mut r: Vec<f64> = (0..k).map(|_| rng.gen::<f64>().powi(3)).collect();
            let s: f64 = r.iter().sum();
            r.iter_mut().for_each(|v| *v /= s);
            p.extend(r);
            y.push(rng.gen_range(0..k));
        }
        let mut want = 0.0;
        for j in 0..15 {
            let (lo, hi) = (j as f64 / 15.0, (j + 1) as f64 / 15.0);
            let members: Vec<usize> = (0..n)
                .filter(|&i| {
                    let c = p[i * k..(i + 1) * k].iter().cloned().fold(0.0, f64::max);
                    (c > lo || (j == 0 && c == 0.0)) && c <= hi
                })
                .collect();
            if members.is_empty() {
                continue;
            }
            let m = members.len() as f64;
            let acc = members.iter().filter(|&&i| argmax(&p[i * k..(i + 1) * k]) == y[i]).count() as f64 / m;
            let conf = members.iter().map(|&i| p[i * k..(i + 1) * k].iter().cloned().fold(0.0, f64::max)).sum::<f64>() / m;
            want += m / n as f64 * (acc - conf).abs();
        }
        assert!((ece(&p, &y, k, 15).unwrap() - want).abs() < 1e-14);
        // The reliability bins hold every point once, and their gaps weighted by size are the ECE.
        let rel = reliability(&p, &y, k, 15).unwrap();
        assert_eq!(rel.iter().map(|r| r.count).sum::<usize>(), n);
        assert!(rel.iter().all(|r| (r.count == 0) == r.accuracy.is_nan() && (r.count == 0 || (r.confidence > r.lo && r.confidence <= r.hi))));
        let from_bins: f64 = rel.iter().filter(|r| r.count > 0).map(|r| r.count as f64 / n as f64 * (r.accuracy - r.confidence).abs()).sum();
        assert!((from_bins - want).abs() < 1e-14);
        assert_eq!((rel[0].lo, rel[14].hi), (0.0, 1.0));
    }

    #[test]
    fn nll_of_zero_probability_is_infinite() {
        let p = [1.0, 0.0, 0.5, 0.5];
        assert_eq!(nll(&p, &[1, 0], 2).unwrap(), f64::INFINITY);
        assert_eq!(nll(&p, &[0, 0], 2).unwrap(), 0.5f64.ln().abs() / 2.0);
    }

    #[test]
    fn argmax_ties_and_nan_inputs() {
        assert_eq!(argmax(&[0.5, 0.5]), 0);
        assert_eq!(argmax(&[0.2, 0.4, 0.4]), 1);
        // A tie counts for the first class: point 0 is right only with label 0.
        let p = [0.5, 0.5];
        assert_eq!(accuracy(&p, &[0], 2).unwrap(), 1.0);
        assert_eq!(accuracy(&p, &[1], 2).unwrap(), 0.0);
        let mut bad = P;
        bad[4] = f64::NAN;
        for r in [
            accuracy(&bad, &Y, 3),
            nll(&bad, &Y, 3),
            brier(&bad, &Y, 3),
            ece(&bad, &Y, 3, 15),
            max_prob(&bad, 3).map(|v| v[0]),
        ] {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("[1, 1] = NaN"), "{e}");
        }
        assert!(accuracy(&[0.6, 0.6], &[0], 2).unwrap_err().to_string().contains("sum to"));
        assert!(accuracy(&[-0.1, 1.1], &[0], 2).is_err());
        assert!(accuracy(&P, &[0, 1], 3).is_err());
        assert!(accuracy(&P, &[0, 1, 3], 3).is_err());
        assert!(accuracy(&[], &[], 3).is_err());
        assert!(accuracy(&P[..8], &Y, 3).is_err());
        assert!(softmax_rows(&[0.0, f64::NAN], 2).is_err());
        assert!(auroc(&[0.5, f64::NAN], &[0.1]).is_err());
        assert!(auroc(&[0.5], &[]).is_err());
    }

    #[test]
    fn softmax_hand_and_extremes() {
        let p = softmax_rows(&[0.0, 0.0, 1.0, 2.0, 1000.0, -1000.0], 2).unwrap();
        assert_eq!(&p[..2], &[0.5, 0.5]);
        let e = 1.0f64.exp();
        assert!((p[2] - 1.0 / (1.0 + e)).abs() < 1e-16 && (p[3] - e / (1.0 + e)).abs() < 1e-16);
        assert_eq!(&p[4..], &[1.0, 0.0]);
    }

    #[test]
    fn auroc_hand_and_ties() {
        assert_eq!(auroc(&[3.0, 4.0], &[1.0, 2.0]).unwrap(), 1.0);
        assert_eq!(auroc(&[1.0, 2.0], &[3.0, 4.0]).unwrap(), 0.0);
        // Pairs: (2,1) win, (2,3) lose, (4,1) win, (4,3) win → 3/4.
        assert_eq!(auroc(&[2.0, 4.0], &[1.0, 3.0]).unwrap(), 0.75);
        // All tied: 1/2.
        assert_eq!(auroc(&[1.0, 1.0], &[1.0, 1.0, 1.0]).unwrap(), 0.5);
        // (1 vs 1 tie = ½) + (2 vs 1 win) over 2 pairs.
        assert_eq!(auroc(&[1.0, 2.0], &[1.0]).unwrap(), 0.75);
        assert_eq!(auroc(&[0.0], &[-0.0]).unwrap(), 0.5);
        assert_eq!(auroc(&[f64::INFINITY], &[1e300]).unwrap(), 1.0);
        assert_eq!(average_ranks(&[3.0, 1.0, 3.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
        // Directions: the same separation read either way.
        let (inn, out) = ([0.9, 0.8, 0.7], [0.2, 0.75]);
        assert_eq!(ood_auroc(&inn, &out, ScoreDirection::HigherIsInDistribution).unwrap(), 5.0 / 6.0);
        let (vin, vout) = ([0.1, 0.2, 0.3], [2.0, 0.25]);
        assert_eq!(ood_auroc(&vin, &vout, ScoreDirection::HigherIsOod).unwrap(), 5.0 / 6.0);
    }

    #[test]
    fn auroc_against_pair_count() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for trial in 0..50 {
            let (a, b) = (rng.gen_range(1..40), rng.gen_range(1..40));
            // Coarse values so that ties are frequent.
            let pos: Vec<f64> = (0..a).map(|_| (rng.gen_range(0..8) as f64) * 0.5).collect();
            let neg: Vec<f64> = (0..b).map(|_| (rng.gen_range(0..8) as f64) * 0.5 - 0.5).collect();
            let mut s = 0.0;
            for &p in &pos {
                for &q in &neg {
                    s += if p > q { 1.0 } else if p == q { 0.5 } else { 0.0 };
                }
            }
            let want = s / (a * b) as f64;
            assert!((auroc(&pos, &neg).unwrap() - want).abs() < 1e-14, "trial {trial}");
        }
    }
}
