//! Which training points drive a prediction (EPK paper Fig. 6): per-training-point
//! contributions of the kernel machine and the strongest supporters and opponents of an output,
//! on flat Grams and on the kernel engine's output ([`machine_contributions`], [`baseline`]:
//! what `Gram::contributions` and `Gram::baseline` of the front door return).

use serde::{Deserialize, Serialize};

use crate::analysis::{check_finite, check_len};
use crate::error::{Error, Result};
use crate::kernel::{KernelKind, KernelOutput};

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

/// Refuses a kernel whose machine is not the network's path (the NTK's is a linearisation; the
/// `path` kernel's is not a training point's sum): attribution needs epk, dpk or kprime.
pub fn require_path_machine(kind: KernelKind) -> Result<()> {
    if matches!(kind, KernelKind::Ntk | KernelKind::Path) {
        return Err(Error::Config(format!("attribution needs a path kernel whose machine is the network's path (epk, dpk, kprime); the {kind} machine is not")));
    }
    Ok(())
}

/// Whether `a_{i,s}` is the same for every step of `out`, so that Theorem 3.7's single machine
/// applies.
pub fn constant_a(out: &KernelOutput) -> bool {
    let mk = out.m * out.k;
    let n = out.a.len() / mk.max(1);
    (1..n).all(|s| out.a[s * mk..(s + 1) * mk] == out.a[..mk])
}

/// Contributions of every training point to every row's output of a full-layout kernel output:
/// [`contributions`] when `a_{i,s}` is constant over the steps (Theorem 3.7), else
/// [`contributions_per_step`] on the per-step Grams (Theorem 3.6). The kind is checked by
/// [`require_path_machine`] and the layout by the caller. # Shapes `[P, M, K]`.
///
/// Errors: `a_{i,s}` varying by step without per-step Grams, and those of the two above.
pub fn machine_contributions(out: &KernelOutput) -> Result<Vec<f64>> {
    let (p, m, k) = (out.p, out.m, out.k);
    let mk = m * k;
    if constant_a(out) {
        return contributions(&out.gram, &out.a[..mk], p, m, k);
    }
    let per_step = out.per_step.as_ref().ok_or_else(|| {
        Error::Config("a_{i,s} varies by step: the single machine does not apply; compute the Gram with `.per_step()` (`pathkernel kernel --per-step`) for the ensemble attribution".into())
    })?;
    let a_steps: Vec<f64> = out.steps.iter().flat_map(|&s| out.a[s * mk..(s + 1) * mk].iter().copied()).collect();
    contributions_per_step(per_step, &a_steps, out.steps.len(), p, m, k)
}

/// The network output minus what belongs to no training point: the bias `f_{w_0}(x_p)` plus
/// the weight-decay, rounding and carried-in terms when present. # Shapes `[P, K]`.
pub fn baseline(out: &KernelOutput) -> Vec<f64> {
    // The non-data terms summed first, then added to the bias.
    let mut non_data: Option<Vec<f64>> = None;
    for t in [&out.reg, &out.rounding, &out.carried].into_iter().flatten() {
        match non_data.as_mut() {
            Some(n) => n.iter_mut().zip(t).for_each(|(n, t)| *n += t),
            None => non_data = Some(t.clone()),
        }
    }
    match non_data {
        Some(t) => out.bias.iter().zip(&t).map(|(b, t)| b + t).collect(),
        None => out.bias.clone(),
    }
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

/// The `top` largest positive scores (supporters, largest first) and the `top` most negative
/// (opponents, most negative first), as `(index, score)`; ties by index. Any per-training-point
/// attribution (the EPK's contributions, TRAK's scores) ranks this way.
///
/// # Shapes
/// `scores [M]`.
pub fn extremes(scores: &[f64], top: usize) -> (Vec<(usize, f64)>, Vec<(usize, f64)>) {
    let mut pos: Vec<(usize, f64)> = scores.iter().copied().enumerate().filter(|&(_, v)| v > 0.0).collect();
    pos.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
    pos.truncate(top);
    let mut neg: Vec<(usize, f64)> = scores.iter().copied().enumerate().filter(|&(_, v)| v < 0.0).collect();
    neg.sort_by(|x, y| x.1.total_cmp(&y.1).then(x.0.cmp(&y.0)));
    neg.truncate(top);
    (pos, neg)
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
            let scores: Vec<f64> = (0..m).map(|i| rows[i * k + class]).collect();
            let total: f64 = scores.iter().sum();
            let (pos, neg) = extremes(&scores, top);
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rng(seed: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(seed)
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

}
