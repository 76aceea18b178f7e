//! Command-line interface: one file per subcommand; each parses options and calls the library.
//!
//! Every failure is printed as one line `error: …` on stderr with exit status 2.

mod analyze;
mod bench;
mod export;
mod import;
mod kernel;
mod laplace;
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
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The variants carry no doc comments on purpose: clap would take a variant's doc comment as the
// subcommand's `about` and reset its `long_about`, hiding the long help (outputs written,
// examples) that each subcommand's `Args` declares in its own file.
#[derive(Subcommand, Debug)]
enum Command {
    Train(train::Args),
    Kernel(kernel::Args),
    Bench(bench::Args),
    Gp(analyze::GpArgs),
    Svm(analyze::SvmArgs),
    Attribute(analyze::AttributeArgs),
    Stationarity(analyze::StationarityArgs),
    Study(study::Args),
    /// Tiled kernel jobs (plans from `kernel --tiles`): run, merge, status, slurm, compare.
    Tile(tile::Args),
    Export(export::Args),
    Import(import::Args),
    Laplace(laplace::Args),
}

/// Parses the command line, runs the subcommand and returns the process exit status.
pub fn main() -> i32 {
    quiet_on_closed_stdout();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Train(a) => train::exec(a),
        Command::Kernel(a) => kernel::exec(a),
        Command::Bench(a) => bench::exec(a),
        Command::Study(a) => study::exec(a),
        Command::Tile(a) => tile::exec(a),
        Command::Export(a) => export::exec(a),
        Command::Import(a) => import::exec(a),
        Command::Laplace(a) => laplace::exec(a),
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

/// `pathkernel … | head` closes stdout before the summary is printed, and `println!` panics on
/// the broken pipe. Leave instead, as a program killed by SIGPIPE would (status 141), without a
/// panic message: every output file is written (atomically) before the summary is printed.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload_as_str().unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

/// A command line clap refuses, as one line `error: …` with exit status 2 (help and version
/// requests print as clap prints them, status 0).
fn usage_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
        e.exit();
    }
    let text = e.to_string();
    let first = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("invalid command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let first = first.strip_suffix('.').unwrap_or(first);
    eprintln!("error: {first} (see --help)");
    2
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
