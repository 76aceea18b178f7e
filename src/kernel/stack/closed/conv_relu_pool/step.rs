//! [`CnnStep`]: the stack `conv2d → relu → max_pool2d → flatten → dense` on one step
//! `w_s(t) = w_s + tΔw` in the factors its closed form needs: im2col patches, pre-activations affine in t, the
//! backward pass at given times (the training side at `w_s`, and the tests' slow reference), and
//! the kinks (where a pool window's upper envelope changes line). The rows integrated between
//! the kinks ([`super::pieces`]) and the Gram ([`super::gram`]) build on it.

use crate::linalg::{gemm_ab, gemm_abt};
use crate::error::Result;
use crate::kernel::stack::closed::shape::{tensors, ConvReluPool};
use crate::model::{Activation, OutputKind, Params};

/// A CNN on one step `w_s(t) = w_s + tΔw`, in the factors the Gram needs.
#[derive(Clone, Debug)]
pub(crate) struct CnnStep {
    /// Input image `[C, H, W]`.
    pub(in crate::kernel) image: [usize; 3],
    /// Kernel size, stride, padding, pool window.
    pub(in crate::kernel) kernel: usize,
    pub(in crate::kernel) stride: usize,
    pub(in crate::kernel) padding: usize,
    pub(in crate::kernel) pool: usize,
    /// Conv output `Ho, Wo` and pooled `Hp, Wp`.
    pub(in crate::kernel) ho: usize,
    pub(in crate::kernel) wo: usize,
    pub(in crate::kernel) hp: usize,
    pub(in crate::kernel) wp: usize,
    /// Channels Co.
    pub(in crate::kernel) co: usize,
    /// Patch width `ne = C·k·k + [bias]`.
    pub(in crate::kernel) ne: usize,
    /// Dense input width with the bias column `nf = Co·Hp·Wp + [bias]`.
    pub(in crate::kernel) nf: usize,
    /// `[W_c | b_c]` `[Co, ne]` and its step `Δ`.
    pub(in crate::kernel) wc: Vec<f64>,
    pub(in crate::kernel) dwc: Vec<f64>,
    /// `[W_d | b_d]` `[K, nf]` and its step `Δ`.
    pub(in crate::kernel) wd: Vec<f64>,
    pub(in crate::kernel) dwd: Vec<f64>,
    pub(in crate::kernel) bias: bool,
    pub(in crate::kernel) alpha: f64,
    pub(in crate::kernel) output: OutputKind,
    /// Outputs K.
    pub k: usize,
}

/// Evaluations of one point at several times `t_r` (`n` nodes).
pub(in crate::kernel) struct NodeEvals {
    /// Pooled activations with the bias column `[n, nf]`.
    pub(in crate::kernel) a: Vec<f64>,
    /// Output sensitivities `δ_out[r, k, o] = ∂f^k/∂z_out[o]` `[n, K, K]`.
    pub(in crate::kernel) dout: Vec<f64>,
    /// Conv gradients `G[r, k, o, :]` `[n, K, Co·ne]`.
    pub(in crate::kernel) gc: Vec<f64>,
    /// The output map's `q` in `δ_out[r, k, o] = α(δ_ko − q[r, o])` `[n, K]` (softmax; 0 for
    /// the identity).
    pub(in crate::kernel) q: Vec<f64>,
}

impl CnnStep {
    /// Builds the step of the stack `shape` from `w_s` and `w_{s+1}` (`None`: a zero step, for
    /// the training side at `w_s`), its tensors read by position.
    ///
    /// # Errors
    /// [`crate::error::Error::Data`] if a state's tensors do not have the shape's sizes.
    pub(crate) fn new(shape: &ConvReluPool, ws: &Params, next: Option<&Params>) -> Result<Self> {
        let ConvReluPool { image, channels: co, kernel, stride, padding, pool, ho, wo, k, bias, .. } = *shape;
        let kc = image[0] * kernel * kernel;
        let (hp, wp) = (ho / pool, wo / pool);
        let f = co * hp * wp;
        let (ne, nf) = (kc + usize::from(bias), f + usize::from(bias));
        let lens: Vec<usize> = if bias { vec![co * kc, co, k * f, k] } else { vec![co * kc, k * f] };
        // [W | b] of one layer (tensor j, and its bias j + 1) at a state, `[out, ne]`.
        let ext = |t: &[Vec<f64>], j: usize, out: usize, n_in: usize| -> Vec<f64> {
            let mut v = Vec::with_capacity(out * (n_in + usize::from(bias)));
            for o in 0..out {
                v.extend_from_slice(&t[j][o * n_in..(o + 1) * n_in]);
                if bias {
                    v.push(t[j + 1][o]);
                }
            }
            v
        };
        let dense = if bias { 2 } else { 1 };
        let ts = tensors(ws, &lens)?;
        let wc = ext(ts, 0, co, kc);
        let wd = ext(ts, dense, k, f);
        let (dwc, dwd) = match next {
            Some(n) => {
                let tn = tensors(n, &lens)?;
                let sub = |a: Vec<f64>, b: &[f64]| a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<f64>>();
                (sub(ext(tn, 0, co, kc), &wc), sub(ext(tn, dense, k, f), &wd))
            }
            None => (vec![0.0; wc.len()], vec![0.0; wd.len()]),
        };
        Ok(CnnStep { image, kernel, stride, padding, pool, ho, wo, hp, wp, co, ne, nf, wc, dwc, wd, dwd, bias, alpha: shape.alpha, output: shape.output, k })
    }

    /// Input dimension `C·H·W`.
    pub(crate) fn input_dim(&self) -> usize {
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
    pub(in crate::kernel) fn patches(&self, x: &[f64]) -> Vec<f64> {
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
    pub(in crate::kernel) fn pre(&self, u: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (pos, co, ne) = (self.positions(), self.co, self.ne);
        let mut z0 = vec![0.0; pos * co];
        let mut z1 = vec![0.0; pos * co];
        gemm_abt(&mut z0, u, &self.wc, pos, co, ne, 1.0, false);
        gemm_abt(&mut z1, u, &self.dwc, pos, co, ne, 1.0, false);
        (z0, z1)
    }

    /// Pooled-feature index of conv position `pos` in channel `o` (NCHW flattening).
    #[inline]
    pub(in crate::kernel) fn pooled_index(&self, o: usize, pos: usize) -> usize {
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
    pub(in crate::kernel) fn pool_at(&self, z0: &[f64], z1: &[f64], t: f64, best: &mut [f64], arg: &mut [usize]) {
        for p in 0..self.positions() {
            for o in 0..self.co {
                let q = p * self.co + o;
                let v = Activation::Relu.apply(z0[q] + t * z1[q]);
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
    pub(in crate::kernel) fn eval_point(&self, u: &[f64], z0: &[f64], z1: &[f64], t: &[f64], offset: Option<&[f64]>) -> (NodeEvals, Vec<f64>) {
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
                gr[q] = Activation::Relu.derivative(z0[q] + tr * z1[q]);
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

    /// Kinks of the network along `t ∈ (a, b)` for the image `x` (`[C·H·W]`): the times where
    /// some pool window's maximum changes line. Within a window `max_j σ(Z_j(t)) =
    /// σ(max_j Z_j(t))` (σ monotone), each `Z_j` linear in t; the function and its gradient are
    /// smooth except where the upper envelope of the lines `{Z_j}` (and, for ReLU, the line 0)
    /// switches. Sorted, without duplicates.
    #[cfg(test)]
    pub(crate) fn kinks(&self, x: &[f64], a: f64, b: f64) -> Vec<f64> {
        let (z0, z1) = self.pre(&self.patches(x));
        self.kinks_of(&z0, &z1, a, b)
    }

    /// The kinks (as `CnnStep::kinks`, which computes the lines first) from the pre-activation
    /// lines `Z_0`, `Z_1` (`[pos, Co]`, [`CnnStep::pre`]).
    pub(in crate::kernel) fn kinks_of(&self, z0: &[f64], z1: &[f64], a: f64, b: f64) -> Vec<f64> {
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
                    // The ReLU's zero line: max_j relu(Z_j) = relu(max_j Z_j).
                    lines.push((0.0, 0.0));
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

#[cfg(test)]
mod tests {
    use super::*;

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
