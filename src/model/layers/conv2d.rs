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
use super::contract::{add_scaled_rows, At, Layer, Poly, Probe, Sweep};
use super::{uniform, Cache, Grad};
use crate::linalg::gemm;
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
        let mut u = vec![0.0; n * idx.len()];
        for s in 0..n {
            let xs = &x[s * size..(s + 1) * size];
            for (dst, &q) in u[s * idx.len()..(s + 1) * idx.len()].iter_mut().zip(idx.iter()) {
                if q != usize::MAX {
                    *dst = xs[q];
                }
            }
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

    /// Per-sample parameter gradients: for each sample and class, `δ[k] U` (`[Co, C·k·k]`) then
    /// the bias gradient `Σ_pos δ[k]` (`[Co]`).
    ///
    /// # Shapes
    /// `u` `[n, P, C·k·k]`, `dy` `[n, K, Co, P]`; returns `[n, K, width]`.
    pub(crate) fn param_grads(&self, u: &[f64], dy: &[f64], k: usize) -> Vec<f64> {
        let (p, t, co, wd) = (self.positions(), self.taps(), self.co, self.width());
        let n = u.len() / (p * t);
        let mut out = vec![0.0; n * k * wd];
        let mut tmp = vec![0.0; k * co * t];
        for s in 0..n {
            let d = &dy[s * k * co * p..(s + 1) * k * co * p];
            gemm(&mut tmp, d, false, &u[s * p * t..(s + 1) * p * t], false, (k * co, t, p), 1.0, false);
            for c in 0..k {
                let dst = &mut out[(s * k + c) * wd..(s * k + c + 1) * wd];
                dst[..co * t].copy_from_slice(&tmp[c * co * t..(c + 1) * co * t]);
                if self.bias {
                    for o in 0..co {
                        dst[co * t + o] = d[(c * co + o) * p..(c * co + o + 1) * p].iter().sum();
                    }
                }
            }
        }
        out
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
        // inverse of the im2col index), sequential writes instead of a scattered `+=`.
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
        let mut dx = vec![0.0; rows * size];
        let mut du = vec![0.0; p * t];
        for r in 0..rows {
            let dyr = &dy[r * co * p..(r + 1) * co * p];
            gemm(&mut du, dyr, true, w, false, (p, t, co), 1.0, false);
            if let Some((dw, ts)) = off {
                let tr = ts[r / k];
                if tr != 0.0 {
                    gemm(&mut du, dyr, true, dw, false, (p, t, co), tr, true);
                }
            }
            let dxs = &mut dx[r * size..(r + 1) * size];
            for (q, d) in dxs.iter_mut().enumerate() {
                *d = src[start[q] as usize..start[q + 1] as usize].iter().map(|&j| du[j as usize]).sum();
            }
        }
        dx
    }
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
    fn apply_at(&self, first: usize, at: &At, u: &[f64], bias: bool) -> Vec<f64> {
        let b = if bias { self.bias_at(at, first) } else { None };
        let mut y = self.apply(u, at.w(first), b);
        if let Some((dw, t)) = at.offset(first) {
            let db = if bias && self.bias { at.offset(first + 1).map(|o| o.0) } else { None };
            let y1 = self.apply(u, dw, db);
            add_scaled_rows(&mut y, &y1, t, self.co * self.positions());
        }
        y
    }
}

impl Layer for Conv {
    fn torch(&self) -> String {
        format!("Conv2d({}, {}, {}, stride={}, padding={}{})", self.c, self.co, self.k, self.stride, self.padding, if self.bias { "" } else { ", bias=False" })
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
        let u = self.patches(&x);
        let y = self.apply_at(first, at, &u, true);
        (y, if keep { Cache::Patches(u) } else { Cache::None })
    }

    /// `ẏ = U ΔWᵀ + Δb + U̇ W(t)ᵀ`.
    fn tangent(&self, first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        let u = self.patches(&x);
        let y = self.apply_at(first, at, &u, true);
        let mut yd = match at.dw(first) {
            Some(dw) => self.apply(&u, dw, if self.bias { at.dw(first + 1) } else { None }),
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
        let Cache::Patches(u) = cache else { unreachable!("a convolution's cache is its patches") };
        grads.push((first, Grad::Formed { g: self.param_grads(u, &dy, k), width: self.width() }));
        if want_dx {
            self.input_grad(at.w(first), at.offset(first), &dy, k)
        } else {
            Vec::new()
        }
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
