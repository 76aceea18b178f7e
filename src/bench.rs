//! Timing harness behind `pathkernel bench`: wall-clock seconds of kernel computations on a
//! recorded run, as JSON lines (name, sizes, min/median seconds, evaluations).

use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::kernel::{self, KernelKind, KernelRequest, Points, Rule, Side};
use crate::trajectory::Run;

/// One benchmark result.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    /// What was timed.
    pub name: String,
    /// Row points P.
    pub points: usize,
    /// Training points M.
    pub train: usize,
    /// Outputs K.
    pub outputs: usize,
    /// Parameters W.
    pub params: usize,
    /// The step timed.
    pub step: usize,
    /// Repetitions.
    pub repeat: usize,
    /// Fastest repetition, seconds.
    pub seconds_min: f64,
    /// Median repetition, seconds.
    pub seconds_median: f64,
    /// Gradient evaluations per point (mean) in the timed step.
    pub evaluations: f64,
    /// Max |kernel machine − network| over the step (ntk: not applicable, NaN).
    pub step_max_abs_error: f64,
}

/// Times one NTK step and one EPK step (`auto:tol`) at `step` on the run's test points.
pub fn kernel_steps(run: &Run, step: usize, repeat: usize, tol: f64) -> Result<Vec<BenchResult>> {
    let n = run.manifest.steps;
    if step >= n {
        return Err(Error::Config(format!("--step {step}: the run has steps 0..{n}")));
    }
    if repeat == 0 {
        return Err(Error::Config("--repeat must be >= 1".into()));
    }
    let states = run.load_all()?;
    let pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let mut out = Vec::new();
    let cases = [
        ("ntk_step", KernelRequest { kind: KernelKind::Ntk, rule: Rule::Gauss(1), side: Side::Test, ntk_step: Some(step), per_step: false, steps: Some((step, step + 1)) }),
        (
            "epk_step",
            KernelRequest { kind: KernelKind::Epk, rule: Rule::Auto(tol), side: Side::Test, ntk_step: None, per_step: false, steps: Some((step, step + 1)) },
        ),
        ("dpk_step", KernelRequest { kind: KernelKind::Dpk, rule: Rule::Gauss(1), side: Side::Test, ntk_step: None, per_step: false, steps: Some((step, step + 1)) }),
    ];
    for (name, req) in cases {
        let mut times = Vec::with_capacity(repeat);
        let mut last = None;
        for _ in 0..repeat {
            let t0 = Instant::now();
            let o = kernel::compute(&run.manifest, &run.dataset, &states, &pts, &req, u64::MAX, &|_, _| {})?;
            times.push(t0.elapsed().as_secs_f64());
            last = Some(o);
        }
        times.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
        let o = last.expect("repeat >= 1");
        out.push(BenchResult {
            name: name.into(),
            points: o.p,
            train: o.m,
            outputs: o.k,
            params: run.manifest.num_params,
            step,
            repeat,
            seconds_min: times[0],
            seconds_median: times[times.len() / 2],
            evaluations: o.mean_evaluations(),
            step_max_abs_error: if req.kind == KernelKind::Ntk { f64::NAN } else { o.max_abs_error() },
        });
    }
    Ok(out)
}

/// One EPK step (`rule`) on the run's test points through the generic autodiff Gram path and
/// through the structured CNN path, with the speed-up (for CNN runs).
#[derive(Clone, Debug, Serialize)]
pub struct ConvCompare {
    /// Always `"conv_paths"`.
    pub name: String,
    /// The quadrature rule of the EPK step.
    pub rule: String,
    /// Row points P, training points M, outputs K, parameters W.
    pub points: usize,
    /// Training points M.
    pub train: usize,
    /// Outputs K.
    pub outputs: usize,
    /// Parameters W.
    pub params: usize,
    /// The step timed.
    pub step: usize,
    /// Repetitions.
    pub repeat: usize,
    /// Fastest repetition on the generic path, seconds.
    pub generic_seconds_min: f64,
    /// Fastest repetition on the structured path, seconds.
    pub fast_seconds_min: f64,
    /// `generic_seconds_min / fast_seconds_min`.
    pub speedup: f64,
    /// max |G_fast − G_generic| / max |G_generic| over the step's Gram.
    pub gram_rel_diff: f64,
}

/// Times one EPK step with `rule` at `step` through both Gram paths of a CNN run.
pub fn conv_paths(run: &Run, step: usize, repeat: usize, rule: Rule) -> Result<ConvCompare> {
    let n = run.manifest.steps;
    if step >= n {
        return Err(Error::Config(format!("--step {step}: the run has steps 0..{n}")));
    }
    if repeat == 0 {
        return Err(Error::Config("--repeat must be >= 1".into()));
    }
    if !matches!(run.manifest.architecture.body, crate::model::Body::Cnn { .. }) {
        return Err(Error::Config("--conv-compare needs a CNN run".into()));
    }
    let states = run.load_all()?;
    let pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let req = KernelRequest { kind: KernelKind::Epk, rule, side: Side::Test, ntk_step: None, per_step: false, steps: Some((step, step + 1)) };
    let mut best = [f64::INFINITY; 2];
    let mut grams: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for (j, path) in [kernel::GramPath::Generic, kernel::GramPath::Fast].into_iter().enumerate() {
        for _ in 0..repeat {
            let t0 = Instant::now();
            let o = kernel::compute_with_path(&run.manifest, &run.dataset, &states, &pts, &req, u64::MAX, &|_, _| {}, path)?;
            best[j] = best[j].min(t0.elapsed().as_secs_f64());
            grams[j] = o.gram;
        }
    }
    let scale = grams[0].iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let diff = grams[0].iter().zip(&grams[1]).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
    Ok(ConvCompare {
        name: "conv_paths".into(),
        rule: rule.to_string(),
        points: pts.len(),
        train: run.dataset.n_train(),
        outputs: run.manifest.architecture.outputs(),
        params: run.manifest.num_params,
        step,
        repeat,
        generic_seconds_min: best[0],
        fast_seconds_min: best[1],
        speedup: best[0] / best[1],
        gram_rel_diff: diff / scale,
    })
}
