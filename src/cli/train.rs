//! `pathkernel train`

use std::path::PathBuf;

use crate::error::Result;
use crate::train::{train_to_dir, RunConfig, TrainOptions};

/// Train a network from a TOML configuration and record w_0 … w_N.
#[derive(clap::Args, Debug)]
#[command(long_about = "Train a network from a TOML configuration with [data], [model] and [train] sections \
(a study file is accepted too; its other entries are ignored here) \
and record every weight state w_0..w_N into --out (manifest.json, dataset.safetensors, \
trajectory/step-NNNNNN.safetensors, train_log.parquet). The run is staged in OUT.partial and only moved \
to OUT when complete. Example: pathkernel train --config data/studies/paper-toy.toml --out runs/toy")]
pub struct Args {
    /// TOML configuration file ([data], [model], [train]) or a study file.
    #[arg(long, value_name = "FILE.toml", required_unless_present = "resume", conflicts_with = "resume")]
    config: Option<PathBuf>,
    /// Run directory to create.
    #[arg(long, value_name = "DIR", required_unless_present = "resume", conflicts_with = "resume")]
    out: Option<PathBuf>,
    /// Continue an interrupted run into DIR from the last complete step recorded in DIR.partial
    /// (the configuration is read from its manifest; the result is identical to an uninterrupted run).
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
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
    let opts = TrainOptions { progress: !a.quiet, force: a.force, base_dir: PathBuf::from(".") };
    if let Some(dir) = &a.resume {
        if a.device.is_some() {
            return Err(crate::Error::Config("--device cannot change a run being resumed".into()));
        }
        let summary = crate::train::resume_to_dir(dir, &opts)?;
        println!("{summary}");
        return Ok(());
    }
    let (config, out) = (a.config.expect("clap requires --config"), a.out.expect("clap requires --out"));
    let text = std::fs::read_to_string(&config).map_err(|e| crate::Error::io(&config, e))?;
    // A study file (with `name` and [[kernel]] entries) also configures a training run.
    let is_study = text.parse::<toml::Table>().map(|t| t.contains_key("name")).unwrap_or(false);
    let mut cfg = if is_study {
        crate::study::StudyConfig::from_toml(&text, &config)?.run_config()
    } else {
        RunConfig::from_toml(&text, &config)?
    };
    if let Some(d) = &a.device {
        cfg.train.device = match d.as_str() {
            "cpu" => crate::train::DeviceKind::Cpu,
            "cuda" => crate::train::DeviceKind::Cuda,
            other => return Err(crate::Error::Config(format!("--device {other}: expected cpu or cuda"))),
        };
    }
    let summary = train_to_dir(&cfg, &out, &opts)?;
    println!("{summary}");
    Ok(())
}
