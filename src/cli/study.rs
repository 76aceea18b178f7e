//! `pathkernel study`

use std::path::PathBuf;

use crate::error::Result;
use crate::study::{self, StudyOptions};

/// Run a TOML-scripted study (training, kernels, tables, summary) into reports/.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Run a study file end to end into reports/NAME (or --out).
    #[command(long_about = "Run a study file end to end: train as configured by its [data], [model] and [train] \
sections (reusing the cached trajectory when the configuration is unchanged), compute every [[kernel]] entry \
(reused when unchanged), and write tables, JSON summaries and summary.md into reports/NAME (replaced only \
when complete). Trajectories and Grams are cached under runs/NAME. \
Example: pathkernel study run data/studies/paper-toy.toml")]
    Run {
        /// The study TOML file.
        #[arg(value_name = "FILE.toml")]
        file: PathBuf,
        /// Report directory (default reports/NAME).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Cache directory for trajectories and Grams (default runs/NAME).
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
        /// No progress bars.
        #[arg(long, short)]
        quiet: bool,
    },
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    match a.command {
        Sub::Run { file, out, cache, quiet } => {
            let mut parts: Vec<String> = std::env::args().collect();
            parts[0] = "pathkernel".into();
            let command = parts.join(" ");
            let opts = StudyOptions { out, cache, base_dir: PathBuf::from("."), progress: !quiet, command };
            let s = study::run(&file, &opts)?;
            println!("study -> {} ({:.1} s{})", s.out.display(), s.seconds, if s.reused_run { ", trajectory reused" } else { "" });
            for (label, reused, e) in &s.kernels {
                println!(
                    "  {label}: max |kernel machine - network| {:.3e}, {:.2} gradient evaluations per point and step{}",
                    e.max_abs_error,
                    e.evaluations_per_step.mean,
                    if *reused { " (cached)" } else { "" }
                );
            }
            Ok(())
        }
    }
}
