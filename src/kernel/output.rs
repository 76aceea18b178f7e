//! The Gram file: writing a kernel computation to disk and reading it back, and the format's
//! version (the interchange contract of `pathkernel kernel`; one module owns all three).
//!
//! ```text
//! OUT/gram.safetensors   gram [P, M, K, K] f64 (Σ_s K_s; ntk: at step S; `diag` layout [P, M, K],
//!                        `trace` [P, M]; metadata `layout`, `rows` (test, train, grid:N,
//!                        class-means, inputs), `format_version`), a [N, M, K], bias [P, K],
//!                        points [P, d], diag [P, K, K] (K(x_p, x_p) on the rows' side; ntk/dpk/epk);
//!                        gram_steps [S, P, M, K, K] with --per-step, steps [S] (the steps summed),
//!                        reg [P, K] (weight-decay term), rounding [P, K] (what the per-point split
//!                        does not carry), carried [P, K] (a window's carried-in term); all
//!                        included in the machine; metadata `form`
//! OUT/predictions.parquet point, class, network, kernel_machine, abs_error (+ single_machine, reg_term)
//! OUT/exactness.json     max_abs_error, mean_abs_error, quadrature, evaluations per step, steps, seconds, …
//! OUT/steps.parquet      per step: predicted vs actual change of the output (ExPLAIND-style)
//! OUT/layers.parquet     with --per-layer: step, layer, point, class, change (each parameter
//!                        layer's share of the machine's change; step −1: over all steps), and
//!                        in gram.safetensors layer_gram [L, …gram], layer_change [S, L, P, K],
//!                        metadata `layers` (the names, JSON)
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::layout::Layout;
use super::quadrature::Rule;
use super::rows::Rows;
use super::types::{
    max_abs, max_abs_diff, KernelForm, KernelKind, KernelOutput, LayerShares, Points, Side,
    StepRecord,
};
use crate::error::{Error, Result};
use crate::io::{self, Column, NamedArray, SafeFile, Table};
use crate::trajectory::Run;

/// The version of the Gram file this module writes (`format_version` in the metadata of
/// `gram.safetensors`). Version 3 records the rows; a file without the key is version 2 (rows
/// then taken from the points: train or test when they equal that set, else inputs).
pub(crate) const VERSION: u32 = 3;

/// The oldest version [`read`] opens.
const OLDEST: u32 = 2;

/// Summary written to `exactness.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Exactness {
    /// Kernel kind.
    pub kind: KernelKind,
    /// Side of the row points.
    pub side: Side,
    /// Quadrature rule of integrated rows; `None` (written `none (t = 0)`) for rows taken at
    /// `t = 0`.
    #[serde(with = "quadrature_text")]
    pub quadrature: Option<Rule>,
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
    pub form: KernelForm,
    /// Whether that form is a symmetric kernel (false for momentum and Adam).
    #[serde(default = "default_true")]
    pub symmetric_kernel: bool,
    /// The kernel's formula (the EPK's in the optimizer's form; [`KernelKind::formula`]).
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
    /// max |carried-in term| of a window computed with `carry_in` (included in the machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_term_max_abs: Option<f64>,
    /// Which blocks `gram.safetensors` holds (`full` `[P, M, K, K]`, `diag` `[P, M, K]`,
    /// `trace` `[P, M]`).
    #[serde(default)]
    pub layout: Layout,
}

fn default_form() -> KernelForm {
    KernelForm::Gradient
}

/// The quadrature as text: the rule, or `none (t = 0)`.
fn quadrature_name(q: Option<Rule>) -> String {
    q.map_or_else(|| "none (t = 0)".to_string(), |r| r.to_string())
}

/// Serde of [`Exactness::quadrature`] through [`quadrature_name`].
mod quadrature_text {
    use super::{Deserialize, Deserializer, Rule, Serializer};

    pub(crate) fn serialize<S: Serializer>(q: &Option<Rule>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::quadrature_name(*q))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Rule>, D::Error> {
        let s = String::deserialize(d)?;
        if s.starts_with("none") {
            return Ok(None);
        }
        s.parse().map(Some).map_err(|e: crate::Error| serde::de::Error::custom(e.to_string()))
    }
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
    /// The quadrature as the files write it: the rule, or `none (t = 0)`.
    pub(crate) fn quadrature_name(&self) -> String {
        quadrature_name(self.quadrature)
    }

    /// Builds the summary of an output.
    pub fn of(o: &KernelOutput, run_id: &str) -> Self {
        Exactness {
            kind: o.kind,
            side: o.side,
            quadrature: o.integrated.then_some(o.rule),
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
            form: o.form,
            symmetric_kernel: o.form.symmetric(),
            formula: o.kind.formula(o.form).to_string(),
            decomposition_residual: o.decomposition_residual,
            reg_term_max_abs: o.reg.as_deref().map(max_abs),
            rounding_term_max_abs: o.rounding.as_deref().map(max_abs),
            carried_term_max_abs: o.carried.as_deref().map(max_abs),
            layout: o.layout,
        }
    }
}

/// Writes all output files into `dir` (which must exist), recording that the rows are `rows`.
///
/// # Shapes
/// `points.x` `[P, d]`, the output's rows.
pub fn write(dir: &Path, o: &KernelOutput, points: &Points, rows: Rows, run_id: &str) -> Result<Exactness> {
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
    if let Some(c) = &o.carried {
        arrays.push(NamedArray::f64("carried", vec![p, k], c.clone()));
    }
    let mut meta = HashMap::new();
    if let Some(l) = &o.layers {
        let nl = l.names.len();
        let mut shape = vec![nl];
        shape.extend(o.layout.shape(p, m, k));
        arrays.push(NamedArray::f64("layer_gram", shape, l.gram.concat()));
        arrays.push(NamedArray::f64(
            "layer_change",
            vec![o.steps.len(), nl, p, k],
            l.change.clone(),
        ));
        meta.insert(
            "layers".to_string(),
            serde_json::to_string(&l.names).map_err(|e| Error::Numerical(e.to_string()))?,
        );
    }
    meta.insert("kind".to_string(), o.kind.to_string());
    meta.insert("quadrature".to_string(), quadrature_name(o.integrated.then_some(o.rule)));
    meta.insert("side".to_string(), o.side.to_string());
    meta.insert("run_id".to_string(), run_id.to_string());
    meta.insert("form".to_string(), o.form.to_string());
    meta.insert("layout".to_string(), o.layout.to_string());
    meta.insert("rows".to_string(), rows.to_string());
    meta.insert("format_version".to_string(), VERSION.to_string());
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
    if let Some(l) = &o.layers {
        layer_table(o, l).write_parquet(&dir.join("layers.parquet"))?;
    }
    let ex = Exactness::of(o, run_id);
    io::write_json(&dir.join("exactness.json"), &ex)?;
    Ok(ex)
}

/// `layers.parquet`: each parameter layer's share of the machine's predicted change, per step,
/// point and class (`step, layer, point, class, change`), and per layer and point/class over
/// all steps (`step` = −1).
fn layer_table(o: &KernelOutput, l: &LayerShares) -> Table {
    let (p, k, nl) = (o.p, o.k, l.names.len());
    let n = (o.steps.len() + 1) * nl * p * k;
    let (mut step, mut layer, mut point, mut class, mut change) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut total = vec![0.0; nl * p * k];
    for (si, &s) in o.steps.iter().enumerate() {
        for (li, name) in l.names.iter().enumerate() {
            for idx in 0..p * k {
                let v = l.change[(si * nl + li) * p * k + idx];
                total[li * p * k + idx] += v;
                step.push(s as i64);
                layer.push(name.clone());
                point.push((idx / k) as i64);
                class.push((idx % k) as i64);
                change.push(v);
            }
        }
    }
    for (li, name) in l.names.iter().enumerate() {
        for idx in 0..p * k {
            step.push(-1);
            layer.push(name.clone());
            point.push((idx / k) as i64);
            class.push((idx % k) as i64);
            change.push(total[li * p * k + idx]);
        }
    }
    Table::new()
        .with("step", Column::I64(step))
        .with("layer", Column::Str(layer))
        .with("point", Column::I64(point))
        .with("class", Column::I64(class))
        .with("change", Column::F64(change))
}

/// A kernel output directory read back ([`read`]).
#[derive(Clone, Debug)]
pub struct GramFile {
    /// The computation as written (no contraction timings; `columns` is `None`).
    pub out: KernelOutput,
    /// The row points `[P, d]`.
    pub points: Points,
    /// The rows the Gram is on: as recorded (version 3), else derived from the points.
    pub rows: Rows,
    /// `exactness.json`.
    pub exactness: Exactness,
    /// The file's format version.
    pub version: u32,
}

/// Reads a kernel output directory written by `write` (this version or an older one down to
/// version 2) and checks it belongs to `run`.
///
/// Errors: a directory of another run, a version this build cannot read (one line saying
/// which), missing or malformed files.
pub fn read(dir: &Path, run: &Run) -> Result<GramFile> {
    let path = dir.join("gram.safetensors");
    let f = SafeFile::open(&path)?;
    let meta = f.metadata();
    let version: u32 = match meta.get("format_version") {
        None => OLDEST,
        Some(v) => v.parse().map_err(|_| Error::format(&path, format!("format_version `{v}` is not a number")))?,
    };
    if !(OLDEST..=VERSION).contains(&version) {
        return Err(Error::format(&path, format!("Gram file version {version}; this build of pathkernel reads versions {OLDEST} to {VERSION}")));
    }
    if meta.get("run_id") != Some(&run.manifest.run_id) {
        return Err(Error::format(&path, format!("computed for run {:?}, not for {} ({})", meta.get("run_id"), run.manifest.run_id, run.dir.display())));
    }
    let shape = f.shape("gram")?;
    let layout: Layout = meta.get("layout").map_or(Ok(Layout::Full), |l| l.parse()).map_err(|_| Error::format(&path, format!("unknown layout {:?}", meta.get("layout"))))?;
    let k = run.dataset.num_outputs;
    let (p, m) = match (layout, &shape[..]) {
        (Layout::Full, &[p, m, k1, k2]) if k1 == k && k2 == k => (p, m),
        (Layout::Diag, &[p, m, k1]) if k1 == k => (p, m),
        (Layout::Trace, &[p, m]) => (p, m),
        _ => return Err(Error::format(&path, format!("gram has shape {shape:?}, expected {} layout with K = {k}", layout))),
    };
    if m != run.dataset.n_train() {
        return Err(Error::format(&path, format!("gram shape {shape:?} does not match the run (M = {}, K = {})", run.dataset.n_train(), run.dataset.num_outputs)));
    }
    let d = run.dataset.dim;
    let n = run.manifest.steps;
    let per_pair = layout.per_pair(k);
    let gram = f.f64("gram", Some(&layout.shape(p, m, k)))?.1;
    let a = f.f64("a", Some(&[n, m, k]))?.1;
    let bias = f.f64("bias", Some(&[p, k]))?.1;
    let points = f.f64("points", Some(&[p, d]))?.1;
    let names = f.names();
    let diag = if names.iter().any(|x| x == "diag") { Some(f.f64("diag", Some(&[p, k, k]))?.1) } else { None };
    let gram_steps = if names.iter().any(|x| x == "gram_steps") {
        let s = f.shape("gram_steps")?;
        let mut want = vec![s.first().copied().unwrap_or(0)];
        want.extend(layout.shape(p, m, k));
        Some(f.f64("gram_steps", Some(&want))?.1)
    } else {
        None
    };
    for (name, v) in [("gram", &gram), ("a", &a), ("bias", &bias), ("points", &points)] {
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::format(&path, format!("{name}[{i}] is not finite")));
        }
    }
    let get = |key: &str| meta.get(key).cloned().unwrap_or_default();
    let unknown = |what: &str, v: &str| Error::format(&path, format!("unknown {what} `{v}`"));
    let kind: KernelKind = get("kind").parse().map_err(|_| unknown("kind", &get("kind")))?;
    // A path kernel sums steps 0..N−1; the NTK is taken at one state w_S, S ≤ N.
    let last = if kind == KernelKind::Ntk { n } else { n.max(1) - 1 };
    let steps: Vec<usize> = if names.iter().any(|x| x == "steps") {
        let s = f.shape("steps")?;
        let v = f.i64("steps", Some(&[s[0]]))?.1;
        if v.iter().any(|&x| x < 0 || x as usize > last) {
            return Err(Error::format(&path, "steps holds a step outside the run"));
        }
        v.into_iter().map(|x| x as usize).collect()
    } else {
        (0..gram_steps.as_ref().map_or(n, |g| g.len() / (p * m * per_pair).max(1))).collect()
    };
    if let Some(g) = &gram_steps {
        if g.len() != steps.len() * p * m * per_pair {
            return Err(Error::format(&path, format!("gram_steps holds {} steps but steps lists {}", g.len() / (p * m * per_pair).max(1), steps.len())));
        }
    }
    let layers = read_layers(&f, &path, (p, m, k), layout, steps.len())?;
    let optional = |name: &str| -> Result<Option<Vec<f64>>> {
        Ok(if names.iter().any(|x| x == name) {
            Some(f.f64(name, Some(&[p, k]))?.1)
        } else {
            None
        })
    };
    let (reg, rounding, carried) = (optional("reg")?, optional("rounding")?, optional("carried")?);
    // Side and form are written with their serde names.
    let named = |key: &str, default: &str| serde_json::Value::String(meta.get(key).cloned().unwrap_or_else(|| default.into()));
    let side: Side = serde_json::from_value(named("side", "")).map_err(|_| unknown("side", &get("side")))?;
    let form: KernelForm = serde_json::from_value(named("form", "gradient")).map_err(|_| unknown("form", &get("form")))?;
    let quadrature = get("quadrature");
    let rule: Option<Rule> = if quadrature.starts_with("none") { None } else { Some(quadrature.parse().map_err(|_| unknown("quadrature", &quadrature))?) };
    let points = Points { x: points, dim: d };
    let rows = match meta.get("rows") {
        Some(r) => r.parse().map_err(|_| unknown("rows", r))?,
        None => Rows::of_points(&points, run),
    };
    if let Rows::Grid(g) = rows {
        if g * g != p {
            return Err(Error::format(&path, format!("rows grid:{g} but {p} row points")));
        }
    }

    let ex_path = dir.join("exactness.json");
    let exactness: Exactness = serde_json::from_slice(&io::read_file(&ex_path)?).map_err(|e| Error::format(&ex_path, e.to_string()))?;
    let pred_path = dir.join("predictions.parquet");
    let pred = Table::read_parquet(&pred_path)?;
    let col = |name: &str| -> Result<Vec<f64>> { pred.f64(name).map(<[f64]>::to_vec).ok_or_else(|| Error::format(&pred_path, format!("no column `{name}`"))) };
    let (network, machine) = (col("network")?, col("kernel_machine")?);
    if network.len() != p * k || machine.len() != p * k {
        return Err(Error::format(&pred_path, format!("{} rows, expected P·K = {}", network.len(), p * k)));
    }
    let steps_path = dir.join("steps.parquet");
    let records = steps_records(&Table::read_parquet(&steps_path)?).map_err(|name| Error::format(&steps_path, format!("no column `{name}`")))?;
    let single_machine = pred.f64("single_machine").map(<[f64]>::to_vec);
    let out = KernelOutput {
        kind,
        rule: rule.unwrap_or(Rule::Gauss(1)),
        side,
        integrated: rule.is_some(),
        p,
        m,
        k,
        steps,
        layout,
        contraction: Default::default(),
        gram,
        per_step: gram_steps,
        diag,
        a,
        bias,
        network,
        machine,
        single_machine,
        records,
        seconds: exactness.seconds,
        form,
        reg,
        decomposition_residual: exactness.decomposition_residual,
        rounding,
        carried,
        columns: None,
        layers,
    };
    Ok(GramFile { out, points, rows, exactness, version })
}

/// The per-layer decomposition in a Gram file, if it holds one (`layer_gram`, `layer_change`
/// and the `layers` names).
fn read_layers(f: &SafeFile, path: &Path, (p, m, k): (usize, usize, usize), layout: Layout, steps: usize) -> Result<Option<LayerShares>> {
    if !f.names().iter().any(|x| x == "layer_gram") {
        return Ok(None);
    }
    let names: Vec<String> = serde_json::from_str(f.metadata().get("layers").map_or("", |s| s.as_str())).map_err(|_| Error::format(path, "layer_gram without its `layers` names"))?;
    let nl = names.len();
    let mut want = vec![nl];
    want.extend(layout.shape(p, m, k));
    let lg = f.f64("layer_gram", Some(&want))?.1;
    let change = f.f64("layer_change", Some(&[steps, nl, p, k]))?.1;
    let gram = if nl == 0 { Vec::new() } else { lg.chunks_exact(lg.len() / nl).map(<[f64]>::to_vec).collect() };
    Ok(Some(LayerShares { names, gram, change }))
}

/// The per-step records of a `steps.parquet` table; `Err(name)` names a missing column.
fn steps_records(t: &Table) -> std::result::Result<Vec<StepRecord>, &'static str> {
    let f = |name: &'static str| t.f64(name).map(<[f64]>::to_vec).ok_or(name);
    let i = |name: &'static str| t.i64(name).map(<[i64]>::to_vec).ok_or(name);
    let (step, max_err, mean_err, change) = (i("step")?, f("max_abs_error")?, f("mean_abs_error")?, f("max_abs_change")?);
    let (mean_ev, max_ev, jvp) = (f("mean_evaluations")?, i("max_evaluations")?, f("mean_jvp_evaluations")?);
    let (pieces, unconv, cosine) = (f("mean_pieces")?, i("unconverged_pieces")?, f("dpk_cosine_error")?);
    Ok((0..t.rows())
        .map(|r| StepRecord {
            step: step[r] as usize,
            max_abs_error: max_err[r],
            mean_abs_error: mean_err[r],
            max_abs_change: change[r],
            mean_evaluations: mean_ev[r],
            max_evaluations: max_ev[r] as usize,
            mean_jvp_evaluations: jvp[r],
            mean_pieces: pieces[r],
            unconverged_pieces: unconv[r] as usize,
            dpk_cosine_error: cosine[r],
        })
        .collect())
}
