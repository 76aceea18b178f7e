//! `pathkernel import`

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::interop::{import_torch, ImportOptions};

/// Import a trajectory recorded by another framework as a run directory.
#[derive(clap::Args, Debug)]
#[command(long_about = "Import a trajectory recorded by a PyTorch training loop (scripts/record_torch_trajectory.py) as a run \
directory that kernel, gp, svm and attribute accept. DIR holds trajectory.json (model; optimizer: version 2 gives the torch.optim \
class, SGD, Adam or AdamW, and every hyper-parameter, version 1 names plain gd or sgd; precision; loss cross_entropy or mse; the \
learning rate of each step; the batch of each step, absent for full batch), step_00000.safetensors ... (one state_dict per state \
w_0..w_N, float64 or float32) and data.safetensors (x_train, y_train, x_test, y_test). Before anything is written the recording \
is checked: contiguous step files each holding its own step, constant names and shapes, and every recorded update equal to the \
optimizer's update replayed here with PyTorch's formulas (momentum, dampening, Nesterov, weight decay; Adam's moments and bias \
corrections; AdamW's decoupled decay) from the gradients recomputed in f64 at w_s on its batch (the largest relative difference is \
printed; above --tolerance the step is named and nothing is written). The run records the optimizer as a native run of it would, \
so its kernels are exact machines; a float32 recording's rounding (recorded minus replayed update) is carried as the kernel's \
residual term. Refused: half precision, amsgrad, maximize, other optimizers, missing hyper-parameters.\n\
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
    /// Largest accepted relative difference (max-norm) between a recorded update and the optimizer's
    /// update replayed here [default: 1e-9 for float64 recordings, 1e-2 for float32].
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
