//! `pathkernel bench`

use std::path::PathBuf;

use crate::error::Result;
use crate::trajectory::Run;

/// Time one NTK, one EPK and one DPK step of a recorded run (JSON lines on stdout).
#[derive(clap::Args, Debug)]
#[command(long_about = "Time one NTK step, one EPK step (auto quadrature) and one DPK step of a recorded run \
on its test points against its whole training set, and print one JSON line per measurement: name, sizes, \
fastest and median wall-clock seconds over --repeat runs, gradient evaluations per point. \
Example (the paper toy: 200 test x 3000 train): pathkernel bench --run runs/toy --step 50")]
pub struct Args {
    /// Run directory written by `pathkernel train`.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// The step to time (default: the middle of the run).
    #[arg(long, value_name = "S")]
    step: Option<usize>,
    /// Repetitions (the fastest and the median are reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Tolerance of the EPK's auto quadrature.
    #[arg(long, default_value_t = 1e-12)]
    tol: f64,
    /// CNN runs: time one EPK step with this fixed rule (e.g. left:10) through the generic
    /// autodiff Gram path and the structured CNN path, and print their speed-up.
    #[arg(long, value_name = "RULE")]
    conv_compare: Option<crate::kernel::Rule>,
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    let run = Run::open(&a.run)?;
    let step = a.step.unwrap_or(run.manifest.steps / 2);
    if !(a.tol.is_finite() && a.tol > 0.0) {
        return Err(crate::Error::Config(format!("--tol {}: must be > 0", a.tol)));
    }
    if let Some(rule) = a.conv_compare {
        let r = crate::bench::conv_paths(&run, step, a.repeat, rule)?;
        println!("{}", serde_json::to_string(&r).expect("serialisable"));
        return Ok(());
    }
    for r in crate::bench::kernel_steps(&run, step, a.repeat, a.tol)? {
        println!("{}", serde_json::to_string(&r).expect("serialisable"));
    }
    Ok(())
}
