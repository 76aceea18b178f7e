//! The structured Gram path for layer stacks ([`crate::model::layers`]): any stack, any
//! quadrature rule, without per-sample Jacobians of the whole network.
//!
//! Every parameter layer contributes to `⟨∇f^k(x_p; w_s(t)), ∇f^{k'}(x_i; w_s)⟩` through the
//! form of its per-sample gradient ([`crate::model::layers::Grad`]):
//!
//! - **dense** layers, `δ[k] ⊗ [a, 1]`: per quadrature node r of a row point p,
//!   `w_r (a_r·a_i + 1)(δ_r[k]·δ_i[k'])` — two GEMMs (`A_rows A_trainᵀ` and the layout's
//!   `δ` products) and a Hadamard fold, never the `out × in` gradient;
//! - **other** layers (conv, layer norm, projections), formed: the rows' node-weighted sum
//!   `J̄_p = Σ_r w_r G_r` (`[K, width]` per point) against the training points' `G_i`, one GEMM.
//!
//! The prediction `Σ_i Σ_k' a_{ik'} K_s[p, i, k, k']` is contracted from the same factors through
//! `v = Σ_i Σ_k' a_{ik'} ∇f^{k'}(x_i)` (per layer), and the rows' self-kernel node by node. The
//! nodes come from the fixed rule or from the adaptive rule with this stack's kinks
//! ([`kinks`]) and its forward-mode derivative ([`step::StackStep::jvp`]). The result equals
//! [`super::generic::step_into`]'s (tests).

pub(crate) mod closed;
pub(crate) mod cosine;
mod dense;
mod reduced;
pub(crate) use reduced::reduce_nodes;
pub(crate) mod kinks;
pub(crate) mod path;
pub(crate) mod step;
pub(crate) mod symmetric;

use super::types::NodeStats;
use super::gram::GramAccumulator;
use super::layout::{add_dense, add_formed, Layout, TrainDeltas};
use super::step_model::{StepInput, StepModel, StepOutput};
use super::quadrature::nodes::{choose_auto_nodes, AlongPath};
use crate::error::Result;
use crate::linalg::{gemm, gemm_abt};
use crate::model::Architecture;
use rayon::prelude::*;
use dense::{add_dense_self_kernel, dense_formed, fold_dense, fold_wave, sum_dense_jbar, OutputRows, PendingRows, SharedInput, FOLD_BYTES, FOLD_ROWS};
use step::{RowGrad, StackStep};

/// Row points whose nodes are evaluated and contracted together.
pub(crate) const CHUNK_POINTS: usize = 32;

/// Bytes of node-row gradients evaluated at once (their count per point grows with the kinks).
/// Below glibc's largest mmap threshold (32 MiB), so that blocks are reused from the heap
/// instead of mapped fresh and zero-faulted on every block.
const NODE_BYTES: usize = 16 << 20;

/// [`NODE_BYTES`], which the tests lower to one node row per block.
#[cfg(not(test))]
pub(crate) fn node_bytes() -> usize {
    NODE_BYTES
}
#[cfg(test)]
static NODE_BYTES_TEST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(NODE_BYTES);
#[cfg(test)]
pub(crate) fn node_bytes() -> usize {
    NODE_BYTES_TEST.load(std::sync::atomic::Ordering::Relaxed)
}

/// The tests' choice of the dense layers' route: 0 by flops (and the first layer's nodes summed
/// per point, [`SharedInput`]), 1 always folded node by node, 2 always formed, 3 folded with the
/// Fig. 2 measure's `J̄` summed beside the fold (not its node rows kept).
#[cfg(test)]
static DENSE_ROUTE_TEST: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// One parameter layer's training side for a step, and its prediction weights.
enum TrainSide {
    /// `acts` `[M, ne]`, `deltas` `[M, K, out]` (scaled by `colw`), `v` `[out, ne]`, and the
    /// deltas arranged for the formed route ([`TrainDeltas`], [`dense_formed`]).
    Factor { acts: Vec<f64>, deltas: Vec<f64>, v: Vec<f64>, dt: TrainDeltas },
    /// `g` `[M, K, width]` (scaled by `colw`), `v` `[width]`.
    Formed { g: Vec<f64>, v: Vec<f64> },
}

/// A stack's step with the rows it walks along, for the quadrature's node search.
pub(crate) struct StackAlong<'s, 'a> {
    pub(crate) step: &'s StackStep<'a>,
}

impl AlongPath for StackAlong<'_, '_> {
    fn outputs(&self) -> usize {
        self.step.k
    }
    fn kinks(&self, x: &[f64], p: usize, a: f64, b: f64) -> Vec<f64> {
        let d = self.step.d;
        kinks::kinks(self.step, &x[p * d..(p + 1) * d], a, b)
    }
    fn jvp_points(&self, x: &[f64], idx: &[usize], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        self.step.par_jvp(x, off, idx, t)
    }
    /// The sweep's kinks and, where it walks the whole stack, each piece's output polynomial.
    fn pieces(&self, x: &[f64], p: usize, a: f64, b: f64) -> (Vec<f64>, Option<Vec<Vec<f64>>>) {
        let d = self.step.d;
        kinks::pieces(self.step, &x[p * d..(p + 1) * d], a, b)
    }
    fn map_outputs(&self, g: Vec<f64>, gd: &[f64], off: Option<&[f64]>, q: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        self.step.map_outputs(g, gd, off, q)
    }
    fn softmax_at(&self, g: &[f64], off: Option<&[f64]>) -> Option<Vec<f64>> {
        self.step.softmax_at(g, off)
    }
    /// Where the sweep finds every kink, pieces are smooth and converge relative to their own
    /// integrand; a ReLU behind a smooth layer leaves kinks to bisection, where only the
    /// machine's absolute check is asked (it would otherwise bisect to the depth limit).
    fn relative_check(&self) -> bool {
        self.step.stack.kinks_reachable()
    }
    /// Behind a smooth layer the sweep stops: a piece that fails is split at the kink Newton's
    /// method finds on the activation inputs ([`StackStep::locate_kink`]).
    fn locate_kink(&self, x: &[f64], p: usize, a: f64, b: f64) -> (Option<f64>, usize) {
        if self.step.stack.kinks_reachable() {
            return (None, 0);
        }
        let d = self.step.d;
        self.step.locate_kink(&x[p * d..(p + 1) * d], a, b)
    }
}

/// Layer stacks on the structured path.
pub(crate) struct StackModel<'a> {
    pub arch: &'a Architecture,
    /// Each parameter layer into its own sink ([`GramAccumulator::target`]) and its own share
    /// of the prediction ([`StepOutput::layer_pred`]).
    pub per_layer: bool,
    /// The training side's buffers, handed back after each step and reused by the next.
    pub pool: BufferPool,
    /// Where the gradient evaluations run (`None`: here; `--device cuda`: the GPU's).
    pub device: Option<std::sync::Arc<dyn crate::device::NodeBackend>>,
    /// Whether a point's nodes may be reduced on its pieces ([`reduced`]; the tests turn it off
    /// to compare against the rule node by node).
    pub reduce: bool,
}

/// Large `f64` buffers kept across steps (already faulted in) and handed out by capacity.
#[derive(Default)]
pub(crate) struct BufferPool(std::sync::Mutex<Vec<Vec<f64>>>);

impl BufferPool {
    /// An empty buffer with at least `n` capacity: the smallest kept one that fits, else new.
    fn take(&self, n: usize) -> Vec<f64> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match kept.iter().enumerate().filter(|(_, v)| v.capacity() >= n).min_by_key(|(_, v)| v.capacity()).map(|(i, _)| i) {
            Some(i) => {
                let mut v = kept.swap_remove(i);
                v.clear();
                v
            }
            None => Vec::with_capacity(n),
        }
    }

    /// Keeps `v` for a later [`BufferPool::take`].
    fn give(&self, v: Vec<f64>) {
        if v.capacity() > 0 {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(v);
        }
    }
}

fn train_side(grads: Vec<RowGrad>, a: &[f64], colw: Option<&[f64]>, layout: Layout, m: usize, k: usize) -> Vec<TrainSide> {
    grads
        .into_iter()
        .map(|g| match g {
            RowGrad::Factor { acts, mut deltas, ne, out } => {
                // v = Σ_i (Σ_k' a[i,k'] δ_i[k']) ⊗ [a_i, 1]
                let mut dt = vec![0.0; m * out];
                for i in 0..m {
                    for c in 0..k {
                        let ac = a[i * k + c];
                        if ac != 0.0 {
                            dt[i * out..(i + 1) * out].iter_mut().zip(&deltas[(i * k + c) * out..(i * k + c + 1) * out]).for_each(|(x, y)| *x += ac * y);
                        }
                    }
                }
                let mut v = vec![0.0; out * ne];
                gemm(&mut v, &dt, true, &acts, false, (out, ne, m), 1.0, false);
                if let Some(cw) = colw {
                    deltas.chunks_exact_mut(out).zip(cw).for_each(|(row, &c)| row.iter_mut().for_each(|x| *x *= c));
                }
                let dt = TrainDeltas::new(layout, &deltas, m, k, out, None);
                TrainSide::Factor { acts, deltas, v, dt }
            }
            RowGrad::Formed { mut g, width } => {
                let mut v = vec![0.0; width];
                gemm(&mut v, a, false, &g, false, (1, width, m * k), 1.0, false);
                if let Some(cw) = colw {
                    g.chunks_exact_mut(width).zip(cw).for_each(|(row, &c)| row.iter_mut().for_each(|x| *x *= c));
                }
                TrainSide::Formed { g, v }
            }
        })
        .collect()
}

pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One formed layer's share for a chunk of row points starting at `c0`: the prediction
/// `⟨J̄_p[k], v⟩` into `pred` (`[P, K]`) and the Gram rows `⟨J̄_p, G_i⟩` (the layout's blocks)
/// into `out`; returns the flops.
///
/// # Shapes
/// `jbar` `[pc, K, width]`, `tg` `[M, K, width]`, `v` `[width]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn contract_formed(layout: Layout, out: &mut [f64], pred: &mut [f64], jbar: &[f64], tg: &[f64], v: &[f64], c0: usize, m: usize, k: usize) -> f64 {
    predict_formed(pred, jbar, v, c0, k);
    gram_formed(layout, out, jbar, tg, m, k, v.len())
}

/// A formed layer's prediction `⟨J̄_p[k], v⟩` for the points of `jbar` (from `c0`) into `pred`.
///
/// # Shapes
/// `pred` `[P, K]`, `jbar` `[pc, K, width]`, `v` `[width]`.
fn predict_formed(pred: &mut [f64], jbar: &[f64], v: &[f64], c0: usize, k: usize) {
    let wd = v.len();
    let pc = jbar.len() / (k * wd).max(1);
    for q in 0..pc {
        for c in 0..k {
            pred[(c0 + q) * k + c] += dot(&jbar[(q * k + c) * wd..(q * k + c + 1) * wd], v);
        }
    }
}

/// A formed layer's Gram rows `⟨J̄_p, G_i⟩` (the layout's blocks) into `out`; returns the flops.
///
/// # Shapes
/// `out` the accumulation rows of the `pc` points, `jbar` `[pc, K, wd]`, `tg` `[M, K, wd]`.
fn gram_formed(layout: Layout, out: &mut [f64], jbar: &[f64], tg: &[f64], m: usize, k: usize, wd: usize) -> f64 {
    let pc = jbar.len() / (k * wd).max(1);
    add_dense(layout, out, jbar, tg, pc, m, k, wd, 1.0);
    2.0 * (pc * m * layout.per_pair(k)) as f64 * wd as f64
}

/// Bytes of the formed layers' `J̄` held for one wave of row points (see [`wave_points`]).
const WAVE_BYTES: usize = 64 << 20;

/// Row points whose formed layers are contracted together, as one product per layer (and per
/// class in the `diag` layout), after their chunks ran side by side: a multiple of `chunk`
/// whose `J̄` (`formed` numbers per point) stays within [`WAVE_BYTES`] (or one chunk).
///
/// Per chunk (≤ 32 points, 13 for 100 points on two cores) the product's row side is so thin
/// that packing the training side (`[M, K, width]`, 386 MB for LeNet-5's second convolution at
/// M = 2 000) cost as much as the multiply-adds.
fn wave_points(chunk: usize, formed: usize) -> usize {
    #[cfg(test)]
    if let n @ 1.. = WAVE_POINTS_TEST.load(std::sync::atomic::Ordering::Relaxed) {
        return (n / chunk.max(1)).max(1) * chunk.max(1);
    }
    let fit = WAVE_BYTES / (8 * formed).max(1);
    (fit / chunk.max(1)).max(1) * chunk.max(1)
}

/// The tests' wave in row points (0: by [`WAVE_BYTES`]).
#[cfg(test)]
static WAVE_POINTS_TEST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The step's prediction from one prediction per parameter layer (`per_layer`, kept as the
/// shares) or a single one.
pub(crate) fn split_predictions(mut preds: Vec<Vec<f64>>, per_layer: bool) -> (Vec<f64>, Vec<Vec<f64>>) {
    if !per_layer {
        return (preds.pop().expect("one prediction"), Vec::new());
    }
    let mut pred = vec![0.0; preds.first().map_or(0, Vec::len)];
    preds.iter().for_each(|l| pred.iter_mut().zip(l).for_each(|(x, y)| *x += y));
    (pred, preds)
}

/// Row points per parallel task: at most [`CHUNK_POINTS`], and at least four tasks per thread
/// where the points allow (points differ in their kinks, so smaller tasks balance the cores).
fn chunk_points(p: usize) -> usize {
    CHUNK_POINTS.min(p.div_ceil(4 * rayon::current_num_threads())).max(1)
}

/// `rows` as `n` consecutive slices of `len` numbers (the last one shorter; empty ones where
/// `rows` runs out).
fn split_rows(mut rows: &mut [f64], len: usize, n: usize) -> Vec<&mut [f64]> {
    (0..n)
        .map(|_| {
            let take = len.min(rows.len());
            let (head, tail) = std::mem::take(&mut rows).split_at_mut(take);
            rows = tail;
            head
        })
        .collect()
}

/// One task's row points: `x` `[pc, d]`, offsets `[pc, K]`.
struct ChunkRows<'x> {
    x: &'x [f64],
    off: Option<&'x [f64]>,
    pc: usize,
}

/// What one chunk of row points adds: predictions (one array `[pc, K]` per prediction target),
/// the self-kernel `[pc, K, K]`, node statistics, contraction seconds (this thread's) and flops.
struct ChunkOut {
    preds: Vec<Vec<f64>>,
    diag: Vec<f64>,
    stats: NodeStats,
    seconds: f64,
    flops: f64,
    /// Thread-seconds of the gradient evaluations and of the node search.
    gradient_seconds: f64,
    search_seconds: f64,
    /// The formed layers' `J̄` (`[pc, K, width]`, empty for the other layers), contracted per
    /// wave of chunks ([`wave_points`]).
    formed: Vec<Vec<f64>>,
    /// The Fig. 2 measure's `Σ (1 − cos)` over the chunk's (point, class) pairs and their count
    /// (`(0, 0)` unless asked for, [`StepInput::cosine`]).
    cosine: (f64, usize),
    /// The shared first layer's `(a_p, δ̄_p)` (`[pc, ne]`, `[pc, K, out]`) and the output rows'
    /// `[Ā; B̄]` (`[pc, K + 1, ne]`, with its layer and α), folded per wave ([`fold_wave`]).
    shared: Option<(Vec<f64>, Vec<f64>)>,
    output: Option<(usize, f64, Vec<f64>)>,
}

/// The nodes of one chunk of row points, their gradients a block at a time, folded into the
/// chunk's Gram rows `outs` (one slice per target: each layer's sink, or the one sink).
#[allow(clippy::too_many_arguments)]
fn row_chunk(step: &StackStep<'_>, input: &StepInput<'_>, train: &[TrainSide], layout: Layout, rc: &ChunkRows<'_>, outs: &mut [&mut [f64]], (npred, row_numbers, m, k): (usize, usize, usize, usize), reduce: bool) -> ChunkOut {
    let (xc, offc, pc) = (rc.x, rc.off, rc.pc);
    let mut preds = vec![vec![0.0; pc * k]; npred];
    let mut diag = if input.self_kernel { vec![0.0; pc * k * k] } else { Vec::new() };
    let mut stats = NodeStats { evaluations: Vec::with_capacity(pc), jvp_evaluations: Vec::with_capacity(pc), pieces: Vec::with_capacity(pc), unconverged: 0 };
    let (mut gradient_seconds, mut search_seconds) = (0.0, 0.0);
    // Many nodes are reduced on the pieces of a stack whose kinks the sweep finds ([`reduced`];
    // here, not on a device): the rows' stand-ins for the softmax, the reduced pieces and the
    // rows' weights in the self-kernel node by node come with them.
    let searched = std::time::Instant::now();
    let fx = match input.fixed {
        Some(nodes) => {
            // Point-major: a point's node rows are consecutive, so a layer whose input does
            // not depend on t (the first) forms its products once per point (`Dense::apply`,
            // `Conv::shared_patches`) instead of once per node.
            let try_reduce = reduce && nodes.len() >= reduced::REDUCE_FROM && step.nodes.is_none() && step.stack.kinks_reachable();
            reduced::fixed_nodes(step, xc, offc, pc, nodes, try_reduce, &mut stats)
        }
        None => {
            // Product-integrated pieces only where their stand-ins reach the evaluations.
            let here = reduce && step.nodes.is_none();
            let an = choose_auto_nodes(&StackAlong { step }, xc, pc, offc, input.tol_step, here.then_some(input.tol));
            stats.jvp_evaluations.extend_from_slice(&an.jvp_evaluations);
            stats.pieces.extend_from_slice(&an.pieces);
            stats.unconverged += an.unconverged;
            reduced::auto_nodes(step, offc, pc, an, here, &mut stats.evaluations)
        }
    };
    search_seconds += searched.elapsed().as_secs_f64();
    let reduced::FixedNodes { point, weight, times, q: stand_ins, pieces: reduced_pieces, self_weight } = fx;
    let self_weight = (!reduced_pieces.is_empty()).then_some(self_weight);
    let nout = outs.len();
    let target = |li: usize| if nout > 1 { li } else { 0 };
    let pred_of = |li: usize| if npred > 1 { li } else { 0 };
    // The nodes' gradients a block of rows at a time (a kink-heavy step has thousands of
    // nodes per point; LeNet-5 holds ~28 000 numbers per node row): dense layers fold
    // each block into the Gram rows, formed layers sum theirs into the points' J̄ first.
    let block = (node_bytes() / (8 * row_numbers).max(1)).max(1);
    // Formed layers sum their nodes into J̄ per point; so do dense layers whose nodes are many per
    // point (`J̄_p = Σ_r w_r δ_r ⊗ a_r`, `[pc, K, out, ne]`, contracted once against the training
    // factors); the other dense layers fold node by node (empty J̄).
    let nodes = point.len();
    let mut jbars: Vec<Vec<f64>> = train
        .iter()
        .map(|tr| match tr {
            TrainSide::Formed { v, .. } => vec![0.0; pc * k * v.len()],
            TrainSide::Factor { acts, deltas, .. } => {
                let (ne, no) = (acts.len() / m.max(1), deltas.len() / (m * k).max(1));
                if dense_formed(layout, nodes, pc, m, k, no, ne) { vec![0.0; pc * k * no * ne] } else { Vec::new() }
            }
        })
        .collect();
    let mut shared = SharedInput::new(train, pc, m, k);
    if shared.is_some() {
        jbars[0] = Vec::new();
    }
    // With one node per point (the DPK, the NTK) `K + 1` rows are no fewer than the node's `K`:
    // the node folds as any dense layer's (its δ products are GEMMs, the rows' element-wise
    // softmax pass is not: 12 % of the MNIST MLP's DPK).
    let one_node = input.fixed.is_some_and(|n| n.len() < 2);
    let mut output = OutputRows::new(step, train, pc, m, k).filter(|o| !one_node && (o.layer > 0 || shared.is_none()));
    if let Some(o) = &output {
        jbars[o.layer] = Vec::new();
    }
    // The Fig. 2 measure needs each dense layer's `J̄` (the shared first layer and the output
    // rows have theirs in factors). A layer folded node by node keeps its node rows for it and
    // takes the products pairwise (`cosine::Integrated::Rows`) where its rows hold no more
    // numbers than `J̄` (`nodes·(ne + K·out) ≤ pc·K·out·ne`; its flops are then fewer too), else
    // sums `J̄` beside the fold (`cos_jbar`). With `J̄` summed on LeNet-5 under `left:10` (100
    // held-out images) the measure cost 9–11 % of the EPK; pairwise, within the runs' spread.
    let folded: Vec<bool> = train
        .iter()
        .enumerate()
        .map(|(li, tr)| matches!(tr, TrainSide::Factor { .. }) && input.cosine && jbars[li].is_empty() && !(li == 0 && shared.is_some()) && output.as_ref().is_none_or(|o| o.layer != li))
        .collect();
    let sizes = |tr: &TrainSide| match tr {
        TrainSide::Factor { acts, deltas, .. } => (acts.len() / m.max(1), deltas.len() / m.max(1)),
        TrainSide::Formed { .. } => (0, 0),
    };
    #[allow(unused_mut)]
    let mut keep_rows: Vec<bool> = train.iter().zip(&folded).map(|(tr, &f)| f && { let (ne, kno) = sizes(tr); nodes * (ne + kno) <= pc * kno * ne }).collect();
    #[cfg(test)]
    if DENSE_ROUTE_TEST.load(std::sync::atomic::Ordering::Relaxed) == 3 {
        keep_rows.iter_mut().for_each(|r| *r = false);
    }
    let mut cos_jbar: Vec<Vec<f64>> = train
        .iter()
        .enumerate()
        .map(|(li, tr)| if folded[li] && !keep_rows[li] { let (ne, kno) = sizes(tr); vec![0.0; pc * kno * ne] } else { Vec::new() })
        .collect();
    let mut cos_rows: Vec<PendingRows> = train.iter().map(|_| PendingRows::default()).collect();
    let mut scratch: Vec<f64> = Vec::new();
    let mut pending: Vec<PendingRows> = train.iter().map(|_| PendingRows::default()).collect();
    let (mut seconds, mut flops) = (0.0, 0.0);
    let mut dd = vec![0.0; k * k];
    let mut at_zero = cosine::AtZero::new(pc);
    let mut b1 = 0;
    while b1 < point.len() {
        let b0 = b1;
        b1 = reduced::block_end(&reduced_pieces, b0, block, point.len());
        let (bp, bw) = (&point[b0..b1], &weight[b0..b1]);
        // The rows' weights in the self-kernel node by node (0 on reduced pieces, whose share
        // comes from their moments).
        let bs = self_weight.as_deref().map_or(bw, |s| &s[b0..b1]);
        // On every core: with few row points the chunks alone do not fill them.
        // On a device, formed layers come back summed per point (with their self-kernel terms).
        let evaluated = std::time::Instant::now();
        let (parts, grams) = match step.par_grads_weighted(xc, offc, bp, &times[b0..b1], bw, input.self_kernel) {
            Some(p) => {
                let (parts, grams): (Vec<_>, Vec<_>) = p.into_iter().unzip();
                (parts, Some(grams))
            }
            None => (step.par_grads_q(xc, offc, bp, &times[b0..b1], stand_ins.as_deref().map(|q| &q[b0 * k..b1 * k])), None),
        };
        if input.cosine && grams.is_none() {
            at_zero.keep(&parts, bp, &times[b0..b1], k);
        }
        gradient_seconds += evaluated.elapsed().as_secs_f64();
        let started = std::time::Instant::now();
        for (li, tr) in train.iter().enumerate() {
            let pred = &mut preds[pred_of(li)];
            match (&parts[0][li], tr) {
                (RowGrad::Factor { ne, out: no, .. }, TrainSide::Factor { acts: ta, deltas: td, v, .. }) => {
                    let (ne, no) = (*ne, *no);
                    // The block's rows together (small next to the formed layers' rows; the
                    // dense GEMMs want them all).
                    let (mut acts, mut deltas) = (Vec::with_capacity(bp.len() * ne), Vec::with_capacity(bp.len() * k * no));
                    for part in &parts {
                        let RowGrad::Factor { acts: a, deltas: d, .. } = &part[li] else { unreachable!("the same stack gives the same layer kinds") };
                        acts.extend_from_slice(a);
                        deltas.extend_from_slice(d);
                    }
                    if input.self_kernel && !reduced_pieces.is_empty() {
                        let (a, d) = (&acts, &deltas);
                        reduced::add_pieces_self_kernel(&mut diag, &reduced_pieces, (b0, b1), k, &|r| (&a[r * ne..(r + 1) * ne], &d[r * k * no..(r + 1) * k * no]));
                    }
                    if let Some(sh) = shared.as_mut().filter(|_| li == 0) {
                        sh.add(bp, bw, &acts, &deltas);
                        if input.self_kernel {
                            add_dense_self_kernel(&mut diag, &mut dd, bp, bs, &acts, &deltas, ne, no, k);
                        }
                        continue;
                    }
                    if let Some(o) = output.as_mut().filter(|o| o.layer == li) {
                        o.add(bp, bw, &acts, &deltas);
                        if input.self_kernel {
                            add_dense_self_kernel(&mut diag, &mut dd, bp, bs, &acts, &deltas, ne, no, k);
                        }
                        continue;
                    }
                    if !cos_jbar[li].is_empty() {
                        sum_dense_jbar(&mut cos_jbar[li], bp, bw, &acts, &deltas, ne, k * no, &mut scratch);
                    }
                    if keep_rows[li] {
                        let kept = &mut cos_rows[li];
                        kept.point.extend_from_slice(bp);
                        kept.weight.extend_from_slice(bw);
                        kept.acts.extend_from_slice(&acts);
                        kept.deltas.extend_from_slice(&deltas);
                    }
                    if jbars[li].is_empty() {
                        let held = &mut pending[li];
                        held.point.extend_from_slice(bp);
                        held.weight.extend_from_slice(bw);
                        held.acts.extend_from_slice(&acts);
                        held.deltas.extend_from_slice(&deltas);
                        if held.point.len() >= FOLD_ROWS {
                            flops += fold_dense(layout, outs[target(li)], &held.point, &held.weight, &held.acts, &held.deltas, ta, td, ne, no, m, k);
                            held.clear();
                        }
                    } else {
                        flops += sum_dense_jbar(&mut jbars[li], bp, bw, &acts, &deltas, ne, k * no, &mut scratch);
                    }
                    // The prediction's `V a_r` for every node row of the block at once.
                    let rb = bp.len();
                    let mut va = vec![0.0; rb * no];
                    gemm_abt(&mut va, &acts, v, rb, no, ne, 1.0, false);
                    for (r, ((&q, &w), &ws)) in bp.iter().zip(bw).zip(bs).enumerate() {
                        let dr = &deltas[r * k * no..(r + 1) * k * no];
                        let var = &va[r * no..(r + 1) * no];
                        for c in 0..k {
                            pred[q * k + c] += w * dot(&dr[c * no..(c + 1) * no], var);
                        }
                        if input.self_kernel && ws != 0.0 {
                            let ar = &acts[r * ne..(r + 1) * ne];
                            gemm_abt(&mut dd, dr, dr, k, k, no, ws * dot(ar, ar), false);
                            diag[q * k * k..(q + 1) * k * k].iter_mut().zip(&dd).for_each(|(a, b)| *a += b);
                        }
                    }
                }
                (RowGrad::Formed { width, .. }, TrainSide::Formed { .. }) => {
                    // Part by part, as the engine formed them (no copy of the block's rows).
                    let wd = *width;
                    let jbar = &mut jbars[li];
                    if let Some(grams) = &grams {
                        // Each part's runs of equal points, summed with their weights already.
                        let b = step.block_rows();
                        for (pi, part) in parts.iter().enumerate() {
                            let RowGrad::Formed { g, .. } = &part[li] else { unreachable!("the same stack gives the same layer kinds") };
                            let lo = pi * b;
                            let rows = &bp[lo..(lo + b).min(bp.len())];
                            for (ri, &(s0, _)) in crate::device::runs(rows).iter().enumerate() {
                                let q = rows[s0];
                                jbar[q * k * wd..(q + 1) * k * wd].iter_mut().zip(&g[ri * k * wd..(ri + 1) * k * wd]).for_each(|(a, b)| *a += b);
                                if let Some(gg) = &grams[pi][li] {
                                    diag[q * k * k..(q + 1) * k * k].iter_mut().zip(&gg[ri * k * k..(ri + 1) * k * k]).for_each(|(a, b)| *a += b);
                                }
                            }
                        }
                        continue;
                    }
                    let mut r0 = 0;
                    for part in &parts {
                        let RowGrad::Formed { g, .. } = &part[li] else { unreachable!("the same stack gives the same layer kinds") };
                        let nr = g.len() / (k * wd).max(1);
                        let (pp, pw, ps) = (&bp[r0..r0 + nr], &bw[r0..r0 + nr], &bs[r0..r0 + nr]);
                        r0 += nr;
                        for (r, ((&q, &w), &ws)) in pp.iter().zip(pw).zip(ps).enumerate() {
                            let gr = &g[r * k * wd..(r + 1) * k * wd];
                            jbar[q * k * wd..(q + 1) * k * wd].iter_mut().zip(gr).for_each(|(a, b)| *a += w * b);
                            if input.self_kernel && ws != 0.0 {
                                gemm_abt(&mut dd, gr, gr, k, k, wd, ws, false);
                                diag[q * k * k..(q + 1) * k * k].iter_mut().zip(&dd).for_each(|(a, b)| *a += b);
                            }
                        }
                    }
                    if input.self_kernel && !reduced_pieces.is_empty() {
                        // Block row r is row r % EVAL_CHUNK of part r / EVAL_CHUNK (`par_grads_q`).
                        let row = |r: usize| -> (&[f64], &[f64]) {
                            let RowGrad::Formed { g, .. } = &parts[r / step::EVAL_CHUNK][li] else { unreachable!("the same stack gives the same layer kinds") };
                            let i = r % step::EVAL_CHUNK;
                            (&g[i * k * wd..(i + 1) * k * wd], &[])
                        };
                        reduced::add_pieces_self_kernel(&mut diag, &reduced_pieces, (b0, b1), k, &row);
                    }
                }
                _ => unreachable!("rows and training points of one stack"),
            }
        }
        seconds += started.elapsed().as_secs_f64();
    }
    let started = std::time::Instant::now();
    for (li, held) in pending.iter().enumerate() {
        if let (false, TrainSide::Factor { acts: ta, deltas: td, .. }) = (held.point.is_empty(), &train[li]) {
            let (ne, no) = (ta.len() / m.max(1), td.len() / (m * k).max(1));
            flops += fold_dense(layout, outs[target(li)], &held.point, &held.weight, &held.acts, &held.deltas, ta, td, ne, no, m, k);
        }
    }
    // The shared first layer and the output rows are folded into the Gram per wave of chunks
    // ([`fold_wave`]); their predictions here.
    if let (Some(sh), Some(TrainSide::Factor { v, .. })) = (&shared, train.first()) {
        // The prediction `⟨Σ_r w_r δ_r[c], V a_p⟩`.
        let mut va = vec![0.0; pc * sh.no];
        gemm_abt(&mut va, &sh.acts, v, pc, sh.no, sh.ne, 1.0, false);
        let pred = &mut preds[pred_of(0)];
        for q in 0..pc {
            for c in 0..k {
                pred[q * k + c] += dot(&sh.dbar[(q * k + c) * sh.no..(q * k + c + 1) * sh.no], &va[q * sh.no..(q + 1) * sh.no]);
            }
        }
    }
    if let Some(o) = &output {
        let TrainSide::Factor { v, .. } = &train[o.layer] else { unreachable!("an output layer is dense") };
        // The prediction `α(Ā·V[c] − Σ_o B̄[o]·V[o])`.
        let pred = &mut preds[pred_of(o.layer)];
        let (k1, ne) = (k + 1, o.ne);
        for q in 0..pc {
            let ab = &o.ab[q * k1 * ne..(q + 1) * k1 * ne];
            let bv: f64 = (0..k).map(|c| dot(&ab[(1 + c) * ne..(2 + c) * ne], &v[c * ne..(c + 1) * ne])).sum();
            for c in 0..k {
                pred[q * k + c] += o.alpha * (dot(&ab[..ne], &v[c * ne..(c + 1) * ne]) - bv);
            }
        }
    }
    let cosine = if input.cosine {
        // The DPK's test gradients (at w_s, kept from the nodes at t = 0 where the rule has
        // them) against the integrated ones.
        let g0 = at_zero.take().unwrap_or_else(|| step.grads(xc, offc, &(0..pc).collect::<Vec<_>>(), &vec![0.0; pc]));
        let integrated: Vec<cosine::Integrated<'_>> = (0..train.len())
            .map(|li| match (&shared, &output) {
                (Some(sh), _) if li == 0 => cosine::Integrated::Shared { acts: &sh.acts, dbar: &sh.dbar },
                (_, Some(o)) if o.layer == li => cosine::Integrated::Output { ab: &o.ab, alpha: o.alpha },
                _ if keep_rows[li] => {
                    let r = &cos_rows[li];
                    cosine::Integrated::Rows { point: &r.point, weight: &r.weight, acts: &r.acts, deltas: &r.deltas }
                }
                _ if folded[li] => cosine::Integrated::Formed(&cos_jbar[li]),
                _ => cosine::Integrated::Formed(&jbars[li]),
            })
            .collect();
        cosine::add(&g0, &integrated, pc, k)
    } else {
        (0.0, 0)
    };
    let mut formed = vec![Vec::new(); train.len()];
    for (li, (jbar, tr)) in jbars.into_iter().zip(train).enumerate() {
        match tr {
            TrainSide::Formed { v, .. } => {
                predict_formed(&mut preds[pred_of(li)], &jbar, v, 0, k);
                formed[li] = jbar;
            }
            TrainSide::Factor { acts: ta, dt, v, .. } if !jbar.is_empty() => {
                // In point blocks that bound the `[nb·K·out, M]` product to FOLD_BYTES.
                let (ne, no) = (ta.len() / m.max(1), v.len() / (ta.len() / m.max(1)).max(1));
                let out = &mut *outs[target(li)];
                let per_point = out.len() / pc.max(1);
                let nb = (FOLD_BYTES / (8 * k * no * m).max(1)).clamp(1, pc.max(1));
                for q0 in (0..pc).step_by(nb) {
                    let q1 = (q0 + nb).min(pc);
                    add_formed(&mut out[q0 * per_point..q1 * per_point], &jbar[q0 * k * no * ne..q1 * k * no * ne], ta, dt, q1 - q0, ne, &mut scratch);
                }
                flops += 2.0 * (pc * k * no * ne * m) as f64 + 2.0 * (pc * m * layout.per_pair(k) * no) as f64;
            }
            TrainSide::Factor { .. } => {}
        }
    }
    seconds += started.elapsed().as_secs_f64();
    let shared = shared.map(|sh| (sh.acts, sh.dbar));
    let output = output.map(|o| (o.layer, o.alpha, o.ab));
    ChunkOut { preds, diag, stats, seconds, flops, gradient_seconds, search_seconds, formed, cosine, shared, output }
}

/// `st` with its gradient evaluations on `device` when there is one.
fn on_device<'s>(device: &Option<std::sync::Arc<dyn crate::device::NodeBackend>>, st: StackStep<'s>) -> Result<StackStep<'s>> {
    match device {
        Some(dev) => st.on_device(&**dev),
        None => Ok(st),
    }
}

impl StepModel for StackModel<'_> {
    fn add_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<StepOutput> {
        let arch = self.arch;
        if input.train_integrated {
            return path::add_step(input, acc, diag, &StackStep::new(arch, input.state, input.next)?, self.per_layer);
        }
        let rows = input.rows;
        let (p, d, k) = (rows.len(), rows.dim, arch.outputs());
        let m = input.x_train.len() / d;
        let at_ws = on_device(&self.device, StackStep::new(arch, input.state, None)?)?;
        let all: Vec<usize> = (0..m).collect();
        let evaluated = std::time::Instant::now();
        let tgrads = at_ws.par_grads_in(input.x_train, input.off_train, &all, &vec![0.0; m], &mut |n| self.pool.take(n));
        let train_seconds = evaluated.elapsed().as_secs_f64();
        at_ws.device_result()?;
        let layout = acc.sink_mut().layout();
        let train = train_side(tgrads, input.a, input.colw, layout, m, k);
        if input.rows_are_columns && use_symmetric() {
            return Ok(self.symmetric_step(input, acc, diag, train, train_seconds, m, k));
        }
        let step = on_device(&self.device, StackStep::new(arch, input.state, input.next)?)?;
        // Numbers one node row's gradients hold, over all parameter layers.
        let row_numbers: usize = train
            .iter()
            .map(|tr| match tr {
                TrainSide::Factor { acts, deltas, .. } => (acts.len() + deltas.len()) / m.max(1),
                TrainSide::Formed { g, .. } => g.len() / m.max(1),
            })
            .sum();
        // One prediction per parameter layer with the decomposition, else one for all.
        let mut preds = vec![vec![0.0; p * k]; if self.per_layer { train.len() } else { 1 }];
        let mut stats = NodeStats {
            evaluations: Vec::with_capacity(p),
            jvp_evaluations: Vec::with_capacity(p),
            pieces: Vec::with_capacity(p),
            unconverged: 0,
        };
        // Point chunks run in parallel (every core), each into its own rows of the Gram (or of
        // each layer's Gram) and its own prediction and self-kernel buffers, merged in order.
        let chunk = chunk_points(p);
        let mut targets: Vec<&mut [f64]> = match acc.layer_sinks() {
            Some(ls) => ls.iter_mut().map(|s| s.rows_mut(0..p)).collect(),
            None => vec![acc.sink_mut().rows_mut(0..p)],
        };
        let point_len = targets.first().map_or(0, |t| t.len() / p.max(1));
        let nout = targets.len();
        let npred = preds.len();
        let formed_numbers: usize = train.iter().map(|tr| if let TrainSide::Formed { v, .. } = tr { k * v.len() } else { 0 }).sum();
        let wave = wave_points(chunk, formed_numbers);
        let (mut seconds, mut flops) = (0.0, 0.0);
        let mut chunk_out: Vec<ChunkOut> = Vec::with_capacity(p.div_ceil(chunk));
        for w0 in (0..p).step_by(wave) {
            let w1 = (w0 + wave).min(p);
            let starts: Vec<usize> = (w0..w1).step_by(chunk).collect();
            let mut per_target: Vec<std::vec::IntoIter<&mut [f64]>> = targets.iter_mut().map(|t| split_rows(&mut t[w0 * point_len..w1 * point_len], chunk * point_len, starts.len()).into_iter()).collect();
            let tasks: Vec<(usize, Vec<&mut [f64]>)> = starts.iter().map(|&c0| (c0, per_target.iter_mut().map(|it| it.next().expect("one slice per chunk")).collect())).collect();
            let mut outs: Vec<ChunkOut> = tasks
                .into_par_iter()
                .map(|(c0, mut outs)| {
                    let pc = chunk.min(w1 - c0);
                    let rows_of = ChunkRows { x: &rows.x[c0 * d..(c0 + pc) * d], off: input.off_rows.map(|o| &o[c0 * k..(c0 + pc) * k]), pc };
                    row_chunk(&step, input, &train, layout, &rows_of, &mut outs, (npred, row_numbers, m, k), self.reduce)
                })
                .collect();
            // The chunks' own contraction ran side by side: its thread-seconds over the threads
            // that ran them are its share of the wall (the GEMM rate it is compared with is
            // every core's).
            let lanes = rayon::current_num_threads().min(outs.len()).max(1);
            seconds += outs.iter().map(|o| o.seconds).sum::<f64>() / lanes as f64;
            // The wave's formed layers: one product per layer over all its points (faer's
            // parallel GEMM on every core), their J̄ in point order; the shared first layer and
            // the output rows in batches on every core.
            let started = std::time::Instant::now();
            {
                let mut wave_targets: Vec<&mut [f64]> = targets.iter_mut().map(|t| &mut t[w0 * point_len..w1 * point_len]).collect();
                flops += fold_wave(&mut outs, &train, &mut wave_targets, point_len, layout, &self.pool, m, k);
            }
            for (li, tr) in train.iter().enumerate() {
                let TrainSide::Formed { g: tg, v } = tr else { continue };
                let jbar: std::borrow::Cow<'_, [f64]> = match outs.as_mut_slice() {
                    [one] => std::mem::take(&mut one.formed[li]).into(),
                    many => many.iter_mut().flat_map(|o| std::mem::take(&mut o.formed[li])).collect::<Vec<f64>>().into(),
                };
                let out = &mut targets[if nout > 1 { li } else { 0 }][w0 * point_len..w1 * point_len];
                flops += gram_formed(layout, out, &jbar, tg, m, k, v.len());
            }
            seconds += started.elapsed().as_secs_f64();
            chunk_out.extend(outs);
        }
        step.device_result()?;
        let (mut gradient_seconds, mut search_seconds) = (train_seconds, 0.0);
        let (mut cos_sum, mut cos_count) = (0.0, 0);
        for (ci, co) in chunk_out.into_iter().enumerate() {
            cos_sum += co.cosine.0;
            cos_count += co.cosine.1;
            let c0 = ci * chunk;
            for (dst, src) in preds.iter_mut().zip(&co.preds) {
                dst[c0 * k..c0 * k + src.len()].iter_mut().zip(src).for_each(|(a, b)| *a += b);
            }
            if input.self_kernel {
                diag[c0 * k * k..c0 * k * k + co.diag.len()].iter_mut().zip(&co.diag).for_each(|(a, b)| *a += b);
            }
            stats.evaluations.extend_from_slice(&co.stats.evaluations);
            stats.jvp_evaluations.extend_from_slice(&co.stats.jvp_evaluations);
            stats.pieces.extend_from_slice(&co.stats.pieces);
            stats.unconverged += co.stats.unconverged;
            flops += co.flops;
            gradient_seconds += co.gradient_seconds;
            search_seconds += co.search_seconds;
        }
        acc.add_contraction(seconds, flops);
        acc.add_node_work(gradient_seconds, search_seconds);
        self.give_back(train);
        let (pred, layer_pred) = split_predictions(preds, self.per_layer);
        Ok(StepOutput {
            pred,
            stats,
            cosine: if cos_count > 0 { cos_sum / cos_count as f64 } else { f64::NAN },
            layer_pred,
        })
    }
}

impl StackModel<'_> {
    /// Hands the step's training-side buffers back to the pool for the next step.
    fn give_back(&self, train: Vec<TrainSide>) {
        for tr in train {
            match tr {
                TrainSide::Factor { acts, deltas, .. } => {
                    self.pool.give(acts);
                    self.pool.give(deltas);
                }
                TrainSide::Formed { g, .. } => self.pool.give(g),
            }
        }
    }

    /// [`StepModel::add_step`] where the rows are the training points at `t = 0`
    /// ([`StepInput::rows_are_columns`]): the Gram, prediction and self-kernel from the
    /// training side alone ([`symmetric`]).
    #[allow(clippy::too_many_arguments)]
    fn symmetric_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64], train: Vec<TrainSide>, train_seconds: f64, m: usize, k: usize) -> StepOutput {
        let layout = acc.sink_mut().layout();
        let started = std::time::Instant::now();
        let flops = {
            let mut targets: Vec<&mut [f64]> = match acc.layer_sinks() {
                Some(ls) => ls.iter_mut().map(|s| s.rows_mut(0..m)).collect(),
                None => vec![acc.sink_mut().rows_mut(0..m)],
            };
            symmetric::add_gram(&train, layout, &mut targets, m, k)
        };
        acc.add_contraction(started.elapsed().as_secs_f64(), flops);
        acc.add_node_work(train_seconds, 0.0);
        let mut preds = vec![vec![0.0; m * k]; if self.per_layer { train.len() } else { 1 }];
        symmetric::predict(&train, &mut preds, m, k);
        if input.self_kernel {
            symmetric::self_kernel(&train, diag, m, k);
        }
        self.give_back(train);
        let (pred, layer_pred) = split_predictions(preds, self.per_layer);
        // One gradient per point (the training side's), one piece.
        let stats = NodeStats { evaluations: vec![1; m], jvp_evaluations: vec![0; m], pieces: vec![1; m], unconverged: 0 };
        StepOutput { pred, stats, cosine: f64::NAN, layer_pred }
    }
}

/// Whether rows that are the columns take [`symmetric`] (the tests turn it off to compare with
/// the row engine).
fn use_symmetric() -> bool {
    #[cfg(test)]
    if SYMMETRIC_OFF_TEST.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    true
}

/// Set by a test: rows that are the columns take the row engine.
#[cfg(test)]
static SYMMETRIC_OFF_TEST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(test)]
pub(crate) mod tests;
