//! Checkpoints of the optimizer replay below carried-in windows, shared by the windows one
//! process computes on one run.
//!
//! A window `[A, B)` with the carried-in term replays the optimizer from step 0 for the state
//! it reaches A with (Adam's moments, the carried-in sum `U_A`, the replay's largest residual):
//! one data gradient per earlier step. That state depends on the run, the update rule and the
//! path that computes the gradients only, so a later window `[A', B')` with `A' ≥ A` starts from
//! it instead of from step 0 and replays `[A, A')` alone; what it computes is the same, bit for
//! bit (the same operations in the same order). A study's windows are computed in step order,
//! so each replays only the steps since the one before it.

use std::sync::Mutex;

use crate::kernel::engine::prepare::Prepared;
use crate::optim::OptimizerState;

/// The replay's state before step `step`.
#[derive(Clone, Debug)]
pub(super) struct Checkpoint {
    pub step: usize,
    pub opt: OptimizerState,
    /// `U_step` (`[W]`).
    pub carry: Vec<f64>,
    /// The largest relative deviation of the replayed updates of the steps before `step`.
    pub residual: f64,
}

/// Checkpoints kept in all (the oldest goes first); one is `3·W` numbers.
const KEPT: usize = 16;

static CHECKPOINTS: Mutex<Vec<(String, Checkpoint)>> = Mutex::new(Vec::new());

/// What a checkpoint of `s`'s replay depends on: the run (its id hashes its configuration, so
/// its states), the update rule and preconditioners, and the path and device computing the
/// gradients.
pub(super) fn key(s: &Prepared<'_>) -> String {
    format!("{}|{}|{:?}|{}|{}|{}|{}", s.manifest.run_id, s.manifest.created_by, s.rule, s.precond.is_some(), s.stack_fast, s.req.device, s.states.len())
}

/// The latest checkpoint of `key` at or before `step`.
pub(super) fn latest(key: &str, step: usize) -> Option<Checkpoint> {
    let kept = CHECKPOINTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    kept.iter().filter(|(k, c)| k == key && c.step <= step).max_by_key(|(_, c)| c.step).map(|(_, c)| c.clone())
}

/// Keeps `cp` under `key` (unless one of that step is kept already).
pub(super) fn keep(key: &str, cp: Checkpoint) {
    let mut kept = CHECKPOINTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if kept.iter().any(|(k, c)| k == key && c.step == cp.step) {
        return;
    }
    if kept.len() >= KEPT {
        kept.remove(0);
    }
    kept.push((key.to_string(), cp));
}

/// Forgets every checkpoint (tests: a replay from step 0 to compare with).
#[cfg(test)]
pub(crate) fn clear() {
    CHECKPOINTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
}

#[cfg(test)]
mod tests {
    use crate::api::Trained;

    /// A carried-in window computed after an earlier one (its replay resumed from the earlier
    /// window's checkpoint) is the window computed from a replay from step 0, bit for bit:
    /// Gram, per-step Grams, `a`, machine, carried-in term and replay residual.
    #[test]
    fn a_resumed_replay_is_the_replay_from_step_0() {
        let dir = tempfile::tempdir().unwrap();
        let net = Trained::train_toml(include_str!("../../../../tests/data/transformer/modular-addition.toml"), dir.path().join("run")).unwrap();
        let window = |a: usize, b: usize| net.epk().steps(a, b).carry_in().per_step().compute().unwrap();
        super::clear();
        let fresh = window(7, 10);
        super::clear();
        let _earlier = window(2, 5);
        let key_steps = super::CHECKPOINTS.lock().unwrap().iter().map(|(_, c)| c.step).collect::<Vec<_>>();
        assert!(key_steps.contains(&2), "the earlier window left its checkpoint: {key_steps:?}");
        let resumed = window(7, 10);
        let (f, r) = (fresh.output(), resumed.output());
        assert_eq!(f.gram, r.gram);
        assert_eq!(f.per_step, r.per_step);
        assert_eq!(f.a, r.a);
        assert_eq!(f.machine, r.machine);
        assert_eq!(f.carried, r.carried);
        assert_eq!(f.decomposition_residual, r.decomposition_residual);
        assert!(f.carried.as_ref().is_some_and(|c| c.iter().any(|v| *v != 0.0)), "the window has a carried-in term");
    }
}
