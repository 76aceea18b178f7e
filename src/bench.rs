//! Timing harness behind `pathkernel bench`: wall-clock seconds of kernel computations on a
//! recorded run, as JSON lines (name, sizes, min/median seconds, evaluations).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;
use statrs::statistics::{Data, Median};

use crate::error::{Error, Result};
use crate::kernel::{self, KernelKind, Points, Request, Rule, Side};
use crate::trajectory::Run;

/// A global allocator that counts live heap bytes and their peak (for `bench`'s `peak_bytes`).
///
/// Wraps [`System`]; the binary registers it with `#[global_allocator]`. Counting costs two
/// relaxed atomic operations per allocation. In a program that does not register it,
/// `CountingAlloc::current` and [`CountingAlloc::peak`] stay 0.
pub struct CountingAlloc;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl CountingAlloc {
    /// Live heap bytes now.
    pub(crate) fn current() -> usize {
        CURRENT.load(Ordering::Relaxed)
    }
    /// Highest live heap bytes since the last `CountingAlloc::reset_peak`.
    pub fn peak() -> usize {
        PEAK.load(Ordering::Relaxed)
    }
    /// Sets the peak to the live bytes now.
    pub(crate) fn reset_peak() {
        PEAK.store(CURRENT.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    fn add(n: usize) {
        let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    fn sub(n: usize) {
        CURRENT.fetch_sub(n, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are updated.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            Self::add(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            Self::add(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        Self::sub(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            Self::sub(layout.size());
            Self::add(new_size);
        }
        p
    }
}

/// One benchmark result.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct BenchResult {
    /// What was timed.
    pub name: String,
    /// Row points P (GP/SVM: M).
    pub points: usize,
    /// Training points M.
    pub train: usize,
    /// Outputs K (GP/SVM: 1, one class block).
    pub outputs: usize,
    /// Parameters W.
    pub params: usize,
    /// The step timed (the first step summed).
    pub step: usize,
    /// Steps summed.
    pub steps: usize,
    /// Repetitions.
    pub repeat: usize,
    /// Fastest repetition, seconds.
    pub seconds_min: f64,
    /// Median repetition, seconds.
    pub seconds_median: f64,
    /// Gradient evaluations per point (mean) in the timed steps (NaN for GP/SVM).
    pub evaluations: f64,
    /// Max |kernel machine − network| over the steps (ntk, GP, SVM: not applicable, NaN).
    pub step_max_abs_error: f64,
    /// Peak live heap bytes above those live when the case started (max over repetitions;
    /// 0 when the program does not register [`CountingAlloc`]).
    pub peak_bytes: u64,
    /// Bytes of the arrays the case returns (kernels: all of [`kernel::KernelOutput`]'s arrays).
    pub output_bytes: u64,
    /// Row blocks (kernels; 1 = unblocked).
    pub blocks: usize,
    /// SMO iterations (SVM only).
    pub iterations: Option<usize>,
}

impl BenchResult {
    fn kernel(name: &str, o: &kernel::KernelOutput, params: usize, t: &Timing, blocks: usize) -> Self {
        BenchResult {
            name: name.into(),
            points: o.p,
            train: o.m,
            outputs: o.k,
            params,
            step: o.steps.first().copied().unwrap_or(0),
            steps: o.steps.len(),
            repeat: t.times.len(),
            seconds_min: t.min(),
            seconds_median: t.median(),
            evaluations: o.mean_evaluations(),
            step_max_abs_error: if o.kind == KernelKind::Ntk { f64::NAN } else { o.max_abs_error() },
            peak_bytes: t.peak,
            output_bytes: kernel_output_bytes(o),
            blocks,
            iterations: None,
        }
    }
}

/// Bytes of all arrays of a kernel output.
pub(crate) fn kernel_output_bytes(o: &kernel::KernelOutput) -> u64 {
    let n = o.gram.len()
        + o.per_step.as_ref().map_or(0, Vec::len)
        + o.diag.as_ref().map_or(0, Vec::len)
        + o.a.len()
        + o.bias.len()
        + o.network.len()
        + o.machine.len()
        + o.single_machine.as_ref().map_or(0, Vec::len);
    8 * n as u64
}

/// Wall-clock seconds of the repetitions (sorted) and the peak heap above the start.
struct Timing {
    times: Vec<f64>,
    peak: u64,
}

impl Timing {
    fn min(&self) -> f64 {
        self.times[0]
    }
    /// The median (statrs: the mean of the two middle repetitions for an even count).
    fn median(&self) -> f64 {
        Median::median(&Data::new(self.times.clone()))
    }
}

/// Runs `f` `repeat` times (the previous result dropped before each run) and returns the
/// timing and the last result.
fn timed<T>(repeat: usize, mut f: impl FnMut() -> Result<T>) -> Result<(Timing, T)> {
    let mut times = Vec::with_capacity(repeat);
    let mut peak = 0u64;
    let mut last: Option<T> = None;
    for _ in 0..repeat.max(1) {
        drop(last.take());
        let base = CountingAlloc::current();
        CountingAlloc::reset_peak();
        let t0 = Instant::now();
        let v = f()?;
        times.push(t0.elapsed().as_secs_f64());
        peak = peak.max(CountingAlloc::peak().saturating_sub(base) as u64);
        last = Some(v);
    }
    times.sort_by(f64::total_cmp);
    Ok((Timing { times, peak }, last.expect("repeat >= 1")))
}

/// Which benchmark cases to run.
#[derive(Clone, Debug)]
pub(crate) struct BenchOptions {
    /// The step timed.
    pub step: usize,
    /// Repetitions of the fast cases.
    pub repeat: usize,
    /// Tolerance of the EPK's auto quadrature.
    pub tol: f64,
    /// Also the whole EPK over all steps, unblocked and in `full_blocks` row blocks.
    pub full: bool,
    /// Row blocks of the blocked whole EPK.
    pub full_blocks: usize,
    /// Also GP (Cholesky + solve) and SVM (SMO) on the class-0 block of the NTK Gram of the
    /// first `gram_m` training points at `step`.
    pub gram_m: Option<usize>,
    /// Also the scaling sweep over these training-set sizes (Gaussian mixture, same network).
    pub scaling: Vec<usize>,
    /// Step counts of the scaling sweep in the number of steps.
    pub scaling_steps: Vec<usize>,
}

/// Everything `bench` measured, with the arrays the Python peers compare against.
pub(crate) struct BenchReport {
    /// One result per case.
    pub results: Vec<BenchResult>,
    /// The NTK step's Gram `[P, M, K, K]`.
    pub ntk_gram: Vec<f64>,
    /// The GP/SVM problem and our solutions, when run.
    pub gram_problem: Option<GramProblem>,
    /// Scaling sweep rows: (kind, M, P, steps, seconds_min, seconds_median).
    pub scaling: Vec<(String, usize, usize, usize, f64, f64)>,
}

/// The GP/SVM benchmark problem: `K` = the NTK's class-0 block on training points, rounded to
/// f32 values (libsvm caches `Q` in f32; with f32-valued entries its iterates equal ours).
pub(crate) struct GramProblem {
    /// M.
    pub m: usize,
    /// `[M, M]`.
    pub k: Vec<f64>,
    /// ±1: class 0 against the rest, `[M]`.
    pub y: Vec<f64>,
    /// GP noise σ² (1e-2 × mean diagonal).
    pub noise: f64,
    /// SVM C.
    pub c: f64,
    /// SVM tolerance.
    pub tol: f64,
    /// GP weights `(K + σ²I)⁻¹ y`.
    pub gp_alpha: Vec<f64>,
    /// SVM `y_i α_i` `[M]`.
    pub svm_dual_coef: Vec<f64>,
    /// SVM intercept.
    pub svm_intercept: f64,
    /// SVM decision values on the training points `[M]`.
    pub svm_decision: Vec<f64>,
    /// SMO iterations.
    pub svm_iterations: usize,
}

fn step_request(kind: KernelKind, rule: Rule, step: usize, steps: usize) -> Request {
    Request::new(kind).rule(rule).ntk_step((kind == KernelKind::Ntk).then_some(step)).steps(Some((step, step + steps)))
}

/// Runs the cases of `opts` on a recorded run; `report` sees each result as it is measured.
pub(crate) fn run_all(run: &Run, opts: &BenchOptions, report: &mut dyn FnMut(&BenchResult)) -> Result<BenchReport> {
    let n = run.manifest.steps;
    let step = opts.step;
    if step >= n {
        return Err(Error::Config(format!("--step {step}: the run has steps 0..{n}")));
    }
    if opts.repeat == 0 {
        return Err(Error::Config("--repeat must be >= 1".into()));
    }
    let states = run.load_all()?;
    let w = run.manifest.num_params;
    let pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let mut results = Vec::new();
    let mut push = |r: BenchResult, results: &mut Vec<BenchResult>| {
        report(&r);
        results.push(r);
    };
    let run_kernel = |run: &Run, pts: &Points, req: &Request, repeat: usize| timed(repeat, || kernel::compute(run, &states, pts, req, &|_, _| {}));
    let mut ntk_gram = Vec::new();
    for (name, kind, rule) in [
        ("ntk_step", KernelKind::Ntk, Rule::Gauss(1)),
        ("epk_step", KernelKind::Epk, Rule::Auto(opts.tol)),
        ("dpk_step", KernelKind::Dpk, Rule::Gauss(1)),
    ] {
        let (t, o) = run_kernel(run, &pts, &step_request(kind, rule, step, 1), opts.repeat)?;
        push(BenchResult::kernel(name, &o, w, &t, 1), &mut results);
        if kind == KernelKind::Ntk {
            ntk_gram = o.gram;
        }
    }
    if opts.full {
        let req = Request::new(KernelKind::Epk).rule(Rule::Auto(opts.tol));
        let (t, o) = run_kernel(run, &pts, &req, 1)?;
        push(BenchResult::kernel("epk_full", &o, w, &t, 1), &mut results);
        drop(o);
        let rows = pts.len().div_ceil(opts.full_blocks.max(1));
        let (t, o) = run_kernel(run, &pts, &req.clone().block_rows(Some(rows)), 1)?;
        push(BenchResult::kernel("epk_full_blocked", &o, w, &t, pts.len().div_ceil(rows)), &mut results);
    }
    let gram_problem = match opts.gram_m {
        None => None,
        Some(mreq) => Some(gram_cases(run, &states, step, mreq, opts.repeat, &mut |r| push(r, &mut results))?),
    };
    let mut scaling = Vec::new();
    if !opts.scaling.is_empty() || !opts.scaling_steps.is_empty() {
        let repeat = opts.repeat.min(3);
        for &m in &opts.scaling {
            let per_class = (m / 3).max(1);
            let ds = crate::data::DataConfig::GaussianMixture { dim: run.dataset.dim, per_class, n_test: pts.len(), std: 1.0, seed: 0 }.load(std::path::Path::new("."))?;
            if ds.num_outputs != run.dataset.num_outputs || ds.dim != run.dataset.dim {
                return Err(Error::Config("--scaling needs a run on the paper's Gaussian mixture (d and K of the run)".into()));
            }
            let spts = Points { x: ds.x_test.clone(), dim: ds.dim };
            let srun = Run { dataset: ds, ..run.clone() };
            for (name, kind, rule) in [("ntk_step", KernelKind::Ntk, Rule::Gauss(1)), ("epk_step", KernelKind::Epk, Rule::Auto(opts.tol))] {
                let (t, o) = run_kernel(&srun, &spts, &step_request(kind, rule, step, 1), repeat)?;
                let r = BenchResult::kernel(&format!("scaling_{name}"), &o, w, &t, 1);
                scaling.push((kind.to_string(), o.m, o.p, 1, r.seconds_min, r.seconds_median));
                push(r, &mut results);
            }
        }
        for &ns in &opts.scaling_steps {
            if ns == 0 || ns > n {
                return Err(Error::Config(format!("--scaling-steps {ns}: need 1..={n}")));
            }
            let req = Request::new(KernelKind::Epk).rule(Rule::Auto(opts.tol)).steps(Some((0, ns)));
            let (t, o) = run_kernel(run, &pts, &req, if ns > 10 { 1 } else { repeat })?;
            let r = BenchResult::kernel("scaling_epk_steps", &o, w, &t, 1);
            scaling.push(("epk-steps".into(), o.m, o.p, ns, r.seconds_min, r.seconds_median));
            push(r, &mut results);
        }
    }
    Ok(BenchReport { results, ntk_gram, gram_problem, scaling })
}

/// GP and SVM cases on the NTK's class-0 block over the first `mreq` training points.
fn gram_cases(run: &Run, states: &[crate::model::Params], step: usize, mreq: usize, repeat: usize, push: &mut dyn FnMut(BenchResult)) -> Result<GramProblem> {
    let ds = &run.dataset;
    let m = mreq.min(ds.n_train());
    if m < 2 {
        return Err(Error::Config("--gram-m must be >= 2".into()));
    }
    let crate::data::Targets::Labels(labels) = &ds.y_train else {
        return Err(Error::Config("the GP/SVM cases need a classification run".into()));
    };
    let w = run.manifest.num_params;
    let pts = Points { x: ds.x_train[..m * ds.dim].to_vec(), dim: ds.dim };
    let req = Request::new(KernelKind::Ntk).rule(Rule::Gauss(1)).side(Side::Train).ntk_step(Some(step)).steps(Some((step, step + 1)));
    let (t, o) = timed(1, || kernel::compute(run, states, &pts, &req, &|_, _| {}))?;
    push(BenchResult::kernel("ntk_train_gram", &o, w, &t, 1));
    let (kk, mt) = (o.k, o.m);
    let mut k = vec![0.0; m * m];
    for i in 0..m {
        for j in 0..m {
            k[i * m + j] = o.gram[((i * mt + j) * kk) * kk] as f32 as f64;
        }
    }
    drop(o);
    // Symmetrise exactly (the NTK is symmetric to rounding).
    for i in 0..m {
        for j in 0..i {
            let v = k[i * m + j];
            k[j * m + i] = v;
        }
    }
    let y: Vec<f64> = labels[..m].iter().map(|&l| if l == 0 { 1.0 } else { -1.0 }).collect();
    let noise = 1e-2 * (0..m).map(|i| k[i * m + i]).sum::<f64>() / m as f64;
    let gp = crate::gp::GpParams::new().noise(noise).jitter(0.0);
    let (t, fit) = timed(repeat, || gp.fit(&k, &y, m, 1))?;
    let gp_alpha = fit.alpha(0).expect("one class").to_vec();
    let plain = |name: &str, t: &Timing, out: u64, iterations: Option<usize>| BenchResult {
        name: name.into(),
        points: m,
        train: m,
        outputs: 1,
        params: w,
        step,
        steps: 1,
        repeat: t.times.len(),
        seconds_min: t.min(),
        seconds_median: t.median(),
        evaluations: f64::NAN,
        step_max_abs_error: f64::NAN,
        peak_bytes: t.peak,
        output_bytes: out,
        blocks: 1,
        iterations,
    };
    push(plain("cholesky_solve", &t, 8 * (m * m + m) as u64, None));
    drop(fit);
    let svm = crate::svm::SvmParams::new();
    let (t, s) = timed(repeat, || svm.fit_binary(&k, &y, m))?;
    push(plain("smo", &t, 8 * 2 * m as u64, Some(s.iterations)));
    let svm_decision = s.decision(&k, m)?;
    Ok(GramProblem {
        m,
        k,
        y,
        noise,
        c: 1.0,
        tol: 1e-3,
        gp_alpha,
        svm_dual_coef: s.dual_coef.clone(),
        svm_intercept: s.intercept,
        svm_decision,
        svm_iterations: s.iterations,
    })
}

/// One EPK step (`rule`) on the run's test points through the generic autodiff Gram path and
/// through the structured CNN path, with the speed-up (for CNN runs).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ConvCompare {
    /// Always `"conv_paths"`.
    pub name: String,
    /// The quadrature rule of the EPK step.
    pub rule: String,
    /// Row points P, training points M, outputs K, parameters W.
    pub points: usize,
    /// Training points M.
    pub train: usize,
    /// Outputs K.
    pub outputs: usize,
    /// Parameters W.
    pub params: usize,
    /// The step timed.
    pub step: usize,
    /// Repetitions.
    pub repeat: usize,
    /// Fastest repetition on the generic path, seconds.
    pub generic_seconds_min: f64,
    /// Fastest repetition on the structured path, seconds.
    pub fast_seconds_min: f64,
    /// `generic_seconds_min / fast_seconds_min`.
    pub speedup: f64,
    /// max |G_fast − G_generic| / max |G_generic| over the step's Gram.
    pub gram_rel_diff: f64,
}

/// Times one EPK step with `rule` at `step` through both Gram paths of a CNN run.
pub(crate) fn conv_paths(run: &Run, step: usize, repeat: usize, rule: Rule) -> Result<ConvCompare> {
    let n = run.manifest.steps;
    if step >= n {
        return Err(Error::Config(format!("--step {step}: the run has steps 0..{n}")));
    }
    if repeat == 0 {
        return Err(Error::Config("--repeat must be >= 1".into()));
    }
    if !matches!(run.manifest.architecture.body, crate::model::Body::Cnn { .. }) {
        return Err(Error::Config("--conv-compare needs a CNN run".into()));
    }
    let states = run.load_all()?;
    let pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let req = Request::new(KernelKind::Epk).rule(rule).steps(Some((step, step + 1)));
    let mut best = [f64::INFINITY; 2];
    let mut grams: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for (j, path) in [kernel::GramPath::Generic, kernel::GramPath::Fast].into_iter().enumerate() {
        for _ in 0..repeat {
            let t0 = Instant::now();
            let o = kernel::compute(run, &states, &pts, &req.clone().path(path), &|_, _| {})?;
            best[j] = best[j].min(t0.elapsed().as_secs_f64());
            grams[j] = o.gram;
        }
    }
    let scale = grams[0].iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let diff = grams[0].iter().zip(&grams[1]).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
    Ok(ConvCompare {
        name: "conv_paths".into(),
        rule: rule.to_string(),
        points: pts.len(),
        train: run.dataset.n_train(),
        outputs: run.manifest.architecture.outputs(),
        params: run.manifest.num_params,
        step,
        repeat,
        generic_seconds_min: best[0],
        fast_seconds_min: best[1],
        speedup: best[0] / best[1],
        gram_rel_diff: diff / scale,
    })
}

/// The Gram contraction's rate against the machine's GEMM rate, measured in the same run.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ContractionRate {
    /// Always `"contraction"`.
    pub name: String,
    /// Where the contraction's GEMMs ran (`cpu`, `cuda`).
    pub device: String,
    /// Kernel kind, layout and quadrature.
    pub kind: String,
    /// Layout of the Gram.
    pub layout: String,
    /// Quadrature rule.
    pub quadrature: String,
    /// Row points P.
    pub points: usize,
    /// Training points M.
    pub train: usize,
    /// Outputs K.
    pub outputs: usize,
    /// Steps summed.
    pub steps: usize,
    /// Gradient evaluations per point and step (mean).
    pub evaluations_per_point_step: f64,
    /// Wall seconds of the whole kernel computation.
    pub total_seconds: f64,
    /// Seconds of the contraction (node evaluations excluded).
    pub contraction_seconds: f64,
    /// GEMM flops of the contraction, counted from the shapes (see `kernel::gram::GramAccumulator::contraction`).
    pub contraction_flops: f64,
    /// `contraction_flops / contraction_seconds`, GFLOP/s.
    pub contraction_gflops: f64,
    /// Side of the square GEMM timed for the machine's rate.
    pub gemm_n: usize,
    /// The device's GEMM rate on an `n × n × n` product (fastest of 3), GFLOP/s: faer's on the
    /// CPU, cuBLAS's DGEMM on a GPU.
    pub gemm_gflops: f64,
    /// `contraction_gflops / gemm_gflops`.
    pub ratio: f64,
    /// max |kernel machine − network| of the computation.
    pub max_abs_error: f64,
    /// Layer stacks: seconds of gradient evaluations (see `kernel::gram::Contraction`).
    pub gradient_seconds: f64,
    /// Layer stacks: seconds choosing the nodes (see `kernel::gram::Contraction`).
    pub node_search_seconds: f64,
}

/// Times a kernel computation (the run's test points against its training set, the given
/// steps) with its GEMMs on `device` and reports its contraction's GFLOP/s next to that device's
/// GEMM rate on a square product of similar size (`n` = the larger of P and M, rounded up to a
/// multiple of 64), measured right after it in the same process.
pub(crate) fn contraction_rate(run: &Run, kind: KernelKind, rule: Rule, layout: kernel::Layout, steps: Option<(usize, usize)>, device: kernel::Device) -> Result<ContractionRate> {
    if matches!(run.manifest.architecture.body, crate::model::Body::Cnn { .. }) {
        return Err(Error::Config("--contraction times the MLP's and the layer stacks' paths; this run is the CNN preset (write it as a layer stack)".into()));
    }
    let states = run.load_all()?;
    let pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let req = Request::new(kind).rule(rule).steps(steps).layout(layout).device(device);
    let t0 = Instant::now();
    let o = kernel::compute(run, &states, &pts, &req, &|_, _| {})?;
    let total = t0.elapsed().as_secs_f64();
    let n = o.p.max(o.m).div_ceil(64) * 64;
    let gemm = match device {
        kernel::Device::Cpu => crate::linalg::gemm_rate(n, 3),
        kernel::Device::Cuda => kernel::backend::dgemm_rate(device, n, 3)?,
    };
    let c = o.contraction;
    Ok(ContractionRate {
        name: "contraction".into(),
        device: device.to_string(),
        kind: kind.to_string(),
        layout: layout.to_string(),
        quadrature: rule.to_string(),
        points: o.p,
        train: o.m,
        outputs: o.k,
        steps: o.steps.len(),
        evaluations_per_point_step: o.mean_evaluations(),
        total_seconds: total,
        contraction_seconds: c.seconds,
        contraction_flops: c.flops,
        contraction_gflops: c.gflops(),
        gemm_n: n,
        gemm_gflops: gemm,
        ratio: c.gflops() / gemm,
        max_abs_error: o.max_abs_error(),
        gradient_seconds: c.gradient_seconds,
        node_search_seconds: c.node_search_seconds,
    })
}

/// The device and its DGEMM rate.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DgemmRate {
    /// Always `"dgemm"`.
    pub name: String,
    /// `cpu` or `cuda`.
    pub device: String,
    /// The device's name (and memory, for a GPU).
    pub describe: String,
    /// Side of the square product.
    pub n: usize,
    /// GFLOP/s of `C = A·Bᵀ`, fastest of the repetitions after a warm-up.
    pub gflops: f64,
}

/// The DGEMM rate of `device` on an `n × n × n` product.
pub(crate) fn dgemm(device: kernel::Device, n: usize, repeat: usize) -> Result<DgemmRate> {
    let describe = device.probe()?;
    let gflops = kernel::backend::dgemm_rate(device, n, repeat)?;
    Ok(DgemmRate { name: "dgemm".into(), device: device.to_string(), describe, n, gflops })
}

/// One Gram computed with its GEMMs on the CPU and on `device`, in the same process.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DeviceCompare {
    /// Always `"device_compare"`.
    pub name: String,
    /// The device compared with the CPU.
    pub device: String,
    /// Layout of the Gram.
    pub layout: String,
    /// Row points P.
    pub points: usize,
    /// Training points M.
    pub train: usize,
    /// Outputs K.
    pub outputs: usize,
    /// Steps summed.
    pub steps: usize,
    /// Wall seconds of the whole computation on the CPU.
    pub cpu_seconds: f64,
    /// Wall seconds with the GEMMs on the device.
    pub device_seconds: f64,
    /// Contraction seconds on the CPU.
    pub cpu_contraction_seconds: f64,
    /// Contraction seconds with the GEMMs on the device.
    pub device_contraction_seconds: f64,
    /// max |G_cpu − G_device|.
    pub max_abs_diff: f64,
    /// max |G_cpu|.
    pub max_abs: f64,
    /// `max_abs_diff / max_abs`.
    pub rel_diff: f64,
    /// max |kernel machine − network| on the CPU.
    pub cpu_machine_error: f64,
    /// The same with the GEMMs on the device.
    pub device_machine_error: f64,
}

/// The EPK (`rule`) of the run's test points against its training set over `steps`, once with
/// the GEMMs on the CPU and once on `device`: the largest difference, relative to the Gram's
/// largest entry, and both kernel machines' errors.
///
/// # Shapes
/// Both Grams are `[P, M, …]` in `layout`; they are compared entry by entry.
pub(crate) fn device_compare(run: &Run, rule: Rule, layout: kernel::Layout, steps: Option<(usize, usize)>, device: kernel::Device) -> Result<DeviceCompare> {
    let states = run.load_all()?;
    let pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let req = Request::new(KernelKind::Epk).rule(rule).steps(steps).layout(layout);
    let mut outs = Vec::with_capacity(2);
    let mut secs = Vec::with_capacity(2);
    for d in [kernel::Device::Cpu, device] {
        let t0 = Instant::now();
        outs.push(kernel::compute(run, &states, &pts, &req.clone().device(d), &|_, _| {})?);
        secs.push(t0.elapsed().as_secs_f64());
    }
    let (a, b) = (&outs[0], &outs[1]);
    let max_abs_diff = a.gram.iter().zip(&b.gram).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    let max_abs = a.gram.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    Ok(DeviceCompare {
        name: "device_compare".into(),
        device: device.to_string(),
        layout: layout.to_string(),
        points: a.p,
        train: a.m,
        outputs: a.k,
        steps: a.steps.len(),
        cpu_seconds: secs[0],
        device_seconds: secs[1],
        cpu_contraction_seconds: a.contraction.seconds,
        device_contraction_seconds: b.contraction.seconds,
        max_abs_diff,
        max_abs,
        rel_diff: if max_abs > 0.0 { max_abs_diff / max_abs } else { max_abs_diff },
        cpu_machine_error: a.max_abs_error(),
        device_machine_error: b.max_abs_error(),
    })
}

#[cfg(test)]
mod tests {
    use super::Timing;

    #[test]
    fn timing_min_and_median() {
        let odd = Timing { times: vec![1.0, 2.0, 7.0], peak: 0 };
        assert_eq!((odd.min(), odd.median()), (1.0, 2.0));
        // An even count: the mean of the two middle repetitions (it used to be the upper one).
        let even = Timing { times: vec![1.0, 2.0, 3.0, 10.0], peak: 0 };
        assert_eq!(even.median(), 2.5);
        assert_eq!(Timing { times: vec![4.0], peak: 0 }.median(), 4.0);
    }
}
