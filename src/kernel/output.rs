//! Writing a kernel computation to disk (the interchange contract of `pathkernel kernel`).
//!
//! ```text
//! OUT/gram.safetensors   gram [P, M, K, K] f64 (Σ_s K_s; ntk: at step S; `diag` layout [P, M, K],
//!                        `trace` [P, M]; metadata `layout`), a [N, M, K], bias [P, K],
//!                        points [P, d], diag [P, K, K] (K(x_p, x_p) on the rows' side; ntk/dpk/epk);
//!                        gram_steps [S, P, M, K, K] with --per-step, steps [S] (the steps summed),
//!                        reg [P, K] (weight-decay term), rounding [P, K] (what the per-point split
//!                        does not carry); both included in the machine; metadata `form`
//! OUT/predictions.parquet point, class, network, kernel_machine, abs_error (+ single_machine, reg_term)
//! OUT/exactness.json     max_abs_error, mean_abs_error, quadrature, evaluations per step, steps, seconds, …
//! OUT/steps.parquet      per step: predicted vs actual change of the output (ExPLAIND-style)
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::layout::Layout;
use super::quadrature::Rule;
use super::types::{max_abs, max_abs_diff, KernelOutput, Points};
use crate::error::Result;
use crate::io::{self, Column, NamedArray, Table};

/// Summary written to `exactness.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Exactness {
    /// Kernel kind.
    pub kind: String,
    /// Side of the row points.
    pub side: String,
    /// Quadrature rule.
    pub quadrature: String,
    /// Row points P, training points M, outputs K.
    pub shape: [usize; 3],
    /// Number of steps summed.
    pub steps: usize,
    /// max |kernel machine − network| (ensemble form).
    pub max_abs_error: f64,
    /// mean |kernel machine − network|.
    pub mean_abs_error: f64,
    /// max |single kernel machine − network| (Theorem 3.7), when a_i is constant over steps.
    pub single_machine_max_abs_error: Option<f64>,
    /// Gradient evaluations per point and step: mean over steps of the per-step mean, and max.
    pub evaluations_per_step: EvalStats,
    /// Pieces (auto rule) that did not reach the tolerance.
    pub unconverged_pieces: usize,
    /// The auto rule's requested tolerance on the kernel machine's output, if any.
    pub tolerance: Option<f64>,
    /// Whether `max_abs_error <= tolerance`. The rule's per-piece test cannot go below the
    /// rounding of `f(b) − f(a)` (about 8ε·|f|), so far from the data, where |f| is large, the
    /// achieved error can exceed a very small tolerance; this field says so.
    pub tolerance_met: Option<bool>,
    /// Wall-clock seconds of the kernel computation.
    pub seconds: f64,
    /// Run id of the trajectory.
    pub run_id: String,
    /// The kernel form the run's optimizer admits (`gradient`, `gradient-with-decay`,
    /// `momentum`, `preconditioned`).
    #[serde(default = "default_form")]
    pub form: String,
    /// Whether that form is a symmetric kernel (false for momentum and Adam).
    #[serde(default = "default_true")]
    pub symmetric_kernel: bool,
    /// The form's formula.
    #[serde(default)]
    pub formula: String,
    /// How well the replayed optimizer reproduces the recorded weight changes (relative, max over
    /// steps), for momentum/Adam/weight-decay runs.
    #[serde(default)]
    pub decomposition_residual: Option<f64>,
    /// max |R(x)|, the weight-decay term that belongs to no training point, when present.
    #[serde(default)]
    pub reg_term_max_abs: Option<f64>,
    /// max |rounding term|: the part of the recorded updates the per-point split does not carry
    /// (included in the machine; large only where Adam amplifies gradient rounding by 1/eps).
    #[serde(default)]
    pub rounding_term_max_abs: Option<f64>,
    /// Which blocks `gram.safetensors` holds (`full` `[P, M, K, K]`, `diag` `[P, M, K]`,
    /// `trace` `[P, M]`).
    #[serde(default)]
    pub layout: Layout,
}

fn default_form() -> String {
    "gradient".into()
}

fn default_true() -> bool {
    true
}

/// Mean and max evaluations.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalStats {
    /// Mean per point and step.
    pub mean: f64,
    /// Max for one point in one step.
    pub max: usize,
    /// Mean forward-mode evaluations (f and df/dt only) per point and step spent choosing nodes.
    pub mean_forward_mode: f64,
}

impl Exactness {
    /// Builds the summary of an output.
    pub fn of(o: &KernelOutput, run_id: &str) -> Self {
        Exactness {
            kind: o.kind.to_string(),
            side: format!("{:?}", o.side).to_lowercase(),
            quadrature: if o.integrated { o.rule.to_string() } else { "none (t = 0)".to_string() },
            shape: [o.p, o.m, o.k],
            steps: o.steps.len(),
            max_abs_error: o.max_abs_error(),
            mean_abs_error: o.mean_abs_error(),
            single_machine_max_abs_error: o
                .single_machine
                .as_ref()
                .map(|s| max_abs_diff(s, &o.network)),
            evaluations_per_step: EvalStats {
                mean: o.mean_evaluations(),
                max: o.max_evaluations(),
                mean_forward_mode: o.records.iter().map(|r| r.mean_jvp_evaluations).sum::<f64>() / o.records.len().max(1) as f64,
            },
            unconverged_pieces: o.records.iter().map(|r| r.unconverged_pieces).sum(),
            tolerance: match o.rule {
                Rule::Auto(t) if o.integrated => Some(t),
                _ => None,
            },
            tolerance_met: match o.rule {
                Rule::Auto(t) if o.integrated => Some(o.max_abs_error() <= t),
                _ => None,
            },
            seconds: o.seconds,
            run_id: run_id.to_string(),
            form: o.form.to_string(),
            symmetric_kernel: o.form.symmetric(),
            formula: o.form.formula().to_string(),
            decomposition_residual: o.decomposition_residual,
            reg_term_max_abs: o.reg.as_deref().map(max_abs),
            rounding_term_max_abs: o.rounding.as_deref().map(max_abs),
            layout: o.layout,
        }
    }
}

/// Writes all output files into `dir` (which must exist).
pub fn write(dir: &Path, o: &KernelOutput, points: &Points, run_id: &str) -> Result<Exactness> {
    let (p, m, k) = (o.p, o.m, o.k);
    let n_a = o.a.len() / (m * k).max(1);
    let mut arrays = vec![
        NamedArray::f64("gram", o.layout.shape(p, m, k), o.gram.clone()),
        NamedArray::f64("a", vec![n_a, m, k], o.a.clone()),
        NamedArray::f64("bias", vec![p, k], o.bias.clone()),
        NamedArray::f64("points", vec![p, points.dim], points.x.clone()),
    ];
    if let Some(dg) = &o.diag {
        arrays.push(NamedArray::f64("diag", vec![p, k, k], dg.clone()));
    }
    if let Some(ps) = &o.per_step {
        let mut shape = vec![o.steps.len()];
        shape.extend(o.layout.shape(p, m, k));
        arrays.push(NamedArray::f64("gram_steps", shape, ps.clone()));
    }
    arrays.push(NamedArray::i64("steps", vec![o.steps.len()], o.steps.iter().map(|&s| s as i64).collect()));
    if let Some(r) = &o.reg {
        arrays.push(NamedArray::f64("reg", vec![p, k], r.clone()));
    }
    if let Some(r) = &o.rounding {
        arrays.push(NamedArray::f64("rounding", vec![p, k], r.clone()));
    }
    let mut meta = HashMap::new();
    meta.insert("kind".to_string(), o.kind.to_string());
    meta.insert("quadrature".to_string(), if o.integrated { o.rule.to_string() } else { "none (t = 0)".to_string() });
    meta.insert("side".to_string(), format!("{:?}", o.side).to_lowercase());
    meta.insert("run_id".to_string(), run_id.to_string());
    meta.insert("form".to_string(), o.form.to_string());
    meta.insert("layout".to_string(), o.layout.to_string());
    io::write_safetensors(&dir.join("gram.safetensors"), &arrays, Some(meta))?;

    let mut point = Vec::with_capacity(p * k);
    let mut class = Vec::with_capacity(p * k);
    let mut err = Vec::with_capacity(p * k);
    for pi in 0..p {
        for c in 0..k {
            point.push(pi as i64);
            class.push(c as i64);
            err.push((o.machine[pi * k + c] - o.network[pi * k + c]).abs());
        }
    }
    let mut t = Table::new()
        .with("point", Column::I64(point))
        .with("class", Column::I64(class))
        .with("network", Column::F64(o.network.clone()))
        .with("kernel_machine", Column::F64(o.machine.clone()))
        .with("abs_error", Column::F64(err));
    if let Some(s) = &o.single_machine {
        t = t.with("single_machine", Column::F64(s.clone()));
    }
    if let Some(r) = &o.reg {
        t = t.with("reg_term", Column::F64(r.clone()));
    }
    t.write_parquet(&dir.join("predictions.parquet"))?;

    let r = &o.records;
    Table::new()
        .with("step", Column::I64(r.iter().map(|x| x.step as i64).collect()))
        .with("max_abs_error", Column::F64(r.iter().map(|x| x.max_abs_error).collect()))
        .with("mean_abs_error", Column::F64(r.iter().map(|x| x.mean_abs_error).collect()))
        .with("max_abs_change", Column::F64(r.iter().map(|x| x.max_abs_change).collect()))
        .with("mean_evaluations", Column::F64(r.iter().map(|x| x.mean_evaluations).collect()))
        .with("max_evaluations", Column::I64(r.iter().map(|x| x.max_evaluations as i64).collect()))
        .with("mean_jvp_evaluations", Column::F64(r.iter().map(|x| x.mean_jvp_evaluations).collect()))
        .with("mean_pieces", Column::F64(r.iter().map(|x| x.mean_pieces).collect()))
        .with("unconverged_pieces", Column::I64(r.iter().map(|x| x.unconverged_pieces as i64).collect()))
        .with("dpk_cosine_error", Column::F64(r.iter().map(|x| x.dpk_cosine_error).collect()))
        .write_parquet(&dir.join("steps.parquet"))?;
    let ex = Exactness::of(o, run_id);
    io::write_json(&dir.join("exactness.json"), &ex)?;
    Ok(ex)
}
