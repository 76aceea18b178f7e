//! Merging a plan's tiles into one kernel directory, and reading a tiled Gram a block at a time.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::kernel::{self, KernelOutput, Layout};

use super::format::{read_header, read_tile, tile_path, Tile, TileProblem};
use super::plan::{Plan, TileEntry};

/// Where `tile merge` writes: `OUT/merged/`.
pub(crate) fn merged_dir(out: &Path) -> PathBuf {
    out.join("merged")
}

/// Checks that every tile of the plan is present and that its header belongs to this plan, run,
/// index and ranges (cheap: headers only); the first problem is the error, missing tiles are
/// listed together.
pub(crate) fn check_all_present(out: &Path, plan: &Plan) -> Result<()> {
    let mut missing = Vec::new();
    for t in &plan.tiles {
        let path = tile_path(out, t.index);
        match read_header(&path, plan, t) {
            Ok(_) => {}
            Err(TileProblem::Missing) => missing.push(t.index),
            Err(p) => return Err(p.error(&path, t.index, out)),
        }
    }
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().take(10).map(|i| i.to_string()).collect();
        return Err(Error::Data(format!(
            "{}: {} of {} tiles are missing (index {}{}); run `pathkernel tile run {} --index I` for each",
            out.display(),
            missing.len(),
            plan.tiles.len(),
            list.join(", "),
            if missing.len() > 10 { ", …" } else { "" },
            out.display()
        )));
    }
    Ok(())
}

fn load(out: &Path, plan: &Plan, t: &TileEntry) -> Result<Tile> {
    let path = tile_path(out, t.index);
    read_tile(&path, plan, t).map_err(|p| p.error(&path, t.index, out))
}

/// Sums the Grams of one row block's tiles in the plan's fixed order (step range 0, 1, …):
/// `g = g_0; g += g_1; …` — the one place the order is decided, shared by the merge and
/// [`TiledGram`], so both give the same bits.
fn sum_in_order(acc: &mut [f64], next: &[f64]) {
    acc.iter_mut().zip(next).for_each(|(a, b)| *a += b);
}

/// Slices of `a`: `(first step, the columns [lo, hi), a[first step .., lo..hi] [len, M_c, K])`.
type ASlices = Vec<(usize, [usize; 2], Vec<f64>)>;

/// Assembles the column blocks of row block `b` over step range `r` (column order, by
/// [`kernel::engine::columns::assemble`]): the tile itself when the plan has one column block.
fn combine_columns(out: &Path, plan: &Plan, b: usize, r: usize, a_slices: &mut ASlices) -> Result<KernelOutput> {
    let mut parts = Vec::with_capacity(plan.col_blocks);
    for c in 0..plan.col_blocks {
        let t = &plan.block_tiles(b, c)[r];
        let tile = load(out, plan, t)?;
        a_slices.extend(tile.a.map(|(lo, v)| (lo, t.cols, v)));
        parts.push(tile.out);
    }
    kernel::engine::columns::assemble(parts)
}

/// Combines the tiles of row block `b` (all columns, all steps) into one output: per step range
/// its column blocks assembled, then the step ranges in order.
///
/// gram, self-kernel, weight-decay and rounding terms: summed in order; per-step Grams and
/// records: concatenated; bias: the first range's; network: the last range's; machine:
/// `machine_0 + Σ_{r≥1} (machine_r − bias_r)`; residual: the max. With one column block and one
/// step range the tile is returned as it is.
fn combine_row_block(out: &Path, plan: &Plan, b: usize) -> Result<(KernelOutput, ASlices)> {
    let mut a_slices = Vec::new();
    let mut acc = combine_columns(out, plan, b, 0, &mut a_slices)?;
    for r in 1..plan.step_ranges.len() {
        let o = combine_columns(out, plan, b, r, &mut a_slices)?;
        // Consecutive ranges meet at one state: f at w_B of range r is f at w_A of range r + 1.
        let gap = kernel::max_abs_diff(&acc.network, &o.bias);
        let scale = kernel::max_abs(&o.bias).max(1.0);
        if gap.is_nan() || gap > 1e-12 * scale {
            let (t0, t1) = (&plan.block_tiles(b, 0)[r - 1], &plan.block_tiles(b, 0)[r]);
            return Err(Error::Numerical(format!(
                "tiles {} and {} do not chain: the network at step {} differs by {gap:e} between them",
                t0.index, t1.index, t1.steps[0]
            )));
        }
        sum_in_order(&mut acc.gram, &o.gram);
        if let (Some(dst), Some(src)) = (acc.per_step.as_mut(), o.per_step.as_ref()) {
            dst.extend_from_slice(src);
        }
        if let (Some(dst), Some(src)) = (acc.diag.as_mut(), o.diag.as_ref()) {
            sum_in_order(dst, src);
        }
        for ((mv, m1), b1) in acc.machine.iter_mut().zip(&o.machine).zip(&o.bias) {
            *mv += m1 - b1;
        }
        for (dst, src) in [(&mut acc.reg, &o.reg), (&mut acc.rounding, &o.rounding), (&mut acc.carried, &o.carried)] {
            if let (Some(dst), Some(src)) = (dst.as_mut(), src.as_ref()) {
                sum_in_order(dst, src);
            }
        }
        acc.decomposition_residual = match (acc.decomposition_residual, o.decomposition_residual) {
            (Some(x), Some(y)) => Some(kernel::nan_max(x, y)),
            (x, y) => x.or(y),
        };
        acc.network = o.network;
        acc.steps.extend_from_slice(&o.steps);
        acc.records.extend(o.records);
        acc.seconds += o.seconds;
        // Recomputed from the merged Gram below (it needs the whole path's a).
        acc.single_machine = None;
    }
    Ok((acc, a_slices))
}

/// Merges the tiles of the plan in `out` into one output, equal to the one-process
/// computation's (to rounding of the step-range sums; bit-identical on reruns of a plan).
///
/// Column blocks are assembled by [`kernel::engine::columns::assemble`], row blocks by
/// `kernel::engine::blocked::in_blocks` (the same concatenation and record combination as a blocked
/// one-process run), `a` is the union of the tiles' (disjoint steps and columns), and with
/// several step ranges or column blocks the single machine of Theorem 3.7 is recomputed from the
/// merged full Gram when `a` is constant over the steps ([`kernel::engine::columns::single_machine`]).
/// `seconds` is the sum of the tiles' seconds.
///
/// # Shapes
/// As [`kernel::compute`] over all the plan's row points.
pub fn merge_output(out: &Path, plan: &Plan, points: &kernel::Points) -> Result<KernelOutput> {
    let (m, k, n) = (plan.m, plan.k, plan.n_steps);
    let mk = m * k;
    let mut a = vec![0.0; n * mk];
    let cb = plan.col_blocks;
    let mut written = vec![false; n * cb];
    let mut seconds = 0.0;
    let mut b = 0usize;
    // kernel::engine::blocked's assembly keeps the first block's reg, rounding and residual only: they
    // are concatenated (and maximised) here.
    let mut reg: Vec<Option<Vec<f64>>> = Vec::new();
    let mut rounding: Vec<Option<Vec<f64>>> = Vec::new();
    let mut carried: Vec<Option<Vec<f64>>> = Vec::new();
    let mut residual: Option<f64> = None;
    let mut merged = kernel::engine::blocked::in_blocks(points, plan.block_rows, &|_, _| {}, &mut |pts, _| {
        let (o, slices) = combine_row_block(out, plan, b)?;
        if o.p != pts.len() {
            return Err(Error::ShapeMismatch { what: format!("row block {b}"), expected: vec![pts.len()], got: vec![o.p] });
        }
        for (lo, [c0, c1], v) in slices {
            let w = (c1 - c0) * k;
            let c = c0 / plan.block_cols;
            for (j, src) in v.chunks_exact(w).enumerate() {
                let s = lo + j;
                if std::mem::replace(&mut written[s * cb + c], true) {
                    return Err(Error::Data(format!("two tiles of the plan in {} both hold a at step {s}, columns {c0}..{c1}", out.display())));
                }
                a[s * mk + c0 * k..s * mk + c1 * k].copy_from_slice(src);
            }
        }
        seconds += o.seconds;
        reg.push(o.reg.clone());
        rounding.push(o.rounding.clone());
        carried.push(o.carried.clone());
        residual = match (residual, o.decomposition_residual) {
            (Some(x), Some(y)) => Some(kernel::nan_max(x, y)),
            (x, y) => x.or(y),
        };
        b += 1;
        Ok(o)
    })?;
    if b != plan.row_blocks {
        return Err(Error::Data(format!("merged {b} row blocks, the plan has {}", plan.row_blocks)));
    }
    merged.a = a;
    merged.seconds = seconds;
    let concat = |parts: Vec<Option<Vec<f64>>>| -> Option<Vec<f64>> { parts.into_iter().collect::<Option<Vec<Vec<f64>>>>().map(|v| v.concat()) };
    merged.reg = concat(reg);
    merged.rounding = concat(rounding);
    merged.carried = concat(carried);
    merged.decomposition_residual = residual;
    if plan.step_ranges.len() > 1 || plan.col_blocks > 1 {
        merged.single_machine = kernel::engine::columns::single_machine(&merged);
    }
    Ok(merged)
}

/// `pathkernel tile merge`: checks every tile (present, complete, checksum, same plan and run),
/// merges them and writes `OUT/merged/` (`gram.safetensors`, `predictions.parquet`,
/// `exactness.json`, `steps.parquet`, as `pathkernel kernel` writes them), staged in
/// `OUT/merged.partial` and moved into place. An existing `OUT/merged` is refused unless
/// `force`. The merged output is held in memory: `budget` must cover it plus one row block's
/// tiles (otherwise read the tiles with [`TiledGram`]).
pub fn merge(out: &Path, force: bool, budget: u64) -> Result<(PathBuf, KernelOutput)> {
    let plan = Plan::read(out)?;
    check_all_present(out, &plan)?;
    let block: u64 = plan.row_block_tiles(0).iter().map(|t| t.output_bytes).sum();
    let need = plan.merged_output_bytes + 2 * block;
    if need > budget {
        return Err(Error::OutOfMemoryBudget {
            what: format!("merging the {} tiles of {} (the merged output plus one row block's tiles)", plan.tiles.len(), out.display()),
            needed_bytes: need,
            budget_bytes: budget,
            hint: "raise --memory, or read the tiles a row or class block at a time (pathkernel::tile::TiledGram, or Python) without merging".into(),
        });
    }
    let manifest = crate::trajectory::read_manifest(&plan.run_dir)?;
    if manifest.run_id != plan.run_id {
        return Err(Error::trajectory(&plan.run_dir, format!("is run {}, but the plan was made for run {}", manifest.run_id, plan.run_id)));
    }
    let dataset = crate::trajectory::read_dataset(&plan.run_dir.join("dataset.safetensors"), &manifest)?;
    let points = plan.points(&dataset)?;
    let staged = crate::io::StagedDir::new(&merged_dir(out), force)?;
    let o = merge_output(out, &plan, &points)?;
    kernel::output::write(staged.path(), &o, &points, plan.request.points.parse()?, &plan.run_id)?;
    let dir = staged.commit()?;
    Ok((dir, o))
}

/// A tiled Gram read a row block or a class block at a time, straight from the tiles (checksums
/// verified), without merging: memory is one row block's tiles (each within the plan's
/// `--memory`) plus what is returned.
///
/// ```no_run
/// # fn main() -> pathkernel::Result<()> {
/// let g = pathkernel::tile::TiledGram::open(std::path::Path::new("runs/toy-tiles"))?;
/// for b in 0..g.row_blocks().len() {
///     let rows = g.row_block(b)?; // [rows of block b, M, K, K] (full layout)
///     # let _ = rows;
/// }
/// let k01 = g.class_block(0, 1)?; // [P, M]: K^{01}
/// # let _ = k01;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TiledGram {
    out: PathBuf,
    plan: Plan,
}

impl TiledGram {
    /// Opens the plan in `out` and checks that every tile is present and belongs to it.
    pub fn open(out: &Path) -> Result<Self> {
        let plan = Plan::read(out)?;
        check_all_present(out, &plan)?;
        Ok(TiledGram { out: out.to_path_buf(), plan })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The Gram's layout.
    pub fn layout(&self) -> Layout {
        self.plan.request.layout
    }

    /// The shape of the whole Gram: `[P, M, K, K]`, `[P, M, K]` or `[P, M]`.
    pub fn shape(&self) -> Vec<usize> {
        self.layout().shape(self.plan.p, self.plan.m, self.plan.k)
    }

    /// The row points of each row block.
    pub fn row_blocks(&self) -> Vec<Range<usize>> {
        (0..self.plan.row_blocks).map(|b| self.plan.row_block_tiles(b)[0].rows).map(|[lo, hi]| lo..hi).collect()
    }

    /// The Gram rows of row block `b` (all steps summed in the plan's order, column blocks side
    /// by side: the same bits as the merged Gram).
    ///
    /// # Shapes
    /// `[hi − lo, M, K, K]` (full), `[hi − lo, M, K]` (diag) or `[hi − lo, M]` (trace).
    pub fn row_block(&self, b: usize) -> Result<Vec<f64>> {
        if b >= self.plan.row_blocks {
            return Err(Error::Config(format!("row block {b}: the plan has {}", self.plan.row_blocks)));
        }
        let (m, pp) = (self.plan.m, self.layout().per_pair(self.plan.k));
        let [r0, r1] = self.plan.row_block_tiles(b)[0].rows;
        let mut out = if self.plan.col_blocks > 1 { vec![0.0; (r1 - r0) * m * pp] } else { Vec::new() };
        for c in 0..self.plan.col_blocks {
            let tiles = self.plan.block_tiles(b, c);
            let mut g = load(&self.out, &self.plan, &tiles[0])?.out.gram;
            for t in &tiles[1..] {
                sum_in_order(&mut g, &load(&self.out, &self.plan, t)?.out.gram);
            }
            if self.plan.col_blocks == 1 {
                return Ok(g);
            }
            let [c0, c1] = tiles[0].cols;
            for (row, src) in g.chunks_exact((c1 - c0) * pp).enumerate() {
                out[(row * m + c0) * pp..(row * m + c1) * pp].copy_from_slice(src);
            }
        }
        Ok(out)
    }

    /// The class block `K^{c c'}` over all row points, one row block at a time: any `(c, c')`
    /// in the full layout, `c == c'` in the diag layout (the trace layout has no class blocks).
    ///
    /// # Shapes
    /// `[P, M]`.
    pub fn class_block(&self, c: usize, c2: usize) -> Result<Vec<f64>> {
        let (p, m, k) = (self.plan.p, self.plan.m, self.plan.k);
        if c >= k || c2 >= k {
            return Err(Error::Config(format!("class block ({c}, {c2}) of a Gram with K = {k}")));
        }
        // Entry (c, c') of pair j (row point, training point) is g[j · per + offset].
        let offset = match self.layout() {
            Layout::Full => c * k + c2,
            Layout::Diag if c == c2 => c,
            l => return Err(Error::Config(format!("class block ({c}, {c2}) is not stored in the {l} layout"))),
        };
        let per = self.layout().per_pair(k);
        let mut out = Vec::with_capacity(p * m);
        for b in 0..self.plan.row_blocks {
            let g = self.row_block(b)?;
            out.extend(g.chunks_exact(per).map(|pair| pair[offset]));
        }
        Ok(out)
    }
}
