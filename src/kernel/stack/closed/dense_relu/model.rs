//! The step model of `[flatten,] dense → relu → dense` in closed form under the auto rule
//! ([`super::pieces`]: its rows integrated exactly between their kinks, no gradient at a node),
//! with the training side's structured factors (`δ ⊗ a` per layer).

use rayon::prelude::*;

use crate::error::Result;
use crate::kernel::gram::{self, GramAccumulator, LayerFactors};
use crate::kernel::stack::closed::dense_relu::device::{RowsOnDevice, DEVICE_CHUNK_POINTS};
use crate::kernel::stack::closed::dense_relu::pieces::{self as mlp_pieces, dot};
use crate::kernel::stack::closed::dense_relu::step::MlpStep;
use crate::kernel::step_model::{StepInput, StepModel, StepOutput};
use crate::kernel::types::NodeStats;
use crate::kernel::stack::closed::shape::DenseRelu;
use crate::model::OutputKind;

/// Row points integrated at once on the [`mlp_pieces`] path (their factors are `K·h + (K+1)·(h+1)`
/// numbers each).
const INTEGRATED_CHUNK_POINTS: usize = 256;

#[cfg(test)]
thread_local! {
    /// Steps this thread ran whole on a device ([`RowsOnDevice::step`]).
    pub(crate) static WHOLE_STEPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The closed form of a `dense → relu → dense` stack.
pub(crate) struct DenseReluModel<'a> {
    pub shape: &'a DenseRelu,
    /// Where the rows are integrated: a device ([`super::device`]), else here.
    pub device: Option<std::sync::Arc<dyn RowsOnDevice>>,
}

impl DenseReluModel<'_> {
    /// The rows' factors of the points `x` on the model's device, else here.
    /// Adds its wall seconds to `seconds` (the split `bench --contraction` reports).
    fn row_factors(&self, step: &MlpStep, x: &[f64], off: Option<&[f64]>, tol: f64, cosine: bool, seconds: &mut f64) -> Result<mlp_pieces::RowFactors> {
        let started = std::time::Instant::now();
        let first = step.first_layer(x);
        let rf = match &self.device {
            Some(dev) => dev.row_factors(step, &first, x, off, tol, cosine)?,
            None => mlp_pieces::row_factors(step, &first, x, off, tol, cosine),
        };
        *seconds += started.elapsed().as_secs_f64();
        Ok(rf)
    }
}

impl StepModel for DenseReluModel<'_> {
    fn add_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<StepOutput> {
        let (shape, rows) = (self.shape, input.rows);
        let (p, d, k) = (rows.len(), rows.dim, shape.k);
        let m = input.x_train.len() / d;
        let step = MlpStep::new(shape, input.state, input.next)?;
        // `ClosedForm::of` routes the auto rule's integrated rows here, nothing else.
        if input.fixed.is_some() || !mlp_pieces::applies(&step) {
            return Err(crate::error::Error::Config("the dense → relu → dense closed form integrates rows under the auto quadrature only".into()));
        }
        // On a device whose Gram is resident: the whole step there.
        if let Some(dev) = self.device.as_ref().filter(|_| !input.train_integrated) {
            let tr = step.eval_head(input.x_train, input.off_train);
            let train_layers: Vec<LayerFactors<'_>> = step.layers.iter().enumerate().map(|(l, layer)| LayerFactors { acts: &tr.acts[l], deltas: &tr.deltas[l], n_in: layer.n_in, n_out: layer.n_out }).collect();
            let v = folded_prediction_weights(&step, &tr, input.a);
            if let Some(done) = dev.step(&step, input, &train_layers, &v, acc, diag)? {
                let mut stats = NodeStats { evaluations: vec![mlp_pieces::EVALUATIONS; p], jvp_evaluations: vec![0; p], pieces: Vec::with_capacity(p), unconverged: 0 };
                let (mut cos_sum, mut cos_count) = (0.0, 0usize);
                for st in &done.stats {
                    stats.pieces.push(st.pieces);
                    stats.unconverged += st.unconverged;
                    cos_sum += st.cosine_sum;
                    cos_count += st.cosine_count;
                }
                acc.add_node_work(done.rows_seconds, 0.0);
                acc.add_contraction(done.contraction_seconds, done.flops);
                #[cfg(test)]
                WHOLE_STEPS.with(|c| c.set(c.get() + 1));
                let cosine = if input.cosine && cos_count > 0 { cos_sum / cos_count as f64 } else { f64::NAN };
                return Ok(StepOutput { pred: done.pred, stats, cosine, layer_pred: Vec::new() });
            }
        }
        let tr = step.eval(input.x_train, &vec![0.0; m], input.off_train, true);
        // The path kernel's training side: layer 0 as δ̄_i (its activations are the inputs at
        // every t), the identity output layer as α·e_k ⊗ Ā_i (its B̄ vanishes), so the
        // accumulator contracts ⟨J̄_p, J̄_i⟩ with the same code as ⟨J̄_p, ∇f(x_i; w_s)⟩.
        // Wall seconds integrating rows (reported as the closed form's gradient work).
        let mut rows_seconds = 0.0;
        let train_int = if input.train_integrated {
            if shape.output != OutputKind::Identity {
                return Err(crate::error::Error::Config("the path kernel's closed form needs identity outputs (the logits)".into()));
            }
            let rf = self.row_factors(&step, input.x_train, input.off_train, input.tol_step, false, &mut rows_seconds)?;
            let (h, ne) = (step.layers[0].n_out, step.layers[0].n_out + usize::from(shape.bias));
            let abar: Vec<f64> = (0..m).flat_map(|i| rf.ab[i * (k + 1) * ne..i * (k + 1) * ne + h].iter().copied()).collect();
            Some((rf, abar))
        } else {
            None
        };
        let train_layers: Vec<LayerFactors<'_>> = step
            .layers
            .iter()
            .enumerate()
            .map(|(l, layer)| match (&train_int, l) {
                (Some((rf, _)), 0) => LayerFactors { acts: &tr.acts[0], deltas: &rf.dbar, n_in: layer.n_in, n_out: layer.n_out },
                (Some((_, abar)), _) => LayerFactors { acts: abar, deltas: &tr.deltas[l], n_in: layer.n_in, n_out: layer.n_out },
                (None, _) => LayerFactors { acts: &tr.acts[l], deltas: &tr.deltas[l], n_in: layer.n_in, n_out: layer.n_out },
            })
            .collect();
        let v = gram::prediction_weights(&train_layers, input.a, m, k, shape.bias);
        let mut stats = NodeStats { evaluations: Vec::with_capacity(p), jvp_evaluations: Vec::with_capacity(p), pieces: Vec::with_capacity(p), unconverged: 0 };
        let (mut cos_sum, mut cos_count) = (0.0, 0usize);
        let mut pred = vec![0.0; p * k];
        // The auto rule on a one-hidden-layer ReLU network: the rows integrated exactly between
        // their kinks, no gradient evaluated at a node.
        let h = step.layers[0].n_out;
        let ne = h + usize::from(shape.bias);
        // The path kernel's training Gram: the rows are the training points, whose
        // integrated factors were formed above; they are not integrated twice.
        let rows_are_train = train_int.as_ref().filter(|_| rows.x == input.x_train).map(|t| &t.0);
        let chunk = if self.device.is_some() { DEVICE_CHUNK_POINTS } else { INTEGRATED_CHUNK_POINTS };
        for c0 in (0..p).step_by(chunk) {
            let pc = chunk.min(p - c0);
            let xc = &rows.x[c0 * d..(c0 + pc) * d];
            let own = match rows_are_train {
                Some(_) => None,
                None => {
                    let offc = input.off_rows.map(|o| &o[c0 * k..(c0 + pc) * k]);
                    Some(self.row_factors(&step, xc, offc, input.tol_step, input.cosine, &mut rows_seconds)?)
                }
            };
            let rf = own.as_ref().map_or_else(|| rows_are_train.expect("one of the two").slice(c0..c0 + pc, k, h, ne), mlp_pieces::RowFactorsRef::from);
            acc.add_integrated(rf.dbar, rf.ab, &train_layers, &rows.x, input.colw, c0..c0 + pc);
            // Prediction ⟨∫∇f^k, v⟩: layer 0 as δ̄·(V_0 x̃), the output layer as
            // α(Ā·V_1[k] − Σ_o B̄[o]·V_1[o]).
            let mut xe = Vec::with_capacity(pc * (d + 1));
            for xp in xc.chunks_exact(d) {
                xe.extend_from_slice(xp);
                if shape.bias {
                    xe.push(1.0);
                }
            }
            let de = d + usize::from(shape.bias);
            let mut vx = vec![0.0; pc * h];
            crate::linalg::gemm_abt(&mut vx, &xe, &v[0], pc, h, de, 1.0, false);
            // Point by point on every core (a GPU leaves this to the host).
            pred[c0 * k..(c0 + pc) * k].par_chunks_mut(k).enumerate().for_each(|(pl, pr)| {
                let ab = &rf.ab[pl * (k + 1) * ne..(pl + 1) * (k + 1) * ne];
                let v1 = &v[1];
                let bv: f64 = (0..k).map(|o| dot(&ab[(1 + o) * ne..(2 + o) * ne], &v1[o * ne..(o + 1) * ne])).sum();
                for (kt, pv) in pr.iter_mut().enumerate() {
                    let l0 = dot(&rf.dbar[(pl * k + kt) * h..(pl * k + kt + 1) * h], &vx[pl * h..(pl + 1) * h]);
                    let l1 = shape.alpha * (dot(&ab[..ne], &v1[kt * ne..(kt + 1) * ne]) - bv);
                    *pv += l0 + l1;
                }
            });
            if input.self_kernel && input.train_integrated {
                add_path_self_kernel(&mut diag[c0 * k * k..(c0 + pc) * k * k], rf.dbar, rf.ab, xc, h, k, shape.bias, shape.alpha);
            } else if input.self_kernel {
                diag[c0 * k * k..(c0 + pc) * k * k].iter_mut().zip(rf.diag).for_each(|(a, b)| *a += b);
            }
            for st in rf.stats {
                stats.evaluations.push(mlp_pieces::EVALUATIONS);
                stats.jvp_evaluations.push(0);
                stats.pieces.push(st.pieces);
                stats.unconverged += st.unconverged;
                cos_sum += st.cosine_sum;
                cos_count += st.cosine_count;
            }
        }
        acc.end_step(&train_layers[0], input.colw);
        acc.add_node_work(rows_seconds, 0.0);
        let cosine = if input.cosine && cos_count > 0 { cos_sum / cos_count as f64 } else { f64::NAN };
        Ok(StepOutput { pred, stats, cosine, layer_pred: Vec::new() })
    }
}

/// The prediction weights `V_l = Σ_i u_{i,l} [a_{i,l}, 1]ᵀ` ([`gram::prediction_weights`]) with
/// the coefficients folded in before the backward pass: `u_{i,1} = Σ_k a[i,k] δ_{i,1}[k]` and
/// `u_{i,0} = σ'(z_i) ⊙ (W_1ᵀ u_{i,1})` — one backward pass instead of K, no `[M, K, h]`
/// sensitivities. `tr` is [`MlpStep::eval_head`] at the training points, `a` `[M, K]`.
fn folded_prediction_weights(step: &MlpStep, tr: &crate::kernel::stack::closed::dense_relu::step::Evals, a: &[f64]) -> Vec<Vec<f64>> {
    let (k, bias) = (step.k, step.bias);
    let (l0, l1) = (&step.layers[0], &step.layers[1]);
    let (d, h) = (l0.n_in, l0.n_out);
    let m = a.len() / k;
    let d1 = &tr.deltas[1];
    let u1: Vec<f64> = (0..m * k).into_par_iter().map(|j| (0..k).map(|kk| a[(j / k) * k + kk] * d1[((j / k) * k + kk) * k + j % k]).sum()).collect();
    let mut u0 = vec![0.0; m * h];
    crate::linalg::gemm_ab(&mut u0, &u1, &l1.w, m, h, k, 1.0, false);
    let a1 = &tr.acts[1];
    u0.par_chunks_mut(h).zip(a1.par_chunks(h)).for_each(|(u, a)| u.iter_mut().zip(a).for_each(|(u, a)| *u *= if *a > 0.0 { 1.0 } else { 0.0 }));
    let ext = |acts: &[f64], n: usize| -> Vec<f64> { gram::train_acts_ext(&LayerFactors { acts, deltas: &[], n_in: n, n_out: 0 }, bias) };
    let times = |u: &[f64], no: usize, acts: Vec<f64>, ne: usize| {
        let ut: Vec<f64> = (0..no * m).into_par_iter().map(|j| u[(j % m) * no + j / m]).collect();
        let mut v = vec![0.0; no * ne];
        crate::linalg::gemm_ab(&mut v, &ut, &acts, no, ne, m, 1.0, false);
        v
    };
    let (de, ne) = (d + usize::from(bias), h + usize::from(bias));
    vec![times(&u0, h, ext(&tr.acts[0], d), de), times(&u1, k, ext(a1, h), ne)]
}

/// Adds the path kernel's self-kernel `|J̄|²` of a chunk of points from their integrated
/// factors: `(x̃·x̃)(δ̄[k]·δ̄[k']) + α²(δ_kk'|Ā|² − Ā·B̄_k − Ā·B̄_k' + Σ_o |B̄_o|²)` (the output
/// layer's `J̄[k][o, :] = α(δ_ko Ā − B̄_o)`).
///
/// # Shapes
/// `diag` `[n, K, K]`, `dbar` `[n, K, h]`, `ab` `[n, K+1, h(+1)]`, `x` `[n, d]`.
#[allow(clippy::too_many_arguments)]
fn add_path_self_kernel(diag: &mut [f64], dbar: &[f64], ab: &[f64], x: &[f64], h: usize, k: usize, bias: bool, alpha: f64) {
    let n = diag.len() / (k * k);
    let d = x.len() / n;
    let ne = h + usize::from(bias);
    for p in 0..n {
        let xp = &x[p * d..(p + 1) * d];
        let xsq = dot(xp, xp) + if bias { 1.0 } else { 0.0 };
        let db = &dbar[p * k * h..(p + 1) * k * h];
        let abp = &ab[p * (k + 1) * ne..(p + 1) * (k + 1) * ne];
        let abar = &abp[..ne];
        let bb = |o: usize| &abp[(1 + o) * ne..(2 + o) * ne];
        let aa = dot(abar, abar);
        let ab_k: Vec<f64> = (0..k).map(|o| dot(abar, bb(o))).collect();
        let bsq: f64 = (0..k).map(|o| dot(bb(o), bb(o))).sum();
        for kt in 0..k {
            for ks in 0..k {
                let l0 = xsq * dot(&db[kt * h..(kt + 1) * h], &db[ks * h..(ks + 1) * h]);
                let l1 = alpha * alpha * (if kt == ks { aa } else { 0.0 } - ab_k[kt] - ab_k[ks] + bsq);
                diag[(p * k + kt) * k + ks] += l0 + l1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::stack::closed::dense_relu::pieces::tests::random_step;

    /// The prediction weights with the coefficients folded in before the backward pass equal
    /// the per-output ones ([`gram::prediction_weights`] on every output's sensitivities), on
    /// both output maps, with and without biases; the head-only evaluation keeps the output
    /// layer's sensitivities and no others.
    #[test]
    fn folded_prediction_weights_equal_the_per_output_ones() {
        for (seed, output, bias) in [(1, OutputKind::LogSoftmax, true), (2, OutputKind::Identity, false), (3, OutputKind::LogSoftmax, false)] {
            let (step, x, off, _) = random_step(3000 + seed, seed, output, bias, (6, 13, 4, 23), 2.0, 1.5);
            let (m, k) = (x.len() / step.input_dim(), step.k);
            let a: Vec<f64> = (0..m * k).map(|j| ((j * 37 + 11) % 19) as f64 / 9.0 - 1.0).collect();
            let full = step.eval(&x, &vec![0.0; m], Some(&off), true);
            let layers: Vec<LayerFactors<'_>> = step.layers.iter().enumerate().map(|(l, layer)| LayerFactors { acts: &full.acts[l], deltas: &full.deltas[l], n_in: layer.n_in, n_out: layer.n_out }).collect();
            let want = gram::prediction_weights(&layers, &a, m, k, bias);
            let head = step.eval_head(&x, Some(&off));
            assert!(head.deltas[0].is_empty() && head.deltas[1] == full.deltas[1] && head.f == full.f, "seed {seed}: the head's evaluation");
            let got = folded_prediction_weights(&step, &head, &a);
            for (l, (g, w)) in got.iter().zip(&want).enumerate() {
                let scale = w.iter().fold(0.0f64, |s, v| s.max(v.abs()));
                let diff = g.iter().zip(w).fold(0.0f64, |s, (a, b)| s.max((a - b).abs()));
                assert!(g.len() == w.len() && scale > 0.1 && diff <= 1e-13 * scale, "seed {seed} layer {l}: {diff:e} of {scale:e}");
            }
        }
    }
}
