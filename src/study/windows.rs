//! The exact kernel machine of a whole run from kernels of chosen windows of steps.
//!
//! A kernel over the steps `[A, B)` predicts `f(w_B)` from the bias `f(w_A)`; between two
//! windows, the network's own change `f(w_b) − f(w_a)` over the gap is exact (two forward
//! passes). So, with windows `[A_1, B_1) … [A_n, B_n)` in order,
//!
//! ```text
//! f(w_N) = f(w_0) + Σ_j (machine_j − bias_j) + Σ_gaps (f(w_b) − f(w_a)),
//! ```
//!
//! the gaps being `[0, A_1)`, `[B_1, A_2)`, …, `[B_n, N)` (empty ones left out): each window's
//! kernel sum is attributed to its training points, and the rest of the run is one term per gap.
//! A window computed with [`crate::api::KernelBuilder::carry_in`] (momentum, Adam) holds in its
//! term the carried-in change `C` of the earlier steps' gradients inside it
//! ([`crate::kernel::KernelOutput::carried`]), reported as [`Segment::carried`]: that part is the
//! gap's (or earlier window's) gradients, not the window's training points.

use crate::api::{Gram, Trained};
use crate::error::{Error, Result};

/// One segment of the run: a window's kernel sum or a gap's change.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// The window's label, or `gap`.
    pub label: String,
    /// Its steps `[a, b)`.
    pub steps: (usize, usize),
    /// Its term: `machine − bias` of a window, `f(w_b) − f(w_a)` of a gap. # Shapes `[P, K]`.
    pub term: Vec<f64>,
    /// A window's own `max |machine − f(w_b)|` (`None` for a gap).
    pub window_error: Option<f64>,
    /// A window's carried-in term, included in `term` (`None` for a gap and for a window
    /// whose earlier steps are steps of its Gram). # Shapes `[P, K]`.
    pub carried: Option<Vec<f64>>,
}

/// The whole run's machine put together from windows and gaps.
#[derive(Clone, Debug, PartialEq)]
pub struct Composition {
    /// The segments in step order.
    pub segments: Vec<Segment>,
    /// `f(w_0)` plus every segment's term. # Shapes `[P, K]`.
    pub machine: Vec<f64>,
    /// `f(w_N)`. # Shapes `[P, K]`.
    pub network: Vec<f64>,
    /// `max |machine − network|`.
    pub max_abs_error: f64,
}

/// Puts the windows' kernels together with the gaps' changes into the machine of the whole run of
/// `net`. Every Gram must be on the same points, each with its steps `[A, B)`
/// (`windows[j].0`), in order and not overlapping.
///
/// # Shapes
/// Each Gram's machine and bias `[P, K]`.
///
/// Errors: Grams on different points, windows out of order, overlapping or beyond the run.
pub fn compose(net: &Trained, windows: &[(String, (usize, usize), &Gram)]) -> Result<Composition> {
    let Some(first) = windows.first() else {
        return Err(Error::Config("no windows to put together".into()));
    };
    let states = net.states();
    let n = states.len() - 1;
    let arch = &net.run().manifest.architecture;
    let points = first.2.points();
    let (p, _, k) = first.2.shape();
    let f_at = |s: usize| arch.forward(&states[s], Some(&states[0]), &points.x);
    let mut segments = Vec::new();
    let mut at = 0;
    for (label, (a, b), g) in windows {
        if g.points().x != points.x || g.points().dim != points.dim {
            return Err(Error::Config(format!("window `{label}` is on other points than `{}`", first.0)));
        }
        if a < &at || a >= b || *b > n {
            return Err(Error::Config(format!("window `{label}` [{a}, {b}) is out of order, overlaps the one before or lies beyond the run's {n} steps")));
        }
        if *a > at {
            segments.push(gap(at, *a, &f_at)?);
        }
        let (m, bias) = (g.machine(), g.bias());
        let term: Vec<f64> = (0..p).flat_map(|i| (0..k).map(move |c| (i, c))).map(|(i, c)| m[(i, c)] - bias[(i, c)]).collect();
        let carried = g.output().carried.clone();
        segments.push(Segment { label: label.clone(), steps: (*a, *b), term, window_error: Some(g.max_abs_error()), carried });
        at = *b;
    }
    if at < n {
        segments.push(gap(at, n, &f_at)?);
    }
    let mut machine = f_at(0)?;
    for s in &segments {
        machine.iter_mut().zip(&s.term).for_each(|(m, t)| *m += t);
    }
    let network = f_at(n)?;
    let max_abs_error = machine.iter().zip(&network).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    Ok(Composition { segments, machine, network, max_abs_error })
}

fn gap(a: usize, b: usize, f_at: &dyn Fn(usize) -> Result<Vec<f64>>) -> Result<Segment> {
    let (fa, fb) = (f_at(a)?, f_at(b)?);
    Ok(Segment { label: "gap".into(), steps: (a, b), term: fb.iter().zip(&fa).map(|(y, x)| y - x).collect(), window_error: None, carried: None })
}
