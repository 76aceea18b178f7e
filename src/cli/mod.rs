//! Command-line interface: one file per subcommand; each parses options and calls the library.
//!
//! Every failure is printed as one line `error: …` on stderr with exit status 2.

mod analyze;
mod bench;
mod kernel;
mod study;
mod tile;
mod train;

use clap::{Parser, Subcommand};

/// pathkernel: a trained neural network as the kernel machine it exactly is.
#[derive(Parser, Debug)]
#[command(
    name = "pathkernel",
    version,
    about = "Train networks with a recorded path and compute their exact path kernels (EPK), NTK and kernel machines",
    long_about = "pathkernel trains MLPs and small CNNs with dfdx in f64, recording every weight state w_0..w_N, \
and computes from that path the empirical NTK, Domingos' discrete path kernel and the Exact Path Kernel \
(Bell et al.) together with the kernel machine that reproduces the network's log-softmax outputs.\n\n\
Exit status: 0 on success, 2 on any error (one line on stderr)."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a network from a TOML config and record its trajectory into a run directory.
    Train(train::Args),
    /// Compute NTK, DPK, EPK, Chen or k' Grams of a recorded run and the kernel machine.
    Kernel(kernel::Args),
    /// Time one NTK, EPK and DPK step of a recorded run (JSON lines).
    Bench(bench::Args),
    /// GP logit regression on a kernel and Monte-Carlo softmax posteriors.
    Gp(analyze::GpArgs),
    /// One-vs-rest SVM refit of the kernel machine's weights.
    Svm(analyze::SvmArgs),
    /// Per-training-point contributions to chosen predictions.
    Attribute(analyze::AttributeArgs),
    /// Stationarity score and far-field behaviour of a kernel.
    Stationarity(analyze::StationarityArgs),
    /// Run a TOML-scripted study (training, kernels, tables, summary) into reports/.
    Study(study::Args),
    /// Tiled kernel jobs (plans from `kernel --tiles`): run, merge, status, slurm, compare.
    Tile(tile::Args),
}

/// Parses the command line, runs the subcommand and returns the process exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(a) => train::exec(a),
        Command::Kernel(a) => kernel::exec(a),
        Command::Bench(a) => bench::exec(a),
        Command::Study(a) => study::exec(a),
        Command::Tile(a) => tile::exec(a),
        Command::Gp(a) => analyze::gp(a),
        Command::Svm(a) => analyze::svm(a),
        Command::Attribute(a) => analyze::attribute(a),
        Command::Stationarity(a) => analyze::stationarity(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            2
        }
    }
}

fn one_line(e: &crate::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s.replace('\n', " ")
}
