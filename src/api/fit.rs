//! Estimators that take [`Gram`] values: the per-class GP ([`GpModel`], EPK paper §4.2), the
//! one-vs-rest SVM refit of the kernel machine's weights ([`SvmModel`]), and attribution
//! ([`Gram::attribute`]). No flat indices: class blocks come from the Gram's views.

use std::fmt;

use faer::MatRef;

use super::gram::Gram;
use crate::analysis::{self, Stationarity, StationarityOptions};
use crate::attribution::{self, Attribution};
use crate::error::{Error, Result};
use crate::gp::{self, FittedGp, GpParams, McSoftmax, Posterior};
use crate::kernel::{KernelKind, Layout};
use crate::svm::{OvrSvm, SvmParams};

/// One GP per class on the class blocks of a train × train [`Gram`], regressing the network's
/// outputs minus the bias (`f_{w_N}(x_i) − f_{w_0}(x_i)`, the part the kernel machine carries).
///
/// # Example
///
/// ```
/// # use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 10\nn_test = 6\n\
/// #             [model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 10\n";
/// # let net = Trained::train_toml(toml, dir.path().join("run"))?;
/// let train = net.epk().train_side().layout(Layout::Diag).compute()?; // [M, M, K], symmetric
/// let gp = GpModel::fit(&train)?;                  // σ² and scale per class by marginal likelihood
/// println!("{gp}");                                // noise, scale, jitter, log p(y) per class
/// let fixed = GpModel::fit_with(&train, &GpParams::new().noise(1e-4))?; // fixed hyper-parameters
/// assert_eq!(fixed.fitted().n_train(), 30);
///
/// let rows = net.epk().layout(Layout::Diag).compute()?;
/// let post = gp.predict(&rows)?;                   // a GpPrediction at the 6 test rows
/// # Ok(()) }
/// ```
///
/// Errors: a Gram that is not train × train (`.train_side()`), a kernel form that is not
/// symmetric (momentum, Adam), a `trace` layout.
#[derive(Clone, Debug)]
pub struct GpModel {
    fitted: FittedGp,
    kind: KernelKind,
    run_id: String,
    asymmetry: Vec<f64>,
    with_bias: bool,
}

/// Relative asymmetry `max|K_ij − K_ji| / max|K|` of a square block (NaN propagates).
pub(crate) fn rel_asymmetry(b: MatRef<'_, f64>) -> f64 {
    let m = b.nrows();
    let mut scale = 0.0;
    let mut worst = 0.0;
    for i in 0..m {
        for j in 0..m {
            scale = crate::kernel::nan_max(scale, b[(i, j)].abs());
            if j > i {
                worst = crate::kernel::nan_max(worst, (b[(i, j)] - b[(j, i)]).abs());
            }
        }
    }
    if scale > 0.0 {
        worst / scale
    } else {
        worst
    }
}

impl GpModel {
    /// Fits with σ² and the output scale by marginal likelihood (the paper's setting).
    pub fn fit(train: &Gram) -> Result<GpModel> {
        GpModel::fit_with(train, &GpParams::new().fit_hyper(true))
    }

    /// Fits with the estimator parameters `params`.
    ///
    /// Errors: a Gram whose rows are not the training points, a non-symmetric kernel form, a
    /// `trace` Gram, and every error of [`GpParams::fit`].
    pub fn fit_with(train: &Gram, params: &GpParams) -> Result<GpModel> {
        let out = train.output();
        let targets: Vec<f64> = out.network.iter().zip(&out.bias).map(|(f, b)| f - b).collect();
        GpModel::fit_targets(train, params, &targets, true)
    }

    /// Fits to the targets `y` (`[M, K]`, e.g. one-hot labels, or the network's outputs minus
    /// the bias from another forward pass); `with_bias`: whether [`GpModel::predict`] adds the
    /// rows' bias `f_{w_0}(x)` back (true when `y` is an output minus the bias).
    ///
    /// Errors: as [`GpModel::fit_with`], and targets that are not `[M, K]`.
    pub fn fit_targets(train: &Gram, params: &GpParams, y: &[f64], with_bias: bool) -> Result<GpModel> {
        train.require_train_rows("a GP")?;
        let (m, _, k) = train.shape();
        let mut blocks = Vec::with_capacity(k * m * m);
        let mut asymmetry = Vec::with_capacity(k);
        for c in 0..k {
            asymmetry.push(rel_asymmetry(train.class_block(c)?));
            let b = train.symmetric_class_block(c)?;
            blocks.extend((0..m * m).map(|idx| b[(idx / m, idx % m)]));
        }
        if y.len() != m * k {
            return Err(Error::ShapeMismatch { what: "GP targets".into(), expected: vec![m, k], got: vec![y.len()] });
        }
        let fitted = params.fit(&blocks, y, m, k)?;
        Ok(GpModel { fitted, kind: train.kind(), run_id: train.run_id().to_string(), asymmetry, with_bias })
    }

    /// The logit posterior at the rows of `rows` (a Gram of the same kind and run, with a
    /// self-kernel); its mean includes the bias `f_{w_0}(x)` (unless fitted to targets without
    /// it, [`GpModel::fit_targets`]).
    pub fn predict(&self, rows: &Gram) -> Result<GpPrediction> {
        if rows.kind() != self.kind || rows.run_id() != self.run_id {
            return Err(Error::Config(format!("a GP fitted on the {} of run {} cannot predict from the {} of run {}", self.kind, self.run_id, rows.kind(), rows.run_id())));
        }
        let (p, m, k) = rows.shape();
        if m != self.fitted.n_train() {
            return Err(Error::ShapeMismatch { what: "row Gram columns vs GP training points".into(), expected: vec![self.fitted.n_train()], got: vec![m] });
        }
        let mut cross = Vec::with_capacity(k * p * m);
        let mut diag = Vec::with_capacity(k * p);
        for c in 0..k {
            let b = rows.class_block(c)?;
            cross.extend((0..p * m).map(|idx| b[(idx / m, idx % m)]));
            diag.extend(rows.self_kernel(c)?);
        }
        let mut posterior = self.fitted.predict(&cross, &diag, p)?;
        if self.with_bias {
            for (mv, b) in posterior.mean.iter_mut().zip(&rows.output().bias) {
                *mv += b;
            }
        }
        Ok(GpPrediction { posterior })
    }

    /// The fitted per-class GP (noise, scale, jitter, log marginal likelihood, `α`).
    pub fn fitted(&self) -> &FittedGp {
        &self.fitted
    }
    /// Relative asymmetry of each class block before symmetrisation. # Shapes `[K]`.
    pub fn asymmetry(&self) -> &[f64] {
        &self.asymmetry
    }
}

impl fmt::Display for GpModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.fitted;
        writeln!(f, "GP on the {} ({} training points), one per class:", self.kind, g.n_train())?;
        writeln!(f, "  class      noise σ²   scale s     jitter   log p(y)   asymmetry")?;
        let (n, s, j, l) = (g.noise(), g.output_scale(), g.jitter_used(), g.log_marginal_likelihood());
        for c in 0..g.n_classes() {
            write!(f, "  {c:5} {:10.3e} {:9.3e} {:10.1e} {:10.2} {:11.1e}", n[c], s[c], j[c], l[c], self.asymmetry[c])?;
            if c + 1 < g.n_classes() {
                writeln!(f)?;
            }
        }
        Ok(())
    }
}

/// A GP's logit posterior at some rows.
///
/// # Example
///
/// ```
/// # use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 10\nn_test = 6\n\
/// #             [model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 10\n";
/// # let net = Trained::train_toml(toml, dir.path().join("run"))?;
/// # let train = net.epk().train_side().layout(Layout::Diag).compute()?;
/// # let rows = net.epk().layout(Layout::Diag).compute()?;
/// let post = GpModel::fit(&train)?.predict(&rows)?;
/// assert_eq!((post.mean().nrows(), post.mean().ncols()), (6, 3)); // [P, K], bias included
/// assert!(post.posterior.var.iter().all(|&v| v >= 0.0));
/// let mc = post.mc_softmax(500, 7)?;               // 500 seeded draws per point
/// assert_eq!((mc.samples, mc.mean_prob.len(), mc.entropy.len()), (500, 18, 6));
/// # Ok(()) }
/// ```
///
/// # Shapes
/// `[P, K]` means and variances.
#[derive(Clone, Debug, PartialEq)]
pub struct GpPrediction {
    /// Means (bias included) and variances. # Shapes `[P, K]` each.
    pub posterior: Posterior,
}

impl GpPrediction {
    /// Posterior means of the logits (bias included). # Shapes `[P, K]`.
    pub fn mean(&self) -> MatRef<'_, f64> {
        MatRef::from_row_major_slice(&self.posterior.mean, self.posterior.p, self.posterior.k)
    }
    /// Posterior variances of the logits. # Shapes `[P, K]`.
    pub fn var(&self) -> MatRef<'_, f64> {
        MatRef::from_row_major_slice(&self.posterior.var, self.posterior.p, self.posterior.k)
    }
    /// Monte-Carlo softmax: `samples` seeded draws per point through the softmax
    /// ([`gp::mc_softmax`]).
    pub fn mc_softmax(&self, samples: usize, seed: u64) -> Result<McSoftmax> {
        gp::mc_softmax(&self.posterior, samples, seed)
    }
}

impl fmt::Display for GpPrediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (p, k) = (self.posterior.p, self.posterior.k);
        let sd: Vec<f64> = self.posterior.var.iter().map(|v| v.sqrt()).collect();
        let mean_sd = sd.iter().sum::<f64>() / sd.len().max(1) as f64;
        let max_sd = sd.iter().copied().fold(0.0, crate::kernel::nan_max);
        writeln!(f, "GP logit posterior at {p} points × {k} classes: posterior sd mean {mean_sd:.3e}, max {max_sd:.3e}")?;
        write!(f, "  point  arg-max  mean of arg-max ± sd")?;
        for q in 0..p.min(5) {
            let row = &self.posterior.mean[q * k..(q + 1) * k];
            let c = (0..k).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            write!(f, "\n  {q:5} {c:8}  {:9.4} ± {:.2e}", row[c], sd[q * k + c])?;
        }
        if p > 5 {
            write!(f, "\n  … ({} more)", p - 5)?;
        }
        Ok(())
    }
}

/// The one-vs-rest SVM refit of the kernel machine's weights on the class blocks of a
/// train × train [`Gram`] (labels: the training labels of the run the Gram came from).
///
/// # Example
///
/// ```
/// # use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 10\nn_test = 6\n\
/// #             [model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 10\n";
/// # let net = Trained::train_toml(toml, dir.path().join("run"))?;
/// let train = net.epk().train_side().layout(Layout::Diag).compute()?;
/// let rows = net.epk().layout(Layout::Diag).compute()?;
/// let svm = SvmModel::fit(&train, &SvmParams::default())?; // C = 1, tol 1e-3 (libsvm's)
/// let predicted = svm.predict(&rows)?;            // a class per test row
/// assert_eq!(predicted.len(), 6);
/// assert_eq!(svm.support().len(), 3);             // support vectors per class
///
/// let flipped: Vec<usize> = net.y_train()?.iter().map(|y| (y + 1) % 3).collect();
/// let other = SvmModel::fit_labels(&train, &flipped, &SvmParams::default())?; // labels of your own
/// # Ok(()) }
/// ```
///
/// Errors: as [`GpModel`].
#[derive(Clone, Debug)]
pub struct SvmModel {
    model: OvrSvm,
    kind: KernelKind,
    run_id: String,
    m: usize,
}

impl SvmModel {
    /// Fits one binary SVM per class on the symmetrised class block `c` with labels
    /// `y_i == c`, `y` the training labels of the run the Gram came from
    /// ([`Gram::train_labels`]).
    ///
    /// Errors: as [`SvmModel::fit_labels`], and a run with regression targets.
    pub fn fit(train: &Gram, params: &SvmParams) -> Result<SvmModel> {
        SvmModel::fit_labels(train, train.train_labels()?, params)
    }

    /// [`SvmModel::fit`] with the labels `labels` instead of the run's. # Shapes `labels: [M]`.
    ///
    /// Errors: as [`GpModel::fit_with`], labels of the wrong length, and those of
    /// [`SvmParams::fit_ovr`].
    pub fn fit_labels(train: &Gram, labels: &[usize], params: &SvmParams) -> Result<SvmModel> {
        train.require_train_rows("an SVM")?;
        let (m, _, k) = train.shape();
        if labels.len() != m {
            return Err(Error::ShapeMismatch { what: "SVM labels".into(), expected: vec![m], got: vec![labels.len()] });
        }
        let mut blocks = Vec::with_capacity(k * m * m);
        for c in 0..k {
            let b = train.symmetric_class_block(c)?;
            blocks.extend((0..m * m).map(|idx| b[(idx / m, idx % m)]));
        }
        let model = params.fit_ovr(&blocks, labels, m, k)?;
        Ok(SvmModel { model, kind: train.kind(), run_id: train.run_id().to_string(), m })
    }

    /// The arg-max class of the decision values at the rows of `rows` (same kind and run).
    pub fn predict(&self, rows: &Gram) -> Result<Vec<usize>> {
        let (cross, p) = self.cross(rows)?;
        self.model.predict(&cross, p)
    }

    /// Decision values at the rows of `rows`. # Shapes `[P, K]`.
    pub fn decision(&self, rows: &Gram) -> Result<Vec<f64>> {
        let (cross, p) = self.cross(rows)?;
        self.model.decision(&cross, p)
    }

    /// Support vectors per class.
    pub fn support(&self) -> Vec<usize> {
        self.model.classes.iter().map(|c| c.support.len()).collect()
    }
    /// SMO iterations per class.
    pub fn iterations(&self) -> Vec<usize> {
        self.model.classes.iter().map(|c| c.iterations).collect()
    }
    /// `y_i α_i` of every training point per class (zero off the support). # Shapes `[K][M]`.
    pub fn dual_coefficients(&self) -> Vec<Vec<f64>> {
        self.model.classes.iter().map(|c| c.dual_coef.clone()).collect()
    }

    fn cross(&self, rows: &Gram) -> Result<(Vec<f64>, usize)> {
        if rows.kind() != self.kind || rows.run_id() != self.run_id {
            return Err(Error::Config(format!("an SVM fitted on the {} of run {} cannot predict from the {} of run {}", self.kind, self.run_id, rows.kind(), rows.run_id())));
        }
        let (p, m, k) = rows.shape();
        if m != self.m {
            return Err(Error::ShapeMismatch { what: "row Gram columns vs SVM training points".into(), expected: vec![self.m], got: vec![m] });
        }
        let mut cross = Vec::with_capacity(k * p * m);
        for c in 0..k {
            let b = rows.class_block(c)?;
            cross.extend((0..p * m).map(|idx| b[(idx / m, idx % m)]));
        }
        Ok((cross, p))
    }
}

impl fmt::Display for SvmModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "one-vs-rest SVM on the {} ({} training points): support vectors per class {:?}", self.kind, self.m, self.support())
    }
}

/// Per-training-point contributions of chosen rows (Theorem 3.7's single machine, or the
/// ensemble of Theorem 3.6 when `a_{i,s}` varies by step), from [`Gram::attribute`].
///
/// # Example
///
/// ```
/// # use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 10\nn_test = 6\n\
/// #             [model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 10\n";
/// # let net = Trained::train_toml(toml, dir.path().join("run"))?;
/// let epk = net.epk().compute()?;                 // attribution needs the full layout
/// let who = epk.attribute(&[0, 2], 3)?;           // rows 0 and 2, top 3 each way
/// assert_eq!(who.items.len(), 2 * 3);             // one item per row and class
/// assert_eq!(who.of(2, 1)?.point, 2);             // row 2's output 1
/// assert!(who.of(1, 0).is_err());                 // row 1 was not asked for
/// for a in &who.items {
///     // the training points' contributions add up to the output minus the bias
///     assert!(a.residual.abs() < 1e-10);
///     assert!(a.supporters.len() <= 3 && a.opponents.len() <= 3);
/// }
/// println!("{who}");
/// # Ok(()) }
/// ```
///
/// Errors (of [`Gram::attribute`]): the NTK, a layout other than `full`, a row out of range, and
/// `a_{i,s}` varying by step without per-step Grams (`.per_step()`).
#[derive(Clone, Debug)]
pub struct Attributions {
    /// One entry per chosen row and class.
    pub items: Vec<Attribution>,
}

impl Attributions {
    /// The attribution of row `point`'s output `class`.
    ///
    /// Errors: a row or class that was not attributed.
    pub fn of(&self, point: usize, class: usize) -> Result<&Attribution> {
        self.items.iter().find(|a| a.point == point && a.class == class).ok_or_else(|| Error::Config(format!("row {point}, class {class} was not attributed")))
    }
}

impl fmt::Display for Attributions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  row  class    output      bias   Σ contributions   residual   top supporters (train index: contribution)")?;
        for (n, a) in self.items.iter().enumerate() {
            let top: Vec<String> = a.supporters.iter().take(3).map(|(i, v)| format!("{i}: {v:+.3}")).collect();
            write!(f, "  {:3} {:6} {:9.4} {:9.4} {:17.4} {:10.1e}   {}", a.point, a.class, a.output, a.bias, a.total, a.residual, top.join(", "))?;
            if n + 1 < self.items.len() {
                writeln!(f)?;
            }
        }
        Ok(())
    }
}

impl Gram {
    /// Whether `a_{i,s}` is the same for every step, so that Theorem 3.7's single machine
    /// applies.
    pub fn constant_a(&self) -> bool {
        attribution::constant_a(self.output())
    }

    /// Contributions of every training point to every row's output: `c[p, i, k] = Σ_k'
    /// a_{i,k'} K(x_p, x_i)[k, k']` when `a_{i,s}` is constant over the steps (Theorem 3.7),
    /// else the ensemble `Σ_s Σ_k' a_{i,s,k'} K_s(x_p, x_i)[k, k']` from the per-step Grams
    /// (Theorem 3.6). # Shapes `[P, M, K]`.
    ///
    /// Errors: the NTK (its machine is a linearisation), a layout other than `full`, and a run
    /// whose `a_{i,s}` varies by step when the Gram holds no per-step Grams.
    pub fn contributions(&self) -> Result<Vec<f64>> {
        attribution::require_path_machine(self.kind())?;
        self.require_layout(Layout::Full, "attribution (it contracts a_i with the off-diagonal blocks)")?;
        attribution::machine_contributions(self.output())
    }

    /// The network output minus what belongs to no training point: the bias `f_{w_0}(x_p)` plus
    /// the weight-decay and rounding terms when present. # Shapes `[P, K]`.
    pub fn baseline(&self) -> Vec<f64> {
        attribution::baseline(self.output())
    }

    /// The `top` strongest supporters and opponents of each output of rows `points`, with the
    /// check that the contributions sum to the network output minus the [`Gram::baseline`].
    ///
    /// Errors: a row out of range, and those of [`Gram::contributions`].
    pub fn attribute(&self, points: &[usize], top: usize) -> Result<Attributions> {
        let (p, m, k) = self.shape();
        if let Some(&bad) = points.iter().find(|&&q| q >= p) {
            return Err(Error::Config(format!("row {bad} is out of range: the Gram has {p} rows")));
        }
        let c = self.contributions()?;
        let items = attribution::attribute(&c, &self.baseline(), &self.output().network, points, p, m, k, top)?;
        Ok(Attributions { items })
    }

    /// How far the kernel on the training points is from stationary (a function of `x' − x`
    /// only; [`Stationarity`] defines the score): of the trace `Σ_c K^{cc}` when `class` is
    /// `None`, else of class block `class`. 1 = stationary.
    ///
    /// Errors: rows that are not the training points, and those of [`analysis::stationarity`].
    pub fn stationarity(&self, class: Option<usize>, opts: &StationarityOptions) -> Result<Stationarity> {
        let (p, m, _) = self.shape();
        if *self.rows() != super::Rows::Train || p != m {
            return Err(Error::Config(format!("stationarity needs a train × train Gram (`.train_side()`); these rows are {}", self.rows())));
        }
        let flat: Vec<f64> = match class {
            None => {
                let t = self.trace();
                (0..m * m).map(|idx| t[(idx / m, idx % m)]).collect()
            }
            Some(c) => {
                let b = self.class_block(c)?;
                (0..m * m).map(|idx| b[(idx / m, idx % m)]).collect()
            }
        };
        analysis::stationarity(&self.points().x, &flat, m, self.points().dim, opts)
    }
}
