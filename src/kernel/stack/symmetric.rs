//! A step's Gram of the training points with themselves at `t = 0`: `--points train` with the
//! EPK's training side, the DPK and the NTK (the Gram a GP or function-space Laplace fits on).
//! There `K_s[i, j] = ⟨∇f(x_i; w_s), ∇f(x_j; w_s)⟩` is symmetric and the rows' gradients are
//! the training side's, so both come from the training side alone: no second evaluation of the
//! same gradients, and only the tiles on and below the diagonal are multiplied, each added to
//! its mirror — about half the products of the row engine ([`super::row_chunk`], which the
//! tests hold it equal to).
//!
//! Per parameter layer, as in the row engine: formed layers `⟨G_i, G_j⟩` (the layout's
//! blocks, [`add_dense`]); dense layers `(a_i·a_j)·⟨δ_i, δ_j⟩`.

use super::{dot, predict_formed, TrainSide};
use crate::kernel::layout::{add_dense, Layout};
use crate::linalg::gemm_abt;
use rayon::prelude::*;

/// Scratch bytes of one strip of tiles (one tile of rows against every tile up to its own).
const STRIP_BYTES: usize = 64 << 20;

/// Points per tile: an eighth of the points (the products then cost 9/16 of the full square),
/// fewer where a strip would pass [`STRIP_BYTES`], at least 16.
fn tile_points(m: usize, per_pair: usize) -> usize {
    #[cfg(test)]
    if let n @ 1.. = TILE_TEST.load(std::sync::atomic::Ordering::Relaxed) {
        return n;
    }
    let fit = STRIP_BYTES / (8 * m * per_pair).max(1);
    m.div_ceil(8).min(fit).max(16)
}

/// The tests' tile in points (0: by [`tile_points`]).
#[cfg(test)]
pub(super) static TILE_TEST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Adds one layer's products of the points `[i0, i1)` with `[j0, j1)` into the tile `t`
/// (`[ni·rows_per_point, nj·cols_per_train]`, the layout's blocks); returns the flops.
fn add_tile(layout: Layout, t: &mut [f64], tr: &TrainSide, (i0, i1): (usize, usize), (j0, j1): (usize, usize), m: usize, k: usize, scratch: &mut Vec<f64>) -> f64 {
    let (ni, nj) = (i1 - i0, j1 - j0);
    match tr {
        TrainSide::Formed { g, .. } => {
            let wd = g.len() / (m * k).max(1);
            add_dense(layout, t, &g[i0 * k * wd..i1 * k * wd], &g[j0 * k * wd..j1 * k * wd], ni, nj, k, wd, 1.0);
            2.0 * (ni * nj * layout.per_pair(k) * wd) as f64
        }
        TrainSide::Factor { acts, deltas, .. } => {
            let (ne, no) = (acts.len() / m.max(1), deltas.len() / (m * k).max(1));
            scratch.clear();
            scratch.resize(ni * nj + t.len(), 0.0);
            let (sa, sd) = scratch.split_at_mut(ni * nj);
            gemm_abt(sa, &acts[i0 * ne..i1 * ne], &acts[j0 * ne..j1 * ne], ni, nj, ne, 1.0, false);
            add_dense(layout, sd, &deltas[i0 * k * no..i1 * k * no], &deltas[j0 * k * no..j1 * k * no], ni, nj, k, no, 1.0);
            let (rpp, cols) = (layout.rows_per_point(k), layout.cols_per_train(k));
            let row_len = nj * cols;
            for (row, (tr, sr)) in t.chunks_exact_mut(row_len).zip(sd.chunks_exact(row_len)).enumerate() {
                let s = &sa[(row / rpp) * nj..(row / rpp + 1) * nj];
                for ((tc, sc), &sv) in tr.chunks_exact_mut(cols).zip(sr.chunks_exact(cols)).zip(s) {
                    tc.iter_mut().zip(sc).for_each(|(o, v)| *o += sv * v);
                }
            }
            2.0 * (ni * nj * ne) as f64 + 2.0 * (ni * nj * layout.per_pair(k) * no) as f64
        }
    }
}

/// Adds the tile `t` of the points `[i0, i1)` against `[j0, j1)` (the layout's blocks, as
/// [`add_tile`] fills it) transposed into `rows`: the Gram rows of the points `[j0, j1)`, at
/// the columns of `[i0, i1)`.
///
/// # Shapes
/// `rows` `[nj·rows_per_point, m·cols_per_train]`.
fn add_mirror(layout: Layout, rows: &mut [f64], t: &[f64], (i0, i1): (usize, usize), nj: usize, m: usize, k: usize) {
    let ni = i1 - i0;
    let row_len = m * layout.cols_per_train(k);
    match layout {
        // t[(p, c), i] → rows[(i, c), p]
        Layout::Diag => {
            for i in 0..nj {
                for c in 0..k {
                    let dst = &mut rows[(i * k + c) * row_len + i0..(i * k + c) * row_len + i1];
                    for (p, o) in dst.iter_mut().enumerate() {
                        *o += t[(p * k + c) * nj + i];
                    }
                }
            }
        }
        // t[(p, r), (i, c)] → rows[(i, c), (p, r)]
        Layout::Full => {
            for i in 0..nj {
                for c in 0..k {
                    let dst = &mut rows[(i * k + c) * row_len + i0 * k..(i * k + c) * row_len + i1 * k];
                    for p in 0..ni {
                        for r in 0..k {
                            dst[p * k + r] += t[(p * k + r) * nj * k + i * k + c];
                        }
                    }
                }
            }
        }
        // t[p, i] → rows[i, p]
        Layout::Trace => {
            for i in 0..nj {
                let dst = &mut rows[i * row_len + i0..i * row_len + i1];
                for (p, o) in dst.iter_mut().enumerate() {
                    *o += t[p * nj + i];
                }
            }
        }
    }
}

/// Adds the step's Gram of the `m` training points with themselves into `targets` (one per
/// parameter layer with the per-layer decomposition, else one for all layers: the Gram rows
/// of all `m` points in the layout); returns the flops. Tiles below the diagonal are computed
/// once and added twice (in place and mirrored); a strip of tiles at a time, its tiles in
/// parallel.
pub(super) fn add_gram(train: &[TrainSide], layout: Layout, targets: &mut [&mut [f64]], m: usize, k: usize) -> f64 {
    let (rpp, cols) = (layout.rows_per_point(k), layout.cols_per_train(k));
    let point_len = rpp * m * cols;
    let tile = tile_points(m, layout.per_pair(k));
    let tiles: Vec<(usize, usize)> = (0..m).step_by(tile.max(1)).map(|a| (a, (a + tile).min(m))).collect();
    let nout = targets.len();
    let mut flops = 0.0;
    for (ti, out) in targets.iter_mut().enumerate() {
        let layers: Vec<&TrainSide> = if nout > 1 { vec![&train[ti]] } else { train.iter().collect() };
        for (bi, &(i0, i1)) in tiles.iter().enumerate() {
            let ni = i1 - i0;
            // The strip's tiles (I, J) for J ≤ I, side by side.
            let strip: Vec<(Vec<f64>, f64)> = tiles[..=bi]
                .par_iter()
                .map(|&(j0, j1)| {
                    let mut t = vec![0.0; ni * rpp * (j1 - j0) * cols];
                    let mut scratch = Vec::new();
                    let f: f64 = layers.iter().map(|tr| add_tile(layout, &mut t, tr, (i0, i1), (j0, j1), m, k, &mut scratch)).sum();
                    (t, f)
                })
                .collect();
            flops += strip.iter().map(|s| s.1).sum::<f64>();
            let (above, rest) = out.split_at_mut(i0 * point_len);
            // The strip's own rows: each tile in place.
            rest[..ni * point_len].par_chunks_mut(m * cols).enumerate().for_each(|(row, dst)| {
                for (&(j0, j1), (t, _)) in tiles[..=bi].iter().zip(&strip) {
                    let w = (j1 - j0) * cols;
                    dst[j0 * cols..j1 * cols].iter_mut().zip(&t[row * w..(row + 1) * w]).for_each(|(o, v)| *o += v);
                }
            });
            // The rows of the tiles above: the strip's tiles mirrored (not the diagonal one).
            let mut chunks: Vec<&mut [f64]> = Vec::with_capacity(bi);
            let mut left = above;
            for &(j0, j1) in &tiles[..bi] {
                let (head, tail) = left.split_at_mut((j1 - j0) * point_len);
                debug_assert_eq!(j0 * point_len + head.len(), j1 * point_len);
                chunks.push(head);
                left = tail;
            }
            chunks.into_par_iter().zip(&tiles[..bi]).zip(&strip[..bi]).for_each(|((rows, &(j0, j1)), (t, _))| add_mirror(layout, rows, t, (i0, i1), j1 - j0, m, k));
        }
    }
    flops
}

/// Adds the step's prediction `⟨∇f(x_i)[c], v⟩` of each training point into `preds` (one
/// `[M, K]` per parameter layer with the decomposition, else one).
pub(super) fn predict(train: &[TrainSide], preds: &mut [Vec<f64>], m: usize, k: usize) {
    let npred = preds.len();
    for (li, tr) in train.iter().enumerate() {
        let pred = &mut preds[if npred > 1 { li } else { 0 }];
        match tr {
            TrainSide::Formed { g, v } => predict_formed(pred, g, v, 0, k),
            TrainSide::Factor { acts, deltas, v, .. } => {
                let ne = acts.len() / m.max(1);
                let no = v.len() / ne.max(1);
                let mut va = vec![0.0; m * no];
                gemm_abt(&mut va, acts, v, m, no, ne, 1.0, false);
                for i in 0..m {
                    for c in 0..k {
                        pred[i * k + c] += dot(&deltas[(i * k + c) * no..(i * k + c + 1) * no], &va[i * no..(i + 1) * no]);
                    }
                }
            }
        }
    }
}

/// Adds each training point's self-kernel `∇f(x_i) ∇f(x_i)ᵀ` (`[M, K, K]`) into `diag`.
pub(super) fn self_kernel(train: &[TrainSide], diag: &mut [f64], m: usize, k: usize) {
    diag.par_chunks_mut(k * k).enumerate().for_each(|(i, d)| {
        let mut dd = vec![0.0; k * k];
        for tr in train {
            match tr {
                TrainSide::Formed { g, .. } => {
                    let wd = g.len() / (m * k).max(1);
                    let gi = &g[i * k * wd..(i + 1) * k * wd];
                    gemm_abt(&mut dd, gi, gi, k, k, wd, 1.0, false);
                }
                TrainSide::Factor { acts, deltas, .. } => {
                    let (ne, no) = (acts.len() / m.max(1), deltas.len() / (m * k).max(1));
                    let ai = &acts[i * ne..(i + 1) * ne];
                    let di = &deltas[i * k * no..(i + 1) * k * no];
                    gemm_abt(&mut dd, di, di, k, k, no, dot(ai, ai), false);
                }
            }
            d.iter_mut().zip(&dd).for_each(|(a, b)| *a += b);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use crate::kernel::{self, KernelKind, Layout, Outputs, Request, Rows, Side};

    /// The Gram of the training points with themselves from the training side alone, lower
    /// tiles mirrored, equals the row engine's (every point's gradient evaluated again as a
    /// row, the whole square multiplied): Gram, machine, self-kernel, per-layer shares and
    /// evaluations, for the EPK's training side, the DPK and the NTK, in every layout, on the
    /// network's outputs and the logits, on convolutions with a formed layer norm and on a
    /// dense-only stack; with tiles of 5 points (a short last one) and the default tile.
    #[test]
    fn symmetric_gram_equals_the_row_engine() {
        // Flips the process-wide test switches: no other test's kernel runs meanwhile.
        let _switches = crate::kernel::test_switches::exclusive();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("mnist");
        std::fs::create_dir_all(&data).unwrap();
        super::super::tests::tiny_mnist(&data, 23, 4);
        let conv = format!(
            "[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 23\nn_test = 4\n\n[model]\nkind = \"layers\"\nzero_last = false\nlayers = [{{ conv2d = {{ channels = 2, kernel = 5, stride = 2 }} }}, \"relu\", {{ max_pool2d = 2 }}, \"flatten\", {{ layer_norm = {{}} }}, {{ dense = 6 }}, \"tanh\", {{ dense = 10 }}]\n\n[train]\nlr = 0.3\nsteps = 2\nseed = 4\n",
            data.to_str().unwrap()
        );
        let dense = "[data]\nkind = \"gaussian-mixture\"\ndim = 3\nper_class = 7\nn_test = 2\nseed = 2\n\n[model]\nkind = \"layers\"\nlayers = [{ dense = 9 }, \"relu\", { dense = 7 }, \"tanh\", { dense = 3 }]\n\n[train]\nlr = 0.7\nsteps = 3\nseed = 5\n";
        for (name, toml) in [("conv", conv.as_str()), ("dense", dense)] {
            let (run, states, _) = super::super::tests::trained(dir.path(), name, toml);
            let pts = Rows::Train.resolve(&run.dataset).unwrap();
            let kinds = [Request::new(KernelKind::Epk).side(Side::Train), Request::new(KernelKind::Dpk), Request::new(KernelKind::Ntk)];
            for (base, layout, outputs, per_layer) in kinds.into_iter().flat_map(|r| [Layout::Full, Layout::Diag, Layout::Trace].into_iter().flat_map(move |l| [(r.clone(), l, Outputs::Network, false), (r.clone(), l, Outputs::Logits, true)])) {
                let req = base.layout(layout).outputs(outputs).per_layer(per_layer);
                super::super::SYMMETRIC_OFF_TEST.store(true, Relaxed);
                let rows = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                super::super::SYMMETRIC_OFF_TEST.store(false, Relaxed);
                super::TILE_TEST.store(5, Relaxed);
                let fives = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                super::TILE_TEST.store(0, Relaxed);
                let default = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                let (rows, fives, default) = (rows.unwrap(), fives.unwrap(), default.unwrap());
                let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b).max(1e-300);
                for (tiles, other) in [("tiles of 5", &fives), ("default tiles", &default)] {
                    let what = format!("{name} {} {layout:?} {outputs:?} per_layer {per_layer}: {tiles}", req.kind);
                    assert!(rel(&other.gram, &rows.gram) <= 1e-13, "{what}: Gram {:e}", rel(&other.gram, &rows.gram));
                    assert!(rel(&other.machine, &rows.machine) <= 1e-13, "{what}: machine");
                    assert!(rel(other.diag.as_ref().unwrap(), rows.diag.as_ref().unwrap()) <= 1e-13, "{what}: self-kernel");
                    assert_eq!(other.records.iter().map(|r| r.mean_evaluations).collect::<Vec<_>>(), rows.records.iter().map(|r| r.mean_evaluations).collect::<Vec<_>>(), "{what}: evaluations");
                    if per_layer {
                        let (a, b) = (other.layers.as_ref().unwrap(), rows.layers.as_ref().unwrap());
                        assert_eq!(a.gram.len(), b.gram.len());
                        for (x, y) in a.gram.iter().zip(&b.gram) {
                            assert!(rel(x, y) <= 1e-13, "{what}: a layer's Gram {:e}", rel(x, y));
                        }
                        assert!(rel(&a.change, &b.change) <= 1e-13, "{what}: the layers' shares of the change");
                    }
                }
            }
        }
    }
}
