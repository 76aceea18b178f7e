//! `pathkernel import`

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::interop::{import_torch, ImportOptions};

/// Import a trajectory recorded by another framework as a run directory.
#[derive(clap::Args, Debug)]
#[command(long_about = "Import a trajectory recorded by a PyTorch training loop (scripts/record_torch_trajectory.py) as a run \
directory that kernel, gp, svm and attribute accept. DIR holds trajectory.json (model; optimizer: version 2 gives the torch.optim \
class, SGD, Adam, AdamW, RMSprop or Adagrad, and every hyper-parameter; momenta per step when a scheduler cycled them; gradient clipping by norm with each step's factor, version 1 names plain gd or sgd; precision; loss cross_entropy or mse; the \
learning rate of each step; the batch of each step, absent for full batch), step_00000.safetensors ... (one state_dict per state \
w_0..w_N, float64 or float32) and data.safetensors (x_train, y_train, x_test, y_test). Before anything is written the recording \
is checked: contiguous step files each holding its own step, constant names and shapes, and every recorded update equal to the \
optimizer's update replayed here with PyTorch's formulas (momentum, dampening, Nesterov, weight decay; Adam's moments and bias \
corrections; AdamW's decoupled decay; RMSprop's and Adagrad's preconditioners) from the gradients recomputed in f64 at w_s on its batch, \
each coordinate's difference measured in units of the run's rounding u(|w_s| + |w_s+1| + 64 max|update|), u the unit roundoff of its \
precision (the largest absolute, relative and ulps figures are printed; above --tolerance the step is named with all three and nothing is written). The run records the optimizer as a native run of it would, \
so its kernels are exact machines; a float32 recording's rounding (recorded minus replayed update) is carried as the kernel's \
residual term. Refused, each in one line: half precision, amsgrad, maximize, RMSprop with momentum, clipping by value, Nesterov with a cycled momentum, \
other optimizers, missing hyper-parameters.\n\
Example: pathkernel import --from torch tests/data/torch-trajectory --out runs/torch")]
pub struct Args {
    /// The recording's framework: torch.
    #[arg(long, value_name = "FRAMEWORK")]
    from: String,
    /// The recording directory.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Run directory to create.
    #[arg(long, value_name = "OUT")]
    out: PathBuf,
    /// Largest accepted difference between a recorded update and the optimizer's update replayed
    /// here, per coordinate in units of u(|w_s| + |w_s+1| + 64 max|update|), u the unit roundoff
    /// of the recording's precision [default: 4].
    #[arg(long, value_name = "TOL")]
    tolerance: Option<f64>,
    /// Replace OUT if it already holds something (only after the import succeeded).
    #[arg(long)]
    force: bool,
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    if a.from != "torch" {
        return Err(Error::Config(format!("--from {}: the only recording format is torch", a.from)));
    }
    let summary = import_torch(&a.dir, &a.out, &ImportOptions { tolerance: a.tolerance, force: a.force })?;
    println!("{summary}");
    Ok(())
}
