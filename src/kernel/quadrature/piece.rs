//! One smooth piece of a ReLU network's path between two kinks, shared by the CNN's and the
//! MLP's adaptive rules: its logits are a known quadratic in t and the Gram of their gradients
//! a quadratic too, so the integrated softmax moments and self-kernel need a scalar quadrature
//! only (Gauss–Legendre of orders [`ORDERS`], compared, bisected until they agree).

use crate::kernel::quadrature::gauss_legendre_01;

/// Gauss–Legendre orders compared on each piece of the scalar quadrature.
pub(crate) const ORDERS: (usize, usize) = (8, 16);
/// Bisections of one piece before it is accepted as unconverged.
const MAX_DEPTH: u32 = 40;
/// Intervals one piece may spend before the rest is accepted as unconverged.
const MAX_INTERVALS: usize = 4096;

/// The dense output layer's share of one piece: `Ā += L ã_0 + T ã_1` and (softmax)
/// `B̄[o] += S_0[o] ã_0 + S_1[o] ã_1`.
///
/// # Shapes
/// `ab` `[K+1, nf]`, `a0`, `a1` `[nf]`, `s` `[2K]` (`[S_0; S_1]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_dense_moments(ab: &mut [f64], a0: &[f64], a1: &[f64], l: f64, t: f64, s: &[f64], k: usize, softmax: bool) {
    let nf = a0.len();
    let (wbar, vbar) = ab.split_at_mut(nf);
    for ((w, &x0), &x1) in wbar.iter_mut().zip(a0).zip(a1) {
        *w += l * x0 + t * x1;
    }
    if softmax {
        for o in 0..k {
            let (s0, s1) = (s[o], s[k + o]);
            for ((v, &x0), &x1) in vbar[o * nf..(o + 1) * nf].iter_mut().zip(a0).zip(a1) {
                *v += s0 * x0 + s1 * x1;
            }
        }
    }
}

/// One smooth piece: the logits' quadratic, the Gram of `∇z` (`H(t) = H_0 + tH_1 + t²H_2`, the
/// dense part `|ã(t)|²` on its diagonal) and the offset. Shared by the CNN ([`crate::kernel::stack::closed::conv_relu_pool::pieces`])
/// and the MLP ([`crate::kernel::stack::closed::dense_relu::pieces`]).
pub(crate) struct Piece<'a> {
    k: usize,
    alpha: f64,
    /// `z(t) = c[0] + t c[1] + t² c[2]`, `[3, K]`.
    c: Vec<f64>,
    /// `[3, K, K]`.
    h: Vec<f64>,
    off: Option<&'a [f64]>,
    /// Scale of `H` (the rounding floor of the self-kernel's check).
    hscale: f64,
}

impl<'a> Piece<'a> {
    /// A piece from its logits' coefficients `c` (`[3, K]`: `z(t) = c_0 + t c_1 + t² c_2`, before
    /// the offset and α) and the Gram of the logits' gradients `h` (`[3, K, K]`).
    pub(crate) fn from_parts(k: usize, alpha: f64, c: Vec<f64>, h: Vec<f64>, off: Option<&'a [f64]>) -> Self {
        assert!(c.len() == 3 * k && h.len() == 3 * k * k, "a piece has [3, K] logit and [3, K, K] Gram coefficients");
        let hscale = alpha * alpha * h.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        Piece { k, alpha, c, h, off, hscale }
    }

    /// Adds to `acc` (`[2K + K²]`) `w·[p(t), t p(t), (D H(t) Dᵀ)]` (`p = 0`, `D = αI` for the
    /// identity map).
    pub(crate) fn add_node(&self, t: f64, w: f64, softmax: bool, acc: &mut [f64], p: &mut [f64], hp: &mut [f64]) {
        let k = self.k;
        let a2 = self.alpha * self.alpha;
        let hk = k * k;
        if softmax {
            for o in 0..k {
                let z = self.c[o] + t * (self.c[k + o] + t * self.c[2 * k + o]);
                p[o] = self.alpha * (z - self.off.map_or(0.0, |v| v[o]));
            }
            let mx = p.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            p.iter_mut().for_each(|v| *v = (*v - mx).exp());
            let sum: f64 = p.iter().sum();
            p.iter_mut().for_each(|v| *v /= sum);
            for o in 0..k {
                acc[o] += w * p[o];
                acc[k + o] += w * t * p[o];
            }
        }
        // H(t) into acc's self-kernel part through D.
        let ht = |o: usize, q: usize| self.h[o * k + q] + t * (self.h[hk + o * k + q] + t * self.h[2 * hk + o * k + q]);
        let dg = &mut acc[2 * k..];
        if softmax {
            let mut php = 0.0;
            for o in 0..k {
                hp[o] = (0..k).map(|q| ht(o, q) * p[q]).sum();
                php += p[o] * hp[o];
            }
            for o in 0..k {
                for q in 0..k {
                    dg[o * k + q] += w * a2 * (ht(o, q) - hp[o] - hp[q] + php);
                }
            }
        } else {
            for o in 0..k {
                for q in 0..k {
                    dg[o * k + q] += w * a2 * ht(o, q);
                }
            }
        }
    }

    /// `[S_0, S_1]` (`[2K]`, zero for the identity map), the self-kernel `[K, K]` over `[a, b]`
    /// and the number of unconverged intervals.
    pub(crate) fn integrate(&self, a: f64, b: f64, tol: f64, softmax: bool) -> (Vec<f64>, Vec<f64>, usize) {
        let k = self.k;
        let n = 2 * k + k * k;
        let mut total = vec![0.0; n];
        let mut bad = 0;
        let (mut p, mut hp) = (vec![0.0; k], vec![0.0; k]);
        let (mut q1, mut q2) = (vec![0.0; n], vec![0.0; n]);
        let mut stack = vec![(a, b, 0u32)];
        let mut spent = 0;
        // The largest difference, NaN if any (a NaN fails the test and is not bisected).
        let diff = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(u, v)| (u - v).abs()).fold(0.0, |m: f64, d| if d.is_nan() || m.is_nan() { f64::NAN } else { m.max(d) });
        while let Some((lo, hi, depth)) = stack.pop() {
            spent += 1;
            for (q, order) in [(&mut q1, ORDERS.0), (&mut q2, ORDERS.1)] {
                q.iter_mut().for_each(|v| *v = 0.0);
                for (t, w) in gauss_legendre_01(order, lo, hi) {
                    self.add_node(t, w, softmax, q, &mut p, &mut hp);
                }
            }
            let rel = tol.max(8.0 * f64::EPSILON) * (hi - lo);
            let (es, ed) = (diff(&q1[..2 * k], &q2[..2 * k]), diff(&q1[2 * k..], &q2[2 * k..]));
            let ok = es <= rel && ed <= rel * self.hscale.max(f64::MIN_POSITIVE);
            let give_up = es.is_nan() || ed.is_nan() || depth >= MAX_DEPTH || hi - lo <= 1e-12 || spent + stack.len() >= MAX_INTERVALS;
            if ok || give_up {
                if !ok {
                    bad += 1;
                }
                total.iter_mut().zip(&q2).for_each(|(x, y)| *x += y);
            } else {
                let mid = 0.5 * (lo + hi);
                stack.push((lo, mid, depth + 1));
                stack.push((mid, hi, depth + 1));
            }
        }
        let dg = total.split_off(2 * k);
        (total, dg, bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_quadrature_bisects_a_sharp_softmax() {
        // Two classes, logit difference 400(t − 0.3): p_0 switches within ~1/400 of t = 0.3.
        let p = Piece { k: 2, alpha: 1.0, c: vec![0.0, -120.0, 0.0, 400.0, 0.0, 0.0], h: vec![0.0; 12], off: None, hscale: 0.0 };
        let (s, _, bad) = p.integrate(0.0, 1.0, 1e-15, true);
        assert_eq!(bad, 0);
        // A NaN logit is reported (one unconverged interval, NaN moments), not bisected away.
        let nan = Piece { c: vec![f64::NAN, 0.0, 0.0, 0.0, 0.0, 0.0], ..Piece { k: 2, alpha: 1.0, c: Vec::new(), h: vec![0.0; 12], off: None, hscale: 0.0 } };
        let (sn, _, badn) = nan.integrate(0.0, 1.0, 1e-15, true);
        assert_eq!(badn, 1);
        assert!(sn.iter().all(|v| v.is_nan()));
        // ∫ σ(400(t − 0.3)) dt = [ln(1 + e^{400(t−0.3)})/400]_0^1.
        let soft = |x: f64| x.max(0.0) + (-x.abs()).exp().ln_1p();
        let exact = (soft(280.0) - soft(-120.0)) / 400.0;
        assert!((s[1] - exact).abs() <= 1e-14, "{} vs {exact}", s[1]);
        assert!((s[0] + s[1] - 1.0).abs() <= 1e-14);
    }
}
