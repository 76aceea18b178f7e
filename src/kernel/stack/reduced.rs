//! A chunk of row points' quadrature nodes, reduced on each point's pieces
//! ([`crate::kernel::quadrature::reduce`]) where the kink sweep walks the whole stack and its
//! pieces' output polynomials are trusted, else the rule's nodes as they are: a fixed rule's
//! ([`fixed_nodes`]) and the adaptive rule's accepted nodes ([`auto_nodes`]).
//!
//! Trust, for a fixed rule, per point: consecutive pieces' polynomials agree at the kink between them (a kink the
//! sweep missed inside a piece shows there as a jump of its slope change times the distance
//! to it, the next piece being read afresh), and the last piece's agrees with the network at
//! `t = 1` (one forward-mode evaluation), each to [`POLY_AGREEMENT`] of the outputs' scale —
//! the adaptive rule's test for reading the node search off the same polynomials (which the
//! adaptive rule makes at every piece bound before it reads them).

use super::kinks;
use super::step::StackStep;
use crate::kernel::quadrature::nodes::{AutoNodes, POLY_AGREEMENT};
pub(super) use crate::kernel::quadrature::reduce::PieceMoments;
use crate::kernel::quadrature::reduce::{reduce, Reduced};
use crate::kernel::types::NodeStats;
use crate::linalg::gemm_abt;

/// Nodes per step from which a fixed rule is reduced: below, the sweep costs more than it
/// saves (`left:10` on the MNIST CNN has about as many pieces as nodes).
pub(super) const REDUCE_FROM: usize = 16;

/// Points of a chunk swept before the sweep must have paid: it goes on for the chunk's other
/// points only while the reduced points saved [`MIN_SAVED`] of their nodes (LeNet-5 under
/// `left:16` has more pieces per point and step than nodes, and its sweep is not free).
const SWEEP_TRIAL: usize = 2;
const MIN_SAVED: f64 = 0.25;

#[cfg(test)]
thread_local! {
    /// The tests' switch, read where a kernel's stack model is made (on the calling thread):
    /// `true` keeps every rule's nodes as they are.
    pub(crate) static KEEP_NODES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a kernel computed from this thread reduces its nodes on the pieces (always, but in
/// the tests that compare against the rule node by node).
pub(crate) fn reduce_nodes() -> bool {
    #[cfg(test)]
    if KEEP_NODES.with(|c| c.get()) {
        return false;
    }
    true
}

/// The node rows of a chunk's points, point-major: row j is point `point[j]` at `times[j]`
/// with `weight[j]`, and, where some point's nodes were reduced with a softmax, `q` `[R, K]`
/// its stand-in for the softmax (NaN rows: the node's own). The reduced pieces' node rows are
/// `pieces[i].1.first..+m` (point `pieces[i].0`, in row order); their self-kernel comes from
/// the pieces' moments, so `self_weight` (the rows' weights for the self-kernel node by node)
/// holds 0 for them.
pub(super) struct FixedNodes {
    pub point: Vec<usize>,
    pub weight: Vec<f64>,
    pub times: Vec<f64>,
    pub q: Option<Vec<f64>>,
    pub pieces: Vec<(usize, PieceMoments)>,
    pub self_weight: Vec<f64>,
}

/// The fixed rule `nodes` for the chunk's `pc` points (`x` `[pc, d]`, `off` `[pc, K]`), reduced
/// on each point's pieces where `try_reduce` and the point's polynomials are trusted; the
/// evaluations, forward-mode evaluations and pieces per point go to `stats`.
pub(super) fn fixed_nodes(step: &StackStep<'_>, x: &[f64], off: Option<&[f64]>, pc: usize, nodes: &[(f64, f64)], try_reduce: bool, stats: &mut NodeStats) -> FixedNodes {
    let (k, d) = (step.k, step.d);
    // Each point's reduced nodes where its sweep has polynomials that join at its kinks, and the
    // last piece's outputs at t = 1. The sweep stops for the chunk's other points where the
    // first ones saved too little (a network with about as many pieces as the rule has nodes).
    let mut found: Vec<Option<(Reduced, Vec<f64>)>> = Vec::with_capacity(pc);
    let (mut swept, mut saved) = (0usize, 0usize);
    for q in 0..pc {
        let pays = swept < SWEEP_TRIAL || saved as f64 >= MIN_SAVED * (swept * nodes.len()) as f64;
        if !try_reduce || !pays {
            found.push(None);
            continue;
        }
        swept += 1;
        found.push(reduce_point(step, &x[q * d..(q + 1) * d], off.map(|o| &o[q * k..(q + 1) * k]), nodes));
        saved += found[q].as_ref().map_or(0, |r| nodes.len().saturating_sub(r.0.times.len()));
    }
    // The last pieces against the network at t = 1.
    let ends: Vec<usize> = (0..pc).filter(|&q| found[q].is_some()).collect();
    let mut trusted = vec![false; pc];
    if !ends.is_empty() {
        let (f_net, _) = step.par_jvp(x, off, &ends, &vec![1.0; ends.len()]);
        let g: Vec<f64> = ends.iter().flat_map(|&q| found[q].as_ref().expect("reduced").1.iter().copied()).collect();
        let offs = off.map(|o| ends.iter().flat_map(|&q| o[q * k..(q + 1) * k].iter().copied()).collect::<Vec<f64>>());
        let (f_poly, _) = step.map_outputs(g, &vec![0.0; ends.len() * k], offs.as_deref(), None);
        for (j, &q) in ends.iter().enumerate() {
            let (a, b) = (&f_net[j * k..(j + 1) * k], &f_poly[j * k..(j + 1) * k]);
            let scale = a.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            trusted[q] = a.iter().zip(b).all(|(u, v)| (u - v).abs() <= POLY_AGREEMENT * scale);
        }
    }
    let rows: Vec<PointNodes> = found
        .into_iter()
        .enumerate()
        .map(|(q, f)| {
            let r = f.filter(|_| trusted[q]).map(|f| f.0);
            stats.jvp_evaluations.push(usize::from(ends.contains(&q)));
            stats.pieces.push(r.as_ref().map_or(1, |r| r.pieces));
            (if r.is_some() { Vec::new() } else { nodes.to_vec() }, r)
        })
        .collect();
    assemble(k, rows, &mut stats.evaluations)
}

/// The adaptive rule's nodes `an` for the chunk's points, each point's reduced on its sweep's
/// pieces where its node search ran on their polynomials (checked against the network at
/// every piece bound there): a piece whose accepted nodes outnumber the gradient's degree plus
/// one is evaluated at that many, for the same sum — on log-softmax outputs, where the search
/// takes several Gauss orders per piece to pass its relative check on a non-polynomial `df/dt`.
/// A point's product-integrated pieces ([`AutoNodes::q`]) keep their nodes with their
/// stand-ins and moments as they are; its plain pieces are reduced as above. The evaluations
/// per point go to `evaluations`.
/// Without `try_reduce`, the nodes as the search gave them.
pub(super) fn auto_nodes(step: &StackStep<'_>, off: Option<&[f64]>, pc: usize, an: AutoNodes, try_reduce: bool, evaluations: &mut Vec<usize>) -> FixedNodes {
    let k = step.k;
    if !try_reduce {
        debug_assert!(an.q.is_none(), "product-integrated nodes need their stand-ins");
        evaluations.extend_from_slice(&an.evaluations);
        return FixedNodes { point: an.point, weight: an.weight, times: an.times, q: None, pieces: Vec::new(), self_weight: Vec::new() };
    }
    // Each point's plain nodes, and its product-integrated pieces' nodes with their stand-ins
    // (a node's place among those, for the pieces' moments).
    let mut own: Vec<Vec<(f64, f64)>> = vec![Vec::new(); pc];
    let mut product: Vec<Option<Reduced>> = vec![None; pc];
    let mut local = vec![usize::MAX; an.point.len()];
    if let Some(qs) = &an.q {
        for (i, &q) in an.point.iter().enumerate() {
            let row = &qs[i * k..(i + 1) * k];
            if row[0].is_nan() {
                continue;
            }
            let r = product[q].get_or_insert_with(|| Reduced { times: Vec::new(), weights: Vec::new(), q: Vec::new(), pieces: an.pieces[q], moments: Vec::new() });
            local[i] = r.times.len();
            r.times.push(an.times[i]);
            r.weights.push(an.weight[i]);
            r.q.extend_from_slice(row);
        }
        for (q, mut pm) in an.moments {
            pm.first = local[pm.first];
            product[q].as_mut().expect("a product-integrated point").moments.push(pm);
        }
    }
    for (i, ((&q, &w), &t)) in an.point.iter().zip(&an.weight).zip(&an.times).enumerate() {
        if local[i] == usize::MAX {
            own[q].push((t, w));
        }
    }
    let rows = own
        .into_iter()
        .zip(an.swept)
        .zip(product)
        .enumerate()
        .map(|(q, ((nodes, swept), product))| {
            let plain = match swept.and_then(|(bounds, polys)| reduce_on(step, off.map(|o| &o[q * k..(q + 1) * k]), &nodes, &bounds, &polys)) {
                Some(r) => (Vec::new(), Some(r)),
                None => (nodes, None),
            };
            let Some(mut r) = product else { return plain };
            // The plain nodes (reduced or not) after the product-integrated pieces'.
            match plain {
                (_, Some(red)) => {
                    let first = r.times.len();
                    r.moments.extend(red.moments.into_iter().map(|pm| PieceMoments { first: pm.first + first, ..pm }));
                    r.times.extend(red.times);
                    r.weights.extend(red.weights);
                    r.q.extend(red.q);
                }
                (nodes, None) => {
                    for (t, w) in nodes {
                        r.times.push(t);
                        r.weights.push(w);
                        r.q.extend(std::iter::repeat_n(f64::NAN, k));
                    }
                }
            }
            (Vec::new(), Some(r))
        })
        .collect();
    assemble(k, rows, evaluations)
}

/// One point's own nodes `(t, w)` (empty where reduced), or their reduction.
type PointNodes = (Vec<(f64, f64)>, Option<Reduced>);

/// The chunk's node rows, point-major, from each point's own nodes or its reduction.
fn assemble(k: usize, rows: Vec<PointNodes>, evaluations: &mut Vec<usize>) -> FixedNodes {
    let n: usize = rows.iter().map(|(o, r)| r.as_ref().map_or(o.len(), |r| r.times.len())).sum();
    let mut out = FixedNodes { point: Vec::with_capacity(n), weight: Vec::with_capacity(n), times: Vec::with_capacity(n), q: None, pieces: Vec::new(), self_weight: Vec::new() };
    // Each point's stand-ins and its node rows.
    let mut qs: Vec<(Option<Vec<f64>>, usize)> = Vec::with_capacity(rows.len());
    for (q, (own, r)) in rows.into_iter().enumerate() {
        match r {
            Some(r) => {
                evaluations.push(r.times.len());
                let row0 = out.point.len();
                out.point.extend(std::iter::repeat_n(q, r.times.len()));
                for mut pm in r.moments {
                    pm.first += row0;
                    out.pieces.push((q, pm));
                }
                out.weight.extend_from_slice(&r.weights);
                out.times.extend_from_slice(&r.times);
                qs.push(((!r.q.is_empty()).then_some(r.q), r.times.len()));
            }
            None => {
                evaluations.push(own.len());
                out.point.extend(std::iter::repeat_n(q, own.len()));
                out.weight.extend(own.iter().map(|n| n.1));
                out.times.extend(own.iter().map(|n| n.0));
                qs.push((None, own.len()));
            }
        }
    }
    if qs.iter().any(|q| q.0.is_some()) {
        let mut all = Vec::with_capacity(out.times.len() * k);
        for (q, rows) in qs {
            all.extend(q.unwrap_or_else(|| vec![f64::NAN; rows * k]));
        }
        out.q = Some(all);
    }
    out.self_weight = out.weight.clone();
    for (_, pm) in &out.pieces {
        out.self_weight[pm.first..pm.first + pm.m].iter_mut().for_each(|w| *w = 0.0);
    }
    out
}

/// One point's (`x` `[d]`, `off` `[K]`) fixed rule reduced on its pieces, and its last piece's
/// raw outputs at t = 1 (`[K]`, to check against the network): `None` where the sweep has no
/// polynomials, they do not join at the kinks, or no piece has more nodes than its degree.
fn reduce_point(step: &StackStep<'_>, x: &[f64], off: Option<&[f64]>, nodes: &[(f64, f64)]) -> Option<(Reduced, Vec<f64>)> {
    let k = step.k;
    let (kinks, polys) = kinks::pieces(step, x, 0.0, 1.0);
    let polys = polys?;
    let mut bounds = Vec::with_capacity(kinks.len() + 2);
    bounds.push(0.0);
    bounds.extend(kinks);
    bounds.push(1.0);
    if !joined(&bounds, &polys, k) {
        return None;
    }
    let reduced = reduce_on(step, off, nodes, &bounds, &polys)?;
    let last = polys.last().expect("a piece");
    Some((reduced, (0..k).map(|o| at(last, k, o, 1.0)).collect()))
}

/// One point's (`off` `[K]`) nodes reduced on its pieces `bounds` with raw-output polynomials
/// `polys` (`[deg + 1, K]` each): the gradient's degree is one below the outputs'.
fn reduce_on(step: &StackStep<'_>, off: Option<&[f64]>, nodes: &[(f64, f64)], bounds: &[f64], polys: &[Vec<f64>]) -> Option<Reduced> {
    let k = step.k;
    let degree = (polys.iter().map(Vec::len).max().unwrap_or(0) / k).saturating_sub(2);
    let softmax = |j: usize, t: f64| -> Vec<f64> {
        let g: Vec<f64> = (0..k).map(|o| at(&polys[j], k, o, t)).collect();
        step.softmax_at(&g, off).expect("asked only with a softmax")
    };
    reduce(nodes, bounds, degree, k, step.has_softmax().then_some(&softmax as &dyn Fn(usize, f64) -> Vec<f64>))
}

/// The end of the block of node rows from `b0` (at most `len` rows): short of a reduced piece
/// that would straddle it (its rows' products are taken within one block).
pub(super) fn block_end(pieces: &[(usize, PieceMoments)], b0: usize, len: usize, total: usize) -> usize {
    let b1 = (b0 + len).min(total);
    match pieces.iter().find(|(_, pm)| pm.first < b1 && b1 < pm.first + pm.m) {
        Some((_, pm)) if pm.first > b0 => pm.first,
        Some((_, pm)) => pm.first + pm.m,
        None => b1,
    }
}

/// The reduced pieces of rows `b0..b1` and their share of the rows' self-kernel (`diag`
/// `[pc, K, K]`) from one layer, node row `r` of the block holding `row(r)`: a dense layer's
/// `(a_r, δ_r)` (`[ne]`, `[K, out]`) or a formed layer's `([K, width], [])`.
pub(super) fn add_pieces_self_kernel<'r>(diag: &mut [f64], pieces: &[(usize, PieceMoments)], (b0, b1): (usize, usize), k: usize, row: &dyn Fn(usize) -> (&'r [f64], &'r [f64])) {
    for (q, pm) in pieces.iter().filter(|(_, pm)| pm.first >= b0 && pm.first + pm.m <= b1) {
        let d = &mut diag[q * k * k..(q + 1) * k * k];
        pm.add_self_kernel(d, k, &mut |j, j2, out: &mut [f64]| {
            let ((a1, d1), (a2, d2)) = (row(pm.first + j - b0), row(pm.first + j2 - b0));
            if d1.is_empty() {
                // Formed: `[K, width]` rows.
                gemm_abt(out, a1, a2, k, k, a1.len() / k, 1.0, false);
            } else {
                let dot: f64 = a1.iter().zip(a2).map(|(x, y)| x * y).sum();
                gemm_abt(out, d1, d2, k, k, d1.len() / k, dot, false);
            }
        });
    }
}

/// Output `o` of the raw-output polynomial `c` (`[deg + 1, K]`) at t.
fn at(c: &[f64], k: usize, o: usize, t: f64) -> f64 {
    (0..c.len() / k).rev().fold(0.0, |acc, i| acc * t + c[i * k + o])
}

/// Whether consecutive pieces' polynomials agree at the kinks between them (to
/// [`POLY_AGREEMENT`] of the outputs' scale there).
fn joined(bounds: &[f64], polys: &[Vec<f64>], k: usize) -> bool {
    polys.len() + 1 == bounds.len()
        && polys.windows(2).zip(&bounds[1..]).all(|(pair, &b)| {
            let (l, r): (Vec<f64>, Vec<f64>) = (0..k).map(|o| (at(&pair[0], k, o, b), at(&pair[1], k, o, b))).unzip();
            let scale = l.iter().chain(&r).fold(1.0f64, |m, v| m.max(v.abs()));
            l.iter().zip(&r).all(|(u, v)| (u - v).abs() <= POLY_AGREEMENT * scale)
        })
}
