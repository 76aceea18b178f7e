//! The CNN preset's step model: formed conv-layer gradients and dense factors ([`super::gram`]),
//! any quadrature rule.

use crate::error::Result;
use crate::kernel::gram::GramAccumulator;
use crate::kernel::step_model::{StepInput, StepModel, StepOutput};
use crate::model::Architecture;

use super::gram as cnn_gram;

/// CNNs on the structured path.
pub(crate) struct CnnModel<'a> {
    pub arch: &'a Architecture,
}

impl StepModel for CnnModel<'_> {
    fn add_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<StepOutput> {
        let (pred, stats, cosine) = cnn_gram::step_into(
            self.arch,
            input.state,
            input.next,
            &input.rows.x,
            input.off_rows,
            input.fixed,
            input.tol_step,
            input.x_train,
            input.off_train,
            acc.sink_mut(),
            diag,
            input.a,
            input.colw,
            input.cosine,
        )?;
        Ok(StepOutput { pred, stats, cosine, layer_pred: Vec::new() })
    }
}
