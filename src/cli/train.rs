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
    /// Override one key of the configuration, as TOML: `--set train.optimizer=adamw
    /// --set train.lr=0.01 --set 'train.betas=[0.9, 0.99]'` (repeatable; values that are not
    /// valid TOML are taken as strings).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Memory budget, e.g. 8G or 512M: training is refused with an estimate when it would need more.
    #[arg(long, default_value = "16G", value_name = "SIZE")]
    memory: String,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// Applies `SECTION.KEY=VALUE` overrides to a TOML document.
fn apply_overrides(text: &str, origin: &std::path::Path, sets: &[String]) -> Result<String> {
    if sets.is_empty() {
        return Ok(text.to_string());
    }
    let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| crate::Error::format(origin, e.message().replace('\n', " ")))?;
    for set in sets {
        let bad = || crate::Error::Config(format!("--set `{set}`: expected SECTION.KEY=VALUE, e.g. train.optimizer=adamw"));
        let (path, value) = set.split_once('=').ok_or_else(bad)?;
        let (section, key) = path.trim().split_once('.').ok_or_else(bad)?;
        if section.is_empty() || key.is_empty() || key.contains('.') {
            return Err(bad());
        }
        let v: toml::Value = match format!("v = {}", value.trim()).parse::<toml::Table>() {
            Ok(mut t) => t.remove("v").expect("parsed key"),
            Err(_) => toml::Value::String(value.trim().to_string()),
        };
        let table = doc.entry(section.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match table {
            toml::Value::Table(t) => {
                t.insert(key.to_string(), v);
            }
            _ => return Err(crate::Error::Config(format!("--set `{set}`: `{section}` is not a section of the configuration"))),
        }
    }
    Ok(toml::to_string(&doc).expect("a TOML table serialises"))
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    let budget = crate::io::parse_bytes(&a.memory)?;
    let opts = TrainOptions { progress: !a.quiet, force: a.force, base_dir: PathBuf::from("."), memory_budget: Some(budget) };
    if let Some(dir) = &a.resume {
        if a.device.is_some() || !a.set.is_empty() {
            return Err(crate::Error::Config("--device and --set cannot change a run being resumed".into()));
        }
        let summary = crate::train::resume_to_dir(dir, &opts)?;
        println!("{summary}");
        return Ok(());
    }
    let (config, out) = (a.config.expect("clap requires --config"), a.out.expect("clap requires --out"));
    let text = std::fs::read_to_string(&config).map_err(|e| crate::Error::io(&config, e))?;
    let text = apply_overrides(&text, &config, &a.set)?;
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
