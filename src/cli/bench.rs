//! `pathkernel bench`

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::Result;
use crate::io::{Column, NamedArray, Table};
use crate::plot::{Scale, Series};
use crate::trajectory::Run;

/// Time kernel steps, the whole EPK, GP and SVM solves and a scaling sweep (JSON lines).
#[derive(clap::Args, Debug)]
#[command(long_about = "Time one NTK step, one EPK step (auto quadrature) and one DPK step of a recorded run \
on its test points against its whole training set, and print one JSON line per measurement: name, sizes, \
fastest and median wall-clock seconds over --repeat runs, gradient evaluations per point, peak heap bytes \
above the start of the case and the bytes of its outputs.\n\n\
--full adds the whole EPK (all steps) unblocked and in row blocks; --gram-m M adds GP (Cholesky + solve) and \
SVM (SMO) on the class-0 block of the NTK on the first M training points; --scaling M1,M2,.. and \
--scaling-steps T1,T2,.. add the scaling sweep (Gaussian-mixture training sets of those sizes, EPK over the \
first T steps), written with --scaling-out as scaling.parquet and scaling.png. --export DIR writes the \
arrays the Python peers compare against (bench/compare.sh).\n\
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
    #[arg(long, default_value = "1e-12")]
    tol: f64,
    /// Also the whole EPK over all steps (unblocked, and in --full-blocks row blocks).
    #[arg(long)]
    full: bool,
    /// Row blocks of the blocked whole EPK.
    #[arg(long, default_value_t = 10)]
    full_blocks: usize,
    /// Also GP and SVM on the NTK Gram of the first M training points.
    #[arg(long, value_name = "M")]
    gram_m: Option<usize>,
    /// Scaling sweep over training-set sizes, e.g. 300,1000,3000,10000.
    #[arg(long, value_name = "M,..", value_delimiter = ',')]
    scaling: Vec<usize>,
    /// Scaling sweep over the number of EPK steps, e.g. 1,3,10,30,100.
    #[arg(long, value_name = "T,..", value_delimiter = ',')]
    scaling_steps: Vec<usize>,
    /// Where the scaling sweep's table and chart go.
    #[arg(long, value_name = "DIR", default_value = "bench/out")]
    scaling_out: PathBuf,
    /// Write the compared arrays (NTK step Gram, GP/SVM problem and solutions) and results.jsonl.
    #[arg(long, value_name = "DIR")]
    export: Option<PathBuf>,
    /// CNN runs: time one EPK step with this fixed rule (e.g. left:10) through the generic
    /// autodiff Gram path and the structured CNN path, and print their speed-up.
    #[arg(long, value_name = "RULE")]
    conv_compare: Option<crate::kernel::Rule>,
    /// MLP and layer-stack runs: compute the EPK (auto quadrature, --tol) of the test points
    /// against the training set in this layout (full, diag or trace) over --steps, and print the
    /// contraction's GFLOP/s (flops counted from the product shapes) next to faer's GEMM rate on
    /// a square product of similar size, measured in the same run; for a stack also the seconds
    /// of its gradient evaluations and of its node search.
    #[arg(long, value_name = "LAYOUT")]
    contraction: Option<crate::kernel::Layout>,
    /// Steps A:B of the --contraction computation (default: all).
    #[arg(long, value_name = "A:B")]
    steps: Option<String>,
    /// Where --contraction's work runs: cpu or cuda (the MLP's closed form, its whole step with
    /// the Gram resident on the GPU; a stack's node gradients on the GPU; a GPU, its driver and
    /// libcublas.so.13 are needed, else one line and exit 2). With cuda the GEMM rate printed is
    /// cuBLAS's.
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    device: crate::kernel::Device,
    /// With --contraction LAYOUT and --device cuda: compute the Gram with its GEMMs on the CPU
    /// and on the GPU in the same process and print their largest difference (relative to the
    /// Gram's largest entry), both times and both kernel machines' errors.
    #[arg(long)]
    compare: bool,
    /// Print the device's name and its DGEMM rate on an N x N x N product (fastest of --repeat
    /// after a warm-up); the run is only opened.
    #[arg(long, value_name = "N")]
    dgemm: Option<usize>,
    /// Time the cross-class function-space Laplace factorisations at these system sizes M·K
    /// (e.g. 5000,20000): the Cholesky of I + G/δ (one δ) and the eigendecomposition of G (every
    /// δ) on a random SPD matrix of that size (`gp::crossclass::factor_timings`), one JSON line
    /// each; the run is not used.
    #[arg(long, value_name = "N,..", value_delimiter = ',')]
    fsl_kxk: Vec<usize>,
    /// With --fsl-kxk: the eigendecomposition only up to this size (it costs about ten
    /// Choleskys).
    #[arg(long, value_name = "N")]
    fsl_kxk_eig_max: Option<usize>,
    /// Time a whole cross-class fit by the Cholesky route (`gp::crossclass::fit_timings`) at
    /// these numbers of training points M (10 classes: a [10 M, 10 M] system; the full curvature,
    /// δ by the evidence, then the predictive at --fsl-kxk-rows rows) on a random problem, one
    /// JSON line each; the run is not used. Memory: 2.5 (10 M)² f64 (8.0 GB at M = 2 000).
    #[arg(long, value_name = "M,..", value_delimiter = ',')]
    fsl_kxk_fit: Vec<usize>,
    /// With --fsl-kxk-fit: rows of the timed predictive.
    #[arg(long, value_name = "P", default_value_t = 100)]
    fsl_kxk_rows: usize,
}

/// Runs the subcommand.
pub fn exec(a: Args) -> Result<()> {
    if !a.fsl_kxk_fit.is_empty() {
        for &m in &a.fsl_kxk_fit {
            let r = crate::gp::crossclass::fit_timings(m, a.fsl_kxk_rows, 0)?;
            println!("{}", serde_json::to_string(&r).expect("serialisable"));
        }
        return Ok(());
    }
    if !a.fsl_kxk.is_empty() {
        for &n in &a.fsl_kxk {
            let eig = a.fsl_kxk_eig_max.is_none_or(|max| n <= max);
            let r = crate::gp::crossclass::factor_timings(n, 0, eig)?;
            println!("{}", serde_json::to_string(&r).expect("serialisable"));
        }
        return Ok(());
    }
    let run = Run::open(&a.run)?;
    let step = a.step.unwrap_or(run.manifest.steps / 2);
    if !(a.tol.is_finite() && a.tol > 0.0) {
        return Err(crate::Error::Config(format!("--tol {}: must be > 0", a.tol)));
    }
    if let Some(n) = a.dgemm {
        let r = crate::bench::dgemm(a.device, n, a.repeat)?;
        println!("{}", serde_json::to_string(&r).expect("serialisable"));
        return Ok(());
    }
    if a.compare && a.contraction.is_none() {
        return Err(crate::Error::Config("--compare needs --contraction LAYOUT".into()));
    }
    if let Some(layout) = a.contraction {
        let steps = a.steps.as_deref().map(crate::kernel::parse_step_range).transpose()?;
        let rule = crate::kernel::Rule::Auto(a.tol);
        if a.compare {
            let r = crate::bench::device_compare(&run, rule, layout, steps, a.device)?;
            println!("{}", serde_json::to_string(&r).expect("serialisable"));
            return Ok(());
        }
        let r = crate::bench::contraction_rate(&run, crate::kernel::KernelKind::Epk, rule, layout, steps, a.device)?;
        println!("{}", serde_json::to_string(&r).expect("serialisable"));
        return Ok(());
    }
    if let Some(rule) = a.conv_compare {
        let r = crate::bench::conv_paths(&run, step, a.repeat, rule)?;
        println!("{}", serde_json::to_string(&r).expect("serialisable"));
        return Ok(());
    }
    let opts = crate::bench::BenchOptions {
        step,
        repeat: a.repeat,
        tol: a.tol,
        full: a.full,
        full_blocks: a.full_blocks,
        gram_m: a.gram_m,
        scaling: a.scaling.clone(),
        scaling_steps: a.scaling_steps.clone(),
    };
    let mut lines = Vec::new();
    let rep = crate::bench::run_all(&run, &opts, &mut |r| {
        let line = serde_json::to_string(r).expect("serialisable");
        println!("{line}");
        lines.push(line);
    })?;
    if !rep.scaling.is_empty() {
        crate::io::create_dir_all(&a.scaling_out)?;
        let col = |f: &dyn Fn(&(String, usize, usize, usize, f64, f64)) -> f64| rep.scaling.iter().map(f).collect::<Vec<f64>>();
        let table = Table::new()
            .with("kind", Column::Str(rep.scaling.iter().map(|r| r.0.clone()).collect()))
            .with("m", Column::I64(rep.scaling.iter().map(|r| r.1 as i64).collect()))
            .with("p", Column::I64(rep.scaling.iter().map(|r| r.2 as i64).collect()))
            .with("steps", Column::I64(rep.scaling.iter().map(|r| r.3 as i64).collect()))
            .with("seconds_min", Column::F64(col(&|r| r.4)))
            .with("seconds_median", Column::F64(col(&|r| r.5)));
        table.write_parquet(&a.scaling_out.join("scaling.parquet"))?;
        let mut series = Vec::new();
        for (kind, label) in [("ntk", "NTK, one step (P = 200, M varies)"), ("epk", "EPK auto, one step (P = 200, M varies)"), ("epk-steps", "EPK auto, M = 3000, P = 200, steps vary")] {
            let rows: Vec<_> = rep.scaling.iter().filter(|r| r.0 == kind).collect();
            if !rows.is_empty() {
                series.push(Series::new(label, rows.iter().map(|r| (r.1 * r.2 * r.3) as f64).collect(), rows.iter().map(|r| r.4).collect()));
            }
        }
        // One slope-1 reference through the NTK's largest point, over the whole x range.
        let xs: Vec<f64> = series.iter().flat_map(|s| s.x.iter().copied()).collect();
        let (xmin, xmax) = (xs.iter().copied().fold(f64::INFINITY, f64::min), xs.iter().copied().fold(0.0, f64::max));
        if let Some(s0) = series.first() {
            let (x1, y1) = (*s0.x.last().expect("non-empty"), *s0.y.last().expect("non-empty"));
            series.push(Series::new("slope 1 (time ∝ M·P·steps)", vec![xmin, xmax], vec![y1 * xmin / x1, y1 * xmax / x1]));
        }
        crate::plot::line_chart(
            &a.scaling_out.join("scaling.png"),
            "Kernel time vs M·P·steps (paper-toy MLP 100-64-3, log-log)",
            "M · P · steps",
            "seconds (fastest of repeats)",
            &series,
            Scale::Log,
            Scale::Log,
        )?;
        eprintln!("wrote {}", a.scaling_out.join("scaling.{parquet,png}").display());
    }
    if let Some(dir) = &a.export {
        crate::io::create_dir_all(dir)?;
        let meta = HashMap::from([("step".to_string(), step.to_string()), ("run".to_string(), a.run.display().to_string())]);
        let ntk = rep.results.iter().find(|r| r.name == "ntk_step").expect("always run");
        crate::io::write_safetensors(
            &dir.join("ntk_step.safetensors"),
            &[NamedArray::f64("gram", vec![ntk.points, ntk.train, ntk.outputs, ntk.outputs], rep.ntk_gram.clone())],
            Some(meta.clone()),
        )?;
        if let Some(g) = &rep.gram_problem {
            let m = g.m;
            crate::io::write_safetensors(
                &dir.join("gram_problem.safetensors"),
                &[
                    NamedArray::f64("k", vec![m, m], g.k.clone()),
                    NamedArray::f64("y", vec![m], g.y.clone()),
                    NamedArray::f64("noise", vec![1], vec![g.noise]),
                    NamedArray::f64("c", vec![1], vec![g.c]),
                    NamedArray::f64("tol", vec![1], vec![g.tol]),
                    NamedArray::f64("gp_alpha", vec![m], g.gp_alpha.clone()),
                    NamedArray::f64("svm_dual_coef", vec![m], g.svm_dual_coef.clone()),
                    NamedArray::f64("svm_intercept", vec![1], vec![g.svm_intercept]),
                    NamedArray::f64("svm_decision", vec![m], g.svm_decision.clone()),
                    NamedArray::i64("svm_iterations", vec![1], vec![g.svm_iterations as i64]),
                ],
                Some(meta),
            )?;
        }
        crate::io::write_atomic(&dir.join("results.jsonl"), (lines.join("\n") + "\n").as_bytes())?;
        eprintln!("wrote {}", dir.display());
    }
    Ok(())
}
