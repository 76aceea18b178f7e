//! `[selection]`: the learning rate and step count chosen on the validation split.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{SelectionSpec, StudyConfig, StudyOptions};
use crate::api::Trained;
use crate::error::{Error, Result};
use crate::train::{train_to_dir, TrainOptions};
use crate::trajectory::Run;

/// One candidate of a `[selection]`, with its validation accuracy.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Learning rate.
    pub lr: f64,
    /// Steps.
    pub steps: usize,
    /// Accuracy on the validation split.
    pub validation_accuracy: f64,
    /// Accuracy on the test set (reported, not used).
    pub test_accuracy: f64,
}

/// Trains the candidates of `sel` (each cached under `cache/select/`) and returns them with the
/// index of the chosen one, its run directory and whether every candidate was reused.
pub(super) fn select(cfg: &StudyConfig, sel: &SelectionSpec, cache: &Path, opts: &StudyOptions) -> Result<(Vec<Candidate>, usize, PathBuf, bool)> {
    if sel.lr.is_empty() || sel.steps.is_empty() || sel.lr.iter().any(|v| !(v.is_finite() && *v > 0.0)) || sel.steps.contains(&0) {
        return Err(Error::Config("[selection] needs non-empty lists of positive lr and steps".into()));
    }
    let data = cfg.data.load(&opts.base_dir)?;
    let val = data.validation.as_ref().ok_or_else(|| Error::Config("[selection] chooses on the validation split: set data.val_per_class".into()))?;
    let crate::data::Targets::Labels(yv) = &val.y else {
        return Err(Error::Config("[selection] needs a classification dataset".into()));
    };
    let accuracy = |net: &Trained, x: &[f64], y: &[usize]| -> Result<f64> {
        let f = net.network(x)?;
        let k = net.run().manifest.architecture.outputs();
        let hits = f.chunks_exact(k).zip(y).filter(|(row, &c)| crate::uncertainty::metrics::argmax(row) == c).count();
        Ok(hits as f64 / y.len().max(1) as f64)
    };
    let crate::data::Targets::Labels(yt) = &data.y_test else {
        return Err(Error::Config("[selection] needs a classification dataset".into()));
    };
    let mut out = Vec::new();
    let mut dirs = Vec::new();
    let mut all_reused = true;
    for &steps in &sel.steps {
        for &lr in &sel.lr {
            let mut rc = cfg.run_config();
            rc.train.lr = lr;
            rc.train.steps = steps;
            let dir = cache.join("select").join(format!("lr{lr}-steps{steps}")).join("run");
            let reuse = matches!(Run::open(&dir), Ok(r) if r.manifest.run_id == rc.run_id() && r.manifest.config == serde_json::to_value(&rc).expect("serialisable") && r.manifest.created_by == crate::train::created_by());
            if !reuse {
                all_reused = false;
                train_to_dir(&rc, &dir, &TrainOptions { progress: opts.progress, force: true, base_dir: opts.base_dir.clone(), memory_budget: None })?;
            }
            let net = Trained::open(&dir)?;
            out.push(Candidate { lr, steps, validation_accuracy: accuracy(&net, &val.x, yv)?, test_accuracy: accuracy(&net, &data.x_test, yt)? });
            dirs.push(dir);
        }
    }
    // Best validation accuracy; ties to fewer steps, then the smaller rate (the order above).
    let best = (0..out.len()).fold(0, |b, i| if out[i].validation_accuracy > out[b].validation_accuracy { i } else { b });
    Ok((out, best, dirs[best].clone(), all_reused))
}
