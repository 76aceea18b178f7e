//! The CNN's adaptive (`auto`) rule for ReLU networks without gradient evaluations at
//! quadrature nodes: the rows' side of a step integrated piece by piece between the kinks.
//!
//! Along step s (`w_s(t) = w_s + tΔw`) the conv pre-activations are affine in t, so between two
//! consecutive kinks ([`CnnStep::kinks_of`]: a ReLU zero crossing or a max-pool switch) the
//! pool/ReLU pattern is fixed and everything but the output map is polynomial in t:
//!
//! - the pooled activations (bias column included) are affine: `ã(t) = ã_0 + t ã_1` (`[nf]`;
//!   each feature is its window's chosen unit `Z_0 + tZ_1`, or 0);
//! - the logits are quadratic: `z(t) = (W_d + tΔW_d) ã(t) = c_0 + c_1 t + c_2 t²` (`[K]`);
//! - the logits' conv gradients are affine: `∇_{W_c} z_o(t) = E_0[o] + t E_1[o]` (`[Co, ne]`:
//!   the rows of `W_d` and `ΔW_d` routed through the pattern to the chosen units, times their
//!   patches).
//!
//! With the output sensitivities `δ_out[k, o](t) = α(δ_{ko} − p_o(t))` (`p` the softmax of the
//! outputs; `α δ_{ko}` for the identity map) the integrated gradient over a piece `[a, b]` is
//!
//! `∫∇_{W_c} f^k = α(L E_0[k] + T E_1[k] − Σ_o (S_0[o] E_0[o] + S_1[o] E_1[o]))`,
//! `∫∇_{W_d} f^k = α(e_k ⊗ (L ã_0 + T ã_1) − Σ_o e_o ⊗ (S_0[o] ã_0 + S_1[o] ã_1))`,
//!
//! with `L = b − a`, `T = (b² − a²)/2`, `S_m[o] = ∫_a^b t^m p_o(t) dt` — exactly: only the
//! scalars `S_m` need a quadrature, and they cost no network evaluation (`z(t)` is a known
//! quadratic). The self-kernel's integrand `⟨∇f^k(t), ∇f^{k'}(t)⟩ = (D H(t) Dᵀ)[k, k']`, with
//! `D = α(I − 1pᵀ)` and `H(t)[o, o'] = ⟨E_0[o] + tE_1[o], E_0[o'] + tE_1[o']⟩ + δ_{oo'}|ã(t)|²`
//! quadratic in t, goes through the same scalar quadrature. Each piece's scalars are integrated
//! by Gauss–Legendre of orders [`crate::kernel::quadrature::piece::ORDERS`], accepted when the two agree to `tol·(b − a)` (or the
//! rounding floor), else bisected.
//!
//! Per point and step, `E_0` and `E_1` are formed once (two backward passes' worth of work:
//! the gradient evaluations this path reports) and updated at each kink by the units that
//! switch (`K·ne` per unit); the rest is forward-only work per piece.

use crate::kernel::stack::closed::conv_relu_pool::step::{CnnStep, SideFactors};
use crate::kernel::quadrature::piece::{add_dense_moments, Piece};
use crate::model::{Activation, OutputKind};
use rayon::prelude::*;

/// A pool window with no active unit (ReLU zero).
const NONE: usize = usize::MAX;

/// Gradient evaluations this path reports per point and step (`E_0` and `E_1`).
pub(crate) const EVALUATIONS: usize = 2;

/// The integrated rows' side of one step for one point, and what it cost.
pub(crate) struct PointFactors {
    /// `∫ ∇_{W_c} f^k dt` `[K, Co·ne]`.
    pub gc: Vec<f64>,
    /// `∫ ∇_{W_d} f^k dt = α(e_k ⊗ Ā − Σ_o e_o ⊗ B̄[o])` as its K + 1 distinct rows `[Ā; B̄]`
    /// `[K+1, nf]` (`Ā = ∫ã dt`, `B̄[o] = ∫p_o ã dt`; the form of [`crate::kernel::layout::add_output_layer`]).
    pub ab: Vec<f64>,
    /// `∫ ⟨∇f^k, ∇f^{k'}⟩ dt` `[K, K]`.
    pub diag: Vec<f64>,
    /// Smooth pieces (kinks + 1).
    pub pieces: usize,
    /// Scalar-quadrature intervals that did not reach the tolerance.
    pub unconverged: usize,
}

/// The rows' factors of a block of points, each integrated over the step exactly between its
/// kinks (the scalars to tolerance `tol`): conv gradients and self-kernels as [`SideFactors`]
/// (`[n, K, Co·ne]`, `[n, K, K]`), the dense gradients' `[Ā; B̄]` (`[n, K+1, nf]`,
/// [`PointFactors::ab`]), and per point `(pieces, unconverged)`.
///
/// # Shapes
/// `x` `[n, C·H·W]`, `off` `[n, K]`.
pub(crate) fn row_factors(step: &CnnStep, x: &[f64], off: Option<&[f64]>, tol: f64) -> (SideFactors, Vec<f64>, Vec<(usize, usize)>) {
    let (d, k) = (step.input_dim(), step.k);
    let per: Vec<PointFactors> = x.par_chunks(d).enumerate().map(|(pi, xp)| integrate_point(step, xp, off.map(|o| &o[pi * k..(pi + 1) * k]), tol)).collect();
    let mut gc = Vec::with_capacity(per.len() * k * step.co * step.ne);
    let mut diag = Vec::with_capacity(per.len() * k * k);
    let mut ab = Vec::with_capacity(per.len() * (k + 1) * step.nf);
    let mut stats = Vec::with_capacity(per.len());
    for pf in per {
        gc.extend(pf.gc);
        diag.extend(pf.diag);
        ab.extend(pf.ab);
        stats.push((pf.pieces, pf.unconverged));
    }
    (SideFactors { gc, diag }, ab, stats)
}

/// The pool/ReLU pattern at time `t`: per pooled feature, the unit `q = pos·Co + o` that
/// carries it (its window's first maximum, as `model::conv::max_pool2d`), or [`NONE`] when the ReLU zeroes it. `z0`, `z1` `[pos, Co]`; writes `sel`
/// `[Co·Hp·Wp]`.
fn pattern(step: &CnnStep, z0: &[f64], z1: &[f64], t: f64, sel: &mut [usize]) {
    let mut best = vec![f64::NEG_INFINITY; sel.len()];
    step.pool_at(z0, z1, t, &mut best, sel);
    for s in sel.iter_mut() {
        if Activation::Relu.derivative(z0[*s] + t * z1[*s]) == 0.0 {
            *s = NONE;
        }
    }
}

/// One image along the step: its patches, pre-activation lines, the current pattern, and for
/// it the logits' conv gradients `E_0 + tE_1` and the pooled activations `ã_0 + tã_1`.
struct Along<'a> {
    step: &'a CnnStep,
    u: Vec<f64>,
    z0: Vec<f64>,
    z1: Vec<f64>,
    sel: Vec<usize>,
    next: Vec<usize>,
    /// `[K, Co·ne]` each.
    e0: Vec<f64>,
    e1: Vec<f64>,
    /// `[nf]` each.
    a0: Vec<f64>,
    a1: Vec<f64>,
}

impl<'a> Along<'a> {
    fn new(step: &'a CnnStep, x: &[f64]) -> Self {
        let (k, cne, nf, fdim) = (step.k, step.co * step.ne, step.nf, step.co * step.hp * step.wp);
        let u = step.patches(x);
        let (z0, z1) = step.pre(&u);
        Along { step, u, z0, z1, sel: vec![NONE; fdim], next: vec![NONE; fdim], e0: vec![0.0; k * cne], e1: vec![0.0; k * cne], a0: vec![0.0; nf], a1: vec![0.0; nf] }
    }

    /// Computes the pattern at `t` into `next`; whether it differs from the current one.
    fn probe(&mut self, t: f64) -> bool {
        pattern(self.step, &self.z0, &self.z1, t, &mut self.next);
        self.next != self.sel
    }

    /// Makes the probed pattern current: routes the units that switch into or out of `E`
    /// (`E_m[o, ch, :] ±= W_m[o, f]·Ũ[pos, :]`, `K·ne` each) and sets `ã_0`, `ã_1`.
    fn switch(&mut self) {
        let st = self.step;
        let (k, co, ne, nf) = (st.k, st.co, st.ne, st.nf);
        let cne = co * ne;
        let (u, e0, e1) = (&self.u, &mut self.e0, &mut self.e1);
        let mut route = |q: usize, f: usize, s: f64| {
            let (p, ch) = (q / co, q % co);
            let up = &u[p * ne..(p + 1) * ne];
            for o in 0..k {
                let (w, dw) = (s * st.wd[o * nf + f], s * st.dwd[o * nf + f]);
                let base = o * cne + ch * ne;
                for ((a, b), &v) in e0[base..base + ne].iter_mut().zip(&mut e1[base..base + ne]).zip(up) {
                    *a += w * v;
                    *b += dw * v;
                }
            }
        };
        for (f, (s, &n)) in self.sel.iter_mut().zip(&self.next).enumerate() {
            if n != *s {
                if *s != NONE {
                    route(*s, f, -1.0);
                }
                if n != NONE {
                    route(n, f, 1.0);
                }
                *s = n;
            }
        }
        for (f, &q) in self.sel.iter().enumerate() {
            (self.a0[f], self.a1[f]) = if q == NONE { (0.0, 0.0) } else { (self.z0[q], self.z1[q]) };
        }
        if st.bias {
            (self.a0[nf - 1], self.a1[nf - 1]) = (1.0, 0.0);
        }
    }
}

/// The moments of one piece (one pattern) `[a, b]`: `L = b − a`, `T = ∫t dt`, `[S_0; S_1]`
/// (`∫p dt`, `∫t p dt`, `[2K]`) and the self-kernel `∫D H Dᵀ dt` (`[K, K]`).
struct Moments {
    l: f64,
    t: f64,
    s: Vec<f64>,
    diag: Vec<f64>,
}


/// Adds one run's moments on the current pattern of `al` into the factors (module docs).
fn add_run(al: &Along<'_>, mo: &Moments, softmax: bool, gc: &mut [f64], ab: &mut [f64], diag: &mut [f64], y: &mut [f64]) {
    let st = al.step;
    let (k, alpha) = (st.k, st.alpha);
    let cne = st.co * st.ne;
    let (l, t, s) = (mo.l, mo.t, &mo.s);
    let (e0, e1, a0, a1) = (&al.e0, &al.e1, &al.a0, &al.a1);
    add_dense_moments(ab, a0, a1, l, t, s, k, softmax);
    y.iter_mut().for_each(|v| *v = 0.0);
    if softmax {
        for o in 0..k {
            let (s0, s1) = (s[o], s[k + o]);
            // Y = Σ_o S_0[o] E_0[o] + S_1[o] E_1[o].
            for ((yv, &x0), &x1) in y.iter_mut().zip(&e0[o * cne..(o + 1) * cne]).zip(&e1[o * cne..(o + 1) * cne]) {
                *yv += s0 * x0 + s1 * x1;
            }
        }
    }
    // Conv: α(L E_0[k] + T E_1[k] − Y).
    for kk in 0..k {
        let g = &mut gc[kk * cne..(kk + 1) * cne];
        for (((gv, &x0), &x1), &yv) in g.iter_mut().zip(&e0[kk * cne..(kk + 1) * cne]).zip(&e1[kk * cne..(kk + 1) * cne]).zip(y.iter()) {
            *gv += alpha * (l * x0 + t * x1 - yv);
        }
    }
    diag.iter_mut().zip(&mo.diag).for_each(|(x, v)| *x += v);
}

/// The rows' side of one step for the image `x` (`[C·H·W]`, offset `off` `[K]`), integrated
/// exactly between the kinks (the ReLU's `σ(z) = σ'(z)·z` makes a pooled activation affine
/// there), the scalars to tolerance `tol`; see the module docs.
pub(crate) fn integrate_point(step: &CnnStep, x: &[f64], off: Option<&[f64]>, tol: f64) -> PointFactors {
    let (k, nf, cne) = (step.k, step.nf, step.co * step.ne);
    let softmax = step.output == OutputKind::LogSoftmax;
    let mut al = Along::new(step, x);
    let mut gc = vec![0.0; k * cne];
    let mut diag = vec![0.0; k * k];
    let mut ab = vec![0.0; (k + 1) * nf];
    let mut y = vec![0.0; cne];
    let (mut pieces, mut unconverged) = (0, 0);
    let mut bps = vec![0.0];
    bps.extend(step.kinks_of(&al.z0, &al.z1, 0.0, 1.0));
    bps.push(1.0);
    for w in bps.windows(2) {
        let (a, b) = (w[0], w[1]);
        if al.probe(0.5 * (a + b)) || pieces == 0 {
            al.switch();
        }
        let (s, dg, bad) = piece_along(step, &al, off).integrate(a, b, tol, softmax);
        unconverged += bad;
        let mo = Moments { l: b - a, t: 0.5 * (b * b - a * a), s, diag: dg };
        add_run(&al, &mo, softmax, &mut gc, &mut ab, &mut diag, &mut y);
        pieces += 1;
    }
    PointFactors { gc, ab, diag, pieces, unconverged }
}

/// The piece of `step` on the current pattern of `al`.
fn piece_along<'a>(step: &CnnStep, al: &Along<'_>, off: Option<&'a [f64]>) -> Piece<'a> {
    let (k, nf) = (step.k, step.nf);
    let (e0, e1, a0, a1) = (&al.e0, &al.e1, &al.a0, &al.a1);
    let cne = e0.len() / k;
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    let mut c = vec![0.0; 3 * k];
    for o in 0..k {
        let (w, dw) = (&step.wd[o * nf..(o + 1) * nf], &step.dwd[o * nf..(o + 1) * nf]);
        c[o] = dot(w, a0);
        c[k + o] = dot(dw, a0) + dot(w, a1);
        c[2 * k + o] = dot(dw, a1);
    }
    let mut h = vec![0.0; 3 * k * k];
    for o in 0..k {
        let (x0, x1) = (&e0[o * cne..(o + 1) * cne], &e1[o * cne..(o + 1) * cne]);
        for q in o..k {
            let (y0, y1) = (&e0[q * cne..(q + 1) * cne], &e1[q * cne..(q + 1) * cne]);
            let v = [dot(x0, y0), dot(x0, y1) + dot(x1, y0), dot(x1, y1)];
            for m in 0..3 {
                h[(m * k + o) * k + q] = v[m];
                h[(m * k + q) * k + o] = v[m];
            }
        }
    }
    let aa = [dot(a0, a0), 2.0 * dot(a0, a1), dot(a1, a1)];
    for m in 0..3 {
        for o in 0..k {
            h[(m * k + o) * k + o] += aa[m];
        }
    }
    Piece::from_parts(k, step.alpha, c, h, off)
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::quadrature::gauss_legendre_01;
    use crate::kernel::stack::closed::conv_relu_pool::gram::tests::{cases, rel, setup};
    use crate::kernel::stack::closed::conv_relu_pool::gram::{offsets, side_factors, CnnStep};
    use crate::kernel::stack::closed::shape::ConvReluPool;

    /// The slow obvious path: gradients evaluated at a fixed high-order Gauss rule on every
    /// smooth piece, summed with their weights.
    #[test]
    fn integrated_rows_equal_high_order_gauss_per_piece() {
        let mut worst: f64 = 0.0;
        let mut kinks = 0;
        for (ci, c) in cases().iter().enumerate().filter(|(_, c)| c.6 == Activation::Relu) {
            let (arch, init, ws, next, rows, _) = setup(c, 40 + ci as u64);
            let step = CnnStep::new(&ConvReluPool::of(&arch), &ws, Some(&next)).unwrap();
            let d = arch.input_dim();
            let off = offsets(&arch, &init, &rows).unwrap();
            let p = rows.len() / d;
            let (fast, ab_fast, stats) = row_factors(&step, &rows, off.as_deref(), 1e-15);
            assert!(stats.iter().all(|s| s.1 == 0), "case {ci}: unconverged {stats:?}");
            let nodes: Vec<Vec<(f64, f64)>> = (0..p)
                .map(|pi| {
                    let mut bps = vec![0.0];
                    bps.extend(step.kinks(&rows[pi * d..(pi + 1) * d], 0.0, 1.0));
                    bps.push(1.0);
                    kinks += bps.len() - 2;
                    bps.windows(2).flat_map(|w| gauss_legendre_01(30, w[0], w[1])).collect()
                })
                .collect();
            let (slow, ab_slow, _) = side_factors(&step, &rows, off.as_deref(), &nodes, false);
            let e = [rel(&fast.gc, &slow.gc), rel(&ab_fast, &ab_slow), rel(&fast.diag, &slow.diag)];
            assert!(e.iter().all(|&v| v <= 1e-13), "case {ci}: conv, dense, self-kernel relative differences {e:?}");
            assert_eq!(stats.iter().map(|s| s.0).sum::<usize>(), p + rows.chunks(d).map(|x| step.kinks(x, 0.0, 1.0).len()).sum::<usize>());
            worst = e.iter().fold(worst, |m, &v| m.max(v));
        }
        assert!(kinks > 10, "too few kinks ({kinks}) for a meaningful test");
        eprintln!("integrated CNN rows vs Gauss(30) per piece: max relative difference {worst:e} over {kinks} kinks");
    }

}
