//! A dense layer's routes into the Gram (`δ[k] ⊗ [a, 1]` factors of its node rows against the
//! training points'): folded node by node in column tiles ([`fold_dense`]), summed into each
//! point's `J̄` and contracted once ([`dense_formed`], [`sum_dense_jbar`]), the first layer's
//! rows summed per point when its input does not depend on t ([`SharedInput`]), the output
//! layer as `K + 1` rows per point ([`OutputRows`]), and the last two folded per wave of chunks
//! ([`fold_wave`]).

use super::step::StackStep;
#[cfg(test)]
use super::DENSE_ROUTE_TEST;
use super::{dot, node_bytes, BufferPool, ChunkOut, TrainSide};
use crate::kernel::layout::{add_dense, add_output_layer, Layout};
use crate::linalg::{gemm, gemm_abt};
use rayon::prelude::*;

/// Scratch bytes for one batch of node rows' dense-layer products.
pub(super) const FOLD_BYTES: usize = 16 << 20;

/// Whether a dense layer (`no` outputs, `ne` inputs with the bias column) of a chunk of `pc`
/// row points with `nodes` node rows in all is contracted formed (its `J̄_p` summed over each
/// point's nodes, then one product against the training factors) rather than folded node by
/// node ([`fold_dense`]): whichever takes fewer flops, while the chunk's `J̄` fits in 8 node
/// blocks (128 MiB). With `ne = 0` (unknown) it says no.
pub(super) fn dense_formed(layout: Layout, nodes: usize, pc: usize, m: usize, k: usize, no: usize, ne: usize) -> bool {
    if ne == 0 {
        return false;
    }
    #[cfg(test)]
    match DENSE_ROUTE_TEST.load(std::sync::atomic::Ordering::Relaxed) {
        1 | 3 => return false,
        2 => return true,
        _ => {}
    }
    let pair = match layout {
        Layout::Full => k * k * no,
        Layout::Diag | Layout::Trace => k * no,
    };
    // The chunk's `J̄` is held at once: at most 8 node blocks of it.
    if std::mem::size_of::<f64>() * pc * k * no * ne > 8 * node_bytes() {
        return false;
    }
    let fold = nodes as f64 * 2.0 * m as f64 * (ne + pair) as f64;
    let formed = nodes as f64 * 2.0 * (k * no * ne) as f64 + pc as f64 * 2.0 * m as f64 * (k * no * ne + pair) as f64;
    formed < fold
}

/// Adds a block of a dense layer's node rows into the points' `J̄` (`[pc, K·out, ne]`):
/// `J̄_q += Σ_{r of q} w_r δ_rᵀ a_r`, one GEMM per point of the block; returns the flops.
///
/// # Shapes
/// `acts` `[R, ne]`, `deltas` `[R, K·out]` (`kno` = K·out).
#[allow(clippy::too_many_arguments)]
pub(super) fn sum_dense_jbar(jbar: &mut [f64], point: &[usize], weight: &[f64], acts: &[f64], deltas: &[f64], ne: usize, kno: usize, scratch: &mut Vec<f64>) -> f64 {
    let mut order: Vec<usize> = (0..point.len()).collect();
    order.sort_by_key(|&r| point[r]);
    let mut flops = 0.0;
    let mut i = 0;
    while i < order.len() {
        let q = point[order[i]];
        let j = order[i..].iter().position(|&r| point[r] != q).map_or(order.len(), |n| i + n);
        let rows = &order[i..j];
        let n = rows.len();
        scratch.clear();
        scratch.resize(n * (ne + kno), 0.0);
        let (wa, dq) = scratch.split_at_mut(n * ne);
        for (x, &r) in rows.iter().enumerate() {
            wa[x * ne..(x + 1) * ne].iter_mut().zip(&acts[r * ne..(r + 1) * ne]).for_each(|(a, b)| *a = weight[r] * b);
            dq[x * kno..(x + 1) * kno].copy_from_slice(&deltas[r * kno..(r + 1) * kno]);
        }
        gemm(&mut jbar[q * kno * ne..(q + 1) * kno * ne], dq, true, wa, false, (kno, ne, n), 1.0, true);
        flops += 2.0 * (kno * ne * n) as f64;
        i = j;
    }
    flops
}

/// Training points per column tile of [`fold_dense`].
const FOLD_COLUMNS: usize = 512;

/// Node rows a dense layer buffers across blocks before [`fold_dense`] (its products want many
/// rows: with a block's ~75 LeNet-5 rows, packing the training side for every product cost as
/// much as the multiply-adds).
pub(super) const FOLD_ROWS: usize = 512;

/// Adds one dense layer's node rows into the chunk's Gram rows `out` (`point` indexes them):
/// `out[p(r), ·, i, ·] += w_r (a_r·a_i) ⟨δ_r, δ_i⟩_layout`, a tile of training points
/// ([`FOLD_COLUMNS`]) and a batch of rows at a time, its products within [`FOLD_BYTES`].
#[allow(clippy::too_many_arguments)]
pub(super) fn fold_dense(layout: Layout, out: &mut [f64], point: &[usize], weight: &[f64], acts: &[f64], deltas: &[f64], tacts: &[f64], tdeltas: &[f64], ne: usize, no: usize, m: usize, k: usize) -> f64 {
    let ti = m.min(FOLD_COLUMNS);
    let batch = (FOLD_BYTES / (8 * ti * (layout.per_pair(k) + 1)).max(1)).max(1);
    fold_dense_tiled(layout, out, point, weight, (acts, deltas), (tacts, tdeltas), (ne, no, m, k), ti, batch)
}

/// [`fold_dense`] in column tiles of `ti` training points and batches of `batch` rows.
#[allow(clippy::too_many_arguments)]
pub(super) fn fold_dense_tiled(layout: Layout, out: &mut [f64], point: &[usize], weight: &[f64], (acts, deltas): (&[f64], &[f64]), (tacts, tdeltas): (&[f64], &[f64]), (ne, no, m, k): (usize, usize, usize, usize), ti: usize, batch: usize) -> f64 {
    let (rpp, cols) = (layout.rows_per_point(k), layout.cols_per_train(k));
    let row_len = m * cols;
    let mut flops = 0.0;
    let mut sa = Vec::new();
    let mut sd = Vec::new();
    for r0 in (0..point.len()).step_by(batch) {
        let rb = batch.min(point.len() - r0);
        let (ra, rd) = (&acts[r0 * ne..(r0 + rb) * ne], &deltas[r0 * k * no..(r0 + rb) * k * no]);
        for i0 in (0..m).step_by(ti.max(1)) {
            let nt = ti.min(m - i0);
            sa.clear();
            sa.resize(rb * nt, 0.0);
            gemm_abt(&mut sa, ra, &tacts[i0 * ne..(i0 + nt) * ne], rb, nt, ne, 1.0, false);
            let tile_row = nt * cols;
            sd.clear();
            sd.resize(rb * rpp * tile_row, 0.0);
            add_dense(layout, &mut sd, rd, &tdeltas[i0 * k * no..(i0 + nt) * k * no], rb, nt, k, no, 1.0);
            flops += 2.0 * (rb * nt * ne) as f64 + 2.0 * (rb * rpp * tile_row * no) as f64;
            for r in 0..rb {
                let (p, w) = (point[r0 + r], weight[r0 + r]);
                let s = &sa[r * nt..(r + 1) * nt];
                for j in 0..rpp {
                    let dst = &mut out[(p * rpp + j) * row_len + i0 * cols..(p * rpp + j) * row_len + (i0 + nt) * cols];
                    let src = &sd[(r * rpp + j) * tile_row..(r * rpp + j + 1) * tile_row];
                    for ((dc, sc), &sv) in dst.chunks_exact_mut(cols).zip(src.chunks_exact(cols)).zip(s) {
                        let c = w * sv;
                        dc.iter_mut().zip(sc).for_each(|(o, v)| *o += c * v);
                    }
                }
            }
        }
    }
    flops
}

/// A dense layer's node rows held for [`fold_dense`] across blocks ([`FOLD_ROWS`]).
#[derive(Default)]
pub(super) struct PendingRows {
    pub(super) point: Vec<usize>,
    pub(super) weight: Vec<f64>,
    pub(super) acts: Vec<f64>,
    pub(super) deltas: Vec<f64>,
}

impl PendingRows {
    pub(super) fn clear(&mut self) {
        self.point.clear();
        self.weight.clear();
        self.acts.clear();
        self.deltas.clear();
    }
}

/// The self-kernel of a block of a dense layer's node rows, node by node:
/// `diag[p(r)] += w_r |a_r|² δ_r δ_rᵀ` (`[K, K]` per point).
#[allow(clippy::too_many_arguments)]
pub(super) fn add_dense_self_kernel(diag: &mut [f64], dd: &mut [f64], point: &[usize], weight: &[f64], acts: &[f64], deltas: &[f64], ne: usize, no: usize, k: usize) {
    for (r, (&q, &w)) in point.iter().zip(weight).enumerate() {
        let (ar, dr) = (&acts[r * ne..(r + 1) * ne], &deltas[r * k * no..(r + 1) * k * no]);
        gemm_abt(dd, dr, dr, k, k, no, w * dot(ar, ar), false);
        diag[q * k * k..(q + 1) * k * k].iter_mut().zip(dd.iter()).for_each(|(a, b)| *a += b);
    }
}

/// A dense first parameter layer of a chunk of row points: nothing with parameters runs ahead of
/// it, so its input does not depend on t and a point's node rows share it (`a_p`), and its
/// contribution folds once per point from the weighted sum of the nodes' sensitivities:
/// `Σ_r w_r (a_p·a_i + 1)⟨δ_r, δ_i⟩ = (a_p·a_i + 1)⟨Σ_r w_r δ_r, δ_i⟩` (one fold per point
/// instead of one per node: on an MNIST MLP the first layer's fold, `M·(785 + K·128)` per
/// row, is most of a node's work).
pub(super) struct SharedInput {
    /// `a_p` with the bias column `[pc, ne]`.
    pub(super) acts: Vec<f64>,
    /// `Σ_r w_r δ_r` `[pc, K, out]`.
    pub(super) dbar: Vec<f64>,
    pub(super) ne: usize,
    pub(super) no: usize,
    /// `K·out`.
    pub(super) kno: usize,
}

impl SharedInput {
    /// For a stack whose first parameter layer is dense on a flat input (`None` otherwise, and
    /// under the tests' forced routes).
    pub(super) fn new(train: &[TrainSide], pc: usize, m: usize, k: usize) -> Option<SharedInput> {
        #[cfg(test)]
        if DENSE_ROUTE_TEST.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            return None;
        }
        let TrainSide::Factor { acts, deltas, .. } = train.first()? else { return None };
        let (ne, no) = (acts.len() / m.max(1), deltas.len() / (m * k).max(1));
        Some(SharedInput { acts: vec![0.0; pc * ne], dbar: vec![0.0; pc * k * no], ne, no, kno: k * no })
    }

    /// Adds a block of node rows (`point` indexes the chunk's points, `weight` their weights).
    ///
    /// # Shapes
    /// `acts` `[R, ne]`, `deltas` `[R, K, out]`.
    pub(super) fn add(&mut self, point: &[usize], weight: &[f64], acts: &[f64], deltas: &[f64]) {
        let (ne, kno) = (self.ne, self.kno);
        for (r, (&q, &w)) in point.iter().zip(weight).enumerate() {
            let a = &acts[r * ne..(r + 1) * ne];
            let held = &mut self.acts[q * ne..(q + 1) * ne];
            // Every node row of a point carries the same input: held once.
            debug_assert!(held.iter().all(|&v| v == 0.0) || held == a, "the first layer's input depends on t");
            held.copy_from_slice(a);
            self.dbar[q * kno..(q + 1) * kno].iter_mut().zip(&deltas[r * kno..(r + 1) * kno]).for_each(|(s, d)| *s += w * d);
        }
    }
}

/// The stack's last layer when it is dense on a flat input: its sensitivities are the output
/// map's seeds, `δ_r[k, o] = α(δ_ko − q_{r,o})` (log-softmax: `q` the softmax; identity: 0), so
/// a point's node rows sum to `K + 1` distinct rows, `Ā = Σ_r w_r [a_r, 1]` and
/// `B̄[o] = Σ_r w_r q_{r,o} [a_r, 1]`, contracted once per point
/// ([`crate::kernel::layout::add_output_layer`], as the MLP preset's output layer) instead of
/// folded node by node.
pub(super) struct OutputRows {
    /// The layer's index among the parameter layers.
    pub(super) layer: usize,
    /// `[pc, K + 1, ne]`.
    pub(super) ab: Vec<f64>,
    pub(super) ne: usize,
    pub(super) k: usize,
    pub(super) alpha: f64,
    pub(super) softmax: bool,
}

impl OutputRows {
    pub(super) fn new(step: &StackStep<'_>, train: &[TrainSide], pc: usize, m: usize, k: usize) -> Option<OutputRows> {
        #[cfg(test)]
        if DENSE_ROUTE_TEST.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            return None;
        }
        let arch = step.arch;
        let last = step.stack.nodes.last()?;
        let dense_last = matches!(&last.layer, crate::model::layers::AnyLayer::Dense(d) if d.positions == 1);
        let map_ok = matches!(arch.output, crate::model::OutputKind::LogSoftmax | crate::model::OutputKind::Identity);
        if !dense_last || !map_ok || arch.alpha == 0.0 || k < 2 {
            return None;
        }
        let layer = train.len().checked_sub(1)?;
        let TrainSide::Factor { acts, deltas, .. } = &train[layer] else { return None };
        let (ne, no) = (acts.len() / m.max(1), deltas.len() / (m * k).max(1));
        (no == k).then(|| OutputRows { layer, ab: vec![0.0; pc * (k + 1) * ne], ne, k, alpha: arch.alpha, softmax: arch.output == crate::model::OutputKind::LogSoftmax })
    }

    /// Adds a block of node rows: `q_{r,o} = −δ_r[(o + 1) mod K, o]/α`.
    ///
    /// # Shapes
    /// `acts` `[R, ne]`, `deltas` `[R, K, K]`.
    pub(super) fn add(&mut self, point: &[usize], weight: &[f64], acts: &[f64], deltas: &[f64]) {
        let (ne, k) = (self.ne, self.k);
        for (r, (&q, &w)) in point.iter().zip(weight).enumerate() {
            let a = &acts[r * ne..(r + 1) * ne];
            let ab = &mut self.ab[q * (k + 1) * ne..(q + 1) * (k + 1) * ne];
            ab[..ne].iter_mut().zip(a).for_each(|(s, v)| *s += w * v);
            if self.softmax {
                let d = &deltas[r * k * k..(r + 1) * k * k];
                for o in 0..k {
                    let c = -w * d[((o + 1) % k) * k + o] / self.alpha;
                    ab[(1 + o) * ne..(2 + o) * ne].iter_mut().zip(a).for_each(|(s, v)| *s += c * v);
                }
            }
        }
    }
}

/// Row points per task of [`fold_wave`]: two heights of faer's f64 microkernel, and products
/// whose scratch stays in malloc's reused memory (`[96·(K+1), M]` for the output rows).
const WAVE_FOLD_POINTS: usize = 96;

/// The shared first layer's and the output rows' contraction for a wave of chunks (`outs`, in
/// point order) into the wave's Gram rows (`targets`, one per target, each `[wave points, ·]`):
/// one fold over the wave's points, [`WAVE_FOLD_POINTS`] at a time on every core. Per chunk
/// (≤ 32 points) the products' row side was thin: on the MNIST MLP the training side's packing
/// was a sixth of the DPK's time. The wave's rows are gathered into buffers of `pool`. Returns
/// the flops.
#[allow(clippy::too_many_arguments)]
pub(super) fn fold_wave(outs: &mut [ChunkOut], train: &[TrainSide], targets: &mut [&mut [f64]], point_len: usize, layout: Layout, pool: &BufferPool, m: usize, k: usize) -> f64 {
    let n: usize = outs.iter().map(|o| o.preds.first().map_or(0, |p| p.len() / k)).sum();
    if n == 0 {
        return 0.0;
    }
    let batch = WAVE_FOLD_POINTS;
    let nout = targets.len();
    let mut flops = 0.0;
    if let (true, Some(TrainSide::Factor { acts: ta, deltas: td, .. })) = (outs.iter().all(|o| o.shared.is_some()), train.first()) {
        let (ne, no) = (ta.len() / m.max(1), td.len() / (m * k).max(1));
        let (mut acts, mut dbar) = (pool.take(n * ne), pool.take(n * k * no));
        for o in outs.iter_mut() {
            let (a, d) = o.shared.take().expect("checked above");
            acts.extend_from_slice(&a);
            dbar.extend_from_slice(&d);
        }
        let ones = vec![1.0; batch];
        let points: Vec<usize> = (0..batch).collect();
        flops += targets[0]
            .par_chunks_mut(batch * point_len)
            .enumerate()
            .map(|(b, out)| {
                let (q0, nb) = (b * batch, out.len() / point_len);
                fold_dense(layout, out, &points[..nb], &ones[..nb], &acts[q0 * ne..(q0 + nb) * ne], &dbar[q0 * k * no..(q0 + nb) * k * no], ta, td, ne, no, m, k)
            })
            .sum::<f64>();
        pool.give(acts);
        pool.give(dbar);
    }
    if let (true, Some(&(layer, alpha, _))) = (outs.iter().all(|o| o.output.is_some()), outs.first().and_then(|o| o.output.as_ref())) {
        let TrainSide::Factor { acts: ta, dt, .. } = &train[layer] else { unreachable!("an output layer is dense") };
        let ne = ta.len() / m.max(1);
        let k1 = k + 1;
        let mut ab = pool.take(n * k1 * ne);
        for o in outs.iter_mut() {
            ab.extend_from_slice(&o.output.take().expect("checked above").2);
        }
        targets[if nout > 1 { layer } else { 0 }].par_chunks_mut(batch * point_len).enumerate().for_each(|(b, out)| {
            let (q0, nb) = (b * batch, out.len() / point_len);
            let mut t = pool.take(nb * k1 * m);
            add_output_layer(out, &ab[q0 * k1 * ne..(q0 + nb) * k1 * ne], ta, dt, nb, ne, alpha, &mut t);
            pool.give(t);
        });
        pool.give(ab);
        flops += 2.0 * (n * k1 * ne * m) as f64 + 2.0 * (n * m * layout.per_pair(k) * k1) as f64;
    }
    flops
}
