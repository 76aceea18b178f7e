//! A fixed rule on a point's pieces: fewer gradient evaluations, the same sum.
//!
//! Between two kinks of a piecewise-linear network (ReLU, leaky ReLU, max pooling, with dense,
//! conv and pooling layers) the pattern is fixed and the network is multilinear in its layers'
//! parameters, so along `w_s(t) = w_s + tΔw` its raw outputs are a polynomial of degree `d` in t
//! (the kink sweep's, [`crate::kernel::stack::kinks::pieces`]) and its per-sample parameter
//! gradient one of degree `e = d − 1`. A fixed rule's sum over the nodes `t_r` of one piece,
//! `Σ_r w_r G(t_r)`, is then exactly `Σ_j v_j G(τ_j)` at `e + 1` interpolatory nodes `τ_j` of
//! the piece, with `v_j = Σ_r w_r ℓ_j(t_r)` (`ℓ_j` the Lagrange basis at the `τ`): a left rule
//! with 200 nodes on a step with 30 pieces of a ReLU CNN (`e = 1`) costs 60 evaluations, not
//! 200, and gives the same Gram up to rounding.
//!
//! A classifier's log-softmax outputs are not polynomial, but the rule's sum is linear in the
//! softmax: `Σ_r w_r ∇f^k(t_r) = α Σ_r w_r Σ_o (δ_ko − p_o(t_r)) ∇g_o(t_r)`, with `∇g_o` the
//! raw outputs' gradients (polynomial) and `p(t_r)` known from the piece's output polynomial.
//! Each output's measure `w_r p_o(t_r)` gets its own interpolatory weights at the same nodes,
//! `u_{j,o} = Σ_r w_r p_o(t_r) ℓ_j(t_r)`, so the node τ_j is evaluated once with the seeds
//! `α(v_j δ_ko − u_{j,o})` — in the engine's form `v_j · α(δ_ko − q_{j,o})` with
//! `q_{j,o} = u_{j,o}/v_j` standing in for the node's softmax (product integration).
//!
//! The rows' self-kernel, `Σ_r w_r ∇f(t_r)∇f(t_r)ᵀ`, is quadratic in the gradients: on a
//! reduced piece it is `Σ_{j,j'} Σ_r w_r ℓ_j ℓ_j' P_r M_jj' P_rᵀ` with `M_jj' = R_j R_j'ᵀ` the
//! products of the nodes' rows `R_j` and `P_r = I − 1p(t_r)ᵀ` (the rows' stand-in seeds
//! `α(I − 1q_jᵀ)` drop out: `P_r 1 = 0`), so each pair `(j, j')` carries the moments
//! `s0 = Σ_r w_r ℓ_j ℓ_j'`, `s1 = Σ_r w_r ℓ_j ℓ_j' p_r` and `s2 = Σ_r w_r ℓ_j ℓ_j' p_r p_rᵀ`
//! ([`PieceMoments`]; without a softmax `P_r = I` and `s0` alone).
//!
//! A node on a piece bound (the left rule's `t = 0`) keeps its own evaluation: the network's
//! pattern there may be either side's. A piece with no more nodes than `e + 1`, or whose
//! interpolatory weights are not all comfortably positive, keeps its nodes.
//!
//! The adaptive rule takes the same stand-ins from the exact integrals instead of a rule's sum
//! ([`SoftmaxTable`]): its nodes on a piece then integrate the softmax-weighted gradient exactly
//! at as many nodes as the raw outputs' degree (product integration), and at fewer on nodes
//! placed for the softmax ([`SoftmaxTable::simultaneous`]) where the classes are few.

use super::gauss_legendre_01;

/// One point's nodes after [`reduce`], in time order: `q` `[n, K]` holds each node's stand-in
/// for its softmax (empty without one), a row of NaN where the node keeps its own.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Reduced {
    pub times: Vec<f64>,
    pub weights: Vec<f64>,
    pub q: Vec<f64>,
    /// The pieces the point's nodes fell in (reduced or not).
    pub pieces: usize,
    /// The reduced pieces, for the self-kernel.
    pub moments: Vec<PieceMoments>,
}

/// A reduced piece's self-kernel moments: its nodes are `first..first + m` of [`Reduced`]'s,
/// `s` `[m, m, 1 + K + K²]` (`s0`, `s1`, `s2` of the pair `(j, j')`; `[m, m, 1]` without a
/// softmax).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PieceMoments {
    pub first: usize,
    pub m: usize,
    pub s: Vec<f64>,
}

impl PieceMoments {
    /// Adds the piece's share of the rows' self-kernel to `diag` (`[K, K]`) for one layer whose
    /// node rows' products `R_j R_j'ᵀ` (`[K, K]`) `pair(j, j', out)` writes.
    pub(crate) fn add_self_kernel(&self, diag: &mut [f64], k: usize, pair: &mut dyn FnMut(usize, usize, &mut [f64])) {
        let m = self.m;
        let per = self.s.len() / (m * m);
        let mut mm = vec![0.0; k * k];
        let (mut u, mut v) = (vec![0.0; k], vec![0.0; k]);
        for j in 0..m {
            for j2 in 0..m {
                pair(j, j2, &mut mm);
                let s = &self.s[(j * m + j2) * per..(j * m + j2 + 1) * per];
                if per == 1 {
                    diag.iter_mut().zip(&mm).for_each(|(d, x)| *d += s[0] * x);
                    continue;
                }
                let (s1, s2) = (&s[1..1 + k], &s[1 + k..]);
                // P M Pᵀ summed: s0 M − 1(s1ᵀM) − (M s1)1ᵀ + ⟨s2, M⟩ 11ᵀ.
                u.iter_mut().enumerate().for_each(|(b, x)| *x = (0..k).map(|a| s1[a] * mm[a * k + b]).sum());
                v.iter_mut().enumerate().for_each(|(a, x)| *x = (0..k).map(|b| mm[a * k + b] * s1[b]).sum());
                let c: f64 = s2.iter().zip(&mm).map(|(x, y)| x * y).sum();
                for a in 0..k {
                    for b in 0..k {
                        diag[a * k + b] += s[0] * mm[a * k + b] - u[b] - v[a] + c;
                    }
                }
            }
        }
    }
}

/// Smallest interpolatory weight accepted, relative to the piece's mean weight per node: the
/// weights of evenly spread nodes are the Gauss–Legendre weights' shape (the smallest of 8 is
/// 0.4 of the mean); a piece whose nodes crowd one end can give a weight near 0 or below, and
/// dividing by it would lose the softmax's digits.
const MIN_WEIGHT: f64 = 0.05;

/// The nodes `(t, w)` of a fixed rule on the pieces `bounds` (`[J + 1]`, sorted:
/// piece j is `(bounds[j], bounds[j + 1])`) where the per-sample gradient is a polynomial of
/// degree `degree` on each piece. `softmax(j, t)` gives the output map's `p(t)` (`[K]`) on piece
/// j, or is `None` for outputs without one (then `q` is empty). `None`: no piece is reduced.
pub(crate) fn reduce(nodes: &[(f64, f64)], bounds: &[f64], degree: usize, k: usize, softmax: Option<&dyn Fn(usize, f64) -> Vec<f64>>) -> Option<Reduced> {
    let m = degree + 1;
    let mut sorted = nodes.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let nodes = &sorted[..];
    let own = |q: &mut Vec<f64>| {
        if softmax.is_some() {
            q.extend(std::iter::repeat_n(f64::NAN, k));
        }
    };
    let mut out = Reduced { times: Vec::with_capacity(nodes.len()), weights: Vec::with_capacity(nodes.len()), q: Vec::new(), pieces: 0, moments: Vec::new() };
    let mut reduced = false;
    let mut r = 0;
    // Nodes before the first bound or on a bound keep their own evaluation.
    let on_bound = |t: f64| bounds.iter().any(|&b| (t - b).abs() <= 4.0 * f64::EPSILON * b.abs().max(1.0));
    let mut touched = vec![false; bounds.len().saturating_sub(1)];
    while r < nodes.len() {
        let t = nodes[r].0;
        let piece = bounds.partition_point(|&b| b < t).checked_sub(1).filter(|&j| j + 1 < bounds.len() && t < bounds[j + 1]);
        let (Some(j), false) = (piece, on_bound(t)) else {
            if let Some(j) = bounds.partition_point(|&b| b <= t).checked_sub(1).filter(|&j| j + 1 < bounds.len()) {
                touched[j] = true;
            }
            out.times.push(t);
            out.weights.push(nodes[r].1);
            own(&mut out.q);
            r += 1;
            continue;
        };
        touched[j] = true;
        // The piece's interior nodes: r..e.
        let mut e = r;
        while e < nodes.len() && nodes[e].0 < bounds[j + 1] && !on_bound(nodes[e].0) {
            e += 1;
        }
        let run = &nodes[r..e];
        match (run.len() > m).then(|| interpolate(run, m, k, j, softmax)).flatten() {
            Some((tau, v, q, s)) => {
                reduced = true;
                out.moments.push(PieceMoments { first: out.times.len(), m, s });
                out.times.extend(tau);
                out.weights.extend(v);
                out.q.extend(q);
            }
            None => {
                for &(t, w) in run {
                    out.times.push(t);
                    out.weights.push(w);
                    own(&mut out.q);
                }
            }
        }
        r = e;
    }
    out.pieces = touched.iter().filter(|&&t| t).count();
    reduced.then_some(out)
}

/// The `m` interpolatory nodes of one piece's nodes `run` (more than `m`, sorted): the
/// Gauss–Legendre points of their span, their weights `v_j = Σ_r w_r ℓ_j(t_r)` and, with a
/// softmax, `q_{j,o} = Σ_r w_r p_o(t_r) ℓ_j(t_r) / v_j` (`[m, K]`), and the self-kernel's
/// moments ([`PieceMoments::s`]). `None` where some `v_j` is below [`MIN_WEIGHT`] of the mean.
#[allow(clippy::type_complexity)]
fn interpolate(run: &[(f64, f64)], m: usize, k: usize, piece: usize, softmax: Option<&dyn Fn(usize, f64) -> Vec<f64>>) -> Option<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (lo, hi) = (run[0].0, run[run.len() - 1].0);
    if hi <= lo {
        return None;
    }
    let tau: Vec<f64> = gauss_legendre_01(m, lo, hi).into_iter().map(|(t, _)| t).collect();
    let p: Option<Vec<f64>> = softmax.map(|sm| run.iter().flat_map(|&(t, _)| sm(piece, t)).collect());
    let (v, mut u, s) = weigh(&tau, run, k, p.as_deref(), true);
    let mean = run.iter().map(|n| n.1).sum::<f64>() / m as f64;
    if !v.iter().all(|&vj| vj >= MIN_WEIGHT * mean) {
        return None;
    }
    if !u.is_empty() {
        for (j, &vj) in v.iter().enumerate() {
            u[j * k..(j + 1) * k].iter_mut().for_each(|a| *a /= vj);
        }
    }
    Some((tau, v, u, s))
}

/// The sums of a rule `run` (`(t_r, w_r)`) against the Lagrange basis `ℓ_j` at the nodes `tau`
/// (`[m]`): `v_j = Σ_r w_r ℓ_j(t_r)`, with the softmax at the rule's nodes `p` (`[R, K]`) also
/// `u_{j,o} = Σ_r w_r p_o(t_r) ℓ_j(t_r)` (`[m, K]`, else empty), and with `moments` the
/// self-kernel's ([`PieceMoments::s`], else empty; each pair's and each product's once, then
/// mirrored).
#[allow(clippy::type_complexity)]
fn weigh(tau: &[f64], run: &[(f64, f64)], k: usize, p: Option<&[f64]>, moments: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let m = tau.len();
    let mut v = vec![0.0; m];
    let mut u = vec![0.0; if p.is_some() { m * k } else { 0 }];
    let mut l = vec![0.0; m];
    let per = if p.is_some() { 1 + k + k * k } else { 1 };
    let mut s = vec![0.0; if moments { m * m * per } else { 0 }];
    for (r, &(t, w)) in run.iter().enumerate() {
        lagrange(tau, t, &mut l);
        v.iter_mut().zip(&l).for_each(|(a, b)| *a += w * b);
        let p = p.map(|p| &p[r * k..(r + 1) * k]);
        if let Some(p) = p {
            for (j, &lj) in l.iter().enumerate() {
                u[j * k..(j + 1) * k].iter_mut().zip(p).for_each(|(a, b)| *a += w * b * lj);
            }
        }
        if !moments {
            continue;
        }
        for j in 0..m {
            for j2 in j..m {
                let c = w * l[j] * l[j2];
                let sj = &mut s[(j * m + j2) * per..(j * m + j2 + 1) * per];
                sj[0] += c;
                if let Some(p) = p {
                    sj[1..1 + k].iter_mut().zip(p).for_each(|(a, b)| *a += c * b);
                    for (a, &pa) in p.iter().enumerate() {
                        let cp = c * pa;
                        sj[1 + k + a * k + a..1 + k + (a + 1) * k].iter_mut().zip(&p[a..]).for_each(|(x, pb)| *x += cp * pb);
                    }
                }
            }
        }
    }
    if moments {
        for j in 0..m {
            for j2 in j..m {
                let (lo, hi) = ((j * m + j2) * per, (j2 * m + j) * per);
                if per > 1 {
                    for a in 0..k {
                        for b2 in 0..a {
                            s[lo + 1 + k + a * k + b2] = s[lo + 1 + k + b2 * k + a];
                        }
                    }
                }
                if j2 > j {
                    s.copy_within(lo..lo + per, hi);
                }
            }
        }
    }
    (v, u, s)
}

/// Gauss–Legendre orders of the scalar quadratures behind product integration, tried in turn
/// until two consecutive ones agree.
const PRODUCT_ORDERS: [usize; 3] = [16, 32, 64];

/// One piece's softmax at the Gauss–Legendre nodes of [`PRODUCT_ORDERS`], for product
/// integration at any number of nodes ([`SoftmaxTable::nodes`]) and the self-kernel's moments
/// ([`SoftmaxTable::moments`]), computed once per piece (a piece tries several orders).
pub(crate) struct SoftmaxTable {
    a: f64,
    b: f64,
    k: usize,
    /// Per scalar order, as far as they were needed: its nodes on `[a, b]` and the softmax there.
    rules: Vec<ScalarRule>,
    /// The order that agreed with the one before it (an index into `rules`; its integrals are
    /// the ones used), once found.
    agreed: Option<usize>,
}

/// A scalar Gauss–Legendre rule on a piece, `(t, w)` `[Q]`, and the softmax at its nodes
/// (`[Q, K]`).
type ScalarRule = (Vec<(f64, f64)>, Vec<f64>);

impl SoftmaxTable {
    /// The piece `[a, b]` with softmax `softmax(ts)` at times `ts` (`[Q, K]`).
    pub(crate) fn new(a: f64, b: f64, k: usize, softmax: &dyn Fn(&[f64]) -> Vec<f64>) -> SoftmaxTable {
        let mut table = SoftmaxTable { a, b, k, rules: Vec::new(), agreed: None };
        let tol = 8.0 * f64::EPSILON * (b - a);
        // The orders agree where the product weights at the most nodes any piece takes do.
        let tau: Vec<f64> = gauss_legendre_01(6, a, b).into_iter().map(|(t, _)| t).collect();
        let mut last: Option<Vec<f64>> = None;
        for (i, order) in PRODUCT_ORDERS.into_iter().enumerate() {
            let run = gauss_legendre_01(order, a, b);
            let p = softmax(&run.iter().map(|n| n.0).collect::<Vec<f64>>());
            let u = weigh(&tau, &run, k, Some(&p), false).1;
            table.rules.push((run, p));
            if let Some(prev) = &last {
                if prev.iter().zip(&u).all(|(x, y)| (x - y).abs() <= tol) {
                    table.agreed = Some(i);
                    break;
                }
            }
            last = Some(u);
        }
        table
    }

    /// Product integration on the piece with its `m` Gauss–Legendre nodes `τ_j`: the weights
    /// `v_j = ∫ ℓ_j` (the Gauss weights) and the stand-ins `q_{j,o} = ∫ p_o ℓ_j / v_j`
    /// (`[m, K]`) for the softmax `p`, the integrals of the known scalar functions by
    /// Gauss–Legendre at no network cost. The nodes' gradients with seeds `v_j α(δ_ko − q_{j,o})`
    /// then integrate `α Σ_o (δ_ko − p_o) ∇g_o` over the piece exactly wherever the raw
    /// outputs' gradient `∇g` is a polynomial of degree below `m` (as on a piecewise-linear
    /// stack's piece with `m` at least the outputs' degree); with fewer nodes the error is
    /// `∫ p ω R`, the part `ωR` of `∇g` the nodes do not interpolate (`ω = Π_j (t − τ_j)`)
    /// against the softmax, which vanishes where `p` is constant (`ω` is orthogonal to `R`'s
    /// degree).
    ///
    /// `None` where no two consecutive scalar orders of [`PRODUCT_ORDERS`] agreed to 8 ulps of
    /// the piece's length (a softmax that swings too fast along the piece for them).
    #[allow(clippy::type_complexity)]
    pub(crate) fn nodes(&self, m: usize) -> Option<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let (run, p) = &self.rules[self.agreed?];
        let nodes = gauss_legendre_01(m, self.a, self.b);
        let tau: Vec<f64> = nodes.iter().map(|n| n.0).collect();
        let (_, u, _) = weigh(&tau, run, self.k, Some(p), false);
        // `v_j`: the Gauss weights, which the rule's sums reproduce to rounding.
        let v: Vec<f64> = nodes.iter().map(|n| n.1).collect();
        let q = u.iter().enumerate().map(|(i, x)| x / v[i / self.k]).collect();
        Some((tau, v, q))
    }

    /// Product integration at `m` nodes that is exact for raw outputs of degree `deg > m`
    /// (gradients of degree `e = deg − 1 ≥ m`), where [`SoftmaxTable::nodes`]' Gauss nodes
    /// would need `deg`: the nodes are the zeros of a degree-`m` polynomial `ω` orthogonal to
    /// `p_o(t) P_i(t)` for every output `o` and `i < deg − m` (a multiple orthogonal
    /// polynomial; simultaneous Gaussian quadrature for the K weights `p_o`). The interpolatory
    /// rule at them then integrates `p_o R` exactly for every `R` of degree `e` and every `o`
    /// (the error is `∫ p_o ω S` with `S` of degree `e − m`), and `∫ R` too (`Σ_o p_o = 1`).
    /// That is `K (deg − m)` conditions on `m` nodes: a classifier with few outputs (three
    /// classes take three nodes for a degree-4 piece, two for a degree-3 one with two classes).
    ///
    /// The rows' self-kernel is quadratic in the gradient, which `m` nodes do not interpolate
    /// (its pieces' moments, [`PieceMoments`], take the interpolant's): it is checked on the
    /// raw outputs' derivative `gd(t)` (`[K]`, the gradient along the step, which the sweep's
    /// polynomial gives): the moments' self-kernel of `gd` at the nodes against its integral,
    /// to `rel` of the integral's trace.
    ///
    /// `None` where there are more conditions than nodes, where the nodes found do not make
    /// the conditions' residuals rounding (`64 ε` of their absolute sums) with `m` distinct
    /// nodes inside the piece and every weight positive ([`MIN_WEIGHT`]), or where the
    /// self-kernel check fails; then the Gauss nodes are checked against the next order as
    /// before.
    #[allow(clippy::type_complexity)]
    pub(crate) fn simultaneous(&self, m: usize, deg: usize, gd: &dyn Fn(f64) -> Vec<f64>, rel: f64) -> Option<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let (run, p) = &self.rules[self.agreed?];
        let k = self.k;
        let c = deg.checked_sub(m).filter(|&c| c >= 1 && m >= 1)?;
        if k * c > m {
            return None;
        }
        let (mid, half) = (0.5 * (self.a + self.b), 0.5 * (self.b - self.a));
        // Legendre values P_0..P_m at the scalar rule's nodes on [−1, 1].
        let leg: Vec<Vec<f64>> = run.iter().map(|&(t, _)| legendre_upto(m, (t - mid) / half).0).collect();
        // ω = P_m + Σ_{n<m} x_n P_n with Σ_r w_r p_o(t_r) P_i(t_r) ω(t_r) = 0: `A x = −b`,
        // row `o c + i`; the least-norm x keeps ω nearest P_m (Gauss) where rows are dependent.
        let rows = k * c;
        let mut am = vec![0.0; rows * m];
        let mut rhs = vec![0.0; rows];
        for (r, &(_, w)) in run.iter().enumerate() {
            let l = &leg[r];
            for o in 0..k {
                let wp = w * p[r * k + o];
                for i in 0..c {
                    let f = wp * l[i];
                    am[(o * c + i) * m..(o * c + i + 1) * m].iter_mut().zip(l).for_each(|(a, ln)| *a += f * ln);
                    rhs[o * c + i] -= f * l[m];
                }
            }
        }
        let svd = nalgebra::DMatrix::from_row_slice(rows, m, &am).svd(true, true);
        let floor = 1e-12 * svd.singular_values.max();
        let x = svd.solve(&nalgebra::DVector::from_vec(rhs), floor).ok()?;
        // ω's zeros by Newton's method from the Gauss–Legendre nodes (the zeros of P_m).
        let omega = |y: f64| {
            let (l, d) = legendre_upto(m, y);
            (0..m).fold((l[m], d[m]), |(v, dv), n| (v + x[n] * l[n], dv + x[n] * d[n]))
        };
        let mut sigma = Vec::with_capacity(m);
        for (g, _) in gauss_legendre_01(m, -1.0, 1.0) {
            let mut y = g;
            let mut done = false;
            for _ in 0..60 {
                let (v, dv) = omega(y);
                let step = v / dv;
                y -= step;
                if !step.is_finite() {
                    return None;
                }
                if step.abs() <= 4.0 * f64::EPSILON {
                    done = true;
                    break;
                }
            }
            if !done || y.abs() >= 1.0 {
                return None;
            }
            sigma.push(y);
        }
        sigma.sort_by(f64::total_cmp);
        if sigma.windows(2).any(|w| w[1] - w[0] <= 1e-3 / m as f64) {
            return None;
        }
        // The conditions at the nodes as found, in the nodes' own product form.
        for o in 0..k {
            for i in 0..c {
                let (mut sum, mut mass) = (0.0f64, 0.0f64);
                for (r, &(t, w)) in run.iter().enumerate() {
                    let y = (t - mid) / half;
                    let f = w * p[r * k + o] * leg[r][i] * sigma.iter().fold(1.0, |acc, s| acc * (y - s));
                    sum += f;
                    mass += f.abs();
                }
                if sum.abs() > 64.0 * f64::EPSILON * mass {
                    return None;
                }
            }
        }
        let tau: Vec<f64> = sigma.iter().map(|s| mid + half * s).collect();
        let (v, u, moments) = weigh(&tau, run, k, Some(p), true);
        if v.iter().any(|&vj| vj < MIN_WEIGHT * (self.b - self.a) / m as f64) {
            return None;
        }
        // The self-kernel of `gd`: the moments' at the nodes, and its integral by the scalar
        // rule, `Σ_r w_r (P_r gd)(P_r gd)ᵀ` with `P_r = I − 1 p_rᵀ`.
        let at: Vec<Vec<f64>> = tau.iter().map(|&t| gd(t)).collect();
        let mut rule = vec![0.0; k * k];
        PieceMoments { first: 0, m, s: moments }.add_self_kernel(&mut rule, k, &mut |j, j2, out: &mut [f64]| {
            for a in 0..k {
                for b in 0..k {
                    out[a * k + b] = at[j][a] * at[j2][b];
                }
            }
        });
        // (Rounding against the unprojected `gd`'s trace: the projection may cancel.)
        let (mut exact, mut trace, mut raw) = (vec![0.0; k * k], 0.0, 0.0);
        for (r, &(t, w)) in run.iter().enumerate() {
            let g = gd(t);
            let pg: f64 = g.iter().zip(&p[r * k..(r + 1) * k]).map(|(x, y)| x * y).sum();
            for a in 0..k {
                trace += w * (g[a] - pg) * (g[a] - pg);
                raw += w * g[a] * g[a];
                for b in 0..k {
                    exact[a * k + b] += w * (g[a] - pg) * (g[b] - pg);
                }
            }
        }
        if rule.iter().zip(&exact).any(|(x, y)| (x - y).abs() > rel * trace + 64.0 * f64::EPSILON * raw) {
            return None;
        }
        let q = u.iter().enumerate().map(|(i, x)| x / v[i / k]).collect();
        Some((tau, v, q))
    }

    /// The self-kernel's moments ([`PieceMoments::s`]) at nodes `tau` ([`SoftmaxTable::nodes`]'s).
    pub(crate) fn moments(&self, tau: &[f64]) -> Vec<f64> {
        let (run, p) = &self.rules[self.agreed.expect("moments of a product-integrated piece")];
        weigh(tau, run, self.k, Some(p), true).2
    }
}

/// Legendre polynomials `P_0..P_m` at `y` and their derivatives (`[m + 1]` each), by the
/// three-term recurrence and `P'_{n+1} = P'_{n−1} + (2n + 1) P_n`.
fn legendre_upto(m: usize, y: f64) -> (Vec<f64>, Vec<f64>) {
    let mut l = vec![1.0; m + 1];
    let mut d = vec![0.0; m + 1];
    if m >= 1 {
        l[1] = y;
        d[1] = 1.0;
    }
    for n in 1..m {
        l[n + 1] = ((2 * n + 1) as f64 * y * l[n] - n as f64 * l[n - 1]) / (n + 1) as f64;
        d[n + 1] = d[n - 1] + (2 * n + 1) as f64 * l[n];
    }
    (l, d)
}

/// The Lagrange basis at the nodes `tau`, evaluated at `t`, into `l`.
fn lagrange(tau: &[f64], t: f64, l: &mut [f64]) {
    for (j, lj) in l.iter_mut().enumerate() {
        *lj = tau.iter().enumerate().filter(|&(i, _)| i != j).fold(1.0, |acc, (_, &ti)| acc * (t - ti) / (tau[j] - ti));
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    fn poly(c: &[f64], t: f64) -> f64 {
        c.iter().rev().fold(0.0, |acc, &ci| acc * t + ci)
    }

    /// On every piece, a random polynomial of the degree and a random smooth positive "softmax":
    /// the reduced nodes' sums equal the rule's, written out node by node.
    #[test]
    fn reduced_nodes_sum_polynomials_as_the_rule_does() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (t_nodes, degree, bounds) in [
            (200, 1, vec![0.0, 0.137, 0.4, 0.4001, 0.77, 1.0]),
            (200, 4, vec![0.0, 0.31, 0.52, 1.0]),
            (50, 2, vec![0.0, 1.0]),
            (13, 3, vec![0.0, 0.05, 0.9, 1.0]),
        ] {
            let k = 3;
            let nodes: Vec<(f64, f64)> = (0..t_nodes).map(|j| (j as f64 / t_nodes as f64, 1.0 / t_nodes as f64)).collect();
            let coef: Vec<Vec<f64>> = (0..bounds.len() - 1).map(|_| (0..=degree).map(|_| rng.gen_range(-3.0..3.0)).collect()).collect();
            let freq: Vec<f64> = (0..k).map(|_| rng.gen_range(0.5..4.0)).collect();
            let soft = |j: usize, t: f64| -> Vec<f64> { freq.iter().map(|f| 0.3 + 0.2 * (f * t + j as f64).sin()).collect() };
            let piece_of = |t: f64| bounds.partition_point(|&b| b <= t) - 1;
            let red = reduce(&nodes, &bounds, degree, k, Some(&soft)).expect("pieces with many nodes reduce");
            assert!(red.times.len() < nodes.len(), "fewer nodes: {} of {}", red.times.len(), nodes.len());
            assert_eq!(red.pieces, bounds.len() - 1);
            // Σ_r w_r P(t_r) and Σ_r w_r p_o(t_r) P(t_r) against the reduced nodes' sums.
            let mut want = vec![0.0; 1 + k];
            for &(t, w) in &nodes {
                let (j, p) = (piece_of(t), soft(piece_of(t), t));
                let g = poly(&coef[j], t);
                want[0] += w * g;
                (0..k).for_each(|o| want[1 + o] += w * p[o] * g);
            }
            let mut got = vec![0.0; 1 + k];
            for (i, (&t, &w)) in red.times.iter().zip(&red.weights).enumerate() {
                let j = piece_of(t);
                let g = poly(&coef[j], t);
                let q = &red.q[i * k..(i + 1) * k];
                // A kept node's own softmax (NaN marks it).
                let p: Vec<f64> = if q[0].is_nan() { soft(j, t) } else { q.to_vec() };
                got[0] += w * g;
                (0..k).for_each(|o| got[1 + o] += w * p[o] * g);
            }
            for (a, b) in want.iter().zip(&got) {
                assert!((a - b).abs() <= 1e-13 * a.abs().max(1.0), "degree {degree}: {a} vs {b}");
            }
            // The node on the bound 0 keeps its own evaluation.
            assert_eq!(red.times[0], 0.0);
            assert!(red.q[0].is_nan());
        }
    }

    /// The self-kernel `Σ_r w_r P_r G(t_r) G(t_r)ᵀ P_rᵀ` of polynomial rows `G` (`[K, W]`, degree
    /// 2) under a softmax `p` (summing to 1), written out node by node, against the reduced
    /// nodes' rows `(I − 1q_jᵀ)G(τ_j)` through [`PieceMoments::add_self_kernel`].
    #[test]
    fn reduced_self_kernel_equals_the_rules() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (k, wd, degree) = (3, 4, 2);
        let bounds = [0.0, 0.3, 0.71, 1.0];
        let nodes: Vec<(f64, f64)> = (0..60).map(|j| (j as f64 / 60.0, 1.0 / 60.0)).collect();
        // G_j(t) per piece: coefficients [degree + 1][K·W].
        let coef: Vec<Vec<Vec<f64>>> = (0..3).map(|_| (0..=degree).map(|_| (0..k * wd).map(|_| rng.gen_range(-1.0..1.0)).collect()).collect()).collect();
        let rows = |j: usize, t: f64| -> Vec<f64> { (0..k * wd).map(|i| (0..=degree).rev().fold(0.0, |acc, d| acc * t + coef[j][d][i])).collect() };
        let soft = |j: usize, t: f64| -> Vec<f64> {
            let e: Vec<f64> = (0..k).map(|o| ((o as f64 + 1.0) * t + 0.3 * j as f64).sin().exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|v| v / z).collect()
        };
        let piece_of = |t: f64| bounds.partition_point(|&b| b <= t) - 1;
        // P G (rows [K, W]) for a softmax p.
        let project = |g: &[f64], p: &[f64]| -> Vec<f64> {
            let mut out = g.to_vec();
            for c in 0..wd {
                let s: f64 = (0..k).map(|o| p[o] * g[o * wd + c]).sum();
                (0..k).for_each(|a| out[a * wd + c] -= s);
            }
            out
        };
        let outer = |a: &[f64], b: &[f64]| -> Vec<f64> { (0..k * k).map(|i| (0..wd).map(|c| a[(i / k) * wd + c] * b[(i % k) * wd + c]).sum()).collect() };
        let mut want = vec![0.0; k * k];
        for &(t, w) in &nodes {
            let j = piece_of(t);
            let pg = project(&rows(j, t), &soft(j, t));
            want.iter_mut().zip(outer(&pg, &pg)).for_each(|(a, b)| *a += w * b);
        }
        let red = reduce(&nodes, &bounds, degree, k, Some(&soft)).unwrap();
        assert_eq!(red.moments.len(), 3);
        let mut got = vec![0.0; k * k];
        let in_piece: Vec<bool> = (0..red.times.len()).map(|i| red.moments.iter().any(|pm| (pm.first..pm.first + pm.m).contains(&i))).collect();
        // The engine's rows: seeds (I − 1qᵀ) with the stand-in q (own p where NaN).
        let node_rows: Vec<Vec<f64>> = (0..red.times.len())
            .map(|i| {
                let (t, j) = (red.times[i], piece_of(red.times[i]));
                let q = &red.q[i * k..(i + 1) * k];
                project(&rows(j, t), &if q[0].is_nan() { soft(j, t) } else { q.to_vec() })
            })
            .collect();
        for (i, r) in node_rows.iter().enumerate() {
            if !in_piece[i] {
                got.iter_mut().zip(outer(r, r)).for_each(|(a, b)| *a += red.weights[i] * b);
            }
        }
        for pm in &red.moments {
            pm.add_self_kernel(&mut got, k, &mut |j, j2, out: &mut [f64]| out.copy_from_slice(&outer(&node_rows[pm.first + j], &node_rows[pm.first + j2])));
        }
        for (a, b) in want.iter().zip(&got) {
            assert!((a - b).abs() <= 1e-13 * want.iter().fold(1.0f64, |m, v| m.max(v.abs())), "{a} vs {b}");
        }
    }

    /// Product integration on a piece: a softmax of quartic logits against a cubic "gradient"
    /// `P`, `Σ_j v_j q_{j,o} P(τ_j)` at 4 nodes equals `∫ p_o P` (by a 200-point rule) to
    /// rounding, and `Σ_j v_j P(τ_j)` equals `∫ P`; at 3 nodes it does not (the test can fail).
    /// The
    /// moments equal the pairs' integrals `∫ ℓ_j ℓ_j' (1, p, ppᵀ)` by the same 200-point rule.
    #[test]
    fn product_nodes_integrate_the_softmax_against_the_gradient_s_degree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let k = 3;
        let (a, b) = (0.2, 0.9);
        let logit: Vec<Vec<f64>> = (0..k).map(|_| (0..5).map(|_| rng.gen_range(-2.0..2.0)).collect()).collect();
        let soft = |t: f64| -> Vec<f64> {
            let e: Vec<f64> = logit.iter().map(|c| poly(c, t).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|v| v / z).collect()
        };
        let cubic: Vec<f64> = (0..4).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let fine = gauss_legendre_01(200, a, b);
        let want: Vec<f64> = (0..k).map(|o| fine.iter().map(|&(t, w)| w * soft(t)[o] * poly(&cubic, t)).sum()).collect();
        let plain: f64 = fine.iter().map(|&(t, w)| w * poly(&cubic, t)).sum();
        let table = SoftmaxTable::new(a, b, k, &|ts: &[f64]| ts.iter().flat_map(|&t| soft(t)).collect());
        let (tau, v, q) = table.nodes(4).expect("a smooth softmax");
        for o in 0..k {
            let got: f64 = (0..4).map(|j| v[j] * q[j * k + o] * poly(&cubic, tau[j])).sum();
            assert!((got - want[o]).abs() <= 4e-15 * want[o].abs().max(1.0), "output {o}: {got} vs {}", want[o]);
        }
        let got: f64 = (0..4).map(|j| v[j] * poly(&cubic, tau[j])).sum();
        assert!((got - plain).abs() <= 4e-15 * plain.abs().max(1.0));
        let (tau3, v3, q3) = table.nodes(3).unwrap();
        for o in 0..k {
            let prod: f64 = (0..3).map(|j| v3[j] * q3[j * k + o] * poly(&cubic, tau3[j])).sum();
            assert!((prod - want[o]).abs() > 1e-8, "output {o}: three nodes are not exact for a cubic");
        }
        let s = table.moments(&tau);
        let mut l = vec![0.0; 4];
        let per = 1 + k + k * k;
        for j in 0..4 {
            for j2 in 0..4 {
                let mut w = vec![0.0; per];
                for &(t, wt) in &fine {
                    lagrange(&tau, t, &mut l);
                    let (c, p) = (wt * l[j] * l[j2], soft(t));
                    w[0] += c;
                    (0..k).for_each(|o| w[1 + o] += c * p[o]);
                    (0..k * k).for_each(|i| w[1 + k + i] += c * p[i / k] * p[i % k]);
                }
                for (x, y) in w.iter().zip(&s[(j * 4 + j2) * per..(j * 4 + j2 + 1) * per]) {
                    assert!((x - y).abs() <= 4e-15, "moment ({j}, {j2}): {x} vs {y}");
                }
            }
        }
        // A softmax that swings too fast for the scalar rules: none.
        let wild = |t: f64| -> Vec<f64> {
            let e: Vec<f64> = (0..k).map(|o| (4000.0 * (t * (o as f64 + 1.0)).sin()).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|v| v / z).collect()
        };
        assert!(SoftmaxTable::new(0.0, 1.0, k, &|ts: &[f64]| ts.iter().flat_map(|&t| wild(t)).collect()).nodes(4).is_none());
    }

    /// The simultaneous rule integrates every class's softmax against a polynomial of the
    /// gradient's degree exactly at fewer nodes than that degree needs otherwise — three classes
    /// and a cubic at three nodes, two classes and a quadratic at two, two classes and a cubic at
    /// three (fewer conditions than nodes) — where the Gauss nodes at the same count do not;
    /// ten classes have more conditions than three nodes.
    #[test]
    fn simultaneous_nodes_integrate_every_class_against_the_gradient_s_degree() {
        for (k, deg, m, seed) in [(3, 4, 3, 11), (3, 4, 3, 12), (2, 3, 2, 5), (2, 4, 3, 6)] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (a, b) = (0.2, 0.9);
            let logit: Vec<Vec<f64>> = (0..k).map(|_| (0..=deg).map(|_| rng.gen_range(-1.5..1.5)).collect()).collect();
            let soft = |t: f64| -> Vec<f64> {
                let e: Vec<f64> = logit.iter().map(|c| poly(c, t).exp()).collect();
                let z: f64 = e.iter().sum();
                e.iter().map(|v| v / z).collect()
            };
            let r: Vec<f64> = (0..deg).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let fine = gauss_legendre_01(200, a, b);
            let want: Vec<f64> = (0..k).map(|o| fine.iter().map(|&(t, w)| w * soft(t)[o] * poly(&r, t)).sum()).collect();
            let mass: Vec<f64> = (0..k).map(|o| fine.iter().map(|&(t, w)| w * (soft(t)[o] * poly(&r, t)).abs()).sum()).collect();
            let plain: f64 = fine.iter().map(|&(t, w)| w * poly(&r, t)).sum();
            let table = SoftmaxTable::new(a, b, k, &|ts: &[f64]| ts.iter().flat_map(|&t| soft(t)).collect());
            // (No gradient along the step: the self-kernel check passes trivially; below.)
            let flat = |_: f64| vec![0.0; k];
            let (tau, v, q) = table.simultaneous(m, deg, &flat, 1e-14).unwrap_or_else(|| panic!("K = {k}, degree {deg}, {m} nodes"));
            assert_eq!(tau.len(), m);
            assert!(tau.windows(2).all(|w| a < w[0] && w[0] < w[1] && w[1] < b));
            for o in 0..k {
                let got: f64 = (0..m).map(|j| v[j] * q[j * k + o] * poly(&r, tau[j])).sum();
                assert!((got - want[o]).abs() <= 1e-14 * mass[o], "K = {k}, output {o}: {got} vs {}", want[o]);
            }
            let got: f64 = (0..m).map(|j| v[j] * poly(&r, tau[j])).sum();
            assert!((got - plain).abs() <= 1e-14 * plain.abs().max(1.0), "plain: {got} vs {plain}");
            let (tg, vg, qg) = table.nodes(m).unwrap();
            let worst = (0..k).fold(0.0f64, |e, o| e.max(((0..m).map(|j| vg[j] * qg[j * k + o] * poly(&r, tg[j])).sum::<f64>() - want[o]).abs() / mass[o]));
            assert!(worst > 1e-9, "K = {k}: Gauss' {m} nodes are not exact here ({worst:e})");
            // Nor with one degree more than the rule is built for.
            assert!(table.simultaneous(m, deg + 1, &flat, 1e-14).is_none_or(|(t, _, _)| t != tau));
            // The rows' self-kernel at the nodes (the interpolant's) misses that of outputs
            // whose derivative is `r` times a slope per class by more than 1e-14 here; the check
            // refuses the nodes, and takes them where the slopes are equal (`P_r gd = 0`).
            let slope: Vec<f64> = (0..k).map(|o| 1.0 + o as f64).collect();
            assert!(table.simultaneous(m, deg, &|t: f64| slope.iter().map(|s| s * poly(&r, t)).collect(), 1e-14).is_none(), "K = {k}");
            assert!(table.simultaneous(m, deg, &|t: f64| vec![poly(&r, t); k], 1e-14).is_some(), "K = {k}");
        }
        let k = 10;
        let table = SoftmaxTable::new(0.0, 1.0, k, &|ts: &[f64]| ts.iter().flat_map(|&t| (0..k).map(move |o| (1.0 + 0.1 * t * o as f64) / (k as f64 * (1.0 + 0.45 * t)))).collect());
        let flat = |_: f64| vec![0.0; k];
        assert!(table.simultaneous(3, 4, &flat, 1e-14).is_none());
        assert!(table.simultaneous(4, 4, &flat, 1e-14).is_none(), "no conditions: the Gauss nodes are exact there");
    }

    /// One degree too many for the reduced nodes: the sums differ (the test above can fail).
    #[test]
    fn a_polynomial_above_the_degree_is_not_summed_exactly() {
        let nodes: Vec<(f64, f64)> = (0..100).map(|j| (j as f64 / 100.0, 0.01)).collect();
        let red = reduce(&nodes, &[0.0, 1.0], 1, 1, None).unwrap();
        assert_eq!(red.times.len(), 3, "t = 0 kept, two interpolatory nodes");
        assert!(red.q.is_empty());
        let want: f64 = nodes.iter().map(|&(t, w)| w * t * t).sum();
        let got: f64 = red.times.iter().zip(&red.weights).map(|(&t, &w)| w * t * t).sum();
        assert!((want - got).abs() > 1e-6);
    }

    /// Pieces with few nodes, or none, keep them; nothing reduced gives `None`.
    #[test]
    fn few_nodes_per_piece_are_kept() {
        let nodes: Vec<(f64, f64)> = (0..10).map(|j| (j as f64 / 10.0, 0.1)).collect();
        let bounds: Vec<f64> = std::iter::once(0.0).chain((0..10).map(|j| (j as f64 + 0.5) / 10.0)).chain([1.0]).collect();
        assert_eq!(reduce(&nodes, &bounds, 1, 2, None), None);
        // Nodes crowding one end of a piece: the weights would be lopsided, kept.
        let crowd = [(0.1, 1.0), (0.11, 1.0), (0.12, 1.0), (0.9, 1e-3)];
        assert_eq!(reduce(&crowd, &[0.0, 1.0], 1, 1, None), None);
    }
}
