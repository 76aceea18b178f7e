//! Kernels under a memory budget: blocks of row points.
//!
//! Row points are independent (each has its own quadrature nodes, Gram rows, bias, network
//! value and machine), so a kernel over P rows is the concatenation of kernels over blocks of
//! rows. [`plan`] picks the largest block whose working memory, together with the complete
//! output, fits the budget ([`crate::kernel::Request::block_rows`] then runs the one entry per block);
//! it refuses (with an estimate) only when the output alone, plus one row's work, cannot fit.
//! `in_blocks` concatenates the blocks' outputs. Training points are not blocked: their per-step factors (`M·Σ_l(in + K·out)`
//! numbers) are part of the fixed cost of every block.

use crate::error::{Error, Result};
use crate::kernel::stack::closed::ClosedForm;
use crate::trajectory::Manifest;

use crate::kernel::layout::Layout;
use crate::kernel::request::Request;
use crate::kernel::types::{
    nan_max, output_bytes_in, ColumnShare, KernelKind, KernelOutput, LayerShares, Points,
    StepRecord,
};

/// Auto-rule nodes per row point assumed by the working-memory estimate (the paper toy uses
/// about 5 on average; a point with many kinks may use more, the estimate is not a bound).
const NODES_PER_ROW: u64 = 32;

/// Slack for small per-step buffers.
const SCRATCH_BYTES: u64 = 4 << 20;

/// How a kernel computation is split to fit a memory budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    /// Row points per block (the last block may be smaller).
    pub block_rows: usize,
    /// Number of blocks.
    pub blocks: usize,
    /// Bytes of the complete output (all arrays of [`KernelOutput`]).
    pub output_bytes: u64,
    /// Estimated working bytes independent of the block size (training factors, scratch).
    pub fixed_bytes: u64,
    /// Estimated working bytes per row point of a block.
    pub row_bytes: u64,
}

impl BlockPlan {
    /// Estimated peak bytes of the plan: output, fixed work and one block's rows.
    pub fn estimated_peak(&self) -> u64 {
        self.output_bytes + self.fixed_bytes + self.row_bytes * self.block_rows as u64
    }
}

/// Plans a computation of `p` rows against the run's `m` training points, in `req.layout`,
/// within `budget` bytes (see the module docs). With one block, no extra copy is made.
///
/// Errors: [`Error::OutOfMemoryBudget`] with the estimate when the output plus one row's work
/// does not fit.
pub fn plan(manifest: &Manifest, p: usize, m: usize, req: &Request, budget: u64) -> Result<BlockPlan> {
    plan_columns(manifest, p, m, m, req, budget)
}

/// [`plan`] for a Gram against `mc` of the run's `m` training points
/// ([`crate::kernel::Request::columns`]): the Gram, the training factors, `a` and the accumulator scale
/// with `mc`; the loss gradients of a step (`[M, K]`) and, for momentum/Adam, the replay's
/// training side with `m`. Runs that are not plain gradient steps add the recursion's working
/// memory (`H` and `J̄` per row point, the replay's per-step vectors and Adam's
/// preconditioners).
pub(crate) fn plan_columns(manifest: &Manifest, p: usize, mc: usize, m: usize, req: &Request, budget: u64) -> Result<BlockPlan> {
    let layout = req.layout;
    let arch = &manifest.architecture;
    let (k, n) = (arch.outputs() as u64, manifest.steps as u64);
    let (m64, p64) = (mc as u64, p as u64);
    let gram_row = m64 * layout.per_pair(k as usize) as u64 * 8;
    // The per-layer decomposition: a Gram and a change per step for each parameter layer.
    let n_layers = if req.per_layer {
        crate::model::param_layers(&arch.param_specs()).len() as u64
    } else {
        0
    };
    let out = output_bytes_in(layout, p, mc, k as usize, manifest.steps, req.per_step)
        + n_layers * (p64 * gram_row + n * p64 * k * 8);
    // Per-layer factor numbers kept per evaluated point: the stack's dense layers as factors
    // (input activations and δ's), the others formed (`kernel::stack`); a preset is its stack.
    let rule = crate::optim::UpdateRule::of(&manifest.optimizer);
    let factors = arch.as_stack()?.stack()?.gradient_floats(k as usize);
    // The dense closed form (`kernel::stack::closed::dense_relu`) contracts through the Gram
    // accumulator, whose scratch per point of its row blocks holds at most `cap` points
    // ([`crate::kernel::gram::BLOCK_BYTES`], at least 16 points), and whose layer 0's step
    // buffers take at most another Gram (`gram::Layer0Sum`).
    let dense_closed = match ClosedForm::of(arch, req, rule.is_plain()) {
        Some(ClosedForm::DenseRelu(s)) => Some(s),
        _ => None,
    };
    let (per_point, cap) = match &dense_closed {
        Some(s) => {
            let pp = crate::kernel::gram::scratch_bytes_per_point(&[s.d, s.h, s.k], mc, k as usize) as u64;
            (pp, (crate::kernel::gram::BLOCK_BYTES as u64 / pp.max(1)).max(16))
        }
        None => (0, 1),
    };
    // Fixed per block: the training factors of a step and the accumulator's copies of them,
    // each block's own a_{i,s} and loss gradients ([N, M_c, K] each), and one step's outputs
    // and loss gradients of all M training points ([M, K] each, with the zero_output offsets).
    let mut fixed = 2 * m64 * factors * 8 + SCRATCH_BYTES + 2 * n * m64 * k * 8 + 3 * m as u64 * k * 8;
    // Per row: its Gram rows in the block (and per-step rows), the accumulator's scratch, the
    // layer-0 scale, its nodes' factors, its network values at every state, and a column
    // block's per-step predicted and actual changes.
    let steps_kept = if req.per_step { crate::kernel::engine::prepare::steps_kept(manifest, req) as u64 } else { 0 };
    let shares = if mc < m { 2 * n * k * 8 } else { 0 };
    let l0_buffer = if dense_closed.is_some() { gram_row } else { 0 };
    // Rows at t = 0 (not integrated) have one node each.
    let nodes_per_row = if req.integrates_rows() { NODES_PER_ROW } else { 1 };
    let mut row = gram_row * (1 + steps_kept + n_layers)
        + l0_buffer
        + per_point
        + m64 * 8
        + nodes_per_row * factors * 8
        + (n + 1) * k * 8
        + 4 * k * 8
        + k * k * 8
        + shares;
    if !rule.is_plain() {
        let (lo, hi) = req.steps.unwrap_or((0, manifest.steps));
        let work = crate::kernel::engine::stateful::work_bytes(manifest, &rule, hi.saturating_sub(lo), mc, m, layout, req.kind == KernelKind::Ntk);
        fixed += work.fixed;
        row += work.per_row;
    }
    let one_row = out + fixed + row;
    if one_row > budget {
        return Err(Error::OutOfMemoryBudget {
            what: format!(
                "the {} Gram [{}]{}{} (output {} bytes, one row point's work {} bytes on top)",
                req.kind,
                layout.shape(p, mc, k as usize).iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
                if layout == Layout::Full { String::new() } else { format!(" ({layout} blocks)") },
                if req.per_step { " with per-step Grams" } else { "" },
                out,
                fixed + row
            ),
            needed_bytes: one_row,
            budget_bytes: budget,
            hint: "use fewer points (--points), drop --per-step, or raise --memory".into(),
        });
    }
    let mut fit = (budget - out - fixed) / row;
    if fit > cap {
        // Blocks above `cap` points add no accumulator scratch.
        fit = (budget - out - fixed - cap * per_point) / (row - per_point);
    }
    let fit = fit.min(p64).max(1) as usize;
    let blocks = p.div_ceil(fit);
    // Even blocks: the same number of blocks, the smallest block size that gives it.
    let block_rows = p.div_ceil(blocks);
    // The accumulator's scratch is that of min(block, cap) points.
    if block_rows as u64 > cap {
        fixed += cap * per_point;
        row -= per_point;
    }
    Ok(BlockPlan { block_rows, blocks, output_bytes: out, fixed_bytes: fixed, row_bytes: row })
}

/// Computes one block of row points with a progress callback (see [`in_blocks`]).
pub(crate) type BlockFn<'a> = dyn FnMut(&Points, &dyn Fn(usize, usize)) -> Result<KernelOutput> + 'a;

/// Any kernel computation over blocks of `block_rows` row points, concatenated:
/// `compute_block(points, progress)` computes one block (the one entry with one request, or
/// the tiles' outputs read back from disk); all blocks must use the same request. One block
/// (`block_rows >= P`) is a single call on `rows`. Records are combined: maxima of maxima,
/// means weighted by block size.
///
/// # Panics
/// If `block_rows == 0`.
pub(crate) fn in_blocks(
    rows: &Points,
    block_rows: usize,
    progress: &dyn Fn(usize, usize),
    compute_block: &mut BlockFn<'_>,
) -> Result<KernelOutput> {
    assert!(block_rows > 0, "block_rows must be >= 1");
    let p = rows.len();
    let d = rows.dim;
    if block_rows >= p {
        return compute_block(rows, progress);
    }
    let start = std::time::Instant::now();
    let blocks = p.div_ceil(block_rows);
    let mut acc: Option<Assembly> = None;
    for b in 0..blocks {
        let (lo, hi) = (b * block_rows, ((b + 1) * block_rows).min(p));
        let pts = Points { x: rows.x[lo * d..hi * d].to_vec(), dim: d };
        let o = compute_block(&pts, &|done, total| progress(b * total + done, blocks * total))?;
        match acc.as_mut() {
            None => acc = Some(Assembly::new(o, p, lo)),
            Some(a) => a.add(o, lo)?,
        }
    }
    let mut out = acc.expect("at least one block").finish();
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// The output being assembled from blocks.
struct Assembly {
    out: KernelOutput,
    /// Row points covered so far, per step record (for weighted means).
    rows_seen: usize,
}

impl Assembly {
    /// Starts from the first block (rows `lo..lo + o.p`, `lo = 0`), sized for `p` rows.
    fn new(first: KernelOutput, p: usize, lo: usize) -> Self {
        debug_assert_eq!(lo, 0);
        let (m, k, nb) = (first.m, first.k, first.p);
        let row = m * first.layout.per_pair(k);
        let mut gram = vec![0.0; p * row];
        gram[..nb * row].copy_from_slice(&first.gram);
        let per_step = first.per_step.as_ref().map(|ps| {
            let s = ps.len() / (nb * row);
            let mut v = vec![0.0; s * p * row];
            for si in 0..s {
                v[si * p * row..si * p * row + nb * row].copy_from_slice(&ps[si * nb * row..(si + 1) * nb * row]);
            }
            v
        });
        let grow = |v: &[f64], w: usize| {
            let mut out = vec![0.0; p * w];
            out[..v.len()].copy_from_slice(v);
            out
        };
        let columns = first.columns.as_ref().map(|c| ColumnShare {
            step_pred: c.step_pred.as_deref().map(|v| grow_steps(v, nb, p, k)),
            step_actual: c.step_actual.as_deref().map(|v| grow_steps(v, nb, p, k)),
            ..c.clone()
        });
        let layers = first.layers.as_ref().map(|l| LayerShares {
            names: l.names.clone(),
            gram: l.gram.iter().map(|g| grow(g, row)).collect(),
            change: grow_steps(&l.change, nb, p, k),
        });
        let out = KernelOutput {
            columns,
            layers,
            gram,
            per_step,
            diag: first.diag.as_deref().map(|v| grow(v, k * k)),
            bias: grow(&first.bias, k),
            network: grow(&first.network, k),
            machine: grow(&first.machine, k),
            single_machine: first.single_machine.as_deref().map(|v| grow(v, k)),
            reg: first.reg.as_deref().map(|v| grow(v, k)),
            rounding: first.rounding.as_deref().map(|v| grow(v, k)),
            carried: first.carried.as_deref().map(|v| grow(v, k)),
            p,
            ..first
        };
        Assembly { out, rows_seen: nb }
    }

    fn add(&mut self, o: KernelOutput, lo: usize) -> Result<()> {
        let a = &mut self.out;
        let (m, k, nb, p) = (a.m, a.k, o.p, a.p);
        if o.m != m || o.k != k || o.layout != a.layout || o.records.len() != a.records.len() || o.columns.as_ref().map(|c| c.range) != a.columns.as_ref().map(|c| c.range) {
            return Err(Error::Numerical("kernel blocks disagree in shape".into()));
        }
        if let (Some(dst), Some(src)) = (a.columns.as_mut(), o.columns.as_ref()) {
            for (d, s) in [(dst.step_pred.as_mut(), src.step_pred.as_ref()), (dst.step_actual.as_mut(), src.step_actual.as_ref())] {
                if let (Some(d), Some(s)) = (d, s) {
                    put_steps(d, s, lo, nb, p, k);
                }
            }
        }
        let row = m * a.layout.per_pair(k);
        a.gram[lo * row..(lo + nb) * row].copy_from_slice(&o.gram);
        if let (Some(dst), Some(src)) = (a.layers.as_mut(), o.layers.as_ref()) {
            for (d, s) in dst.gram.iter_mut().zip(&src.gram) {
                d[lo * row..(lo + nb) * row].copy_from_slice(s);
            }
            // `[S, L, nb, K]` as `[S·L, nb, K]`.
            put_steps(&mut dst.change, &src.change, lo, nb, p, k);
        }
        if let (Some(dst), Some(src)) = (a.per_step.as_mut(), o.per_step.as_ref()) {
            let s = src.len() / (nb * row);
            for si in 0..s {
                dst[(si * p + lo) * row..(si * p + lo + nb) * row].copy_from_slice(&src[si * nb * row..(si + 1) * nb * row]);
            }
        }
        let put = |dst: &mut [f64], src: &[f64], w: usize| dst[lo * w..(lo + nb) * w].copy_from_slice(src);
        if let (Some(dst), Some(src)) = (a.diag.as_mut(), o.diag.as_ref()) {
            put(dst, src, k * k);
        }
        put(&mut a.bias, &o.bias, k);
        put(&mut a.network, &o.network, k);
        put(&mut a.machine, &o.machine, k);
        if let (Some(dst), Some(src)) = (a.single_machine.as_mut(), o.single_machine.as_ref()) {
            put(dst, src, k);
        }
        // The non-data terms are per row point; the replay residual is a max over steps (the
        // same for every block, taken as the max to stay loud).
        for (dst, src) in [(a.reg.as_mut(), o.reg.as_ref()), (a.rounding.as_mut(), o.rounding.as_ref()), (a.carried.as_mut(), o.carried.as_ref())] {
            if let (Some(d), Some(s)) = (dst, src) {
                put(d, s, k);
            }
        }
        if let (Some(r), Some(q)) = (a.decomposition_residual.as_mut(), o.decomposition_residual) {
            *r = nan_max(*r, q);
        }
        a.contraction.add(&o.contraction);
        let (w0, w1) = (self.rows_seen as f64, nb as f64);
        for (r, s) in a.records.iter_mut().zip(&o.records) {
            combine(r, s, w0, w1);
        }
        self.rows_seen += nb;
        Ok(())
    }

    fn finish(self) -> KernelOutput {
        self.out
    }
}

/// `[S, nb, K]` rows `0..nb` of a `[S, P, K]` array, the rest zero.
fn grow_steps(v: &[f64], nb: usize, p: usize, k: usize) -> Vec<f64> {
    let s = v.len() / (nb * k).max(1);
    let mut out = vec![0.0; s * p * k];
    put_steps(&mut out, v, 0, nb, p, k);
    out
}

/// Writes `[S, nb, K]` into rows `lo..lo + nb` of a `[S, P, K]` array.
fn put_steps(dst: &mut [f64], src: &[f64], lo: usize, nb: usize, p: usize, k: usize) {
    for (si, chunk) in src.chunks_exact(nb * k).enumerate() {
        dst[(si * p + lo) * k..(si * p + lo + nb) * k].copy_from_slice(chunk);
    }
}

/// Combines the records of two disjoint row sets of sizes `w0` and `w1`.
fn combine(r: &mut StepRecord, s: &StepRecord, w0: f64, w1: f64) {
    let mean = |a: f64, b: f64| (a * w0 + b * w1) / (w0 + w1);
    r.max_abs_error = nan_max(r.max_abs_error, s.max_abs_error);
    r.mean_abs_error = mean(r.mean_abs_error, s.mean_abs_error);
    r.max_abs_change = nan_max(r.max_abs_change, s.max_abs_change);
    r.mean_evaluations = mean(r.mean_evaluations, s.mean_evaluations);
    r.max_evaluations = r.max_evaluations.max(s.max_evaluations);
    r.mean_jvp_evaluations = mean(r.mean_jvp_evaluations, s.mean_jvp_evaluations);
    r.mean_pieces = mean(r.mean_pieces, s.mean_pieces);
    r.unconverged_pieces += s.unconverged_pieces;
    r.dpk_cosine_error = mean(r.dpk_cosine_error, s.dpk_cosine_error);
}
