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
//! Parameters, in storage order, in one of two layouts ([`AttentionLayout`]) of the same
//! function:
//! - per head (default): every head's encoders (`head{h}_encoder.weight` and its `bias` when
//!   shared, else `head{h}_query`, `head{h}_key`, `head{h}_value`), then every head's
//!   `head{h}_decoder` (h = 1..H, ExPLAIND's names and order);
//! - packed (`layout = "packed"`), PyTorch's `nn.MultiheadAttention` held as `attn`:
//!   `attn.in_proj_weight` `[3d, d]` (the rows of every head's `W_q`, then `W_k`, then `W_v`),
//!   `attn.in_proj_bias` `[3d]`, `attn.out_proj.weight` `[d, d]` (`[D_1 … D_H]`, column block h
//!   is head h's decoder) and `attn.out_proj.bias` `[d]`: `b_D` once, on the sum (on head 1 in
//!   the formula above), not once per head. The names are PyTorch's, so an export loads into
//!   `torch_model.MHSelfAttention` with `load_state_dict` and a recording imports tensor for
//!   tensor, with no conversion of weights or optimizer states; each head's maps are views into
//!   these tensors ([`Map`]).
//!
//! Smooth and not polynomial along a step ([`Along::Smooth`]): the kink sweep stops here and
//! kinks behind it are located by Newton's method on the probe. Its per-sample gradients are
//! formed, one per parameter layer as the kernel engine groups the names (a weight and its bias:
//! per head each linear map; packed `attn`, the in-projection, and `attn.out_proj`),
//! `[n, K, W_j]`.
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
use crate::model::param_spec::ParamSpec;

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
    /// PyTorch's `nn.MultiheadAttention` tensors (`attn.in_proj_weight`, …) instead of one
    /// linear map per head ([`AttentionLayout`]).
    pub packed: bool,
}

/// Where one linear map of a head (a projection or its decoder) lies among the layer's tensors
/// (indices relative to the layer): its weight `W` `[dout, din]` has row r at
/// `tensor[w][base + r·stride ..][..din]`, its bias (when it has one) `[dout]` at
/// `tensor[b.0][b.1 ..]`. Per head it is a whole tensor (`stride = din`); packed, head h's query
/// is rows `h·d_h..` of `in_proj_weight` (contiguous) and its decoder the column block `h·d_h..`
/// of `out_proj.weight` (`stride = d`), whose one bias is head 0's.
#[derive(Clone, Copy, Debug)]
struct Map {
    w: usize,
    base: usize,
    stride: usize,
    din: usize,
    dout: usize,
    b: Option<(usize, usize)>,
}

impl Map {
    /// Its weight `[dout, din]` out of the tensor `src` holding it (borrowed when contiguous).
    fn weight<'a>(&self, src: &'a [f64]) -> std::borrow::Cow<'a, [f64]> {
        if self.stride == self.din {
            src[self.base..self.base + self.dout * self.din].into()
        } else {
            (0..self.dout).flat_map(|r| src[self.base + r * self.stride..][..self.din].iter().copied()).collect::<Vec<f64>>().into()
        }
    }

    /// Its bias `[dout]` out of the tensor `src` holding it.
    fn bias<'a>(&self, src: &'a [f64]) -> &'a [f64] {
        let (_, at) = self.b.expect("a map with a bias");
        &src[at..at + self.dout]
    }
}

/// Which linear map of a head.
#[derive(Clone, Copy)]
enum Lin {
    Enc(Proj),
    Dec,
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

    /// Where head h's linear map `lin` lies (see [`Map`]).
    fn map(&self, h: usize, lin: Lin) -> Map {
        let (d, dh, per) = (self.d, self.dh, self.per_linear());
        let bias = |w: usize, at: usize| self.bias.then_some((w + 1, at));
        match (self.packed, lin) {
            (false, Lin::Enc(which)) => {
                let j = if self.shared { 0 } else { which as usize };
                let w = (h * self.projections() + j) * per;
                Map { w, base: 0, stride: d, din: d, dout: dh, b: bias(w, 0) }
            }
            (false, Lin::Dec) => {
                let w = (self.heads * self.projections() + h) * per;
                Map { w, base: 0, stride: dh, din: dh, dout: d, b: bias(w, 0) }
            }
            (true, Lin::Enc(which)) => {
                let row = which as usize * d + h * dh;
                Map { w: 0, base: row * d, stride: d, din: d, dout: dh, b: bias(0, row) }
            }
            (true, Lin::Dec) => Map { w: per, base: h * dh, stride: d, din: dh, dout: d, b: if h == 0 { bias(per, 0) } else { None } },
        }
    }

    /// Head h's input projections, each with the one it computes (one when shared).
    fn encoders(&self, h: usize) -> Vec<(Proj, Map)> {
        let ps: &[Proj] = if self.shared { &[Proj::Q] } else { &[Proj::Q, Proj::K, Proj::V] };
        ps.iter().map(|&p| (p, self.map(h, Lin::Enc(p)))).collect()
    }

    /// Names (relative) and shapes of every tensor, in storage order.
    fn named_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let mut v = Vec::new();
        if self.packed {
            let d = self.d;
            v.push(("attn.in_proj_weight".to_string(), vec![3 * d, d]));
            if self.bias {
                v.push(("attn.in_proj_bias".to_string(), vec![3 * d]));
            }
            v.push(("attn.out_proj.weight".to_string(), vec![d, d]));
            if self.bias {
                v.push(("attn.out_proj.bias".to_string(), vec![d]));
            }
            return v;
        }
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
        self.named_tensors().iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }

    /// Offset of tensor `i` (relative) in the layer's flattened parameters.
    fn offset_of(&self, i: usize) -> usize {
        self.named_tensors()[..i].iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }

    /// `x W(t_s)ᵀ (+ b(t_s))` of the map `m` over rows of `T` positions, each sample at its own
    /// t (the bias only `with_bias`).
    ///
    /// # Shapes
    /// `x` `[n, T, din]`; returns `[n, T, dout]`.
    fn apply(&self, first: usize, at: &At, m: Map, x: &[f64], with_bias: bool) -> Vec<f64> {
        let (din, dout) = (m.din, m.dout);
        let rows = x.len() / din;
        let b = m.b.filter(|_| with_bias);
        let mut y = vec![0.0; rows * dout];
        gemm_abt(&mut y, x, &m.weight(at.w(first + m.w)), rows, dout, din, 1.0, false);
        if let Some((bi, _)) = b {
            add_rows(&mut y, m.bias(at.w(first + bi)));
        }
        if let Some((dw, t)) = at.offset(first + m.w) {
            let mut y1 = vec![0.0; rows * dout];
            gemm_abt(&mut y1, x, &m.weight(dw), rows, dout, din, 1.0, false);
            if let Some((db, _)) = b.and_then(|(bi, _)| at.offset(first + bi)) {
                add_rows(&mut y1, m.bias(db));
            }
            add_scaled_rows(&mut y, &y1, t, self.t * dout);
        }
        y
    }

    /// The direction term `x ΔWᵀ + Δb` of the map `m` (zeros without a direction).
    fn direction(&self, first: usize, at: &At, m: Map, x: &[f64]) -> Vec<f64> {
        let rows = x.len() / m.din;
        let mut y = vec![0.0; rows * m.dout];
        if let Some(dw) = at.dw(first + m.w) {
            gemm_abt(&mut y, x, &m.weight(dw), rows, m.dout, m.din, 1.0, false);
            if let Some((bi, _)) = m.b {
                add_rows(&mut y, m.bias(at.dw(first + bi).expect("a direction covers every tensor")));
            }
        }
        y
    }

    /// `dy W(t_s)` of the map `m` for cotangent rows, `per` rows to a sample.
    ///
    /// # Shapes
    /// `dy` `[rows, dout]`, `W` `[dout, din]`; returns `[rows, din]`.
    fn apply_t(&self, first: usize, at: &At, m: Map, dy: &[f64], per: usize) -> Vec<f64> {
        let (din, dout) = (m.din, m.dout);
        let rows = dy.len() / dout;
        let mut dx = vec![0.0; rows * din];
        gemm(&mut dx, dy, false, &m.weight(at.w(first + m.w)), false, (rows, din, dout), 1.0, false);
        if let Some((dw, t)) = at.offset(first + m.w) {
            let mut d1 = vec![0.0; rows * din];
            gemm(&mut d1, dy, false, &m.weight(dw), false, (rows, din, dout), 1.0, false);
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
        let mut y = vec![0.0; x.len()];
        let mut heads = Vec::with_capacity(self.heads);
        for h in 0..self.heads {
            let q = self.apply(first, at, self.map(h, Lin::Enc(Proj::Q)), x, true);
            let (k, v) = if self.shared {
                (q.clone(), q.clone())
            } else {
                (self.apply(first, at, self.map(h, Lin::Enc(Proj::K)), x, true), self.apply(first, at, self.map(h, Lin::Enc(Proj::V)), x, true))
            };
            let (p, o) = self.core(&q, &k, &v);
            let yh = self.apply(first, at, self.map(h, Lin::Dec), &o, true);
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
        if self.packed {
            return format!("MHSelfAttention({}, num_heads={}, bias={}, causal={})", self.d, self.heads, py_bool(self.bias), py_bool(self.causal));
        }
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

    /// Per head, PyTorch's `nn.Linear` default for every projection: uniform in `±1/√fan_in`.
    /// Packed, `nn.MultiheadAttention`'s: `in_proj_weight` Xavier-uniform (`±√(6 / 4d)`),
    /// `out_proj.weight` `nn.Linear`'s, both biases 0.
    fn init(&self, rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) {
        if self.packed {
            use rand::Rng;
            let d = self.d;
            let bound = (6.0 / (4 * d) as f64).sqrt();
            data.push((0..3 * d * d).map(|_| rng.gen_range(-bound..bound)).collect());
            if self.bias {
                data.push(vec![0.0; 3 * d]);
            }
            uniform(rng, d * d, d, data);
            if self.bias {
                data.push(vec![0.0; d]);
            }
            return;
        }
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
        let dot_of = |m: Map| {
            let mut z = self.direction(first, at, m, &x);
            if let Some(xd) = xd.as_deref() {
                add(&mut z, &self.apply(first, at, m, xd, false));
            }
            z
        };
        let mut yd = vec![0.0; x.len()];
        for (h, hc) in heads.iter().enumerate() {
            let qd = dot_of(self.map(h, Lin::Enc(Proj::Q)));
            let (kd, vd) = if self.shared { (qd.clone(), qd.clone()) } else { (dot_of(self.map(h, Lin::Enc(Proj::K))), dot_of(self.map(h, Lin::Enc(Proj::V)))) };
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
            let dm = self.map(h, Lin::Dec);
            add(&mut yd, &self.apply(first, at, dm, &od, false));
            add(&mut yd, &self.direction(first, at, dm, &hc.o));
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
            let dm = self.map(h, Lin::Dec);
            // dO = dY D(t) for every cotangent row: [n, K, T, d_h].
            let d_o = self.apply_t(first, at, dm, &dy, per);
            // D's entry (a, c) is at `off_dec + a·stride + c` of the layer's gradient.
            let (off_dec, off_dec_b) = (self.offset_of(dm.w) + dm.base, dm.b.map(|(bi, at)| self.offset_of(bi) + at));
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
                            gs[off_dec + a * dm.stride..][..dh].iter_mut().zip(oi).for_each(|(x, y)| *x += u * y);
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
            for (p, em) in self.encoders(h) {
                let dz = match p {
                    Proj::Q => &dq,
                    Proj::K => &dk,
                    Proj::V => &dv,
                };
                // W's row a is at `ow + a·d` (every projection's rows are whole).
                let (ow, ob) = (self.offset_of(em.w) + em.base, em.b.map(|(bi, at)| self.offset_of(bi) + at));
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
                    add(&mut dx, &self.apply_t(first, at, em, dz, per));
                }
            }
        }
        // One gradient per parameter layer as the kernel engine groups the names (a weight with
        // its bias: each `head{h}_*` map; packed, `attn` (in_proj_weight and in_proj_bias) and
        // `attn.out_proj`), which it pairs with them in order.
        let specs: Vec<ParamSpec> = self.named_tensors().into_iter().map(|(name, shape)| ParamSpec { name, shape }).collect();
        for l in crate::model::param_spec::param_layers(&specs) {
            let (start, end) = (l.flat.start, l.flat.end);
            let gj: Vec<f64> = g.chunks_exact(width).flat_map(|r| r[start..end].iter().copied()).collect();
            grads.push((first + l.tensors.start, Grad::Formed { g: gj, width: end - start }));
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
        // One head: `softmax(c·Q Kᵀ) V` on `[n, T, d_h]` each, as rows `[n·T, d_h]`.
        let attend = |q: Tensor<(usize, usize, usize), f64, D, T>, k: Tensor<(usize, usize, usize), f64, D, T>, v: Tensor<(usize, usize, usize), f64, D, T>| {
            let mut s = q.matmul(k.permute::<(usize, usize, usize), Axes3<0, 2, 1>>()) * c;
            if let Some(m) = &mask {
                s = s + m.clone();
            }
            s.softmax::<Axis<2>>().matmul(v).reshape_like(&(n * t, dh))
        };
        if self.packed {
            // All heads' queries, keys and values at once, `[n·T, 3d]`, each head's columns
            // sliced out of copies of it (all but the last without the tape, as below); the
            // heads' outputs side by side `[n·T, d]` through the one output projection.
            let qkv = lin(rows, 0, 3 * d);
            let reads = self.heads * 3;
            let mut parts: Vec<Tensor<(usize, usize), f64, D, T>> = (1..reads).map(|_| qkv.retaped::<T>()).collect();
            parts.push(qkv);
            let mut parts = parts.into_iter();
            let mut heads: Option<Tensor<(usize, usize), f64, D, T>> = None;
            for h in 0..self.heads {
                let mut take = |which: Proj| {
                    let c0 = which as usize * d + h * dh;
                    parts.next().expect("one read per block").slice((.., c0..c0 + dh)).reshape_like(&(n, t, dh))
                };
                let (q, k, v) = (take(Proj::Q), take(Proj::K), take(Proj::V));
                let o = attend(q, k, v);
                heads = Some(match heads {
                    None => o,
                    Some(acc) => (acc, o).concat_along(Axis::<1>),
                });
            }
            let y = lin(heads.expect("at least one head"), self.per_linear(), d);
            return Activations::Seq(y.reshape_like(&(n, t, d)));
        }
        // Every projection reads the rows: all but the last read copies without the tape, the
        // last the rows themselves, whose tape (everything before this layer) the heads' sum
        // merges back.
        let reads = self.heads * 3;
        let mut inputs: Vec<Tensor<(usize, usize), f64, D, T>> = (1..reads).map(|_| rows.retaped::<T>()).collect();
        inputs.push(rows);
        let mut inputs = inputs.into_iter();
        let mut out: Option<Tensor<(usize, usize), f64, D, T>> = None;
        for h in 0..self.heads {
            let mut project = |which: Proj| lin(inputs.next().expect("one read per projection"), self.map(h, Lin::Enc(which)).w, dh).reshape_like(&(n, t, dh));
            // Shared: the one projection applied three times (dfdx's matmul needs distinct
            // operands), its gradient the sum of the three.
            let (q, k, v) = (project(Proj::Q), project(Proj::K), project(Proj::V));
            let y = lin(attend(q, k, v), self.map(h, Lin::Dec).w, d);
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
        Some((if self.packed { "embed_dim" } else { "d" }, self.d))
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

/// How a `self_attention` layer stores its heads' parameters: the same function either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionLayout {
    /// One linear map per head and projection: `head{h}_query`, `head{h}_key`, `head{h}_value`
    /// (one `head{h}_encoder` with `shared_qkv`) `[d_h, d]` and `head{h}_decoder` `[d, d_h]`,
    /// each with its bias (ExPLAIND's; `torch_model.SelfAttention`).
    #[default]
    Heads,
    /// PyTorch's `nn.MultiheadAttention` (`torch_model.MHSelfAttention`, the module as its
    /// attribute `attn`): `attn.in_proj_weight` `[3d, d]` (every head's query rows, then the
    /// keys', then the values'; head h's rows `h·d_h..(h+1)·d_h` of each block),
    /// `attn.in_proj_bias` `[3d]`, `attn.out_proj.weight` `[d, d]` (column block h is head h's
    /// decoder) and `attn.out_proj.bias` `[d]`, added once to the heads' sum; `d_h = d / H`.
    Packed,
}

/// `{ self_attention = heads }` or `{ self_attention = { heads, head_dim, shared_qkv, bias,
/// causal, layout } }`: multi-head self-attention on a sequence `[T, d]`, the heads' outputs summed.
/// `head_dim` defaults to `d / heads` (then heads must divide d); `shared_qkv` (one projection
/// for query, key and value, ExPLAIND's), `bias` and `causal` default to false; `layout` is
/// `"heads"` (default) or `"packed"` ([`AttentionLayout`]: `nn.MultiheadAttention`'s tensors,
/// no `shared_qkv`, `head_dim = d / heads`).
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
    /// How the parameters are stored and named.
    pub layout: AttentionLayout,
}

/// Why `nn.MultiheadAttention` itself cannot be a layer of a recorded `nn.Sequential`.
const BARE_MHA: &str = "nn.MultiheadAttention takes (query, key, value) and returns (output, weights), so it cannot be a child of nn.Sequential and may be used other than as self-attention; wrap it as torch_model.MHSelfAttention (self-attention, attn(x, x, x)[0])";

impl SelfAttentionSpec {
    /// `torch_model.MHSelfAttention` as recorded (`embed_dim`, `num_heads`, `bias`, `causal` and
    /// the `nn.MultiheadAttention` attributes our layer cannot express, each refused naming it).
    fn from_mha(m: &Value, at: &str) -> Result<Self, String> {
        use super::recorded::{number, refuse, require};
        let d = uint(m, "embed_dim", at)?;
        let heads = uint(m, "num_heads", at)?;
        let why = "keys and values of another width than the queries are not self-attention on one sequence; pathkernel's attention has kdim = vdim = embed_dim";
        require(m, "kdim", json!(d), at, why)?;
        require(m, "vdim", json!(d), at, why)?;
        require(m, "add_bias_kv", json!(false), at, "learned key/value biases appended to the sequence are not supported")?;
        require(m, "add_zero_attn", json!(false), at, "a zero key/value position appended to the sequence is not supported")?;
        let p = number(m, "dropout", at)?;
        if p > 0.0 && boolean(m, "training", at)? {
            return Err(refuse(at, m, format!("dropout = {p} in training mode: {}", super::spec::REFUSED_DROPOUT.replacen("dropout is not supported: ", "", 1))));
        }
        boolean(m, "batch_first", at)?;
        Ok(SelfAttentionSpec { heads, head_dim: None, shared_qkv: false, bias: boolean(m, "bias", at)?, causal: boolean(m, "causal", at)?, layout: AttentionLayout::Packed })
    }
}

impl KindSpec for SelfAttentionSpec {
    const NAMES: &'static [&'static str] = &["self_attention"];
    /// `scripts/torch_model.py`'s `SelfAttention` (ExPLAIND's heads, `head{h}_*` children) and
    /// `MHSelfAttention` (an `nn.MultiheadAttention` as self-attention); `MultiheadAttention`
    /// itself is named to be refused with the remedy.
    const TORCH: &'static [&'static str] = &["SelfAttention", "MHSelfAttention", "MultiheadAttention"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let a = need(arg, at, name)?;
        if a.is_number() {
            return Ok(SelfAttentionSpec { heads: as_size(a, at, "self_attention")?, head_dim: None, shared_qkv: false, bias: false, causal: false, layout: AttentionLayout::Heads });
        }
        let m = options(a, at, name, &["heads", "head_dim", "shared_qkv", "bias", "causal", "layout"])?;
        let heads = as_size(m.get("heads").ok_or_else(|| err(at, "self_attention needs `heads`"))?, at, "self_attention.heads")?;
        let head_dim = m.get("head_dim").map(|v| as_size(v, at, "self_attention.head_dim")).transpose()?;
        let flag = |key: &str| m.get(key).map_or(Ok(false), |b| as_bool(b, at, &format!("self_attention.{key}")));
        let layout = match m.get("layout").map(|v| (v, v.as_str())) {
            None | Some((_, Some("heads"))) => AttentionLayout::Heads,
            Some((_, Some("packed"))) => AttentionLayout::Packed,
            Some((v, _)) => return Err(err(at, format!("self_attention.layout must be \"heads\" (one linear map per head) or \"packed\" (nn.MultiheadAttention's tensors), got {v}"))),
        };
        Ok(SelfAttentionSpec { heads, head_dim, shared_qkv: flag("shared_qkv")?, bias: flag("bias")?, causal: flag("causal")?, layout })
    }

    fn to_value(&self) -> Value {
        let mut m = json!({ "heads": self.heads, "shared_qkv": self.shared_qkv, "bias": self.bias, "causal": self.causal });
        if let Some(dh) = self.head_dim {
            m["head_dim"] = json!(dh);
        }
        if self.layout == AttentionLayout::Packed {
            m["layout"] = json!("packed");
        }
        json!({ "self_attention": m })
    }

    fn label(&self) -> String {
        let what = match (self.layout, self.shared_qkv) {
            (AttentionLayout::Packed, _) => ", packed",
            (_, true) => ", shared qkv",
            _ => "",
        };
        format!("self_attention({} heads{what})", self.heads)
    }

    fn from_torch(class: &str, m: &Value, at: &str) -> Result<Self, String> {
        match class {
            "MHSelfAttention" => return SelfAttentionSpec::from_mha(m, at),
            "MultiheadAttention" => return Err(super::recorded::refuse(at, m, BARE_MHA)),
            _ => {}
        }
        Ok(SelfAttentionSpec {
            heads: uint(m, "heads", at)?,
            head_dim: Some(uint(m, "head_dim", at)?),
            shared_qkv: boolean(m, "shared_qkv", at)?,
            bias: boolean(m, "bias", at)?,
            causal: boolean(m, "causal", at)?,
            layout: AttentionLayout::Heads,
        })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let Shape::Seq(t, d) = input else {
            return Err(format!("{at} {}: needs a sequence [T, d] (after an embedding), got {input}", self.label()));
        };
        if self.heads == 0 || self.head_dim == Some(0) {
            return Err(format!("{at} {}: needs at least one head of width at least 1", self.label()));
        }
        let packed = self.layout == AttentionLayout::Packed;
        let dh = match self.head_dim {
            Some(dh) => dh,
            None if d % self.heads == 0 => d / self.heads,
            None if packed => return Err(format!("{at} {}: {} heads do not divide the width {d} (nn.MultiheadAttention's embed_dim must be a multiple of num_heads)", self.label(), self.heads)),
            None => return Err(format!("{at} {}: {} heads do not divide the width {d}; give head_dim", self.label(), self.heads)),
        };
        if packed && self.shared_qkv {
            return Err(format!("{at} {}: layout = \"packed\" (nn.MultiheadAttention) has separate query, key and value projections; drop shared_qkv or use layout = \"heads\"", self.label()));
        }
        if packed && dh * self.heads != d {
            return Err(format!("{at} {}: layout = \"packed\" (nn.MultiheadAttention) splits the width {d} into {} heads of d / heads; {} heads of width {dh} need layout = \"heads\"", self.label(), self.heads, self.heads));
        }
        let layer = Attention { t, d, heads: self.heads, dh, shared: self.shared_qkv, bias: self.bias, causal: self.causal, packed };
        Ok((AnyLayer::SelfAttention(layer), input))
    }
}
