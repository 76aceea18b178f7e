//! Computing one tile (`pathkernel tile run`) and the state of a plan's tiles.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::kernel::{self, Points};
use crate::trajectory::Run;

use super::format::{read_header, read_tile, tile_path, write_tile, TileProblem};
use super::plan::Plan;

/// What `tile run` did.
#[derive(Clone, Debug, PartialEq)]
pub enum RunOutcome {
    /// The tile was already complete and valid: nothing computed.
    AlreadyComplete(PathBuf),
    /// The tile was computed and written.
    Computed {
        /// The tile file.
        path: PathBuf,
        /// Seconds of the kernel computation.
        seconds: f64,
        /// Why an existing file was replaced (truncated, corrupted), if one was.
        replaced: Option<String>,
    },
}

/// The state of one tile of a plan.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TileState {
    /// Present, header consistent with the plan (and checksum verified when asked).
    Complete,
    /// Not there, or unusable (see the problem).
    Problem(TileProblem),
}

/// The state of every tile of the plan in `out`: header checks only (cheap), or also the
/// checksum of every tile's data with `verify`.
pub(crate) fn tile_states(out: &Path, plan: &Plan, verify: bool) -> Vec<TileState> {
    plan.tiles
        .iter()
        .map(|t| {
            let path = tile_path(out, t.index);
            let r = if verify { read_tile(&path, plan, t).map(|_| ()) } else { read_header(&path, plan, t).map(|_| ()) };
            match r {
                Ok(()) => TileState::Complete,
                Err(p) => TileState::Problem(p),
            }
        })
        .collect()
}

/// Computes tile `index` of the plan in `out` and writes it atomically, unless it is already
/// complete and valid (checksum verified). A truncated or corrupted file at its place is
/// replaced; a valid tile of another plan or run there is an error (nothing is overwritten).
///
/// `progress(done, total)` counts the tile's steps.
pub fn run_tile(out: &Path, index: usize, progress: &dyn Fn(usize, usize)) -> Result<RunOutcome> {
    let plan = Plan::read(out)?;
    let entry = plan.tiles.get(index).ok_or_else(|| {
        Error::Config(format!("--index {index}: the plan in {} has tiles 0..={}", out.display(), plan.tiles.len().saturating_sub(1)))
    })?;
    let path = tile_path(out, index);
    let replaced = match read_tile(&path, &plan, entry) {
        Ok(_) => return Ok(RunOutcome::AlreadyComplete(path)),
        Err(TileProblem::Missing) => None,
        Err(TileProblem::Damaged(why)) => Some(why),
        Err(p @ TileProblem::Foreign(_)) => return Err(p.error(&path, index, out)),
    };
    let start = Instant::now();
    let run = Run::open(&plan.run_dir)?;
    if run.manifest.run_id != plan.run_id {
        return Err(Error::trajectory(&plan.run_dir, format!("is run {}, but the plan was made for run {}", run.manifest.run_id, plan.run_id)));
    }
    let states = run.load_all()?;
    let points = plan.points(&run.dataset)?;
    let d = points.dim;
    let rows = Points { x: points.x[entry.rows[0] * d..entry.rows[1] * d].to_vec(), dim: d };
    let split = plan.step_ranges.len() > 1;
    // Several column blocks: this tile's columns only (a column share).
    let columns = (plan.col_blocks > 1).then_some((entry.cols[0], entry.cols[1]));
    let req = plan.request.kernel_request(if split { Some(entry.steps) } else { None })?.memory_budget(plan.memory_budget).columns(columns);
    let mc = entry.cols[1] - entry.cols[0];
    let bp = kernel::engine::blocked::plan_columns(&run.manifest, rows.len(), mc, plan.m, &req, plan.memory_budget)?;
    let o = kernel::compute(&run, &states, &rows, &req.block_rows(Some(bp.block_rows)), progress)?;
    if o.p != rows.len() || o.m != mc || o.k != plan.k {
        return Err(Error::ShapeMismatch { what: format!("tile {index}"), expected: vec![rows.len(), mc, plan.k], got: vec![o.p, o.m, o.k] });
    }
    let path = write_tile(out, &plan, entry, &o, entry.row_block == 0)?;
    Ok(RunOutcome::Computed { path, seconds: start.elapsed().as_secs_f64(), replaced })
}
