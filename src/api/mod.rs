//! The notebook front door: a trained run ([`Trained`]), its kernels as typed values ([`Gram`])
//! and the estimators that take them ([`GpModel`], [`SvmModel`], [`Gram::attribute`]). Each
//! step is one or two lines in an evcxr cell and every value displays as a compact table.
//!
//! ```no_run
//! use pathkernel::api::*;
//! # fn main() -> pathkernel::Result<()> {
//! let net = Trained::open("runs/paper-toy/run")?;
//! let epk = net.epk().compute()?;                  // test × train EPK, auto:1e-12
//! println!("{epk}");                                // kernel machine vs network: ~1e-13
//! let k00 = epk.class_block(0)?.to_nalgebra();      // a nalgebra::DMatrix
//! let train = net.epk().train_side().layout(Layout::Diag).compute()?;
//! let rows = net.epk().layout(Layout::Diag).compute()?;
//! let probs = GpModel::fit(&train)?.predict(&rows)?.mc_softmax(1000, 0)?;
//! # Ok(()) }
//! ```

mod files;
mod fit;
mod gram;
mod rows;
mod trained;

pub use fit::{Attributions, GpModel, GpPrediction, SvmModel};
pub use gram::{from_nalgebra, Gram, ToNalgebra};
/// nalgebra itself, for its other types.
pub use nalgebra;
/// The matrix [`ToNalgebra::to_nalgebra`] returns (a name evcxr can give a cell's variable).
pub type DMatrix = nalgebra::DMatrix<f64>;
pub use rows::Rows;
pub use trained::{KernelBuilder, Trained};

pub use crate::error::{Error, Result};
pub use crate::gp::{GpParams, McSoftmax, Posterior};
pub use crate::kernel::{KernelKind, Layout, Rule, Side};
pub use crate::plot::{BarSeries, Chart, Grid2d, Heatmap, ImageTile, ReliabilityPanel, Scale, Series};
pub use crate::analysis::{Stationarity, StationarityOptions};
pub use crate::svm::SvmParams;

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
