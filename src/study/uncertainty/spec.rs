//! The `[uncertainty]` section of a study file, typed: kernels, ablations and curvatures are
//! enums from the parse on ([`GpKernel`], [`Ablation`], [`crate::gp::Curvature`]).

use serde::{Deserialize, Serialize};

use super::super::text;
use crate::error::{Error, Result};
use crate::gp::Curvature;
use crate::kernel::{KernelKind, Rule};
use crate::train::{self, RunConfig};
use crate::uncertainty::ensemble::ENSEMBLE_SEEDS;
use crate::uncertainty::kernel_gp::{KernelGpSpec, TrainGram};
use crate::uncertainty::method::{Ablation, FslVariant, GpKernel, Method};
use crate::uncertainty::BenchmarkConfig;

fn default_lrs() -> Vec<f64> {
    vec![0.1, 0.2, 0.5]
}
fn default_steps() -> Vec<usize> {
    vec![200, 500]
}
fn default_seeds() -> Vec<u64> {
    ENSEMBLE_SEEDS.to_vec()
}
fn default_quadrature() -> Rule {
    Rule::Auto(1e-12)
}
fn default_kernel_gps() -> Vec<GpKernel> {
    vec![GpKernel::Epk, GpKernel::Ntk]
}
fn default_grid() -> usize {
    24
}

/// The `[uncertainty]` section of a study file.
///
/// ```toml
/// [uncertainty]
/// lrs = [0.1, 0.2, 0.5]          # learning rates tried
/// steps = [200, 500]             # step counts tried
/// ensemble_seeds = [0, 1, 2, 3, 4]
/// quadrature = "auto:1e-12"      # the EPK rows' quadrature
/// kernel_gps = ["epk", "ntk"]    # epk | ntk | path | window:L
/// row_memory = "8G"              # bytes one setting's row Gram computation may take (default: no limit)
/// [uncertainty.benchmark]        # settings and Monte-Carlo (BenchmarkConfig; defaults: the protocol)
/// angles = [15, 30, 45, 60, 90, 180]
/// ```
///
/// `[train]` gives the optimizer and the seed; its `lr` and `steps` must be one of the grid's
/// points and are replaced by the selection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UqStudySpec {
    /// Learning rates tried (default 0.1, 0.2, 0.5).
    #[serde(default = "default_lrs")]
    pub lrs: Vec<f64>,
    /// Step counts tried (default 200, 500).
    #[serde(default = "default_steps")]
    pub steps: Vec<usize>,
    /// Seeds of the deep ensemble's members (default 0–4).
    #[serde(default = "default_seeds")]
    pub ensemble_seeds: Vec<u64>,
    /// Quadrature of the EPK's test-side rows (default `auto:1e-12`).
    #[serde(default = "default_quadrature", with = "text::rule")]
    pub quadrature: Rule,
    /// Kernel GPs: any of `epk`, `ntk`, `path`, `window:L` (default epk and ntk).
    #[serde(default = "default_kernel_gps", with = "text::list")]
    pub kernel_gps: Vec<GpKernel>,
    /// Ablations of the kernel GPs on the same Grams (default none): `netmean` adds
    /// `{kernel}-gp-netmean` (the network's outputs as the mean, the GP's variance; free),
    /// `sym` adds `epk-gp-sym` (the EPK-GP on the symmetrised training Gram with the training
    /// points on the test side; one more integrated EPK on the training points).
    #[serde(default, with = "text::list")]
    pub ablations: Vec<Ablation>,
    /// The study author's notes (markdown), reproduced in the summary as they are.
    #[serde(default)]
    pub notes: String,
    /// Test images in the chart of the largest EPK-GP/MAP confidence differences (default 24).
    #[serde(default = "default_grid")]
    pub disagreement_images: usize,
    /// Function-space Laplace on each kernel of `kernel_gps` (default none): the curvatures
    /// `diag` and/or `full` ([`crate::gp::functional`]). Each adds, on the same Grams (on the
    /// logits), the variants of `FslVariant`.
    #[serde(default)]
    pub fsl: Vec<Curvature>,
    /// Function-space Laplace on the cross-class kernel (default none): the curvatures
    /// `class-diagonal` (laplace-torch's `independent_outputs=False`) and/or `full` (the
    /// GGN-exact posterior) ([`crate::gp::crossclass`]), methods `fsl-{kernel}-kxk-{diag|full}…`
    /// with every variant of `FslVariant`. Their kernels' Grams are computed in the full layout
    /// (about K times the class-diagonal cost of a dense block).
    #[serde(default)]
    pub fsl_kxk: Vec<Curvature>,
    /// The kernels of `kernel_gps` that get the `fsl_kxk` methods (default: every one).
    #[serde(default, with = "text::opt_list")]
    pub fsl_kxk_kernels: Option<Vec<GpKernel>>,
    /// How the cross-class fits factor their `[M·K, M·K]` system ([`crate::gp::KxkSolver`]):
    /// `eigen` (the default: one eigendecomposition serves every δ of the evidence and of the
    /// 100-value grid) or `cholesky` (one Cholesky per δ tried: Brent's search on the evidence,
    /// the grid coarse to fine — the route for large systems).
    #[serde(default)]
    pub fsl_kxk_solver: crate::gp::KxkSolver,
    /// Bytes one row Gram computation (a setting's rows, or the validation split's) may take,
    /// e.g. `"8G"` (default: no limit, each setting's rows one computation). Above it the rows
    /// are computed in row blocks planned by [`crate::kernel::engine::blocked::plan`] (the
    /// training side evaluated again for every block) and concatenated; refused with an
    /// estimate when a setting's output plus one row's work exceeds it.
    #[serde(default)]
    pub row_memory: Option<String>,
    /// Settings and Monte-Carlo parameters (defaults: the protocol).
    #[serde(default)]
    pub benchmark: BenchmarkConfig,
}

impl Default for UqStudySpec {
    fn default() -> Self {
        UqStudySpec {
            lrs: default_lrs(),
            steps: default_steps(),
            ensemble_seeds: default_seeds(),
            quadrature: default_quadrature(),
            kernel_gps: default_kernel_gps(),
            ablations: Vec::new(),
            notes: String::new(),
            disagreement_images: default_grid(),
            fsl: Vec::new(),
            fsl_kxk: Vec::new(),
            fsl_kxk_kernels: None,
            fsl_kxk_solver: crate::gp::KxkSolver::Eigen,
            row_memory: None,
            benchmark: BenchmarkConfig::default(),
        }
    }
}

fn has_duplicates<T: Ord + Clone>(v: &[T]) -> bool {
    let mut s = v.to_vec();
    s.sort();
    s.windows(2).any(|w| w[0] == w[1])
}

impl UqStudySpec {
    /// Checks the section against the study's training configuration.
    pub(crate) fn validate(&self, rc: &RunConfig) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("[uncertainty] {m}")));
        if self.lrs.is_empty() || self.lrs.iter().any(|l| !(l.is_finite() && *l > 0.0)) {
            return bad(format!("lrs must be a non-empty list of positive rates, got {:?}", self.lrs));
        }
        if self.steps.is_empty() || self.steps.contains(&0) {
            return bad(format!("steps must be a non-empty list of positive step counts, got {:?}", self.steps));
        }
        if self.ensemble_seeds.is_empty() {
            return bad("ensemble_seeds is empty".into());
        }
        if has_duplicates(&self.ensemble_seeds) {
            return bad(format!("ensemble_seeds has duplicates: {:?}", self.ensemble_seeds));
        }
        if has_duplicates(&self.kernel_gps) {
            return bad(format!("kernel_gps has duplicates: {:?}", self.kernel_gps.iter().map(ToString::to_string).collect::<Vec<_>>()));
        }
        if has_duplicates(&self.fsl) || has_duplicates(&self.fsl_kxk) {
            return bad("fsl and fsl_kxk must not repeat a curvature".into());
        }
        if let Some(ks) = &self.fsl_kxk_kernels {
            if let Some(k) = ks.iter().find(|k| !self.kernel_gps.contains(k)) {
                return bad(format!("fsl_kxk_kernels: `{k}` is not one of kernel_gps"));
            }
        }
        if let Some(m) = &self.row_memory {
            crate::io::parse_bytes(m).map_err(|e| Error::Config(format!("[uncertainty] row_memory: {e}")))?;
        }
        if self.benchmark.mc_samples < 2 {
            return bad("benchmark.mc_samples must be >= 2".into());
        }
        if !self.lrs.contains(&rc.train.lr) || !self.steps.contains(&rc.train.steps) {
            return bad(format!(
                "[train] lr = {} and steps = {} must be points of the selection grid (lrs {:?}, steps {:?}); the selection replaces them",
                rc.train.lr, rc.train.steps, self.lrs, self.steps
            ));
        }
        if rc.train.optimizer != train::OptimizerKind::Gd || rc.train.batch_size.is_some() {
            return bad("the benchmark trains by full-batch gradient descent ([train] optimizer = \"gd\")".into());
        }
        Ok(())
    }

    /// The kernel GPs to run, one family per kernel.
    pub(super) fn kernel_families(&self) -> Vec<KernelFamily> {
        let row_memory = self.row_memory.as_deref().and_then(|m| crate::io::parse_bytes(m).ok());
        let netmean = self.ablations.contains(&Ablation::NetMean);
        let sym = self.ablations.contains(&Ablation::Sym);
        let rule = self.quadrature;
        self.kernel_gps
            .iter()
            .map(|&kernel| {
                let mut gps = vec![(
                    Method::Gp(kernel),
                    match kernel {
                        GpKernel::Epk => KernelGpSpec::epk(rule),
                        GpKernel::Ntk => KernelGpSpec::ntk(),
                        GpKernel::Path | GpKernel::Window(_) => KernelGpSpec::path(rule, kernel.window()),
                    },
                )];
                if sym && kernel == GpKernel::Epk {
                    gps.push((Method::GpSym, KernelGpSpec::epk(rule).train_gram(TrainGram::SymmetrisedTestSide)));
                }
                let netmean = if netmean { vec![(Method::GpNetMean(kernel), Method::Gp(kernel))] } else { Vec::new() };
                let kxk = self.fsl_kxk_kernels.as_ref().is_none_or(|ks| ks.contains(&kernel));
                KernelFamily { kernel, rule, gps, netmean, fsl: self.fsl.clone(), fsl_kxk: if kxk { self.fsl_kxk.clone() } else { Vec::new() }, fsl_kxk_solver: self.fsl_kxk_solver, row_memory }
            })
            .collect()
    }
}

/// The GPs on one kernel: they share its row Grams.
pub(super) struct KernelFamily {
    /// The kernel (its label names the methods and the cache folder).
    pub kernel: GpKernel,
    /// The quadrature of integrated rows.
    pub rule: Rule,
    /// Fitted GPs: method and specification; the first is the protocol's method.
    pub gps: Vec<(Method, KernelGpSpec)>,
    /// Methods with the network's outputs as the mean and a fitted GP's variance: (method, GP).
    pub netmean: Vec<(Method, Method)>,
    /// Function-space Laplace curvatures on this kernel.
    pub fsl: Vec<Curvature>,
    /// Cross-class function-space Laplace curvatures on this kernel (its Grams in the full
    /// layout when not empty).
    pub fsl_kxk: Vec<Curvature>,
    /// How the cross-class fits factor their system.
    pub fsl_kxk_solver: crate::gp::KxkSolver,
    /// Bytes one row Gram computation may take (`None`: no limit).
    pub row_memory: Option<u64>,
}

impl KernelFamily {
    /// The label in stages and the cache folder (`epk`, `ntk`, `path`, `windowL`).
    pub(crate) fn label(&self) -> String {
        self.kernel.label()
    }
    /// The kernel computed.
    pub(crate) fn kind(&self) -> KernelKind {
        self.kernel.kind()
    }
    /// The function-space Laplace methods of the family, curvature by curvature, the
    /// class-diagonal kernel's then the cross-class kernel's.
    pub(crate) fn fsl_methods(&self) -> Vec<Method> {
        let diag = self.fsl.iter().flat_map(|&c| FslVariant::ALL.into_iter().filter(move |v| v.applies_to(c)).map(move |v| Method::Fsl(self.kernel, c, v)));
        let kxk = self.fsl_kxk.iter().flat_map(|&c| FslVariant::ALL.into_iter().map(move |v| Method::FslKxk(self.kernel, c, v)));
        diag.chain(kxk).collect()
    }
    /// The layout of the family's Grams: `full` when a cross-class fit needs every block.
    pub(crate) fn layout(&self) -> crate::kernel::Layout {
        if self.fsl_kxk.is_empty() {
            crate::kernel::Layout::Diag
        } else {
            crate::kernel::Layout::Full
        }
    }
    /// Every method of the family: the GPs, the netmean ablations, function-space Laplace.
    pub(crate) fn methods(&self) -> Vec<Method> {
        self.gps.iter().map(|g| g.0).chain(self.netmean.iter().map(|m| m.0)).chain(self.fsl_methods()).collect()
    }
}
