//! The MLP's adaptive (`auto`) rule for one-hidden-layer ReLU networks without gradient
//! evaluations at quadrature nodes: the rows' side of a step integrated piece by piece between
//! the kinks, as [`crate::kernel::stack::closed::conv_relu_pool::pieces`] does for the CNN.
//!
//! Along step s (`w_s(t) = w_s + tΔw`) the hidden pre-activations of a point are `z + t·u`
//! ([`crate::kernel::stack::closed::dense_relu::step::FirstLayer`]), so between two consecutive kinks (`t = −z_j/u_j`) the ReLU
//! pattern `m` is fixed and
//!
//! - the hidden activations (bias column included) are affine: `ã(t) = ã_0 + t ã_1`;
//! - the logits are quadratic: `z(t) = (W + tΔW) ã(t) = c_0 + c_1 t + c_2 t²` (`W`, `ΔW` the
//!   output layer `[K, h(+1)]`);
//! - layer 0's sensitivities are `δ_0[k](t) = α m ⊙ (W + tΔW)ᵀ(e_k − p(t))` (`p` the softmax of
//!   the outputs; `p = 0` for the identity map).
//!
//! With `L = b − a`, `T = (b² − a²)/2` and `S_m[o] = ∫_a^b t^m p_o(t) dt`, a piece adds exactly
//!
//! `∫δ_0[k] = α m ⊙ (L W[k] + T ΔW[k] − Σ_o (S_0[o] W[o] + S_1[o] ΔW[o]))`,
//! `Ā += L ã_0 + T ã_1`, `B̄[o] += S_0[o] ã_0 + S_1[o] ã_1`,
//!
//! the factors [`crate::kernel::gram::GramAccumulator::add_integrated`] contracts (layer 0 as
//! `δ̄ ⊗ x`, the output layer as `α(e_k ⊗ Ā − Σ_o e_o ⊗ B̄[o])`). Only the scalars `S_m` need a
//! quadrature, on the known quadratic logits ([`crate::kernel::quadrature::piece::Piece`], Gauss–Legendre 8
//! against 16, bisected until they agree to `tol·(b − a)`). The self-kernel's integrand is
//! `(D H(t) Dᵀ)[k, k']` with `D = α(I − 1pᵀ)` and `H(t)[o, o'] = (Σ_j m_j W(t)[o, j] W(t)[o', j])
//! (|x|² + 1) + δ_{oo'}|ã(t)|²`, quadratic in t, through the same quadrature.
//!
//! Per point and step the work is `O(K·h)` per piece: no gradient is evaluated at a node. The
//! evaluations this path reports are [`EVALUATIONS`] per point and step: the two t-coefficients
//! `W`, `ΔW` routed through the pattern, a backward pass' worth each.

use crate::kernel::quadrature::piece::{add_dense_moments, Piece};
use crate::kernel::stack::closed::dense_relu::step::{relu_cuts, FirstLayer, MlpStep};
use crate::model::OutputKind;
use rayon::prelude::*;

/// Gradient evaluations this path reports per point and step.
pub(crate) const EVALUATIONS: usize = 2;

/// Whether the rows of `step` can be integrated here (its hidden layer is a ReLU by
/// construction): one hidden layer and an output layer whose sensitivities have the form `α(δ_ko − p_o)` (α ≠ 0, K ≥ 2).
pub(crate) fn applies(step: &MlpStep) -> bool {
    step.layers.len() == 2 && step.alpha != 0.0 && step.k >= 2
}

/// The integrated rows' side of one step for a block of points.
pub(crate) struct RowFactors {
    /// `∫δ_0[k] dt` `[n, K, h]`.
    pub dbar: Vec<f64>,
    /// `[Ā; B̄]` `[n, K+1, h(+1)]`.
    pub ab: Vec<f64>,
    /// `∫⟨∇f^k, ∇f^{k'}⟩ dt` `[n, K, K]`.
    pub diag: Vec<f64>,
    /// Per point: smooth pieces, unconverged scalar intervals, and (when asked) the Fig. 2
    /// measure `Σ_k (1 − cos(∇f^k_{w_s}, ∫∇f^k dt))` with its count of classes.
    pub stats: Vec<PointStats>,
}

/// A view of [`RowFactors`], possibly of a range of its points.
#[derive(Clone, Copy)]
pub(crate) struct RowFactorsRef<'a> {
    pub dbar: &'a [f64],
    pub ab: &'a [f64],
    pub diag: &'a [f64],
    pub stats: &'a [PointStats],
}

impl<'a> From<&'a RowFactors> for RowFactorsRef<'a> {
    fn from(r: &'a RowFactors) -> Self {
        RowFactorsRef { dbar: &r.dbar, ab: &r.ab, diag: &r.diag, stats: &r.stats }
    }
}

impl RowFactors {
    /// The factors of the points `range` (K outputs, h hidden units, `ne` = h (+1 with bias)).
    pub(crate) fn slice(&self, range: std::ops::Range<usize>, k: usize, h: usize, ne: usize) -> RowFactorsRef<'_> {
        let (a, b) = (range.start, range.end);
        RowFactorsRef { dbar: &self.dbar[a * k * h..b * k * h], ab: &self.ab[a * (k + 1) * ne..b * (k + 1) * ne], diag: &self.diag[a * k * k..b * k * k], stats: &self.stats[a..b] }
    }
}

/// What one point's integration cost and measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PointStats {
    pub pieces: usize,
    pub unconverged: usize,
    pub cosine_sum: f64,
    pub cosine_count: usize,
}

/// The rows' factors of the points `x` (`[n, d]`, layer 0 of the step at them in `first`,
/// offsets `off` `[n, K]`), each integrated over `[0, 1]` to tolerance `tol`; with `cosine`
/// also the Fig. 2 measure.
///
/// # Panics
/// If [`applies`] does not hold.
pub(crate) fn row_factors(step: &MlpStep, first: &FirstLayer, x: &[f64], off: Option<&[f64]>, tol: f64, cosine: bool) -> RowFactors {
    assert!(applies(step), "the integrated MLP rows need one hidden ReLU layer and a structured output");
    let (d, k, h) = (step.input_dim(), step.k, first.h);
    let n = x.len() / d;
    let per: Vec<(Vec<f64>, Vec<f64>, Vec<f64>, PointStats)> = (0..n)
        .into_par_iter()
        .map(|pi| {
            let xp = &x[pi * d..(pi + 1) * d];
            let xsq = xp.iter().map(|v| v * v).sum::<f64>() + if step.bias { 1.0 } else { 0.0 };
            integrate_point(step, &first.z[pi * h..(pi + 1) * h], &first.u[pi * h..(pi + 1) * h], xsq, off.map(|o| &o[pi * k..(pi + 1) * k]), tol, cosine)
        })
        .collect();
    let ne = h + usize::from(step.bias);
    let mut out = RowFactors { dbar: Vec::with_capacity(n * k * h), ab: Vec::with_capacity(n * (k + 1) * ne), diag: Vec::with_capacity(n * k * k), stats: Vec::with_capacity(n) };
    for (dbar, ab, diag, st) in per {
        out.dbar.extend(dbar);
        out.ab.extend(ab);
        out.diag.extend(diag);
        out.stats.push(st);
    }
    out
}

pub(crate) fn dot(x: &[f64], y: &[f64]) -> f64 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// One point's integrated factors (module docs): `z`, `u` its hidden pre-activation line
/// (`[h]`), `xsq = |x|² + [bias]`.
fn integrate_point(step: &MlpStep, z: &[f64], u: &[f64], xsq: f64, off: Option<&[f64]>, tol: f64, cosine: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>, PointStats) {
    let out = &step.layers[1];
    let (k, h, alpha) = (step.k, z.len(), step.alpha);
    let ne = h + usize::from(step.bias);
    let softmax = step.output == OutputKind::LogSoftmax;
    // Output layer rows without bias: W[o] = out.w[o·h..], ΔW[o] likewise.
    let (w, dw) = (&out.w, &out.dw);
    let mut dbar = vec![0.0; k * h];
    let mut ab = vec![0.0; (k + 1) * ne];
    let mut diag = vec![0.0; k * k];
    let mut st = PointStats::default();
    let (mut a0, mut a1) = (vec![0.0; ne], vec![0.0; ne]);
    if step.bias {
        a0[h] = 1.0;
    }
    let mut mask = vec![0.0; h];
    let mut y = vec![0.0; h];
    let mut bps = vec![0.0];
    bps.extend(relu_cuts(z, u, 0.0, 1.0));
    bps.push(1.0);
    for win in bps.windows(2) {
        let (a, b) = (win[0], win[1]);
        let tm = 0.5 * (a + b);
        for j in 0..h {
            let on = z[j] + tm * u[j] > 0.0;
            mask[j] = if on { 1.0 } else { 0.0 };
            (a0[j], a1[j]) = if on { (z[j], u[j]) } else { (0.0, 0.0) };
        }
        // Logits c_0 + t c_1 + t² c_2 and the Gram of their gradients H_0 + tH_1 + t²H_2.
        let mut c = vec![0.0; 3 * k];
        for o in 0..k {
            let (wo, dwo) = (&w[o * h..(o + 1) * h], &dw[o * h..(o + 1) * h]);
            c[o] = dot(wo, &a0[..h]) + out.b[o];
            c[k + o] = dot(dwo, &a0[..h]) + dot(wo, &a1[..h]) + out.db[o];
            c[2 * k + o] = dot(dwo, &a1[..h]);
        }
        let mut hm = vec![0.0; 3 * k * k];
        for o in 0..k {
            let (wo, dwo) = (&w[o * h..(o + 1) * h], &dw[o * h..(o + 1) * h]);
            for q in o..k {
                let (wq, dwq) = (&w[q * h..(q + 1) * h], &dw[q * h..(q + 1) * h]);
                let (mut g0, mut g1, mut g2) = (0.0, 0.0, 0.0);
                for j in 0..h {
                    let mj = mask[j];
                    g0 += mj * wo[j] * wq[j];
                    g1 += mj * (wo[j] * dwq[j] + dwo[j] * wq[j]);
                    g2 += mj * dwo[j] * dwq[j];
                }
                for (m, g) in [g0, g1, g2].into_iter().enumerate() {
                    hm[(m * k + o) * k + q] = g * xsq;
                    hm[(m * k + q) * k + o] = g * xsq;
                }
            }
        }
        let aa = [dot(&a0, &a0), 2.0 * dot(&a0, &a1), dot(&a1, &a1)];
        for (m, v) in aa.into_iter().enumerate() {
            for o in 0..k {
                hm[(m * k + o) * k + o] += v;
            }
        }
        let (s, dg, bad) = Piece::from_parts(k, alpha, c, hm, off).integrate(a, b, tol, softmax);
        st.unconverged += bad;
        st.pieces += 1;
        diag.iter_mut().zip(&dg).for_each(|(x, v)| *x += v);
        let (l, t) = (b - a, 0.5 * (b * b - a * a));
        add_dense_moments(&mut ab, &a0, &a1, l, t, &s, k, softmax);
        y.iter_mut().for_each(|v| *v = 0.0);
        if softmax {
            for o in 0..k {
                let (s0, s1) = (s[o], s[k + o]);
                for ((yv, &wv), &dv) in y.iter_mut().zip(&w[o * h..(o + 1) * h]).zip(&dw[o * h..(o + 1) * h]) {
                    *yv += s0 * wv + s1 * dv;
                }
            }
        }
        for kk in 0..k {
            let (wk, dwk) = (&w[kk * h..(kk + 1) * h], &dw[kk * h..(kk + 1) * h]);
            for ((((g, &mj), &wv), &dv), &yv) in dbar[kk * h..(kk + 1) * h].iter_mut().zip(&mask).zip(wk).zip(dwk).zip(&y) {
                *g += alpha * mj * (l * wv + t * dv - yv);
            }
        }
    }
    if cosine {
        let (sum, count) = cosine_measure(step, z, xsq, off, &dbar, &ab);
        st.cosine_sum = sum;
        st.cosine_count = count;
    }
    (dbar, ab, diag, st)
}

/// `Σ_k (1 − cos(∇f^k(t = 0), ∫∇f^k dt))` over the classes whose two gradients are nonzero,
/// and their count, from the integrated factors (`dbar` `[K, h]`, `ab` `[K+1, ne]`).
fn cosine_measure(step: &MlpStep, z: &[f64], xsq: f64, off: Option<&[f64]>, dbar: &[f64], ab: &[f64]) -> (f64, usize) {
    let out = &step.layers[1];
    let (k, h, alpha) = (step.k, z.len(), step.alpha);
    let ne = ab.len() / (k + 1);
    let mut a0 = vec![0.0; ne];
    for j in 0..h {
        a0[j] = z[j].max(0.0);
    }
    if step.bias {
        a0[h] = 1.0;
    }
    let mut p0 = vec![0.0; k];
    if step.output == OutputKind::LogSoftmax {
        for o in 0..k {
            p0[o] = alpha * (dot(&out.w[o * h..(o + 1) * h], &a0[..h]) + out.b[o] - off.map_or(0.0, |v| v[o]));
        }
        let mx = p0.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        p0.iter_mut().for_each(|v| *v = (*v - mx).exp());
        let sum: f64 = p0.iter().sum();
        p0.iter_mut().for_each(|v| *v /= sum);
    }
    let (abar, bbar) = ab.split_at(ne);
    let aa0 = dot(&a0, &a0);
    let a0_abar = dot(&a0, abar);
    let a0_b: Vec<f64> = (0..k).map(|o| dot(&a0, &bbar[o * ne..(o + 1) * ne])).collect();
    let abar2 = dot(abar, abar);
    let b2: f64 = (0..k).map(|o| dot(&bbar[o * ne..(o + 1) * ne], &bbar[o * ne..(o + 1) * ne])).sum();
    let (mut total, mut count) = (0.0, 0);
    // Layer 0 at t = 0: δ_0[k] = α m_0 ⊙ (W[k] − Wᵀp_0).
    let mut wp = vec![0.0; h];
    for (o, &po) in p0.iter().enumerate() {
        wp.iter_mut().zip(&out.w[o * h..(o + 1) * h]).for_each(|(g, &wv)| *g += po * wv);
    }
    let mut d0 = vec![0.0; h];
    for kk in 0..k {
        for (j, dv) in d0.iter_mut().enumerate() {
            *dv = if z[j] > 0.0 { alpha * (out.w[kk * h + j] - wp[j]) } else { 0.0 };
        }
        let db = &dbar[kk * h..(kk + 1) * h];
        let e = |o: usize| if o == kk { 1.0 } else { 0.0 } - p0[o];
        let dotv = dot(&d0, db) * xsq + alpha * alpha * (0..k).map(|o| e(o) * (if o == kk { a0_abar } else { 0.0 } - a0_b[o])).sum::<f64>();
        let n0 = dot(&d0, &d0) * xsq + alpha * alpha * aa0 * (0..k).map(|o| e(o) * e(o)).sum::<f64>();
        let nbar = dot(db, db) * xsq + alpha * alpha * (abar2 - 2.0 * dot(abar, &bbar[kk * ne..(kk + 1) * ne]) + b2);
        let den = (n0 * nbar).sqrt();
        if den > 0.0 {
            total += 1.0 - (dotv / den).clamp(-1.0, 1.0);
            count += 1;
        }
    }
    (total, count)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernel::stack::closed::dense_relu::nodes::eval_rows;
    use crate::kernel::quadrature::gauss_legendre_01;
    use crate::kernel::stack::closed::dense_relu::nodes::{dpk_cosine_error, RowNodes};
    use crate::kernel::stack::closed::shape::DenseRelu;
    use crate::model::{Activation, Architecture, Body};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn rel(a: &[f64], b: &[f64]) -> f64 {
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-300);
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
    }

    /// A random one-hidden-layer ReLU step with large moves (many kinks), the points, offsets.
    fn setup(seed: u64, output: OutputKind, bias: bool) -> (MlpStep, Vec<f64>, Vec<f64>, usize) {
        random_step(1000 + seed, seed, output, bias, (5, 9, 4, 6), 0.8, 1.0)
    }

    /// A random `d → h → k` ReLU step of `n` points: the initial network of `init_seed`, moved
    /// by up to `±spread` per weight (from the stream `rng_seed`: a step proportional to `w_s`
    /// has no kinks), the points in `±x_range`, offsets in ±0.3.
    pub(crate) fn random_step(rng_seed: u64, init_seed: u64, output: OutputKind, bias: bool, (d, h, k, n): (usize, usize, usize, usize), spread: f64, x_range: f64) -> (MlpStep, Vec<f64>, Vec<f64>, usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(rng_seed);
        let arch = Architecture { body: Body::Mlp { widths: vec![d, h, k] }, activation: Activation::Relu, bias, zero_last: false, alpha: 0.7, zero_output: false, output };
        let init = arch.init(init_seed);
        let mut next = init.clone();
        for t in next.data.iter_mut() {
            t.iter_mut().for_each(|v| *v += rng.gen_range(-spread..spread));
        }
        let step = MlpStep::new(&DenseRelu::of(&arch), &init, Some(&next)).unwrap();
        let x: Vec<f64> = (0..n * d).map(|_| rng.gen_range(-x_range..x_range)).collect();
        let off: Vec<f64> = (0..n * k).map(|_| rng.gen_range(-0.3..0.3)).collect();
        (step, x, off, n)
    }

    /// The slow obvious path: gradients (`MlpStep`'s backward pass) at Gauss(30) nodes on every
    /// smooth piece, summed with their weights, against the integrated factors.
    #[test]
    fn integrated_rows_equal_high_order_gauss_per_piece() {
        let mut kinks = 0;
        for (seed, output, bias) in [(1, OutputKind::LogSoftmax, true), (2, OutputKind::LogSoftmax, false), (3, OutputKind::Identity, true)] {
            let (step, x, off, n) = setup(seed, output, bias);
            let (d, k) = (step.input_dim(), step.k);
            let h = step.layers[0].n_out;
            let ne = h + usize::from(bias);
            let first = step.first_layer(&x);
            let fast = row_factors(&step, &first, &x, Some(&off), 1e-15, true);
            assert!(fast.stats.iter().all(|s| s.unconverged == 0));
            for pi in 0..n {
                let cuts = relu_cuts(&first.z[pi * h..(pi + 1) * h], &first.u[pi * h..(pi + 1) * h], 0.0, 1.0);
                kinks += cuts.len();
                assert_eq!(fast.stats[pi].pieces, cuts.len() + 1);
                let mut bps = vec![0.0];
                bps.extend(cuts);
                bps.push(1.0);
                let nodes: Vec<(f64, f64)> = bps.windows(2).flat_map(|w| gauss_legendre_01(30, w[0], w[1])).collect();
                let idx = vec![pi; nodes.len()];
                let t: Vec<f64> = nodes.iter().map(|v| v.0).collect();
                let ev = eval_rows(&step, &x, Some(&off), &idx, &t);
                // δ̄_0, [Ā; B̄] and the self-kernel from the per-node gradients.
                let (mut dbar, mut ab, mut diag) = (vec![0.0; k * h], vec![0.0; (k + 1) * ne], vec![0.0; k * k]);
                let xp = &x[pi * d..(pi + 1) * d];
                let xsq = xp.iter().map(|v| v * v).sum::<f64>() + if bias { 1.0 } else { 0.0 };
                for (r, &(_, wr)) in nodes.iter().enumerate() {
                    let d0 = &ev.deltas[0][r * k * h..(r + 1) * k * h];
                    let d1 = &ev.deltas[1][r * k * k..(r + 1) * k * k];
                    let a1 = &ev.acts[1][r * h..(r + 1) * h];
                    dbar.iter_mut().zip(d0).for_each(|(a, v)| *a += wr * v);
                    let mut at = a1.to_vec();
                    if bias {
                        at.push(1.0);
                    }
                    // q_o = −δ_1[(o+1) mod K, o]/α (0 for the identity map).
                    for j in 0..ne {
                        ab[j] += wr * at[j];
                        for o in 0..k {
                            ab[(1 + o) * ne + j] += wr * (-d1[((o + 1) % k) * k + o] / step.alpha) * at[j];
                        }
                    }
                    let aa = dot(&at, &at);
                    for a in 0..k {
                        for b in 0..k {
                            let g0 = dot(&d0[a * h..(a + 1) * h], &d0[b * h..(b + 1) * h]) * xsq;
                            let g1 = dot(&d1[a * k..(a + 1) * k], &d1[b * k..(b + 1) * k]) * aa;
                            diag[a * k + b] += wr * (g0 + g1);
                        }
                    }
                }
                let e = [
                    rel(&fast.dbar[pi * k * h..(pi + 1) * k * h], &dbar),
                    rel(&fast.ab[pi * (k + 1) * ne..(pi + 1) * (k + 1) * ne], &ab),
                    rel(&fast.diag[pi * k * k..(pi + 1) * k * k], &diag),
                ];
                assert!(e.iter().all(|&v| v <= 1e-12), "seed {seed} point {pi}: δ̄, [Ā; B̄], self-kernel relative differences {e:?}");
                // The Fig. 2 measure against the node path's.
                let nn = nodes.len();
                let rn = RowNodes { point: vec![0; nn], weight: nodes.iter().map(|v| v.1).collect(), evals: ev };
                let (cs, cc) = dpk_cosine_error(&step, &rn, xp, Some(&off[pi * k..(pi + 1) * k]), 1);
                assert_eq!(cc, fast.stats[pi].cosine_count);
                assert!((cs - fast.stats[pi].cosine_sum).abs() <= 1e-12 * cs.abs().max(1e-3), "seed {seed} point {pi}: cosine measure {cs} vs {}", fast.stats[pi].cosine_sum);
            }
        }
        assert!(kinks > 20, "too few kinks ({kinks}) for a meaningful test");
    }
}
