//! The step models' contract: what the kernel driver ([`crate::kernel::engine::driver`]) asks of a
//! network for one training step. Each model adds the step's Gram (only the entries of the
//! accumulator's layout) for all row points, the rows' self-kernel, and returns the kernel
//! machine's predicted change of the outputs over the step (contracted from the factors, so no
//! layout needs the off-diagonal blocks for it) with the quadrature's statistics. The driver owns
//! the loop over steps, the per-step validation and the outputs; the accumulator
//! ([`GramAccumulator`], over a [`crate::kernel::layout::GramSink`]) owns the one permutation into
//! the output layout.
//!
//! The models, each beside the code it runs: the layer stack's
//! ([`crate::kernel::stack::StackModel`]), the MLP and CNN presets' fast paths
//! ([`crate::kernel::stack::closed::dense_relu::model`], [`crate::kernel::stack::closed::conv_relu_pool::model`]) and the dfdx reference
//! ([`crate::kernel::generic::GenericModel`]). Runs with momentum or Adam(W) walk the path
//! backwards instead ([`crate::kernel::engine::stateful`]); they use the same accumulator and
//! contractions.

use crate::error::Result;
use crate::kernel::gram::GramAccumulator;
use crate::kernel::types::{NodeStats, Points};
use crate::model::Params;

/// One step's inputs.
pub(crate) struct StepInput<'a> {
    /// `w_s`.
    pub state: &'a Params,
    /// `w_{s+1}` when the rows are integrated over the step, else `None` (t = 0).
    pub next: Option<&'a Params>,
    /// Row points `[P, d]` and their `zero_output` offsets `[P, K]`.
    pub rows: &'a Points,
    pub off_rows: Option<&'a [f64]>,
    /// Training inputs `[M, d]` and offsets `[M, K]`.
    pub x_train: &'a [f64],
    pub off_train: Option<&'a [f64]>,
    /// A fixed rule's `(t, weight)` nodes, or `None` for the adaptive rule with `tol_step`.
    pub fixed: Option<&'a [(f64, f64)]>,
    pub tol_step: f64,
    /// The auto rule's tolerance, relative for the rows' self-kernel on the node search's
    /// product-integrated pieces (`crate::kernel::quadrature::reduce::SoftmaxTable::simultaneous`).
    pub tol: f64,
    /// The training weights of the prediction `Σ_i a[i, k'] K_s[p, i, k, k']` `[M, K]`.
    pub a: &'a [f64],
    /// Scales the stored Gram's training gradients (Chen's kernel) `[M, K]`.
    pub colw: Option<&'a [f64]>,
    /// Whether to compute the paper's Fig. 2 cosine measure (integrated rows).
    pub cosine: bool,
    /// Whether to accumulate the rows' self-kernel.
    pub self_kernel: bool,
    /// The path-averaged kernel ([`crate::kernel::KernelKind::Path`]): the training side integrated over
    /// the step too, `K_s = ⟨J̄_s(x), J̄_s(x_i)⟩`, and the self-kernel `|J̄_s(x)|²`: the
    /// [`crate::kernel::stack::closed::dense_relu::pieces`] closed form (one-hidden-layer ReLU, identity outputs, auto rule), the layer
    /// stacks' [`crate::kernel::stack::path`] (any rule) and the generic reference (fixed rules).
    pub train_integrated: bool,
    /// The rows are the columns (the same training points and offsets) at `t = 0` and the
    /// training side is unscaled (no `colw`): the step's Gram is symmetric and its rows'
    /// gradients are the training side's (the EPK's training side, the DPK and the NTK of
    /// `--points train`; [`crate::kernel::stack::symmetric`]).
    pub rows_are_columns: bool,
}

/// One step's outputs.
pub(crate) struct StepOutput {
    /// Predicted change of the outputs `[P, K]`.
    pub pred: Vec<f64>,
    /// Gradient evaluations, forward-mode evaluations, pieces per point.
    pub stats: NodeStats,
    /// The Fig. 2 cosine measure (NaN when not computed).
    pub cosine: f64,
    /// With the per-layer decomposition, each parameter layer's share of `pred` (`L` arrays
    /// `[P, K]`); empty otherwise.
    pub layer_pred: Vec<Vec<f64>>,
}

/// A network on one training step, as the driver needs it.
pub(crate) trait StepModel {
    /// Adds the step into `acc` (its layout) and the rows' self-kernel into `diag` (`[P, K, K]`).
    fn add_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<StepOutput>;
}
