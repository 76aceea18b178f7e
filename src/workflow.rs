//! Analyses that read a run and kernel output directories and write tables: the library side of
//! `pathkernel gp`, `svm`, `attribute` and `stationarity` (the CLI only parses options).
//!
//! Kernel directories are the outputs of `pathkernel kernel` (see [`crate::kernel::output`]).
//! A *train kernel* is one computed with `--points train --side train` (its Gram is the square
//! train×train kernel `[M, M, K, K]`); a *row kernel* is one computed at the points of interest
//! (test points, a grid) against the training set.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::analysis::{self, StationarityOptions};
use crate::data::Targets;
use crate::error::{Error, Result};
use crate::gp::{self, GpParams};
use crate::io::{self, Column, NamedArray, SafeFile, Table};
use crate::kernel::{self, KernelKind, KernelRequest, Layout, Points, Rule, Side};
use crate::svm::{self, SvmParams};
use crate::trajectory::Run;

/// The arrays of a kernel output directory.
#[derive(Clone, Debug)]
pub struct KernelFiles {
    /// The directory.
    pub dir: PathBuf,
    /// Which blocks `gram` holds.
    pub layout: Layout,
    /// `Σ_s K_s` in `layout`: `[P, M, K, K]`, `[P, M, K]` or `[P, M]`.
    pub gram: Vec<f64>,
    /// `a_{i,s}` `[N, M, K]`.
    pub a: Vec<f64>,
    /// `b = f_{w_0}(x)` `[P, K]`.
    pub bias: Vec<f64>,
    /// Row points `[P, d]`.
    pub points: Vec<f64>,
    /// Self-kernel `[P, K, K]` when present.
    pub diag: Option<Vec<f64>>,
    /// Per-step Grams `[S, …]` (each in `layout`) when present.
    pub gram_steps: Option<Vec<f64>>,
    /// Kind, side, quadrature and run id from the file's metadata.
    pub kind: String,
    /// Side of the rows.
    pub side: String,
    /// Quadrature rule (or "none (t = 0)").
    pub quadrature: String,
    /// P, M, K, d, N.
    pub p: usize,
    /// Training points M.
    pub m: usize,
    /// Outputs K.
    pub k: usize,
    /// Input dimension d.
    pub d: usize,
    /// Steps N of the run.
    pub n: usize,
    /// The steps whose Grams are summed (and stored in `gram_steps`), ascending.
    pub steps: Vec<usize>,
    /// Non-data terms `[P, K]` (weight decay plus the rounding the per-point split does not
    /// carry), when present: they belong to no training point.
    pub reg: Option<Vec<f64>>,
    /// Kernel form (`gradient`, `gradient-with-decay`, `momentum`, `preconditioned`).
    pub form: String,
}

impl KernelFiles {
    /// Reads `DIR/gram.safetensors` and checks it belongs to `run`.
    pub fn open(dir: &Path, run: &Run) -> Result<Self> {
        let path = dir.join("gram.safetensors");
        let f = SafeFile::open(&path)?;
        let meta = f.metadata();
        if meta.get("run_id") != Some(&run.manifest.run_id) {
            return Err(Error::format(&path, format!("computed for run {:?}, not for {} ({})", meta.get("run_id"), run.manifest.run_id, run.dir.display())));
        }
        let shape = f.shape("gram")?;
        let layout: Layout = meta.get("layout").map_or(Ok(Layout::Full), |l| l.parse()).map_err(|_| Error::format(&path, format!("unknown layout {:?}", meta.get("layout"))))?;
        let k = run.dataset.num_outputs;
        let (p, m) = match (layout, &shape[..]) {
            (Layout::Full, &[p, m, k1, k2]) if k1 == k && k2 == k => (p, m),
            (Layout::Diag, &[p, m, k1]) if k1 == k => (p, m),
            (Layout::Trace, &[p, m]) => (p, m),
            _ => return Err(Error::format(&path, format!("gram has shape {shape:?}, expected {} layout with K = {k}", layout))),
        };
        if m != run.dataset.n_train() {
            return Err(Error::format(&path, format!("gram shape {shape:?} does not match the run (M = {}, K = {})", run.dataset.n_train(), run.dataset.num_outputs)));
        }
        let d = run.dataset.dim;
        let n = run.manifest.steps;
        let per_pair = layout.per_pair(k);
        let gram = f.f64("gram", Some(&layout.shape(p, m, k)))?.1;
        let a = f.f64("a", Some(&[n, m, k]))?.1;
        let bias = f.f64("bias", Some(&[p, k]))?.1;
        let points = f.f64("points", Some(&[p, d]))?.1;
        let names = f.names();
        let diag = if names.iter().any(|x| x == "diag") { Some(f.f64("diag", Some(&[p, k, k]))?.1) } else { None };
        let gram_steps = if names.iter().any(|x| x == "gram_steps") {
            let s = f.shape("gram_steps")?;
            let mut want = vec![s.first().copied().unwrap_or(0)];
            want.extend(layout.shape(p, m, k));
            Some(f.f64("gram_steps", Some(&want))?.1)
        } else {
            None
        };
        for (name, v) in [("gram", &gram), ("a", &a), ("bias", &bias), ("points", &points)] {
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(Error::format(&path, format!("{name}[{i}] is not finite")));
            }
        }
        let get = |key: &str| meta.get(key).cloned().unwrap_or_default();
        let steps: Vec<usize> = if names.iter().any(|x| x == "steps") {
            let s = f.shape("steps")?;
            let v = f.i64("steps", Some(&[s[0]]))?.1;
            if v.iter().any(|&x| x < 0 || x as usize >= n.max(1)) {
                return Err(Error::format(&path, "steps holds a step outside the run"));
            }
            v.into_iter().map(|x| x as usize).collect()
        } else {
            (0..gram_steps.as_ref().map_or(n, |g| g.len() / (p * m * per_pair).max(1))).collect()
        };
        if let Some(g) = &gram_steps {
            if g.len() != steps.len() * p * m * per_pair {
                return Err(Error::format(&path, format!("gram_steps holds {} steps but steps lists {}", g.len() / (p * m * per_pair).max(1), steps.len())));
            }
        }
        let mut reg = if names.iter().any(|x| x == "reg") { Some(f.f64("reg", Some(&[p, k]))?.1) } else { None };
        if names.iter().any(|x| x == "rounding") {
            // Attribution treats the rounding term like the weight decay: it belongs to no point.
            let rd = f.f64("rounding", Some(&[p, k]))?.1;
            reg = Some(match reg {
                Some(r) => r.iter().zip(&rd).map(|(a, b)| a + b).collect(),
                None => rd,
            });
        }
        let form = meta.get("form").cloned().unwrap_or_else(|| "gradient".into());
        Ok(KernelFiles {
            dir: dir.to_path_buf(),
            layout,
            gram,
            a,
            bias,
            points,
            diag,
            gram_steps,
            kind: get("kind"),
            side: get("side"),
            quadrature: get("quadrature"),
            p,
            m,
            k,
            d,
            n,
            steps,
            reg,
            form,
        })
    }

    /// Refuses, with what to do instead, when the stored layout lacks blocks `need`s.
    pub fn require_layout(&self, need: Layout, what: &str) -> Result<()> {
        if self.layout.provides(need) {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "{}: holds the {} blocks of the Gram (--blocks {}); {what} needs the {need} blocks: recompute it with `pathkernel kernel … --blocks {need}`",
                self.dir.display(),
                self.layout,
                self.layout
            )))
        }
    }

    /// Class block `c` of the Gram, `[P, M]`: `K^{cc}(x_p, x_i)`.
    ///
    /// # Panics
    /// If the layout is `trace` (check with [`KernelFiles::require_layout`] first).
    pub fn class_block(&self, c: usize) -> Vec<f64> {
        let (m, k) = (self.m, self.k);
        match self.layout {
            Layout::Full => (0..self.p * m).map(|idx| self.gram[(idx * k + c) * k + c]).collect(),
            Layout::Diag => (0..self.p * m).map(|idx| self.gram[idx * k + c]).collect(),
            Layout::Trace => panic!("a trace Gram has no class blocks"),
        }
    }

    /// `Σ_c K^{cc}(x_p, x_i)`, `[P, M]`, from any layout.
    pub fn trace(&self) -> Vec<f64> {
        Layout::Trace.from_layout(self.layout, &self.gram, self.p, self.m, self.k)
    }

    /// Class block `c` of a train×train kernel, `[M, M]`, symmetrised: `(K + Kᵀ)/2` removes the
    /// rounding asymmetry of a kernel that is symmetric in exact arithmetic.
    ///
    /// # Panics
    /// If the layout is `trace`.
    pub fn symmetric_class_block(&self, c: usize) -> Vec<f64> {
        let m = self.m;
        let mut b = self.class_block(c);
        for i in 0..m {
            for j in i + 1..m {
                let v = 0.5 * (b[i * m + j] + b[j * m + i]);
                b[i * m + j] = v;
                b[j * m + i] = v;
            }
        }
        b
    }

    /// Requires the rows to be the run's training points (a square train×train kernel) and a
    /// symmetric kernel form (momentum and Adam kernels are not symmetric; symmetrising them
    /// would change what they mean).
    pub fn require_train_rows(&self, run: &Run) -> Result<()> {
        if self.form == "momentum" || self.form == "preconditioned" {
            return Err(Error::Config(format!(
                "{}: the kernel of this run is in `{}` form, which is not a symmetric kernel; a GP or SVM needs one (train with gd/sgd, or use this kernel only as a kernel machine and for attribution)",
                self.dir.display(),
                self.form
            )));
        }
        if self.p != self.m || self.points != run.dataset.x_train {
            return Err(Error::Config(format!(
                "{} is not a train×train kernel (compute it with `pathkernel kernel --points train --side train`)",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Whether `a_{i,s}` is the same for every step (Theorem 3.7's single machine applies).
    pub fn constant_a(&self) -> bool {
        let mk = self.m * self.k;
        (1..self.n).all(|s| self.a[s * mk..(s + 1) * mk] == self.a[..mk])
    }
}

/// What a GP or SVM fit would allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// One GP per class: Cholesky factors and solves.
    Gp,
    /// One-vs-rest SMO: class blocks and the solver's kernel rows.
    Svm,
}

/// Estimated peak bytes of a GP/SVM fit from the kernel directories on disk, checked against
/// `budget` *before* anything is loaded: reading both `gram.safetensors` (file bytes plus the
/// decoded arrays), then per class an `[M, M]` block with its factor (GP: also the
/// marginal-likelihood search's copy) and the `[P, M]` cross block.
pub fn check_fit_memory(fit: Fit, run: &Run, train_kernel: &Path, row_kernel: &Path, budget: u64) -> Result<()> {
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

fn labels(run: &Run) -> Result<Vec<usize>> {
    match &run.dataset.y_train {
        Targets::Labels(y) => Ok(y.clone()),
        Targets::Values(_) => Err(Error::Config("this analysis needs a classification run".into())),
    }
}

/// Network outputs `f_{w_N}(x)` for rows `x` (`[P, d]` → `[P, K]`).
pub fn network_at(run: &Run, x: &[f64]) -> Result<Vec<f64>> {
    let init = run.load_step(0)?;
    let last = run.load_step(run.manifest.steps)?;
    run.manifest.architecture.forward(&last, Some(&init), x)
}

fn argmax_rows(v: &[f64], k: usize) -> Vec<usize> {
    v.chunks(k)
        .map(|r| r.iter().enumerate().fold(0, |b, (j, x)| if *x > r[b] { j } else { b }))
        .collect()
}

/// Which GP regression targets to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum GpTargets {
    /// The network's outputs at the training points minus the bias `b` (what the kernel part of
    /// the machine explains); the bias is added back to the posterior mean.
    Network,
    /// One-hot labels (1 for the class, 0 otherwise).
    Labels,
}

/// Summary of `pathkernel gp`.
#[derive(Clone, Debug, Serialize)]
pub struct GpSummary {
    /// Targets used.
    pub targets: GpTargets,
    /// Parameters.
    pub params: GpParams,
    /// Noise per class (after fitting when requested).
    pub noise: Vec<f64>,
    /// Output scale per class.
    pub output_scale: Vec<f64>,
    /// Jitter actually added per class.
    pub jitter: Vec<f64>,
    /// Log marginal likelihood per class.
    pub log_marginal_likelihood: Vec<f64>,
    /// Monte-Carlo samples per point and the seed.
    pub samples: usize,
    /// MC seed.
    pub seed: u64,
    /// Row points P.
    pub points: usize,
    /// Mean posterior standard deviation over points and classes.
    pub mean_std: f64,
    /// Mean predictive entropy over points.
    pub mean_entropy: f64,
    /// Accuracy of the MC mean probabilities against the row points' labels (test points only).
    pub accuracy: Option<f64>,
    /// Agreement of the MC arg-max with the network's.
    pub agreement_with_network: f64,
    /// Calibration of the MC mean probabilities against the row points' labels (test points only).
    pub calibration: Option<Calibration>,
    /// The same measures for the network's own softmax probabilities, for comparison.
    pub network_calibration: Option<Calibration>,
}

/// Calibration measures of predicted class probabilities against labels.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    /// Mean Brier score `Σ_k (p_k − [y = k])²`.
    pub brier: f64,
    /// Mean negative log-likelihood `−log p_y` (probabilities floored at 1e-300).
    pub nll: f64,
    /// Expected calibration error of the top-class probability over 10 equal-width bins.
    pub ece: f64,
}

/// Calibration of probabilities `probs` (`[P, K]`) against `labels` (`[P]`).
pub fn calibration(probs: &[f64], labels: &[usize], k: usize) -> Calibration {
    let p = labels.len().max(1) as f64;
    let mut brier = 0.0;
    let mut nll = 0.0;
    let mut bins = [(0.0f64, 0.0f64, 0usize); 10];
    for (row, &y) in probs.chunks(k).zip(labels) {
        for (c, &v) in row.iter().enumerate() {
            let t = if c == y { 1.0 } else { 0.0 };
            brier += (v - t) * (v - t);
        }
        nll -= row[y].max(1e-300).ln();
        let (top, conf) = row.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (c, &v)| if v > b.1 { (c, v) } else { b });
        let bin = ((conf * 10.0) as usize).min(9);
        bins[bin].0 += conf;
        bins[bin].1 += if top == y { 1.0 } else { 0.0 };
        bins[bin].2 += 1;
    }
    let ece = bins.iter().filter(|b| b.2 > 0).map(|b| (b.0 - b.1).abs()).sum::<f64>() / p;
    Calibration { brier: brier / p, nll: nll / p, ece }
}

/// GP logit regression on the kernel: train×train class blocks from `train_kernel`, cross blocks
/// and prior variances (`diag`) from `row_kernel`; Monte-Carlo softmax posterior. Writes
/// `gp.safetensors` (its exact inputs and outputs), `gp.parquet` and `gp.json` into `out_dir`.
pub fn gp_report(run: &Run, train_kernel: &KernelFiles, row_kernel: &KernelFiles, params: &GpParams, targets: GpTargets, samples: usize, seed: u64, out_dir: &Path) -> Result<GpSummary> {
    train_kernel.require_train_rows(run)?;
    train_kernel.require_layout(Layout::Diag, "a per-class GP")?;
    row_kernel.require_layout(Layout::Diag, "a per-class GP")?;
    let diag = row_kernel.diag.as_ref().ok_or_else(|| {
        Error::Config(format!("{} has no self-kernel `diag` (compute the row kernel with --kind ntk, dpk or epk)", row_kernel.dir.display()))
    })?;
    let (m, k, p) = (train_kernel.m, train_kernel.k, row_kernel.p);
    let mut k_train = Vec::with_capacity(k * m * m);
    let mut k_cross = Vec::with_capacity(k * p * m);
    let mut k_test_diag = Vec::with_capacity(k * p);
    for c in 0..k {
        k_train.extend(train_kernel.symmetric_class_block(c));
        k_cross.extend(row_kernel.class_block(c));
        k_test_diag.extend((0..p).map(|pi| diag[(pi * k + c) * k + c]));
    }
    let y = labels(run)?;
    let f_train = network_at(run, &run.dataset.x_train)?;
    let w0 = run.load_step(0)?;
    let bias_train = run.manifest.architecture.forward(&w0, Some(&w0), &run.dataset.x_train)?;
    let tgt: Vec<f64> = match targets {
        GpTargets::Network => f_train.iter().zip(&bias_train).map(|(f, b)| f - b).collect(),
        GpTargets::Labels => (0..m * k).map(|idx| if y[idx / k] == idx % k { 1.0 } else { 0.0 }).collect(),
    };
    let fitted = params.fit(&k_train, &tgt, m, k)?;
    let mut post = fitted.predict(&k_cross, &k_test_diag, p)?;
    if targets == GpTargets::Network {
        for (mv, b) in post.mean.iter_mut().zip(&row_kernel.bias) {
            *mv += b;
        }
    }
    let mc = gp::mc_softmax(&post, samples, seed)?;
    let network = network_at(run, &row_kernel.points)?;
    let net_arg = argmax_rows(&network, k);
    let mc_arg = argmax_rows(&mc.mean_prob, k);
    let test_labels = match (&run.dataset.y_test, row_kernel.points == run.dataset.x_test) {
        (Targets::Labels(yt), true) => Some(yt.clone()),
        _ => None,
    };
    let accuracy = test_labels.as_ref().map(|yt| svm::agreement(&mc_arg, yt));
    let calib = test_labels.as_ref().map(|yt| calibration(&mc.mean_prob, yt, k));
    let net_probs: Vec<f64> = network.iter().map(|v| v.exp()).collect();
    let net_calib = test_labels.as_ref().map(|yt| calibration(&net_probs, yt, k));
    io::write_safetensors(
        &out_dir.join("gp.safetensors"),
        &[
            NamedArray::f64("k_train", vec![k, m, m], k_train),
            NamedArray::f64("k_cross", vec![k, p, m], k_cross),
            NamedArray::f64("k_test_diag", vec![k, p], k_test_diag),
            NamedArray::f64("targets", vec![m, k], tgt),
            NamedArray::f64("noise", vec![k], fitted.noise()),
            NamedArray::f64("output_scale", vec![k], fitted.output_scale()),
            NamedArray::f64("jitter", vec![k], fitted.jitter_used()),
            NamedArray::f64("mean", vec![p, k], post.mean.clone()),
            NamedArray::f64("var", vec![p, k], post.var.clone()),
            NamedArray::f64("points", vec![p, row_kernel.d], row_kernel.points.clone()),
        ],
        None,
    )?;
    let mut point = Vec::new();
    let mut class = Vec::new();
    for pi in 0..p {
        for c in 0..k {
            point.push(pi as i64);
            class.push(c as i64);
        }
    }
    let std: Vec<f64> = post.var.iter().map(|v| v.sqrt()).collect();
    Table::new()
        .with("point", Column::I64(point))
        .with("class", Column::I64(class))
        .with("mean", Column::F64(post.mean.clone()))
        .with("var", Column::F64(post.var.clone()))
        .with("std", Column::F64(std.clone()))
        .with("network", Column::F64(network))
        .with("mc_mean_prob", Column::F64(mc.mean_prob.clone()))
        .with("mc_std_prob", Column::F64(mc.std_prob.clone()))
        .with("mc_se_mean_prob", Column::F64(mc.se_mean_prob.clone()))
        .write_parquet(&out_dir.join("gp.parquet"))?;
    Table::new()
        .with("point", Column::I64((0..p as i64).collect()))
        .with("entropy", Column::F64(mc.entropy.clone()))
        .with("se_entropy", Column::F64(mc.se_entropy.clone()))
        .with("mean_std", Column::F64(std.chunks(k).map(|r| r.iter().sum::<f64>() / k as f64).collect()))
        .write_parquet(&out_dir.join("gp_points.parquet"))?;
    let s = GpSummary {
        targets,
        params: params.clone(),
        noise: fitted.noise(),
        output_scale: fitted.output_scale(),
        jitter: fitted.jitter_used(),
        log_marginal_likelihood: fitted.log_marginal_likelihood(),
        samples,
        seed,
        points: p,
        mean_std: std.iter().sum::<f64>() / std.len().max(1) as f64,
        mean_entropy: mc.entropy.iter().sum::<f64>() / p.max(1) as f64,
        accuracy,
        agreement_with_network: svm::agreement(&mc_arg, &net_arg),
        calibration: calib,
        network_calibration: net_calib,
    };
    io::write_json(&out_dir.join("gp.json"), &s)?;
    Ok(s)
}

/// Summary of `pathkernel svm`.
#[derive(Clone, Debug, Serialize)]
pub struct SvmSummary {
    /// Parameters.
    pub params: SvmParams,
    /// Support vectors per class.
    pub support: Vec<usize>,
    /// SMO iterations per class.
    pub iterations: Vec<usize>,
    /// Accuracy against the row points' labels (when the rows are the test or training set).
    pub accuracy: Option<f64>,
    /// Agreement of the SVM's arg-max with the network's.
    pub agreement_with_network: f64,
    /// Row points.
    pub points: usize,
}

/// One-vs-rest SVM refit of the kernel machine's weights on the train×train class blocks;
/// decision values at the row kernel's points. Writes `svm.parquet` and `svm.json`.
pub fn svm_report(run: &Run, train_kernel: &KernelFiles, row_kernel: &KernelFiles, params: &SvmParams, out_dir: &Path) -> Result<SvmSummary> {
    train_kernel.require_train_rows(run)?;
    train_kernel.require_layout(Layout::Diag, "the one-vs-rest SVM")?;
    row_kernel.require_layout(Layout::Diag, "the one-vs-rest SVM")?;
    let (m, k, p) = (train_kernel.m, train_kernel.k, row_kernel.p);
    let mut blocks = Vec::with_capacity(k * m * m);
    let mut cross = Vec::with_capacity(k * p * m);
    for c in 0..k {
        blocks.extend(train_kernel.symmetric_class_block(c));
        cross.extend(row_kernel.class_block(c));
    }
    let y = labels(run)?;
    let model = params.fit_ovr(&blocks, &y, m, k)?;
    let dec = model.decision(&cross, p)?;
    let pred = model.predict(&cross, p)?;
    let network = network_at(run, &row_kernel.points)?;
    let net_arg = argmax_rows(&network, k);
    let accuracy = if row_kernel.points == run.dataset.x_test {
        match &run.dataset.y_test {
            Targets::Labels(yt) => Some(svm::agreement(&pred, yt)),
            _ => None,
        }
    } else if row_kernel.points == run.dataset.x_train {
        Some(svm::agreement(&pred, &y))
    } else {
        None
    };
    let mut t = Table::new().with("point", Column::I64((0..p as i64).collect()));
    for c in 0..k {
        t = t.with(&format!("decision_{c}"), Column::F64((0..p).map(|pi| dec[pi * k + c]).collect()));
    }
    t.with("predicted", Column::I64(pred.iter().map(|&v| v as i64).collect()))
        .with("network", Column::I64(net_arg.iter().map(|&v| v as i64).collect()))
        .write_parquet(&out_dir.join("svm.parquet"))?;
    let s = SvmSummary {
        params: params.clone(),
        support: model.classes.iter().map(|c| c.support.len()).collect(),
        iterations: model.classes.iter().map(|c| c.iterations).collect(),
        accuracy,
        agreement_with_network: svm::agreement(&pred, &net_arg),
        points: p,
    };
    io::write_json(&out_dir.join("svm.json"), &s)?;
    Ok(s)
}

/// Summary of `pathkernel attribute`.
#[derive(Clone, Debug, Serialize)]
pub struct AttributionSummary {
    /// Per chosen point and class.
    pub attributions: Vec<analysis::Attribution>,
    /// Largest |residual| = |network − bias − Σ_i contributions|.
    pub max_abs_residual: f64,
    /// Which machine the contributions come from.
    pub form: String,
}

/// Per-training-point contributions `Σ_s a_{i,s} K_s(x, x_i)` for chosen row points, with the
/// top supporters and opponents and the check that they sum to the network output minus the
/// bias. Writes `attribution.parquet`, `contributions.safetensors` and `attribution.json`.
pub fn attribution_report(run: &Run, kf: &KernelFiles, points: &[usize], top: usize, out_dir: &Path) -> Result<AttributionSummary> {
    let (p, m, k) = (kf.p, kf.m, kf.k);
    if let Some(&bad) = points.iter().find(|&&q| q >= p) {
        return Err(Error::Config(format!("point {bad} is out of range: the kernel has {p} row points")));
    }
    if points.is_empty() {
        return Err(Error::Config("no points chosen".into()));
    }
    if kf.kind == "ntk" {
        return Err(Error::Config("attribution needs a path kernel (epk, dpk, kprime); the NTK machine is only a linearisation".into()));
    }
    kf.require_layout(Layout::Full, "attribution (it contracts a_i with the off-diagonal blocks)")?;
    let (contrib, form) = if kf.constant_a() {
        (analysis::contributions(&kf.gram, &kf.a[..m * k], p, m, k)?, "single machine (Theorem 3.7)".to_string())
    } else {
        let gs = kf.gram_steps.as_ref().ok_or_else(|| {
            Error::Config("a_{i,s} varies by step: recompute the kernel with --per-step for the ensemble attribution".into())
        })?;
        let s = gs.len() / (p * m * k * k);
        let a_steps: Vec<f64> = kf.steps.iter().flat_map(|&st| kf.a[st * m * k..(st + 1) * m * k].iter().copied()).collect();
        (analysis::contributions_per_step(gs, &a_steps, s, p, m, k)?, "ensemble (Theorem 3.6)".to_string())
    };
    let network = network_at(run, &kf.points)?;
    // The weight-decay term belongs to no training point: it is part of the baseline.
    let baseline: Vec<f64> = match &kf.reg {
        Some(r) => kf.bias.iter().zip(r).map(|(b, r)| b + r).collect(),
        None => kf.bias.clone(),
    };
    let at = analysis::attribute(&contrib, &baseline, &network, points, p, m, k, top)?;
    let max_abs_residual = at.iter().map(|a| a.residual.abs()).fold(0.0, f64::max);
    let mut rows = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for a in &at {
        for (rank, (i, c)) in a.supporters.iter().enumerate() {
            rows.0.push(a.point as i64);
            rows.1.push(a.class as i64);
            rows.2.push("supporter".to_string());
            rows.3.push(rank as i64);
            rows.4.push(*i as i64);
            rows.5.push(*c);
        }
        for (rank, (i, c)) in a.opponents.iter().enumerate() {
            rows.0.push(a.point as i64);
            rows.1.push(a.class as i64);
            rows.2.push("opponent".to_string());
            rows.3.push(rank as i64);
            rows.4.push(*i as i64);
            rows.5.push(*c);
        }
    }
    Table::new()
        .with("point", Column::I64(rows.0))
        .with("class", Column::I64(rows.1))
        .with("role", Column::Str(rows.2))
        .with("rank", Column::I64(rows.3))
        .with("train_index", Column::I64(rows.4))
        .with("contribution", Column::F64(rows.5))
        .write_parquet(&out_dir.join("attribution.parquet"))?;
    let mut sel = Vec::with_capacity(points.len() * m * k);
    for &q in points {
        sel.extend_from_slice(&contrib[q * m * k..(q + 1) * m * k]);
    }
    io::write_safetensors(
        &out_dir.join("contributions.safetensors"),
        &[
            NamedArray::f64("contributions", vec![points.len(), m, k], sel),
            NamedArray::i64("points", vec![points.len()], points.iter().map(|&q| q as i64).collect()),
        ],
        None,
    )?;
    let s = AttributionSummary { attributions: at, max_abs_residual, form };
    io::write_json(&out_dir.join("attribution.json"), &s)?;
    Ok(s)
}

/// Summary of `pathkernel stationarity`.
#[derive(Clone, Debug, Serialize)]
pub struct StationaritySummary {
    /// Headline score of the kernel (trace over classes), 1 = stationary.
    pub score: f64,
    /// Per class block.
    pub class_scores: Vec<f64>,
    /// The RBF reference on the same points (length scale = median pairwise distance).
    pub rbf_score: f64,
    /// RBF length scale used.
    pub rbf_length: f64,
    /// Spearman correlation of the kernel's self-value along rays with the distance from the
    /// training data (> 0: grows far away).
    pub far_kernel_spearman: f64,
    /// Spearman correlation of the GP posterior standard deviation along rays with the distance
    /// (< 0: more confident far from the data).
    pub far_std_spearman: f64,
    /// Spearman correlation of the Monte-Carlo standard deviation of the softmax probabilities
    /// along rays with the distance (< 0: probabilities more certain far from the data).
    pub far_prob_std_spearman: f64,
    /// Points along rays.
    pub ray_points: usize,
    /// Quadrature of the far-field kernel.
    pub far_quadrature: String,
}

/// Stationarity of a train×train kernel against an RBF reference on the same points, and the
/// far field: the kernel's self-value and the GP standard deviation along rays leaving the data.
/// Writes `stationarity.json`, `far_field.parquet` and `far_profile.parquet`.
#[allow(clippy::too_many_arguments)]
pub fn stationarity_report(
    run: &Run,
    train_kernel: &KernelFiles,
    gp_params: &GpParams,
    rule: Rule,
    n_dirs: usize,
    n_steps: usize,
    growth: f64,
    seed: u64,
    out_dir: &Path,
) -> Result<StationaritySummary> {
    train_kernel.require_train_rows(run)?;
    train_kernel.require_layout(Layout::Diag, "stationarity (per-class scores and the far-field GP)")?;
    let (m, k, d) = (train_kernel.m, train_kernel.k, train_kernel.d);
    let x = &run.dataset.x_train;
    let opts = StationarityOptions { seed, ..StationarityOptions::default() };
    let mut trace = vec![0.0; m * m];
    let mut class_scores = Vec::with_capacity(k);
    for c in 0..k {
        let b = train_kernel.class_block(c);
        for (t, v) in trace.iter_mut().zip(&b) {
            *t += v;
        }
        class_scores.push(analysis::stationarity(x, &b, m, d, &opts)?.score);
    }
    let score = analysis::stationarity(x, &trace, m, d, &opts)?.score;
    // RBF reference with the median pairwise distance as length scale.
    let mut dists = Vec::new();
    for i in 0..m.min(400) {
        for j in i + 1..m.min(400) {
            dists.push((0..d).map(|c| (x[i * d + c] - x[j * d + c]).powi(2)).sum::<f64>().sqrt());
        }
    }
    // statrs's median: the mean of the two middle distances for an even count, NaN for none.
    let median = statrs::statistics::Median::median(&statrs::statistics::Data::new(dists));
    let rbf_length = if median.is_nan() { 1.0 } else { median.max(1e-12) };
    let rbf: Vec<f64> = (0..m * m)
        .map(|idx| {
            let (i, j) = (idx / m, idx % m);
            let r2: f64 = (0..d).map(|c| (x[i * d + c] - x[j * d + c]).powi(2)).sum();
            (-0.5 * r2 / (rbf_length * rbf_length)).exp()
        })
        .collect();
    let rbf_score = analysis::stationarity(x, &rbf, m, d, &opts)?.score;
    // Far field along rays: the kernel of the same kind at the ray points (test side).
    let (rx, ray, radius) = analysis::ray_points(x, m, d, n_dirs, n_steps, growth, seed)?;
    let r = ray.len();
    let kind: KernelKind = if train_kernel.kind.is_empty() { KernelKind::Epk } else { train_kernel.kind.parse()? };
    let states = run.load_all()?;
    let req = KernelRequest { kind, rule, side: Side::Test, ntk_step: None, per_step: false, steps: None };
    let far = kernel::compute_run(run, &states, &Points { x: rx.clone(), dim: d }, &req, u64::MAX, &|_, _| {})?;
    let far_diag = far.diag.clone().ok_or_else(|| Error::Config(format!("kernel kind {kind} has no self-kernel for the far field")))?;
    let kval: Vec<f64> = (0..r).map(|q| (0..k).map(|c| far_diag[(q * k + c) * k + c]).sum::<f64>() / k as f64).collect();
    let nearest = analysis::nearest_distance(&rx, x, d)?;
    // GP posterior std along the rays (targets: the network's outputs minus the bias).
    let mut k_train = Vec::with_capacity(k * m * m);
    let mut k_cross = Vec::with_capacity(k * r * m);
    let mut k_diag = Vec::with_capacity(k * r);
    for c in 0..k {
        k_train.extend(train_kernel.symmetric_class_block(c));
        k_cross.extend((0..r * m).map(|idx| far.gram[(idx * k + c) * k + c]));
        k_diag.extend((0..r).map(|q| far_diag[(q * k + c) * k + c]));
    }
    let f_train = network_at(run, x)?;
    let b_train = run.manifest.architecture.forward(&states[0], Some(&states[0]), x)?;
    let tgt: Vec<f64> = f_train.iter().zip(&b_train).map(|(f, b)| f - b).collect();
    let post = gp_params.fit(&k_train, &tgt, m, k)?.predict(&k_cross, &k_diag, r)?;
    let std: Vec<f64> = (0..r).map(|q| (0..k).map(|c| post.var[q * k + c].sqrt()).sum::<f64>() / k as f64).collect();
    // Standard deviation of the softmax probabilities (Monte Carlo), the paper's Fig. 5 quantity.
    let mc = gp::mc_softmax(&post, 1000, seed)?;
    let pstd: Vec<f64> = (0..r).map(|q| (0..k).map(|c| mc.std_prob[q * k + c]).sum::<f64>() / k as f64).collect();
    let kp = analysis::profile(&nearest, &kval, 8)?;
    let sp = analysis::profile(&nearest, &std, 8)?;
    let pp = analysis::profile(&nearest, &pstd, 8)?;
    Table::new()
        .with("ray", Column::I64(ray.iter().map(|&v| v as i64).collect()))
        .with("radius", Column::F64(radius))
        .with("nearest_train_distance", Column::F64(nearest))
        .with("kernel_self_value", Column::F64(kval))
        .with("gp_std", Column::F64(std))
        .with("mc_prob_std", Column::F64(pstd))
        .write_parquet(&out_dir.join("far_field.parquet"))?;
    let rows = |pr: &analysis::Profile| pr.rows.iter().map(|r| (r.lo, r.hi, r.count as i64, r.mean)).collect::<Vec<_>>();
    let (kr, sr, pr) = (rows(&kp), rows(&sp), rows(&pp));
    Table::new()
        .with("distance_lo", Column::F64(kr.iter().map(|r| r.0).collect()))
        .with("distance_hi", Column::F64(kr.iter().map(|r| r.1).collect()))
        .with("count", Column::I64(kr.iter().map(|r| r.2).collect()))
        .with("kernel_self_value_mean", Column::F64(kr.iter().map(|r| r.3).collect()))
        .with("gp_std_mean", Column::F64(sr.iter().map(|r| r.3).collect()))
        .with("mc_prob_std_mean", Column::F64(pr.iter().map(|r| r.3).collect()))
        .write_parquet(&out_dir.join("far_profile.parquet"))?;
    let s = StationaritySummary {
        score,
        class_scores,
        rbf_score,
        rbf_length,
        far_kernel_spearman: kp.spearman,
        far_std_spearman: sp.spearman,
        far_prob_std_spearman: pp.spearman,
        ray_points: r,
        far_quadrature: rule.to_string(),
    };
    io::write_json(&out_dir.join("stationarity.json"), &s)?;
    Ok(s)
}
