//! Temperature scaling (Guo et al. 2017): one temperature `T > 0` dividing every logit, fitted
//! on a validation set by minimising the mean negative log-likelihood.
//!
//! With `β = 1/T` the mean NLL `F(β) = (1/N) Σ_i [lse(β z_i) − β z_{i,y_i}]` is convex in `β`
//! (a log-sum-exp of linear functions minus a linear one), with
//! `F′(β) = (1/N) Σ_i (E_{softmax(β z_i)}[z_i] − z_{i,y_i})` and
//! `F″(β) = (1/N) Σ_i Var_{softmax(β z_i)}[z_i] ≥ 0`. So `F′` has at most one sign change and
//! the optimum is its root. The fit brackets that root over `T ∈ [T_MIN, T_MAX]` (in `log T`)
//! and refines it by Newton steps in `log β`, each safeguarded by bisection of the bracket;
//! an optimum outside the range (or a flat NLL) is an error, not a clipped value.

use crate::error::{Error, Result};

use super::metrics::softmax_in_place;

/// Smallest temperature searched.
pub(crate) const T_MIN: f64 = 1e-2;
/// Largest temperature searched.
pub(crate) const T_MAX: f64 = 1e2;

/// A fitted temperature.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TemperatureFit {
    /// The temperature `T` (probabilities are `softmax(z / T)`).
    pub temperature: f64,
    /// Mean validation NLL at `T = 1`.
    pub nll_before: f64,
    /// Mean validation NLL at the fitted `T`.
    pub nll_after: f64,
    /// `dNLL/dβ` at the fitted `T` (0 up to rounding).
    pub gradient: f64,
    /// Newton/bisection iterations used.
    pub iterations: usize,
    /// Validation points N.
    pub n: usize,
}

/// `(F(β), F′(β), F″(β))` of the mean NLL at inverse temperature `β`.
fn nll_derivatives(logits: &[f64], labels: &[usize], k: usize, beta: f64) -> (f64, f64, f64) {
    let n = labels.len() as f64;
    let (mut f, mut g, mut h) = (0.0, 0.0, 0.0);
    let mut p = vec![0.0; k];
    for (z, &y) in logits.chunks_exact(k).zip(labels) {
        for c in 0..k {
            p[c] = beta * z[c];
        }
        let m = p.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + p.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        f += lse - beta * z[y];
        softmax_in_place(&mut p);
        let mean: f64 = p.iter().zip(z).map(|(a, b)| a * b).sum();
        let var: f64 = p.iter().zip(z).map(|(a, b)| a * (b - mean) * (b - mean)).sum();
        g += mean - z[y];
        h += var;
    }
    (f / n, g / n, h / n)
}

/// Fits the temperature on validation logits `z` (the network's pre-softmax outputs) and labels.
///
/// Errors: [`Error::Data`] for non-finite logits, bad labels or no points; [`Error::Numerical`]
/// when the NLL is flat in `T` (every validation row's logits constant) or its minimum lies
/// outside `[T_MIN, T_MAX]` (e.g. a validation set the network classifies perfectly with growing
/// margins, where the NLL decreases all the way to `T → 0`).
///
/// # Shapes
/// `logits: [N, K]`, `labels: [N]`.
pub(crate) fn fit_temperature(logits: &[f64], labels: &[usize], k: usize) -> Result<TemperatureFit> {
    if k == 0 || logits.len() != labels.len() * k {
        return Err(Error::ShapeMismatch {
            what: "temperature scaling: logits [N, K] vs labels [N]".into(),
            expected: vec![labels.len(), k],
            got: vec![logits.len()],
        });
    }
    if labels.is_empty() {
        return Err(Error::Data("temperature scaling needs at least one validation point".into()));
    }
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return Err(Error::Data(format!("temperature scaling: non-finite logit [{}, {}] = {}", i / k, i % k, logits[i])));
    }
    if let Some(i) = labels.iter().position(|&y| y >= k) {
        return Err(Error::Data(format!("temperature scaling: label {i} is {}, not < K = {k}", labels[i])));
    }
    let at = |u: f64| nll_derivatives(logits, labels, k, u.exp());
    let (nll_before, g1, h1) = at(0.0);
    if h1 == 0.0 {
        return Err(Error::Numerical(
            "temperature scaling: the validation NLL does not depend on T (every row's logits are constant)".into(),
        ));
    }
    // u = ln β = −ln T. F′(β(u)) increases with u; bracket its root in [lo, hi].
    let (mut lo, mut hi) = (-(T_MAX.ln()), -(T_MIN.ln()));
    let (_, g_lo, _) = at(lo);
    let (_, g_hi, _) = at(hi);
    if g_lo >= 0.0 {
        return Err(Error::Numerical(format!(
            "temperature scaling: the validation NLL still decreases at T = {T_MAX} (dNLL/dβ = {g_lo:e} ≥ 0 at β = 1/{T_MAX}); no temperature in [{T_MIN}, {T_MAX}] minimises it"
        )));
    }
    if g_hi <= 0.0 {
        return Err(Error::Numerical(format!(
            "temperature scaling: the validation NLL still decreases at T = {T_MIN} (dNLL/dβ = {g_hi:e} ≤ 0 at β = 1/{T_MIN}); no temperature in [{T_MIN}, {T_MAX}] minimises it"
        )));
    }
    let (mut u, mut g, mut h) = (0.0, g1, h1);
    let mut iterations = 0;
    for it in 1..=200 {
        iterations = it;
        if g == 0.0 {
            break;
        }
        if g < 0.0 {
            lo = lo.max(u);
        } else {
            hi = hi.min(u);
        }
        // Newton in u: d F′/du = β F″(β).
        let beta = u.exp();
        let step = -g / (beta * h);
        let mut next = u + step;
        if !(next > lo && next < hi && step.is_finite()) {
            next = 0.5 * (lo + hi);
        }
        let done = (next - u).abs() <= 1e-15 * (1.0 + u.abs()) || hi - lo <= 1e-15 * (1.0 + u.abs());
        let (_, gn, hn) = at(next);
        u = next;
        g = gn;
        h = hn;
        if done {
            break;
        }
    }
    let (nll_after, gradient, _) = at(u);
    Ok(TemperatureFit { temperature: (-u).exp(), nll_before, nll_after, gradient, iterations, n: labels.len() })
}

/// `softmax(z / T)` row-wise.
///
/// # Shapes
/// `logits: [N, K]`; returns `[N, K]`.
pub(crate) fn tempered_softmax(logits: &[f64], k: usize, temperature: f64) -> Result<Vec<f64>> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(Error::Config(format!("temperature must be finite and > 0, got {temperature}")));
    }
    let scaled: Vec<f64> = logits.iter().map(|z| z / temperature).collect();
    super::metrics::softmax_rows(&scaled, k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uncertainty::metrics::nll;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::StandardNormal;

    /// Two classes, logit margin d on every point, n1 points right and n0 wrong: the optimum has
    /// σ(β d) = n1 / (n0 + n1), i.e. T = d / ln(n1 / n0).
    #[test]
    fn closed_form_two_class_case() {
        let d = 2.0;
        let logits = [d, 0.0, d, 0.0, d, 0.0, d, 0.0];
        let labels = [0, 0, 0, 1];
        let fit = fit_temperature(&logits, &labels, 2).unwrap();
        let want = d / 3.0f64.ln();
        assert!((fit.temperature - want).abs() < 1e-12 * want, "{} vs {want}", fit.temperature);
        assert!(fit.gradient.abs() < 1e-14);
        // NLL at the optimum: −(3/4) ln(3/4) − (1/4) ln(1/4).
        let h = -(0.75f64 * 0.75f64.ln() + 0.25 * 0.25f64.ln());
        assert!((fit.nll_after - h).abs() < 1e-14);
        assert!(fit.nll_after <= fit.nll_before);
        let p = tempered_softmax(&logits, 2, fit.temperature).unwrap();
        assert!((p[0] - 0.75).abs() < 1e-13);
        assert!((nll(&p, &labels, 2).unwrap() - fit.nll_after).abs() < 1e-14);
        // Scaling the logits scales the temperature.
        let l3: Vec<f64> = logits.iter().map(|v| 3.0 * v).collect();
        let f3 = fit_temperature(&l3, &labels, 2).unwrap();
        assert!((f3.temperature - 3.0 * want).abs() < 1e-12 * want);
    }

    #[test]
    fn matches_a_fine_grid_search() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let (n, k) = (300, 5);
        let mut logits = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..n {
            let y = rng.gen_range(0..k);
            for c in 0..k {
                let z: f64 = rng.sample(StandardNormal);
                logits.push(3.0 * z + if c == y { 2.5 } else { 0.0 });
            }
            labels.push(y);
        }
        let fit = fit_temperature(&logits, &labels, k).unwrap();
        let f = |t: f64| nll(&tempered_softmax(&logits, k, t).unwrap(), &labels, k).unwrap();
        // Golden-section search on ln T as the slow obvious reference.
        let (mut a, mut b) = (T_MIN.ln(), T_MAX.ln());
        let r = (5f64.sqrt() - 1.0) / 2.0;
        for _ in 0..200 {
            let (c, d) = (b - r * (b - a), a + r * (b - a));
            if f(c.exp()) < f(d.exp()) {
                b = d;
            } else {
                a = c;
            }
        }
        let t_ref = (0.5 * (a + b)).exp();
        assert!((fit.temperature - t_ref).abs() < 1e-6 * t_ref, "{} vs {t_ref}", fit.temperature);
        assert!(fit.nll_after <= f(t_ref) + 1e-14);
        assert!((fit.nll_after - f(fit.temperature)).abs() < 1e-13);
        assert!(fit.temperature > 1.0, "noisy over-confident logits need T > 1: {}", fit.temperature);
    }

    #[test]
    fn errors_are_loud() {
        assert!(fit_temperature(&[0.0, f64::NAN], &[0], 2).unwrap_err().to_string().contains("non-finite"));
        assert!(fit_temperature(&[0.0, 1.0], &[2], 2).is_err());
        assert!(fit_temperature(&[0.0, 1.0, 2.0], &[0], 2).is_err());
        assert!(fit_temperature(&[], &[], 2).is_err());
        // Constant rows: the NLL is flat in T.
        assert!(fit_temperature(&[1.0, 1.0, 0.0, 0.0], &[0, 1], 2).unwrap_err().to_string().contains("does not depend"));
        // Every point right: the NLL falls all the way to T → 0.
        let e = fit_temperature(&[1.0, 0.0, 0.0, 1.0], &[0, 1], 2).unwrap_err().to_string();
        assert!(e.contains("T = 0.01"), "{e}");
        // Every point wrong: the optimum is T → ∞ (β → 0 and beyond).
        let e = fit_temperature(&[1.0, 0.0, 0.0, 1.0], &[1, 0], 2).unwrap_err().to_string();
        assert!(e.contains("T = 100"), "{e}");
        assert!(tempered_softmax(&[0.0, 1.0], 2, 0.0).is_err());
        assert!(tempered_softmax(&[0.0, 1.0], 2, f64::NAN).is_err());
    }
}
