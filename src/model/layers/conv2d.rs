//! `conv2d`: PyTorch's `Conv2d(C, Co, k, stride, padding, bias)` on `[C, H, W]` maps
//! (cross-correlation, zero padding).
//!
//! Parameters `weight [Co, C, k, k]` and `bias [Co]`. Computed through im2col: each sample's
//! patches `U [P, C·k·k]` (P = Ho·Wo output positions), so `Y = U Wᵀ + b` is one GEMM for a batch
//! and the per-sample weight gradient for class k is `δ[k] U` (`[Co, P] × [P, C·k·k]`, one GEMM
//! for all K classes of a sample). Linear in input and parameters, like `dense`; its per-sample
//! gradient is formed (`Co·(C·k·k + 1)` numbers per class: small, where the `P`-fold
//! position sum would make factors expensive).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use dfdx::prelude::*;

use super::autodiff::{map, Activations};
use serde_json::{json, Value};

use super::contract::{At, KindSpec, Layer, Poly, Probe, Sweep};
use super::recorded::{self, boolean, refuse, require, uint};
use super::spec::{as_bool, as_count, as_size, err, need, options};
use super::{uniform, AnyLayer, Cache, Grad, Shape};
use crate::linalg::{gemm, gemm_abt_strided_add};
use crate::model::conv;
use crate::model::tensors::ParamTensor;

/// A resolved convolution.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Conv {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub co: usize,
    pub k: usize,
    pub stride: usize,
    pub padding: usize,
    pub ho: usize,
    pub wo: usize,
    pub bias: bool,
}

impl Conv {
    /// Output positions P.
    pub(crate) fn positions(&self) -> usize {
        self.ho * self.wo
    }
    /// Patch length `C·k·k`.
    pub(crate) fn taps(&self) -> usize {
        self.c * self.k * self.k
    }
    /// Per-class parameter-gradient length `Co·C·k·k (+ Co)`.
    pub(crate) fn width(&self) -> usize {
        self.co * self.taps() + if self.bias { self.co } else { 0 }
    }

    /// [`Conv::build_index`], built once per geometry and shared: the adaptive rule evaluates
    /// its nodes one row at a time (each point's nodes have their own times), and rebuilding the
    /// index per row was 8 % of a LeNet-5 EPK's profile.
    fn index(&self) -> Arc<Vec<usize>> {
        type Key = (usize, usize, usize, usize, usize, usize, usize, usize);
        static CACHE: OnceLock<Mutex<HashMap<Key, Arc<Vec<usize>>>>> = OnceLock::new();
        let key = (self.c, self.h, self.w, self.k, self.stride, self.padding, self.ho, self.wo);
        let mut cache = CACHE.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|e| e.into_inner());
        cache.entry(key).or_insert_with(|| Arc::new(self.build_index())).clone()
    }

    /// The CSR inverse of [`Conv::index`]: input entry q is read by the patch entries
    /// `src[start[q]..start[q + 1]]` (built once per geometry and shared).
    fn inverse(&self) -> Arc<(Vec<u32>, Vec<u32>)> {
        type Key = (usize, usize, usize, usize, usize, usize, usize, usize);
        static CACHE: OnceLock<Mutex<HashMap<Key, Arc<(Vec<u32>, Vec<u32>)>>>> = OnceLock::new();
        let key = (self.c, self.h, self.w, self.k, self.stride, self.padding, self.ho, self.wo);
        let mut cache = CACHE.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(key)
            .or_insert_with(|| {
                let size = self.c * self.h * self.w;
                let idx = self.index();
                let mut start = vec![0u32; size + 1];
                idx.iter().filter(|&&q| q != usize::MAX).for_each(|&q| start[q + 1] += 1);
                for q in 0..size {
                    start[q + 1] += start[q];
                }
                let mut fill = start.clone();
                let mut src = vec![0u32; start[size] as usize];
                for (j, &q) in idx.iter().enumerate() {
                    if q != usize::MAX {
                        src[fill[q] as usize] = j as u32;
                        fill[q] += 1;
                    }
                }
                Arc::new((start, src))
            })
            .clone()
    }

    /// im2col gather: for position `pos` and tap `(c, i, j)`, the input offset `(c·H + ih)·W + iw`,
    /// or `usize::MAX` in the padding.
    fn build_index(&self) -> Vec<usize> {
        let (p, t) = (self.positions(), self.taps());
        let mut idx = vec![usize::MAX; p * t];
        for oy in 0..self.ho {
            for ox in 0..self.wo {
                let pos = oy * self.wo + ox;
                for c in 0..self.c {
                    for i in 0..self.k {
                        for j in 0..self.k {
                            let iy = (oy * self.stride + i) as isize - self.padding as isize;
                            let ix = (ox * self.stride + j) as isize - self.padding as isize;
                            if iy >= 0 && ix >= 0 && (iy as usize) < self.h && (ix as usize) < self.w {
                                idx[pos * t + (c * self.k + i) * self.k + j] = (c * self.h + iy as usize) * self.w + ix as usize;
                            }
                        }
                    }
                }
            }
        }
        idx
    }

    /// Patches of a batch.
    ///
    /// # Shapes
    /// `x` `[n, C, H, W]`; returns `[n, P, C·k·k]`.
    pub(crate) fn patches(&self, x: &[f64]) -> Vec<f64> {
        let size = self.c * self.h * self.w;
        let n = x.len() / size;
        let idx = self.index();
        let mut u = Vec::with_capacity(n * idx.len());
        for xs in x.chunks_exact(size) {
            u.extend(idx.iter().map(|&q| if q != usize::MAX { xs[q] } else { 0.0 }));
        }
        u
    }

    /// `Y = U Wᵀ (+ b)` from patches, as `[n, Co, P]`.
    ///
    /// # Shapes
    /// `u` `[n, P, C·k·k]`, `w` `[Co, C·k·k]`, `b` `[Co]`; returns `[n, Co, Ho, Wo]`.
    pub(crate) fn apply(&self, u: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
        let (p, t, co) = (self.positions(), self.taps(), self.co);
        let n = u.len() / (p * t);
        // [Co, C·k·k] × [n·P, C·k·k]ᵀ would interleave samples; per sample Wᵀ-products instead:
        // Y_s = W U_sᵀ  ([Co, P]).
        let mut y = vec![0.0; n * co * p];
        for s in 0..n {
            let ys = &mut y[s * co * p..(s + 1) * co * p];
            gemm(ys, w, false, &u[s * p * t..(s + 1) * p * t], true, (co, p, t), 1.0, false);
            if let Some(b) = b {
                for (o, row) in ys.chunks_exact_mut(p).enumerate() {
                    row.iter_mut().for_each(|v| *v += b[o]);
                }
            }
        }
        y
    }

    /// Input sensitivities: `dU[k] = δ[k]ᵀ W(t_s)` (`[P, C·k·k]`, `W + t_s·ΔW` with `off` =
    /// `(ΔW, t)`) scattered back through im2col.
    ///
    /// # Shapes
    /// `w` `[Co, C·k·k]`, `dy` `[n, K, Co, P]`, `t` `[n]`; returns `[n, K, C, H, W]`.
    pub(crate) fn input_grad(&self, w: &[f64], off: Option<(&[f64], &[f64])>, dy: &[f64], k: usize) -> Vec<f64> {
        let (p, t, co) = (self.positions(), self.taps(), self.co);
        let size = self.c * self.h * self.w;
        let rows = dy.len() / (co * p);
        // col2im as a gather: each input entry sums the patch entries that read it (a CSR
        // inverse of the im2col index), sequential writes instead of a scattered `+=`; rows in
        // blocks of ROWS, whose sums run side by side (one entry's few terms summed in a chain
        // were latency-bound: 70 % of this function's time on LeNet-5).
        const ROWS: usize = 8;
        let inv = self.inverse();
        let (start, src) = (&inv.0, &inv.1);
        let pt = p * t;
        // Each block's rows are summed into `blk` and appended: `dx` is written once, not
        // zeroed first.
        let (mut dx, mut blk) = (Vec::with_capacity(rows * size), vec![0.0; ROWS * size]);
        let mut du = vec![0.0; ROWS * pt];
        let (mut wt, mut wt_of) = (vec![0.0; if off.is_some() { w.len() } else { 0 }], None);
        for r0 in (0..rows).step_by(ROWS) {
            let nb = ROWS.min(rows - r0);
            for b in 0..nb {
                let r = r0 + b;
                let dyr = &dy[r * co * p..(r + 1) * co * p];
                let dub = &mut du[b * pt..(b + 1) * pt];
                // `W(t_s)` formed once per sample (its K rows in a row).
                let ws = match off {
                    Some((dw, ts)) if ts[r / k] != 0.0 => {
                        if wt_of != Some(r / k) {
                            wt.iter_mut().zip(w).zip(dw).for_each(|((o, a), d)| *o = a + ts[r / k] * d);
                            wt_of = Some(r / k);
                        }
                        wt.as_slice()
                    }
                    _ => w,
                };
                gemm(dub, dyr, true, ws, false, (p, t, co), 1.0, false);
            }
            for q in 0..size {
                let mut acc = [0.0; ROWS];
                for &j in &src[start[q] as usize..start[q + 1] as usize] {
                    for (b, a) in acc.iter_mut().enumerate().take(nb) {
                        *a += du[b * pt + j as usize];
                    }
                }
                for (b, a) in acc.iter().enumerate().take(nb) {
                    blk[b * size + q] = *a;
                }
            }
            dx.extend_from_slice(&blk[..nb * size]);
        }
        dx
    }
}

/// `Σ v` with four running sums (a single chain of dependent adds is latency-bound).
fn sum4(v: &[f64]) -> f64 {
    let mut a = [0.0; 4];
    let mut it = v.chunks_exact(4);
    for c in &mut it {
        a[0] += c[0];
        a[1] += c[1];
        a[2] += c[2];
        a[3] += c[3];
    }
    (a[0] + a[1]) + (a[2] + a[3]) + it.remainder().iter().sum::<f64>()
}

/// A PyTorch size argument (`3` or `[3, 3]`) when square.
fn square(m: &serde_json::Value, key: &str) -> Option<usize> {
    match m.get(key)? {
        serde_json::Value::Array(a) if a.len() == 2 && a[0] == a[1] => a[0].as_u64().map(|v| v as usize),
        v => v.as_u64().map(|v| v as usize),
    }
}

impl Conv {
    fn bias_at<'a>(&self, at: &At<'a>, first: usize) -> Option<&'a [f64]> {
        self.bias.then(|| at.w(first + 1))
    }

    /// `U W(t)ᵀ (+ b(t))` from patches, each sample at its own t.
    ///
    /// The products are per sample already, so each sample's `W(t_s)` is formed (`Co·C·k·k`
    /// numbers, against the GEMM's `P` times as many multiply-adds) and applied once, rather
    /// than `W_s` and `ΔW` each applied and combined.
    fn apply_at(&self, first: usize, at: &At, u: &[f64], bias: bool) -> Vec<f64> {
        let b = if bias { self.bias_at(at, first) } else { None };
        let Some((dw, t)) = at.offset(first) else { return self.apply(u, at.w(first), b) };
        let db = if bias && self.bias { at.offset(first + 1).map(|o| o.0) } else { None };
        let (pt, out) = (self.positions() * self.taps(), self.co * self.positions());
        let mut y = Vec::with_capacity(t.len() * out);
        let (mut wt, mut bt) = (vec![0.0; dw.len()], vec![0.0; self.co]);
        for (s, &ts) in t.iter().enumerate() {
            let us = &u[s * pt..(s + 1) * pt];
            if ts == 0.0 {
                y.extend(self.apply(us, at.w(first), b));
                continue;
            }
            wt.iter_mut().zip(at.w(first)).zip(dw).for_each(|((o, a), d)| *o = a + ts * d);
            let bs = match (b, db) {
                (Some(b), Some(db)) => {
                    bt.iter_mut().zip(b).zip(db).for_each(|((o, a), d)| *o = a + ts * d);
                    Some(bt.as_slice())
                }
                (b, _) => b,
            };
            y.extend(self.apply(us, &wt, bs));
        }
        y
    }
}

/// A batch's patches with one copy per run of identical consecutive samples: the node rows of a
/// point share its input, so a first convolution's patches are formed once per point and its
/// products are one GEMM against the run's stacked `W(t_s)`.
///
/// # Shapes
/// `u` `[R, P, C·k·k]` (R runs); `runs[r]` = (first sample, samples) of run r.
#[derive(Debug)]
pub(crate) struct SharedPatches {
    pub u: Vec<f64>,
    pub runs: Vec<(usize, usize)>,
}

impl Conv {
    /// [`Conv::patches`] once per run of equal consecutive samples of `x` (`[n, C, H, W]`).
    pub(crate) fn shared_patches(&self, x: &[f64]) -> SharedPatches {
        let size = self.c * self.h * self.w;
        let runs = super::contract::sample_runs(x, size);
        let firsts: Vec<f64> = runs.iter().flat_map(|&(s0, _)| x[s0 * size..(s0 + 1) * size].iter().copied()).collect();
        SharedPatches { u: self.patches(&firsts), runs }
    }

    /// [`Conv::apply_at`] on shared patches: per run, `[W(t_s)]_s U_runᵀ` as one GEMM (a run at
    /// one point of the step is computed once and copied).
    fn apply_shared(&self, first: usize, at: &At, sp: &SharedPatches, bias: bool) -> Vec<f64> {
        let (p, t, co) = (self.positions(), self.taps(), self.co);
        let n: usize = sp.runs.iter().map(|r| r.1).sum();
        let mut y = vec![0.0; n * co * p];
        let b = if bias { self.bias_at(at, first) } else { None };
        let off = at.offset(first);
        let db = if bias && self.bias { at.offset(first + 1).map(|o| o.0) } else { None };
        let w = at.w(first);
        let mut wbuf = Vec::new();
        for (r, &(s0, len)) in sp.runs.iter().enumerate() {
            let u = &sp.u[r * p * t..(r + 1) * p * t];
            let ys = &mut y[s0 * co * p..(s0 + len) * co * p];
            let t_of = |s: usize| off.map_or(0.0, |(_, ts)| ts[s]);
            if (s0..s0 + len).all(|s| t_of(s) == t_of(s0)) {
                // One point of the step for the whole run: once, then copied.
                let y1 = self.apply_at(first, &At { w: at.w, dw: at.dw, t: off.map(|(_, ts)| &ts[s0..s0 + 1]) }, u, bias);
                for chunk in ys.chunks_exact_mut(co * p) {
                    chunk.copy_from_slice(&y1);
                }
                continue;
            }
            let (dw, ts) = off.expect("times differ only with a step");
            wbuf.clear();
            for s in s0..s0 + len {
                wbuf.extend(w.iter().zip(dw).map(|(a, d)| a + ts[s] * d));
            }
            gemm(ys, &wbuf, false, u, true, (len * co, p, t), 1.0, false);
            if let Some(b) = b {
                for (j, s) in (s0..s0 + len).enumerate() {
                    for o in 0..co {
                        let bo = b[o] + db.map_or(0.0, |d| ts[s] * d[o]);
                        ys[(j * co + o) * p..(j * co + o + 1) * p].iter_mut().for_each(|v| *v += bo);
                    }
                }
            }
        }
        y
    }

    /// Per-sample parameter gradients on shared patches: for each sample and class, `δ[k] U`
    /// (`[Co, C·k·k]`) then the bias gradient `Σ_pos δ[k]` (`[Co]`); per run of equal samples,
    /// `[δ_s[k]]_{s,k} U_run` as one GEMM.
    ///
    /// # Shapes
    /// `dy` `[n, K, Co, P]`; returns `[n, K, width]`.
    fn param_grads_shared(&self, sp: &SharedPatches, dy: &[f64], k: usize) -> Vec<f64> {
        let (p, t, co, wd) = (self.positions(), self.taps(), self.co, self.width());
        let n: usize = sp.runs.iter().map(|r| r.1).sum();
        // Rows appended in order (the runs cover the samples in order): every number is
        // written once, none zeroed first.
        let mut out = Vec::with_capacity(n * k * wd);
        let mut tmp = Vec::new();
        for (r, &(s0, len)) in sp.runs.iter().enumerate() {
            let u = &sp.u[r * p * t..(r + 1) * p * t];
            tmp.resize(len * k * co * t, 0.0);
            gemm(&mut tmp, &dy[s0 * k * co * p..(s0 + len) * k * co * p], false, u, false, (len * k * co, t, p), 1.0, false);
            for j in 0..len * k {
                let row = s0 * k + j;
                out.extend_from_slice(&tmp[j * co * t..(j + 1) * co * t]);
                if self.bias {
                    let d = &dy[row * co * p..(row + 1) * co * p];
                    out.extend((0..co).map(|o| sum4(&d[o * p..(o + 1) * p])));
                }
            }
        }
        debug_assert_eq!(out.len(), n * k * wd);
        out
    }

    /// [`Conv::param_grads_shared`] from the sensitivities `dy` (`[n, K, O]`) of a max-pool
    /// right after this layer and its winners `arg` (`[n, O]`, indices into this layer's output
    /// `[C_out, positions]`; the pool's outputs channel-major, `O = C_out·m`): channel o's weight
    /// gradient is `Σ_j dy[j]·u[pos_j]` over the pool outputs j of channel o, `pos_j` their
    /// winners' positions, its bias gradient `Σ_j dy[j]`. The positions the pool does not pick
    /// contribute nothing (the dense form scatters `dy` into `[n, K, C_out, positions]` and
    /// multiplies every position). Consecutive samples of one run with the same winners (a
    /// point's nodes between two of the pool's switches) share the gathered patches: one GEMM
    /// `[rows·K, m] × [m, taps]` per channel.
    ///
    /// # Shapes
    /// returns `[n, K, width]`.
    fn param_grads_pooled(&self, sp: &SharedPatches, dy: &[f64], arg: &[u32], k: usize) -> Vec<f64> {
        let (p, t, co, wd) = (self.positions(), self.taps(), self.co, self.width());
        let n: usize = sp.runs.iter().map(|r| r.1).sum();
        let on = arg.len() / n.max(1);
        let m = on / co;
        debug_assert_eq!(m * co, on, "a max-pool's outputs are channel-major");
        let mut out = vec![0.0; n * k * wd];
        // The winners' patches, transposed per channel: `[C_out, taps, m]`.
        let mut ugt = vec![0.0; on * t];
        for (r, &(s0, len)) in sp.runs.iter().enumerate() {
            let u = &sp.u[r * p * t..(r + 1) * p * t];
            let mut s = s0;
            while s < s0 + len {
                let a = &arg[s * on..(s + 1) * on];
                let mut e = s + 1;
                while e < s0 + len && arg[e * on..(e + 1) * on] == *a {
                    e += 1;
                }
                for (j, &q) in a.iter().enumerate() {
                    let (pos, o, i) = (q as usize % p, j / m, j % m);
                    debug_assert_eq!(q as usize / p, o, "a winner lies in its window's channel");
                    for (tap, &v) in u[pos * t..(pos + 1) * t].iter().enumerate() {
                        ugt[(o * t + tap) * m + i] = v;
                    }
                }
                // Read from `dy` and written into `out` in place (strided): channel o's `[rows·K, m]`
                // block times its `[m, taps]` patches.
                let rows = (e - s) * k;
                for o in 0..co {
                    gemm_abt_strided_add(&mut out[s * k * wd + o * t..], wd, &dy[s * k * on + o * m..], on, &ugt[o * t * m..(o + 1) * t * m], m, rows, t, m, 1.0);
                    if self.bias {
                        for row in s * k..e * k {
                            out[row * wd + co * t + o] = sum4(&dy[row * on + o * m..row * on + (o + 1) * m]);
                        }
                    }
                }
                s = e;
            }
        }
        out
    }
}

impl Layer for Conv {
    fn torch(&self) -> String {
        format!("Conv2d({}, {}, {}, stride={}, padding={}{})", self.c, self.co, self.k, self.stride, self.padding, if self.bias { "" } else { ", bias=False" })
    }

    fn device(&self) -> Option<crate::device::program::Op> {
        let Conv { c, h, w, co, k, stride, padding, ho, wo, bias } = self.clone();
        Some(crate::device::program::Op::Conv { c, h, w, co, k, stride, padding, ho, wo, bias })
    }

    fn tensors(&self) -> Vec<(&'static str, Vec<usize>)> {
        let mut v = vec![("weight", vec![self.co, self.c, self.k, self.k])];
        if self.bias {
            v.push(("bias", vec![self.co]));
        }
        v
    }

    fn init(&self, rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) {
        uniform(rng, self.co * self.taps(), self.taps(), data);
        if self.bias {
            uniform(rng, self.co, self.taps(), data);
        }
    }

    fn linear_in_params(&self) -> bool {
        true
    }

    fn forward(&self, first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let sp = self.shared_patches(&x);
        let y = self.apply_shared(first, at, &sp, true);
        (y, if keep { Cache::Patches(sp) } else { Cache::None })
    }

    /// `ẏ = U ΔWᵀ + Δb + U̇ W(t)ᵀ`.
    fn tangent(&self, first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        let sp = self.shared_patches(&x);
        let y = self.apply_shared(first, at, &sp, true);
        let mut yd = match at.dw {
            // `U ΔWᵀ + Δb` does not depend on t: once per run.
            Some(dirs) => self.apply_shared(first, &At::fixed(dirs), &sp, self.bias),
            None => vec![0.0; y.len()],
        };
        if let Some(xd) = xd {
            let ud = self.patches(&xd);
            let t = self.apply_at(first, at, &ud, false);
            yd.iter_mut().zip(t).for_each(|(a, b)| *a += b);
        }
        (y, Some(yd))
    }

    fn backward(&self, first: usize, at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Patches(sp) = cache else { unreachable!("a convolution's cache is its patches") };
        grads.push((first, Grad::Formed { g: self.param_grads_shared(sp, &dy, k), width: self.width() }));
        if want_dx {
            self.input_grad(at.w(first), at.offset(first), &dy, k)
        } else {
            Vec::new()
        }
    }

    fn grads_behind_max_pool(&self, first: usize, cache: &Cache, dy: &[f64], arg: &[u32], k: usize, grads: &mut Vec<(usize, Grad)>) -> bool {
        let Cache::Patches(sp) = cache else { return false };
        grads.push((first, Grad::Formed { g: self.param_grads_pooled(sp, dy, arg, k), width: self.width() }));
        true
    }

    fn sweep(&self, first: usize, w: &[Vec<f64>], dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        // The bias of channel o at every one of its positions.
        let per_position = |b: &[f64]| -> Vec<f64> { b.iter().flat_map(|&v| std::iter::repeat_n(v, self.positions())).collect() };
        let b = self.bias.then(|| (per_position(&w[first + 1]), per_position(&dw[first + 1])));
        let out = self.co * self.positions();
        let u = self.patches(&p.c); // once for both W_s and ΔW
        Some(p.linear(out, &|wt, _| self.apply(&u, wt, None), &w[first], &dw[first], b.as_ref().map(|b| (b.0.as_slice(), b.1.as_slice()))))
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, first: usize, p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        let a = map(x);
        let zero: Tensor<(usize,), f64, D> = a.device().zeros_like(&(self.co,));
        let b = if self.bias { p[first + 1].r1().clone() } else { zero };
        Activations::Map(conv::conv2d(a, p[first].r4(), &b, self.stride, self.padding))
    }

    fn gradient_floats(&self, k: u64) -> u64 {
        k * self.width() as u64
    }

    fn scratch_floats(&self) -> u64 {
        (self.positions() * self.taps()) as u64
    }

    fn torch_input(&self) -> Option<(&'static str, usize)> {
        Some(("in_channels", self.c))
    }

    fn is_recorded_projection(&self, m: &serde_json::Value) -> bool {
        m.get("type").and_then(serde_json::Value::as_str) == Some("Conv2d")
            && square(m, "kernel_size") == Some(1)
            && square(m, "stride") == Some(self.stride)
            && square(m, "padding") == Some(0)
            && m.get("bias").and_then(serde_json::Value::as_bool) == Some(true)
    }
}

/// `{ conv2d = { channels, kernel, stride = 1, padding = 0, bias = true } }`:
/// `Conv2d(C, channels, kernel, stride, padding, bias)` on a `[C, H, W]` map.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dSpec {
    /// Output channels.
    pub channels: usize,
    /// Square kernel size.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Zero padding on every side.
    pub padding: usize,
    /// Whether it has a bias.
    pub bias: bool,
}

impl KindSpec for Conv2dSpec {
    const NAMES: &'static [&'static str] = &["conv2d"];
    const TORCH: &'static [&'static str] = &["Conv2d"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let m = options(need(arg, at, name)?, at, name, &["channels", "kernel", "stride", "padding", "bias"])?;
        let channels = as_size(m.get("channels").ok_or_else(|| err(at, "conv2d needs `channels`"))?, at, "conv2d.channels")?;
        let kernel = as_size(m.get("kernel").ok_or_else(|| err(at, "conv2d needs `kernel`"))?, at, "conv2d.kernel")?;
        let stride = m.get("stride").map_or(Ok(1), |v| as_size(v, at, "conv2d.stride"))?;
        let padding = m.get("padding").map_or(Ok(0), |v| as_count(v, at, "conv2d.padding"))?;
        let bias = m.get("bias").map_or(Ok(true), |b| as_bool(b, at, "conv2d.bias"))?;
        Ok(Conv2dSpec { channels, kernel, stride, padding, bias })
    }

    fn to_value(&self) -> Value {
        json!({ "conv2d": { "channels": self.channels, "kernel": self.kernel, "stride": self.stride, "padding": self.padding, "bias": self.bias } })
    }

    fn label(&self) -> String {
        format!("conv2d({}, k{}, s{}, p{})", self.channels, self.kernel, self.stride, self.padding)
    }

    fn from_torch(_class: &str, m: &Value, at: &str) -> Result<Self, String> {
        let padding = match m.get("padding") {
            Some(Value::String(s)) => return Err(refuse(at, m, format!("padding='{s}': give the padding as numbers"))),
            _ => recorded::square(m, "padding", at)?,
        };
        if recorded::square(m, "dilation", at)? != 1 {
            return Err(refuse(at, m, "dilation is not supported"));
        }
        require(m, "groups", Value::from(1), at, "grouped convolutions are not supported")?;
        require(m, "padding_mode", Value::from("zeros"), at, "only zero padding is supported")?;
        Ok(Conv2dSpec {
            channels: uint(m, "out_channels", at)?,
            kernel: recorded::square(m, "kernel_size", at)?,
            stride: recorded::square(m, "stride", at)?,
            padding,
            bias: boolean(m, "bias", at)?,
        })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let Shape::Map(c, h, w) = input else {
            return Err(format!("{at} {}: needs a [C, H, W] map, got {input} (image data, or a conv layer's output)", self.label()));
        };
        let (kernel, padding, stride) = (self.kernel, self.padding, self.stride);
        let (hp, wp) = (h + 2 * padding, w + 2 * padding);
        if kernel > hp || kernel > wp {
            return Err(format!("{at} {}: the kernel {kernel} does not fit the input {input} padded by {padding}", self.label()));
        }
        let (ho, wo) = ((hp - kernel) / stride + 1, (wp - kernel) / stride + 1);
        let conv = Conv { c, h, w, co: self.channels, k: kernel, stride, padding, ho, wo, bias: self.bias };
        Ok((AnyLayer::Conv2d(conv), Shape::Map(self.channels, ho, wo)))
    }
}
