//! Reading a kernel output directory (the files of [`crate::kernel::output::write`]) for
//! [`Gram::open`](super::Gram::open): the arrays of `gram.safetensors`, checked against the run.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::SafeFile;
use crate::kernel::{KernelForm, KernelKind, Layout, Rule, Side};
use crate::trajectory::Run;

/// The arrays and metadata of a kernel output directory, typed.
pub(super) struct KernelFiles {
    /// Which blocks `gram` holds.
    pub(super) layout: Layout,
    /// `Σ_s K_s` in `layout`. # Shapes `[P, M, K, K]`, `[P, M, K]` or `[P, M]`.
    pub(super) gram: Vec<f64>,
    /// `a_{i,s}`. # Shapes `[N, M, K]`.
    pub(super) a: Vec<f64>,
    /// `b = f_{w_0}(x)`. # Shapes `[P, K]`.
    pub(super) bias: Vec<f64>,
    /// Row points. # Shapes `[P, d]`.
    pub(super) points: Vec<f64>,
    /// Self-kernel when present. # Shapes `[P, K, K]`.
    pub(super) diag: Option<Vec<f64>>,
    /// Per-step Grams (each in `layout`) when present. # Shapes `[S, …]`.
    pub(super) gram_steps: Option<Vec<f64>>,
    /// Kernel kind.
    pub(super) kind: KernelKind,
    /// Side of the rows.
    pub(super) side: Side,
    /// The quadrature of integrated rows; `None` for rows taken at `t = 0`.
    pub(super) rule: Option<Rule>,
    /// Row points P.
    pub(super) p: usize,
    /// Training points M.
    pub(super) m: usize,
    /// Outputs K.
    pub(super) k: usize,
    /// Input dimension d.
    pub(super) d: usize,
    /// The steps whose Grams are summed (and stored in `gram_steps`), ascending.
    pub(super) steps: Vec<usize>,
    /// The weight-decay term when present. # Shapes `[P, K]`.
    pub(super) reg: Option<Vec<f64>>,
    /// The rounding term the per-point split does not carry, when present. # Shapes `[P, K]`.
    pub(super) rounding: Option<Vec<f64>>,
    /// Kernel form.
    pub(super) form: KernelForm,
}

impl KernelFiles {
    /// Reads `DIR/gram.safetensors` and checks it belongs to `run`.
    pub(super) fn open(dir: &Path, run: &Run) -> Result<Self> {
        let path = dir.join("gram.safetensors");
        let f = SafeFile::open(&path)?;
        let meta = f.metadata();
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
        let optional = |name: &str| -> Result<Option<Vec<f64>>> {
            Ok(if names.iter().any(|x| x == name) { Some(f.f64(name, Some(&[p, k]))?.1) } else { None })
        };
        let (reg, rounding) = (optional("reg")?, optional("rounding")?);
        // Side and form are written with their serde names.
        let named = |key: &str, default: &str| serde_json::Value::String(meta.get(key).cloned().unwrap_or_else(|| default.into()));
        let side: Side = serde_json::from_value(named("side", "")).map_err(|_| unknown("side", &get("side")))?;
        let form: KernelForm = serde_json::from_value(named("form", "gradient")).map_err(|_| unknown("form", &get("form")))?;
        let quadrature = get("quadrature");
        let rule = if quadrature.starts_with("none") { None } else { Some(quadrature.parse().map_err(|_| unknown("quadrature", &quadrature))?) };
        Ok(KernelFiles { layout, gram, a, bias, points, diag, gram_steps, kind, side, rule, p, m, k, d, steps, reg, rounding, form })
    }
}
