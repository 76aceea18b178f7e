//! `pathkernel train`

use std::path::PathBuf;

use crate::error::Result;
use crate::train::{train_to_dir, RunConfig, TrainOptions};

/// Train a network from a TOML configuration and record w_0 … w_N.
#[derive(clap::Args, Debug)]
#[command(long_about = "Train a network from a TOML configuration with [data], [model] and [train] sections \
and record every weight state w_0..w_N into --out (manifest.json, dataset.safetensors, \
trajectory/step-NNNNNN.safetensors, train_log.parquet). The run is staged in OUT.partial and only moved \
to OUT when complete. Example: pathkernel train --config data/studies/paper-toy.toml --out runs/toy")]
pub struct Args {
    /// TOML configuration file ([data], [model], [train]).
    #[arg(long, value_name = "FILE.toml")]
    config: PathBuf,
    /// Run directory to create.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Replace OUT if it already holds something (only after the new run completed).
    #[arg(long)]
    force: bool,
    /// Override train.device from the config (cpu or cuda; cuda needs the `cuda` build feature).
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    let mut cfg = RunConfig::load(&a.config)?;
    if let Some(d) = &a.device {
        cfg.train.device = match d.as_str() {
            "cpu" => crate::train::DeviceKind::Cpu,
            "cuda" => crate::train::DeviceKind::Cuda,
            other => return Err(crate::Error::Config(format!("--device {other}: expected cpu or cuda"))),
        };
    }
    let opts = TrainOptions { progress: !a.quiet, force: a.force, base_dir: PathBuf::from(".") };
    let summary = train_to_dir(&cfg, &a.out, &opts)?;
    println!("{summary}");
    Ok(())
}
