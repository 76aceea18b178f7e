//! The one check of an import: is a recorded update `w_{s+1} − w_s` the recorded optimizer's
//! step, replayed here in f64 from the gradient recomputed at `w_s`?
//!
//! A genuine step differs from the replay by rounding only: the recorded weights are stored in
//! the run's precision (unit roundoff `u`: 2⁻⁵³ for float64, 2⁻²⁴ for float32), and the update
//! was computed in it from a gradient rounded in it. So each coordinate's difference is measured
//! in units of the rounding it can carry,
//!
//! ```text
//! ulps_j = |(w_{s+1,j} − w_{s,j}) − Δ̂_j| / ( u · (|w_{s,j}| + |w_{s+1,j}| + UPDATE_ULPS · ‖Δ̂‖_∞) )
//! ```
//!
//! an ulp of each stored weight (the storage's rounding) plus [`UPDATE_ULPS`] ulps of the
//! update's size: the gradient's rounding carried through the optimizer (summed per-point
//! gradients that cancel, normalised by Adam's `1/√v̂`) scales with the whole update, not with one
//! coordinate of it, and was measured at up to 79 ulps of the update on genuine float32 runs. A
//! step is the optimizer's when its largest `ulps_j` is within [`TOLERANCE_ULPS`] (the same
//! numbers for every precision: the precision enters through `u`). This accepts the steps of a vanishing learning rate (OneCycleLR's last steps,
//! LinearLR from a factor of 1e-6: their difference is one ulp of the weights, however large
//! relative to the update) and refuses an edit of one weight as soon as it exceeds the rounding
//! that weight and that update can carry.
//!
//! Under a preconditioned optimizer (Adam, RMSprop, Adagrad) the unit of each coordinate also
//! carries how far the optimizer moves its update when the gradient moves by its rounding
//! ([`gradient_rounding_slack`]). The recorded update is the optimizer applied to PyTorch's
//! gradient, ours to the gradient recomputed here; the two differ by rounding of different sums,
//! up to `UPDATE_ULPS · u · ‖ĝ‖_∞` in a coordinate whose terms cancel. Where the preconditioner is
//! large (Adam's `1 / (√v̂ + ε)` where the gradient is far below ε), or where the buffer nearly
//! cancels (a gradient changing sign), that rounding reaches the update multiplied by up to
//! `ε_s / ε`: an `nn.MultiheadAttention` with biases under AdamW, whose key biases have a gradient
//! that vanishes in exact arithmetic (every softmax row ignores a shift shared by its scores),
//! differs there by 1e-12, 1e5 of the plain units, and a query weight whose small gradient
//! changed sign under OneCycleLR by 15 of them. Where the update is insensitive the added term is
//! far below the plain unit. The price is in edit detection where it is sensitive: on the float32
//! AdamW recipe (`python -m pathkernel_recorder.recipes --edits`) the smallest refused edit of one
//! weight, over 24 coordinates, is at most 1.9e-6 (49× the run's rounding; 3.1e-7 without this
//! term), and every edit of 100× the rounding is still refused.

use crate::model::ParamSpec;
use crate::optim::OptimizerState;

/// Ulps of the update's max-norm in the unit of the step check (module docs).
pub const UPDATE_ULPS: f64 = 64.0;

/// Default tolerance of the step check, in units of `u·(|w_s| + |w_{s+1}| + 64‖Δ̂‖_∞)`: four
/// ulps of the weights and 256 of the update. The largest figure seen on genuine runs is
/// reported in the guide's PyTorch chapter.
pub const TOLERANCE_ULPS: f64 = 4.0;

/// How far one recorded update is from the replayed one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct StepDiff {
    /// `‖(w_{s+1} − w_s) − Δ̂‖_∞`.
    pub abs: f64,
    /// `abs / ‖Δ̂‖_∞` (0 when both are 0; infinite for a difference from a zero update).
    pub rel: f64,
    /// `max_j ulps_j` (module docs).
    pub ulps: f64,
    /// The flat index j where `ulps_j` is largest.
    pub at: usize,
    /// `‖Δ̂‖_∞`.
    pub update: f64,
}

/// Each coordinate's largest change of a preconditioned update when the gradient `g` moves by
/// its rounding, `±UPDATE_ULPS · u · ‖g‖_∞` in every coordinate, replayed from the optimizer's
/// state `before` the step (its preconditioner follows the gradient): the extra unit of the
/// step check under a preconditioner (module docs). `replayed` is the update from `g`.
///
/// # Shapes
/// `w`, `g`, `replayed` and the result `[W]`.
pub(crate) fn gradient_rounding_slack(before: &OptimizerState, lr: f64, w: &[f64], g: &[f64], replayed: &[f64], u: f64) -> Vec<f64> {
    let noise = UPDATE_ULPS * u * g.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let mut out = vec![0.0f64; g.len()];
    for sign in [1.0, -1.0] {
        let moved: Vec<f64> = g.iter().map(|v| v + sign * noise).collect();
        let d = before.clone().step(lr, w, &moved);
        out.iter_mut().zip(d.iter().zip(replayed)).for_each(|(o, (a, b))| *o = (*o).max((a - b).abs()));
    }
    out
}

impl StepDiff {
    /// Measures the recorded update `w1 − w0` against the replayed `replayed`, with the unit
    /// roundoff `u` of the recording's precision and, under a preconditioner, each coordinate's
    /// [`gradient_rounding_slack`] added to its unit.
    ///
    /// # Shapes
    /// All `[W]`.
    pub(crate) fn of(w0: &[f64], w1: &[f64], replayed: &[f64], u: f64, slack: Option<&[f64]>) -> StepDiff {
        let update = replayed.iter().fold(0.0f64, |m, d| m.max(d.abs()));
        let mut out = StepDiff { update, ..StepDiff::default() };
        for (j, ((a, b), want)) in w0.iter().zip(w1).zip(replayed).enumerate() {
            let d = ((b - a) - want).abs();
            let unit = u * (a.abs() + b.abs() + UPDATE_ULPS * update) + slack.map_or(0.0, |s| s[j]);
            let ulps = if d == 0.0 {
                0.0
            } else if unit == 0.0 {
                f64::INFINITY
            } else {
                d / unit
            };
            out.abs = out.abs.max(d);
            if ulps > out.ulps || ulps.is_nan() {
                (out.ulps, out.at) = (ulps, j);
            }
        }
        out.rel = if out.abs == 0.0 {
            0.0
        } else {
            out.abs / update
        };
        out
    }

    /// Whether the step is the optimizer's at `tolerance` ulps.
    pub(crate) fn accepted(&self, tolerance: f64) -> bool {
        self.ulps <= tolerance
    }
}

/// `name[i]` of flat index `j` in parameters `specs`.
pub(crate) fn coordinate(specs: &[ParamSpec], j: usize) -> String {
    let mut off = 0;
    for sp in specs {
        let n = sp.numel();
        if j < off + n {
            return format!("{}[{}]", sp.name, j - off);
        }
        off += n;
    }
    format!("[{j}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    const U32: f64 = f32::EPSILON as f64 / 2.0;
    const U64: f64 = f64::EPSILON / 2.0;

    #[test]
    fn a_step_of_a_vanishing_learning_rate_is_one_ulp_of_the_weights() {
        // OneCycleLR's last step: an update of 1e-9 on weights of 0.3, stored in float64.
        let w0 = [0.3, -0.7, 1.1];
        let replayed = [1e-9, -2e-9, 5e-10];
        let w1: Vec<f64> = w0.iter().zip(&replayed).map(|(a, d)| a + d).collect();
        let d = StepDiff::of(&w0, &w1, &replayed, U64, None);
        assert!(d.abs > 0.0 && d.abs <= 2.3e-16, "{d:?}");
        assert!(d.rel > 1e-9, "relative to the update it is large: {d:?}");
        assert!(d.accepted(TOLERANCE_ULPS) && d.ulps <= 1.0, "{d:?}");
    }

    #[test]
    fn an_edit_beyond_the_rounding_is_refused_and_located() {
        // A float32 Adam-like step of 1e-3 on weights ~0.2, each stored weight rounded to float32.
        let w0: Vec<f64> = (0..50).map(|i| f64::from((0.2 + 0.01 * i as f64) as f32)).collect();
        let replayed: Vec<f64> = (0..50).map(|i| if i % 2 == 0 { 1e-3 } else { -1e-3 }).collect();
        let mut w1: Vec<f64> = w0.iter().zip(&replayed).map(|(a, d)| f64::from((a + d) as f32)).collect();
        let genuine = StepDiff::of(&w0, &w1, &replayed, U32, None);
        assert!(genuine.accepted(TOLERANCE_ULPS) && genuine.ulps <= 1.0, "{genuine:?}");
        // Rounding of the update of 200 ulps of its size is accepted too.
        let mut noisy = w1.clone();
        noisy[3] += 200.0 * U32 * 1e-3;
        assert!(StepDiff::of(&w0, &noisy, &replayed, U32, None).accepted(TOLERANCE_ULPS));
        w1[17] += 5e-5;
        let edited = StepDiff::of(&w0, &w1, &replayed, U32, None);
        assert!(!edited.accepted(TOLERANCE_ULPS), "{edited:?}");
        assert_eq!(edited.at, 17);
        assert!((edited.abs - 5e-5).abs() < 1e-7, "{edited:?}");
        // The same edit is rounding in a weight of 1e3 (its ulp is 6e-5).
        let big: Vec<f64> = w0.iter().map(|w| w + 3e3).collect();
        let mut big1: Vec<f64> = big.iter().zip(&replayed).map(|(a, d)| a + d).collect();
        big1[17] += 5e-5;
        assert!(StepDiff::of(&big, &big1, &replayed, U32, None).accepted(TOLERANCE_ULPS));
    }

    /// Under Adam a coordinate whose gradient is rounding (attention's key bias) has an update of
    /// that rounding over ε: two such updates 1e-12 apart are accepted there, and the same
    /// difference on a coordinate with a gradient is refused (its slack is below the plain unit).
    #[test]
    fn a_vanishing_gradient_under_adam_carries_its_rounding_over_epsilon() {
        use crate::optim::{StepFactors, UpdateRule};
        use crate::trajectory::OptimizerRecord;
        let rule = UpdateRule::of(&OptimizerRecord::Adam {
            lr: 5e-3,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-8,
            weight_decay: 0.1,
            decoupled_weight_decay: true,
            batch_size: None,
            shuffle_seed: 0,
            recorded_batches: None,
            per_step: StepFactors::default(),
        });
        let before = OptimizerState::new(rule, 3);
        let (w0, lr) = ([0.3, 0.0, -0.2], 5e-3);
        let (g, theirs) = ([0.5, 3e-17, -0.1], [0.5, 1e-17, -0.1]);
        let replayed = before.clone().step(lr, &w0, &g);
        let recorded = before.clone().step(lr, &w0, &theirs);
        let w1: Vec<f64> = w0.iter().zip(&recorded).map(|(a, d)| a + d).collect();
        assert!((w1[1] - w0[1] - replayed[1]).abs() > 1e-12, "rounding over ε moves the update by 1e-12");
        let slack = gradient_rounding_slack(&before, lr, &w0, &g, &replayed, U64);
        assert!(slack[0] < 1e-18 && slack[2] < 1e-18 && slack[1] > 1e-10, "{slack:?}");
        assert!(!StepDiff::of(&w0, &w1, &replayed, U64, None).accepted(TOLERANCE_ULPS));
        let d = StepDiff::of(&w0, &w1, &replayed, U64, Some(&slack));
        assert!(d.accepted(TOLERANCE_ULPS) && d.ulps < 1.0, "{d:?}");
        let mut edited = w1.clone();
        edited[2] += 1.4e-12;
        assert!(!StepDiff::of(&w0, &edited, &replayed, U64, Some(&slack)).accepted(TOLERANCE_ULPS));
    }

    #[test]
    fn zero_updates_and_names() {
        let d = StepDiff::of(&[0.0, 1.0], &[0.0, 1.0], &[0.0, 0.0], U64, None);
        assert_eq!((d.abs, d.rel, d.ulps), (0.0, 0.0, 0.0));
        let moved = StepDiff::of(&[0.0, 1.0], &[1e-300, 1.0], &[0.0, 0.0], U64, None);
        assert!(!moved.accepted(TOLERANCE_ULPS) && moved.rel.is_infinite(), "{moved:?}");
        let specs = vec![ParamSpec { name: "0.weight".into(), shape: vec![2, 3] }, ParamSpec { name: "0.bias".into(), shape: vec![2] }];
        assert_eq!(coordinate(&specs, 4), "0.weight[4]");
        assert_eq!(coordinate(&specs, 7), "0.bias[1]");
    }
}
