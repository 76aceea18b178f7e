//! The closed form of `conv2d → relu → max_pool2d → flatten → dense` under the auto rule: the
//! rows integrated exactly between the kinks ([`super::pieces`]), the training points' gradients
//! at `w_s` from one backward pass each, contracted without per-sample Jacobians of the whole
//! network. (Every other kernel and rule of this shape runs on the stack engine, measured faster
//! there: [`crate::kernel::stack::closed`].)
//!
//! Along step s the weights are `w_s(t) = w_s + t·Δw`. The convolution is the first layer, so
//! its im2col patches `Ũ_x` (`[pos, C·k·k (+1 bias column)]`) do not depend on t and its
//! pre-activations are linear in t: `Z(t) = Ũ_x (W_c + tΔW_c)ᵀ = Z_0 + t Z_1` (`[pos, Co]`).
//! For one evaluation (a point x at a time t) the backward pass gives
//!
//! - the dense layer's factors: pooled input `a` (`[F]`, `F = Co·Hp·Wp`) and output sensitivity
//!   `δ_out[k]` (`[K]`), so `∇_{W_d} f^k = δ_out[k] [a, 1]ᵀ`;
//! - the conv sensitivities `δ_c[k, o, pos]`: `(W_d(t)ᵀ δ_out[k])` routed through the pool to
//!   each window's first maximal position (as `model::conv::max_pool2d`), times `σ'(Z)`; the conv
//!   gradient is `G[k] = δ_c[k] Ũ_x` (`[Co, C·k·k (+1)]`, a small matrix).
//!
//! For a row point p with quadrature nodes r (weights `w_r`; `side_factors`, the slow
//! reference the tests hold the integrated rows to) and training points i at `w_s`:
//!
//! `K_s[p, i, k, k'] = ⟨J̄c_p[k], G_i[k']⟩ + Σ_o (J̄d_p[k, o, :]·[a_i, 1]) δ_out,i[k', o]`
//!
//! with `J̄c_p = Σ_r w_r G_r` (conv, formed: only `K·Co·(C·k·k+1)` numbers per point) and
//! `J̄d_p[k, o, :] = Σ_r w_r δ_out,r[k, o] [a_r, 1]` (dense, formed per point, then contracted
//! with the training activations by one GEMM as `kernel::gram` does for dense layers). Every sum over
//! positions, nodes and points is a GEMM (faer); nothing of size `M·K·W` is formed.
//!
//! The output is exactly [`crate::kernel::generic::step_gram`]'s: the Gram `[P, M, K, K]` and the rows'
//! self-kernel `[P, K, K]` accumulated.
//!
//! Along t the network is piecewise linear in its pattern: `Z(t)` is linear, so the function
//! only kinks where a pool window's upper envelope of `{Z_j(t)}` (with the line 0: `max_j
//! relu(Z_j) = relu(max_j Z_j)`) changes its line (`CnnStep::kinks`), and between two kinks the
//! rows' gradients are integrated in closed form.

use rayon::prelude::*;

use super::pieces;
pub(crate) use crate::kernel::stack::closed::conv_relu_pool::step::CnnStep;
use crate::kernel::stack::closed::conv_relu_pool::step::SideFactors;
use crate::kernel::layout::{add_dense, add_output_layer, GramSink, TrainDeltas};
use crate::kernel::stack::cosine::Integrated;
use crate::kernel::stack::step::RowGrad;
use crate::kernel::types::NodeStats;
use crate::linalg::{gemm_ab, gemm_abt};
use crate::error::Result;
use crate::kernel::stack::closed::shape::ConvReluPool;
use crate::model::Params;
#[cfg(test)]
use crate::model::Architecture;

/// Scratch bytes allowed for one block of row points (their formed dense gradients).
const BLOCK_BYTES: usize = 64 << 20;

/// The frozen initial network `g_{w_0}(x)` (`[n, K]`) when the architecture has `zero_output`
/// (the engine passes its own; the tests' reference here).
#[cfg(test)]
pub(in crate::kernel) fn offsets(arch: &Architecture, init: &Params, x: &[f64]) -> Result<Option<Vec<f64>>> {
    if arch.zero_output {
        arch.check_params(init)?;
        Ok(Some(arch.raw_forward(init, x)))
    } else {
        Ok(None)
    }
}

/// Factors of a set of points, each at its own nodes (`nodes[p]` = `(t, weight)` pairs).
/// With `train`, also every point's pooled activations `[n_pts, nf]` and output sensitivities
/// `[n_pts, K, K]` (single node at t = 0 expected); otherwise the formed dense gradient
/// `J̄d[p, k, o, :] = Σ_r w_r δ_out,r[k, o] a_r = α(δ_ko Ā_p − B̄_p[o])` in its K + 1 distinct rows
/// `[Ā_p; B̄_p]` `[n_pts, K+1, nf]` (`Ā_p = Σ_r w_r a_r`, `B̄_p[o] = Σ_r w_r q_{r,o} a_r`, see
/// [`add_output_layer`]).
pub(in crate::kernel) fn side_factors(step: &CnnStep, x: &[f64], off: Option<&[f64]>, nodes: &[Vec<(f64, f64)>], train: bool) -> (SideFactors, Vec<f64>, Vec<f64>) {
    let (k, cne, nf, d) = (step.k, step.co * step.ne, step.nf, step.input_dim());
    let per: Vec<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> = nodes
        .par_iter()
        .enumerate()
        .map(|(pi, nd)| {
            let u = step.patches(&x[pi * d..(pi + 1) * d]);
            let (z0, z1) = step.pre(&u);
            let t: Vec<f64> = nd.iter().map(|v| v.0).collect();
            let (ev, _) = step.eval_point(&u, &z0, &z1, &t, off.map(|o| &o[pi * k..(pi + 1) * k]));
            let mut gc = vec![0.0; k * cne];
            let mut dg = vec![0.0; k * k];
            for (r, &(_, w)) in nd.iter().enumerate() {
                let gr = &ev.gc[r * k * cne..(r + 1) * k * cne];
                gc.iter_mut().zip(gr).for_each(|(a, b)| *a += w * b);
                let ar = &ev.a[r * nf..(r + 1) * nf];
                let aa: f64 = ar.iter().map(|v| v * v).sum();
                let dr = &ev.dout[r * k * k..(r + 1) * k * k];
                for kt in 0..k {
                    for ks in 0..k {
                        let cc: f64 = gr[kt * cne..(kt + 1) * cne].iter().zip(&gr[ks * cne..(ks + 1) * cne]).map(|(x, y)| x * y).sum();
                        let dd: f64 = dr[kt * k..(kt + 1) * k].iter().zip(&dr[ks * k..(ks + 1) * k]).map(|(x, y)| x * y).sum();
                        dg[kt * k + ks] += w * (cc + dd * aa);
                    }
                }
            }
            if train {
                (gc, dg, ev.a, ev.dout)
            } else {
                // J̄d[k, o, :] = α(δ_ko Ā − B̄[o]): Ā = Σ_r w_r a_r, B̄[o] = Σ_r w_r q_{r,o} a_r,
                // i.e. [Ā; B̄] = Qwᵀ A with Qw [n, K+1].
                let n = nd.len();
                let mut qwt = vec![0.0; (k + 1) * n];
                for (r, &(_, w)) in nd.iter().enumerate() {
                    qwt[r] = w;
                    for o in 0..k {
                        qwt[(1 + o) * n + r] = w * ev.q[r * k + o];
                    }
                }
                let mut ab = vec![0.0; (k + 1) * nf];
                gemm_ab(&mut ab, &qwt, &ev.a, k + 1, nf, n, 1.0, false);
                (gc, dg, ab, Vec::new())
            }
        })
        .collect();
    let mut gc = Vec::with_capacity(nodes.len() * k * cne);
    let mut diag = Vec::with_capacity(nodes.len() * k * k);
    let mut third = Vec::new();
    let mut fourth = Vec::new();
    for (a, b, c, e) in per {
        gc.extend(a);
        diag.extend(b);
        third.extend(c);
        fourth.extend(e);
    }
    (SideFactors { gc, diag }, third, fourth)
}

/// The Gram of one step for row points integrated between their kinks to the per-step
/// tolerance `tol` (filling the node statistics). Adds to `sink` (any layout) and
/// `diag` `[P, K, K]`, and returns the step's kernel-machine prediction
/// `Σ_i Σ_k' a[i, k'] K_s[p, i, k, k']` `[P, K]` contracted from the factors (no layout needs the
/// off-diagonal blocks for it). `colw` (`[M, K]`) scales the stored Gram's training gradients
/// (Chen's kernel), not the prediction. Offsets (`zero_output`) are `[P, K]` and `[M, K]`.
#[allow(clippy::too_many_arguments)]
fn step_into_at(
    step: &CnnStep,
    rows: &[f64],
    off_rows: Option<&[f64]>,
    tol: f64,
    stats: &mut NodeStats,
    x_train: &[f64],
    off_train: Option<&[f64]>,
    sink: &mut GramSink,
    diag: &mut [f64],
    a: &[f64],
    colw: Option<&[f64]>,
    cosine: bool,
) -> (Vec<f64>, (f64, usize)) {
    let (k, cne, nf, d) = (step.k, step.co * step.ne, step.nf, step.input_dim());
    let (p, m) = (rows.len() / d, x_train.len() / d);
    let layout = sink.layout();
    let train_nodes = vec![vec![(0.0, 1.0)]; m];
    let (mut tr, a_train, d_train) = side_factors(step, x_train, off_train, &train_nodes, true);
    // The prediction's training side: v_conv = Σ a[i,k'] G_conv[(i,k')], and for the dense
    // layer V[o, :] = Σ_{i,k'} a[i,k'] δ_out,i[k', o] a_i.
    let mut v_conv = vec![0.0; cne];
    gemm_ab(&mut v_conv, a, &tr.gc, 1, cne, m * k, 1.0, false);
    let mut ut = vec![0.0; k * m];
    for i in 0..m {
        for ks in 0..k {
            let c = a[i * k + ks];
            if c != 0.0 {
                for o in 0..k {
                    ut[o * m + i] += c * d_train[(i * k + ks) * k + o];
                }
            }
        }
    }
    let mut v_dense = vec![0.0; k * nf];
    gemm_ab(&mut v_dense, &ut, &a_train, k, nf, m, 1.0, false);
    if let Some(cw) = colw {
        tr.gc.chunks_mut(cne).zip(cw).for_each(|(row, &c)| row.iter_mut().for_each(|x| *x *= c));
    }
    let dt = if step.alpha != 0.0 && k >= 2 { TrainDeltas::output(layout, &d_train, m, k, colw, step.alpha) } else { TrainDeltas::new(layout, &d_train, m, k, k, colw) };
    let mut pred = vec![0.0; p * k];
    let mut cos = (0.0, 0);
    let mut t = Vec::new();
    let pb = (BLOCK_BYTES / 8 / ((k + 1) * nf.max(m)).max(1)).clamp(1, p.max(1));
    for p0 in (0..p).step_by(pb) {
        let nb = pb.min(p - p0);
        let (xb, ob) = (&rows[p0 * d..(p0 + nb) * d], off_rows.map(|o| &o[p0 * k..(p0 + nb) * k]));
        let (rf, ab, st) = pieces::row_factors(step, xb, ob, tol);
        for (pieces, bad) in st {
            stats.evaluations.push(pieces::EVALUATIONS);
            stats.jvp_evaluations.push(pieces);
            stats.pieces.push(pieces);
            stats.unconverged += bad;
        }
        if cosine {
            // The Fig. 2 measure: the rows' gradients at w_s against the integrated ones (the conv
            // layer formed, the dense layer as its K + 1 rows).
            let (g0, a0, d0) = side_factors(step, xb, ob, &vec![vec![(0.0, 1.0)]; nb], true);
            let g0 = [RowGrad::Formed { g: g0.gc, width: cne }, RowGrad::Factor { acts: a0, deltas: d0, ne: nf, out: k }];
            let (sum, count) = crate::kernel::stack::cosine::add(&g0, &[Integrated::Formed(&rf.gc), Integrated::Output { ab: &ab, alpha: step.alpha }], nb, k);
            cos.0 += sum;
            cos.1 += count;
        }
        diag[p0 * k * k..(p0 + nb) * k * k].iter_mut().zip(&rf.diag).for_each(|(a, b)| *a += b);
        let out = sink.rows_mut(p0..p0 + nb);
        // Conv: ⟨J̄c[(p, k)], G_train[(i, k')]⟩.
        add_dense(layout, out, &rf.gc, &tr.gc, nb, m, k, cne, 1.0);
        // Dense: T = [Ā; B̄] · A_trainᵀ, then α(T_A δ_out,i[k', k] − Σ_o T_B[o] δ_out,i[k', o]).
        add_output_layer(out, &ab, &a_train, &dt, nb, nf, step.alpha, &mut t);
        // Prediction: J̄c·v_conv + Σ_o J̄d[(p,k,o), :]·V[o, :] = J̄c·v_conv + α(Ā·V[k] − Σ_o B̄[o]·V[o]).
        let pb_pred = &mut pred[p0 * k..(p0 + nb) * k];
        gemm_abt(pb_pred, &rf.gc, &v_conv, nb * k, 1, cne, 1.0, true);
        let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
        for (pl, pv) in pb_pred.chunks_mut(k).enumerate() {
            let abp = &ab[pl * (k + 1) * nf..(pl + 1) * (k + 1) * nf];
            let sb: f64 = (0..k).map(|o| dot(&abp[(1 + o) * nf..(2 + o) * nf], &v_dense[o * nf..(o + 1) * nf])).sum();
            for (kt, v) in pv.iter_mut().enumerate() {
                *v += step.alpha * (dot(&abp[..nf], &v_dense[kt * nf..(kt + 1) * nf]) - sb);
            }
        }
    }
    (pred, cos)
}

/// One step of the closed form: the rows integrated between their kinks with per-step
/// tolerance `tol_step` ([`super::pieces`]); the Gram into `sink` (any layout), the
/// self-kernel into `diag` and the step's kernel-machine prediction for training weights `a`,
/// and with `cosine` the Fig. 2 measure's mean.
///
/// # Errors
/// [`crate::error::Error::Data`] if the states' tensors do not have the shape's sizes.
///
/// # Shapes
/// `rows` `[P, d]`, `off_rows` `[P, K]`, `x_train` `[M, d]`, `off_train` `[M, K]`,
/// `diag` `[P, K, K]`, `a` and `colw` `[M, K]`; returns `[P, K]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_into(
    shape: &ConvReluPool,
    ws: &Params,
    next: Option<&Params>,
    rows: &[f64],
    off_rows: Option<&[f64]>,
    tol_step: f64,
    x_train: &[f64],
    off_train: Option<&[f64]>,
    sink: &mut GramSink,
    diag: &mut [f64],
    a: &[f64],
    colw: Option<&[f64]>,
    cosine: bool,
) -> Result<(Vec<f64>, NodeStats, f64)> {
    let step = CnnStep::new(shape, ws, next)?;
    let mut stats = NodeStats::default();
    let (pred, (sum, count)) = step_into_at(&step, rows, off_rows, tol_step, &mut stats, x_train, off_train, sink, diag, a, colw, cosine);
    Ok((pred, stats, if count > 0 { sum / count as f64 } else { f64::NAN }))
}

#[cfg(test)]
pub(in crate::kernel) mod tests {
    use super::*;
    use crate::kernel::layout::Layout;
    use crate::kernel::{generic, quadrature};
    use crate::model::{conv, Activation, ModelConfig, OutputKind};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use crate::kernel::stack::closed::shape::ConvReluPool;

    /// `(image, channels, kernel, stride, padding, pool, activation, bias, zero_output, alpha,
    /// output, K)`.
    pub(crate) type Case = ([usize; 3], usize, usize, usize, usize, usize, Activation, bool, bool, f64, OutputKind, usize);

    pub(crate) fn cases() -> Vec<Case> {
        vec![
            ([1, 8, 8], 2, 3, 1, 0, 2, Activation::Relu, true, false, 1.0, OutputKind::LogSoftmax, 3),
            ([2, 7, 7], 3, 3, 2, 1, 2, Activation::Relu, false, false, 1.0, OutputKind::LogSoftmax, 3),
            ([3, 9, 7], 2, 2, 1, 0, 2, Activation::Relu, true, true, 2.0, OutputKind::Identity, 2),
            ([1, 9, 9], 3, 3, 1, 1, 3, Activation::Relu, true, false, 0.7, OutputKind::LogSoftmax, 4),
            ([2, 10, 10], 1, 4, 2, 0, 2, Activation::Relu, true, true, 1.0, OutputKind::LogSoftmax, 2),
        ]
    }

    /// The architecture, three parameter states (init, w_s, w_{s+1}), rows and training points.
    pub(crate) fn setup(c: &Case, seed: u64) -> (Architecture, Params, Params, Params, Vec<f64>, Vec<f64>) {
        let (image, channels, kernel, stride, padding, pool, activation, bias, zero_output, alpha, output, k) = *c;
        let cfg = ModelConfig::Cnn { channels, kernel, stride, padding, pool, activation, bias, zero_last: false, alpha, zero_output };
        let arch = cfg.resolve(image.iter().product(), Some(image), k, output).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let init = arch.init(seed);
        let ws = arch.init(seed + 1);
        let next = Params {
            specs: ws.specs.clone(),
            data: ws.data.iter().map(|v| v.iter().map(|x| x + 0.3 * rng.gen_range(-1.0..1.0)).collect()).collect(),
        };
        let d = arch.input_dim();
        // Half the pixels share one value, as in a blank image border: identical patches, exact
        // ties in the pool.
        let x = |n: usize, rng: &mut ChaCha8Rng| -> Vec<f64> {
            (0..n * d).map(|_| if rng.gen_bool(0.5) { -0.4 } else { rng.gen_range(-1.0..1.0) }).collect()
        };
        let rows = x(3, &mut rng);
        let train = x(5, &mut rng);
        (arch, init, ws, next, rows, train)
    }

    /// Max |a − b| relative to max |b| (which must not be trivially small).
    pub(crate) fn rel(a: &[f64], b: &[f64]) -> f64 {
        let m = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(m > 1e-8, "trivial reference");
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / m
    }

    /// The closed form's step (rows integrated between their kinks, training gradients at `w_s`)
    /// against the slow obvious path: dfdx autodiff of the whole network at Gauss(30) nodes on
    /// every smooth piece of each row point, the Gram and the self-kernel; along a step and with
    /// no direction (the NTK: one piece, the gradient at `w_s`).
    #[test]
    fn closed_form_equals_generic_autodiff_per_piece() {
        let mut worst: f64 = 0.0;
        for (ci, c) in cases().iter().enumerate() {
            let (arch, init, ws, next, rows, train) = setup(c, 10 + ci as u64);
            let d = arch.input_dim();
            let (p, m, k) = (rows.len() / d, train.len() / d, arch.outputs());
            for (name, nx) in [("ntk", None), ("epk", Some(&next))] {
                let step = CnnStep::new(&ConvReluPool::of(&arch), &ws, nx).unwrap();
                let (off_rows, off_train) = (offsets(&arch, &init, &rows).unwrap(), offsets(&arch, &init, &train).unwrap());
                let mut sink = GramSink::new(Layout::Full, p, m, k);
                let mut d_fast = vec![0.0; p * k * k];
                let (_, stats, _) = step_into(&ConvReluPool::of(&arch), &ws, nx, &rows, off_rows.as_deref(), 1e-15, &train, off_train.as_deref(), &mut sink, &mut d_fast, &vec![0.0; m * k], None, false).unwrap();
                assert_eq!(stats.unconverged, 0, "case {ci} {name}");
                let g_fast = sink.finish();
                let (mut g_slow, mut d_slow) = (Vec::with_capacity(p * m * k * k), Vec::with_capacity(p * k * k));
                for x in rows.chunks(d) {
                    let mut bps = vec![0.0];
                    bps.extend(step.kinks(x, 0.0, 1.0));
                    bps.push(1.0);
                    let nodes: Vec<(f64, f64)> = bps.windows(2).flat_map(|w| quadrature::gauss_legendre_01(30, w[0], w[1])).collect();
                    let (mut g, mut dg) = (vec![0.0; m * k * k], vec![0.0; k * k]);
                    generic::step_gram(&arch, &ws, nx, &init, x, &nodes, &train, &mut g, &mut dg).unwrap();
                    g_slow.extend(g);
                    d_slow.extend(dg);
                }
                let (eg, ed) = (rel(&g_fast, &g_slow), rel(&d_fast, &d_slow));
                assert!(eg <= 1e-12 && ed <= 1e-12, "case {ci} {name}: gram {eg:e}, diag {ed:e}");
                worst = worst.max(eg).max(ed);
            }
        }
        eprintln!("cnn closed form vs generic autodiff: max relative difference {worst:e}");
    }

    /// The pool pattern at t: for every window, the argmax position (or "none" when ReLU zeroes
    /// the window).
    fn pattern(arch: &Architecture, ws: &Params, next: &Params, x: &[f64], t: f64) -> Vec<Option<usize>> {
        let ConvReluPool { image, channels, kernel, stride, padding, pool, .. } = ConvReluPool::of(arch);
        let at = generic::interpolate(ws, Some(next), t);
        let zb = vec![0.0; channels];
        let (z, [_, co, ho, wo]) = conv::conv2d_direct(
            x,
            [1, image[0], image[1], image[2]],
            at.get("conv.weight").unwrap(),
            [channels, image[0], kernel, kernel],
            at.get("conv.bias").unwrap_or(&zb),
            stride,
            padding,
        );
        let mut out = Vec::new();
        for o in 0..co {
            for ph in 0..ho / pool {
                for pw in 0..wo / pool {
                    let mut best = (f64::NEG_INFINITY, 0);
                    for i in 0..pool {
                        for j in 0..pool {
                            let p = (ph * pool + i) * wo + pw * pool + j;
                            if z[o * ho * wo + p] > best.0 {
                                best = (z[o * ho * wo + p], p);
                            }
                        }
                    }
                    out.push(if best.0 <= 0.0 { None } else { Some(best.1) });
                }
            }
        }
        out
    }

    #[test]
    fn kinks_are_exactly_the_pool_pattern_changes() {
        let mut total = 0;
        for (ci, c) in cases().iter().enumerate() {
            let (arch, _, ws, next, rows, _) = setup(c, 30 + ci as u64);
            let step = CnnStep::new(&ConvReluPool::of(&arch), &ws, Some(&next)).unwrap();
            let d = arch.input_dim();
            for x in rows.chunks(d) {
                let kinks = step.kinks(x, 0.0, 1.0);
                total += kinks.len();
                let mut bps = vec![0.0];
                bps.extend(&kinks);
                bps.push(1.0);
                for w in bps.windows(2) {
                    let (a, b) = (w[0], w[1]);
                    let mid = pattern(&arch, &ws, &next, x, 0.5 * (a + b));
                    for s in [0.1, 0.3, 0.7, 0.9] {
                        assert_eq!(pattern(&arch, &ws, &next, x, a + s * (b - a)), mid, "case {ci}: pattern changes inside ({a}, {b})");
                    }
                }
                for &kt in &kinks {
                    let e = 1e-9;
                    assert_ne!(pattern(&arch, &ws, &next, x, kt - e), pattern(&arch, &ws, &next, x, kt + e), "case {ci}: no change at kink {kt}");
                }
            }
        }
        assert!(total > 10, "too few kinks ({total}) for a meaningful test");
        eprintln!("{total} kinks checked");
    }
}
