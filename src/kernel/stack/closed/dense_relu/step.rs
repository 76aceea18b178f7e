//! Batched evaluation of an MLP along one training step, in the structured form the Gram needs.
//!
//! For step s the weights are `w_s(t) = w_s + t·Δw`, `Δw = w_{s+1} − w_s`. A batch of rows
//! `(x_r, t_r)` is pushed through the network with large GEMMs (faer): per layer the input
//! activations `a_l` and the back-propagated output sensitivities `δ_l[k] = ∂f^k/∂z_l` for
//! every output k. For a dense layer `∇_{W_l} f^k = δ_l[k] a_lᵀ` and `∇_{b_l} f^k = δ_l[k]`, so
//! inner products of gradients never need a Jacobian: `⟨∇f^k(x), ∇f^k'(x')⟩ =
//! Σ_l (δ_l[k]·δ'_l[k'])(a_l·a'_l + 1)`.
//!
//! Also: layer 0 of a step at a set of points (`z + t·u`, whose zeros are a one-hidden-layer ReLU
//! network's kinks along `t`: [`relu_cuts`]). Used by the closed form ([`super::pieces`]) and as
//! its tests' slow obvious path.

use crate::linalg::{gemm_ab, gemm_abt};
use crate::error::Result;
use crate::kernel::stack::closed::shape::{tensors, DenseRelu};
use crate::model::{Activation, OutputKind, Params};

/// The kinks in `(a, b)` of one hidden ReLU layer whose pre-activations are `z + t·u`: the
/// times `−z/u`, sorted, within 1e-15 of each other merged.
pub(crate) fn relu_cuts(z: &[f64], u: &[f64], a: f64, b: f64) -> Vec<f64> {
    let mut cuts: Vec<f64> = z.iter().zip(u).filter(|(&zv, &uv)| uv.abs() > 1e-15 * zv.abs().max(uv.abs())).map(|(&zv, &uv)| -zv / uv).filter(|&t| t > a && t < b).collect();
    cuts.sort_by(f64::total_cmp);
    cuts.dedup_by(|u, v| (*u - *v).abs() <= 1e-15);
    cuts
}

/// One dense layer at `w_s` with its step direction.
#[derive(Clone, Debug)]
pub(crate) struct Layer {
    /// Input width.
    pub n_in: usize,
    /// Output width.
    pub n_out: usize,
    /// `W_s` `[out, in]`.
    pub w: Vec<f64>,
    /// `ΔW` `[out, in]`.
    pub dw: Vec<f64>,
    /// `b_s` `[out]` (zeros without bias).
    pub b: Vec<f64>,
    /// `Δb` `[out]`.
    pub db: Vec<f64>,
}

/// An MLP on one step `w_s(t) = w_s + tΔw`.
#[derive(Clone, Debug)]
pub(crate) struct MlpStep {
    /// Layers in order.
    pub layers: Vec<Layer>,
    /// Whether the biases are parameters (they enter the Gram only then).
    pub bias: bool,
    /// Output scale α.
    pub alpha: f64,
    /// Output map.
    pub output: OutputKind,
    /// Outputs K.
    pub k: usize,
}

/// Layer 0 of a step at a set of points ([`MlpStep::first_layer`]): `z = W_s x + b_s` and
/// `u = ΔW x + Δb`, `[P, out_0]` each.
#[derive(Clone, Debug)]
pub(crate) struct FirstLayer {
    /// `W_s x + b_s` `[P, out_0]`.
    pub z: Vec<f64>,
    /// `ΔW x + Δb` `[P, out_0]`.
    pub u: Vec<f64>,
    /// out_0.
    pub h: usize,
}

/// Per-row results of [`MlpStep::eval`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Evals {
    /// Per layer l: input activations `[R, in_l]` (layer 0: the inputs).
    pub acts: Vec<Vec<f64>>,
    /// Per layer l: `δ_l` `[R, K, out_l]` (empty when gradients were not requested).
    pub deltas: Vec<Vec<f64>>,
    /// Network outputs f `[R, K]`.
    pub f: Vec<f64>,
}

impl MlpStep {
    /// Builds the step of the stack `shape` from `w_s` and `w_{s+1}` (`None`: a zero step, for
    /// the training side at `w_s`), its tensors read by position.
    ///
    /// # Errors
    /// [`crate::error::Error::Data`] if a state's tensors do not have the shape's sizes.
    pub(crate) fn new(shape: &DenseRelu, ws: &Params, next: Option<&Params>) -> Result<Self> {
        let widths = [shape.d, shape.h, shape.k];
        let lens: Vec<usize> = widths.windows(2).flat_map(|w| if shape.bias { vec![w[0] * w[1], w[1]] } else { vec![w[0] * w[1]] }).collect();
        let ts = tensors(ws, &lens)?;
        let tn = next.map(|n| tensors(n, &lens)).transpose()?;
        let mut layers = Vec::with_capacity(2);
        let mut j = 0;
        // `w_{s+1} − w_s` of tensor j (zeros without a next state).
        let delta = |j: usize| match tn {
            Some(n) => n[j].iter().zip(&ts[j]).map(|(a, b)| a - b).collect(),
            None => vec![0.0; ts[j].len()],
        };
        for l in 0..2 {
            let (n_in, n_out) = (widths[l], widths[l + 1]);
            let (w, dw) = (ts[j].clone(), delta(j));
            j += 1;
            let (b, db) = if shape.bias {
                j += 1;
                (ts[j - 1].clone(), delta(j - 1))
            } else {
                (vec![0.0; n_out], vec![0.0; n_out])
            };
            layers.push(Layer { n_in, n_out, w, dw, b, db });
        }
        Ok(MlpStep { layers, bias: shape.bias, alpha: shape.alpha, output: shape.output, k: shape.k })
    }

    /// Input dimension d.
    pub(crate) fn input_dim(&self) -> usize {
        self.layers[0].n_in
    }

    /// Layer 0 of this step at the points `x` (`[P, d]`): along the step its pre-activation is
    /// `z + t·u` for every t, so evaluations at any node skip the input-sized GEMM.
    pub(crate) fn first_layer(&self, x: &[f64]) -> FirstLayer {
        let l0 = &self.layers[0];
        let (ni, no) = (l0.n_in, l0.n_out);
        let p = x.len() / ni;
        let mut z = vec![0.0; p * no];
        let mut u = vec![0.0; p * no];
        gemm_abt(&mut z, x, &l0.w, p, no, ni, 1.0, false);
        gemm_abt(&mut u, x, &l0.dw, p, no, ni, 1.0, false);
        for (zr, ur) in z.chunks_exact_mut(no).zip(u.chunks_exact_mut(no)) {
            zr.iter_mut().zip(&l0.b).for_each(|(a, b)| *a += b);
            ur.iter_mut().zip(&l0.db).for_each(|(a, b)| *a += b);
        }
        FirstLayer { z, u, h: no }
    }

    /// Evaluates rows `x` (`[R, d]`) at times `t` (`[R]`), subtracting `offset` (`[R, K]`,
    /// the frozen initial network for `zero_output`) before scaling. With `grads`, also the
    /// sensitivities δ.
    pub(crate) fn eval(&self, x: &[f64], t: &[f64], offset: Option<&[f64]>, grads: bool) -> Evals {
        self.eval_down_to(x, t, offset, grads, 0)
    }

    /// [`Self::eval`] at `w_s` with the sensitivities of the last layer only (the layers below
    /// keep empty ones): what the closed form's whole step on a device needs of the training
    /// side ([`super::device`]).
    pub(crate) fn eval_head(&self, x: &[f64], offset: Option<&[f64]>) -> Evals {
        let r = x.len() / self.input_dim();
        self.eval_down_to(x, &vec![0.0; r], offset, true, self.layers.len() - 1)
    }

    /// [`Self::eval`] with the sensitivities of layers `lowest..` only.
    fn eval_down_to(&self, x: &[f64], t: &[f64], offset: Option<&[f64]>, grads: bool, lowest: usize) -> Evals {
        debug_assert_eq!(x.len(), t.len() * self.input_dim());

        let r = t.len();
        let k = self.k;
        let nl = self.layers.len();
        let moving = t.iter().any(|&v| v != 0.0);
        let mut acts: Vec<Vec<f64>> = Vec::with_capacity(nl);
        let mut pre: Vec<Vec<f64>> = Vec::with_capacity(nl);
        let mut a = x.to_vec();
        for (l, layer) in self.layers.iter().enumerate() {
            let (ni, no) = (layer.n_in, layer.n_out);
            let mut z = vec![0.0; r * no];
            gemm_abt(&mut z, &a, &layer.w, r, no, ni, 1.0, false);
            let mut u = vec![0.0; if moving { r * no } else { 0 }];
            if moving {
                gemm_abt(&mut u, &a, &layer.dw, r, no, ni, 1.0, false);
            }
            for row in 0..r {
                for o in 0..no {
                    let idx = row * no + o;
                    if moving {
                        u[idx] += layer.db[o];
                        z[idx] += layer.b[o] + t[row] * u[idx];
                    } else {
                        z[idx] += layer.b[o];
                    }
                }
            }
            let next: Vec<f64> = if l + 1 < nl { z.iter().map(|&v| Activation::Relu.apply(v)).collect() } else { Vec::new() };
            acts.push(std::mem::replace(&mut a, next));
            pre.push(z);
        }
        // Output map.
        let mut f = self.scaled_output(pre.last().expect("at least one layer"), offset);
        let mut soft = vec![0.0; r * k];
        if self.output == OutputKind::LogSoftmax {
            crate::model::log_softmax_rows(&mut f, k);
            for (s, v) in soft.iter_mut().zip(&f) {
                *s = v.exp();
            }
        }
        if !grads {
            return Evals { acts, deltas: Vec::new(), f };
        }
        // Backward for all K outputs at once: rows (r, k).
        let mut deltas: Vec<Vec<f64>> = vec![Vec::new(); nl];
        let mut d = vec![0.0; r * k * k];
        for row in 0..r {
            for kk in 0..k {
                for o in 0..k {
                    let e = if kk == o { 1.0 } else { 0.0 };
                    let v = match self.output {
                        OutputKind::LogSoftmax => e - soft[row * k + o],
                        OutputKind::Identity => e,
                    };
                    d[(row * k + kk) * k + o] = self.alpha * v;
                }
            }
        }
        for l in (lowest..nl).rev() {
            let layer = &self.layers[l];
            if l == lowest {
                deltas[l] = std::mem::take(&mut d);
            } else {
                let (ni, no) = (layer.n_in, layer.n_out);
                let mut prev = vec![0.0; r * k * ni];
                gemm_ab(&mut prev, &d, &layer.w, r * k, ni, no, 1.0, false);
                if moving {
                    let mut extra = vec![0.0; r * k * ni];
                    gemm_ab(&mut extra, &d, &layer.dw, r * k, ni, no, 1.0, false);
                    for row in 0..r {
                        let tr = t[row];
                        if tr != 0.0 {
                            for idx in row * k * ni..(row + 1) * k * ni {
                                prev[idx] += tr * extra[idx];
                            }
                        }
                    }
                }
                let zprev = &pre[l - 1];
                for row in 0..r {
                    for kk in 0..k {
                        for i in 0..ni {
                            prev[(row * k + kk) * ni + i] *= Activation::Relu.derivative(zprev[row * ni + i]);
                        }
                    }
                }
                deltas[l] = std::mem::replace(&mut d, prev);
            }
        }
        Evals { acts, deltas, f }
    }

    /// `α (z − offset)` for the last layer's pre-activations `z` (`[R, K]`), before the output map.
    fn scaled_output(&self, z: &[f64], offset: Option<&[f64]>) -> Vec<f64> {
        match offset {
            Some(off) => z.iter().zip(off).map(|(v, o)| self.alpha * (v - o)).collect(),
            None => z.iter().map(|v| self.alpha * v).collect(),
        }
    }
}
