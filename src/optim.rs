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
//! ĝ_s  = g_s + λ_c w_s
//! m_s  = β m_{s−1} + γ_s ĝ_s                                    (m_{−1} = 0)
//! Δw_s = w_{s+1} − w_s = −ε_s ( κ_s D_s ⊙ m_s + λ_d w_s )          (Nesterov: −ε_s ( ĝ_s + β m_s + λ_d w_s ))
//! ```
//!
//! | optimizer                      | β      | γ_0     | γ_s (s ≥ 1) | κ_s                  | D_s (diagonal)                          |
//! |--------------------------------|--------|---------|-------------|----------------------|-----------------------------------------|
//! | GD / SGD                       | 0      | 1       | 1           | 1                    | 1                                       |
//! | momentum μ, dampening τ        | μ      | 1       | 1 − τ       | 1                    | 1                                       |
//! | Nesterov momentum μ            | μ      | 1       | 1           | (the Nesterov form)  | 1                                       |
//! | Adam / AdamW (β1, β2)          | β1     | 1 − β1  | 1 − β1      | 1 / (1 − β1^{s+1})   | 1 / (√(v_s / (1 − β2^{s+1})) + eps)     |
//! | RMSprop (α; no momentum)       | 0      | 1       | 1           | 1                    | 1 / (√(v_s − ḡ_s²) + eps), ḡ if centred |
//! | Adagrad (lr decay δ)           | 0      | 1       | 1           | 1 / (1 + s δ)        | 1 / (√(v_0 + Σ_{r≤s} ĝ_r²) + eps)       |
//!
//! A scheduler may change the momentum (β1) from step to step, and gradient clipping by norm
//! multiplies the data gradient by a factor `c_s`: both recorded per step ([`StepFactors`]),
//! `β` and `γ` then read `β_s` and `γ_s`, and `g_s` reads `c_s g_s`.
//!
//! with `v_s = β2 v_{s−1} + (1 − β2) ĝ_s²` for Adam. Weight decay is *coupled*
//! (`λ_c`, an L2 term added to the gradient: PyTorch's `weight_decay` of SGD and Adam) or
//! *decoupled* (`λ_d`, applied to the weights directly: SGDW and AdamW, PyTorch's AdamW
//! convention `w ← w − ε_s λ_d w`). Momentum follows PyTorch's SGD exactly: the first buffer is
//! the first gradient (`γ_0 = 1` whatever the dampening), later gradients enter it scaled by
//! `1 − τ`, and Nesterov steps by `ĝ_s + μ m_s` (PyTorch requires τ = 0 with Nesterov).
//!
//! # The exact per-point decomposition
//!
//! Unrolling the recursion, the step's weight change is a sum of per-point terms and one
//! non-data term:
//!
//! ```text
//! Δw_s = Σ_i u_{i,s} + r_s
//! u_{i,s} = −ε_s κ_s D_s ⊙ Σ_{r≤s} γ_r β^{s−r} [i∈B_r] ∇ℓ_i(w_r) / |B_r|
//! r_s     = −ε_s ( κ_s D_s ⊙ Σ_{r≤s} γ_r β^{s−r} λ_c w_r + λ_d w_s )
//! ```
//!
//! (Nesterov adds the step's own term once more: `u_{i,s}` gains `−ε_s [i∈B_s] ∇ℓ_i(w_s) / |B_s|`
//! on top of `β` times the buffer's, and `r_s` gains `−ε_s λ_c w_s`.)
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
//! a_{i,r}    = −ε_r c_r ∂L_r/∂f(x_i)                   (as for gradient descent; c_r the clip factor)
//! K_r(x, x') = ⟨ F_r(x), ∇f(x'; w_r) ⟩,  F_r(x) = Σ_{s≥r} (ε_s/ε_r) γ β^{s−r} κ_s D_s ⊙ J̄_s(x)
//! R(x)       = −Σ_r λ_c ε_r ⟨F_r(x), w_r⟩ − Σ_s λ_d ε_s ⟨J̄_s(x), w_s⟩
//! ```
//!
//! A step of learning rate 0 moves no weight but its gradient still enters the buffer (Adam's
//! moments): its coefficients are taken with `ε_r` replaced by 1 (`a_{i,r} = −c_r ∂L_r/∂f`,
//! `K_r = ⟨ε_r F_r, ∇f⟩`), the same product `a·K`.
//!
//! `F_r` is `γ_r H_r / ε_r` with `H_r = ε_r κ_r D_r ⊙ J̄_r + β H_{r+1}` (Nesterov:
//! `ε_r F_r = ε_r J̄_r + β γ_r H_r`, [`UpdateRule::row_coefficients`]), so the kernel engine walks
//! the path once backwards, carrying `H_r` for every row point.
//! For GD/SGD `F_r = J̄_r` and `K_r` is the EPK of Definition 3.4. With momentum the row side
//! carries future steps, and with Adam it is preconditioned by a `D_s` that changes from step to
//! step: `K_r` is then a valid kernel *machine* (it reproduces the network exactly) but not a
//! symmetric kernel `⟨φ(x), φ(x')⟩` of one feature map, and the output says so
//! ([`crate::kernel::KernelForm`]).

use std::sync::Arc;

use serde::Serialize;

use crate::trajectory::OptimizerRecord;

pub use crate::trajectory::StepFactors;

/// A diagonal preconditioner `κ_s D_s` computed from the gradients' history (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Preconditioner {
    /// Adam's: `κ_s = 1 / (1 − β1^{s+1})`, `D_s = 1 / (√(v_s / (1 − β2^{s+1})) + eps)`.
    Adam {
        /// β2.
        beta2: f64,
        /// eps added to `√v̂`.
        eps: f64,
    },
    /// RMSprop's (no momentum): `D_s = 1 / (√(v_s − [centered] ḡ_s²) + eps)` with
    /// `v_s = α v_{s−1} + (1 − α) ĝ_s²`, `ḡ_s = α ḡ_{s−1} + (1 − α) ĝ_s`.
    Rmsprop {
        /// α.
        alpha: f64,
        /// eps.
        eps: f64,
        /// Divide by the centred second moment.
        centered: bool,
    },
    /// Adagrad's: `D_s = 1 / ((1 + s·lr_decay)(√(v_0 + Σ_{r≤s} ĝ_r²) + eps))`.
    Adagrad {
        /// The learning rate's decay per step.
        lr_decay: f64,
        /// eps.
        eps: f64,
        /// `v_0`: PyTorch's `initial_accumulator_value`.
        initial: f64,
    },
}

/// The recursion's constants (module docs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UpdateRule {
    /// Buffer decay β (with per-step momenta: their largest, so that it is 0 exactly when no
    /// step carries a buffer).
    pub beta: f64,
    /// Buffer input scale γ_s of the steps s ≥ 1.
    pub gamma: f64,
    /// Buffer input scale γ_0 of the first step (1 for PyTorch's SGD momentum, whose first
    /// buffer is the first gradient whatever the dampening).
    pub gamma_first: f64,
    /// Nesterov momentum: `Δw_s = −ε_s (ĝ_s + β m_s + λ_d w_s)`.
    pub nesterov: bool,
    /// The diagonal preconditioner (Adam's, RMSprop's, Adagrad's), if any; its `κ_s D_s` of
    /// every step is recorded beside the states.
    pub adam: Option<Preconditioner>,
    /// Coupled (L2) weight decay λ_c.
    pub wd_coupled: f64,
    /// Decoupled weight decay λ_d.
    pub wd_decoupled: f64,
    /// The recorded updates are rounded (an imported float32 run): never plain, so kernels
    /// replay the optimizer and carry the difference as a residual term.
    pub rounded: bool,
    /// Per-step momenta and clip factors ([`StepFactors`]), when recorded.
    #[serde(skip)]
    pub per_step: Option<Arc<StepFactors>>,
    /// Adam: the bias correction κ_s uses the step's β1 (`Some`), else κ_s = 1.
    adam_bias_correction: bool,
}

impl UpdateRule {
    /// The rule of a recorded optimizer.
    pub fn of(rec: &OptimizerRecord) -> Self {
        let split = |wd: f64, decoupled: bool| if decoupled { (0.0, wd) } else { (wd, 0.0) };
        let per_step = |f: &StepFactors| if f.is_empty() { None } else { Some(Arc::new(f.clone())) };
        let most = |beta: f64, f: &StepFactors| f.momenta.as_ref().map_or(beta, |m| m.iter().copied().fold(0.0, f64::max));
        let base = UpdateRule {
            beta: 0.0,
            gamma: 1.0,
            gamma_first: 1.0,
            nesterov: false,
            adam: None,
            wd_coupled: 0.0,
            wd_decoupled: 0.0,
            rounded: false,
            per_step: None,
            adam_bias_correction: false,
        };
        match rec {
            OptimizerRecord::Gd { momentum, dampening, nesterov, weight_decay, decoupled_weight_decay, rounded_updates, per_step: f, .. }
            | OptimizerRecord::Sgd { momentum, dampening, nesterov, weight_decay, decoupled_weight_decay, rounded_updates, per_step: f, .. } => {
                let (wd_coupled, wd_decoupled) = split(*weight_decay, *decoupled_weight_decay);
                let beta = most(*momentum, f);
                // PyTorch ignores dampening and Nesterov without momentum.
                let (gamma, nesterov) = if beta == 0.0 { (1.0, false) } else { (1.0 - dampening, *nesterov) };
                UpdateRule { beta, gamma, nesterov, wd_coupled, wd_decoupled, rounded: *rounded_updates, per_step: per_step(f), ..base }
            }
            OptimizerRecord::Adam { beta1, beta2, eps, weight_decay, decoupled_weight_decay, per_step: f, .. } => {
                let (wd_coupled, wd_decoupled) = split(*weight_decay, *decoupled_weight_decay);
                let adam = Some(Preconditioner::Adam { beta2: *beta2, eps: *eps });
                let beta = most(*beta1, f);
                UpdateRule { beta, gamma: 1.0 - beta1, gamma_first: 1.0 - beta1, adam, wd_coupled, wd_decoupled, per_step: per_step(f), adam_bias_correction: true, ..base }
            }
            OptimizerRecord::Rmsprop { alpha, eps, centered, weight_decay, per_step: f, .. } => {
                let adam = Some(Preconditioner::Rmsprop { alpha: *alpha, eps: *eps, centered: *centered });
                UpdateRule { adam, wd_coupled: *weight_decay, per_step: per_step(f), ..base }
            }
            OptimizerRecord::Adagrad { lr_decay, eps, initial_accumulator_value, weight_decay, per_step: f, .. } => {
                let adam = Some(Preconditioner::Adagrad { lr_decay: *lr_decay, eps: *eps, initial: *initial_accumulator_value });
                UpdateRule { adam, wd_coupled: *weight_decay, per_step: per_step(f), ..base }
            }
        }
    }

    /// Plain gradient steps: `Δw_s = −ε_s g_s` (GD or SGD without momentum, weight decay or
    /// clipping), recorded exactly (not [`Self::rounded`]).
    pub(crate) fn is_plain(&self) -> bool {
        !self.rounded && self.beta == 0.0 && !self.nesterov && self.adam.is_none() && self.wd_coupled == 0.0 && self.wd_decoupled == 0.0 && self.per_step.is_none()
    }

    /// β_s: how much of the buffer step s keeps (the recorded momentum of step s, or β).
    pub fn beta_at(&self, s: usize) -> f64 {
        match self.per_step.as_ref().and_then(|f| f.momenta.as_ref()) {
            Some(m) => m.get(s).copied().unwrap_or(0.0),
            None => self.beta,
        }
    }

    /// γ_s: how step s's gradient enters the buffer.
    pub fn gamma_at(&self, s: usize) -> f64 {
        if self.adam_bias_correction && self.per_step.as_ref().is_some_and(|f| f.momenta.is_some()) {
            return 1.0 - self.beta_at(s);
        }
        if s == 0 {
            self.gamma_first
        } else {
            self.gamma
        }
    }

    /// `c_s`: the factor gradient clipping by norm multiplied step s's data gradient by (1 without).
    pub fn grad_scale_at(&self, s: usize) -> f64 {
        self.per_step.as_ref().and_then(|f| f.grad_scales.as_ref()).and_then(|c| c.get(s).copied()).unwrap_or(1.0)
    }

    /// `(a, b)` with `ε_r F_r = a·ε_r κ_r D_r ⊙ J̄_r + b·H_r` and `H_r = ε_r κ_r D_r ⊙ J̄_r + β_{r+1} H_{r+1}`
    /// (module docs): `(0, γ_r)` for gradient steps, heavy-ball momentum and Adam, `(1, β γ_r)`
    /// for Nesterov (constant β: per-step momenta with Nesterov are refused on import).
    pub fn row_coefficients(&self, r: usize) -> (f64, f64) {
        if self.nesterov {
            (1.0, self.beta * self.gamma_at(r))
        } else {
            (0.0, self.gamma_at(r))
        }
    }

    /// Whether the per-step kernel is still the symmetric path kernel `⟨J̄_s(x), ∇f(x'; w_s)⟩`
    /// (no momentum, no preconditioner; weight decay only adds the non-data term).
    pub fn symmetric_kernel(&self) -> bool {
        self.beta == 0.0 && self.adam.is_none()
    }
}

/// The optimizer's state along a training run: the buffer `m` and the preconditioner's `v`
/// (RMSprop centred: also `ḡ`).
#[derive(Clone, Debug)]
pub(crate) struct OptimizerState {
    rule: UpdateRule,
    m: Vec<f64>,
    v: Vec<f64>,
    mean: Vec<f64>,
    steps: usize,
    /// `κ_s D_s` of the last step (empty unless preconditioned).
    scale: Vec<f64>,
}

impl OptimizerState {
    /// A fresh state for W parameters.
    pub(crate) fn new(rule: UpdateRule, w: usize) -> Self {
        let v = match rule.adam {
            Some(Preconditioner::Adagrad { initial, .. }) => vec![initial; w],
            Some(_) => vec![0.0; w],
            None => Vec::new(),
        };
        let mean = if matches!(rule.adam, Some(Preconditioner::Rmsprop { centered: true, .. })) { vec![0.0; w] } else { Vec::new() };
        OptimizerState { rule, m: vec![0.0; w], v, mean, steps: 0, scale: Vec::new() }
    }

    /// Advances by one step and returns `Δw_s`.
    ///
    /// # Shapes
    /// `w` (the weights `w_s`) and `g` (the data gradient `g_s`, before any clipping) are `[W]`,
    /// flat in parameter order; returns `[W]`.
    pub(crate) fn step(&mut self, lr: f64, w: &[f64], g: &[f64]) -> Vec<f64> {
        self.step_with(lr, w, g, None)
    }

    /// [`Self::step`], with the preconditioner's `κ_s D_s` taken from `recorded` (`[W]`) instead
    /// of the second moments, when given: how a kernel replays exactly the update that was made.
    pub(crate) fn step_with(&mut self, lr: f64, w: &[f64], g: &[f64], recorded: Option<&[f64]>) -> Vec<f64> {
        let r = &self.rule;
        let s = self.steps;
        self.steps += 1;
        if r.beta == 0.0 && r.adam.is_none() && r.wd_coupled == 0.0 && r.wd_decoupled == 0.0 && r.per_step.is_none() {
            return g.iter().map(|gi| -(lr * gi)).collect();
        }
        let (beta, gamma, c) = (r.beta_at(s), r.gamma_at(s), r.grad_scale_at(s));
        let ghat: Vec<f64> = g.iter().zip(w).map(|(gi, wi)| c * gi + r.wd_coupled * wi).collect();
        for (m, ge) in self.m.iter_mut().zip(&ghat) {
            *m = beta * *m + gamma * ge;
        }
        let Some(pre) = r.adam else {
            if r.nesterov {
                return self.m.iter().zip(&ghat).zip(w).map(|((m, ge), wi)| -lr * (ge + beta * m + r.wd_decoupled * wi)).collect();
            }
            return self.m.iter().zip(w).map(|(m, wi)| -lr * (m + r.wd_decoupled * wi)).collect();
        };
        self.scale.clear();
        match pre {
            Preconditioner::Adam { beta2, eps } => {
                let bc1 = 1.0 - beta.powi(s as i32 + 1);
                let bc2 = 1.0 - beta2.powi(s as i32 + 1);
                for (v, ge) in self.v.iter_mut().zip(&ghat) {
                    *v = beta2 * *v + (1.0 - beta2) * ge * ge;
                    self.scale.push(1.0 / (bc1 * ((*v / bc2).sqrt() + eps)));
                }
            }
            Preconditioner::Rmsprop { alpha, eps, centered } => {
                for (j, (v, ge)) in self.v.iter_mut().zip(&ghat).enumerate() {
                    *v = alpha * *v + (1.0 - alpha) * ge * ge;
                    let var = if centered {
                        let mean = &mut self.mean[j];
                        *mean = alpha * *mean + (1.0 - alpha) * ge;
                        *v - *mean * *mean
                    } else {
                        *v
                    };
                    self.scale.push(1.0 / (var.sqrt() + eps));
                }
            }
            Preconditioner::Adagrad { lr_decay, eps, .. } => {
                let decay = 1.0 + s as f64 * lr_decay;
                for (v, ge) in self.v.iter_mut().zip(&ghat) {
                    *v += ge * ge;
                    self.scale.push(1.0 / (decay * (v.sqrt() + eps)));
                }
            }
        }
        if let Some(rec) = recorded {
            self.scale.copy_from_slice(rec);
        }
        self.m.iter().zip(&self.scale).zip(w).map(|((m, c), wi)| -lr * (c * m + r.wd_decoupled * wi)).collect()
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
        let r = rule(OptimizerRecord::Gd { lr: 0.3, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0, decoupled_weight_decay: false, rounded_updates: false, per_step: StepFactors::default() });
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
        let r = rule(OptimizerRecord::Gd { lr: 0.1, momentum: 0.9, dampening: 0.0, nesterov: false, weight_decay: 0.01, decoupled_weight_decay: false, rounded_updates: false, per_step: StepFactors::default() });
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
            recorded_batches: None,
            per_step: StepFactors::default(),
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

    /// PyTorch's `_single_tensor_sgd`, written out: `d = g + λ w`; the first buffer is `d`,
    /// later ones `μ b + (1 − τ) d`; the step is `b`, or `d + μ b` with Nesterov.
    fn torch_sgd(w: &mut f64, b: &mut Option<f64>, g: f64, lr: f64, (mu, tau, nesterov, wd): (f64, f64, bool, f64)) {
        let d = g + wd * *w;
        let buf = match *b {
            None => d,
            Some(b0) => mu * b0 + (1.0 - tau) * d,
        };
        *b = Some(buf);
        let step = if nesterov { d + mu * buf } else { buf };
        *w -= lr * step;
    }

    #[test]
    fn dampened_and_nesterov_momentum_match_pytorch_sgd() {
        for (mu, tau, nesterov, wd) in [(0.9, 0.3, false, 0.01), (0.8, 0.0, true, 0.0), (0.9, 0.0, true, 0.05), (0.5, 1.0, false, 0.0)] {
            let rec = OptimizerRecord::Sgd {
                lr: 0.1,
                batch_size: 1,
                shuffle_seed: 0,
                momentum: mu,
                dampening: tau,
                nesterov,
                weight_decay: wd,
                decoupled_weight_decay: false,
                rounded_updates: false,
                recorded_batches: None,
                per_step: StepFactors::default(),
            };
            let r = rule(rec);
            assert!(!r.is_plain() && !r.symmetric_kernel());
            let mut st = OptimizerState::new(r, 1);
            let (mut w, mut b, mut w_ref) = (1.0f64, None, 1.0f64);
            for (t, g) in [0.5, -0.2, 0.3, 0.7].into_iter().enumerate() {
                let lr = 0.1 / (1.0 + t as f64);
                let d = st.step(lr, &[w], &[g]);
                torch_sgd(&mut w_ref, &mut b, g, lr, (mu, tau, nesterov, wd));
                w += d[0];
                assert!((w - w_ref).abs() < 1e-15, "{mu} {tau} {nesterov}: {w} vs {w_ref}");
            }
        }
    }

    /// The per-point split of `row_coefficients` unrolled by hand: the coefficient of step r's
    /// gradient in `Σ_s Δw_s` equals `a ε_r + b Σ_{s≥r} ε_s β^{s−r}` (one parameter, D = 1).
    #[test]
    fn row_coefficients_unroll_the_recursion() {
        for (mu, tau, nesterov) in [(0.9, 0.3, false), (0.7, 0.0, true), (0.0, 0.0, false)] {
            let rec = OptimizerRecord::Gd { lr: 0.1, momentum: mu, dampening: tau, nesterov, weight_decay: 0.0, decoupled_weight_decay: false, rounded_updates: false, per_step: StepFactors::default() };
            let r = rule(rec);
            let lrs = [0.3, 0.2, 0.25, 0.1];
            let n = lrs.len();
            for src in 0..n {
                // Total weight change from a unit gradient at step `src` only (linearity).
                let mut st = OptimizerState::new(r.clone(), 1);
                let mut total = 0.0;
                for (s, &lr) in lrs.iter().enumerate() {
                    total += st.step(lr, &[0.0], &[if s == src { 1.0 } else { 0.0 }])[0];
                }
                let (a, b) = r.row_coefficients(src);
                let h: f64 = (src..n).map(|s| lrs[s] * mu.powi((s - src) as i32)).sum();
                let want = -(a * lrs[src] + b * h);
                assert!((total - want).abs() < 1e-15, "{mu} {tau} {nesterov} step {src}: {total} vs {want}");
            }
        }
    }
    /// Per-step momenta (a scheduler cycling β1 / SGD's momentum) and clip factors, against
    /// PyTorch's formulas written out: Adam's bias correction uses the step's own β1.
    #[test]
    fn per_step_momenta_and_clip_factors_match_pytorch() {
        let momenta = vec![0.95, 0.9, 0.85, 0.9];
        let clips = vec![1.0, 0.5, 0.25, 1.0];
        let per_step = StepFactors { momenta: Some(momenta.clone()), grad_scales: Some(clips.clone()) };
        let r = rule(OptimizerRecord::Adam {
            lr: 0.01,
            beta1: 0.95,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.1,
            decoupled_weight_decay: false,
            batch_size: None,
            shuffle_seed: 0,
            recorded_batches: None,
            per_step: per_step.clone(),
        });
        assert!(!r.is_plain());
        let mut st = OptimizerState::new(r, 1);
        let (mut w, mut m, mut v) = (1.0f64, 0.0f64, 0.0f64);
        for (t, g) in [0.5, -0.2, 0.3, 1e-3].into_iter().enumerate() {
            let d = st.step(0.01, &[w], &[g]);
            let (b1, c) = (momenta[t], clips[t]);
            let ge = c * g + 0.1 * w;
            m = b1 * m + (1.0 - b1) * ge;
            v = 0.99 * v + 0.01 * ge * ge;
            let w_ref = w - 0.01 * (m / (1.0 - b1.powi(t as i32 + 1))) / ((v / (1.0 - 0.99f64.powi(t as i32 + 1))).sqrt() + 1e-8);
            w += d[0];
            assert!((w - w_ref).abs() < 1e-15, "step {t}: {w} vs {w_ref}");
        }
        // SGD: momentum μ_s, dampening τ.
        let rec = OptimizerRecord::Gd { lr: 0.1, momentum: 0.95, dampening: 0.2, nesterov: false, weight_decay: 0.0, decoupled_weight_decay: false, rounded_updates: false, per_step };
        let mut st = OptimizerState::new(rule(rec), 1);
        let (mut w, mut b) = (1.0f64, 0.0f64);
        for (t, g) in [0.5, -0.2, 0.3, 0.7].into_iter().enumerate() {
            let d = st.step(0.1, &[w], &[g]);
            let gc = clips[t] * g;
            b = if t == 0 { gc } else { momenta[t] * b + 0.8 * gc };
            let w_ref = w - 0.1 * b;
            w += d[0];
            assert!((w - w_ref).abs() < 1e-15, "sgd step {t}: {w} vs {w_ref}");
        }
    }

    /// RMSprop (centred or not) and Adagrad (lr decay, initial accumulator, weight decay), as
    /// `torch.optim`'s single-tensor code computes them.
    #[test]
    fn rmsprop_and_adagrad_match_pytorch() {
        for centered in [false, true] {
            let rec = OptimizerRecord::Rmsprop { lr: 0.01, alpha: 0.9, eps: 1e-8, centered, weight_decay: 0.01, batch_size: None, recorded_batches: None, per_step: StepFactors::default() };
            let mut st = OptimizerState::new(rule(rec), 1);
            let (mut w, mut v, mut ga) = (1.0f64, 0.0f64, 0.0f64);
            for g in [0.5, -0.2, 0.3, 1e-3] {
                let d = st.step(0.01, &[w], &[g]);
                let ge = g + 0.01 * w;
                v = 0.9 * v + 0.1 * ge * ge;
                ga = 0.9 * ga + 0.1 * ge;
                let avg = if centered { (v - ga * ga).sqrt() } else { v.sqrt() } + 1e-8;
                let w_ref = w - 0.01 * ge / avg;
                w += d[0];
                assert!((w - w_ref).abs() < 1e-15, "centered {centered}: {w} vs {w_ref}");
            }
        }
        let rec = OptimizerRecord::Adagrad { lr: 0.1, lr_decay: 0.05, eps: 1e-10, initial_accumulator_value: 0.3, weight_decay: 0.01, batch_size: None, recorded_batches: None, per_step: StepFactors::default() };
        let mut st = OptimizerState::new(rule(rec), 1);
        let (mut w, mut sum) = (1.0f64, 0.3f64);
        for (t, g) in [0.5, -0.2, 0.3, 1e-3].into_iter().enumerate() {
            let d = st.step(0.1, &[w], &[g]);
            let ge = g + 0.01 * w;
            sum += ge * ge;
            let clr = 0.1 / (1.0 + t as f64 * 0.05);
            let w_ref = w - clr * ge / (sum.sqrt() + 1e-10);
            w += d[0];
            assert!((w - w_ref).abs() < 1e-15, "adagrad step {t}: {w} vs {w_ref}");
        }
        assert!(st.last_scale().is_some());
    }
}
