//! The ReLU CNN preset's step model under the auto rule: its closed form ([`super::gram`]).

use crate::error::{Error, Result};
use crate::kernel::gram::GramAccumulator;
use crate::kernel::step_model::{StepInput, StepModel, StepOutput};
use crate::model::Architecture;

use super::gram as cnn_gram;

/// The ReLU CNN preset on its closed form (the engine routes only the auto rule here).
pub(crate) struct CnnModel<'a> {
    pub arch: &'a Architecture,
}

impl StepModel for CnnModel<'_> {
    fn add_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<StepOutput> {
        if input.fixed.is_some() {
            return Err(Error::Config("the CNN preset's closed form is the auto rule's; a fixed rule runs on its layer stack".into()));
        }
        let (pred, stats, cosine) = cnn_gram::step_into(
            self.arch,
            input.state,
            input.next,
            &input.rows.x,
            input.off_rows,
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
