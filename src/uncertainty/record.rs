//! What one uncertainty study run records for its report: the selection, the stages' timings,
//! the function-space Laplace fits and everything `summary.md` is written from. The runner
//! ([`crate::study::uncertainty`]) fills it; the summary and the charts ([`super::summary`]) read it.

use serde::{Deserialize, Serialize};

use super::kernel_gp::{GramCheck, KernelGpFit};
use super::report::UqResults;

/// A function-space Laplace fit of the study, for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FslStudyFit {
    /// The kernel (`epk`, `ntk`).
    pub kernel: String,
    /// The fit at δ by the evidence.
    pub fit: crate::gp::FslFit,
    /// Temperature alone on the validation split (s = 1).
    pub temperature: crate::gp::Calibration,
    /// Temperature and variance scale on the validation split.
    pub calibration: crate::gp::Calibration,
    /// δ by the validation grid (class-diagonal only) and its sweep `[δ, NLL]`.
    pub grid: Option<(f64, Vec<(f64, f64)>)>,
    /// Per setting (and `val`): the smallest posterior variance before clamping, and the count
    /// clamped to 0.
    pub min_variance: Vec<(String, f64, usize)>,
}

/// One stage's wall-clock time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageTiming {
    /// What was computed.
    pub stage: String,
    /// The method it belongs to (`shared` for training the network under test and the selection).
    pub method: String,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// 1-minute load average of the machine before and after.
    pub load: [f64; 2],
}

/// One point of the selection grid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelectionRow {
    /// Learning rate.
    pub lr: f64,
    /// Steps.
    pub steps: usize,
    /// Validation accuracy of the state after `steps` updates.
    pub val_accuracy: f64,
    /// Validation NLL of that state's softmax.
    pub val_nll: f64,
    /// Mean training loss at that step (from the training log).
    pub train_loss: f64,
}

/// The selection of `(lr, steps)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// Every grid point.
    pub rows: Vec<SelectionRow>,
    /// The chosen learning rate.
    pub lr: f64,
    /// The chosen step count.
    pub steps: usize,
    /// When the chosen run is trained separately: whether its last state equals the selection
    /// run's state at `steps` bit for bit.
    pub prefix_identical: Option<bool>,
}

/// Everything the summary is written from.
#[derive(Clone, Debug)]
pub struct UqStudyReport {
    /// Study name.
    pub name: String,
    /// Description.
    pub description: String,
    /// The study file as given.
    pub study_file: String,
    /// The study file's text.
    pub text: String,
    /// The dataset's description.
    pub data_description: String,
    /// Training, validation and test points.
    pub sizes: [usize; 3],
    /// The network under test: its architecture (debug form), parameter count and run id.
    pub network: (String, usize, String),
    /// Training accuracy and loss of the network under test.
    pub train_fit: (f64, f64),
    /// The selection.
    pub selection: Selection,
    /// Ensemble members: seed, run id, clean test accuracy.
    pub ensemble: Vec<(u64, String, f64)>,
    /// The scored benchmark.
    pub results: UqResults,
    /// Each fitted kernel GP: method name and fit.
    pub kernel_gps: Vec<(String, KernelGpFit)>,
    /// The function-space Laplace fits (δ, calibrations, smallest variances).
    pub fsl: Vec<FslStudyFit>,
    /// Each kernel's row Grams: kernel (`epk`, `ntk`) and the checks.
    pub row_grams: Vec<(String, Vec<GramCheck>)>,
    /// Ablations left out, with the reason.
    pub failed: Vec<(String, String)>,
    /// Stages in run order.
    pub stages: Vec<StageTiming>,
    /// Monte-Carlo samples and seed.
    pub mc: (usize, u64),
    /// The author's notes from the study file.
    pub notes: String,
    /// `metrics.parquet` re-scored from `predictions.parquet` as written: values compared and
    /// the largest difference (0 when every value is reproduced exactly).
    pub rescored: (usize, f64),
}
