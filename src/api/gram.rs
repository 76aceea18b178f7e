//! [`Gram`]: a kernel of a recorded run as a typed value that knows its shape and meaning (the
//! engine's [`KernelOutput`] with its [`Rows`] and exactness summary), its views, and its files.

use std::fmt;
use std::path::Path;

use faer::{Mat, MatRef};

use super::rows::Rows;
use crate::error::{Error, Result};
use crate::io::StagedDir;
use crate::kernel::{self, output::Exactness, KernelForm, KernelKind, KernelOutput, Layout, Points, Side};
use crate::trajectory::Run;

/// A kernel Gram of a recorded run with its rows, layout and exactness.
///
/// Its blocks are read through views, never by flat index arithmetic: [`Gram::class_block`]
/// `K^{cc}(x_p, x_i)` `[P, M]` (layouts `full` and `diag`), [`Gram::pair`] the `K × K` block of
/// one pair (layout `full`), [`Gram::trace`] `Σ_c K^{cc}` `[P, M]` from any layout,
/// [`Gram::symmetric_class_block`] for a train × train Gram; [`ToNalgebra::to_nalgebra`] copies
/// any of them into a `nalgebra::DMatrix`. `Display` is a compact table; [`Gram::save`] /
/// [`Gram::open`] use the files of `pathkernel kernel`, so a Gram saved from a notebook is read
/// by the CLI and by Python.
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
/// let epk = net.epk().compute()?;                 // test rows × training points, full layout
/// let (p, m, k) = epk.shape();
/// assert_eq!((p, m, k), (6, 30, 3));
/// let k11 = epk.class_block(1)?;                  // K^{11}(x_p, x_i), a [P, M] view
/// let pair = epk.pair(0, 0)?;                     // K(x_0, x_0)[k, k'], a K × K view
/// assert_eq!(k11[(0, 0)], pair[(1, 1)]);
/// let t = epk.trace();                            // Σ_c K^{cc}, [P, M]
/// let sum: f64 = (0..k).map(|c| pair[(c, c)]).sum();
/// assert!((t[(0, 0)] - sum).abs() <= 1e-12 * sum.abs());
///
/// epk.save(dir.path().join("epk"))?;              // the files of `pathkernel kernel --out`
/// let back = Gram::open(dir.path().join("epk"), &net)?;
/// assert_eq!((back.shape(), back.max_abs_error()), (epk.shape(), epk.max_abs_error()));
/// # Ok(()) }
/// ```
///
/// # Shapes
/// `(P, M, K)` = [`Gram::shape`]: row points, training points, outputs.
#[derive(Clone, Debug)]
pub struct Gram {
    out: KernelOutput,
    points: Points,
    rows: Rows,
    run_id: String,
    /// The run's training labels (the columns' classes), for the estimators that need them.
    labels: Option<Vec<usize>>,
    exactness: Exactness,
}

/// Copies a `faer` matrix view into a `nalgebra::DMatrix` (the matrix type many Rust numerics
/// users hold); [`from_nalgebra`] goes back.
///
/// # Example
///
/// ```
/// use pathkernel::api::*;
/// let a = DMatrix::from_row_slice(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// let m = from_nalgebra(&a);                      // a faer::Mat
/// assert_eq!(m[(1, 2)], 6.0);
/// assert_eq!(m.to_nalgebra(), a);
/// assert_eq!(m.as_ref().transpose().to_nalgebra(), a.transpose()); // any faer view
/// ```
pub trait ToNalgebra {
    /// The same matrix as a `nalgebra::DMatrix<f64>`.
    fn to_nalgebra(&self) -> nalgebra::DMatrix<f64>;
}

impl ToNalgebra for MatRef<'_, f64> {
    fn to_nalgebra(&self) -> nalgebra::DMatrix<f64> {
        nalgebra::DMatrix::from_fn(self.nrows(), self.ncols(), |i, j| self[(i, j)])
    }
}

impl ToNalgebra for Mat<f64> {
    fn to_nalgebra(&self) -> nalgebra::DMatrix<f64> {
        self.as_ref().to_nalgebra()
    }
}

/// A `nalgebra::DMatrix` as a `faer::Mat` (the inverse of [`ToNalgebra`]).
///
/// # Example
///
/// ```
/// use pathkernel::api::{from_nalgebra, DMatrix};
/// let m = from_nalgebra(&DMatrix::identity(3, 3));
/// assert_eq!((m.nrows(), m.ncols(), m[(2, 2)], m[(0, 1)]), (3, 3, 1.0, 0.0));
/// ```
pub fn from_nalgebra(m: &nalgebra::DMatrix<f64>) -> Mat<f64> {
    Mat::from_fn(m.nrows(), m.ncols(), |i, j| m[(i, j)])
}

/// A strided view into `data`: element `(i, j)` at `offset + i·rs + j·cs`.
///
/// # Panics
/// If the view would reach past the end of `data` (checked before the view is made).
fn strided(data: &[f64], offset: usize, (rows, cols): (usize, usize), (rs, cs): (usize, usize)) -> MatRef<'_, f64> {
    if rows == 0 || cols == 0 {
        return MatRef::from_row_major_slice(&[], rows, cols);
    }
    let last = offset + (rows - 1) * rs + (cols - 1) * cs;
    assert!(last < data.len(), "view past the end of the Gram ({last} >= {})", data.len());
    // SAFETY: every element offset + i·rs + j·cs (i < rows, j < cols) is at most `last`, which
    // is inside `data` (checked above); the view borrows `data`, so it cannot outlive it.
    unsafe { MatRef::from_raw_parts(data.as_ptr().add(offset), rows, cols, rs as isize, cs as isize) }
}

impl Gram {
    pub(super) fn new(out: KernelOutput, points: Points, rows: Rows, run: &Run) -> Gram {
        let run_id = &run.manifest.run_id;
        let exactness = Exactness::of(&out, run_id);
        Gram { out, points, rows, run_id: run_id.clone(), labels: train_labels(run), exactness }
    }

    /// The kernel kind (`epk`, `ntk`, `dpk`, …).
    pub fn kind(&self) -> KernelKind {
        self.out.kind
    }
    /// Which copy of the input space the rows live in (EPK Definition 3.3).
    pub fn side(&self) -> Side {
        self.out.side
    }
    /// Which blocks are held.
    pub fn layout(&self) -> Layout {
        self.out.layout
    }
    /// What the rows are.
    pub fn rows(&self) -> &Rows {
        &self.rows
    }
    /// `(P, M, K)`: row points, training points, outputs.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.out.p, self.out.m, self.out.k)
    }
    /// The row points' inputs. # Shapes `[P, d]`.
    pub fn points(&self) -> &Points {
        &self.points
    }
    /// The run this Gram belongs to.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
    /// Everything the engine returned (per-step records, the machine, `a_{i,s}`, …).
    pub fn output(&self) -> &KernelOutput {
        &self.out
    }
    /// The exactness summary (as `exactness.json`).
    pub fn exactness(&self) -> &Exactness {
        &self.exactness
    }
    /// The per-layer decomposition, when computed ([`super::KernelBuilder::per_layer`]).
    pub fn layers(&self) -> Option<&crate::kernel::LayerShares> {
        self.out.layers.as_ref()
    }
    /// `max |kernel machine − network|` over rows and classes (NaN if either has a NaN).
    pub fn max_abs_error(&self) -> f64 {
        self.exactness.max_abs_error
    }
    /// The network's output `f_{w_N}(x_p)`. # Shapes `[P, K]`.
    pub fn network(&self) -> MatRef<'_, f64> {
        MatRef::from_row_major_slice(&self.out.network, self.out.p, self.out.k)
    }
    /// The kernel machine's output (ensemble form, Theorem 3.6). # Shapes `[P, K]`.
    pub fn machine(&self) -> MatRef<'_, f64> {
        MatRef::from_row_major_slice(&self.out.machine, self.out.p, self.out.k)
    }
    /// A window's carried-in term ([`crate::kernel::KernelOutput::carried`]): what the
    /// gradients of the steps before it, carried by the momentum, change inside it (included in
    /// the machine); `None` without [`super::KernelBuilder::carry_in`].
    ///
    /// # Shapes
    /// `[P, K]`.
    pub fn carried(&self) -> Option<MatRef<'_, f64>> {
        let (p, _, k) = self.shape();
        self.out.carried.as_deref().map(|c| MatRef::from_row_major_slice(c, p, k))
    }
    /// The bias `b = f_{w_0}(x_p)`. # Shapes `[P, K]`.
    pub fn bias(&self) -> MatRef<'_, f64> {
        MatRef::from_row_major_slice(&self.out.bias, self.out.p, self.out.k)
    }
    /// The arg-max class of the network's output at each row (the first on ties). # Shapes `[P]`.
    pub fn predicted(&self) -> Vec<usize> {
        self.out.network.chunks(self.out.k.max(1)).map(|r| (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b })).collect()
    }
    /// The class labels of the `M` training points (the columns), from the run this Gram
    /// belongs to. # Shapes `[M]`.
    ///
    /// Errors: a run with regression targets.
    pub fn train_labels(&self) -> Result<&[usize]> {
        self.labels.as_deref().ok_or_else(|| Error::Config("labels need a classification dataset".into()))
    }
    /// The per-step check as a chart series labelled `label`: each step `s` against
    /// `max |predicted − actual change of the output|` over that step. # Shapes `[steps]` each.
    pub fn step_errors(&self, label: &str) -> crate::plot::Series {
        let r = &self.out.records;
        crate::plot::Series::xy(label, r.iter().map(|r| r.step as f64), r.iter().map(|r| r.max_abs_error))
    }

    /// Refuses, with what to do instead, when this Gram's layout lacks the blocks `need`s.
    pub fn require_layout(&self, need: Layout, what: &str) -> Result<()> {
        if self.layout().provides(need) {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "this Gram holds the {} blocks; {what} needs the {need} blocks: compute it with `.layout(Layout::{})`",
                self.layout(),
                match need {
                    Layout::Full => "Full",
                    Layout::Diag => "Diag",
                    Layout::Trace => "Trace",
                }
            )))
        }
    }

    /// Class block `c`: `K^{cc}(x_p, x_i)`, a view into the Gram. # Shapes `[P, M]`.
    ///
    /// Errors: `c ≥ K`; a `trace` Gram (it holds no class blocks).
    pub fn class_block(&self, c: usize) -> Result<MatRef<'_, f64>> {
        let (p, m, k) = self.shape();
        if c >= k {
            return Err(Error::Config(format!("class {c} is out of range: the Gram has {k} outputs")));
        }
        self.require_layout(Layout::Diag, "a class block")?;
        Ok(match self.layout() {
            Layout::Full => strided(&self.out.gram, c * k + c, (p, m), (m * k * k, k * k)),
            _ => strided(&self.out.gram, c, (p, m), (m * k, k)),
        })
    }

    /// The `K × K` block `K(x_p, x_i)[k, k']` of one pair, a view into a `full` Gram.
    ///
    /// Errors: `p ≥ P` or `i ≥ M`; a layout other than `full`.
    pub fn pair(&self, p: usize, i: usize) -> Result<MatRef<'_, f64>> {
        let (np, m, k) = self.shape();
        if p >= np || i >= m {
            return Err(Error::Config(format!("pair ({p}, {i}) is out of range: the Gram is {np} × {m}")));
        }
        self.require_layout(Layout::Full, "a pair's K × K block")?;
        Ok(strided(&self.out.gram, (p * m + i) * k * k, (k, k), (k, 1)))
    }

    /// `Σ_c K^{cc}(x_p, x_i)`, from any layout. # Shapes `[P, M]`.
    pub fn trace(&self) -> Mat<f64> {
        let (p, m, k) = self.shape();
        let t = Layout::Trace.from_layout(self.layout(), &self.out.gram, p, m, k);
        Mat::from_fn(p, m, |i, j| t[i * m + j])
    }

    /// Class block `c` of a train × train Gram, symmetrised `(K + Kᵀ)/2` (removes the rounding
    /// asymmetry of a kernel that is symmetric in exact arithmetic). # Shapes `[M, M]`.
    ///
    /// Errors: rows that are not the training points; a kernel form that is not symmetric
    /// (momentum, Adam); those of [`Gram::class_block`].
    pub fn symmetric_class_block(&self, c: usize) -> Result<Mat<f64>> {
        self.require_train_rows("a symmetric class block")?;
        let b = self.class_block(c)?;
        Ok(Mat::from_fn(b.nrows(), b.ncols(), |i, j| 0.5 * (b[(i, j)] + b[(j, i)])))
    }

    /// Requires the rows to be the training points and the kernel form to be symmetric.
    pub fn require_train_rows(&self, what: &str) -> Result<()> {
        if !self.out.form.symmetric() {
            return Err(Error::Config(format!(
                "{what} needs a symmetric kernel; this run's kernel is in `{}` form (train with gd or sgd)",
                self.out.form
            )));
        }
        if self.rows != Rows::Train {
            return Err(Error::Config(format!("{what} needs a train × train Gram (`.train_side()`); these rows are {}", self.rows.describe())));
        }
        Ok(())
    }

    /// Self-kernel of class `c` at the rows, `K^{cc}(x_p, x_p)` on the rows' side. # Shapes `[P]`.
    ///
    /// Errors: kinds without a self-kernel (chen, kprime).
    pub fn self_kernel(&self, c: usize) -> Result<Vec<f64>> {
        let (p, _, k) = self.shape();
        let d = self.out.diag.as_ref().ok_or_else(|| Error::Config(format!("the {} kernel has no self-kernel at its rows", self.kind())))?;
        if c >= k {
            return Err(Error::Config(format!("class {c} is out of range: the Gram has {k} outputs")));
        }
        Ok((0..p).map(|q| d[(q * k + c) * k + c]).collect())
    }

    /// `Σ_c K^{cc}(x_p, x_p)`, the trace of each row's self-kernel. # Shapes `[P]`.
    ///
    /// Errors: kinds without a self-kernel (chen, kprime).
    pub fn self_kernel_trace(&self) -> Result<Vec<f64>> {
        let (p, _, k) = self.shape();
        let mut t = vec![0.0; p];
        for c in 0..k {
            t.iter_mut().zip(self.self_kernel(c)?).for_each(|(a, b)| *a += b);
        }
        Ok(t)
    }

    /// Values at the rows of a grid Gram ([`Rows::Grid`]) as a plottable grid (x fastest).
    ///
    /// Errors: rows that are not a grid; `values` not one per grid point.
    pub fn on_grid(&self, values: Vec<f64>) -> Result<crate::plot::Grid2d> {
        let Rows::Grid(n) = self.rows else {
            return Err(Error::Config(format!("values on a grid need a grid Gram (`.grid(n)`); these rows are {}", self.rows.describe())));
        };
        if values.len() != n * n || self.points.dim != 2 || n < 2 {
            return Err(Error::ShapeMismatch { what: "values on the grid".into(), expected: vec![n * n], got: vec![values.len()] });
        }
        let x = &self.points.x;
        Ok(crate::plot::Grid2d { nx: n, ny: n, x0: x[0], x1: x[2 * (n - 1)], y0: x[1], y1: x[2 * (n * n - 1) + 1], values })
    }

    /// Writes the Gram as `pathkernel kernel` does into `dir` (replaced if it exists; written in
    /// a staging sibling and moved into place, so `dir` never holds a partial result).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let staged = StagedDir::new(dir.as_ref(), true)?;
        kernel::output::write(staged.path(), &self.out, &self.points, self.rows, &self.run_id)?;
        staged.commit()?;
        Ok(())
    }

    /// Reads a Gram written by [`Gram::save`] or `pathkernel kernel --out DIR` for `net`'s run
    /// (`&net` a [`Trained`](super::Trained), or anything else that holds the [`Run`]).
    ///
    /// Errors: a directory of another run, missing or malformed files.
    pub fn open(dir: impl AsRef<Path>, net: impl AsRef<Run>) -> Result<Gram> {
        let dir = dir.as_ref();
        let run = net.as_ref();
        let kernel::output::GramFile { out, points, rows, exactness, .. } = kernel::output::read(dir, run)?;
        Ok(Gram { out, points, rows, run_id: run.manifest.run_id.clone(), labels: train_labels(run), exactness })
    }
}

/// The training labels of a classification run (`None` for regression targets).
fn train_labels(run: &Run) -> Option<Vec<usize>> {
    run.dataset.train_labels().ok().map(<[usize]>::to_vec)
}

impl fmt::Display for Gram {
    /// A compact table: what the Gram is, its shape, and how exactly its kernel machine
    /// reproduces the network.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.exactness;
        let (p, m, k) = self.shape();
        let side = match (self.side(), self.out.integrated) {
            (Side::Test, true) => "test (gradients integrated over each step)",
            (Side::Test, false) => "test (gradients at t = 0)",
            (Side::Train, _) => "train (gradients at t = 0)",
        };
        let shape = self.layout().shape(p, m, k).iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" × ");
        writeln!(f, "Gram {} · {} rows × {m} training points · {k} outputs", self.kind(), self.rows.describe())?;
        writeln!(f, "  side        {side}")?;
        writeln!(f, "  quadrature  {}", e.quadrature_name())?;
        writeln!(f, "  layout      {} [{shape}]", self.layout())?;
        writeln!(f, "  steps       {}", e.steps)?;
        writeln!(f, "  evaluations {:.2} per point and step (max {})", e.evaluations_per_step.mean, e.evaluations_per_step.max)?;
        writeln!(f, "  seconds     {:.2}", e.seconds)?;
        if e.form != KernelForm::Gradient {
            writeln!(f, "  form        {}{}", e.form, if e.symmetric_kernel { "" } else { " (not a symmetric kernel)" })?;
        }
        write!(f, "  machine     max |kernel machine − network| {:.3e}, mean {:.3e}", e.max_abs_error, e.mean_abs_error)?;
        if self.side() == Side::Train && self.kind() == KernelKind::Epk {
            // The train side is not a kernel machine of the network: its rows take the
            // gradients at t = 0 (the DPK's rule), which is what the GP's covariance uses.
            write!(f, "\n              (train side: not the exact machine by design; the test side is exact)")?;
        } else if let Some(met) = e.tolerance_met {
            write!(f, " ({})", if met { "within the tolerance" } else { "ABOVE the tolerance" })?;
        }
        Ok(())
    }
}
