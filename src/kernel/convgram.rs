//! The structured Gram path for the CNN (conv → activation → max-pool → dense), without
//! per-sample Jacobians of the whole network.
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
//! For a row point p with quadrature nodes r (weights `w_r`) and training points i at `w_s`:
//!
//! `K_s[p, i, k, k'] = ⟨J̄c_p[k], G_i[k']⟩ + Σ_o (J̄d_p[k, o, :]·[a_i, 1]) δ_out,i[k', o]`
//!
//! with `J̄c_p = Σ_r w_r G_r` (conv, formed: only `K·Co·(C·k·k+1)` numbers per point) and
//! `J̄d_p[k, o, :] = Σ_r w_r δ_out,r[k, o] [a_r, 1]` (dense, formed per point, then contracted
//! with the training activations by one GEMM as `gram.rs` does for dense layers). Every sum over
//! positions, nodes and points is a GEMM (faer); nothing of size `M·K·W` is formed.
//!
//! The output is exactly [`super::generic::step_gram`]'s: the Gram `[P, M, K, K]` and the rows'
//! self-kernel `[P, K, K]` accumulated.
//!
//! Along t the network is piecewise smooth: `Z(t)` is linear, so the function only kinks where a
//! pool window's upper envelope of `{Z_j(t)}` (with the line 0 for ReLU: `max_j relu(Z_j) =
//! relu(max_j Z_j)`) changes its line ([`CnnStep::kinks`]); [`CnnStep::jvp`] gives `f` and
//! `df/dt` exactly, so the adaptive `auto` rule applies to CNNs too.

use rayon::prelude::*;

use super::convpieces::{self, Measure};
use super::layout::{add_dense, add_output_layer, GramSink, Layout, TrainDeltas};
use super::linalg::{gemm_ab, gemm_abt};
use crate::error::{Error, Result};
use crate::model::{Activation, Architecture, Body, OutputKind, Params};

/// Scratch bytes allowed for one block of row points (their formed dense gradients).
const BLOCK_BYTES: usize = 64 << 20;

/// A CNN on one step `w_s(t) = w_s + tΔw`, in the factors the Gram needs.
#[derive(Clone, Debug)]
pub struct CnnStep {
    /// Input image `[C, H, W]`.
    pub(super) image: [usize; 3],
    /// Kernel size, stride, padding, pool window.
    pub(super) kernel: usize,
    pub(super) stride: usize,
    pub(super) padding: usize,
    pub(super) pool: usize,
    /// Conv output `Ho, Wo` and pooled `Hp, Wp`.
    pub(super) ho: usize,
    pub(super) wo: usize,
    pub(super) hp: usize,
    pub(super) wp: usize,
    /// Channels Co.
    pub(super) co: usize,
    /// Patch width `ne = C·k·k + [bias]`.
    pub(super) ne: usize,
    /// Dense input width with the bias column `nf = Co·Hp·Wp + [bias]`.
    pub(super) nf: usize,
    /// `[W_c | b_c]` `[Co, ne]` and its step `Δ`.
    pub(super) wc: Vec<f64>,
    pub(super) dwc: Vec<f64>,
    /// `[W_d | b_d]` `[K, nf]` and its step `Δ`.
    pub(super) wd: Vec<f64>,
    pub(super) dwd: Vec<f64>,
    pub(super) activation: Activation,
    pub(super) bias: bool,
    pub(super) alpha: f64,
    pub(super) output: OutputKind,
    /// Outputs K.
    pub k: usize,
}

/// Evaluations of one point at several times `t_r` (`n` nodes).
struct NodeEvals {
    /// Pooled activations with the bias column `[n, nf]`.
    a: Vec<f64>,
    /// Output sensitivities `δ_out[r, k, o] = ∂f^k/∂z_out[o]` `[n, K, K]`.
    dout: Vec<f64>,
    /// Conv gradients `G[r, k, o, :]` `[n, K, Co·ne]`.
    gc: Vec<f64>,
    /// The output map's `q` in `δ_out[r, k, o] = α(δ_ko − q[r, o])` `[n, K]` (softmax; 0 for
    /// the identity).
    q: Vec<f64>,
}

impl CnnStep {
    /// Builds the step from `w_s` and `w_{s+1}` (`None`: a zero step, for NTK/train-side use).
    pub fn new(arch: &Architecture, ws: &Params, next: Option<&Params>) -> Result<Self> {
        let Body::Cnn { image, channels, kernel, stride, padding, pool, outputs } = &arch.body else {
            return Err(Error::Config("the structured CNN kernel path needs a CNN".into()));
        };
        arch.check_params(ws)?;
        if let Some(n) = next {
            arch.check_params(n)?;
        }
        let g = arch.cnn_geometry()?;
        let (co, k, bias) = (*channels, *outputs, arch.bias);
        let kc = image[0] * kernel * kernel;
        let f = co * g.hp * g.wp;
        let (ne, nf) = (kc + usize::from(bias), f + usize::from(bias));
        // [W | b] of one layer at a state, `[out, ne]`.
        let ext = |p: &Params, w: &str, b: &str, out: usize, n_in: usize| -> Vec<f64> {
            let wv = p.get(w).expect("checked params");
            let mut v = Vec::with_capacity(out * (n_in + usize::from(bias)));
            for o in 0..out {
                v.extend_from_slice(&wv[o * n_in..(o + 1) * n_in]);
                if bias {
                    v.push(p.get(b).expect("checked params")[o]);
                }
            }
            v
        };
        let wc = ext(ws, "conv.weight", "conv.bias", co, kc);
        let wd = ext(ws, "dense.weight", "dense.bias", k, f);
        let (dwc, dwd) = match next {
            Some(n) => {
                let sub = |a: Vec<f64>, b: &[f64]| a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<f64>>();
                (sub(ext(n, "conv.weight", "conv.bias", co, kc), &wc), sub(ext(n, "dense.weight", "dense.bias", k, f), &wd))
            }
            None => (vec![0.0; wc.len()], vec![0.0; wd.len()]),
        };
        Ok(CnnStep {
            image: *image,
            kernel: *kernel,
            stride: *stride,
            padding: *padding,
            pool: *pool,
            ho: g.ho,
            wo: g.wo,
            hp: g.hp,
            wp: g.wp,
            co,
            ne,
            nf,
            wc,
            dwc,
            wd,
            dwd,
            activation: arch.activation,
            bias,
            alpha: arch.alpha,
            output: arch.output,
            k,
        })
    }

    /// Input dimension `C·H·W`.
    pub fn input_dim(&self) -> usize {
        self.image.iter().product()
    }

    fn positions(&self) -> usize {
        self.ho * self.wo
    }

    /// im2col patches of one image, position-major, with a ones column when there are biases.
    ///
    /// # Shapes
    /// `x` `[C·H·W]`; returns `[Ho·Wo, ne]`, entry `(pos, (c·k + i)·k + j)` = the input read by
    /// tap `(c, i, j)` at output position `pos = oh·Wo + ow` (0 in the padding).
    pub(super) fn patches(&self, x: &[f64]) -> Vec<f64> {
        let [c, h, w] = self.image;
        let (kk, ne) = (self.kernel, self.ne);
        let mut u = vec![0.0; self.positions() * ne];
        for oh in 0..self.ho {
            for ow in 0..self.wo {
                let row = &mut u[(oh * self.wo + ow) * ne..(oh * self.wo + ow + 1) * ne];
                for ci in 0..c {
                    for i in 0..kk {
                        let ih = (oh * self.stride + i).wrapping_sub(self.padding);
                        if ih >= h {
                            continue;
                        }
                        for j in 0..kk {
                            let iw = (ow * self.stride + j).wrapping_sub(self.padding);
                            if iw < w {
                                row[(ci * kk + i) * kk + j] = x[(ci * h + ih) * w + iw];
                            }
                        }
                    }
                }
                if self.bias {
                    row[ne - 1] = 1.0;
                }
            }
        }
        u
    }

    /// Conv pre-activations of one image along the step: `Z(t) = Z_0 + t·Z_1`.
    ///
    /// # Shapes
    /// `u` `[pos, ne]`; returns `(Z_0, Z_1)`, each `[pos, Co]`.
    pub(super) fn pre(&self, u: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (pos, co, ne) = (self.positions(), self.co, self.ne);
        let mut z0 = vec![0.0; pos * co];
        let mut z1 = vec![0.0; pos * co];
        gemm_abt(&mut z0, u, &self.wc, pos, co, ne, 1.0, false);
        gemm_abt(&mut z1, u, &self.dwc, pos, co, ne, 1.0, false);
        (z0, z1)
    }

    /// Pooled-feature index of conv position `pos` in channel `o` (NCHW flattening).
    #[inline]
    pub(super) fn pooled_index(&self, o: usize, pos: usize) -> usize {
        let (oh, ow) = (pos / self.wo, pos % self.wo);
        (o * self.hp + oh / self.pool) * self.wp + ow / self.pool
    }

    /// The max-pool at `t`: for each pooled feature `f` the largest post-activation value of its
    /// window into `best[f]` (which must start at −∞) and the conv output `q = pos·Co + o` it
    /// comes from into `arg[f]` (ties: the first, row-major within the window, as
    /// `model::conv::max_pool2d` routes its gradient).
    ///
    /// # Shapes
    /// `z0`, `z1` `[pos, Co]`; `best`, `arg` `[Co·Hp·Wp]`.
    pub(super) fn pool_at(&self, z0: &[f64], z1: &[f64], t: f64, best: &mut [f64], arg: &mut [usize]) {
        for p in 0..self.positions() {
            for o in 0..self.co {
                let q = p * self.co + o;
                let v = self.activation.apply(z0[q] + t * z1[q]);
                let f = self.pooled_index(o, p);
                if v > best[f] {
                    best[f] = v;
                    arg[f] = q;
                }
            }
        }
    }

    /// `α (z − offset)` followed by the output map, in place on `[n, K]`; returns the softmax
    /// (`[n, K]`, empty for the identity map).
    fn output_map(&self, z: &mut [f64], offset: Option<&[f64]>) -> Vec<f64> {
        let k = self.k;
        for row in z.chunks_mut(k) {
            for (c, v) in row.iter_mut().enumerate() {
                *v = self.alpha * (*v - offset.map_or(0.0, |o| o[c]));
            }
        }
        if self.output == OutputKind::LogSoftmax {
            crate::model::log_softmax_rows(z, k);
            z.iter().map(|v| v.exp()).collect()
        } else {
            Vec::new()
        }
    }

    /// Evaluates one point (patches `u`, pre-activation lines `z0`, `z1`) at times `t`, with
    /// `offset` (`[K]`) subtracted before scaling; returns also `f` `[n, K]`.
    fn eval_point(&self, u: &[f64], z0: &[f64], z1: &[f64], t: &[f64], offset: Option<&[f64]>) -> (NodeEvals, Vec<f64>) {
        let n = t.len();
        let (k, co, pos, nf, ne) = (self.k, self.co, self.positions(), self.nf, self.ne);
        let fdim = co * self.hp * self.wp;
        // Forward: activations and pool; the gate σ'(z) sits at each window's first maximum
        // (row-major within the window, as `model::conv::max_pool2d` routes its gradient).
        let mut a = vec![f64::NEG_INFINITY; n * nf];
        let mut gate = vec![0.0; n * pos * co];
        let mut arg = vec![0usize; fdim];
        for (r, &tr) in t.iter().enumerate() {
            let ar = &mut a[r * nf..(r + 1) * nf];
            self.pool_at(z0, z1, tr, &mut ar[..fdim], &mut arg);
            let gr = &mut gate[r * pos * co..(r + 1) * pos * co];
            for &q in &arg {
                gr[q] = self.activation.derivative(z0[q] + tr * z1[q]);
            }
            if self.bias {
                ar[nf - 1] = 1.0;
            }
        }
        // Dense: z_out = a W_dᵀ + t a ΔW_dᵀ.
        let mut out = vec![0.0; n * k];
        let mut out1 = vec![0.0; n * k];
        gemm_abt(&mut out, &a, &self.wd, n, k, nf, 1.0, false);
        gemm_abt(&mut out1, &a, &self.dwd, n, k, nf, 1.0, false);
        for r in 0..n {
            for c in 0..k {
                out[r * k + c] += t[r] * out1[r * k + c];
            }
        }
        let soft = self.output_map(&mut out, offset);
        let mut dout = vec![0.0; n * k * k];
        for r in 0..n {
            for kk in 0..k {
                for o in 0..k {
                    let e = if kk == o { 1.0 } else { 0.0 };
                    let v = if soft.is_empty() { e } else { e - soft[r * k + o] };
                    dout[(r * k + kk) * k + o] = self.alpha * v;
                }
            }
        }
        // Back to the pooled features: δ_pool = δ_out (W_d + tΔW_d)  [n·K, nf] (bias column unused).
        let mut dpool = vec![0.0; n * k * nf];
        let mut dpool1 = vec![0.0; n * k * nf];
        gemm_ab(&mut dpool, &dout, &self.wd, n * k, nf, k, 1.0, false);
        gemm_ab(&mut dpool1, &dout, &self.dwd, n * k, nf, k, 1.0, false);
        for r in 0..n {
            for (x, y) in dpool[r * k * nf..(r + 1) * k * nf].iter_mut().zip(&dpool1[r * k * nf..(r + 1) * k * nf]) {
                *x += t[r] * y;
            }
        }
        drop(dpool1);
        // Through the pool and the activation: δ_c[(r, k, o), pos].
        let mut dc = vec![0.0; n * k * co * pos];
        for r in 0..n {
            let gr = &gate[r * pos * co..(r + 1) * pos * co];
            for kk in 0..k {
                let dp = &dpool[(r * k + kk) * nf..(r * k + kk) * nf + fdim];
                let base = (r * k + kk) * co * pos;
                for p in 0..pos {
                    for o in 0..co {
                        let gv = gr[p * co + o];
                        if gv != 0.0 {
                            dc[base + o * pos + p] = gv * dp[self.pooled_index(o, p)];
                        }
                    }
                }
            }
        }
        // Conv gradients G = δ_c Ũ: [(r, k, o), ne].
        let mut gc = vec![0.0; n * k * co * ne];
        gemm_ab(&mut gc, &dc, u, n * k * co, ne, pos, 1.0, false);
        let q = if soft.is_empty() { vec![0.0; n * k] } else { soft };
        (NodeEvals { a, dout, gc, q }, out)
    }

    /// Forward-mode evaluation: `f_{w_s(t)}(x)` and its exact t-derivative, no backward pass.
    /// A pool window passes the derivative of its first maximal entry, like the gradient.
    ///
    /// # Shapes
    /// `x` `[R, C·H·W]`, `t` `[R]`, `offset` `[R, K]`; returns `(f [R, K], df/dt [R, K])`.
    pub fn jvp(&self, x: &[f64], t: &[f64], offset: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        let (k, co, pos, nf) = (self.k, self.co, self.positions(), self.nf);
        let d = self.input_dim();
        let rows: Vec<(Vec<f64>, Vec<f64>)> = t
            .par_iter()
            .enumerate()
            .map(|(r, &tr)| {
                let (z0, z1) = self.pre(&self.patches(&x[r * d..(r + 1) * d]));
                let mut a = vec![f64::NEG_INFINITY; nf];
                let mut adot = vec![0.0; nf];
                for p in 0..pos {
                    for o in 0..co {
                        let q = p * co + o;
                        let z = z0[q] + tr * z1[q];
                        let v = self.activation.apply(z);
                        let f = self.pooled_index(o, p);
                        if v > a[f] {
                            a[f] = v;
                            adot[f] = self.activation.derivative(z) * z1[q];
                        }
                    }
                }
                if self.bias {
                    a[nf - 1] = 1.0;
                    adot[nf - 1] = 0.0;
                }
                // z = (W_d + tΔW_d) a,  ż = ΔW_d a + (W_d + tΔW_d) ȧ.
                let mut z = vec![0.0; k];
                let mut zdot = vec![0.0; k];
                for c in 0..k {
                    let w = &self.wd[c * nf..(c + 1) * nf];
                    let dw = &self.dwd[c * nf..(c + 1) * nf];
                    let (mut s, mut sd) = (0.0, 0.0);
                    for j in 0..nf {
                        let wt = w[j] + tr * dw[j];
                        s += wt * a[j];
                        sd += dw[j] * a[j] + wt * adot[j];
                    }
                    z[c] = s;
                    zdot[c] = sd;
                }
                (z, zdot)
            })
            .collect();
        let mut f: Vec<f64> = rows.iter().flat_map(|(z, _)| z.iter().copied()).collect();
        let mut fdot: Vec<f64> = rows.iter().flat_map(|(_, zd)| zd.iter().map(|v| self.alpha * v)).collect();
        for (r, row) in f.chunks_mut(k).enumerate() {
            self.output_map(row, offset.map(|o| &o[r * k..(r + 1) * k]));
        }
        if self.output == OutputKind::LogSoftmax {
            for (row, fr) in fdot.chunks_mut(k).zip(f.chunks(k)) {
                let mean: f64 = row.iter().zip(fr).map(|(d, v)| v.exp() * d).sum();
                row.iter_mut().for_each(|d| *d -= mean);
            }
        }
        (f, fdot)
    }

    /// Kinks of the network along `t ∈ (a, b)` for the image `x` (`[C·H·W]`): the times where
    /// some pool window's maximum changes line. Within a window `max_j σ(Z_j(t)) =
    /// σ(max_j Z_j(t))` (σ monotone), each `Z_j` linear in t; the function and its gradient are
    /// smooth except where the upper envelope of the lines `{Z_j}` (and, for ReLU, the line 0)
    /// switches. Sorted, without duplicates.
    pub fn kinks(&self, x: &[f64], a: f64, b: f64) -> Vec<f64> {
        let (z0, z1) = self.pre(&self.patches(x));
        self.kinks_of(&z0, &z1, a, b)
    }

    /// [`CnnStep::kinks`] from the pre-activation lines `Z_0`, `Z_1` (`[pos, Co]`, [`CnnStep::pre`]).
    pub(super) fn kinks_of(&self, z0: &[f64], z1: &[f64], a: f64, b: f64) -> Vec<f64> {
        let co = self.co;
        let q = self.pool;
        let mut out = Vec::new();
        let mut lines: Vec<(f64, f64)> = Vec::with_capacity(q * q + 1);
        for o in 0..co {
            for ph in 0..self.hp {
                for pw in 0..self.wp {
                    lines.clear();
                    for i in 0..q {
                        for j in 0..q {
                            let p = (ph * q + i) * self.wo + pw * q + j;
                            lines.push((z0[p * co + o], z1[p * co + o]));
                        }
                    }
                    if self.activation == Activation::Relu {
                        lines.push((0.0, 0.0));
                    }
                    envelope_breaks(&lines, a, b, &mut out);
                }
            }
        }
        out.sort_by(|u, v| u.partial_cmp(v).expect("finite kinks"));
        out.dedup_by(|u, v| (*u - *v).abs() <= 1e-15);
        out
    }
}

/// Appends to `out` the times in `(a, b)` where the upper envelope of the lines
/// `c_0 + c_1 t` changes line (ties at a switch go to the steeper line, which is above after it).
fn envelope_breaks(lines: &[(f64, f64)], a: f64, b: f64, out: &mut Vec<f64>) {
    let value = |l: &(f64, f64), t: f64| l.0 + t * l.1;
    let mut cur = 0;
    for (j, l) in lines.iter().enumerate() {
        let (v, vc) = (value(l, a), value(&lines[cur], a));
        if v > vc || (v == vc && l.1 > lines[cur].1) {
            cur = j;
        }
    }
    let mut t = a;
    loop {
        let c = lines[cur];
        let mut best: Option<(f64, usize)> = None;
        for (j, l) in lines.iter().enumerate() {
            if l.1 > c.1 {
                let tc = (c.0 - l.0) / (l.1 - c.1);
                if tc > t && tc < b {
                    match best {
                        Some((bt, bj)) if tc > bt || (tc == bt && l.1 <= lines[bj].1) => {}
                        _ => best = Some((tc, j)),
                    }
                }
            }
        }
        match best {
            Some((tc, j)) => {
                out.push(tc);
                t = tc;
                cur = j;
            }
            None => return,
        }
    }
}

/// One side's factors at its nodes, by point.
pub(crate) struct SideFactors {
    /// Conv gradients summed over the point's nodes with their weights, `[n_pts, K, Co·ne]`.
    pub(crate) gc: Vec<f64>,
    /// Self-kernel of each point `Σ_r w_r ⟨∇f^k, ∇f^k'⟩` `[n_pts, K, K]`.
    pub(crate) diag: Vec<f64>,
}

/// Adds one CNN step's Gram `[P, M, K, K]` to `g` and the rows' self-kernel `[P, K, K]` to
/// `diag`, with the same arguments and result as [`super::generic::step_gram`]: row p's gradient
/// averaged over `nodes` (`(t, weight)` on `[0, 1]`, at `w_s(t)`), training gradients at `w_s`.
///
/// # Shapes
/// `rows` `[P, d]`, `x_train` `[M, d]`, `g` `[P, M, K, K]`, `diag` `[P, K, K]`.
#[allow(clippy::too_many_arguments)]
pub fn step_gram(
    arch: &Architecture,
    ws: &Params,
    next: Option<&Params>,
    init: &Params,
    rows: &[f64],
    nodes: &[(f64, f64)],
    x_train: &[f64],
    g: &mut [f64],
    diag: &mut [f64],
) -> Result<()> {
    let off_rows = offsets(arch, init, rows)?;
    let off_train = offsets(arch, init, x_train)?;
    let (d, k) = (arch.input_dim(), arch.outputs());
    let (p, m) = (rows.len() / d, x_train.len() / d);
    let mut sink = GramSink::new(Layout::Full, p, m, k);
    step_into(arch, ws, next, rows, off_rows.as_deref(), Some(nodes), 0.0, x_train, off_train.as_deref(), &mut sink, diag, &vec![0.0; m * k], None)?;
    g.iter_mut().zip(sink.finish()).for_each(|(a, b)| *a += b);
    Ok(())
}

/// The frozen initial network `g_{w_0}(x)` (`[n, K]`) when the architecture has `zero_output`.
pub(super) fn offsets(arch: &Architecture, init: &Params, x: &[f64]) -> Result<Option<Vec<f64>>> {
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
pub(super) fn side_factors(step: &CnnStep, x: &[f64], off: Option<&[f64]>, nodes: &[Vec<(f64, f64)>], train: bool) -> (SideFactors, Vec<f64>, Vec<f64>) {
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

/// How the rows' gradients over a step are formed.
enum RowSide<'a> {
    /// At quadrature nodes: node j belongs to point `point[j]` with weight `weight[j]` at time
    /// `times[j]` (ReLU: evaluated in the factored form of [`convpieces`], else by
    /// [`CnnStep`]'s backward pass).
    Nodes { point: &'a [usize], weight: &'a [f64], times: &'a [f64] },
    /// Integrated piece by piece between the kinks ([`convpieces`], ReLU only) to the per-step
    /// tolerance `tol`; fills the node statistics.
    Integrated { tol: f64 },
}

/// The Gram of one step for row points whose gradients are formed as `side` says (nodes may
/// differ per point). Adds to `sink` (any layout) and
/// `diag` `[P, K, K]`, and returns the step's kernel-machine prediction
/// `Σ_i Σ_k' a[i, k'] K_s[p, i, k, k']` `[P, K]` contracted from the factors (no layout needs the
/// off-diagonal blocks for it). `colw` (`[M, K]`) scales the stored Gram's training gradients
/// (Chen's kernel), not the prediction. Offsets (`zero_output`) are `[P, K]` and `[M, K]`.
#[allow(clippy::too_many_arguments)]
fn step_into_at(
    step: &CnnStep,
    rows: &[f64],
    off_rows: Option<&[f64]>,
    side: &RowSide<'_>,
    stats: &mut NodeStats,
    x_train: &[f64],
    off_train: Option<&[f64]>,
    sink: &mut GramSink,
    diag: &mut [f64],
    a: &[f64],
    colw: Option<&[f64]>,
) -> Vec<f64> {
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
    let mut nodes_of: Vec<Vec<(f64, f64)>> = vec![Vec::new(); p];
    if let RowSide::Nodes { point, weight, times } = side {
        for ((&pi, &w), &t) in point.iter().zip(*weight).zip(*times) {
            nodes_of[pi].push((t, w));
        }
    }
    let mut pred = vec![0.0; p * k];
    let mut t = Vec::new();
    let pb = (BLOCK_BYTES / 8 / ((k + 1) * nf.max(m)).max(1)).clamp(1, p.max(1));
    for p0 in (0..p).step_by(pb) {
        let nb = pb.min(p - p0);
        let (xb, ob) = (&rows[p0 * d..(p0 + nb) * d], off_rows.map(|o| &o[p0 * k..(p0 + nb) * k]));
        let (rf, ab) = match side {
            // ReLU: each node's gradient in the factored form of its pattern.
            RowSide::Nodes { .. } if convpieces::applies(step) => {
                let measures: Vec<Measure<'_>> = nodes_of[p0..p0 + nb].iter().map(|v| Measure::Nodes(v)).collect();
                let (rf, ab, _) = convpieces::row_factors(step, xb, ob, &measures);
                (rf, ab)
            }
            RowSide::Nodes { .. } => {
                let (rf, ab, _) = side_factors(step, xb, ob, &nodes_of[p0..p0 + nb], false);
                (rf, ab)
            }
            RowSide::Integrated { tol } => {
                let (rf, ab, st) = convpieces::row_factors(step, xb, ob, &vec![Measure::Exact { tol: *tol }; nb]);
                for (pieces, bad) in st {
                    stats.evaluations.push(convpieces::EVALUATIONS);
                    stats.jvp_evaluations.push(pieces);
                    stats.pieces.push(pieces);
                    stats.unconverged += bad;
                }
                (rf, ab)
            }
        };
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
    pred
}

impl super::AlongPath for CnnStep {
    fn outputs(&self) -> usize {
        self.k
    }
    fn kinks(&self, x: &[f64], p: usize, a: f64, b: f64) -> Vec<f64> {
        let d = self.input_dim();
        CnnStep::kinks(self, &x[p * d..(p + 1) * d], a, b)
    }
    fn jvp_points(&self, x: &[f64], idx: &[usize], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        let (d, k) = (self.input_dim(), self.k);
        CnnStep::jvp(self, &super::nodes::gather_rows(x, d, idx), t, super::nodes::gather_offsets(off, k, idx).as_deref())
    }
}

/// Gradient evaluations spent on one step, per row point.
#[derive(Clone, Debug, Default)]
pub struct NodeStats {
    /// Gradient evaluations (quadrature nodes) per point `[P]`; for ReLU CNN rows integrated
    /// between kinks (the auto rule), the two backward passes forming `∇z(t)`.
    pub evaluations: Vec<usize>,
    /// Forward-mode evaluations spent choosing the nodes (auto rule) `[P]`; for ReLU CNN rows
    /// integrated between kinks, one forward pass (pattern and logits) per piece.
    pub jvp_evaluations: Vec<usize>,
    /// Smooth pieces per point `[P]`.
    pub pieces: Vec<usize>,
    /// Pieces that did not reach the tolerance.
    pub unconverged: usize,
}

/// One CNN step of the engine: the rows' nodes from the fixed rule `fixed` (`(t, weight)`
/// pairs, the same for every point) or, when `None`, from the adaptive rule with per-step
/// tolerance `tol_step` (ReLU: the rows integrated between kinks, [`convpieces`]); then the Gram into `sink` (any layout), the self-kernel into `diag` and
/// the step's kernel-machine prediction for training weights `a`, as in [`step_into_at`].
///
/// # Shapes
/// `rows` `[P, d]`, `off_rows` `[P, K]`, `x_train` `[M, d]`, `off_train` `[M, K]`,
/// `diag` `[P, K, K]`, `a` and `colw` `[M, K]`; returns `[P, K]`.
#[allow(clippy::too_many_arguments)]
pub fn step_into(
    arch: &Architecture,
    ws: &Params,
    next: Option<&Params>,
    rows: &[f64],
    off_rows: Option<&[f64]>,
    fixed: Option<&[(f64, f64)]>,
    tol_step: f64,
    x_train: &[f64],
    off_train: Option<&[f64]>,
    sink: &mut GramSink,
    diag: &mut [f64],
    a: &[f64],
    colw: Option<&[f64]>,
) -> Result<(Vec<f64>, NodeStats)> {
    let step = CnnStep::new(arch, ws, next)?;
    let p = rows.len() / step.input_dim();
    let (point, weight, times, mut stats) = match fixed {
        Some(nodes) => {
            let (mut point, mut weight, mut times) = (Vec::new(), Vec::new(), Vec::new());
            for pi in 0..p {
                for &(t, w) in nodes {
                    point.push(pi);
                    weight.push(w);
                    times.push(t);
                }
            }
            (point, weight, times, NodeStats { evaluations: vec![nodes.len(); p], jvp_evaluations: vec![0; p], pieces: vec![1; p], unconverged: 0 })
        }
        None if convpieces::applies(&step) => (Vec::new(), Vec::new(), Vec::new(), NodeStats::default()),
        None => {
            let c = super::choose_auto_nodes(&step, rows, p, off_rows, tol_step);
            let stats = NodeStats { evaluations: c.evaluations, jvp_evaluations: c.jvp_evaluations, pieces: c.pieces, unconverged: c.unconverged };
            (c.point, c.weight, c.times, stats)
        }
    };
    let side = if fixed.is_none() && convpieces::applies(&step) {
        RowSide::Integrated { tol: tol_step }
    } else {
        RowSide::Nodes { point: &point, weight: &weight, times: &times }
    };
    let pred = step_into_at(&step, rows, off_rows, &side, &mut stats, x_train, off_train, sink, diag, a, colw);
    Ok((pred, stats))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kernel::{generic, quadrature};
    use crate::model::{conv, ModelConfig};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// `(image, channels, kernel, stride, padding, pool, activation, bias, zero_output, alpha,
    /// output, K)`.
    pub(crate) type Case = ([usize; 3], usize, usize, usize, usize, usize, Activation, bool, bool, f64, OutputKind, usize);

    pub(crate) fn cases() -> Vec<Case> {
        vec![
            ([1, 8, 8], 2, 3, 1, 0, 2, Activation::Relu, true, false, 1.0, OutputKind::LogSoftmax, 3),
            ([2, 7, 7], 3, 3, 2, 1, 2, Activation::Tanh, false, false, 1.0, OutputKind::LogSoftmax, 3),
            ([3, 9, 7], 2, 2, 1, 0, 2, Activation::Relu, true, true, 2.0, OutputKind::Identity, 2),
            ([1, 9, 9], 3, 3, 1, 1, 3, Activation::Relu, true, false, 0.7, OutputKind::LogSoftmax, 4),
            ([2, 10, 10], 1, 4, 2, 0, 2, Activation::Tanh, true, true, 1.0, OutputKind::LogSoftmax, 2),
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

    #[test]
    fn step_gram_equals_generic_autodiff() {
        let mut worst: f64 = 0.0;
        for (ci, c) in cases().iter().enumerate() {
            let (arch, init, ws, next, rows, train) = setup(c, 10 + ci as u64);
            let (p, m, k) = (rows.len() / arch.input_dim(), train.len() / arch.input_dim(), arch.outputs());
            let gauss3 = quadrature::Rule::Gauss(3).fixed_nodes().unwrap();
            for (name, nx, nodes) in [("ntk", None, vec![(0.0, 1.0)]), ("gauss:3", Some(&next), gauss3)] {
                let mut g_fast = vec![0.0; p * m * k * k];
                let mut d_fast = vec![0.0; p * k * k];
                step_gram(&arch, &ws, nx, &init, &rows, &nodes, &train, &mut g_fast, &mut d_fast).unwrap();
                let mut g_slow = vec![0.0; p * m * k * k];
                let mut d_slow = vec![0.0; p * k * k];
                generic::step_gram(&arch, &ws, nx, &init, &rows, &nodes, &train, &mut g_slow, &mut d_slow).unwrap();
                let (eg, ed) = (rel(&g_fast, &g_slow), rel(&d_fast, &d_slow));
                assert!(eg <= 1e-12 && ed <= 1e-12, "case {ci} {name}: gram {eg:e}, diag {ed:e}");
                worst = worst.max(eg).max(ed);
            }
        }
        eprintln!("convgram vs generic: max relative difference {worst:e}");
    }

    #[test]
    fn jvp_matches_forward_and_finite_differences() {
        for (ci, c) in cases().iter().enumerate() {
            let (arch, init, ws, next, rows, _) = setup(c, 20 + ci as u64);
            let step = CnnStep::new(&arch, &ws, Some(&next)).unwrap();
            let d = arch.input_dim();
            let p = rows.len() / d;
            let off = offsets(&arch, &init, &rows).unwrap();
            let f_at = |t: f64| -> Vec<f64> { arch.forward(&generic::interpolate(&ws, Some(&next), t), Some(&init), &rows).unwrap() };
            let mut checked = 0;
            for &t in &[0.0, 0.37, 0.81, 0.5] {
                let (f, fdot) = step.jvp(&rows, &vec![t; p], off.as_deref());
                assert!(rel(&f, &f_at(t)) <= 1e-13, "case {ci}: f at t = {t}");
                // Central differences inside one smooth piece only.
                let h = 1e-6;
                let smooth = (0..p).all(|pi| step.kinks(&rows[pi * d..(pi + 1) * d], t - h, t + h).is_empty());
                if smooth {
                    let (up, down) = (f_at(t + h), f_at(t - h));
                    let fd: Vec<f64> = up.iter().zip(&down).map(|(a, b)| (a - b) / (2.0 * h)).collect();
                    assert!(rel(&fdot, &fd) <= 1e-6, "case {ci}: df/dt at t = {t}");
                    checked += 1;
                }
            }
            assert!(checked > 0, "case {ci}: no smooth point for the finite-difference check");
        }
    }

    /// The pool pattern at t: for every window, the argmax position (or "none" when ReLU zeroes
    /// the window).
    fn pattern(arch: &Architecture, ws: &Params, next: &Params, x: &[f64], t: f64) -> Vec<Option<usize>> {
        let Body::Cnn { image, channels, kernel, stride, padding, pool, .. } = arch.body else { unreachable!() };
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
                    out.push(if arch.activation == Activation::Relu && best.0 <= 0.0 { None } else { Some(best.1) });
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
            let step = CnnStep::new(&arch, &ws, Some(&next)).unwrap();
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

    #[test]
    fn envelope_of_three_lines() {
        // y = 0, y = 2t − 1, y = −t + 0.5: envelope −t+0.5 until t = 0.5 (tie with 0 → the steeper
        // 0 line), then 0 until t = 0.5 (2t − 1 = 0)… the 2t−1 line takes over at t = 0.5 too.
        let mut out = Vec::new();
        envelope_breaks(&[(0.0, 0.0), (-1.0, 2.0), (0.5, -1.0)], 0.0, 1.0, &mut out);
        assert_eq!(out, vec![0.5]);
        out.clear();
        envelope_breaks(&[(0.0, 0.0), (-1.5, 2.0), (0.25, -1.0)], 0.0, 1.0, &mut out);
        assert_eq!(out, vec![0.25, 0.75]);
    }
}
