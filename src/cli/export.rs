//! `pathkernel export`

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Export the network at one recorded state for another framework.
#[derive(clap::Args, Debug)]
#[command(long_about = "Export the network at state S of a recorded run (default: the last state N) as a PyTorch \
state_dict in safetensors, f64, under the names of the equivalent nn.Sequential (MLP: Linear, ReLU|Tanh, ..., Linear -> \
0.weight [out, in], 0.bias, 2.weight, ...; CNN: Conv2d, act, MaxPool2d, Flatten, Linear -> 0.*, 4.*). The module's output is \
the network's logits: alpha is folded into the last layer, and with zero_output the frozen initial network is stored as \
init.* tensors (output = net(x) - init(x)). The header's __metadata__ holds the architecture (JSON), the step and the source \
run. scripts/torch_model.py rebuilds the module (load) or runs it with numpy alone (forward_numpy). The file is written \
under a temporary name and renamed.\n\
Example: pathkernel export --run runs/toy --format torch --out toy.safetensors")]
pub struct Args {
    /// Run directory written by `pathkernel train` or `pathkernel import`.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// The state to export (0..=N; default N, the trained network).
    #[arg(long, value_name = "S")]
    step: Option<usize>,
    /// Output format: torch (a PyTorch state_dict in safetensors).
    #[arg(long, value_name = "FORMAT")]
    format: String,
    /// Output file.
    #[arg(long, value_name = "FILE.safetensors")]
    out: PathBuf,
    /// Replace OUT if it exists.
    #[arg(long)]
    force: bool,
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    if a.format != "torch" {
        return Err(Error::Config(format!("--format {}: the only export format is torch (a PyTorch state_dict in safetensors)", a.format)));
    }
    if a.out.exists() && !a.force {
        return Err(Error::Config(format!("{} already exists; choose another --out or pass --force", a.out.display())));
    }
    let exported = crate::interop::export_torch_to(&a.run, a.step, &a.out)?;
    println!("{exported} -> {}", a.out.display());
    Ok(())
}
