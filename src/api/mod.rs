//! The notebook front door: a trained run ([`Trained`]: trained here, opened, or imported from a
//! PyTorch recording), its kernels as typed values ([`Gram`]) and the estimators that take them
//! ([`GpModel`], [`SvmModel`], [`Gram::attribute`]); and an uncertainty benchmark's report read
//! back ([`UqReport`]: metric tables, reliability diagrams, a metric against the rotation angle).
//! Each step is one or two lines in an evcxr cell and every value displays as a compact table.
//!
//! The path of the notebooks, on a run small enough for a doctest (`Trained::open(dir)?` opens
//! one that `pathkernel train` recorded):
//!
//! ```
//! use pathkernel::api::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 10\nn_test = 6\n\
//!             [model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 10\n";
//! let net = Trained::train_toml(toml, dir.path().join("run"))?;
//! println!("{net}");                               // steps, parameters, loss, accuracy
//! let same = RunConfig::mixture(2, 10, 6).mlp(&[8]).lr(0.5).steps(10); // the TOML by setters
//! assert_eq!(Trained::train(&same, dir.path().join("again"))?.states(), net.states());
//! assert_eq!((net.x_test().nrows(), net.x_test().ncols(), net.y_test()?.len()), (6, 2, 6));
//!
//! let epk = net.epk().compute()?;                  // test × train EPK, auto:1e-12, full layout
//! println!("{epk}");                               // kernel machine vs network: ~1e-14
//! assert!(epk.max_abs_error() < 1e-10);
//! let k00: DMatrix = epk.class_block(0)?.to_nalgebra(); // a nalgebra::DMatrix, 6 × 30
//! assert_eq!(k00.shape(), (6, 30));
//!
//! let train = net.epk().train_side().layout(Layout::Diag).compute()?; // the GP's covariance
//! let rows = net.epk().layout(Layout::Diag).compute()?;
//! let gp = GpModel::fit(&train)?;                  // noise and scale by marginal likelihood
//! let post = gp.predict(&rows)?;                   // logit mean (bias included) and variance
//! let probs = post.mc_softmax(1000, 0)?;           // Monte-Carlo softmax, seeded
//! let mean = probs.mean();                         // a [P, K] view, as probs.std()
//! assert!((0..6).all(|q| (mean.row(q).iter().sum::<f64>() - 1.0).abs() < 1e-9));
//!
//! let svm = SvmModel::fit(&train, &SvmParams::default())?; // labels from the Gram's run
//! assert_eq!(svm.predict(&rows)?.len(), 6);
//!
//! let who = epk.attribute(&[0, 1], 5)?;            // supporters and opponents of two rows
//! println!("{who}");
//! # Ok(()) }
//! ```

mod attribution;
mod config;
mod fit;
mod gram;
mod laplace;
mod rows;
mod trained;
mod uqreport;

pub use attribution::trak;
pub use fit::{Attributions, GpModel, GpPrediction, SvmModel};
pub use gram::{from_nalgebra, Gram, ToNalgebra};
pub use laplace::{FslModel, FslPrediction};
pub use crate::gp::{Calibration, Curvature, Prior};
/// nalgebra itself, for its other types.
pub use nalgebra;
/// The matrix [`ToNalgebra::to_nalgebra`] returns (a name evcxr can give a cell's variable).
///
/// # Example
///
/// ```
/// use pathkernel::api::DMatrix;
/// let k: DMatrix = DMatrix::from_element(2, 2, 0.5);
/// assert_eq!(k.sum(), 2.0);
/// ```
pub type DMatrix = nalgebra::DMatrix<f64>;
pub use rows::Rows;
pub use trained::{KernelBuilder, Trained};
pub use uqreport::{MetricTable, UqReport};

pub use crate::error::{Error, Result};
pub use crate::gp::{GpParams, McSoftmax, Posterior};
pub use crate::kernel::{Device, KernelKind, Layout, Rule, Side};
pub use crate::plot::{BarSeries, Chart, Grid2d, Heatmap, ImageTile, LineChart, Overlay, ReliabilityPanel, Scale, ScatterChart, Series};
pub use crate::train::{OptimizerKind, RunConfig};
pub use crate::analysis::{Stationarity, StationarityOptions};
pub use crate::attribution::{extremes, lds::spearman};
pub use crate::svm::{agreement, SvmParams};
pub use crate::interop::ImportSummary;
pub use crate::uncertainty::Metric;

/// evcxr shows a cell's value with its `evcxr_display` method when it has one, else with
/// `Debug` (for these types, every weight and Gram entry): each gets its `Display` table.
macro_rules! evcxr_table {
    ($($t:ty),* $(,)?) => {
        $(
            impl $t {
                /// evcxr's inline display: the compact `Display` table as `text/plain`.
                pub fn evcxr_display(&self) {
                    println!("EVCXR_BEGIN_CONTENT text/plain\n{self}\nEVCXR_END_CONTENT");
                }
            }
        )*
    };
}

evcxr_table!(Trained, Gram, GpModel, GpPrediction, SvmModel, Attributions, Stationarity);
