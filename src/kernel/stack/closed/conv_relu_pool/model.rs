//! The step model of `conv2d → relu → max_pool2d → flatten → dense` under the auto rule: its
//! closed form ([`super::gram`]).

use crate::error::{Error, Result};
use crate::kernel::gram::GramAccumulator;
use crate::kernel::step_model::{StepInput, StepModel, StepOutput};
use crate::kernel::stack::closed::shape::ConvReluPool;

use super::gram as cnn_gram;

/// The closed form of a `conv2d → relu → max_pool2d → flatten → dense` stack (the auto rule's
/// integrated rows only).
pub(crate) struct ConvReluPoolModel<'a> {
    pub shape: &'a ConvReluPool,
}

impl StepModel for ConvReluPoolModel<'_> {
    fn add_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<StepOutput> {
        if input.fixed.is_some() {
            return Err(Error::Config("the conv → relu → max-pool closed form integrates rows under the auto quadrature only".into()));
        }
        let (pred, stats, cosine) = cnn_gram::step_into(
            self.shape,
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
