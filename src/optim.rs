//! First-order optimizers as linear recursions in the per-point gradients, and how each
//! training step splits exactly into per-training-point terms plus a term that belongs to no
//! training point.
//!
//! # The update rules
//!
//! Every optimizer here is one recursion. At step s (weights `w_s`, learning rate `ε_s`,
//! mini-batch `B_s`, or every point for full-batch training) the data gradient is
//! `g_s = Σ_{i∈B_s} ∇ℓ_i(w_s) / |B_s|`, with `∇ℓ_i = Σ_k ∂ℓ/∂f^k(x_i) ∇f^k(x_i)`, and
//!
//! ```text
//! m_s  = β m_{s−1} + γ (g_s + λ_c w_s)                         (m_{−1} = 0)
//! Δw_s = w_{s+1} − w_s = −ε_s ( κ_s D_s ⊙ m_s + λ_d w_s )
//! ```
//!
//! | optimizer              | β      | γ       | κ_s                  | D_s (diagonal)                          |
//! |------------------------|--------|---------|----------------------|-----------------------------------------|
//! | GD / SGD               | 0      | 1       | 1                    | 1                                       |
//! | heavy-ball momentum μ  | μ      | 1       | 1                    | 1                                       |
//! | Adam / AdamW (β1, β2)  | β1     | 1 − β1  | 1 / (1 − β1^{s+1})   | 1 / (√(v_s / (1 − β2^{s+1})) + eps)     |
//!
//! with `v_s = β2 v_{s−1} + (1 − β2)(g_s + λ_c w_s)²` for Adam. Weight decay is *coupled*
//! (`λ_c`, an L2 term added to the gradient: PyTorch's `weight_decay` of SGD and Adam) or
//! *decoupled* (`λ_d`, applied to the weights directly: SGDW and AdamW, PyTorch's AdamW
//! convention `w ← w − ε_s λ_d w`). Momentum follows PyTorch's SGD (no dampening, the first
//! buffer is the first gradient).
//!
//! # The exact per-point decomposition
//!
//! Unrolling the recursion, the step's weight change is a sum of per-point terms and one
//! non-data term:
//!
//! ```text
//! Δw_s = Σ_i u_{i,s} + r_s
//! u_{i,s} = −ε_s κ_s D_s ⊙ Σ_{r≤s} γ β^{s−r} [i∈B_r] ∇ℓ_i(w_r) / |B_r|
//! r_s     = −ε_s ( κ_s D_s ⊙ Σ_{r≤s} γ β^{s−r} λ_c w_r + λ_d w_s )
//! ```
//!
//! For plain SGD only the batch contributes; momentum carries earlier steps' per-point gradients
//! forward (point i keeps contributing after it left the batch); Adam's preconditioner `D_s` is
//! a function of the whole history, fixed within the step (it multiplies every point's term
//! alike). `r_s` is the weight decay, ExPLAIND's "reg term".
//!
//! # The kernel machine
//!
//! With `J̄_s(x) = ∫₀¹ ∇f(x; w_s + tΔw_s) dt` (exact by the fundamental theorem of calculus,
//! computed by the kink-aware adaptive quadrature), `f(x; w_{s+1}) − f(x; w_s) = J̄_s(x)·Δw_s`.
//! Summing over steps and regrouping by the step r at which each gradient was taken:
//!
//! ```text
//! f(x; w_N) = f(x; w_0) + Σ_r Σ_i Σ_{k'} a_{i,r}^{k'} K_r(x, x_i)[k, k'] + R(x)
//! a_{i,r}    = −ε_r ∂L_r/∂f(x_i)                       (as for gradient descent)
//! K_r(x, x') = ⟨ F_r(x), ∇f(x'; w_r) ⟩,  F_r(x) = Σ_{s≥r} (ε_s/ε_r) γ β^{s−r} κ_s D_s ⊙ J̄_s(x)
//! R(x)       = −Σ_r λ_c ε_r ⟨F_r(x), w_r⟩ − Σ_s λ_d ε_s ⟨J̄_s(x), w_s⟩
//! ```
//!
//! `F_r` obeys the backward recursion `ε_r F_r = ε_r γ κ_r D_r ⊙ J̄_r + β ε_{r+1} F_{r+1}`, so
//! the kernel engine walks the path once backwards, carrying `ε_r F_r` for every row point.
//! For GD/SGD `F_r = J̄_r` and `K_r` is the EPK of Definition 3.4. With momentum the row side
//! carries future steps, and with Adam it is preconditioned by a `D_s` that changes from step to
//! step: `K_r` is then a valid kernel *machine* (it reproduces the network exactly) but not a
//! symmetric kernel `⟨φ(x), φ(x')⟩` of one feature map, and the output says so
//! ([`crate::kernel::KernelForm`]).

use serde::Serialize;

use crate::trajectory::OptimizerRecord;

/// Adam's second-moment preconditioner.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AdamMoments {
    /// β1 (bias correction of the first moment).
    pub beta1: f64,
    /// β2.
    pub beta2: f64,
    /// eps added to `√v̂`.
    pub eps: f64,
}

/// The recursion's constants (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct UpdateRule {
    /// Buffer decay β.
    pub beta: f64,
    /// Buffer input scale γ.
    pub gamma: f64,
    /// Adam's preconditioner and bias corrections, if any.
    pub adam: Option<AdamMoments>,
    /// Coupled (L2) weight decay λ_c.
    pub wd_coupled: f64,
    /// Decoupled weight decay λ_d.
    pub wd_decoupled: f64,
}

impl UpdateRule {
    /// The rule of a recorded optimizer.
    pub fn of(rec: &OptimizerRecord) -> Self {
        let split = |wd: f64, decoupled: bool| if decoupled { (0.0, wd) } else { (wd, 0.0) };
        match *rec {
            OptimizerRecord::Gd { momentum, weight_decay, decoupled_weight_decay, .. }
            | OptimizerRecord::Sgd { momentum, weight_decay, decoupled_weight_decay, .. } => {
                let (wd_coupled, wd_decoupled) = split(weight_decay, decoupled_weight_decay);
                UpdateRule { beta: momentum, gamma: 1.0, adam: None, wd_coupled, wd_decoupled }
            }
            OptimizerRecord::Adam { beta1, beta2, eps, weight_decay, decoupled_weight_decay, .. } => {
                let (wd_coupled, wd_decoupled) = split(weight_decay, decoupled_weight_decay);
                UpdateRule { beta: beta1, gamma: 1.0 - beta1, adam: Some(AdamMoments { beta1, beta2, eps }), wd_coupled, wd_decoupled }
            }
        }
    }

    /// Plain gradient steps: `Δw_s = −ε_s g_s` (GD or SGD without momentum or weight decay).
    pub(crate) fn is_plain(&self) -> bool {
        self.beta == 0.0 && self.adam.is_none() && self.wd_coupled == 0.0 && self.wd_decoupled == 0.0
    }

    /// Whether the per-step kernel is still the symmetric path kernel `⟨J̄_s(x), ∇f(x'; w_s)⟩`
    /// (no momentum, no preconditioner; weight decay only adds the non-data term).
    pub fn symmetric_kernel(&self) -> bool {
        self.beta == 0.0 && self.adam.is_none()
    }
}

/// The optimizer's state along a training run: the buffer `m` and Adam's `v`.
#[derive(Clone, Debug)]
pub(crate) struct OptimizerState {
    rule: UpdateRule,
    m: Vec<f64>,
    v: Vec<f64>,
    steps: usize,
    /// `κ_s D_s` of the last step (empty unless Adam).
    scale: Vec<f64>,
}

impl OptimizerState {
    /// A fresh state for W parameters.
    pub(crate) fn new(rule: UpdateRule, w: usize) -> Self {
        let v = if rule.adam.is_some() { vec![0.0; w] } else { Vec::new() };
        OptimizerState { rule, m: vec![0.0; w], v, steps: 0, scale: Vec::new() }
    }

    /// Advances by one step and returns `Δw_s`.
    ///
    /// # Shapes
    /// `w` (the weights `w_s`) and `g` (the data gradient `g_s`) are `[W]`, flat in parameter
    /// order; returns `[W]`.
    pub(crate) fn step(&mut self, lr: f64, w: &[f64], g: &[f64]) -> Vec<f64> {
        self.step_with(lr, w, g, None)
    }

    /// [`Self::step`], with Adam's `κ_s D_s` taken from `recorded` (`[W]`) instead of the
    /// second moments, when given: how a kernel replays exactly the update that was made.
    pub(crate) fn step_with(&mut self, lr: f64, w: &[f64], g: &[f64], recorded: Option<&[f64]>) -> Vec<f64> {
        let r = self.rule;
        let s = self.steps;
        self.steps += 1;
        if r.is_plain() {
            return g.iter().map(|gi| -(lr * gi)).collect();
        }
        for ((m, &gi), &wi) in self.m.iter_mut().zip(g).zip(w) {
            *m = r.beta * *m + r.gamma * (gi + r.wd_coupled * wi);
        }
        match r.adam {
            None => self.m.iter().zip(w).map(|(m, wi)| -lr * (m + r.wd_decoupled * wi)).collect(),
            Some(a) => {
                let bc1 = 1.0 - a.beta1.powi(s as i32 + 1);
                let bc2 = 1.0 - a.beta2.powi(s as i32 + 1);
                self.scale.clear();
                for ((v, &gi), &wi) in self.v.iter_mut().zip(g).zip(w) {
                    let ge = gi + r.wd_coupled * wi;
                    *v = a.beta2 * *v + (1.0 - a.beta2) * ge * ge;
                    self.scale.push(1.0 / (bc1 * ((*v / bc2).sqrt() + a.eps)));
                }
                if let Some(rec) = recorded {
                    self.scale.copy_from_slice(rec);
                }
                self.m.iter().zip(&self.scale).zip(w).map(|((m, c), wi)| -lr * (c * m + r.wd_decoupled * wi)).collect()
            }
        }
    }

    /// `κ_s D_s` (`[W]`) of the last step, or `None` when it is 1 (no preconditioner).
    pub(crate) fn last_scale(&self) -> Option<&[f64]> {
        if self.rule.adam.is_some() {
            Some(&self.scale)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(rec: OptimizerRecord) -> UpdateRule {
        UpdateRule::of(&rec)
    }

    #[test]
    fn plain_steps_are_bitwise_gradient_descent() {
        let r = rule(OptimizerRecord::Gd { lr: 0.3, momentum: 0.0, weight_decay: 0.0, decoupled_weight_decay: false });
        assert!(r.is_plain() && r.symmetric_kernel());
        let mut st = OptimizerState::new(r, 3);
        let w = [1.0, -2.0, 0.5];
        let g = [0.1, 0.7, -1e-300];
        let d = st.step(0.3, &w, &g);
        for i in 0..3 {
            assert_eq!(w[i] + d[i], w[i] - 0.3 * g[i]);
        }
    }

    #[test]
    fn momentum_matches_pytorch_heavy_ball() {
        // PyTorch SGD(momentum=μ, weight_decay=λ): b = μ b + (g + λ w); w -= lr b.
        let r = rule(OptimizerRecord::Gd { lr: 0.1, momentum: 0.9, weight_decay: 0.01, decoupled_weight_decay: false });
        assert!(!r.symmetric_kernel());
        let mut st = OptimizerState::new(r, 1);
        let (mut w, mut b) = (1.0f64, 0.0f64);
        for g in [0.5, -0.2, 0.3] {
            let d = st.step(0.1, &[w], &[g]);
            b = 0.9 * b + (g + 0.01 * w);
            let w_ref = w - 0.1 * b;
            w += d[0];
            assert!((w - w_ref).abs() < 1e-15);
        }
    }

    #[test]
    fn adamw_matches_the_reference_formula() {
        let r = rule(OptimizerRecord::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            decoupled_weight_decay: true,
            batch_size: None,
            shuffle_seed: 0,
        });
        let mut st = OptimizerState::new(r, 1);
        let (mut w, mut m, mut v) = (1.0f64, 0.0f64, 0.0f64);
        for (t, g) in [0.5, -0.2, 0.3, 1e-3].into_iter().enumerate() {
            let d = st.step(0.01, &[w], &[g]);
            // PyTorch AdamW: w *= 1 − lr λ; m, v updates; w -= lr m̂ / (√v̂ + eps).
            m = 0.9 * m + 0.1 * g;
            v = 0.999 * v + 0.001 * g * g;
            let mh = m / (1.0 - 0.9f64.powi(t as i32 + 1));
            let vh = v / (1.0 - 0.999f64.powi(t as i32 + 1));
            let w_ref = w * (1.0 - 0.01 * 0.1) - 0.01 * mh / (vh.sqrt() + 1e-8);
            w += d[0];
            assert!((w - w_ref).abs() < 1e-15, "{w} vs {w_ref}");
        }
        assert!(st.last_scale().is_some());
    }
}
