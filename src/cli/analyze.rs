//! `pathkernel gp`, `svm`, `attribute` and `stationarity`: analyses of a run's kernels.

use std::path::{Path, PathBuf};

use crate::api::{Gram, Rows, Trained};
use crate::error::{Error, Result};
use crate::gp::GpParams;
use crate::io::StagedDir;
use crate::kernel::Layout;
use crate::report::{self, GpTargets};
use crate::svm::SvmParams;
use crate::trajectory::Run;

/// Refuses, with the flag to use, a Gram (from `dir`) whose layout lacks the blocks `what`
/// needs.
fn require_blocks(g: &Gram, dir: &Path, need: Layout, what: &str) -> Result<()> {
    if g.layout().provides(need) {
        return Ok(());
    }
    Err(Error::Config(format!(
        "{}: holds the {} blocks of the Gram (--layout {}); {what} needs the {need} blocks: recompute it with `pathkernel kernel … --layout {need}`",
        dir.display(),
        g.layout(),
        g.layout()
    )))
}

/// Opens the Gram in `dir` (written by `pathkernel kernel`) for `net`; refuses a layout that
/// lacks the blocks `what` needs.
fn open_gram(dir: &Path, net: &Trained, need: Layout, what: &str) -> Result<Gram> {
    let g = Gram::open(dir, net)?;
    require_blocks(&g, dir, need, what)?;
    Ok(g)
}

/// [`open_gram`] for a train × train Gram in the `diag` or `full` layout: also refuses other
/// rows and a kernel form that is not symmetric (momentum and Adam kernels; symmetrising them
/// would change what they mean).
fn open_train_gram(dir: &Path, net: &Trained, what: &str) -> Result<Gram> {
    let g = Gram::open(dir, net)?;
    let form = g.output().form;
    if !form.symmetric() {
        return Err(Error::Config(format!(
            "{}: the kernel of this run is in `{form}` form, which is not a symmetric kernel; a GP or SVM needs one (train with gd/sgd, or use this kernel only as a kernel machine and for attribution)",
            dir.display()
        )));
    }
    if *g.rows() != Rows::Train {
        return Err(Error::Config(format!("{} is not a train×train kernel (compute it with `pathkernel kernel --points train --side train`)", dir.display())));
    }
    require_blocks(&g, dir, Layout::Diag, what)?;
    Ok(g)
}

/// What a GP or SVM fit would allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    /// One GP per class: Cholesky factors and solves.
    Gp,
    /// One-vs-rest SMO: class blocks and the solver's kernel rows.
    Svm,
}

/// Estimated peak bytes of a GP/SVM fit from the kernel directories on disk, checked against
/// `budget` *before* anything is loaded: reading both `gram.safetensors` (file bytes plus the
/// decoded arrays), then per class an `[M, M]` block with its factor (GP: also the
/// marginal-likelihood search's copy) and the `[P, M]` cross block.
fn check_fit_memory(fit: Fit, run: &Run, train_kernel: &Path, row_kernel: &Path, budget: u64) -> Result<()> {
    let size = |d: &Path| -> Result<u64> {
        let p = d.join("gram.safetensors");
        std::fs::metadata(&p).map(|m| m.len()).map_err(|e| Error::io(&p, e))
    };
    let (tb, rb) = (size(train_kernel)?, size(row_kernel)?);
    let (m, k) = (run.dataset.n_train() as u64, run.dataset.num_outputs as u64);
    let p = rb / (8 * m * k * k).max(1);
    let per_class = match fit {
        Fit::Gp => 8 * (3 * m * m + 3 * p * m),
        Fit::Svm => 8 * (2 * m * m + 2 * p * m),
    };
    let need = 2 * (tb + rb) + per_class;
    if need > budget {
        return Err(Error::OutOfMemoryBudget {
            what: format!("the {} fit on M = {m} training points and P = {p} rows (K = {k})", if fit == Fit::Gp { "GP" } else { "SVM" }),
            needed_bytes: need,
            budget_bytes: budget,
            hint: "use fewer row points in --kernel, a smaller training set, or raise --memory".into(),
        });
    }
    Ok(())
}

/// GP logit regression with the kernel as covariance, and Monte-Carlo softmax posteriors.
#[derive(clap::Args, Debug)]
#[command(long_about = "Gaussian-process regression of the network's outputs with the kernel as covariance, one \
independent GP per class (EPK paper §4.2), and a Monte-Carlo softmax posterior at the row points. \
--train-kernel is a train x train kernel (pathkernel kernel --points train --side train); --kernel holds the rows \
(e.g. --points test or grid:N) with their self-kernel; both on the same outputs (the network's, or its logits with \
--outputs logits: a GP on the logits). Writes gp.safetensors (k_train, k_cross, k_test_diag, \
targets, noise, output_scale, jitter, mean, var, points), gp.parquet, gp_points.parquet and gp.json.")]
pub struct GpArgs {
    /// Run directory.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// Train x train kernel directory.
    #[arg(long, value_name = "DIR")]
    train_kernel: PathBuf,
    /// Row kernel directory (points of interest x training set).
    #[arg(long, value_name = "DIR")]
    kernel: PathBuf,
    /// Regression targets: network (the outputs the kernels are on, the network's or its logits, minus the bias) or labels (one-hot).
    #[arg(long, default_value = "network")]
    targets: String,
    /// Noise variance.
    #[arg(long, default_value = "1e-6")]
    noise: f64,
    /// Initial jitter added to the diagonal (escalated x10 on failure up to --max-jitter).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Largest jitter, relative to the mean diagonal.
    #[arg(long, default_value_t = 1e-2)]
    max_jitter: f64,
    /// Fit noise and output scale by maximising the log marginal likelihood.
    #[arg(long)]
    fit_hyper: bool,
    /// Monte-Carlo samples per point.
    #[arg(long, default_value_t = 1000)]
    samples: usize,
    /// Monte-Carlo seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Memory budget, e.g. 8G: the fit is refused with an estimate when it would need more.
    #[arg(long, default_value = "16G", value_name = "SIZE")]
    memory: String,
    /// Output directory.
    #[arg(long, value_name = "OUT")]
    out: PathBuf,
    /// Replace OUT.
    #[arg(long)]
    force: bool,
}

/// Runs `gp`.
pub fn gp(a: GpArgs) -> Result<()> {
    let targets = match a.targets.as_str() {
        "network" => GpTargets::Network,
        "labels" => GpTargets::Labels,
        other => return Err(Error::Config(format!("--targets {other}: expected network or labels"))),
    };
    let net = Trained::open(&a.run)?;
    check_fit_memory(Fit::Gp, net.run(), &a.train_kernel, &a.kernel, crate::io::parse_bytes(&a.memory)?)?;
    let tk = open_train_gram(&a.train_kernel, &net, "a per-class GP")?;
    let rk = open_gram(&a.kernel, &net, Layout::Diag, "a per-class GP")?;
    if rk.output().diag.is_none() {
        return Err(Error::Config(format!("{} has no self-kernel `diag` (compute the row kernel with --kind ntk, dpk or epk)", a.kernel.display())));
    }
    let params = GpParams::new().noise(a.noise).jitter(a.jitter).max_jitter(a.max_jitter).fit_hyper(a.fit_hyper);
    let staged = StagedDir::new(&a.out, a.force)?;
    let s = report::gp_report(&net, &tk, &rk, &params, targets, a.samples, a.seed, staged.path())?.summary;
    let dir = staged.commit()?;
    println!(
        "gp: {} points, mean posterior std {:.4e}, mean predictive entropy {:.4}, jitter {:?}, agreement with the network {:.2}%{} -> {}",
        s.points,
        s.mean_std,
        s.mean_entropy,
        s.jitter,
        100.0 * s.agreement_with_network,
        s.accuracy.map_or(String::new(), |v| format!(", accuracy {:.2}%", 100.0 * v)),
        dir.display()
    );
    Ok(())
}

/// One-vs-rest SVM refit of the kernel machine's weights a_i on the kernel's class blocks.
#[derive(clap::Args, Debug)]
#[command(long_about = "Refit the kernel machine's weights with a one-vs-rest C-SVC (SMO, libsvm's working-set \
selection) on the train x train kernel's class blocks, and evaluate decision values at the row kernel's points. \
Writes svm.parquet (decision values, predicted class, the network's class) and svm.json (accuracy, agreement \
with the network, support vectors, iterations).")]
pub struct SvmArgs {
    /// Run directory.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// Train x train kernel directory.
    #[arg(long, value_name = "DIR")]
    train_kernel: PathBuf,
    /// Row kernel directory.
    #[arg(long, value_name = "DIR")]
    kernel: PathBuf,
    /// Box constraint C.
    #[arg(long, default_value_t = 1.0)]
    c: f64,
    /// KKT tolerance.
    #[arg(long, default_value_t = 1e-3)]
    tol: f64,
    /// Iteration budget.
    #[arg(long, default_value_t = 1_000_000)]
    max_iter: usize,
    /// Memory budget, e.g. 8G: the fit is refused with an estimate when it would need more.
    #[arg(long, default_value = "16G", value_name = "SIZE")]
    memory: String,
    /// Output directory.
    #[arg(long, value_name = "OUT")]
    out: PathBuf,
    /// Replace OUT.
    #[arg(long)]
    force: bool,
}

/// Runs `svm`.
pub fn svm(a: SvmArgs) -> Result<()> {
    let net = Trained::open(&a.run)?;
    check_fit_memory(Fit::Svm, net.run(), &a.train_kernel, &a.kernel, crate::io::parse_bytes(&a.memory)?)?;
    let tk = open_train_gram(&a.train_kernel, &net, "the one-vs-rest SVM")?;
    let rk = open_gram(&a.kernel, &net, Layout::Diag, "the one-vs-rest SVM")?;
    let params = SvmParams::new().c(a.c).tol(a.tol).max_iter(a.max_iter);
    let staged = StagedDir::new(&a.out, a.force)?;
    let s = report::svm_report(&net, &tk, &rk, &params, staged.path())?.summary;
    let dir = staged.commit()?;
    println!(
        "svm: {} points, support vectors {:?}, agreement with the network {:.2}%{} -> {}",
        s.points,
        s.support,
        100.0 * s.agreement_with_network,
        s.accuracy.map_or(String::new(), |v| format!(", accuracy {:.2}%", 100.0 * v)),
        dir.display()
    );
    Ok(())
}

/// Per-training-point contributions to chosen predictions.
#[derive(clap::Args, Debug)]
#[command(long_about = "Split chosen outputs f^k(x_p) of the kernel machine into per-training-point contributions \
sum_s a_{i,s} K_s(x_p, x_i), list the strongest supporters and opponents, and check that the contributions sum to \
the network output minus the bias. Writes attribution.parquet, contributions.safetensors and attribution.json.")]
pub struct AttributeArgs {
    /// Run directory.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// Kernel directory (rows = the points to explain).
    #[arg(long, value_name = "DIR")]
    kernel: PathBuf,
    /// Row points to explain, e.g. 0,3,7 (indices into the kernel's rows).
    #[arg(long, value_name = "LIST", default_value = "0")]
    points: String,
    /// Supporters and opponents listed per point and class.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Output directory.
    #[arg(long, value_name = "OUT")]
    out: PathBuf,
    /// Replace OUT.
    #[arg(long)]
    force: bool,
}

/// Runs `attribute`.
pub fn attribute(a: AttributeArgs) -> Result<()> {
    let points: Vec<usize> = a
        .points
        .split(',')
        .map(|s| s.trim().parse::<usize>().map_err(|_| Error::Config(format!("--points `{}`: expected indices like 0,3,7", a.points))))
        .collect::<Result<_>>()?;
    let net = Trained::open(&a.run)?;
    let g = Gram::open(&a.kernel, &net)?;
    let (p, _, _) = g.shape();
    if let Some(&bad) = points.iter().find(|&&q| q >= p) {
        return Err(Error::Config(format!("point {bad} is out of range: the kernel has {p} row points")));
    }
    if g.kind() != crate::kernel::KernelKind::Ntk {
        require_blocks(&g, &a.kernel, Layout::Full, "attribution (it contracts a_i with the off-diagonal blocks)")?;
    }
    let staged = StagedDir::new(&a.out, a.force)?;
    let s = report::attribution_report(&net, &g, &points, a.top, staged.path())?;
    let dir = staged.commit()?;
    println!("attribution ({}): {} outputs explained, max |network - bias - sum of contributions| {:.3e} -> {}", s.form, s.attributions.len(), s.max_abs_residual, dir.display());
    Ok(())
}

/// How far a kernel is from stationary, and its far field.
#[derive(clap::Args, Debug)]
#[command(long_about = "Stationarity score of a train x train kernel (1 = stationary: k depends on x - x' only; \
one minus the RMS error of the best stationary fit relative to the kernel's spread, see src/analysis/stationarity.rs) with an RBF \
kernel on the same points as the stationary reference, and the far field: the kernel's self-value and the GP \
posterior standard deviation along rays leaving the training data. Writes stationarity.json, far_field.parquet \
and far_profile.parquet.")]
pub struct StationarityArgs {
    /// Run directory.
    #[arg(long, value_name = "DIR")]
    run: PathBuf,
    /// Train x train kernel directory.
    #[arg(long, value_name = "DIR")]
    train_kernel: PathBuf,
    /// Ray directions.
    #[arg(long, default_value_t = 16)]
    dirs: usize,
    /// Points per ray.
    #[arg(long, default_value_t = 10)]
    ray_steps: usize,
    /// Radius growth factor between points of a ray (from the data's RMS radius).
    #[arg(long, default_value_t = 1.5)]
    growth: f64,
    /// Quadrature of the far-field kernel at the ray points (far from the data the logits are
    /// large and a looser tolerance saves much time; the kernel machine's error there is reported
    /// by `pathkernel kernel` if needed).
    #[arg(long, default_value = "auto:1e-8", value_name = "RULE")]
    quadrature: String,
    /// GP noise variance for the far-field standard deviation.
    #[arg(long, default_value = "1e-6")]
    noise: f64,
    /// Fit the far-field GP's noise and output scale by maximum marginal likelihood.
    #[arg(long)]
    fit_hyper: bool,
    /// Seed (pair subsampling, ray directions).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory.
    #[arg(long, value_name = "OUT")]
    out: PathBuf,
    /// Replace OUT.
    #[arg(long)]
    force: bool,
}

/// Runs `stationarity`.
pub fn stationarity(a: StationarityArgs) -> Result<()> {
    if a.dirs == 0 || a.ray_steps == 0 || !(a.growth.is_finite() && a.growth > 1.0) {
        return Err(Error::Config("--dirs and --ray-steps must be >= 1 and --growth > 1".into()));
    }
    let rule: crate::kernel::Rule = a.quadrature.parse()?;
    let net = Trained::open(&a.run)?;
    let tk = open_train_gram(&a.train_kernel, &net, "stationarity (per-class scores and the far-field GP)")?;
    let staged = StagedDir::new(&a.out, a.force)?;
    let s = report::stationarity_report(&net, &tk, &GpParams::new().noise(a.noise).fit_hyper(a.fit_hyper), rule, a.dirs, a.ray_steps, a.growth, a.seed, staged.path())?.summary;
    let dir = staged.commit()?;
    println!(
        "stationarity score {:.3} (RBF reference {:.3}); far field, Spearman vs distance: kernel self-value {:+.3}, GP logit std {:+.3}, MC probability std {:+.3} -> {}",
        s.score,
        s.rbf_score,
        s.far_kernel_spearman,
        s.far_std_spearman,
        s.far_prob_std_spearman,
        dir.display()
    );
    Ok(())
}
