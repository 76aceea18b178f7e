//! The window geometry and arithmetic of the two pooling kinds, [`super::max_pool`] and
//! [`super::avg_pool`]: PyTorch's `MaxPool2d(kernel, stride)` and `AvgPool2d(kernel, stride)`
//! (no padding, floor mode: `Ho = (H − k) / s + 1`; trailing rows and columns that fill no
//! window are dropped).
//!
//! No parameters. Average pooling is linear. Max pooling is piecewise linear: along a step its
//! output follows one entry of each window, and changes entry where two entries' polynomials in
//! t cross (a kink of the path). Its derivative sends each window's sensitivity to its first
//! maximal entry in row-major order, as PyTorch does.

use serde_json::Value;

use super::recorded::{refuse, require, square};
use super::spec::{as_size, err, need, options};
use super::Shape;

/// A pooling entry's window: `{ kind = k }` (stride k) or `{ kind = { kernel, stride } }`.
pub(crate) fn parse_window(name: &str, arg: Option<&Value>, at: &str) -> Result<(usize, usize), String> {
    let a = need(arg, at, name)?;
    if a.is_number() {
        let k = as_size(a, at, name)?;
        return Ok((k, k));
    }
    let m = options(a, at, name, &["kernel", "stride"])?;
    let k = as_size(m.get("kernel").ok_or_else(|| err(at, format!("{name} needs `kernel`")))?, at, &format!("{name}.kernel"))?;
    Ok((k, m.get("stride").map_or(Ok(k), |v| as_size(v, at, &format!("{name}.stride")))?))
}

/// A recorded `MaxPool2d` / `AvgPool2d`'s window, refusing padding and ceil mode.
pub(crate) fn torch_window(m: &Value, at: &str) -> Result<(usize, usize), String> {
    let kernel = square(m, "kernel_size", at)?;
    let stride = if m.get("stride").is_some_and(|s| !s.is_null()) { square(m, "stride", at)? } else { kernel };
    if square(m, "padding", at)? != 0 {
        return Err(refuse(at, m, "pooling with padding is not supported"));
    }
    require(m, "ceil_mode", Value::Bool(false), at, "only floor mode is supported")?;
    Ok((kernel, stride))
}

/// The windows of `kernel`, `stride` on `input` (a map); `label` names the entry in errors.
pub(crate) fn resolve(input: Shape, kernel: usize, stride: usize, at: &str, label: &str) -> Result<Pool, String> {
    let Shape::Map(c, h, w) = input else { return Err(format!("{at} {label}: needs a [C, H, W] map, got {input}")) };
    if kernel > h || kernel > w {
        return Err(format!("{at} {label}: the window {kernel} is larger than the input {input}"));
    }
    Ok(Pool { c, h, w, k: kernel, stride, ho: (h - kernel) / stride + 1, wo: (w - kernel) / stride + 1 })
}

/// A resolved pooling layer over `[C, H, W]` maps.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pool {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub ho: usize,
    pub wo: usize,
}

impl Pool {
    /// The window as the device program takes it.
    pub(crate) fn device_window(&self) -> crate::device::program::Window {
        crate::device::program::Window { c: self.c, h: self.h, w: self.w, k: self.k, stride: self.stride, ho: self.ho, wo: self.wo }
    }

    fn in_size(&self) -> usize {
        self.c * self.h * self.w
    }
    fn out_size(&self) -> usize {
        self.c * self.ho * self.wo
    }

    /// Offsets (within one sample) of the entries of output `(c, oy, ox)`'s window.
    pub(crate) fn window(&self, c: usize, oy: usize, ox: usize) -> impl Iterator<Item = usize> + '_ {
        let (y0, x0) = (oy * self.stride, ox * self.stride);
        (0..self.k).flat_map(move |i| (0..self.k).map(move |j| (c * self.h + y0 + i) * self.w + x0 + j))
    }

    /// Max pooling: values and the winning input offset of every output.
    ///
    /// # Shapes
    /// `x` `[n, C, H, W]`; returns `[n, C, Ho, Wo]` twice (values, offsets within the sample).
    pub(crate) fn max_forward(&self, x: &[f64]) -> (Vec<f64>, Vec<u32>) {
        let n = x.len() / self.in_size();
        let mut y = Vec::with_capacity(n * self.out_size());
        let mut arg = Vec::with_capacity(n * self.out_size());
        for s in 0..n {
            let xs = &x[s * self.in_size()..(s + 1) * self.in_size()];
            for c in 0..self.c {
                for oy in 0..self.ho {
                    for ox in 0..self.wo {
                        // The window's first maximum in [`Pool::window`]'s order (row by row).
                        let (y0, x0) = (oy * self.stride, ox * self.stride);
                        let mut best = (c * self.h + y0) * self.w + x0;
                        let mut top = xs[best];
                        for i in 0..self.k {
                            let row = (c * self.h + y0 + i) * self.w + x0;
                            for (j, &v) in xs[row..row + self.k].iter().enumerate() {
                                if v > top {
                                    top = v;
                                    best = row + j;
                                }
                            }
                        }
                        y.push(top);
                        arg.push(best as u32);
                    }
                }
            }
        }
        (y, arg)
    }

    /// Each window entry's margin over the rest of its window, `m_q = x_q − max_{r≠q} x_r`, with
    /// its t-derivative along the tangent `xd`, pushed onto `probe` (sample-major, window by
    /// window, entries in window order). `m_q > 0` exactly where q is the window's strict winner,
    /// so a switch of winner between two times is a sign change of two margins: the kink
    /// location behind smooth layers reads these as it reads a ReLU's inputs.
    ///
    /// # Shapes
    /// `x`, `xd` `[n, C, H, W]`; pushes `n·C·Ho·Wo·k²` pairs.
    pub(crate) fn max_margins(&self, x: &[f64], xd: &[f64], probe: &mut Vec<(f64, f64)>) {
        let n = x.len() / self.in_size();
        for s in 0..n {
            let (xs, ds) = (&x[s * self.in_size()..(s + 1) * self.in_size()], &xd[s * self.in_size()..(s + 1) * self.in_size()]);
            for c in 0..self.c {
                for oy in 0..self.ho {
                    for ox in 0..self.wo {
                        // The winner (first maximum) and the best of the rest (first maximum
                        // without it): every other entry's rest is led by the winner.
                        let (mut best, mut second) = (usize::MAX, usize::MAX);
                        for q in self.window(c, oy, ox) {
                            if best == usize::MAX || xs[q] > xs[best] {
                                second = best;
                                best = q;
                            } else if second == usize::MAX || xs[q] > xs[second] {
                                second = q;
                            }
                        }
                        for q in self.window(c, oy, ox) {
                            let rest = if q == best { second } else { best };
                            probe.push(if rest == usize::MAX { (1.0, 0.0) } else { (xs[q] - xs[rest], ds[q] - ds[rest]) });
                        }
                    }
                }
            }
        }
    }

    /// Average pooling (also the tangent of average pooling).
    ///
    /// # Shapes
    /// `x` `[n, C, H, W]`; returns `[n, C, Ho, Wo]`.
    pub(crate) fn avg_forward(&self, x: &[f64]) -> Vec<f64> {
        let n = x.len() / self.in_size();
        let scale = 1.0 / (self.k * self.k) as f64;
        let mut y = Vec::with_capacity(n * self.out_size());
        for s in 0..n {
            let xs = &x[s * self.in_size()..(s + 1) * self.in_size()];
            for c in 0..self.c {
                for oy in 0..self.ho {
                    for ox in 0..self.wo {
                        y.push(scale * self.window(c, oy, ox).map(|q| xs[q]).sum::<f64>());
                    }
                }
            }
        }
        y
    }

    /// Tangent (or any linear map) of max pooling with fixed winners: `ẏ = ẋ[arg]`.
    ///
    /// # Shapes
    /// `xdot` `[n, C, H, W]`, `arg` `[n, C, Ho, Wo]`; returns `[n, C, Ho, Wo]`.
    pub(crate) fn max_gather(&self, xdot: &[f64], arg: &[u32]) -> Vec<f64> {
        let (is, os) = (self.in_size(), self.out_size());
        arg.iter().enumerate().map(|(j, &q)| xdot[(j / os) * is + q as usize]).collect()
    }

    /// Input sensitivities of max pooling: each output's sensitivity to its winner.
    ///
    /// # Shapes
    /// `dy` `[n, K, C, Ho, Wo]`, `arg` `[n, C, Ho, Wo]`; returns `[n, K, C, H, W]`.
    pub(crate) fn max_backward(&self, dy: &[f64], arg: &[u32], k: usize) -> Vec<f64> {
        let (is, os) = (self.in_size(), self.out_size());
        let rows = dy.len() / os;
        let mut dx = vec![0.0; rows * is];
        for r in 0..rows {
            let s = r / k;
            for j in 0..os {
                dx[r * is + arg[s * os + j] as usize] += dy[r * os + j];
            }
        }
        dx
    }

    /// Input sensitivities of average pooling.
    ///
    /// # Shapes
    /// `dy` `[n, K, C, Ho, Wo]`; returns `[n, K, C, H, W]`.
    pub(crate) fn avg_backward(&self, dy: &[f64]) -> Vec<f64> {
        let (is, os) = (self.in_size(), self.out_size());
        let rows = dy.len() / os;
        let scale = 1.0 / (self.k * self.k) as f64;
        let mut dx = vec![0.0; rows * is];
        for r in 0..rows {
            let mut j = 0;
            for c in 0..self.c {
                for oy in 0..self.ho {
                    for ox in 0..self.wo {
                        let v = scale * dy[r * os + j];
                        for q in self.window(c, oy, ox) {
                            dx[r * is + q] += v;
                        }
                        j += 1;
                    }
                }
            }
        }
        dx
    }
}
