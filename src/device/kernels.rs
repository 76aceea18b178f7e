//! The kernels of `kernels/epk.cu`, declared once: their arguments, and the length each buffer
//! argument must have for the `n` work items of a call (checked before every launch, on every
//! backend, so that no call reads or writes outside a buffer).
//!
//! Each entry names its item count first (`n;`, the kernel's first parameter), then its
//! arguments. Argument kinds: `i` an `i64`, `f` an `f64`, `r` a buffer read, `w` a buffer written.
//! `scripts/gpu/ptx.py` reads this list too and checks that the PTX of every kernel takes these
//! parameters; the host's are the C functions of the same names (`build.rs`).

use super::Backend;
use crate::error::{Error, Result};

/// The kernels whose items are whole row points (a few thousand items, each thousands of
/// operations): a device launches them in narrow blocks, so that they spread over its
/// multiprocessors.
pub(crate) const POINT_ITEM_KERNELS: &[&str] = &["pk_mlp_pieces"];

/// One argument of a launch, in the kernel's order (after `n`).
pub(crate) enum Arg<'a, B> {
    I(i64),
    F(f64),
    R(&'a B),
    W(&'a mut B),
}

/// The length a buffer argument needs, or the one-line reason a call is refused.
fn need(kernel: &str, arg: &str, have: usize, want: i64) -> Result<()> {
    if want < 0 || (have as u64) < want as u64 {
        return Err(Error::Backend(format!("device kernel {kernel}: buffer `{arg}` holds {have} numbers, the call needs {want}")));
    }
    Ok(())
}

macro_rules! arg_ty {
    (i, $b:ty) => { i64 };
    (f, $b:ty) => { f64 };
    (r, $b:ty) => { &$b };
    (w, $b:ty) => { &mut $b };
}

macro_rules! wrap {
    (i, $v:ident) => { Arg::I($v) };
    (f, $v:ident) => { Arg::F($v) };
    (r, $v:ident) => { Arg::R($v) };
    (w, $v:ident) => { Arg::W($v) };
}

#[cfg(test)]
macro_rules! c_ty {
    (i) => { i64 };
    (f) => { f64 };
    (r) => { *const f64 };
    (w) => { *mut f64 };
}

#[cfg(test)]
macro_rules! unwrap_host {
    (i, $a:expr, $k:expr) => { match $a { Some(Arg::I(v)) => *v, _ => return Err(mismatch($k)) } };
    (f, $a:expr, $k:expr) => { match $a { Some(Arg::F(v)) => *v, _ => return Err(mismatch($k)) } };
    (r, $a:expr, $k:expr) => { match $a { Some(Arg::R(b)) => b.as_ptr(), _ => return Err(mismatch($k)) } };
    (w, $a:expr, $k:expr) => { match $a { Some(Arg::W(b)) => b.as_mut_ptr(), _ => return Err(mismatch($k)) } };
}

#[cfg(test)]
fn mismatch(kernel: &str) -> Error {
    Error::Backend(format!("device kernel {kernel}: arguments do not match its declaration"))
}

macro_rules! kernels {
    ($( $(#[$doc:meta])* $name:ident ( $n:ident; $($arg:ident : $kind:ident $([$len:expr])?),* ); )*) => {
        /// Every kernel's name and its arguments' kinds (after `n`), in declaration order.
        pub(crate) const KERNELS: &[(&str, &[&str])] = &[$((stringify!($name), &[$(stringify!($kind)),*])),*];

        /// The kernels, with their arguments checked, on any backend that can launch them.
        #[allow(clippy::too_many_arguments)]
        pub(crate) trait Kernels: Backend {
            /// Runs kernel `name` on `n` work items with `args` (checked by the callers below).
            fn launch(&self, name: &'static str, n: usize, args: &mut [Arg<'_, Self::Buf>]) -> Result<()>;

            $(
                $(#[$doc])*
                #[allow(unused_variables, clippy::identity_op)]
                fn $name(&self, $n: usize, $($arg: arg_ty!($kind, Self::Buf)),*) -> Result<()> {
                    if $n == 0 {
                        return Ok(());
                    }
                    let items = $n;
                    {
                        let $n = $n as i64;
                        $($( need(stringify!($name), stringify!($arg), self.len($arg), $len)?; )?)*
                    }
                    self.launch(stringify!($name), items, &mut [$(wrap!($kind, $arg)),*])
                }
            )*
        }

        #[cfg(test)]
        mod ffi {
            extern "C" {
                $( pub(super) fn $name(n: i64, $($arg: c_ty!($kind)),*); )*
            }
        }

        /// Runs kernel `name` compiled for the host (one thread, a plain loop over the items).
        #[cfg(test)]
        pub(crate) fn host_launch(name: &str, n: usize, args: &mut [Arg<'_, Vec<f64>>]) -> Result<()> {
            match name {
                $(stringify!($name) => {
                    let mut it = args.iter_mut();
                    $( let $arg = unwrap_host!($kind, it.next(), stringify!($name)); )*
                    // SAFETY: the typed callers of `Kernels` checked every buffer's length against
                    // what the kernel reads and writes for `n` items, and the pointers come from
                    // distinct live `Vec`s (a `W` argument is a unique borrow).
                    unsafe { ffi::$name(n as i64, $($arg),*) };
                    Ok(())
                })*
                other => Err(Error::Backend(format!("no device kernel named {other}"))),
            }
        }
    };
}

kernels! {
    /// `y0[i] += t[i / per]·y1[i]`: the combine by t of a layer linear in its parameters.
    pk_combine(n; per: i, t: r[n / per], y1: r[n], y0: w[n]);
    /// `y[r, j, q] += b[j]` for `y` `[rows, out, inner]`.
    pk_add_bias(n; out: i, inner: i, b: r[out], y: w[n]);
    /// `y = σ(x)` (`kind` as `program::act_code` numbers them).
    pk_act(n; kind: i, slope: f, x: r[n], y: w[n]);
    /// `dy[s, c, j] *= σ'(x[s, j])`, `per` numbers and `k` rows per sample.
    pk_act_back(n; per: i, k: i, kind: i, slope: f, x: r[n / k], dy: w[n]);
    /// im2col: `x` `[n_s, c, h, w]` to patches `u` `[n_s, ho·wo, c·kk·kk]`.
    pk_im2col(n; c: i, h: i, w: i, kk: i, stride: i, pad: i, ho: i, wo: i, x: r[n / (ho * wo * c * kk * kk) * c * h * w], u: w[n]);
    /// col2im as a gather: patch sensitivities `[rows, ho·wo, c·kk·kk]` to `[rows, c, h, w]`.
    pk_col2im(n; c: i, h: i, w: i, kk: i, stride: i, pad: i, ho: i, wo: i, du: r[n / (c * h * w) * ho * wo * c * kk * kk], dx: w[n]);
    /// Max pooling with each window's winner (its offset in the sample).
    pk_maxpool(n; c: i, h: i, w: i, kk: i, stride: i, ho: i, wo: i, x: r[n / (c * ho * wo) * c * h * w], y: w[n], arg: w[n]);
    /// Max pooling's input sensitivities (`k` rows per sample) as a gather.
    pk_maxpool_back(n; k: i, c: i, h: i, w: i, kk: i, stride: i, ho: i, wo: i, arg: r[n / (c * h * w * k) * c * ho * wo], dy: r[n / (c * h * w) * c * ho * wo], dx: w[n]);
    /// Average pooling.
    pk_avgpool(n; c: i, h: i, w: i, kk: i, stride: i, ho: i, wo: i, x: r[n / (c * ho * wo) * c * h * w], y: w[n]);
    /// Average pooling's input sensitivities as a gather.
    pk_avgpool_back(n; c: i, h: i, w: i, kk: i, stride: i, ho: i, wo: i, dy: r[n / (c * h * w) * c * ho * wo], dx: w[n]);
    /// The output map of `n` rows of `k` raw outputs in place, and its seeds `[n, k, k]`.
    pk_output_seeds(n; k: i, log_softmax: i, alpha: f, has_off: i, off: r[if has_off != 0 { n * k } else { 0 }], g: w[n * k], seeds: w[n * k * k]);
    /// `y[r] = [x[r], 1]` with `m` numbers a row of `x`.
    pk_append_one(n; m: i, x: r[n / (m + 1) * m], y: w[n]);
    /// `dst[r·stride + offset + o] = Σ_q dy[r, o, q]` for `dy` `[rows, out, inner]`.
    pk_row_sums(n; out: i, inner: i, stride: i, offset: i, dy: r[n * inner], dst: w[(n / out - 1) * stride + offset + out]);
    /// `y += x`.
    pk_add(n; x: r[n], y: w[n]);
    /// Layer norm over `g` values at each of `positions` per sample (`seq`: a sequence's rows),
    /// γ and β at each sample's `t`; keeps `x̂` and `1/√(σ² + ε)`.
    pk_norm(n; g: i, positions: i, seq: i, eps: f, t: r[n / positions], gamma: r[g], dgamma: r[g], beta: r[g], dbeta: r[g], x: r[n * g], y: w[n * g], xhat: w[n * g], rstd: w[n]);
    /// Layer norm's input sensitivities for `k` rows per sample.
    pk_norm_back(n; k: i, g: i, positions: i, seq: i, t: r[n / positions / k], gamma: r[g], dgamma: r[g], xhat: r[n / k * g], rstd: r[n / k], dy: r[n * g], dx: w[n * g]);
    /// Layer norm's parameter gradients `[rows, 2g]` (γ then β).
    pk_norm_grads(n; k: i, g: i, positions: i, seq: i, xhat: r[n / g / k * g * positions], dy: r[n * positions], pg: w[n * 2]);
    /// The weighted sum of each segment of rows (`start` `[segments + 1]`, clamped to `rows`).
    pk_segment_sum(n; width: i, rows: i, start: r[n / width + 1], wt: r[rows], g: r[rows * width], out: w[n]);
    /// `y += c`.
    pk_add_scalar(n; c: f, y: w[n]);
    /// Layer 0's fold of a block of `nb` points' product, scaled by `x_p·x_i + 1`, into the
    /// Gram rows of points `p0..` (`kernel::backend::resident`).
    pk_fold_scaled(n; m: i, cols: i, rpp: i, k: i, diag: i, nb: i, p0: i, s0: r[(p0 + n / (m * cols * rpp)) * m], prod: r[n], g: w[p0 * rpp * m * cols + n]);
    /// The output layer's fold against a structured training side (`diag`, `trace`).
    pk_fold_soft(n; m: i, k: i, trace: i, has_w: i, scale: f, p0: i, tb: r[n * (k + 1)], q: r[k * m], w: r[if has_w != 0 { k * m } else { 0 }], g: w[(p0 + n / m) * m * if trace != 0 { 1 } else { k }]);
    /// The output layer's fold in the `full` layout against formed training sensitivities.
    pk_fold_output_full(n; m: i, k: i, alpha: f, p0: i, tb: r[n / (k * m * k) * (k + 1) * m], d: r[k * m * k], g: w[p0 * k * m * k + n]);
    /// One step's layer-0 factors of the points `first..` into slot `slot` of a layer-0 step
    /// buffer (`kernel::gram`'s `Layer0Sum` layouts, numbered 0 `full`, 1 `diag`, 2 `trace`),
    /// scaled by Chen's column weights `w` `[points, k]` when `has_w`.
    pk_put_slot(n; k: i, h: i, slots: i, slot: i, layout: i, npts: i, first: i, has_w: i, src: r[n], w: r[if has_w != 0 { (first + n / (h * k)) * k } else { 0 }], dst: w[npts * k * slots * h]);
    /// Layer 0's training sensitivities `[M, K, h]` of the closed form at `w_s` from the output
    /// layer's `d1` `[M, K, K]`, the activations `a1` `[M, ne]` (the ReLU's derivative) and
    /// `W_1` `[K, h]`.
    pk_mlp_delta0(n; k: i, h: i, ne: i, d1: r[n / h * k], a1: r[n / (k * h) * ne], w1: r[k * h], d0: w[n]);
    /// The closed form's prediction of `n / k` points from their factors (`dbar` `[n, h]`,
    /// `ab` `[n / k, k + 1, ne]`), `vx = V_0 x̃` `[n / k, h]` and `V_1` `[k, ne]`.
    pk_mlp_predict(n; k: i, h: i, ne: i, alpha: f, dbar: r[n * h], vx: r[n / k * h], ab: r[n / k * (k + 1) * ne], v1: r[k * ne], pred: w[n]);
    /// The `dense → relu → dense` closed form's rows of `n` points, integrated between their
    /// kinks (`kernel::stack::closed::dense_relu::pieces`), each point's scratch its own.
    pk_mlp_pieces(n; h: i, k: i, bias: i, softmax: i, has_off: i, cosine: i, alpha: f, tol: f, z: r[n * h], u: r[n * h], xsq: r[n], off: r[if has_off != 0 { n * k } else { 0 }], w: r[k * h], dw: r[k * h], b: r[k], db: r[k], gl: r[48], scratch: w[n * (5 * h + 2 + 2 * (h + bias) + 13 * k + 6 * k * k)], dbar: w[n * k * h], ab: w[n * (k + 1) * (h + bias)], diag: w[n * k * k], stats: w[n * 4]);
}
