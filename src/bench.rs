//! Timing harness behind `pathkernel bench`: wall-clock seconds of kernel computations on a
//! recorded run, as JSON lines (name, sizes, min/median seconds, evaluations).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::kernel::{self, KernelKind, KernelRequest, Points, Rule, Side};
use crate::trajectory::Run;

/// A global allocator that counts live heap bytes and their peak (for `bench`'s `peak_bytes`).
///
/// Wraps [`System`]; the binary registers it with `#[global_allocator]`. Counting costs two
/// relaxed atomic operations per allocation. In a program that does not register it,
/// [`CountingAlloc::current`] and [`CountingAlloc::peak`] stay 0.
pub struct CountingAlloc;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static REGISTERED: AtomicU64 = AtomicU64::new(0);

impl CountingAlloc {
    /// Live heap bytes now.
    pub fn current() -> usize {
        CURRENT.load(Ordering::Relaxed)
    }
    /// Highest live heap bytes since the last [`CountingAlloc::reset_peak`].
    pub fn peak() -> usize {
        PEAK.load(Ordering::Relaxed)
    }
    /// Sets the peak to the live bytes now.
    pub fn reset_peak() {
        PEAK.store(CURRENT.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    /// Whether the running program counts (it registered [`CountingAlloc`]).
    pub fn is_counting() -> bool {
        REGISTERED.load(Ordering::Relaxed) > 0
    }
    fn add(n: usize) {
        let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(now, Ordering::Relaxed);
        REGISTERED.store(1, Ordering::Relaxed);
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
pub struct BenchResult {
    /// What was timed.
    pub name: String,
    /// Row points P.
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
    /// Fastest repetition, seconds.
    pub seconds_min: f64,
    /// Median repetition, seconds.
    pub seconds_median: f64,
    /// Gradient evaluations per point (mean) in the timed step.
    pub evaluations: f64,
    /// Max |kernel machine − network| over the step (ntk: not applicable, NaN).
    pub step_max_abs_error: f64,
}

/// Times one NTK step and one EPK step (`auto:tol`) at `step` on the run's test points.
pub fn kernel_steps(run: &Run, step: usize, repeat: usize, tol: f64) -> Result<Vec<BenchResult>> {
    let n = run.manifest.steps;
    if step >= n {
        return Err(Error::Config(format!("--step {step}: the run has steps 0..{n}")));
    }
    if repeat == 0 {
        return Err(Error::Config("--repeat must be >= 1".into()));
    }
    let states = run.load_all()?;
    let pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let mut out = Vec::new();
    let cases = [
        ("ntk_step", KernelRequest { kind: KernelKind::Ntk, rule: Rule::Gauss(1), side: Side::Test, ntk_step: Some(step), per_step: false, steps: Some((step, step + 1)) }),
        (
            "epk_step",
            KernelRequest { kind: KernelKind::Epk, rule: Rule::Auto(tol), side: Side::Test, ntk_step: None, per_step: false, steps: Some((step, step + 1)) },
        ),
        ("dpk_step", KernelRequest { kind: KernelKind::Dpk, rule: Rule::Gauss(1), side: Side::Test, ntk_step: None, per_step: false, steps: Some((step, step + 1)) }),
    ];
    for (name, req) in cases {
        let mut times = Vec::with_capacity(repeat);
        let mut last = None;
        for _ in 0..repeat {
            let t0 = Instant::now();
            let o = kernel::compute(&run.manifest, &run.dataset, &states, &pts, &req, u64::MAX, &|_, _| {})?;
            times.push(t0.elapsed().as_secs_f64());
            last = Some(o);
        }
        times.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
        let o = last.expect("repeat >= 1");
        out.push(BenchResult {
            name: name.into(),
            points: o.p,
            train: o.m,
            outputs: o.k,
            params: run.manifest.num_params,
            step,
            repeat,
            seconds_min: times[0],
            seconds_median: times[times.len() / 2],
            evaluations: o.mean_evaluations(),
            step_max_abs_error: if req.kind == KernelKind::Ntk { f64::NAN } else { o.max_abs_error() },
        });
    }
    Ok(out)
}
