//! `pathkernel laplace`

use std::collections::HashMap;
use std::path::PathBuf;

use crate::data::Targets;
use crate::error::{Error, Result};
use crate::gp::{LaplaceParams, LastLayerLaplace};
use crate::io::StagedDir;
use crate::kernel::Rows;
use crate::trajectory::Run;

/// Last-layer Laplace of a recorded classification run.
#[derive(clap::Args, Debug)]
#[command(long_about = "Fit the last-layer Laplace approximation of the network at state S of a recorded \
classification run (default: the last state N) on its training set, as the uncertainty benchmark does \
(src/gp/lastlayer.rs: the exact GGN of the summed cross-entropy for the final layer's weights and bias, prior \
N(0, 1/lambda I), lambda by the Laplace marginal likelihood unless --prior-precision is given), and its logit \
posterior at the row points. Writes OUT/laplace.safetensors (precision H + lambda I [D,D], hessian [D,D], \
covariance [D,D], theta [D], points [P,d], mean [P,K], cov [P,K,K], variance [P,K]; parameters class-blocked: \
index k*q + j holds W[k, j] for j < h and b[k] for j = h, q = h + 1 with biases) and OUT/laplace.json (lambda, \
evidence, sizes).\n\
Example: pathkernel laplace --run runs/mnist --points test --out runs/mnist-laplace")]
pub struct Args {
    /// Run directory written by `pathkernel train` or `pathkernel import`.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// The state whose final layer is the posterior mean (0..=N; default N, the trained network).
    #[arg(long, value_name = "S")]
    step: Option<usize>,
    /// A fixed prior precision lambda > 0 instead of the marginal-likelihood search.
    #[arg(long, value_name = "LAMBDA", allow_hyphen_values = true)]
    prior_precision: Option<f64>,
    /// The marginal-likelihood search grid: POINTS values of log10 lambda from MIN to MAX (the
    /// benchmark's default -8:8:161).
    #[arg(long, value_name = "MIN:MAX:POINTS", allow_hyphen_values = true)]
    grid: Option<String>,
    /// Row points: test, train, class-means or grid:N (2-D data).
    #[arg(long, default_value = "test", value_name = "SET")]
    points: String,
    /// Output directory.
    #[arg(long, value_name = "OUT")]
    out: PathBuf,
    /// Replace OUT if it exists (only after the fit succeeded).
    #[arg(long)]
    force: bool,
}

/// `MIN:MAX:POINTS` of `--grid`.
fn parse_grid(s: &str) -> Result<(f64, f64, usize)> {
    let bad = || Error::Config(format!("--grid {s}: expected MIN:MAX:POINTS (log10 lambda from MIN to MAX, POINTS >= 3), e.g. -8:8:161"));
    let parts: Vec<&str> = s.split(':').collect();
    let [lo, hi, n] = parts.as_slice() else { return Err(bad()) };
    Ok((lo.parse().map_err(|_| bad())?, hi.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?))
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    let mut lp = LaplaceParams::new();
    match (a.prior_precision, &a.grid) {
        (Some(_), Some(_)) => return Err(Error::Config("--grid is the marginal-likelihood search's; it does not apply with --prior-precision".into())),
        (Some(l), None) => lp = lp.prior_precision(l),
        (None, Some(g)) => {
            let (lo, hi, n) = parse_grid(g)?;
            lp = lp.grid(lo, hi, n);
        }
        (None, None) => {}
    }
    let spec: Rows = a.points.parse()?;
    let run = Run::open(&a.run)?;
    let n = run.manifest.steps;
    let step = a.step.unwrap_or(n);
    if step > n {
        return Err(Error::Config(format!("--step {step} is beyond the last state {n} of {}", run.dir.display())));
    }
    let Targets::Labels(labels) = &run.dataset.y_train else {
        return Err(Error::Config(format!("{}: last-layer Laplace needs a classification run (labels), this one is a regression", run.dir.display())));
    };
    let points = spec.resolve(&run.dataset)?;
    let (params, init) = (run.load_step(step)?, run.load_step(0)?);
    let arch = &run.manifest.architecture;
    let fit = LastLayerLaplace::fit(arch, &params, Some(&init), &run.dataset.x_train, labels, &lp)?;
    let staged = StagedDir::new(&a.out, a.force)?;
    let meta = HashMap::from([("run_id".to_string(), run.manifest.run_id.clone()), ("step".to_string(), step.to_string()), ("points".to_string(), a.points.clone())]);
    let pred = fit.save(&staged.path().join("laplace.safetensors"), &points.x, meta)?;
    let post = fit.posterior();
    let tv = pred.total_variance();
    let summary = serde_json::json!({
        "format": "pathkernel-lastlayer-laplace",
        "run_id": run.manifest.run_id,
        "step": step,
        "points": a.points,
        "n_points": pred.p,
        "n_train": labels.len(),
        "classes": post.classes(),
        "features": post.features(),
        "num_params": post.num_params(),
        "prior": if a.prior_precision.is_some() { "fixed" } else { "evidence" },
        "grid": if a.prior_precision.is_some() { serde_json::Value::Null } else { serde_json::json!([lp.log10_min, lp.log10_max, lp.grid_points]) },
        "prior_precision": post.prior_precision(),
        "log_marginal_likelihood": post.evidence(),
        "log_likelihood": post.log_likelihood(),
        "clamped_eigenvalues": post.clamped_eigenvalues(),
        "mean_total_variance": tv.iter().sum::<f64>() / tv.len().max(1) as f64,
    });
    crate::io::write_json(&staged.path().join("laplace.json"), &summary)?;
    let dir = staged.commit()?;
    println!(
        "last-layer Laplace of {} at state {step}: D = {} parameters, lambda = {:e} ({}), log evidence {:.6}, {} row points",
        run.dir.display(),
        post.num_params(),
        post.prior_precision(),
        if a.prior_precision.is_some() { "fixed" } else { "marginal likelihood" },
        post.evidence(),
        pred.p
    );
    println!("wrote {}", dir.display());
    Ok(())
}
