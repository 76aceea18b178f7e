//! The one model selection of every study (`[selection]` of a plain study, the grid of
//! `[uncertainty]`): a learning rate and a step count chosen on the validation split.
//!
//! The grid is `lrs × steps`. One run per learning rate is trained to the largest step count
//! (cached under `select/lr{lr}-steps{last}/run`, the runs trained side by side); candidate
//! `(lr, s)` is that run's state at step `s` (training does not depend on where it stops, so the
//! state is the run of `s` steps; the chosen one is checked against its own run bit for bit when
//! `s` is not the last). A cosine schedule does depend on the total: then every point of the grid
//! is trained as its own run. The choice is the best validation accuracy; ties go to the
//! smaller learning rate, then to fewer steps ([`choose`]).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::cache::Clock;
use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::io;
use crate::train::{RunConfig, Schedule};
use crate::trajectory::Run;
use crate::uncertainty::{self, metrics};

/// One candidate of a `[selection]`, as a plain study's `selection.json` lists it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Candidate {
    /// Learning rate.
    pub lr: f64,
    /// Steps.
    pub steps: usize,
    /// Accuracy on the validation split.
    pub validation_accuracy: f64,
    /// Accuracy on the test set (reported, not used).
    pub test_accuracy: f64,
}

/// One point of the grid with what was measured there.
#[derive(Clone, Debug)]
pub struct Scored {
    /// Learning rate.
    pub lr: f64,
    /// Steps.
    pub steps: usize,
    /// Accuracy on the validation split (the criterion).
    pub val_accuracy: f64,
    /// Mean negative log-likelihood on the validation split.
    pub val_nll: f64,
    /// Accuracy on the test set (reported, never used to choose).
    pub test_accuracy: f64,
    /// Training loss at that step (from the training log; NaN where not logged).
    pub train_loss: f64,
}

/// What [`select`] chose.
pub(crate) struct Selected {
    /// Every point of the grid, learning rates outer, steps inner (in the order given).
    pub grid: Vec<Scored>,
    /// Index of the chosen point in `grid`.
    pub best: usize,
    /// The chosen network's run (the selection run itself when it stops at the last step).
    pub run: Run,
    /// Whether the chosen run equals the selection run's state at its step, bit for bit (None
    /// when the chosen run is the selection run).
    pub prefix_identical: Option<bool>,
}

/// `rc` with the learning rate, step count and seed replaced.
pub(crate) fn configured(rc: &RunConfig, lr: f64, steps: usize, seed: u64) -> RunConfig {
    let mut c = rc.clone();
    c.train.lr = lr;
    c.train.steps = steps;
    c.train.seed = seed;
    c
}

/// The chosen index: the best validation accuracy; ties to the smaller learning rate, then to
/// fewer steps (whatever the order of `grid`).
///
/// # Panics
/// If `grid` is empty.
pub fn choose(grid: &[Scored]) -> usize {
    assert!(!grid.is_empty(), "choose: an empty grid");
    let better = |a: &Scored, b: &Scored| a.val_accuracy > b.val_accuracy || (a.val_accuracy == b.val_accuracy && (a.lr < b.lr || (a.lr == b.lr && a.steps < b.steps)));
    (1..grid.len()).fold(0, |best, i| if better(&grid[i], &grid[best]) { i } else { best })
}

fn labels(t: &Targets) -> Result<&[usize]> {
    match t {
        Targets::Labels(y) => Ok(y),
        Targets::Values(_) => Err(Error::Config("model selection chooses by validation accuracy: it needs a classification dataset".into())),
    }
}

/// Trains the grid `lrs × steps` of `rc` (its seed; the runs cached under `cache/select/`),
/// scores every point on `data`'s validation split and returns the choice ([`choose`]) with its
/// run (trained to the chosen steps under `cache/run` when they are not the last).
///
/// Errors: an empty or non-positive grid, no validation split, a regression dataset, and every
/// error of training.
#[allow(clippy::too_many_arguments)]
pub(crate) fn select(clock: &mut Clock, rc: &RunConfig, lrs: &[f64], steps: &[usize], data: &Dataset, cache: &Path, base_dir: &Path, progress: bool) -> Result<Selected> {
    if lrs.is_empty() || steps.is_empty() || lrs.iter().any(|v| !(v.is_finite() && *v > 0.0)) || steps.contains(&0) {
        return Err(Error::Config("model selection needs non-empty lists of positive learning rates and steps".into()));
    }
    let val = data.validation.as_ref().ok_or_else(|| Error::Config("model selection chooses on the validation split: set data.val_per_class".into()))?;
    let (y_val, y_test) = (labels(&val.y)?, labels(&data.y_test)?);
    let k = data.num_outputs;
    let last = *steps.iter().max().expect("checked non-empty");
    let seed = rc.train.seed;
    // A schedule that depends on the total step count (cosine) does not stop where a shorter
    // run would: then every point of the grid is its own run.
    let prefix = !matches!(rc.train.schedule, Schedule::Cosine { .. });
    let lengths: Vec<usize> = if prefix { vec![last] } else { steps.to_vec() };
    let jobs: Vec<(RunConfig, PathBuf)> =
        lrs.iter().flat_map(|&lr| lengths.iter().map(move |&t| (configured(rc, lr, t, seed), cache.join("select").join(format!("lr{lr}-steps{t}")).join("run")))).collect();
    let names: Vec<String> = lrs.iter().map(|lr| lr.to_string()).collect();
    let lens: Vec<String> = lengths.iter().map(|t| t.to_string()).collect();
    let runs = clock.train_group(&format!("selection runs lr = {}, {} steps (trained side by side)", names.join(", "), lens.join(", ")), "shared", &jobs, base_dir)?;
    // The run that holds candidate (lr, s), and its step count.
    let run_of = |lr: f64, s: usize| -> &Run {
        let (i, j) = (lrs.iter().position(|&l| l == lr).expect("from the grid"), if prefix { 0 } else { lengths.iter().position(|&t| t == s).expect("from the grid") });
        &runs[i * lengths.len() + j]
    };
    let mut grid = Vec::new();
    for &lr in lrs {
        for &s in steps {
            let run = run_of(lr, s);
            let log = io::Table::read_parquet(&run.dir.join("train_log.parquet"))?;
            let step_col = log.i64("step").ok_or_else(|| Error::Data("train_log.parquet has no step column".into()))?;
            let loss_col = log.f64("loss").ok_or_else(|| Error::Data("train_log.parquet has no loss column".into()))?;
            let w0 = run.load_step(0)?;
            let w = run.load_step(s)?;
            let probs = |x: &[f64]| metrics::softmax_rows(&uncertainty::network_logits(&run.manifest.architecture, &w, Some(&w0), x)?, k);
            let (pv, pt) = (probs(&val.x)?, probs(&data.x_test)?);
            grid.push(Scored {
                lr,
                steps: s,
                val_accuracy: metrics::accuracy(&pv, y_val, k)?,
                val_nll: metrics::nll(&pv, y_val, k)?,
                test_accuracy: metrics::accuracy(&pt, y_test, k)?,
                train_loss: step_col.iter().position(|&v| v == s as i64).map_or(f64::NAN, |i| loss_col[i]),
            });
        }
    }
    let best = choose(&grid);
    let (lr, s) = (grid[best].lr, grid[best].steps);
    let sel = run_of(lr, s);
    let (run, prefix_identical) = if sel.manifest.steps == s {
        (Run::open(&sel.dir)?, None)
    } else {
        let chosen = configured(rc, lr, s, seed);
        let run = clock.train(&format!("network under test (lr = {lr}, {s} steps)"), "shared", &chosen, &cache.join("run"), base_dir, progress)?;
        let same = sel.load_step(s)? == run.load_step(s)?;
        (run, Some(same))
    };
    Ok(Selected { grid, best, run, prefix_identical })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(lr: f64, steps: usize, acc: f64) -> Scored {
        Scored { lr, steps, val_accuracy: acc, val_nll: 0.0, test_accuracy: 0.0, train_loss: 0.0 }
    }

    /// The obvious version: sort by (accuracy descending, lr, steps) and take the first.
    fn slow(grid: &[Scored]) -> usize {
        let mut idx: Vec<usize> = (0..grid.len()).collect();
        idx.sort_by(|&a, &b| {
            let (x, y) = (&grid[a], &grid[b]);
            y.val_accuracy.total_cmp(&x.val_accuracy).then(x.lr.total_cmp(&y.lr)).then(x.steps.cmp(&y.steps))
        });
        idx[0]
    }

    #[test]
    fn ties_go_to_the_smaller_rate_then_fewer_steps_in_any_order() {
        let grid = vec![point(0.5, 200, 0.9), point(0.2, 500, 0.9), point(0.2, 200, 0.8), point(0.1, 500, 0.9), point(0.1, 300, 0.9)];
        assert_eq!(choose(&grid), 4);
        let mut rng = 7u64;
        for _ in 0..200 {
            let mut g = Vec::new();
            for _ in 0..6 {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = (rng >> 33) as usize;
                g.push(point([0.1, 0.2, 0.5][r % 3], [100, 200][(r / 3) % 2], [0.7, 0.8][(r / 6) % 2]));
            }
            assert_eq!(choose(&g), slow(&g), "{:?}", g.iter().map(|p| (p.lr, p.steps, p.val_accuracy)).collect::<Vec<_>>());
        }
    }
}
