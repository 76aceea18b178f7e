//! `self_attention`: multi-head scaled dot-product self-attention on a sequence `[T, d]`, each
//! head with its own input projections and its own output projection, the heads' outputs summed
//! (ExPLAIND's grokking transformer; the same function as PyTorch's concatenated heads followed
//! by one `out_proj`, whose column block h is head h's decoder).
//!
//! For head h with projections `W_q, W_k, W_v` `[d_h, d]` (one shared `W` when `shared_qkv`, as
//! ExPLAIND's `head{h}_encoder`) and decoder `D` `[d, d_h]`, on `X` `[T, d]`:
//!
//! ```text
//! Q = X W_qᵀ (+ b_q), K = X W_kᵀ (+ b_k), V = X W_vᵀ (+ b_v)       [T, d_h]
//! P = softmax_rows(Q Kᵀ / √d_h)  (masked to j ≤ i when causal)     [T, T]
//! Y = Σ_h (P V) Dᵀ (+ b_D)                                          [T, d]
//! ```
//!
//! Parameters, in storage order: every head's encoders (`head{h}_encoder.weight` and its `bias`
//! when shared, else `head{h}_query`, `head{h}_key`, `head{h}_value`), then every head's
//! `head{h}_decoder` (h = 1..H, ExPLAIND's names and order). Smooth and not polynomial along a
//! step ([`Along::Smooth`]): the kink sweep stops here and kinks behind it are located by
//! Newton's method on the probe. Its per-sample gradients are formed, one per linear map (a
//! weight and its bias: a parameter layer of the kernel engine), `[n, K, W_j]`.
//!
//! The derivatives, per sample and head (`c = 1/√d_h`, `S = c·Q Kᵀ`, `O = P V`):
//! tangent `Ṡ = c(Q̇ Kᵀ + Q K̇ᵀ)`, `Ṗ = P ⊙ (Ṡ − rowsum(P ⊙ Ṡ))`, `Ȯ = Ṗ V + P V̇`,
//! `Ẏ = Ȯ Dᵀ + O ΔDᵀ + Δb_D`; backward `dO = dY D`, `dD = dYᵀ O`, `dP = dO Vᵀ`, `dV = Pᵀ dO`,
//! `dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dQ = c·dS K`, `dK = c·dSᵀ Q`, `dW_q = dQᵀ X`,
//! `dX = dQ W_q + dK W_k + dV W_v`.

use dfdx::prelude::*;

use super::autodiff::{seq, Activations};
use serde_json::{json, Value};

use super::contract::{add_scaled_rows, Along, At, KindSpec, Layer, Poly, Probe, Sweep};
use super::recorded::{boolean, uint};
use super::spec::{as_bool, as_size, err, need, options};
use super::{uniform, AnyLayer, Cache, Grad, Shape};
use crate::linalg::{gemm, gemm_abt};
use crate::model::tensors::ParamTensor;
use crate::model::ParamSpec;

/// A resolved self-attention layer on sequences of `t` positions of `d` features.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Attention {
    pub t: usize,
    pub d: usize,
    pub heads: usize,
    pub dh: usize,
    pub shared: bool,
    pub bias: bool,
    pub causal: bool,
}

/// One head's intermediate values for a batch: `q, k, v`, `o` `[n, T, d_h]`, `p` `[n, T, T]`.
#[derive(Clone, Default)]
pub(crate) struct HeadCache {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    p: Vec<f64>,
    o: Vec<f64>,
}

/// What the backward pass needs: the input `[n, T, d]` and every head's values.
#[derive(Debug)]
pub(crate) struct AttentionCache {
    x: Vec<f64>,
    heads: Vec<HeadCache>,
}

impl std::fmt::Debug for HeadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeadCache({} values)", self.q.len() + self.k.len() + self.v.len() + self.p.len() + self.o.len())
    }
}

/// Which input projection.
#[derive(Clone, Copy)]
enum Proj {
    Q = 0,
    K = 1,
    V = 2,
}

impl Attention {
    /// Tensors per linear map (weight, and bias when it has one).
    fn per_linear(&self) -> usize {
        1 + usize::from(self.bias)
    }

    /// Input projections per head (1 when shared).
    fn projections(&self) -> usize {
        if self.shared {
            1
        } else {
            3
        }
    }

    /// Storage index (relative to the layer) of head h's projection `which`'s weight.
    fn enc(&self, h: usize, which: Proj) -> usize {
        let j = if self.shared { 0 } else { which as usize };
        (h * self.projections() + j) * self.per_linear()
    }

    /// Storage index of head h's decoder weight.
    fn dec(&self, h: usize) -> usize {
        (self.heads * self.projections() + h) * self.per_linear()
    }

    /// Names (relative) and shapes of every tensor, in storage order.
    fn named_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let mut v = Vec::new();
        let lin = |v: &mut Vec<(String, Vec<usize>)>, name: String, out: usize, inp: usize| {
            v.push((format!("{name}.weight"), vec![out, inp]));
            if self.bias {
                v.push((format!("{name}.bias"), vec![out]));
            }
        };
        for h in 1..=self.heads {
            if self.shared {
                lin(&mut v, format!("head{h}_encoder"), self.dh, self.d);
            } else {
                for p in ["query", "key", "value"] {
                    lin(&mut v, format!("head{h}_{p}"), self.dh, self.d);
                }
            }
        }
        for h in 1..=self.heads {
            lin(&mut v, format!("head{h}_decoder"), self.d, self.dh);
        }
        v
    }

    /// Numbers in all its tensors.
    fn width(&self) -> usize {
        self.heads * (self.projections() * (self.dh * self.d + if self.bias { self.dh } else { 0 }) + self.d * self.dh + if self.bias { self.d } else { 0 })
    }

    /// Offset of tensor `i` (relative) in the layer's flattened parameters.
    fn offset_of(&self, i: usize) -> usize {
        self.named_tensors()[..i].iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }

    /// `x W(t_s)ᵀ (+ b(t_s))` over rows of `T` positions, each sample at its own t: tensor `first
    /// + wi` is `W` `[dout, din]`, the next one its bias when `bias`.
    ///
    /// # Shapes
    /// `x` `[n, T, din]`; returns `[n, T, dout]`.
    fn apply(&self, at: &At, wi: usize, x: &[f64], din: usize, dout: usize, bias: bool) -> Vec<f64> {
        let rows = x.len() / din;
        let mut y = vec![0.0; rows * dout];
        gemm_abt(&mut y, x, at.w(wi), rows, dout, din, 1.0, false);
        if bias && self.bias {
            add_rows(&mut y, at.w(wi + 1));
        }
        if let Some((dw, t)) = at.offset(wi) {
            let mut y1 = vec![0.0; rows * dout];
            gemm_abt(&mut y1, x, dw, rows, dout, din, 1.0, false);
            if bias && self.bias {
                if let Some((db, _)) = at.offset(wi + 1) {
                    add_rows(&mut y1, db);
                }
            }
            add_scaled_rows(&mut y, &y1, t, self.t * dout);
        }
        y
    }

    /// The direction term `x ΔWᵀ + Δb` (zeros without a direction).
    fn direction(&self, at: &At, wi: usize, x: &[f64], din: usize, dout: usize) -> Vec<f64> {
        let rows = x.len() / din;
        let mut y = vec![0.0; rows * dout];
        if let Some(dw) = at.dw(wi) {
            gemm_abt(&mut y, x, dw, rows, dout, din, 1.0, false);
            if self.bias {
                add_rows(&mut y, at.dw(wi + 1).expect("a direction covers every tensor"));
            }
        }
        y
    }

    /// `dy W(t_s)` for cotangent rows, `per` rows to a sample.
    ///
    /// # Shapes
    /// `dy` `[rows, dout]`, `W` `[dout, din]`; returns `[rows, din]`.
    fn apply_t(&self, at: &At, wi: usize, dy: &[f64], din: usize, dout: usize, per: usize) -> Vec<f64> {
        let rows = dy.len() / dout;
        let mut dx = vec![0.0; rows * din];
        gemm(&mut dx, dy, false, at.w(wi), false, (rows, din, dout), 1.0, false);
        if let Some((dw, t)) = at.offset(wi) {
            let mut d1 = vec![0.0; rows * din];
            gemm(&mut d1, dy, false, dw, false, (rows, din, dout), 1.0, false);
            add_scaled_rows(&mut dx, &d1, t, per * din);
        }
        dx
    }

    /// Whether position i attends to position j.
    fn sees(&self, i: usize, j: usize) -> bool {
        !self.causal || j <= i
    }

    /// `P = softmax(c·Q Kᵀ)` and `O = P V` per sample.
    ///
    /// # Shapes
    /// `q, k, v` `[n, T, d_h]`; returns `p` `[n, T, T]` and `o` `[n, T, d_h]`.
    fn core(&self, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (t, dh) = (self.t, self.dh);
        let c = 1.0 / (dh as f64).sqrt();
        let n = q.len() / (t * dh);
        let mut p = vec![0.0; n * t * t];
        let mut o = vec![0.0; n * t * dh];
        for s in 0..n {
            let (qs, ks, vs) = (&q[s * t * dh..(s + 1) * t * dh], &k[s * t * dh..(s + 1) * t * dh], &v[s * t * dh..(s + 1) * t * dh]);
            for i in 0..t {
                let row = &mut p[(s * t + i) * t..(s * t + i + 1) * t];
                let qi = &qs[i * dh..(i + 1) * dh];
                let mut max = f64::NEG_INFINITY;
                for j in (0..t).filter(|&j| self.sees(i, j)) {
                    row[j] = c * dot(qi, &ks[j * dh..(j + 1) * dh]);
                    max = max.max(row[j]);
                }
                let mut sum = 0.0;
                for j in 0..t {
                    row[j] = if self.sees(i, j) { (row[j] - max).exp() } else { 0.0 };
                    sum += row[j];
                }
                row.iter_mut().for_each(|e| *e /= sum);
                let oi = &mut o[(s * t + i) * dh..(s * t + i + 1) * dh];
                for j in 0..t {
                    oi.iter_mut().zip(&vs[j * dh..(j + 1) * dh]).for_each(|(a, b)| *a += row[j] * b);
                }
            }
        }
        (p, o)
    }

    /// Forward pass: the output `[n, T, d]` and every head's values.
    fn run(&self, first: usize, at: &At, x: &[f64]) -> (Vec<f64>, Vec<HeadCache>) {
        let (d, dh) = (self.d, self.dh);
        let mut y = vec![0.0; x.len()];
        let mut heads = Vec::with_capacity(self.heads);
        for h in 0..self.heads {
            let q = self.apply(at, first + self.enc(h, Proj::Q), x, d, dh, true);
            let (k, v) = if self.shared {
                (q.clone(), q.clone())
            } else {
                (self.apply(at, first + self.enc(h, Proj::K), x, d, dh, true), self.apply(at, first + self.enc(h, Proj::V), x, d, dh, true))
            };
            let (p, o) = self.core(&q, &k, &v);
            let yh = self.apply(at, first + self.dec(h), &o, dh, d, true);
            y.iter_mut().zip(&yh).for_each(|(a, b)| *a += b);
            heads.push(HeadCache { q, k, v, p, o });
        }
        (y, heads)
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn add_rows(y: &mut [f64], b: &[f64]) {
    y.chunks_exact_mut(b.len()).for_each(|r| r.iter_mut().zip(b).for_each(|(u, v)| *u += v));
}

fn add(a: &mut [f64], b: &[f64]) {
    a.iter_mut().zip(b).for_each(|(u, v)| *u += v);
}

impl Layer for Attention {
    fn torch(&self) -> String {
        format!(
            "SelfAttention({}, heads={}, head_dim={}, shared_qkv={}, bias={}, causal={})",
            self.d,
            self.heads,
            self.dh,
            py_bool(self.shared),
            py_bool(self.bias),
            py_bool(self.causal)
        )
    }

    /// The count and shapes (the names are [`Layer::param_specs`]'s, which knows the heads).
    fn tensors(&self) -> Vec<(&'static str, Vec<usize>)> {
        self.named_tensors().into_iter().map(|(_, s)| ("", s)).collect()
    }

    fn param_specs(&self, prefix: &str, out: &mut Vec<ParamSpec>) {
        out.extend(self.named_tensors().into_iter().map(|(name, shape)| ParamSpec { name: format!("{prefix}{name}"), shape }));
    }

    /// PyTorch's `nn.Linear` default for every projection: uniform in `±1/√fan_in`.
    fn init(&self, rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) {
        for (_, shape) in self.named_tensors() {
            let fan_in = if shape.len() == 2 { shape[1] } else if shape[0] == self.dh { self.d } else { self.dh };
            uniform(rng, shape.iter().product(), fan_in, data);
        }
    }

    fn along(&self) -> Along {
        Along::Smooth
    }

    fn forward(&self, first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let (y, heads) = self.run(first, at, &x);
        (y, if keep { Cache::Attention(Box::new(AttentionCache { x, heads })) } else { Cache::None })
    }

    fn tangent(&self, first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        let (y, heads) = self.run(first, at, &x);
        if at.dw.is_none() && xd.is_none() {
            return (y, None);
        }
        let (t, d, dh) = (self.t, self.d, self.dh);
        let c = 1.0 / (dh as f64).sqrt();
        let n = x.len() / (t * d);
        // Q̇ = Ẋ W(t)ᵀ + X ΔWᵀ + Δb.
        let dot_of = |wi: usize| {
            let mut z = self.direction(at, wi, &x, d, dh);
            if let Some(xd) = xd.as_deref() {
                add(&mut z, &self.apply(at, wi, xd, d, dh, false));
            }
            z
        };
        let mut yd = vec![0.0; x.len()];
        for (h, hc) in heads.iter().enumerate() {
            let qd = dot_of(first + self.enc(h, Proj::Q));
            let (kd, vd) = if self.shared { (qd.clone(), qd.clone()) } else { (dot_of(first + self.enc(h, Proj::K)), dot_of(first + self.enc(h, Proj::V))) };
            let mut od = vec![0.0; n * t * dh];
            let mut sd = vec![0.0; t];
            for s in 0..n {
                let r = |i: usize| (s * t + i) * dh..(s * t + i + 1) * dh;
                for i in 0..t {
                    let prow = &hc.p[(s * t + i) * t..(s * t + i + 1) * t];
                    let mut mean = 0.0;
                    for j in 0..t {
                        sd[j] = if self.sees(i, j) {
                            c * (dot(&qd[r(i)], &hc.k[r(j)]) + dot(&hc.q[r(i)], &kd[r(j)]))
                        } else {
                            0.0
                        };
                        mean += prow[j] * sd[j];
                    }
                    let oi = &mut od[r(i)];
                    for j in 0..t {
                        let pd = prow[j] * (sd[j] - mean);
                        let (vj, vdj) = (&hc.v[r(j)], &vd[r(j)]);
                        oi.iter_mut().zip(vj.iter().zip(vdj)).for_each(|(a, (v, vdot))| *a += pd * v + prow[j] * vdot);
                    }
                }
            }
            // Ẏ_h = Ȯ D(t)ᵀ + O ΔDᵀ + Δb_D.
            let wi = first + self.dec(h);
            add(&mut yd, &self.apply(at, wi, &od, dh, d, false));
            add(&mut yd, &self.direction(at, wi, &hc.o, dh, d));
        }
        (y, Some(yd))
    }

    fn backward(&self, first: usize, at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Attention(cache) = cache else { unreachable!("an attention layer's cache is its heads'") };
        let (t, d, dh) = (self.t, self.d, self.dh);
        let c = 1.0 / (dh as f64).sqrt();
        let n = cache.x.len() / (t * d);
        let width = self.width();
        let mut g = vec![0.0; n * k * width];
        let mut dx = if want_dx { vec![0.0; n * k * t * d] } else { Vec::new() };
        let per = k * t;
        for (h, hc) in cache.heads.iter().enumerate() {
            let di = self.dec(h);
            // dO = dY D(t) for every cotangent row: [n, K, T, d_h].
            let d_o = self.apply_t(at, first + di, &dy, dh, d, per);
            let (off_dec, off_dec_b) = (self.offset_of(di), self.bias.then(|| self.offset_of(di + 1)));
            let enc: Vec<(Proj, usize)> = if self.shared { vec![(Proj::Q, self.enc(h, Proj::Q))] } else { [Proj::Q, Proj::K, Proj::V].iter().map(|&p| (p, self.enc(h, p))).collect() };
            // dQ, dK, dV: [n, K, T, d_h] (summed into one when shared).
            let mut dq = vec![0.0; n * k * t * dh];
            let mut dk = if self.shared { Vec::new() } else { vec![0.0; n * k * t * dh] };
            let mut dv = if self.shared { Vec::new() } else { vec![0.0; n * k * t * dh] };
            let mut dp = vec![0.0; t];
            for s in 0..n {
                for c_ in 0..k {
                    let r0 = (s * k + c_) * t;
                    let gs = &mut g[(s * k + c_) * width..(s * k + c_ + 1) * width];
                    // dD = dYᵀ O, db_D = Σ_i dY_i.
                    for i in 0..t {
                        let dyi = &dy[(r0 + i) * d..(r0 + i + 1) * d];
                        let oi = &hc.o[(s * t + i) * dh..(s * t + i + 1) * dh];
                        for (a, &u) in dyi.iter().enumerate() {
                            gs[off_dec + a * dh..off_dec + (a + 1) * dh].iter_mut().zip(oi).for_each(|(x, y)| *x += u * y);
                        }
                        if let Some(ob) = off_dec_b {
                            add(&mut gs[ob..ob + d], dyi);
                        }
                    }
                    for i in 0..t {
                        let doi = &d_o[(r0 + i) * dh..(r0 + i + 1) * dh];
                        let prow = &hc.p[(s * t + i) * t..(s * t + i + 1) * t];
                        let mut mean = 0.0;
                        for j in 0..t {
                            dp[j] = dot(doi, &hc.v[(s * t + j) * dh..(s * t + j + 1) * dh]);
                            mean += prow[j] * dp[j];
                        }
                        let qi = &hc.q[(s * t + i) * dh..(s * t + i + 1) * dh];
                        for j in 0..t {
                            // dV_j += P_ij dO_i; dS_ij = P_ij (dP_ij − Σ_l P_il dP_il).
                            let target = if self.shared { &mut dq } else { &mut dv };
                            target[(r0 + j) * dh..(r0 + j + 1) * dh].iter_mut().zip(doi).for_each(|(a, b)| *a += prow[j] * b);
                            let ds = prow[j] * (dp[j] - mean);
                            if ds == 0.0 {
                                continue;
                            }
                            let kj = &hc.k[(s * t + j) * dh..(s * t + j + 1) * dh];
                            dq[(r0 + i) * dh..(r0 + i + 1) * dh].iter_mut().zip(kj).for_each(|(a, b)| *a += c * ds * b);
                            let target = if self.shared { &mut dq } else { &mut dk };
                            target[(r0 + j) * dh..(r0 + j + 1) * dh].iter_mut().zip(qi).for_each(|(a, b)| *a += c * ds * b);
                        }
                    }
                }
            }
            for (p, ei) in enc {
                let dz = match p {
                    Proj::Q => &dq,
                    Proj::K => &dk,
                    Proj::V => &dv,
                };
                let (ow, ob) = (self.offset_of(ei), self.bias.then(|| self.offset_of(ei + 1)));
                for s in 0..n {
                    let xs = &cache.x[s * t * d..(s + 1) * t * d];
                    for c_ in 0..k {
                        let r0 = (s * k + c_) * t;
                        let gs = &mut g[(s * k + c_) * width..(s * k + c_ + 1) * width];
                        for i in 0..t {
                            let dzi = &dz[(r0 + i) * dh..(r0 + i + 1) * dh];
                            let xi = &xs[i * d..(i + 1) * d];
                            for (a, &u) in dzi.iter().enumerate() {
                                gs[ow + a * d..ow + (a + 1) * d].iter_mut().zip(xi).for_each(|(x, y)| *x += u * y);
                            }
                            if let Some(ob) = ob {
                                add(&mut gs[ob..ob + dh], dzi);
                            }
                        }
                    }
                }
                if want_dx {
                    add(&mut dx, &self.apply_t(at, first + ei, dz, d, dh, per));
                }
            }
        }
        // One gradient per linear map (each `head{h}_*` weight with its bias): the kernel
        // engine pairs them with the parameter layers, which are grouped by name.
        let linears = self.heads * (self.projections() + 1);
        for j in 0..linears {
            let i = j * self.per_linear();
            let (start, end) = (self.offset_of(i), self.offset_of(i + self.per_linear()));
            let gj: Vec<f64> = g.chunks_exact(width).flat_map(|r| r[start..end].iter().copied()).collect();
            grads.push((first + i, Grad::Formed { g: gj, width: end - start }));
        }
        dx
    }

    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], _p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        None
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, first: usize, p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        let x = seq(x);
        let (n, t, d) = *x.shape();
        let dh = self.dh;
        let dev = x.device().clone();
        let c = 1.0 / (dh as f64).sqrt();
        let rows = x.reshape_like(&(n * t, d));
        // `x W_iᵀ + b_i` on rows `[n·T, din]`.
        let lin = |a: Tensor<(usize, usize), f64, D, T>, wi: usize, dout: usize| {
            let r = a.shape().0;
            let mut z = a.matmul(p[first + wi].r2().clone().permute::<(usize, usize), Axes2<1, 0>>());
            if self.bias {
                z = z + p[first + wi + 1].r1().clone().broadcast_like::<(usize, usize), Axis<0>>(&(r, dout));
            }
            z
        };
        let mask: Option<Tensor<(usize, usize, usize), f64, D>> = self.causal.then(|| {
            let m: Vec<f64> = (0..n).flat_map(|_| (0..t).flat_map(move |i| (0..t).map(move |j| if j <= i { 0.0 } else { f64::NEG_INFINITY }))).collect();
            dev.tensor_from_vec(m, (n, t, t))
        });
        // Every projection reads the rows: all but the last read copies without the tape, the
        // last the rows themselves, whose tape (everything before this layer) the heads' sum
        // merges back.
        let reads = self.heads * 3;
        let mut inputs: Vec<Tensor<(usize, usize), f64, D, T>> = (1..reads).map(|_| rows.retaped::<T>()).collect();
        inputs.push(rows);
        let mut inputs = inputs.into_iter();
        let mut out: Option<Tensor<(usize, usize), f64, D, T>> = None;
        for h in 0..self.heads {
            let mut project = |which: Proj| lin(inputs.next().expect("one read per projection"), self.enc(h, which), dh).reshape_like(&(n, t, dh));
            // Shared: the one projection applied three times (dfdx's matmul needs distinct
            // operands), its gradient the sum of the three.
            let (q, k, v) = (project(Proj::Q), project(Proj::K), project(Proj::V));
            let mut s = q.matmul(k.permute::<(usize, usize, usize), Axes3<0, 2, 1>>()) * c;
            if let Some(m) = &mask {
                s = s + m.clone();
            }
            let o = s.softmax::<Axis<2>>().matmul(v).reshape_like(&(n * t, dh));
            let y = lin(o, self.dec(h), d);
            out = Some(match out {
                None => y,
                Some(acc) => acc + y,
            });
        }
        let y = out.expect("at least one head");
        Activations::Seq(y.reshape_like(&(n, t, d)))
    }

    fn gradient_floats(&self, k: u64) -> u64 {
        k * self.width() as u64
    }

    fn torch_input(&self) -> Option<(&'static str, usize)> {
        Some(("d", self.d))
    }

    fn scratch_floats(&self) -> u64 {
        (self.heads * self.t * (4 * self.dh + self.t)) as u64
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// `{ self_attention = heads }` or `{ self_attention = { heads, head_dim, shared_qkv, bias,
/// causal } }`: multi-head self-attention on a sequence `[T, d]`, the heads' outputs summed.
/// `head_dim` defaults to `d / heads` (then heads must divide d); `shared_qkv` (one projection
/// for query, key and value, ExPLAIND's), `bias` and `causal` default to false.
#[derive(Clone, Debug, PartialEq)]
pub struct SelfAttentionSpec {
    /// Number of heads H.
    pub heads: usize,
    /// Each head's width `d_h` (`None`: `d / H`).
    pub head_dim: Option<usize>,
    /// One projection for query, key and value.
    pub shared_qkv: bool,
    /// Biases on every projection.
    pub bias: bool,
    /// Position i attends to positions `j ≤ i` only.
    pub causal: bool,
}

impl KindSpec for SelfAttentionSpec {
    const NAMES: &'static [&'static str] = &["self_attention"];
    /// `scripts/torch_model.py`'s `SelfAttention` (ExPLAIND's heads, `head{h}_*` children).
    const TORCH: &'static [&'static str] = &["SelfAttention"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let a = need(arg, at, name)?;
        if a.is_number() {
            return Ok(SelfAttentionSpec { heads: as_size(a, at, "self_attention")?, head_dim: None, shared_qkv: false, bias: false, causal: false });
        }
        let m = options(a, at, name, &["heads", "head_dim", "shared_qkv", "bias", "causal"])?;
        let heads = as_size(m.get("heads").ok_or_else(|| err(at, "self_attention needs `heads`"))?, at, "self_attention.heads")?;
        let head_dim = m.get("head_dim").map(|v| as_size(v, at, "self_attention.head_dim")).transpose()?;
        let flag = |key: &str| m.get(key).map_or(Ok(false), |b| as_bool(b, at, &format!("self_attention.{key}")));
        Ok(SelfAttentionSpec { heads, head_dim, shared_qkv: flag("shared_qkv")?, bias: flag("bias")?, causal: flag("causal")? })
    }

    fn to_value(&self) -> Value {
        let mut m = json!({ "heads": self.heads, "shared_qkv": self.shared_qkv, "bias": self.bias, "causal": self.causal });
        if let Some(dh) = self.head_dim {
            m["head_dim"] = json!(dh);
        }
        json!({ "self_attention": m })
    }

    fn label(&self) -> String {
        format!("self_attention({} heads{})", self.heads, if self.shared_qkv { ", shared qkv" } else { "" })
    }

    fn from_torch(_class: &str, m: &Value, at: &str) -> Result<Self, String> {
        Ok(SelfAttentionSpec {
            heads: uint(m, "heads", at)?,
            head_dim: Some(uint(m, "head_dim", at)?),
            shared_qkv: boolean(m, "shared_qkv", at)?,
            bias: boolean(m, "bias", at)?,
            causal: boolean(m, "causal", at)?,
        })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let Shape::Seq(t, d) = input else {
            return Err(format!("{at} {}: needs a sequence [T, d] (after an embedding), got {input}", self.label()));
        };
        if self.heads == 0 || self.head_dim == Some(0) {
            return Err(format!("{at} {}: needs at least one head of width at least 1", self.label()));
        }
        let dh = match self.head_dim {
            Some(dh) => dh,
            None if d % self.heads == 0 => d / self.heads,
            None => return Err(format!("{at} {}: {} heads do not divide the width {d}; give head_dim", self.label(), self.heads)),
        };
        let layer = Attention { t, d, heads: self.heads, dh, shared: self.shared_qkv, bias: self.bias, causal: self.causal };
        Ok((AnyLayer::SelfAttention(layer), input))
    }
}
