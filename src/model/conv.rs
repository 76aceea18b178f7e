//! 2-D convolution and max pooling built from stable dfdx ops, plus plain-Rust references.
//!
//! dfdx 0.13 keeps its `Conv2D`, pooling layers and the `conv2d` op behind the `nightly`
//! feature, so they are rebuilt here from ops that exist (with a backward pass) on stable:
//!
//! - [`conv2d`] is im2col + GEMM. The input `[B, C, H, W]` is flattened to `[B, C·H·W]`, one zero
//!   column is appended (`concat_along`), giving `[B, N + 1]` with `N = C·H·W`; that is viewed
//!   transposed as `[N + 1, B]` and **gathered along axis 0** with a 1-D index of length
//!   `K·P` (`K = C·kh·kw` taps, `P = Ho·Wo` output positions, tap-major). A tap that falls in the
//!   zero padding points at row `N`, the appended zero, so padding needs no masking and the
//!   gradient stays exact (the zero column's gradient is simply discarded). The gathered
//!   `[K·P, B]` block is, without copying, the column-major matrix `[P·B, K]`; it is multiplied
//!   by `weightᵀ` (`[K, Co]`), the bias is added, and the `[P·B, Co]` result is permuted to
//!   `[B, Co, Ho, Wo]` and made contiguous.
//! - [`max_pool2d`] finds each window's first maximal entry on the values (no tape) and
//!   **gathers** those entries from the flattened input, so the backward pass sends each window's
//!   gradient to exactly one entry, as PyTorch does (dfdx's `max` would send the full gradient to
//!   every tied entry, which double-counts exact ties, e.g. identical patches of a blank image
//!   border).
//!
//! All of these record onto the tape carried by the *input*; parameters are `NoneTape` tensors
//! and receive gradients by id (`grads.get(&weight)`), as elsewhere in the crate.
//!
//! [`conv2d_direct`] and [`max_pool2d_direct`] are loop implementations on row-major slices with
//! the same semantics; they are the references the tests compare against.

use dfdx::shapes::{Axes2, Axes4, Axis, HasShape};
use dfdx::tensor::{Merge, NoneTape, Tape, Tensor};
use dfdx::tensor_ops::{
    BroadcastTo, Device, GatherTo, PermuteTo, ReshapeTo, TryConcatAlong, TryMatMul,
};

/// 4-D runtime shape `(B, C, H, W)`.
pub(crate) type Shape4 = (usize, usize, usize, usize);

/// Output spatial size of a convolution along one axis: `(n + 2·padding − k) / stride + 1`.
///
/// # Panics
/// If `stride == 0` or the kernel does not fit in the padded input (`k > n + 2·padding`).
fn conv_out_len(n: usize, k: usize, stride: usize, padding: usize) -> usize {
    assert!(stride > 0, "conv2d: stride must be positive");
    assert!(k > 0, "conv2d: kernel size must be positive");
    assert!(
        k <= n + 2 * padding,
        "conv2d: kernel {k} larger than padded input {}",
        n + 2 * padding
    );
    (n + 2 * padding - k) / stride + 1
}

/// im2col gather index: entry `kk·P + p` (tap `kk = (c·kh + i)·kw + j`, output position
/// `p = oh·Wo + ow`) is the flat input offset `(c·H + ih)·W + iw` read by that tap, or
/// `C·H·W` (the appended zero) where the tap lies in the padding.
fn im2col_index(
    (c, h, w): (usize, usize, usize),
    (kh, kw): (usize, usize),
    (ho, wo): (usize, usize),
    stride: usize,
    padding: usize,
) -> Vec<usize> {
    let zero_slot = c * h * w;
    let p_len = ho * wo;
    let mut idx = Vec::with_capacity(c * kh * kw * p_len);
    for ci in 0..c {
        for i in 0..kh {
            for j in 0..kw {
                for oh in 0..ho {
                    // Padded coordinate oh·s + i, real coordinate that minus padding.
                    let ih = (oh * stride + i).wrapping_sub(padding);
                    for ow in 0..wo {
                        let iw = (ow * stride + j).wrapping_sub(padding);
                        idx.push(if ih < h && iw < w {
                            (ci * h + ih) * w + iw
                        } else {
                            zero_slot
                        });
                    }
                }
            }
        }
    }
    debug_assert_eq!(idx.len(), c * kh * kw * p_len);
    idx
}

/// 2-D convolution, NCHW, cross-correlation like PyTorch's `Conv2d`, zero padding, with autodiff.
///
/// `out[b, o, y, x] = bias[o] + Σ_{c,i,j} weight[o, c, i, j] · x[b, c, y·s + i − p, x·s + j − p]`
/// (out-of-range input positions read 0). The tape travels with `x`; `weight` and `bias` are
/// tape-free parameters whose gradients are found in the [`dfdx::tensor::Gradients`] by their
/// own ids after `backward()`. `weight` must be contiguous (as freshly built tensors are): its
/// `[Co, C·kh·kw]` view is taken with a free reshape that keeps its id.
///
/// # Shapes
/// `x [B, C, H, W]`, `weight [Co, C, kh, kw]`, `bias [Co]` → `[B, Co, Ho, Wo]` with
/// `Ho = (H + 2·padding − kh) / stride + 1`, `Wo = (W + 2·padding − kw) / stride + 1`.
/// The result is contiguous.
///
/// # Panics
/// If the channel counts of `x` and `weight` differ, `bias` is not `[Co]`, `stride == 0`, or the
/// kernel does not fit in the padded input.
pub(crate) fn conv2d<D, T>(
    x: Tensor<Shape4, f64, D, T>,
    weight: &Tensor<Shape4, f64, D>,
    bias: &Tensor<(usize,), f64, D>,
    stride: usize,
    padding: usize,
) -> Tensor<Shape4, f64, D, T>
where
    D: Device<f64>,
    T: Tape<f64, D> + Merge<NoneTape>,
{
    let (b, c, h, w) = *x.shape();
    let (co, wc, kh, kw) = *weight.shape();
    assert_eq!(c, wc, "conv2d: input has {c} channels, weight expects {wc}");
    let nb = bias.shape().0;
    assert_eq!(nb, co, "conv2d: bias has {nb} entries, expected {co}");
    let ho = conv_out_len(h, kh, stride, padding);
    let wo = conv_out_len(w, kw, stride, padding);
    let n = c * h * w;
    let k = c * kh * kw;
    let p = ho * wo;
    let dev = x.device().clone();

    // [B, N] ++ [B, 1] zeros → [B, N + 1], viewed as [N + 1, B].
    let flat = x.reshape_like(&(b, n));
    let zero_col: Tensor<(usize, usize), f64, D> = dev.zeros_like(&(b, 1));
    let padded = (flat, zero_col).concat_along(Axis::<1>);
    let padded_t = padded.permute::<(usize, usize), Axes2<1, 0>>();

    // im2col: gather rows → [K·P, B] (contiguous), i.e. [K, P·B], used as [P·B, K].
    let idx = dev.tensor_from_vec(
        im2col_index((c, h, w), (kh, kw), (ho, wo), stride, padding),
        (k * p,),
    );
    let cols = padded_t.gather::<(usize, usize), (usize,)>(idx);
    let cols = cols
        .reshape_like(&(k, p * b))
        .permute::<(usize, usize), Axes2<1, 0>>();

    // [P·B, K] · [K, Co] + bias → [P·B, Co].
    let w_t = weight
        .clone()
        .reshape_like(&(co, k))
        .permute::<(usize, usize), Axes2<1, 0>>();
    let y = cols.matmul(w_t);
    let y = y + bias.clone().broadcast_like::<_, Axis<0>>(&(p * b, co));

    // [Ho, Wo, B, Co] → [B, Co, Ho, Wo].
    y.reshape_like(&(ho, wo, b, co))
        .permute::<Shape4, Axes4<2, 3, 0, 1>>()
        .contiguous()
}

/// Non-overlapping `k×k` max pooling (stride `k`), with autodiff through a gather.
///
/// Like PyTorch's `MaxPool2d(k)` (floor mode): when `H` or `W` is not a multiple of `k`, the
/// trailing rows/columns that do not fill a window are dropped. The backward pass sends each
/// window's upstream gradient to its first maximal entry (row-major within the window) only, as
/// PyTorch does: with distinct values this is the exact derivative, and under an exact tie it is
/// a valid one (a tie that persists, such as two identical patches, is one function counted once).
///
/// # Shapes
/// `x [B, C, H, W]` → `[B, C, H / k, W / k]` (integer division). The result is contiguous.
///
/// # Panics
/// If `k == 0` or `k > H` or `k > W`.
pub(crate) fn max_pool2d<D, T>(x: Tensor<Shape4, f64, D, T>, k: usize) -> Tensor<Shape4, f64, D, T>
where
    D: Device<f64>,
    T: Tape<f64, D>,
{
    let (b, c, h, w) = *x.shape();
    assert!(k > 0, "max_pool2d: window must be positive");
    assert!(
        k <= h && k <= w,
        "max_pool2d: window {k} larger than input {h}x{w}"
    );
    let (ho, wo) = (h / k, w / k);
    let v = x.as_vec();
    let mut idx = Vec::with_capacity(b * c * ho * wo);
    for bc in 0..b * c {
        for oh in 0..ho {
            for ow in 0..wo {
                let mut best = (bc * h + oh * k) * w + ow * k;
                for i in 0..k {
                    for j in 0..k {
                        let q = (bc * h + oh * k + i) * w + ow * k + j;
                        if v[q] > v[best] {
                            best = q;
                        }
                    }
                }
                idx.push(best);
            }
        }
    }
    let dev = x.device().clone();
    let idx = dev.tensor_from_vec(idx, (b * c * ho * wo,));
    x.reshape_like(&(b * c * h * w,))
        .gather::<(usize,), (usize,)>(idx)
        .reshape_like(&(b, c, ho, wo))
}

/// Plain-loop reference for [`conv2d`] on row-major (NCHW) slices; same semantics.
///
/// # Shapes
/// `x` holds `xs = [B, C, H, W]`, `weight` holds `ws = [Co, C, kh, kw]`, `bias` holds `[Co]`;
/// returns the output data and its shape `[B, Co, Ho, Wo]`,
/// `Ho = (H + 2·padding − kh) / stride + 1`, `Wo = (W + 2·padding − kw) / stride + 1`.
///
/// # Panics
/// If a slice length does not match its shape, the channel counts differ, `stride == 0`, or the
/// kernel does not fit in the padded input.
pub(crate) fn conv2d_direct(
    x: &[f64],
    xs: [usize; 4],
    weight: &[f64],
    ws: [usize; 4],
    bias: &[f64],
    stride: usize,
    padding: usize,
) -> (Vec<f64>, [usize; 4]) {
    let [b, c, h, w] = xs;
    let [co, wc, kh, kw] = ws;
    assert_eq!(
        x.len(),
        b * c * h * w,
        "conv2d_direct: x length does not match {xs:?}"
    );
    assert_eq!(
        weight.len(),
        co * wc * kh * kw,
        "conv2d_direct: weight length does not match {ws:?}"
    );
    assert_eq!(
        c, wc,
        "conv2d_direct: input has {c} channels, weight expects {wc}"
    );
    assert_eq!(
        bias.len(),
        co,
        "conv2d_direct: bias has {} entries, expected {co}",
        bias.len()
    );
    let ho = conv_out_len(h, kh, stride, padding);
    let wo = conv_out_len(w, kw, stride, padding);
    let mut out = vec![0.0; b * co * ho * wo];
    for bi in 0..b {
        for o in 0..co {
            for oh in 0..ho {
                for ow in 0..wo {
                    let mut acc = bias[o];
                    for ci in 0..c {
                        for i in 0..kh {
                            let ih = (oh * stride + i) as isize - padding as isize;
                            if ih < 0 || ih >= h as isize {
                                continue;
                            }
                            for j in 0..kw {
                                let iw = (ow * stride + j) as isize - padding as isize;
                                if iw < 0 || iw >= w as isize {
                                    continue;
                                }
                                let xv = x[((bi * c + ci) * h + ih as usize) * w + iw as usize];
                                let wv = weight[((o * c + ci) * kh + i) * kw + j];
                                acc += wv * xv;
                            }
                        }
                    }
                    out[((bi * co + o) * ho + oh) * wo + ow] = acc;
                }
            }
        }
    }
    (out, [b, co, ho, wo])
}

/// Plain-loop reference for [`max_pool2d`] on a row-major (NCHW) slice; same semantics
/// (non-overlapping `k×k` windows, floor mode).
///
/// # Shapes
/// `x` holds `xs = [B, C, H, W]`; returns the output data and its shape `[B, C, H / k, W / k]`.
///
/// # Panics
/// If `x.len()` does not match `xs`, `k == 0`, or `k > H` or `k > W`.
pub(crate) fn max_pool2d_direct(x: &[f64], xs: [usize; 4], k: usize) -> (Vec<f64>, [usize; 4]) {
    let [b, c, h, w] = xs;
    assert_eq!(
        x.len(),
        b * c * h * w,
        "max_pool2d_direct: x length does not match {xs:?}"
    );
    assert!(k > 0, "max_pool2d_direct: window must be positive");
    assert!(
        k <= h && k <= w,
        "max_pool2d_direct: window {k} larger than input {h}x{w}"
    );
    let (ho, wo) = (h / k, w / k);
    let mut out = vec![0.0; b * c * ho * wo];
    for bc in 0..b * c {
        for oh in 0..ho {
            for ow in 0..wo {
                let mut m = f64::NEG_INFINITY;
                for i in 0..k {
                    for j in 0..k {
                        m = m.max(x[(bc * h + oh * k + i) * w + ow * k + j]);
                    }
                }
                out[(bc * ho + oh) * wo + ow] = m;
            }
        }
    }
    (out, [b, c, ho, wo])
}

#[cfg(test)]
mod tests {
    use super::*;
    use dfdx::tensor::{Cpu, Gradients, TensorFromVec, Trace};
    use dfdx::tensor_ops::{Backward, SumTo};
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const H_FD: f64 = 1e-6;
    const FD_TOL: f64 = 1e-7;

    fn randn(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
        (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
    }

    /// `n` distinct values, shuffled, pairwise separated by at least 1e-3 (≫ the FD step).
    fn distinct(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
        let mut v: Vec<f64> = (0..n).map(|i| (i as f64 - n as f64 / 2.0) * 0.01).collect();
        v.shuffle(rng);
        // small jitter that keeps the ordering gaps ≥ 0.01 − 2·0.002
        v.iter_mut()
            .for_each(|a| *a += rng.gen_range(-0.002..0.002));
        v
    }

    fn t4(dev: &Cpu, v: &[f64], s: [usize; 4]) -> Tensor<Shape4, f64, Cpu> {
        dev.tensor_from_vec(v.to_vec(), (s[0], s[1], s[2], s[3]))
    }

    fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len(), "length mismatch");
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    fn assert_fd_close(name: &str, got: &[f64], fd: &[f64]) {
        assert_eq!(got.len(), fd.len(), "{name}: length mismatch");
        let mut nonzero = 0;
        for (i, (g, f)) in got.iter().zip(fd).enumerate() {
            let tol = FD_TOL * g.abs().max(f.abs()).max(1.0);
            assert!(
                (g - f).abs() <= tol,
                "{name}[{i}]: autodiff {g} vs finite difference {f}"
            );
            if g.abs() > 1e-9 {
                nonzero += 1;
            }
        }
        assert!(
            nonzero > 0,
            "{name}: gradient is identically zero; test would be vacuous"
        );
    }

    /// Central differences of `f` at `v` in every coordinate.
    fn central_fd(v: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        let mut p = v.to_vec();
        (0..v.len())
            .map(|i| {
                let orig = p[i];
                p[i] = orig + H_FD;
                let up = f(&p);
                p[i] = orig - H_FD;
                let down = f(&p);
                p[i] = orig;
                (up - down) / (2.0 * H_FD)
            })
            .collect()
    }

    fn dot(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn direct_conv_matches_hand_computed() {
        // x = [[1,2,3],[4,5,6],[7,8,9]], kernel [[1,0],[0,-1]], bias 0.5.
        let x: Vec<f64> = (1..=9).map(|v| v as f64).collect();
        let w = [1.0, 0.0, 0.0, -1.0];
        let (y, s) = conv2d_direct(&x, [1, 1, 3, 3], &w, [1, 1, 2, 2], &[0.5], 1, 0);
        assert_eq!(s, [1, 1, 2, 2]);
        // x[i][j] − x[i+1][j+1] = −4 everywhere, + 0.5
        assert_eq!(y, vec![-3.5; 4]);
        // padding 1, stride 2: positions (−1,−1),(−1,1),(1,−1),(1,1) of the padded grid.
        let (y, s) = conv2d_direct(&x, [1, 1, 3, 3], &w, [1, 1, 2, 2], &[0.0], 2, 1);
        assert_eq!(s, [1, 1, 2, 2]);
        // out(0,0) = 0·1 − x[0][0] = −1; out(0,1) = −x[0][2] = −3; out(1,0) = −x[2][0] = −7;
        // out(1,1) = x[1][1] − x[2][2] = 5 − 9 = −4.
        assert_eq!(y, vec![-1.0, -3.0, -7.0, -4.0]);
    }

    #[test]
    fn direct_pool_matches_hand_computed() {
        // 1×1×4×5 (floor mode drops the last column), distinct maxima in different corners.
        #[rustfmt::skip]
        let x = [
            9.0, 1.0,   2.0, 3.0,   100.0,
            0.0, 2.0,   4.0, 8.0,   100.0,
            1.0, 0.5,  -1.0, -2.0,  100.0,
            0.25, 7.0, -3.0, -0.5,  100.0,
        ];
        let (y, s) = max_pool2d_direct(&x, [1, 1, 4, 5], 2);
        assert_eq!(s, [1, 1, 2, 2]);
        assert_eq!(y, vec![9.0, 8.0, 7.0, -0.5]);
    }

    #[test]
    fn conv2d_matches_direct() {
        let dev: Cpu = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut checked = 0;
        for &(c, co) in &[(1usize, 2usize), (3, 4), (3, 3)] {
            for &k in &[3usize, 5] {
                for &stride in &[1usize, 2] {
                    for &padding in &[0usize, 1] {
                        let (b, h, w) = (2, 9, 8);
                        let xs = [b, c, h, w];
                        let ws = [co, c, k, k];
                        let x = randn(&mut rng, b * c * h * w);
                        let wt = randn(&mut rng, co * c * k * k);
                        let bias = randn(&mut rng, co);
                        let (want, ys) = conv2d_direct(&x, xs, &wt, ws, &bias, stride, padding);
                        let got = conv2d(
                            t4(&dev, &x, xs),
                            &t4(&dev, &wt, ws),
                            &dev.tensor_from_vec(bias.clone(), (co,)),
                            stride,
                            padding,
                        );
                        assert_eq!(*got.shape(), (ys[0], ys[1], ys[2], ys[3]));
                        let d = max_abs_diff(&got.as_vec(), &want);
                        assert!(
                            d <= 1e-12,
                            "c={c} co={co} k={k} s={stride} p={padding}: diff {d}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 24);
    }

    #[test]
    fn conv2d_non_square_and_padding_larger_than_needed() {
        let dev: Cpu = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        // kh ≠ kw, H ≠ W, padding 2, batch 3, stride 3.
        for &(stride, padding) in &[(1usize, 2usize), (3, 2), (2, 0)] {
            let xs = [3, 2, 7, 6];
            let ws = [3, 2, 3, 2];
            let x = randn(&mut rng, xs.iter().product());
            let wt = randn(&mut rng, ws.iter().product());
            let bias = randn(&mut rng, 3);
            let (want, ys) = conv2d_direct(&x, xs, &wt, ws, &bias, stride, padding);
            let got = conv2d(
                t4(&dev, &x, xs),
                &t4(&dev, &wt, ws),
                &dev.tensor_from_vec(bias, (3,)),
                stride,
                padding,
            );
            assert_eq!(*got.shape(), (ys[0], ys[1], ys[2], ys[3]));
            assert!(max_abs_diff(&got.as_vec(), &want) <= 1e-12);
        }
    }

    #[test]
    fn max_pool2d_matches_direct() {
        let dev: Cpu = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        for &xs in &[[2usize, 3usize, 6usize, 8usize], [2, 1, 4, 4], [1, 2, 7, 5]] {
            let n: usize = xs.iter().product();
            for x in [randn(&mut rng, n), distinct(&mut rng, n)] {
                let (want, ys) = max_pool2d_direct(&x, xs, 2);
                let got = max_pool2d(t4(&dev, &x, xs), 2);
                assert_eq!(*got.shape(), (ys[0], ys[1], ys[2], ys[3]));
                assert!(max_abs_diff(&got.as_vec(), &want) <= 1e-15);
            }
        }
        // Hand example: the maximum sits in a different corner of each window.
        #[rustfmt::skip]
        let x = vec![
            9.0, 1.0,   2.0, 3.0,
            0.0, 2.0,   4.0, 8.0,
            1.0, 0.5,  -1.0, -2.0,
            0.25, 7.0, -3.0, -0.5,
        ];
        let got = max_pool2d(t4(&dev, &x, [1, 1, 4, 4]), 2);
        assert_eq!(got.as_vec(), vec![9.0, 8.0, 7.0, -0.5]);
    }

    /// Checks d/d{x, weight, bias} of `sum(conv(x) · R)` against central differences.
    fn check_conv_grads(seed: u64, xs: [usize; 4], ws: [usize; 4], stride: usize, padding: usize) {
        let dev: Cpu = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let co = ws[0];
        let x = randn(&mut rng, xs.iter().product());
        let wt = randn(&mut rng, ws.iter().product());
        let bias = randn(&mut rng, co);
        let (_, ys) = conv2d_direct(&x, xs, &wt, ws, &bias, stride, padding);
        let r = randn(&mut rng, ys.iter().product());

        let xt = t4(&dev, &x, xs);
        let wt_t = t4(&dev, &wt, ws);
        let bt = dev.tensor_from_vec(bias.clone(), (co,));
        let rt = t4(&dev, &r, ys);
        let y = conv2d(xt.leaky_trace(), &wt_t, &bt, stride, padding);
        let grads: Gradients<f64, Cpu> = (y * rt).sum().backward();
        let gx = grads.get(&xt).as_vec();
        let gw = grads.get(&wt_t).as_vec();
        let gb = grads.get(&bt).as_vec();

        let fd_x = central_fd(&x, |xv| {
            dot(
                &conv2d_direct(xv, xs, &wt, ws, &bias, stride, padding).0,
                &r,
            )
        });
        let fd_w = central_fd(&wt, |wv| {
            dot(&conv2d_direct(&x, xs, wv, ws, &bias, stride, padding).0, &r)
        });
        let fd_b = central_fd(&bias, |bv| {
            dot(&conv2d_direct(&x, xs, &wt, ws, bv, stride, padding).0, &r)
        });
        assert_fd_close("d/dx", &gx, &fd_x);
        assert_fd_close("d/dweight", &gw, &fd_w);
        assert_fd_close("d/dbias", &gb, &fd_b);
    }

    #[test]
    fn conv2d_gradients_match_finite_differences() {
        check_conv_grads(31, [2, 1, 6, 6], [2, 1, 3, 3], 1, 0);
        check_conv_grads(32, [2, 3, 7, 7], [4, 3, 3, 3], 2, 1);
        check_conv_grads(33, [2, 3, 8, 7], [3, 3, 5, 5], 1, 1);
        check_conv_grads(34, [2, 1, 9, 9], [2, 1, 5, 5], 2, 0);
    }

    #[test]
    fn max_pool2d_gradient_matches_finite_differences() {
        let dev: Cpu = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        for &xs in &[[2usize, 3usize, 6usize, 4usize], [2, 2, 5, 7]] {
            let x = distinct(&mut rng, xs.iter().product());
            let (_, ys) = max_pool2d_direct(&x, xs, 2);
            let r = randn(&mut rng, ys.iter().product());
            let xt = t4(&dev, &x, xs);
            let y = max_pool2d(xt.leaky_trace(), 2);
            let grads = (y * t4(&dev, &r, ys)).sum().backward();
            let gx = grads.get(&xt).as_vec();
            let fd = central_fd(&x, |xv| dot(&max_pool2d_direct(xv, xs, 2).0, &r));
            assert_fd_close("pool d/dx", &gx, &fd);
            // Exactly one nonzero per window (all windows have distinct values, R ≠ 0).
            let nz = gx.iter().filter(|g| **g != 0.0).count();
            assert_eq!(nz, ys.iter().product::<usize>());
        }
    }

    #[test]
    fn max_pool2d_sends_a_tied_window_gradient_to_its_first_maximum_only() {
        let dev: Cpu = Default::default();
        #[rustfmt::skip]
        let x = vec![
            1.0, 1.0,   0.0, 2.0,
            0.5, 1.0,   2.0, 2.0,
        ];
        let xt = t4(&dev, &x, [1, 1, 2, 4]);
        let y = max_pool2d(xt.leaky_trace(), 2);
        assert_eq!(y.as_vec(), vec![1.0, 2.0]);
        let g = y.sum().backward().get(&xt).as_vec();
        assert_eq!(g, vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn conv_relu_pool_gradients_match_finite_differences() {
        let dev: Cpu = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(51);
        let (xs, ws, stride, padding, pool) =
            ([2usize, 3usize, 8usize, 8usize], [4usize, 3, 3, 3], 1, 1, 2);
        let x = randn(&mut rng, xs.iter().product());
        let wt = randn(&mut rng, ws.iter().product());
        let bias = randn(&mut rng, ws[0]);
        let forward = |xv: &[f64], wv: &[f64], bv: &[f64]| -> (Vec<f64>, [usize; 4]) {
            let (mut c, cs) = conv2d_direct(xv, xs, wv, ws, bv, stride, padding);
            c.iter_mut().for_each(|v| *v = v.max(0.0));
            max_pool2d_direct(&c, cs, pool)
        };
        let (_, ys) = forward(&x, &wt, &bias);
        let r = randn(&mut rng, ys.iter().product());

        // The FD check is only meaningful away from ReLU kinks and pool ties.
        let (pre, _) = conv2d_direct(&x, xs, &wt, ws, &bias, stride, padding);
        assert!(
            pre.iter().all(|v| v.abs() > 1e-4),
            "pre-activation too close to the ReLU kink"
        );

        let xt = t4(&dev, &x, xs);
        let wt_t = t4(&dev, &wt, ws);
        let bt = dev.tensor_from_vec(bias.clone(), (ws[0],));
        let y = max_pool2d(
            conv2d(xt.leaky_trace(), &wt_t, &bt, stride, padding).relu(),
            pool,
        );
        let (want, _) = forward(&x, &wt, &bias);
        assert!(max_abs_diff(&y.as_vec(), &want) <= 1e-12);
        let grads = (y * t4(&dev, &r, ys)).sum().backward();

        let fd_x = central_fd(&x, |xv| dot(&forward(xv, &wt, &bias).0, &r));
        let fd_w = central_fd(&wt, |wv| dot(&forward(&x, wv, &bias).0, &r));
        let fd_b = central_fd(&bias, |bv| dot(&forward(&x, &wt, bv).0, &r));
        assert_fd_close("conv-relu-pool d/dx", &grads.get(&xt).as_vec(), &fd_x);
        assert_fd_close(
            "conv-relu-pool d/dweight",
            &grads.get(&wt_t).as_vec(),
            &fd_w,
        );
        assert_fd_close("conv-relu-pool d/dbias", &grads.get(&bt).as_vec(), &fd_b);
    }

    #[test]
    fn gradients_accumulate_with_traced_input() {
        // The crate's other convention: x.traced(grads) accumulating into an existing Gradients.
        let dev: Cpu = Default::default();
        let mut rng = ChaCha8Rng::seed_from_u64(61);
        let xs = [1, 2, 5, 5];
        let ws = [2, 2, 3, 3];
        let x = randn(&mut rng, 50);
        let wt = randn(&mut rng, 36);
        let xt = t4(&dev, &x, xs);
        let wt_t = t4(&dev, &wt, ws);
        let bt = dev.tensor_from_vec(vec![0.1, -0.2], (2,));
        let mut grads: Gradients<f64, Cpu> = Gradients::leaky();
        for _ in 0..2 {
            let y = conv2d(xt.clone().traced(grads), &wt_t, &bt, 1, 1);
            grads = y.sum().backward();
        }
        let gb = grads.get(&bt).as_vec();
        // d sum / d bias[o] = number of output positions (25), accumulated twice.
        assert!(max_abs_diff(&gb, &[50.0, 50.0]) <= 1e-12, "{gb:?}");
        let once = {
            let y = conv2d(xt.leaky_trace(), &wt_t, &bt, 1, 1);
            y.sum().backward().get(&wt_t).as_vec()
        };
        let twice = grads.get(&wt_t).as_vec();
        let doubled: Vec<f64> = once.iter().map(|v| 2.0 * v).collect();
        assert!(max_abs_diff(&twice, &doubled) <= 1e-12);
    }
}
