//! Batched evaluation of an MLP along one training step, in the structured form the Gram needs.
//!
//! For step s the weights are `w_s(t) = w_s + t·Δw`, `Δw = w_{s+1} − w_s`. A batch of rows
//! `(x_r, t_r)` is pushed through the network with large GEMMs (faer): per layer the input
//! activations `a_l` and the back-propagated output sensitivities `δ_l[k] = ∂f^k/∂z_l` for
//! every output k. For a dense layer `∇_{W_l} f^k = δ_l[k] a_lᵀ` and `∇_{b_l} f^k = δ_l[k]`, so
//! inner products of gradients never need a Jacobian: `⟨∇f^k(x), ∇f^k'(x')⟩ =
//! Σ_l (δ_l[k]·δ'_l[k'])(a_l·a'_l + 1)`.
//!
//! Also: the exact derivative `d/dt f_{w_s(t)}(x)` (a forward-mode product, for the quadrature's
//! error control) and the kinks of ReLU networks along `t` (where a pre-activation crosses 0).

use crate::linalg::{gemm_ab, gemm_abt};
use crate::kernel::quadrature::poly_roots_in;
use crate::error::{Error, Result};
use crate::model::{Activation, Architecture, Body, OutputKind, Params};

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
    /// Hidden activation.
    pub activation: Activation,
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

impl FirstLayer {
    /// The rows of points `idx`: `(z, u)`, `[R, out_0]` each.
    fn rows(&self, idx: &[usize]) -> (Vec<f64>, Vec<f64>) {
        let h = self.h;
        let mut z = Vec::with_capacity(idx.len() * h);
        let mut u = Vec::with_capacity(idx.len() * h);
        for &p in idx {
            z.extend_from_slice(&self.z[p * h..(p + 1) * h]);
            u.extend_from_slice(&self.u[p * h..(p + 1) * h]);
        }
        (z, u)
    }
}

/// Per-row results of [`MlpStep::eval`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Evals {
    /// Rows R.
    pub rows: usize,
    /// Per layer l: input activations `[R, in_l]` (layer 0: the inputs).
    pub acts: Vec<Vec<f64>>,
    /// Per layer l: `δ_l` `[R, K, out_l]` (empty when gradients were not requested).
    pub deltas: Vec<Vec<f64>>,
    /// Network outputs f `[R, K]`.
    pub f: Vec<f64>,
    /// `d/dt f_{w_s(t)}(x)` at each row `[R, K]` (empty when gradients were not requested).
    pub jvp: Vec<f64>,
}

impl MlpStep {
    /// Builds the step from `w_s` and `w_{s+1}` (`None`: a zero step, for NTK/train-side use).
    pub(crate) fn new(arch: &Architecture, ws: &Params, next: Option<&Params>) -> Result<Self> {
        let Body::Mlp { widths } = &arch.body else {
            return Err(Error::Config("the structured kernel path needs an MLP".into()));
        };
        arch.check_params(ws)?;
        if let Some(n) = next {
            arch.check_params(n)?;
        }
        let mut layers = Vec::with_capacity(widths.len() - 1);
        let mut j = 0;
        for l in 0..widths.len() - 1 {
            let (n_in, n_out) = (widths[l], widths[l + 1]);
            let w = ws.data[j].clone();
            let dw = match next {
                Some(n) => n.data[j].iter().zip(&w).map(|(a, b)| a - b).collect(),
                None => vec![0.0; w.len()],
            };
            j += 1;
            let (b, db) = if arch.bias {
                let b = ws.data[j].clone();
                let db = match next {
                    Some(n) => n.data[j].iter().zip(&b).map(|(a, c)| a - c).collect(),
                    None => vec![0.0; b.len()],
                };
                j += 1;
                (b, db)
            } else {
                (vec![0.0; n_out], vec![0.0; n_out])
            };
            layers.push(Layer { n_in, n_out, w, dw, b, db });
        }
        Ok(MlpStep {
            layers,
            activation: arch.activation,
            bias: arch.bias,
            alpha: arch.alpha,
            output: arch.output,
            k: arch.outputs(),
        })
    }

    /// Input dimension d.
    pub(crate) fn input_dim(&self) -> usize {
        self.layers[0].n_in
    }

    /// Evaluates rows `x` (`[R, d]`) at times `t` (`[R]`), subtracting `offset` (`[R, K]`,
    /// the frozen initial network for `zero_output`) before scaling. With `grads`, also the
    /// sensitivities δ and the t-derivative of f.
    pub(crate) fn eval(&self, x: &[f64], t: &[f64], offset: Option<&[f64]>, grads: bool) -> Evals {
        debug_assert_eq!(x.len(), t.len() * self.input_dim());
        self.eval_impl(Some(x), None, t, offset, grads)
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

    /// [`MlpStep::eval`] at the points `idx` of a [`FirstLayer`] (row j: point `idx[j]` at
    /// time `t[j]`, `offset` `[R, K]` per row). The input activations of layer 0 are the points
    /// themselves and are not copied per row: `acts[0]` is empty.
    pub(crate) fn eval_at(&self, first: &FirstLayer, idx: &[usize], t: &[f64], offset: Option<&[f64]>, grads: bool) -> Evals {
        self.eval_impl(None, Some(first.rows(idx)), t, offset, grads)
    }

    /// [`MlpStep::jvp`] at the points `idx` of a [`FirstLayer`].
    pub(crate) fn jvp_at(&self, first: &FirstLayer, idx: &[usize], t: &[f64], offset: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        self.jvp_impl(None, Some(first.rows(idx)), t, offset)
    }

    fn eval_impl(&self, x: Option<&[f64]>, first: Option<(Vec<f64>, Vec<f64>)>, t: &[f64], offset: Option<&[f64]>, grads: bool) -> Evals {
        let r = t.len();
        let k = self.k;
        let nl = self.layers.len();
        let moving = t.iter().any(|&v| v != 0.0);
        let mut acts: Vec<Vec<f64>> = Vec::with_capacity(nl);
        let mut pre: Vec<Vec<f64>> = Vec::with_capacity(nl);
        let mut tangents: Vec<Vec<f64>> = Vec::with_capacity(nl);
        let mut a = x.map(<[f64]>::to_vec).unwrap_or_default();
        let mut first = first;
        for (l, layer) in self.layers.iter().enumerate() {
            let (ni, no) = (layer.n_in, layer.n_out);
            if let (0, Some((z0, u0))) = (l, first.take()) {
                // z + t·u from the cached first layer (biases included).
                let mut z = z0;
                for (row, (zr, ur)) in z.chunks_exact_mut(no).zip(u0.chunks_exact(no)).enumerate() {
                    let tr = t[row];
                    if tr != 0.0 {
                        zr.iter_mut().zip(ur).for_each(|(zv, uv)| *zv += tr * uv);
                    }
                }
                let next: Vec<f64> = if l + 1 < nl { z.iter().map(|&v| self.activation.apply(v)).collect() } else { Vec::new() };
                acts.push(std::mem::replace(&mut a, next));
                pre.push(z);
                tangents.push(if moving { u0 } else { Vec::new() });
                continue;
            }
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
            let next: Vec<f64> = if l + 1 < nl { z.iter().map(|&v| self.activation.apply(v)).collect() } else { Vec::new() };
            acts.push(std::mem::replace(&mut a, next));
            pre.push(z);
            tangents.push(u);
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
            return Evals { rows: r, acts, deltas: Vec::new(), f, jvp: Vec::new() };
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
        for l in (0..nl).rev() {
            let layer = &self.layers[l];
            if l > 0 {
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
                            prev[(row * k + kk) * ni + i] *= self.activation.derivative(zprev[row * ni + i]);
                        }
                    }
                }
                deltas[l] = std::mem::replace(&mut d, prev);
            } else {
                deltas[0] = std::mem::take(&mut d);
            }
        }
        // d/dt f = Σ_l δ_l · (ΔW_l a_l + Δb_l).
        let mut jvp = vec![0.0; r * k];
        if moving {
            for (l, layer) in self.layers.iter().enumerate() {
                let no = layer.n_out;
                let u = &tangents[l];
                let dl = &deltas[l];
                for row in 0..r {
                    for kk in 0..k {
                        let base = (row * k + kk) * no;
                        let mut s = 0.0;
                        for o in 0..no {
                            s += dl[base + o] * u[row * no + o];
                        }
                        jvp[row * k + kk] += s;
                    }
                }
            }
        }
        Evals { rows: r, acts, deltas, f, jvp }
    }

    /// Forward-mode evaluation: `f_{w_s(t)}(x)` and its exact t-derivative for rows `x`
    /// (`[R, d]`) at times `t` (`[R]`), without any backward pass (cheap; used by the adaptive
    /// quadrature to choose its nodes before the gradients are computed).
    ///
    /// # Shapes
    /// returns `(f [R, K], df/dt [R, K])`.
    pub(crate) fn jvp(&self, x: &[f64], t: &[f64], offset: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        self.jvp_impl(Some(x), None, t, offset)
    }

    fn jvp_impl(&self, x: Option<&[f64]>, first: Option<(Vec<f64>, Vec<f64>)>, t: &[f64], offset: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        let r = t.len();
        let k = self.k;
        let nl = self.layers.len();
        let mut a = x.map(<[f64]>::to_vec).unwrap_or_default();
        let mut adot: Option<Vec<f64>> = None;
        let mut zout = Vec::new();
        let mut zdot_out = Vec::new();
        let mut first = first;
        for (l, layer) in self.layers.iter().enumerate() {
            let (ni, no) = (layer.n_in, layer.n_out);
            if let (0, Some((mut z, u0))) = (l, first.take()) {
                // z + t·u and ż = u from the cached first layer.
                for (row, (zr, ur)) in z.chunks_exact_mut(no).zip(u0.chunks_exact(no)).enumerate() {
                    let tr = t[row];
                    zr.iter_mut().zip(ur).for_each(|(zv, uv)| *zv += tr * uv);
                }
                if l + 1 < nl {
                    a = z.iter().map(|&v| self.activation.apply(v)).collect();
                    adot = Some(z.iter().zip(&u0).map(|(&zv, &zd)| self.activation.derivative(zv) * zd).collect());
                } else {
                    zout = z;
                    zdot_out = u0;
                }
                continue;
            }
            let mut z = vec![0.0; r * no];
            let mut u = vec![0.0; r * no];
            gemm_abt(&mut z, &a, &layer.w, r, no, ni, 1.0, false);
            gemm_abt(&mut u, &a, &layer.dw, r, no, ni, 1.0, false);
            // ż = ΔW a + Δb + (W + tΔW) ȧ
            let mut zdot = vec![0.0; r * no];
            if let Some(ad) = &adot {
                let mut v = vec![0.0; r * no];
                gemm_abt(&mut zdot, ad, &layer.w, r, no, ni, 1.0, false);
                gemm_abt(&mut v, ad, &layer.dw, r, no, ni, 1.0, false);
                for row in 0..r {
                    for o in 0..no {
                        zdot[row * no + o] += t[row] * v[row * no + o];
                    }
                }
            }
            for row in 0..r {
                for o in 0..no {
                    let idx = row * no + o;
                    let ui = u[idx] + layer.db[o];
                    z[idx] += layer.b[o] + t[row] * ui;
                    zdot[idx] += ui;
                }
            }
            if l + 1 < nl {
                a = z.iter().map(|&v| self.activation.apply(v)).collect();
                adot = Some(z.iter().zip(&zdot).map(|(&zv, &zd)| self.activation.derivative(zv) * zd).collect());
            } else {
                zout = z;
                zdot_out = zdot;
            }
        }
        let mut f = self.scaled_output(&zout, offset);
        let mut fdot: Vec<f64> = zdot_out.iter().map(|v| self.alpha * v).collect();
        if self.output == OutputKind::LogSoftmax {
            crate::model::log_softmax_rows(&mut f, k);
            for row in 0..r {
                let mean: f64 = (0..k).map(|c| f[row * k + c].exp() * fdot[row * k + c]).sum();
                for c in 0..k {
                    fdot[row * k + c] -= mean;
                }
            }
        }
        (f, fdot)
    }

    /// `α (z − offset)` for the last layer's pre-activations `z` (`[R, K]`), before the output map.
    fn scaled_output(&self, z: &[f64], offset: Option<&[f64]>) -> Vec<f64> {
        match offset {
            Some(off) => z.iter().zip(off).map(|(v, o)| self.alpha * (v - o)).collect(),
            None => z.iter().map(|v| self.alpha * v).collect(),
        }
    }

    /// Kinks of the network along `t ∈ (a, b)` for input `x` (`[d]`): the times where some
    /// hidden ReLU pre-activation crosses zero. Within each piece between kinks every
    /// pre-activation of layer l is a polynomial of degree l+1 in t (computed exactly, layer by
    /// layer, with the activation pattern of the piece), so its zeros are polynomial roots.
    /// Tanh networks have no kinks.
    pub(crate) fn kinks(&self, x: &[f64], a: f64, b: f64) -> Vec<f64> {
        self.kinks_impl(x, None, a, b)
    }

    /// [`MlpStep::kinks`] for point `p` of a [`FirstLayer`] (whose input row is `x`, `[d]`),
    /// with layer 0's polynomials `z + t·u` taken from the cache.
    pub(crate) fn kinks_at(&self, first: &FirstLayer, p: usize, x: &[f64], a: f64, b: f64) -> Vec<f64> {
        let h = first.h;
        self.kinks_impl(x, Some((&first.z[p * h..(p + 1) * h], &first.u[p * h..(p + 1) * h])), a, b)
    }

    fn kinks_impl(&self, x: &[f64], first: Option<(&[f64], &[f64])>, a: f64, b: f64) -> Vec<f64> {
        if self.activation != Activation::Relu || self.layers.len() < 2 {
            return Vec::new();
        }
        if let (Some((z, u)), 2) = (first, self.layers.len()) {
            return relu_cuts(z, u, a, b);
        }
        let mut pieces = vec![(a, b)];
        // For each hidden layer, split every current piece at the zeros of that layer.
        for depth in 0..self.layers.len() - 1 {
            let mut next_pieces = Vec::with_capacity(pieces.len());
            for &(pa, pb) in &pieces {
                let polys = self.hidden_polys(x, first, depth, 0.5 * (pa + pb));
                let mut cuts: Vec<f64> = Vec::new();
                for c in &polys {
                    cuts.extend(poly_roots_in(c, pa, pb));
                }
                cuts.sort_by(|u, v| u.partial_cmp(v).expect("finite roots"));
                cuts.dedup_by(|u, v| (*u - *v).abs() <= 1e-15);
                let mut lo = pa;
                for c in cuts {
                    next_pieces.push((lo, c));
                    lo = c;
                }
                next_pieces.push((lo, pb));
            }
            pieces = next_pieces;
        }
        pieces.iter().skip(1).map(|p| p.0).collect()
    }

    /// Coefficients (in t) of every pre-activation of hidden layer `depth`, with the
    /// activation pattern of the shallower layers taken at time `tm`.
    fn hidden_polys(&self, x: &[f64], first: Option<(&[f64], &[f64])>, depth: usize, tm: f64) -> Vec<Vec<f64>> {
        // a: per unit, polynomial coefficients (lowest degree first).
        let mut a: Vec<Vec<f64>> = x.iter().map(|&v| vec![v]).collect();
        for l in 0..=depth {
            let layer = &self.layers[l];
            if let (0, Some((z0, u0))) = (l, first) {
                let z: Vec<Vec<f64>> = z0.iter().zip(u0).map(|(&zv, &uv)| vec![zv, uv]).collect();
                if l == depth {
                    return z;
                }
                a = z
                    .into_iter()
                    .map(|c| if crate::kernel::quadrature::horner(&c, tm) > 0.0 { c } else { vec![0.0; c.len()] })
                    .collect();
                continue;
            }
            let deg_in = a.first().map_or(1, |c| c.len());
            let mut z: Vec<Vec<f64>> = vec![vec![0.0; deg_in + 1]; layer.n_out];
            for o in 0..layer.n_out {
                let zo = &mut z[o];
                let wrow = &layer.w[o * layer.n_in..(o + 1) * layer.n_in];
                let dwrow = &layer.dw[o * layer.n_in..(o + 1) * layer.n_in];
                for (i, ai) in a.iter().enumerate() {
                    for (j, &c) in ai.iter().enumerate() {
                        zo[j] += wrow[i] * c;
                        zo[j + 1] += dwrow[i] * c;
                    }
                }
                zo[0] += layer.b[o];
                zo[1] += layer.db[o];
            }
            if l == depth {
                return z;
            }
            a = z
                .into_iter()
                .map(|c| {
                    let v = crate::kernel::quadrature::horner(&c, tm);
                    if v > 0.0 {
                        c
                    } else {
                        vec![0.0; c.len()]
                    }
                })
                .collect();
        }
        unreachable!("returns at l == depth")
    }
}
