//! [`Trained`]: a recorded training run with its weight states in memory, and
//! [`KernelBuilder`], the one way to ask it for a kernel.

use std::fmt;
use std::path::{Path, PathBuf};

use faer::MatRef;

use super::gram::Gram;
use super::rows::Rows;
use crate::error::{Error, Result};
use crate::interop::{import_torch, ImportOptions, ImportSummary};
use crate::kernel::{self, KernelKind, Layout, Outputs, Points, Request, Rule, Side};
use crate::model::Params;
use crate::train::{train_to_dir, RunConfig, TrainOptions, TrainSummary};
use crate::trajectory::Run;

/// A recorded run (`w_0 … w_N` on disk) with its states loaded.
///
/// # Example
///
/// ```
/// use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// // The format of `pathkernel train --config` (a study file works too).
/// let toml = r#"
///     [data]
///     kind = "gaussian-mixture"
///     dim = 2
///     per_class = 10
///     n_test = 6
///     [model]
///     kind = "mlp"
///     hidden = [8]
///     [train]
///     lr = 0.5
///     steps = 10
/// "#;
/// let net = Trained::train_toml(toml, dir.path().join("run"))?; // trains, records, opens
/// assert_eq!(net.states().len(), 11);                           // w_0 … w_10
/// let f = net.network(&[1.0, 4.0, 4.0, 1.0])?;                  // f_{w_N} at two inputs, [2, K]
/// assert_eq!(f.len(), 2 * 3);
/// println!("{net}; test accuracy {:.2}", net.test_accuracy()?);
///
/// let again = Trained::open(dir.path().join("run"))?;           // the same run, from disk
/// assert_eq!(again.run().manifest.run_id, net.run().manifest.run_id);
/// assert_eq!(again.states(), net.states());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Trained {
    run: Run,
    states: Vec<Params>,
    summary: Option<TrainSummary>,
    imported: Option<ImportSummary>,
}

impl Trained {
    /// Trains the run described by a TOML string (the format of `pathkernel train --config`)
    /// into `dir`, replacing a run there, and opens it. Relative data paths (MNIST's `dir`)
    /// are resolved against the current directory.
    pub fn train_toml(toml: &str, dir: impl AsRef<Path>) -> Result<Trained> {
        let config = RunConfig::from_toml(toml, Path::new("<notebook>"))?;
        Trained::train(&config, dir)
    }

    /// Trains `config` into `dir` (replacing a run there) and opens it.
    pub fn train(config: &RunConfig, dir: impl AsRef<Path>) -> Result<Trained> {
        let dir = dir.as_ref();
        let base_dir = std::env::current_dir().map_err(|e| Error::io(".", e))?;
        let summary = train_to_dir(config, dir, &TrainOptions { progress: false, force: true, base_dir, memory_budget: None })?;
        let mut t = Trained::open(dir)?;
        t.summary = Some(summary);
        Ok(t)
    }

    /// Opens a run written by `pathkernel train` (or [`Trained::train`]) and loads its states.
    pub fn open(dir: impl AsRef<Path>) -> Result<Trained> {
        let run = Run::open(dir.as_ref())?;
        let states = run.load_all()?;
        Ok(Trained { run, states, summary: None, imported: None })
    }

    /// Imports a trajectory recorded by a PyTorch training loop (`scripts/record_torch_trajectory.py`:
    /// `recording/trajectory.json`, one `state_dict` per step, `data.safetensors`) as a run in
    /// `dir` (replacing a run there) and opens it: `pathkernel import --from torch recording --out
    /// dir` ([`import_torch`]). Every recorded update is checked against the recorded
    /// optimizer's (SGD with momentum, dampening, Nesterov and weight decay, Adam, AdamW)
    /// replayed here from the gradients recomputed in f64 (relative tolerance 1e-9, or 1e-2 for a
    /// float32 recording, whose differences the kernels carry as a residual term); the largest
    /// difference shows in `Display`.
    ///
    /// # Example
    ///
    /// ```
    /// # use pathkernel::api::*;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// // A 2-6-2 ReLU MLP, 20 SGD steps of batch 8 on 24 points, recorded in PyTorch.
    /// let net = Trained::import_torch("tests/data/torch-trajectory", dir.path().join("run"))?;
    /// println!("{net}");                                  // steps, loss, recorded vs recomputed
    /// assert!(net.imported().unwrap().max_update_rel_diff < 1e-12);
    /// let epk = net.epk().per_step().compute()?;          // SGD: a_{i,s} changes with the batch
    /// assert!(epk.max_abs_error() < 1e-10);               // the machine is the PyTorch network
    /// let who = epk.attribute(&[0], 3)?;                  // per-step (ensemble) attribution
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: every refusal of [`import_torch`] (another optimizer, missing hyper-parameters,
    /// amsgrad, half precision, missing or out-of-order steps, changed shapes, an update beyond
    /// the tolerance, naming the step).
    pub fn import_torch(recording: impl AsRef<Path>, dir: impl AsRef<Path>) -> Result<Trained> {
        let summary = import_torch(recording.as_ref(), dir.as_ref(), &ImportOptions { force: true, ..ImportOptions::default() })?;
        let mut t = Trained::open(dir)?;
        t.imported = Some(summary);
        Ok(t)
    }

    /// The run on disk (manifest, dataset).
    pub fn run(&self) -> &Run {
        &self.run
    }
    /// The weight states `w_0 … w_N`.
    pub fn states(&self) -> &[Params] {
        &self.states
    }
    /// The run directory.
    pub fn dir(&self) -> PathBuf {
        self.run.dir.clone()
    }
    /// The training summary, when this value trained the run.
    pub fn summary(&self) -> Option<&TrainSummary> {
        self.summary.as_ref()
    }
    /// What the import found (steps, loss, the largest recorded-vs-recomputed update
    /// difference), when this value imported the run ([`Trained::import_torch`]).
    pub fn imported(&self) -> Option<&ImportSummary> {
        self.imported.as_ref()
    }

    /// The training inputs, a view of the run's dataset. # Shapes `[M, d]`.
    pub fn x_train(&self) -> MatRef<'_, f64> {
        let ds = &self.run.dataset;
        MatRef::from_row_major_slice(&ds.x_train, ds.n_train(), ds.dim)
    }
    /// The held-out test inputs, a view of the run's dataset. # Shapes `[P, d]`.
    pub fn x_test(&self) -> MatRef<'_, f64> {
        let ds = &self.run.dataset;
        MatRef::from_row_major_slice(&ds.x_test, ds.n_test(), ds.dim)
    }
    /// The training labels (classification runs). # Shapes `[M]`.
    ///
    /// Errors: a run with regression targets.
    pub fn y_train(&self) -> Result<&[usize]> {
        self.run.dataset.train_labels()
    }
    /// The test labels (classification runs). # Shapes `[P]`.
    ///
    /// Errors: a run with regression targets.
    pub fn y_test(&self) -> Result<&[usize]> {
        self.run.dataset.test_labels()
    }

    /// The network `f_{w_N}` at inputs `x`. # Shapes `x: [P, d]`, returns `[P, K]`.
    pub fn network(&self, x: &[f64]) -> Result<Vec<f64>> {
        let d = self.run.dataset.dim;
        if d == 0 || x.len() % d != 0 {
            return Err(Error::Config(format!("{} inputs are not rows of d = {d}", x.len())));
        }
        let last = self.states.last().ok_or_else(|| Error::Data("the run has no states".into()))?;
        self.run.manifest.architecture.forward(last, Some(&self.states[0]), x)
    }

    /// Accuracy of `f_{w_N}` on the held-out test set (classification runs).
    pub fn test_accuracy(&self) -> Result<f64> {
        let ds = &self.run.dataset;
        let labels = ds.test_labels()?;
        let f = self.network(&ds.x_test)?;
        let k = ds.num_outputs;
        let hits = labels.iter().enumerate().filter(|(i, &y)| crate::data::argmax(&f[i * k..(i + 1) * k]) == y).count();
        Ok(hits as f64 / labels.len().max(1) as f64)
    }

    /// A kernel of this run: test rows × training points, `auto:1e-12`, `full` layout, unless
    /// the builder says otherwise.
    pub fn kernel(&self, kind: KernelKind) -> KernelBuilder<'_> {
        KernelBuilder::new(&self.run, &self.states, kind)
    }
    /// The Exact Path Kernel ([`Trained::kernel`] with [`KernelKind::Epk`]).
    pub fn epk(&self) -> KernelBuilder<'_> {
        self.kernel(KernelKind::Epk)
    }
    /// The empirical NTK at the last state.
    pub fn ntk(&self) -> KernelBuilder<'_> {
        self.kernel(KernelKind::Ntk)
    }
    /// Domingos' discrete path kernel (one evaluation per step at t = 0).
    pub fn dpk(&self) -> KernelBuilder<'_> {
        self.kernel(KernelKind::Dpk)
    }
}

/// The run, for [`Gram::open`] (which reads a kernel directory of this run).
impl AsRef<Run> for Trained {
    fn as_ref(&self) -> &Run {
        &self.run
    }
}

impl fmt::Display for Trained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.summary {
            return write!(f, "{s}");
        }
        if let Some(s) = &self.imported {
            return write!(f, "{s}");
        }
        let ds = &self.run.dataset;
        write!(f, "run {} ({}): {} steps, {} training and {} test points, d = {}, K = {}", self.run.manifest.run_id, self.run.dir.display(), self.run.manifest.steps, ds.n_train(), ds.n_test(), ds.dim, ds.num_outputs)
    }
}

/// A kernel request under construction ([`Trained::kernel`]); [`KernelBuilder::compute`] runs it.
///
/// The defaults: test rows (integrated over each step), `auto:1e-12`, every step, `full` layout.
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
/// let epk = net.epk().compute()?;                                 // the defaults
/// let left = net.epk().rule(Rule::Left(10)).compute()?;          // the paper's Riemann sum
/// println!("auto {:.1e}, left:10 {:.1e}", epk.max_abs_error(), left.max_abs_error());
///
/// let x = [1.0, 4.0, 4.0, 1.0];                                  // two inputs, [P, d]
/// let two = net.epk().inputs(&x).layout(Layout::Trace).compute()?;
/// assert_eq!((two.shape(), two.layout()), ((2, 30, 3), Layout::Trace));
///
/// let ntk = net.ntk().at_step(5).compute()?;                     // the NTK at w_5
/// assert_eq!(ntk.kind(), KernelKind::Ntk);
/// let late = net.epk().steps(5, 10).per_step().compute()?;       // f_{w_10} from f_{w_5}, K_s kept
/// assert!(late.max_abs_error() < 1e-10);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct KernelBuilder<'a> {
    run: &'a Run,
    states: &'a [Params],
    req: Request,
    rows: Rows,
    inputs: Option<Points>,
    progress: Option<Progress<'a>>,
}

/// A progress callback `(steps done, steps in all)`, shown as `<progress>` by `Debug`.
#[derive(Clone, Copy)]
struct Progress<'a>(&'a dyn Fn(usize, usize));

impl fmt::Debug for Progress<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<progress>")
    }
}

impl<'a> KernelBuilder<'a> {
    /// `kind` of the run with states `states`: test rows (integrated on the test side),
    /// `auto:1e-12`, all steps, `full` layout.
    pub fn new(run: &'a Run, states: &'a [Params], kind: KernelKind) -> Self {
        KernelBuilder {
            run,
            states,
            req: Request::new(kind),
            rows: Rows::Test,
            inputs: None,
            progress: None,
        }
    }
    /// The quadrature of integrated rows (e.g. `Rule::Auto(1e-12)`, `Rule::Left(10)`).
    pub fn rule(mut self, rule: Rule) -> Self {
        self.req.rule = rule;
        self
    }
    /// Rows: the held-out test set (the default).
    pub fn test(mut self) -> Self {
        self.rows = Rows::Test;
        self
    }
    /// Rows: the training set, on the test side (the EPK's integrated gradients: the rows the
    /// exact kernel machine uses). For the GP's covariance use [`KernelBuilder::train_side`].
    pub fn train(mut self) -> Self {
        self.rows = Rows::Train;
        self
    }
    /// Rows: the training set on the train side (gradients at `t = 0` on both sides; for the
    /// EPK `Σ_s ⟨∇f_{w_s}(x_i), ∇f_{w_s}(x_j)⟩`, symmetric): the train × train Gram a GP or SVM
    /// is fitted on.
    pub fn train_side(mut self) -> Self {
        self.rows = Rows::Train;
        self.req.side = Side::Train;
        self
    }
    /// Rows: an `n × n` grid over 2-D training data.
    pub fn grid(mut self, n: usize) -> Self {
        self.rows = Rows::Grid(n);
        self
    }
    /// Rows: the mean of each class's training points.
    pub fn class_means(mut self) -> Self {
        self.rows = Rows::ClassMeans;
        self
    }
    /// Rows: one of the run's own sets ([`Rows::Test`], [`Rows::Train`], [`Rows::Grid`],
    /// [`Rows::ClassMeans`]; [`Rows::Inputs`] needs [`KernelBuilder::inputs`]).
    pub fn rows(mut self, rows: Rows) -> Self {
        self.rows = rows;
        self
    }
    /// Rows: the inputs `x` (`[P, d]`, row-major).
    pub fn inputs(mut self, x: &[f64]) -> Self {
        self.rows = Rows::Inputs;
        self.inputs = Some(Points { x: x.to_vec(), dim: self.run.dataset.dim });
        self
    }
    /// The side of the rows (test: integrated over each step; train: at `t = 0`).
    pub fn side(mut self, side: Side) -> Self {
        self.req.side = side;
        self
    }
    /// Which blocks are computed and held.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.req.layout = layout;
        self
    }
    /// Sum only the steps `[a, b)`; the machine then predicts `f_{w_b}` from `f_{w_a}`.
    pub fn steps(mut self, a: usize, b: usize) -> Self {
        self.req.steps = Some((a, b));
        self
    }
    /// The kernel on a classifier's logits instead of its log-softmax outputs (plain gradient
    /// steps; the machine then reproduces the logits): what [`super::FslModel`] needs.
    pub fn logits(mut self) -> Self {
        self.req.outputs = Outputs::Logits;
        self
    }
    /// Keep every per-step Gram `K_s` (needed for attribution when `a_{i,s}` varies by step).
    pub fn per_step(mut self) -> Self {
        self.req.per_step = true;
        self
    }
    /// Also split the kernel by parameter layer ([`crate::kernel::LayerShares`], read with
    /// [`Gram::layers`]): each layer's Gram and its share of the machine's change per step,
    /// summing to the whole. Any optimizer; all training points.
    pub fn per_layer(mut self) -> Self {
        self.req.per_layer = true;
        self
    }
    /// With [`KernelBuilder::steps`] on a run with momentum or Adam: the gradients of the
    /// steps before the window enter the machine as one carried-in term
    /// ([`crate::kernel::KernelOutput::carried`], [`Gram::carried`]) instead of with their own
    /// kernels, so the Gram, `a` and the per-step Grams are the window's only.
    pub fn carry_in(mut self) -> Self {
        self.req.carry_in = true;
        self
    }
    /// For the NTK: the step `s` it is taken at (default: the last state).
    pub fn at_step(mut self, s: usize) -> Self {
        self.req.ntk_step = Some(s);
        self
    }

    /// Where the work runs ([`crate::kernel::Device::Cuda`]: GPU 0 — where a `dense, relu, dense`
    /// stack takes its closed form (the EPK and k′ under the auto rule) its whole step runs there
    /// with the Gram resident, elsewhere a layer stack's or the CNN's node gradients do; without a GPU [`KernelBuilder::compute`] returns a
    /// one-line [`Error::Backend`]).
    pub fn device(mut self, device: crate::kernel::Device) -> Self {
        self.req.device = device;
        self
    }
    /// Refuses, with an estimate, a computation whose outputs would take more than `bytes`.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.req.memory_budget = bytes;
        self
    }
    /// Calls `f(steps done, steps in all)` as the computation proceeds (a progress bar).
    pub fn progress(mut self, f: &'a dyn Fn(usize, usize)) -> Self {
        self.progress = Some(Progress(f));
        self
    }

    /// Computes the Gram (in memory; [`Gram::save`] writes it).
    ///
    /// Errors: inputs whose length is not a multiple of d, a grid on data that is not 2-D, and
    /// every error of the kernel engine.
    pub fn compute(self) -> Result<Gram> {
        let ds = &self.run.dataset;
        let points = match (&self.rows, self.inputs) {
            (Rows::Inputs, Some(p)) => {
                if p.dim == 0 || p.x.len() % p.dim != 0 {
                    return Err(Error::Config(format!("{} inputs are not rows of d = {}", p.x.len(), p.dim)));
                }
                p
            }
            (Rows::Inputs, None) => return Err(Error::Config("no inputs given".into())),
            (rows, _) => rows.resolve(ds)?,
        };
        let out = kernel::compute(self.run, self.states, &points, &self.req, self.progress.map_or(&|_, _| {}, |p| p.0))?;
        Ok(Gram::new(out, points, self.rows, self.run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed recording (`tests/data/torch-trajectory/`: a 2-6-2 ReLU MLP, 20 SGD steps
    /// of batch 8 on 24 two-moons points, made by `scripts/record_torch_trajectory.py`).
    fn recording() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch-trajectory")
    }

    /// The input and label views equal the flat vectors of the run's dataset.
    #[test]
    fn input_and_label_views_equal_the_dataset() {
        let dir = tempfile::tempdir().unwrap();
        let net = Trained::train(&RunConfig::mixture(3, 4, 5).mlp(&[4]).lr(0.5).steps(2), dir.path().join("run")).unwrap();
        let ds = &net.run().dataset;
        let (xtr, xte) = (net.x_train(), net.x_test());
        assert_eq!((xtr.nrows(), xtr.ncols(), xte.nrows(), xte.ncols()), (12, 3, 5, 3));
        for i in 0..12 {
            for j in 0..3 {
                assert_eq!(xtr[(i, j)], ds.x_train[i * 3 + j]);
            }
        }
        for q in 0..5 {
            assert_eq!(xte.row(q).iter().copied().collect::<Vec<_>>(), ds.x_test[q * 3..q * 3 + 3]);
        }
        assert_eq!((net.y_train().unwrap(), net.y_test().unwrap()), (ds.train_labels().unwrap(), ds.test_labels().unwrap()));
        // The Gram carries the labels of its run's training points.
        let train = net.epk().train_side().layout(Layout::Diag).compute().unwrap();
        assert_eq!(train.train_labels().unwrap(), net.y_train().unwrap());
    }

    #[test]
    fn import_torch_opens_the_recorded_run_and_its_epk_reproduces_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let net = Trained::import_torch(recording(), &out).unwrap();
        assert_eq!(net.states().len(), 21);
        assert_eq!(net.run().dataset.n_train(), 24);
        let s = net.imported().expect("import summary");
        assert_eq!((s.steps, s.optimizer.as_str()), (20, "sgd"));
        assert!(s.max_update_rel_diff <= 1e-12, "{:e}", s.max_update_rel_diff);
        assert!(net.summary().is_none());
        let text = net.to_string();
        assert!(text.starts_with("imported 20 sgd steps") && text.contains("max relative difference"), "{text}");
        // The SGD batches make a_{i,s} vary by step: the per-step Grams carry the attribution.
        let epk = net.epk().per_step().compute().unwrap();
        assert!(epk.max_abs_error() <= 1e-10, "{:e}", epk.max_abs_error());
        assert!(!epk.constant_a());
        let at = epk.attribute(&[0], 3).unwrap();
        assert!(at.items.iter().all(|a| a.residual.abs() <= 1e-10), "{at}");
        // Importing again replaces the run; a reopened run has no import summary.
        Trained::import_torch(recording(), &out).unwrap();
        assert!(Trained::open(&out).unwrap().imported().is_none());
        // A refused recording is an error and writes nothing.
        let bad = dir.path().join("bad");
        std::fs::create_dir_all(&bad).unwrap();
        let e = Trained::import_torch(&bad, dir.path().join("other")).unwrap_err().to_string();
        assert!(e.contains("trajectory.json"), "{e}");
        assert!(!dir.path().join("other").exists());
    }
}
