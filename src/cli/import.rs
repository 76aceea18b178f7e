//! `pathkernel import`

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::interop::{import_torch, ImportOptions};

/// Import a trajectory recorded by another framework as a run directory.
#[derive(clap::Args, Debug)]
#[command(long_about = "Import a trajectory recorded by a PyTorch training loop (scripts/record_torch_trajectory.py) as a run \
directory that kernel, gp, svm and attribute accept. DIR holds trajectory.json (model, optimizer gd or sgd, loss cross_entropy \
or mse, the learning rate of each step, the batch of each step for sgd), step_00000.safetensors ... (one f64 state_dict per \
state w_0..w_N) and data.safetensors (x_train, y_train, x_test, y_test). Before anything is written the recording is checked: \
contiguous step files, constant names and shapes, and every recorded update equal to -lr_s * the gradient recomputed here at w_s \
on its batch (the largest relative difference is printed; above --tolerance the step is named and nothing is written). \
Momentum, Adam and other stateful optimizers are refused: their kernel needs optimizer state the recording does not have.\n\
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
