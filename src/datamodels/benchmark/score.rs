//! Scoring a method's attributions: the shared evaluation ([`Scorer`]: the subsets, the retrained
//! outputs, the split into tuning and evaluation subsets) and a method's sweep ([`Sweep`]: every
//! setting scored, the best on the tuning subsets kept), plus the small helpers every method uses.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{AttributionSpec, MethodResult, SweepPoint};
use crate::attribution::lds::{bootstrap_mean, lds_per_point};
use crate::datamodels::subsets::Subsets;
use crate::error::Result;

/// Retrained outputs at the test points. # Shapes `[S, P]` each.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Retrained {
    pub(super) logp: Vec<f64>,
    pub(super) margin: Vec<f64>,
    pub(super) seconds: f64,
}

/// The shared evaluation: subsets, retrained outputs, bootstrap settings.
pub(super) struct Scorer<'a> {
    pub(super) subsets: &'a Subsets,
    pub(super) retrained: &'a Retrained,
    pub(super) m: usize,
    pub(super) spec: &'a AttributionSpec,
}

impl Scorer<'_> {
    /// One sweep point of `τ [P, M]`, with the per-point LDS on the evaluation subsets (log p and
    /// margin).
    fn point(&self, method: &str, setting: String, dim: Option<usize>, ridge: Option<f64>, tau: &[f64]) -> Result<(SweepPoint, Vec<f64>, Vec<f64>)> {
        let t = lds_per_point(tau, self.m, &self.subsets.members, &self.retrained.logp, &self.subsets.tuning_ids())?;
        let e = lds_per_point(tau, self.m, &self.subsets.members, &self.retrained.logp, &self.subsets.evaluation_ids())?;
        let em = lds_per_point(tau, self.m, &self.subsets.members, &self.retrained.margin, &self.subsets.evaluation_ids())?;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        Ok((SweepPoint { method: method.into(), setting, dim, ridge, tune: mean(&t), eval: mean(&e), eval_margin: mean(&em) }, e, em))
    }
}

/// The best tuning setting so far: its tuning LDS, name, per-point evaluation LDS (log p,
/// margin) and `τ`.
type Best = (f64, String, Vec<f64>, Vec<f64>, Vec<f64>);

/// Accumulates a method's sweep and keeps the per-point LDS of its best tuning setting.
pub(super) struct Sweep {
    method: String,
    models: usize,
    pub(super) points: Vec<SweepPoint>,
    best: Option<Best>,
    start: Instant,
}

impl Sweep {
    pub(super) fn new(method: &str, models: usize) -> Sweep {
        Sweep { method: method.into(), models, points: vec![], best: None, start: Instant::now() }
    }

    /// Scores `τ [P, M]` at one setting.
    pub(super) fn add(&mut self, sc: &Scorer, setting: String, dim: Option<usize>, ridge: Option<f64>, tau: &[f64]) -> Result<()> {
        let (pt, e, em) = sc.point(&self.method, setting.clone(), dim, ridge, tau)?;
        if self.best.as_ref().is_none_or(|b| pt.tune > b.0) {
            self.best = Some((pt.tune, setting, e, em, tau.to_vec()));
        }
        self.points.push(pt);
        Ok(())
    }

    /// The method's result at its best tuning setting; its seconds are the sweep's own plus
    /// `extra_seconds` (work done before the sweep, e.g. kernel rows).
    pub(super) fn finish(self, sc: &Scorer, extra_seconds: f64) -> MethodResult {
        let (tune, chosen, e, em, tau) = self.best.expect("a sweep has at least one point");
        MethodResult {
            method: self.method,
            models: self.models,
            chosen,
            tune,
            lds: bootstrap_mean(&e, sc.spec.bootstrap, sc.spec.bootstrap_seed),
            lds_margin: bootstrap_mean(&em, sc.spec.bootstrap, sc.spec.bootstrap_seed),
            seconds: self.start.elapsed().as_secs_f64() + extra_seconds,
            sweep: self.points,
            tau,
        }
    }
}

/// One line of a method's result, for progress logs.
pub(super) fn line(r: &MethodResult) -> String {
    format!("{}: LDS {} (margin {}) at {} [tune {:.3}], {:.1} s", r.method, r.lds, r.lds_margin, r.chosen, r.tune, r.seconds)
}

/// A setting's number as written in the tables (`0`, else scientific).
pub(super) fn fmt_g(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else {
        format!("{v:e}")
    }
}

/// The ridge (or damping) of a method's chosen setting.
pub(super) fn chosen_ridge(r: &MethodResult) -> Option<f64> {
    r.sweep.iter().find(|s| s.setting == r.chosen).and_then(|s| s.ridge)
}
