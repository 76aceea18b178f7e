//! The one way to compute a Gram: [`compute`] takes a run, its weight states, the row points and
//! a [`Request`]; everything else in the crate (the notebook API, tiles, the CLI, the bench,
//! the studies) calls it.

use super::blocked::in_blocks;
use super::prepare::Prepared;
use super::request::Request;
use super::types::{KernelOutput, Points};
use super::{driver, stateful};
use crate::error::Result;
use crate::model::Params;
use crate::trajectory::Run;

/// The kernel of a recorded run between `rows` and its training points, with the kernel machine
/// and its per-step validation.
///
/// Only the entries of `req.layout` are computed and held; the kernel machine and its per-step
/// validation are computed for every layout (contracted with `a_{i,s}` on the fly, from the
/// factors); the single machine of Theorem 3.7 contracts the off-diagonal blocks and comes with
/// `full` only. MLPs take the structured fast path, CNNs theirs ([`super::GramPath::Fast`]) or
/// the generic autodiff reference ([`super::GramPath::Generic`], fixed rules only). Runs whose
/// optimizer keeps state (momentum, Adam, weight decay) take the optimizer replay
/// (`super::stateful`); what the run recorded besides its states (Adam's preconditioners) is
/// loaded from its directory. With `req.block_rows` the rows are computed in blocks and the
/// outputs concatenated (equal to one block up to rounding of the combined record means).
///
/// `progress(done, total)` counts steps (over all blocks).
///
/// # Shapes
/// `states` `N + 1` (`w_0 … w_N`), `rows.x` `[P, d]`; the output's Gram is `[P, M, K, K]` in
/// `req.layout` (`M` the columns' training points).
///
/// # Panics
/// If `req.block_rows == Some(0)`.
pub fn compute(run: &Run, states: &[Params], rows: &Points, req: &Request, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    // A device that cannot run fails here, before any work (one line, see `backend::cuda`).
    req.device.probe()?;
    let precond = run.load_preconditioners()?;
    let mut one = |pts: &Points, prog: &dyn Fn(usize, usize)| -> Result<KernelOutput> {
        let prep = Prepared::new(&run.manifest, &run.dataset, states, precond.as_deref(), pts, req)?;
        if prep.rule.is_plain() {
            driver::compute(&prep, prog)
        } else {
            super::backend::check_path(req.device, false, "the optimizer replay (momentum, Adam, weight decay)")?;
            stateful::compute(&prep, prog)
        }
    };
    match req.block_rows {
        Some(block) => in_blocks(rows, block, progress, &mut one),
        None => one(rows, progress),
    }
}
