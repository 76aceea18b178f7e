//! The adaptive kink-aware rule's node search along one step, for any network that can say
//! where it kinks and give its forward-mode derivative ([`AlongPath`]); what it costs per
//! point.

use crate::kernel::quadrature;
use crate::kernel::quadrature::reduce::{PieceMoments, SoftmaxTable};

pub(crate) fn gather_offsets(off: Option<&[f64]>, k: usize, idx: &[usize]) -> Option<Vec<f64>> {
    off.map(|o| {
        let mut v = Vec::with_capacity(idx.len() * k);
        for &p in idx {
            v.extend_from_slice(&o[p * k..(p + 1) * k]);
        }
        v
    })
}

/// Rows per forward-mode evaluation in the node search (bounds its scratch to a few MB).
pub(crate) const JVP_CHUNK: usize = 2048;

/// `step.jvp_points` at points `idx` (rows of `x`) and times `t`, in chunks of [`JVP_CHUNK`] rows.
pub(crate) fn jvp_rows<S: AlongPath>(step: &S, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let k = step.outputs();
    let mut f = Vec::with_capacity(idx.len() * k);
    let mut fdot = Vec::with_capacity(idx.len() * k);
    for (ic, tc) in idx.chunks(JVP_CHUNK).zip(t.chunks(JVP_CHUNK)) {
        let (a, b) = step.jvp_points(x, ic, tc, off);
        f.extend_from_slice(&a);
        fdot.extend_from_slice(&b);
    }
    (f, fdot)
}

/// Gauss orders tried in turn on a piece before it is bisected, and the bisection limit.
pub(crate) const AUTO_ORDERS: [usize; 8] = [2, 3, 4, 5, 6, 8, 10, 12];
pub(crate) const AUTO_MAX_DEPTH: u32 = 40;
/// Splits at located kinks along one lineage of pieces before only bisection is left.
pub(crate) const AUTO_MAX_LOCATED: u32 = 4096;

pub(crate) struct Piece {
    p: usize,
    /// The sweep piece it lies in (where the point's search reads the sweep's polynomials).
    j: usize,
    a: f64,
    b: f64,
    fa: Vec<f64>,
    fb: Vec<f64>,
    order: usize,
    /// Midpoint bisections above this piece (a split at a located kink does not count: a
    /// step may hold more kinks than [`AUTO_MAX_DEPTH`]; [`AUTO_MAX_LOCATED`] bounds those).
    depth: u32,
    /// Splits at located kinks above this piece.
    located: u32,
    /// The previous order's quadrature of `df/dt` per class (the relative check).
    prev: Option<Vec<f64>>,
    /// Whether the previous order passed the check against `f(b) − f(a)`.
    prev_ok: bool,
    /// Product integration's: the previous order's quadrature and check, and the piece's
    /// softmax along t (made at its first order).
    prev_prod: Option<Vec<f64>>,
    prev_prod_ok: bool,
    soft: Option<std::rc::Rc<SoftmaxTable>>,
}

/// What the adaptive rule needs of a network along one step: the kinks in t of point `p` of
/// `x` (`[P, d]`), and forward-mode `(f, df/dt)` at rows `(x[idx[j]], t[j])` (`off` `[P, K]`
/// per point; returns `[R, K]` each).
pub(crate) trait AlongPath {
    fn outputs(&self) -> usize;
    fn kinks(&self, x: &[f64], p: usize, a: f64, b: f64) -> Vec<f64>;
    fn jvp_points(&self, x: &[f64], idx: &[usize], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>);
    /// The kinks of point `p` in `(a, b)` (as [`AlongPath::kinks`]) and, where the network's raw
    /// outputs are a known polynomial on every piece between them (a layer stack's sweep walks
    /// the whole network), those polynomials, `[deg + 1, K]` each, one per piece: the node
    /// search then reads `f` and `df/dt` off them through [`AlongPath::map_outputs`] instead of
    /// running the network in forward mode.
    fn pieces(&self, x: &[f64], p: usize, a: f64, b: f64) -> (Vec<f64>, Option<Vec<Vec<f64>>>) {
        (self.kinks(x, p, a, b), None)
    }
    /// `f` and `df/dt` of rows from their raw outputs `g` and `dg/dt` and their offsets (all
    /// `[R, K]`): the output map, asked only where [`AlongPath::pieces`] gives polynomials
    /// (the identity unless the network says otherwise). With `q` (`[R, K]`), a row's softmax
    /// in `df/dt` is its row of `q` where that is not NaN (product integration's stand-in).
    fn map_outputs(&self, g: Vec<f64>, gd: &[f64], _off: Option<&[f64]>, _q: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        (g, gd.to_vec())
    }
    /// The output map's softmax at rows of raw outputs `g` (`[R, K]`; `off` `[K]`, one point's
    /// offsets, for every row), or `None` for outputs without one (then the search never
    /// product-integrates).
    fn softmax_at(&self, _g: &[f64], _off: Option<&[f64]>) -> Option<Vec<f64>> {
        None
    }
    /// Whether a piece must also converge relative to its own integrand: two consecutive
    /// orders' quadratures of `df/dt` agree to [`RELATIVE_TOL`] of `∫|df/dt|`. The check against
    /// `f(b) − f(a)` alone is absolute (its floor is the rounding of f), which on a short step
    /// leaves the Gram's entries, other directions of the same integrand, accurate to fewer
    /// digits than the machine; the layer-stack path asks for both.
    fn relative_check(&self) -> bool {
        false
    }
    /// Where a piece of point `p` fails every order: a kink in `(a, b)` that [`AlongPath::kinks`]
    /// did not report, to split the piece there instead of at its midpoint (`None`: bisect),
    /// with the forward-mode evaluations spent finding it.
    fn locate_kink(&self, _x: &[f64], _p: usize, _a: f64, _b: f64) -> (Option<f64>, usize) {
        (None, 0)
    }
}

/// The relative agreement of two consecutive Gauss orders that [`AlongPath::relative_check`]
/// asks for.
pub(crate) const RELATIVE_TOL: f64 = 1e-14;

/// Where the node search reads `f` and `df/dt`: the sweep's polynomials for the points that
/// have them, the network in forward mode for the rest.
struct Evaluator<'s, S: AlongPath> {
    step: &'s S,
    x: &'s [f64],
    off: Option<&'s [f64]>,
    k: usize,
    /// Per point: each sweep piece's raw-output polynomial (`[deg + 1, K]`).
    polys: Vec<Option<Vec<Vec<f64>>>>,
}

impl<S: AlongPath> Evaluator<'_, S> {
    /// `(f, df/dt)` `[R, K]` at rows `(point idx[r], time t[r])`, a point with polynomials read
    /// on its sweep piece `piece[r]` (the piece's own polynomial also at its ends, where the
    /// next piece's differs by rounding: a piece's quadrature is checked against its own ends).
    /// With `q` (`[R, K]`), a row's softmax stand-in where not NaN ([`AlongPath::map_outputs`];
    /// only rows read off polynomials have one).
    fn eval(&self, idx: &[usize], t: &[f64], piece: &[usize], q: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        let k = self.k;
        let (poly_rows, net_rows): (Vec<usize>, Vec<usize>) = (0..idx.len()).partition(|&r| self.polys[idx[r]].is_some());
        if poly_rows.is_empty() {
            return jvp_rows(self.step, self.x, self.off, idx, t);
        }
        let mut f = vec![0.0; idx.len() * k];
        let mut fd = vec![0.0; idx.len() * k];
        if !net_rows.is_empty() {
            let ni: Vec<usize> = net_rows.iter().map(|&r| idx[r]).collect();
            let nt: Vec<f64> = net_rows.iter().map(|&r| t[r]).collect();
            let (a, b) = jvp_rows(self.step, self.x, self.off, &ni, &nt);
            for (j, &r) in net_rows.iter().enumerate() {
                f[r * k..(r + 1) * k].copy_from_slice(&a[j * k..(j + 1) * k]);
                fd[r * k..(r + 1) * k].copy_from_slice(&b[j * k..(j + 1) * k]);
            }
        }
        let mut g = Vec::with_capacity(poly_rows.len() * k);
        let mut gd = Vec::with_capacity(poly_rows.len() * k);
        for &r in &poly_rows {
            let c = &self.polys[idx[r]].as_ref().expect("a row of a point with polynomials")[piece[r]];
            let deg = c.len() / k - 1;
            for o in 0..k {
                // Horner for the value and its derivative together.
                let (mut v, mut dv) = (0.0, 0.0);
                for i in (0..=deg).rev() {
                    dv = dv * t[r] + v;
                    v = v * t[r] + c[i * k + o];
                }
                g.push(v);
                gd.push(dv);
            }
        }
        let pi: Vec<usize> = poly_rows.iter().map(|&r| idx[r]).collect();
        let offs = gather_offsets(self.off, k, &pi);
        let qs = q.map(|q| gather_offsets(Some(q), k, &poly_rows).expect("rows"));
        let (a, b) = self.step.map_outputs(g, &gd, offs.as_deref(), qs.as_deref());
        for (j, &r) in poly_rows.iter().enumerate() {
            f[r * k..(r + 1) * k].copy_from_slice(&a[j * k..(j + 1) * k]);
            fd[r * k..(r + 1) * k].copy_from_slice(&b[j * k..(j + 1) * k]);
        }
        (f, fd)
    }
}

/// How far the network's outputs at a point's piece bounds may stray from its sweep's
/// polynomials (relative to their scale) before the point's node search runs the network
/// instead: rounding in a deep walk reaches ~1e-14; a kink the sweep missed shows as a
/// difference of the order of its slope change times the distance to it.
pub(crate) const POLY_AGREEMENT: f64 = 1e-11;

/// Nodes chosen by the auto rule: node j of point `point[j]` at `times[j]` with `weight[j]`.
pub(crate) struct AutoNodes {
    pub(crate) point: Vec<usize>,
    pub(crate) weight: Vec<f64>,
    pub(crate) times: Vec<f64>,
    pub(crate) evaluations: Vec<usize>,
    pub(crate) jvp_evaluations: Vec<usize>,
    pub(crate) pieces: Vec<usize>,
    pub(crate) unconverged: usize,
    /// Per point, where its search ran on the sweep's polynomials: its piece bounds
    /// (`0, kinks…, 1`) and each piece's raw-output polynomial (`[deg + 1, K]`).
    #[allow(clippy::type_complexity)]
    pub(crate) swept: Vec<Option<(Vec<f64>, Vec<Vec<f64>>)>>,
    /// Where the search product-integrated some piece: each node's stand-in for its softmax
    /// (`[N, K]`, a row of NaN where the node keeps its own), and the product-integrated
    /// pieces' self-kernel moments, each with its point and `first` its first node here.
    pub(crate) q: Option<Vec<f64>>,
    pub(crate) moments: Vec<(usize, PieceMoments)>,
}

/// The node search of the adaptive rule (the MLP's `kernel::stack::closed::dense_relu::nodes::auto_nodes`, the
/// stacks'), for any network with [`AlongPath`].
///
/// With `product` (for a caller that evaluates nodes with softmax stand-ins, [`AutoNodes::q`];
/// its value the rule's tolerance, relative for the rows' self-kernel on pieces whose nodes
/// do not interpolate it),
/// on log-softmax outputs a piece read off the sweep's polynomials is also integrated by
/// product integration ([`SoftmaxTable::nodes`]): each order's Gauss nodes carry the softmax
/// in their weights, from the piece's known output polynomial. That rule is exact by
/// construction from as many nodes as the raw outputs' degree d (accepted there on the absolute
/// check alone), and at fewer nodes m where the outputs are few enough (`K (d − m) ≤ m`: three
/// classes at three nodes for d = 4) on the nodes of [`SoftmaxTable::simultaneous`] instead of
/// Gauss'; else checked against its next order, as the plain rule is, below d; a piece
/// takes the lower of the two rules' accepted orders (the plain rule's where they tie), and one
/// the plain rule has not taken by order d the product rule's d nodes.
pub(crate) fn choose_auto_nodes<S: AlongPath>(step: &S, x: &[f64], p: usize, off: Option<&[f64]>, tol_step: f64, product: Option<f64>) -> AutoNodes {
    let k = step.outputs();
    let self_tol = product.unwrap_or(0.0);
    let product = product.is_some() && step.softmax_at(&vec![0.0; k], None).is_some();
    let mut bps: Vec<Vec<f64>> = Vec::with_capacity(p);
    let mut polys = Vec::with_capacity(p);
    for pi in 0..p {
        let (kinks, pp) = step.pieces(x, pi, 0.0, 1.0);
        let mut v = vec![0.0];
        v.extend(kinks);
        v.push(1.0);
        polys.push(pp);
        bps.push(v);
    }
    let mut idx = Vec::new();
    let mut tt = Vec::new();
    for (pi, v) in bps.iter().enumerate() {
        for &t in v {
            idx.push(pi);
            tt.push(t);
        }
    }
    // The network at every piece bound; where a point's polynomials agree with it there (each
    // piece's at both its ends), they stand in for the network in the rest of its search.
    let fv = jvp_rows(step, x, off, &idx, &tt).0;
    let mut ev = Evaluator { step, x, off, k, polys };
    // Each piece's ends: rows (point, a_j, piece j) and (point, b_j, piece j).
    let (mut ei, mut et, mut ej) = (Vec::new(), Vec::new(), Vec::new());
    for (pi, v) in bps.iter().enumerate() {
        if ev.polys[pi].is_some() {
            for j in 0..v.len() - 1 {
                ei.extend([pi, pi]);
                et.extend([v[j], v[j + 1]]);
                ej.extend([j, j]);
            }
        }
    }
    let fe = ev.eval(&ei, &et, &ej, None).0;
    let mut ends: Vec<Option<usize>> = vec![None; p];
    // Each point's measured evaluation noise: how far its polynomials and the network, two
    // evaluations of the same f, differ at its piece bounds (0 where it has no polynomials).
    let mut noise = vec![0.0f64; p];
    {
        let (mut pos, mut epos) = (0, 0);
        for (pi, v) in bps.iter().enumerate() {
            let n = v.len();
            if ev.polys[pi].is_some() {
                let scale = fv[pos * k..(pos + n) * k].iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let mut worst: f64 = 0.0;
                for j in 0..n - 1 {
                    for (e, bound) in [(2 * j, j), (2 * j + 1, j + 1)] {
                        let (pe, net) = (&fe[(epos + e) * k..(epos + e + 1) * k], &fv[(pos + bound) * k..(pos + bound + 1) * k]);
                        worst = pe.iter().zip(net).fold(worst, |m, (a, b)| if (a - b).is_nan() { f64::NAN } else { m.max((a - b).abs()) });
                    }
                }
                if worst <= POLY_AGREEMENT * scale {
                    ends[pi] = Some(epos);
                    noise[pi] = worst;
                } else {
                    // The network (and its bounds) for this point's whole search.
                    ev.polys[pi] = None;
                }
                epos += 2 * (n - 1);
            }
            pos += n;
        }
    }
    let mut pending: Vec<Piece> = Vec::new();
    let mut pos = 0;
    for (pi, v) in bps.iter().enumerate() {
        for j in 0..v.len() - 1 {
            let (fa, fb) = match ends[pi] {
                Some(e) => (fe[(e + 2 * j) * k..(e + 2 * j + 1) * k].to_vec(), fe[(e + 2 * j + 1) * k..(e + 2 * j + 2) * k].to_vec()),
                None => (fv[(pos + j) * k..(pos + j + 1) * k].to_vec(), fv[(pos + j + 1) * k..(pos + j + 2) * k].to_vec()),
            };
            pending.push(Piece { p: pi, j, a: v[j], b: v[j + 1], fa, fb, order: 0, depth: 0, located: 0, prev: None, prev_ok: false, prev_prod: None, prev_prod_ok: false, soft: None });
        }
        pos += v.len();
    }
    // The raw outputs' degree on a piece read off the sweep's polynomials (0 without them).
    let degree = |pc: &Piece| ev.polys[pc.p].as_ref().map_or(0, |c| c[pc.j].len() / k - 1);
    // A piece's softmax at times `ts` (`[Q, K]`), from its raw-output polynomial (product
    // integration).
    let softmax_on = |pi: usize, j: usize| {
        let c = &ev.polys[pi].as_ref().expect("a point with polynomials")[j];
        let o = off.map(|o| &o[pi * k..(pi + 1) * k]);
        move |ts: &[f64]| -> Vec<f64> {
            let g: Vec<f64> = ts.iter().flat_map(|&t| (0..k).map(move |q| (0..c.len() / k).rev().fold(0.0, |acc, i| acc * t + c[i * k + q]))).collect();
            step.softmax_at(&g, o).expect("outputs with a softmax")
        }
    };
    // A piece's product rule at n nodes and whether it is exact by construction: the
    // simultaneous rule where the piece's outputs allow it ([`SoftmaxTable::simultaneous`],
    // the rows' self-kernel checked on the piece's output derivative to the rule's tolerance,
    // relative: the Gram and the machine are exact there, the self-kernel is interpolated),
    // else the Gauss nodes, exact from the outputs' degree on.
    #[allow(clippy::type_complexity)]
    let product_rule = |table: &SoftmaxTable, pc: &Piece, n: usize| -> Option<((Vec<f64>, Vec<f64>, Vec<f64>), bool)> {
        let deg = degree(pc);
        let c = &ev.polys[pc.p].as_ref().expect("a point with polynomials")[pc.j];
        let gd = |t: f64| -> Vec<f64> { (0..k).map(|o| (1..c.len() / k).rev().fold(0.0, |acc, i| acc * t + i as f64 * c[i * k + o])).collect() };
        table.simultaneous(n, deg, &gd, self_tol).map(|r| (r, true)).or_else(|| table.nodes(n).map(|r| (r, n >= deg)))
    };
    let mut out = Accepted { point: Vec::new(), weight: Vec::new(), times: Vec::new(), q: product.then(Vec::new), moments: Vec::new() };
    // Accepts a piece's nodes, product-integrated with their stand-ins `q` (`[n, K]`; the
    // piece's softmax table has them), or plain. More nodes than the raw outputs' degree d, on
    // a piece with a softmax table, become its product rule at d nodes, exact by construction
    // (a linear model's one node where the search's least order is two); not a piece that
    // never converged, which keeps the nodes it was checked with.
    let mut accept = |pc: &Piece, nodes: &[(f64, f64)], q: Option<&[f64]>, converged: bool| {
        let table = pc.soft.as_deref();
        let deg = degree(pc);
        let fewer = table.filter(|_| converged && deg >= 1 && nodes.len() > deg).and_then(|t| t.nodes(deg));
        let (nodes, q): (Vec<(f64, f64)>, Option<Vec<f64>>) = match fewer {
            Some((tau, v, q)) => (tau.into_iter().zip(v).collect(), Some(q)),
            None => (nodes.to_vec(), q.map(<[f64]>::to_vec)),
        };
        match (out.q.as_mut(), q) {
            (Some(all), Some(q)) => {
                let tau: Vec<f64> = nodes.iter().map(|n| n.0).collect();
                let table = table.expect("a product-integrated piece has its softmax table");
                out.moments.push((pc.p, PieceMoments { first: out.point.len(), m: nodes.len(), s: table.moments(&tau) }));
                all.extend_from_slice(&q);
            }
            (Some(all), None) => all.extend(std::iter::repeat_n(f64::NAN, nodes.len() * k)),
            (None, _) => {}
        }
        for &(t, w) in &nodes {
            out.point.push(pc.p);
            out.weight.push(w);
            out.times.push(t);
        }
    };
    let mut pieces = vec![0usize; p];
    let mut jvp_evals = vec![0usize; p];
    let mut unconverged = 0;
    while !pending.is_empty() {
        let mut rp = Vec::new();
        let mut rt = Vec::new();
        let mut rw = Vec::new();
        let mut rj = Vec::new();
        let mut start = Vec::with_capacity(pending.len());
        // Product integration's rows for the pieces that have them: the same Gauss nodes, their
        // weights and their stand-ins `rq` (`[·, K]`); `prod_start[j]`: piece j's first row.
        let (mut pp, mut pt, mut pw, mut pj, mut rq) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut prod_start: Vec<Option<(usize, bool)>> = Vec::with_capacity(pending.len());
        for pc in pending.iter_mut() {
            start.push(rt.len());
            let n = AUTO_ORDERS[pc.order];
            for (tq, wq) in quadrature::gauss_legendre_01(n, pc.a, pc.b) {
                rp.push(pc.p);
                rt.push(tq);
                rw.push(wq);
                rj.push(pc.j);
            }
            if ev.polys[pc.p].is_none() {
                jvp_evals[pc.p] += n;
            }
            // The product rule beside the plain one while the order is below the outputs' degree
            // d, and at d from the second order on (its pair check with the order below): past
            // d it would only repeat its d-node rule, which a piece the plain rule fails then
            // gets directly, after the checks (`exact_later`); at the first order a piece with
            // d ≤ 2 is left to the plain rule, which, checked against the next order, takes it
            // at the same count without the product rule's scalar quadratures and paired
            // self-kernel where it can.
            let mut at = None;
            let deg = degree(pc);
            if product && ev.polys[pc.p].is_some() && (deg > n || (deg == n && pc.order > 0)) {
                let table = pc.soft.get_or_insert_with(|| std::rc::Rc::new(SoftmaxTable::new(pc.a, pc.b, k, &softmax_on(pc.p, pc.j)))).clone();
                if let Some(((tau, v, q), exact)) = product_rule(&table, pc, n) {
                    at = Some((pt.len(), exact));
                    pp.extend(std::iter::repeat_n(pc.p, n));
                    pt.extend(tau);
                    pw.extend(v);
                    pj.extend(std::iter::repeat_n(pc.j, n));
                    rq.extend(q);
                }
            }
            prod_start.push(at);
        }
        let (_, fdot) = ev.eval(&rp, &rt, &rj, None);
        let fdot_prod = if pt.is_empty() { Vec::new() } else { ev.eval(&pp, &pt, &pj, Some(&rq)).1 };
        let mut next: Vec<Piece> = Vec::new();
        let mut to_split: Vec<Piece> = Vec::new();
        // Pieces the plain rule failed at an order at or past their outputs' degree d, with
        // their threshold: the product rule at d nodes, exact by construction, is tried on them
        // after the checks (else they go on to the next order).
        let mut exact_later: Vec<(Piece, f64)> = Vec::new();
        for (j, pc) in pending.into_iter().enumerate() {
            let n = AUTO_ORDERS[pc.order];
            let rows = start[j]..start[j] + n;
            let mut scale: f64 = 1.0;
            for c in 0..k {
                scale = scale.max(pc.fa[c].abs()).max(pc.fb[c].abs());
            }
            // A rule's quadrature of `df/dt` per class at rows `rows` of `(w, fd)`: its error
            // against `f(b) − f(a)`, whether it agrees with the previous order's `prev` to the
            // relative tolerance, and the quadratures.
            let check = |w: &[f64], fd: &[f64], rows: std::ops::Range<usize>, prev: &Option<Vec<f64>>| {
                let mut err: f64 = 0.0;
                let mut qs = Vec::with_capacity(k);
                let mut rel_ok = !step.relative_check() || prev.is_some();
                for c in 0..k {
                    let q: f64 = rows.clone().map(|r| w[r] * fd[r * k + c]).sum();
                    err = err.max((q - (pc.fb[c] - pc.fa[c])).abs());
                    if let Some(prev) = prev {
                        let mass: f64 = rows.clone().map(|r| w[r] * fd[r * k + c].abs()).sum();
                        rel_ok &= (q - prev[c]).abs() <= RELATIVE_TOL * mass + 4.0 * f64::EPSILON * mass;
                    }
                    qs.push(q);
                }
                (err, rel_ok, qs)
            };
            let (err, rel_ok, qs) = check(&rw, &fdot, rows.clone(), &pc.prev);
            let prod = prod_start[j].map(|(s0, _)| (s0..s0 + n, check(&pw, &fdot_prod, s0..s0 + n, &pc.prev_prod)));
            // The floor is rounding: 8 ulps of the outputs, or twice the point's measured
            // evaluation noise where that is larger, up to 64 ulps (f(b) − f(a) is two
            // evaluations; a deep walk's rounding exceeds 8 ulps of outputs near 1, and
            // bisection cannot lower it: a LeNet-5 point bisected 20 pieces to 5e-13 wide
            // against 1.9e-15 with errors of 3.5–7.2e-15; the cap keeps a kink the sweep missed,
            // which also shows as disagreement, from widening the floor further).
            let thr = (tol_step * (pc.b - pc.a)).max(8.0 * f64::EPSILON * scale).max((2.0 * noise[pc.p]).min(64.0 * f64::EPSILON * scale));
            // Product integration with as many nodes as the raw outputs' degree is exact by
            // construction (the gradient's degree is one below), as is the simultaneous rule:
            // no next order to agree with.
            let exact = prod_start[j].is_some_and(|(_, exact)| exact);
            let plain_rows = |rows: std::ops::Range<usize>| -> Vec<(f64, f64)> { rows.map(|r| (rt[r], rw[r])).collect() };
            let prod_here = |rows: std::ops::Range<usize>| -> (Vec<(f64, f64)>, &[f64]) { (rows.clone().map(|r| (pt[r], pw[r])).collect(), &rq[rows.start * k..rows.end * k]) };
            // The lower of the two rules' accepted orders; the plain rule where they tie (its
            // self-kernel is node by node, the product's pairs the nodes).
            if err <= thr && rel_ok && pc.prev.is_some() && pc.prev_ok {
                // Two consecutive orders agree to the relative tolerance and both match the
                // exact change: the difference bounds the lower order's error (the higher is
                // the more accurate), so the lower order's nodes are the ones evaluated.
                accept(&pc, &quadrature::gauss_legendre_01(AUTO_ORDERS[pc.order - 1], pc.a, pc.b), None, true);
                pieces[pc.p] += 1;
            } else if prod.as_ref().is_some_and(|(_, (perr, prel, _))| *perr <= thr && *prel && pc.prev_prod.is_some() && pc.prev_prod_ok) {
                // The same for product integration, one order below.
                let table = pc.soft.as_deref().expect("a product-integrated piece");
                let ((tau, v, q), _) = product_rule(table, &pc, AUTO_ORDERS[pc.order - 1]).expect("the previous order had nodes");
                let nodes: Vec<(f64, f64)> = tau.into_iter().zip(v).collect();
                accept(&pc, &nodes, Some(&q), true);
                pieces[pc.p] += 1;
            } else if err <= thr && rel_ok {
                accept(&pc, &plain_rows(rows), None, true);
                pieces[pc.p] += 1;
            } else if let Some((prows, _)) = prod.as_ref().filter(|(_, (perr, _, _))| exact && *perr <= thr) {
                let (nodes, q) = prod_here(prows.clone());
                accept(&pc, &nodes, Some(q), true);
                pieces[pc.p] += 1;
            } else if pc.order + 1 < AUTO_ORDERS.len() {
                // (Not at the first order, where the plain rule has had no pair to check yet.)
                let later = pc.order > 0 && prod.is_none() && product && (1..=n).contains(&degree(&pc));
                let (prev_prod, prev_prod_ok) = match prod {
                    Some((_, (perr, _, pq))) => (step.relative_check().then_some(pq), perr <= thr),
                    None => (None, false),
                };
                let up = Piece { order: pc.order + 1, prev: step.relative_check().then_some(qs), prev_ok: err <= thr, prev_prod, prev_prod_ok, ..pc };
                if later {
                    exact_later.push((up, thr));
                } else {
                    next.push(up);
                }
            } else if err <= thr {
                // The relative check raises the order but never bisects: where the integrand's
                // rounding (cancellation in df/dt) keeps two orders apart, the absolute check
                // decides, as on the other paths.
                accept(&pc, &plain_rows(rows), None, true);
                pieces[pc.p] += 1;
            } else if pc.depth < AUTO_MAX_DEPTH && pc.b - pc.a > 1e-12 {
                to_split.push(pc);
            } else {
                accept(&pc, &plain_rows(rows), None, false);
                pieces[pc.p] += 1;
                unconverged += 1;
            }
        }
        if !exact_later.is_empty() {
            // Their product rule at d nodes, in one evaluation; accepted on the absolute check.
            let (mut ep, mut et, mut ew, mut ej, mut eq, mut spans) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (pc, _) in exact_later.iter_mut() {
                let deg = degree(pc);
                let table = pc.soft.get_or_insert_with(|| std::rc::Rc::new(SoftmaxTable::new(pc.a, pc.b, k, &softmax_on(pc.p, pc.j))));
                let start = et.len();
                if let Some((tau, v, q)) = table.nodes(deg) {
                    ep.extend(std::iter::repeat_n(pc.p, deg));
                    et.extend(tau);
                    ew.extend(v);
                    ej.extend(std::iter::repeat_n(pc.j, deg));
                    eq.extend(q);
                }
                spans.push(start..et.len());
            }
            let fd = if et.is_empty() { Vec::new() } else { ev.eval(&ep, &et, &ej, Some(&eq)).1 };
            for ((pc, thr), rows) in exact_later.into_iter().zip(spans) {
                let err = (0..k).fold(0.0f64, |m, c| {
                    let q: f64 = rows.clone().map(|r| ew[r] * fd[r * k + c]).sum();
                    m.max((q - (pc.fb[c] - pc.fa[c])).abs())
                });
                if !rows.is_empty() && err <= thr {
                    let nodes: Vec<(f64, f64)> = rows.clone().map(|r| (et[r], ew[r])).collect();
                    accept(&pc, &nodes, Some(&eq[rows.start * k..rows.end * k]), true);
                    pieces[pc.p] += 1;
                } else {
                    next.push(pc);
                }
            }
        }
        if !to_split.is_empty() {
            // Split at a located kink where the network finds one, else at the midpoint.
            let mids: Vec<(f64, bool)> = to_split
                .iter()
                .map(|pc| {
                    if pc.located >= AUTO_MAX_LOCATED {
                        return (0.5 * (pc.a + pc.b), false);
                    }
                    let (t, spent) = step.locate_kink(x, pc.p, pc.a, pc.b);
                    jvp_evals[pc.p] += spent;
                    t.map_or((0.5 * (pc.a + pc.b), false), |t| (t, true))
                })
                .collect();
            let pidx: Vec<usize> = to_split.iter().map(|pc| pc.p).collect();
            let at: Vec<f64> = mids.iter().map(|m| m.0).collect();
            let pj: Vec<usize> = to_split.iter().map(|pc| pc.j).collect();
            let fm = ev.eval(&pidx, &at, &pj, None).0;
            for (j, pc) in to_split.into_iter().enumerate() {
                let fmj = fm[j * k..(j + 1) * k].to_vec();
                let (t, located) = mids[j];
                let (depth, located) = if located { (pc.depth, pc.located + 1) } else { (pc.depth + 1, pc.located) };
                let fresh = |a: f64, b: f64, fa: Vec<f64>, fb: Vec<f64>| Piece { p: pc.p, j: pc.j, a, b, fa, fb, order: 0, depth, located, prev: None, prev_ok: false, prev_prod: None, prev_prod_ok: false, soft: None };
                next.push(fresh(pc.a, t, pc.fa.clone(), fmj.clone()));
                next.push(fresh(t, pc.b, fmj, pc.fb.clone()));
            }
        }
        pending = next;
    }
    let Accepted { point, weight, times, q, moments } = out;
    let mut evaluations = vec![0usize; p];
    for &pi in &point {
        evaluations[pi] += 1;
    }
    let q = q.filter(|_| !moments.is_empty());
    let swept = bps.into_iter().zip(ev.polys).map(|(b, p)| p.map(|p| (b, p))).collect();
    AutoNodes { point, weight, times, evaluations, jvp_evaluations: jvp_evals, pieces, unconverged, swept, q, moments }
}

/// The accepted nodes as the search goes ([`AutoNodes`]'s first and last fields).
struct Accepted {
    point: Vec<usize>,
    weight: Vec<f64>,
    times: Vec<f64>,
    q: Option<Vec<f64>>,
    moments: Vec<(usize, PieceMoments)>,
}


#[cfg(test)]
mod tests {
    use super::*;

    /// `f(t) = Σ_j relu(t − t_j)` for one point and one output, with kinks that the network's
    /// sweep does not report but its kink location finds (as behind a smooth layer).
    struct Ramps(Vec<f64>);

    impl AlongPath for Ramps {
        fn outputs(&self) -> usize {
            1
        }
        fn kinks(&self, _x: &[f64], _p: usize, _a: f64, _b: f64) -> Vec<f64> {
            Vec::new()
        }
        fn jvp_points(&self, _x: &[f64], idx: &[usize], t: &[f64], _off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
            let f = t.iter().map(|&t| self.0.iter().map(|&tj| (t - tj).max(0.0)).sum()).collect();
            let fd = t.iter().map(|&t| self.0.iter().filter(|&&tj| t > tj).count() as f64).collect();
            assert!(idx.iter().all(|&p| p == 0));
            (f, fd)
        }
        fn locate_kink(&self, _x: &[f64], _p: usize, a: f64, b: f64) -> (Option<f64>, usize) {
            let hair = 1e-9 * (b - a);
            (self.0.iter().copied().filter(|&t| t - a > hair && b - t > hair).reduce(f64::min), 1)
        }
    }

    /// `f(t) = 1 + 32 (t − ½)²` on 1 000 sweep pieces, read off its polynomial `9 − 32t + 32t²`
    /// (Horner cancels terms of ~16 into ~1: rounding of ~16 ulps) where the network evaluates
    /// the square: two evaluations of one f that differ by their rounding, as a deep walk's
    /// polynomials and the network do.
    struct Bowl(Vec<f64>);

    impl AlongPath for Bowl {
        fn outputs(&self) -> usize {
            1
        }
        fn kinks(&self, _x: &[f64], _p: usize, a: f64, b: f64) -> Vec<f64> {
            self.0.iter().copied().filter(|&t| t > a && t < b).collect()
        }
        fn jvp_points(&self, _x: &[f64], _idx: &[usize], t: &[f64], _off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
            (t.iter().map(|&t| 1.0 + 32.0 * (t - 0.5) * (t - 0.5)).collect(), t.iter().map(|&t| 64.0 * (t - 0.5)).collect())
        }
        fn pieces(&self, x: &[f64], p: usize, a: f64, b: f64) -> (Vec<f64>, Option<Vec<Vec<f64>>>) {
            let kinks = self.kinks(x, p, a, b);
            let n = kinks.len() + 1;
            (kinks, Some(vec![vec![9.0, -32.0, 32.0]; n]))
        }
    }

    /// Pieces too short for the tolerance (1e-12 × 1e-3 below the 8-ulp floor) whose
    /// `f(b) − f(a)` carries the evaluation's rounding: they converge at the measured noise
    /// floor instead of bisecting to the depth limit (before: unconverged pieces, bisected to
    /// 5e-13 wide, on a LeNet-5 point), and the nodes still integrate `df/dt` to the change.
    #[test]
    fn rounding_of_the_end_values_does_not_bisect() {
        let bowl = Bowl((1..1000).map(|j| j as f64 / 1000.0).collect());
        let an = choose_auto_nodes(&bowl, &[0.0], 1, None, 1e-12, None);
        assert_eq!(an.unconverged, 0);
        assert_eq!(an.pieces[0], 1000, "no piece was bisected");
        let (_, fd) = bowl.jvp_points(&[0.0], &vec![0; an.times.len()], &an.times, None);
        let q: f64 = an.weight.iter().zip(&fd).map(|(w, d)| w * d).sum();
        let ends = bowl.jvp_points(&[0.0], &[0, 0], &[0.0, 1.0], None).0;
        assert!((q - (ends[1] - ends[0])).abs() <= 1e-12, "{q} vs {}", ends[1] - ends[0]);
    }

    /// A step with far more located kinks than bisection levels (300 against
    /// [`AUTO_MAX_DEPTH`] = 40): every piece converges and the nodes integrate `df/dt` to the
    /// exact change. Counting each located split as a bisection level left the last piece
    /// unconverged, 1e-3 off.
    #[test]
    fn many_located_kinks_do_not_exhaust_the_bisection_depth() {
        let kinks: Vec<f64> = (1..=300).map(|j| (j as f64 / 301.0).powf(1.3)).collect();
        let ramps = Ramps(kinks);
        let an = choose_auto_nodes(&ramps, &[0.0], 1, None, 1e-12, None);
        assert_eq!(an.unconverged, 0);
        assert!(an.pieces[0] >= 301, "{} pieces", an.pieces[0]);
        let (_, fd) = ramps.jvp_points(&[0.0], &vec![0; an.times.len()], &an.times, None);
        let q: f64 = an.weight.iter().zip(&fd).map(|(w, d)| w * d).sum();
        let exact = ramps.jvp_points(&[0.0], &[0], &[1.0], None).0[0];
        assert!((q - exact).abs() <= 1e-12 * exact, "{q} vs {exact}");
    }
}
