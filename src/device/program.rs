//! A layer stack lowered to a backend's GEMMs and kernels: forward and backward on a block of
//! node rows, each row at its own point `w_s + t·Δw` of a step, with K cotangents per row.
//!
//! Each layer kind says what it is here through the layer contract (`Layer::device`, an
//! [`Op`]); this file lowers the ops, the layer kinds' files say which op they are. Per op:
//!
//! - `Dense`: `Y = X W_sᵀ + b_s + t·(X ΔWᵀ + Δb)` (two GEMMs, a combine by t); backward
//!   `dX = dY W_s + t·dY ΔW`; its gradient stays factored (`[X, 1]` and `dY`).
//! - `Conv`: im2col once per row, `Y_s = W_s U_sᵀ + t_s·ΔW U_sᵀ` as batched GEMMs; backward
//!   `dU = dYᵀ W(t)` then col2im as a gather; its gradient formed per row and class
//!   (`dY_{s,c} U_s`, K batched GEMMs, and the bias's row sums).
//! - `Norm` (layer norm): kernels per group of values, its gradient formed (`2G` per class).
//! - `Act`, `MaxPool`, `AvgPool`: kernels; `Reshape`: nothing.
//! - `Residual`: its body's ops and its shortcut (a projection op, or the identity), summed.
//!
//! # Shapes
//! A block of `n` rows: inputs `[n, d]`, times `[n]`, outputs `[n, K]`, cotangents `[n, K, ·]`.

use super::kernels::Kernels;
use super::{Gemm, Operand};
use crate::error::{Error, Result};

/// A pooling window's geometry: `[c, h, w]` maps, square windows `k` with stride `stride`, no
/// padding, `[c, ho, wo]` outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub ho: usize,
    pub wo: usize,
}

impl Window {
    /// The pooling kernels' geometry arguments, in their order: `c, h, w, kk, stride, ho, wo`.
    fn args(&self) -> [i64; 7] {
        [self.c, self.h, self.w, self.k, self.stride, self.ho, self.wo].map(|v| v as i64)
    }
}

/// What a layer computes on a backend (its parameters are the stack's tensors from its `first`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    /// `Linear(n_in, n_out)`: `weight [n_out, n_in]`, `bias [n_out]` when `bias`.
    Dense { n_in: usize, n_out: usize, bias: bool },
    /// `Conv2d` on `[c, h, w]` to `[co, ho, wo]`: `weight [co, c, k, k]`, `bias [co]`.
    Conv { c: usize, h: usize, w: usize, co: usize, k: usize, stride: usize, padding: usize, ho: usize, wo: usize, bias: bool },
    /// An activation applied to each number (`kind` as [`act_code`] numbers it).
    Act { kind: i64, slope: f64 },
    /// Max pooling, with each window's first maximum as the winner.
    MaxPool(Window),
    /// Average pooling.
    AvgPool(Window),
    /// The numbers unchanged (a flatten).
    Reshape,
    /// Layer norm over `g` values at each of `positions` per sample (`seq`: a sequence's rows
    /// `[T, g]`, else a map's channels or a flat vector): `weight [g]`, `bias [g]`.
    Norm { g: usize, positions: usize, seq: bool, eps: f64 },
    /// `body(x) + shortcut(x)`: the body's ops with their first tensors, and the shortcut's
    /// projection (`None`: the identity).
    Residual { body: Vec<(usize, Op)>, shortcut: Option<(usize, Box<Op>)> },
}

impl Op {
    /// Whether it (or a branch of it) has parameters.
    fn has_params(&self) -> bool {
        match self {
            Op::Dense { .. } | Op::Conv { .. } | Op::Norm { .. } => true,
            Op::Residual { body, shortcut } => shortcut.is_some() || body.iter().any(|(_, o)| o.has_params()),
            _ => false,
        }
    }
}

/// The kernels' number of an activation by its name in a layer list (`kernels/epk.cu`'s
/// `PK_RELU`…), `None` for one they do not know.
pub(crate) fn act_code(name: &str) -> Option<i64> {
    ["relu", "leaky_relu", "tanh", "sigmoid", "softplus", "gelu", "silu"].iter().position(|&a| a == name).map(|i| i as i64)
}

/// A stack lowered: its ops with their first tensors, and the output map.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    pub ops: Vec<(usize, Op)>,
    /// Numbers per sample of the input.
    pub input: usize,
    /// Outputs per sample.
    pub k: usize,
    /// Log-softmax outputs (else the raw outputs).
    pub log_softmax: bool,
    /// The output scale α.
    pub alpha: f64,
}

/// A step's parameters on the backend: `w_s` and, away from t = 0 only, `Δw`, per tensor.
pub(crate) struct Weights<B: Kernels> {
    pub w: Vec<B::Buf>,
    pub dw: Option<Vec<B::Buf>>,
}

impl<B: Kernels> Weights<B> {
    /// Uploads `w` and `dw`.
    pub(crate) fn upload(be: &B, w: &[Vec<f64>], dw: Option<&[Vec<f64>]>) -> Result<Self> {
        let up = |v: &[Vec<f64>]| v.iter().map(|x| be.upload(x)).collect::<Result<Vec<_>>>();
        Ok(Weights { w: up(w)?, dw: dw.map(up).transpose()? })
    }
}

/// What an op's backward pass needs from its forward pass.
enum Saved<B: Kernels> {
    None,
    Input(B::Buf),
    Patches(B::Buf),
    Arg(B::Buf),
    Norm { xhat: B::Buf, rstd: B::Buf },
    Residual { body: Vec<Saved<B>>, shortcut: Option<Box<Saved<B>>> },
}

/// One parameter layer's per-row gradient, as the CPU engine's `RowGrad`.
pub(crate) enum DeviceGrad<B: Kernels> {
    /// `acts` with the bias column when it has a bias, `[n, ne]`; `deltas` `[n, K, out]`.
    Factor { acts: B::Buf, deltas: B::Buf, ne: usize, out: usize },
    /// `[n, K, width]`.
    Formed { g: B::Buf, width: usize },
}

/// `Y [rows, out] = X [rows, inner] · W [out, inner]ᵀ` (`w_trans`) or `· W [inner, out]`.
fn gemm_rows<B: Kernels>(be: &B, (rows, out, inner): (usize, usize, usize), x: &B::Buf, w: &B::Buf, w_trans: bool, y: &mut B::Buf) -> Result<()> {
    let g = Gemm {
        m: rows,
        n: out,
        k: inner,
        batch: 1,
        alpha: 1.0,
        accumulate: false,
        a: Operand::shared(inner, false),
        b: Operand::shared(if w_trans { inner } else { out }, w_trans),
        c: Operand::shared(out, false),
    };
    be.gemm(&g, x, w, y)
}

fn op_err(what: &str) -> Error {
    Error::Backend(format!("device program: {what}"))
}

/// The ops `ops` on `n` rows `x` at times `t` (`[n]`), each keeping what its backward pass needs.
fn forward_ops<B: Kernels>(be: &B, wts: &Weights<B>, t: &B::Buf, ops: &[(usize, Op)], mut x: B::Buf, n: usize) -> Result<(B::Buf, Vec<Saved<B>>)> {
    let mut saved = Vec::with_capacity(ops.len());
    for (first, op) in ops {
        let (y, s) = forward_op(be, wts, t, *first, op, x, n)?;
        x = y;
        saved.push(s);
    }
    Ok((x, saved))
}

/// One op's forward pass.
fn forward_op<B: Kernels>(be: &B, wts: &Weights<B>, t: &B::Buf, first: usize, op: &Op, x: B::Buf, n: usize) -> Result<(B::Buf, Saved<B>)> {
    Ok(match *op {
        Op::Dense { n_in, n_out, bias } => {
            let mut y = be.zeros(n * n_out)?;
            gemm_rows(be, (n, n_out, n_in), &x, &wts.w[first], true, &mut y)?;
            if bias {
                be.pk_add_bias(n * n_out, n_out as i64, 1, &wts.w[first + 1], &mut y)?;
            }
            if let Some(dw) = &wts.dw {
                let mut y1 = be.zeros(n * n_out)?;
                gemm_rows(be, (n, n_out, n_in), &x, &dw[first], true, &mut y1)?;
                if bias {
                    be.pk_add_bias(n * n_out, n_out as i64, 1, &dw[first + 1], &mut y1)?;
                }
                be.pk_combine(n * n_out, n_out as i64, t, &y1, &mut y)?;
            }
            (y, Saved::Input(x))
        }
        Op::Conv { c, h, w, co, k, stride, padding, ho, wo, bias } => {
            let (p, taps) = (ho * wo, c * k * k);
            let mut u = be.zeros(n * p * taps)?;
            let g = [c, h, w, k, stride, padding, ho, wo].map(|v| v as i64);
            be.pk_im2col(n * p * taps, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], &x, &mut u)?;
            // Y_s [co, p] = W [co, taps] · U_s [p, taps]ᵀ, for every sample.
            let conv = |wbuf: &B::Buf, y: &mut B::Buf| {
                let gm = Gemm {
                    m: co,
                    n: p,
                    k: taps,
                    batch: n,
                    alpha: 1.0,
                    accumulate: false,
                    a: Operand::shared(taps, false),
                    b: Operand { offset: 0, ld: taps, stride: p * taps, trans: true },
                    c: Operand { offset: 0, ld: p, stride: co * p, trans: false },
                };
                be.gemm(&gm, wbuf, &u, y)
            };
            let mut y = be.zeros(n * co * p)?;
            conv(&wts.w[first], &mut y)?;
            if bias {
                be.pk_add_bias(n * co * p, co as i64, p as i64, &wts.w[first + 1], &mut y)?;
            }
            if let Some(dw) = &wts.dw {
                let mut y1 = be.zeros(n * co * p)?;
                conv(&dw[first], &mut y1)?;
                if bias {
                    be.pk_add_bias(n * co * p, co as i64, p as i64, &dw[first + 1], &mut y1)?;
                }
                be.pk_combine(n * co * p, (co * p) as i64, t, &y1, &mut y)?;
            }
            (y, Saved::Patches(u))
        }
        Op::Act { kind, slope } => {
            let size = be.len(&x);
            let mut y = be.zeros(size)?;
            be.pk_act(size, kind, slope, &x, &mut y)?;
            (y, Saved::Input(x))
        }
        Op::MaxPool(wd) => {
            let out = n * wd.c * wd.ho * wd.wo;
            let (mut y, mut arg) = (be.zeros(out)?, be.zeros(out)?);
            let g = wd.args();
            be.pk_maxpool(out, g[0], g[1], g[2], g[3], g[4], g[5], g[6], &x, &mut y, &mut arg)?;
            (y, Saved::Arg(arg))
        }
        Op::AvgPool(wd) => {
            let out = n * wd.c * wd.ho * wd.wo;
            let mut y = be.zeros(out)?;
            let g = wd.args();
            be.pk_avgpool(out, g[0], g[1], g[2], g[3], g[4], g[5], g[6], &x, &mut y)?;
            (y, Saved::None)
        }
        Op::Reshape => (x, Saved::None),
        Op::Norm { g, positions, seq, eps } => {
            let size = be.len(&x);
            let (mut y, mut xhat, mut rstd) = (be.zeros(size)?, be.zeros(size)?, be.zeros(n * positions)?);
            // Without a step every t is 0 and the direction is never read.
            let (dg, db) = match &wts.dw {
                Some(dw) => (&dw[first], &dw[first + 1]),
                None => (&wts.w[first], &wts.w[first + 1]),
            };
            be.pk_norm(n * positions, g as i64, positions as i64, i64::from(seq), eps, t, &wts.w[first], dg, &wts.w[first + 1], db, &x, &mut y, &mut xhat, &mut rstd)?;
            (y, Saved::Norm { xhat, rstd })
        }
        Op::Residual { ref body, ref shortcut } => {
            let xb = be.copy(&x)?;
            let (mut y, sb) = forward_ops(be, wts, t, body, xb, n)?;
            let (sv, ss) = match shortcut {
                Some((f, sop)) => {
                    let (sv, ss) = forward_op(be, wts, t, *f, sop, x, n)?;
                    (sv, Some(Box::new(ss)))
                }
                None => (x, None),
            };
            if be.len(&sv) != be.len(&y) {
                return Err(op_err("a residual block's branches give different sizes"));
            }
            be.pk_add(be.len(&y), &sv, &mut y)?;
            (y, Saved::Residual { body: sb, shortcut: ss })
        }
    })
}

/// The backward pass of `ops` from the cotangents `dy` `[n, K, ·]` of their output: each
/// parameter layer's gradient pushed with its first tensor; the input's cotangents when
/// `need_dx` (else `None`, and nothing below the lowest parameter layer is computed).
#[allow(clippy::too_many_arguments)]
fn backward_ops<B: Kernels>(be: &B, wts: &Weights<B>, t: &B::Buf, ops: &[(usize, Op)], mut saved: Vec<Saved<B>>, mut dy: B::Buf, n: usize, kk: usize, need_dx: bool, grads: &mut Vec<(usize, DeviceGrad<B>)>) -> Result<Option<B::Buf>> {
    for i in (0..ops.len()).rev() {
        let (first, op) = &ops[i];
        let s = saved.pop().ok_or_else(|| op_err("fewer saved states than ops"))?;
        let need = need_dx || ops[..i].iter().any(|(_, o)| o.has_params());
        if !need && !op.has_params() {
            return Ok(None);
        }
        match backward_op(be, wts, t, *first, op, s, dy, n, kk, need, grads)? {
            Some(d) => dy = d,
            None => return Ok(None),
        }
    }
    Ok(Some(dy))
}

/// One op's backward pass ([`backward_ops`]).
#[allow(clippy::too_many_arguments)]
fn backward_op<B: Kernels>(be: &B, wts: &Weights<B>, t: &B::Buf, first: usize, op: &Op, saved: Saved<B>, mut dy: B::Buf, n: usize, kk: usize, need_dx: bool, grads: &mut Vec<(usize, DeviceGrad<B>)>) -> Result<Option<B::Buf>> {
    let rows = n * kk;
    Ok(match (op, saved) {
        (&Op::Dense { n_in, n_out, bias }, Saved::Input(a)) => {
            let dx = if need_dx {
                let mut dx = be.zeros(rows * n_in)?;
                gemm_rows(be, (rows, n_in, n_out), &dy, &wts.w[first], false, &mut dx)?;
                if let Some(dw) = &wts.dw {
                    let mut d1 = be.zeros(rows * n_in)?;
                    gemm_rows(be, (rows, n_in, n_out), &dy, &dw[first], false, &mut d1)?;
                    be.pk_combine(rows * n_in, (kk * n_in) as i64, t, &d1, &mut dx)?;
                }
                Some(dx)
            } else {
                None
            };
            let acts = if bias {
                let mut ab = be.zeros(n * (n_in + 1))?;
                be.pk_append_one(n * (n_in + 1), n_in as i64, &a, &mut ab)?;
                ab
            } else {
                a
            };
            grads.push((first, DeviceGrad::Factor { acts, deltas: dy, ne: n_in + usize::from(bias), out: n_out }));
            dx
        }
        (&Op::Conv { c, h, w, co, k, stride, padding, ho, wo, bias }, Saved::Patches(u)) => {
            let (p, taps) = (ho * wo, c * k * k);
            let width = co * taps + if bias { co } else { 0 };
            let mut g = be.zeros(rows * width)?;
            // Per class c: G_{s,c} [co, taps] = dY_{s,c} [co, p] · U_s [p, taps].
            for cl in 0..kk {
                let gm = Gemm {
                    m: co,
                    n: taps,
                    k: p,
                    batch: n,
                    alpha: 1.0,
                    accumulate: false,
                    a: Operand { offset: cl * co * p, ld: p, stride: kk * co * p, trans: false },
                    b: Operand { offset: 0, ld: taps, stride: p * taps, trans: false },
                    c: Operand { offset: cl * width, ld: taps, stride: kk * width, trans: false },
                };
                be.gemm(&gm, &dy, &u, &mut g)?;
            }
            if bias {
                be.pk_row_sums(rows * co, co as i64, p as i64, width as i64, (co * taps) as i64, &dy, &mut g)?;
            }
            let dx = if need_dx {
                // dU_r [p, taps] = dY_r [co, p]ᵀ · W [co, taps], every row r = (s, c).
                let dpatch = |wbuf: &B::Buf, du: &mut B::Buf| {
                    let gm = Gemm {
                        m: p,
                        n: taps,
                        k: co,
                        batch: rows,
                        alpha: 1.0,
                        accumulate: false,
                        a: Operand { offset: 0, ld: p, stride: co * p, trans: true },
                        b: Operand::shared(taps, false),
                        c: Operand { offset: 0, ld: taps, stride: p * taps, trans: false },
                    };
                    be.gemm(&gm, &dy, wbuf, du)
                };
                let mut du = be.zeros(rows * p * taps)?;
                dpatch(&wts.w[first], &mut du)?;
                if let Some(dw) = &wts.dw {
                    let mut du1 = be.zeros(rows * p * taps)?;
                    dpatch(&dw[first], &mut du1)?;
                    be.pk_combine(rows * p * taps, (kk * p * taps) as i64, t, &du1, &mut du)?;
                }
                let size = c * h * w;
                let mut dx = be.zeros(rows * size)?;
                let gg = [c, h, w, k, stride, padding, ho, wo].map(|v| v as i64);
                be.pk_col2im(rows * size, gg[0], gg[1], gg[2], gg[3], gg[4], gg[5], gg[6], gg[7], &du, &mut dx)?;
                Some(dx)
            } else {
                None
            };
            grads.push((first, DeviceGrad::Formed { g, width }));
            dx
        }
        (&Op::Act { kind, slope }, Saved::Input(z)) => {
            let per = be.len(&z) / n.max(1);
            be.pk_act_back(rows * per, per as i64, kk as i64, kind, slope, &z, &mut dy)?;
            Some(dy)
        }
        (Op::MaxPool(wd), Saved::Arg(arg)) => {
            let size = wd.c * wd.h * wd.w;
            let mut dx = be.zeros(rows * size)?;
            let g = wd.args();
            be.pk_maxpool_back(rows * size, kk as i64, g[0], g[1], g[2], g[3], g[4], g[5], g[6], &arg, &dy, &mut dx)?;
            Some(dx)
        }
        (Op::AvgPool(wd), Saved::None) => {
            let size = wd.c * wd.h * wd.w;
            let mut dx = be.zeros(rows * size)?;
            let g = wd.args();
            be.pk_avgpool_back(rows * size, g[0], g[1], g[2], g[3], g[4], g[5], g[6], &dy, &mut dx)?;
            Some(dx)
        }
        (Op::Reshape, Saved::None) => Some(dy),
        (&Op::Norm { g, positions, seq, .. }, Saved::Norm { xhat, rstd }) => {
            let mut pg = be.zeros(rows * 2 * g)?;
            be.pk_norm_grads(rows * g, kk as i64, g as i64, positions as i64, i64::from(seq), &xhat, &dy, &mut pg)?;
            let dx = if need_dx {
                let mut dx = be.zeros(be.len(&dy))?;
                let dg = wts.dw.as_ref().map_or(&wts.w[first], |dw| &dw[first]);
                be.pk_norm_back(rows * positions, kk as i64, g as i64, positions as i64, i64::from(seq), t, &wts.w[first], dg, &xhat, &rstd, &dy, &mut dx)?;
                Some(dx)
            } else {
                None
            };
            grads.push((first, DeviceGrad::Formed { g: pg, width: 2 * g }));
            dx
        }
        (Op::Residual { body, shortcut }, Saved::Residual { body: sb, shortcut: ss }) => {
            let dyb = be.copy(&dy)?;
            let db = backward_ops(be, wts, t, body, sb, dyb, n, kk, need_dx, grads)?;
            let ds = match (shortcut, ss) {
                (Some((f, sop)), Some(ss)) => backward_op(be, wts, t, *f, sop, *ss, dy, n, kk, need_dx, grads)?,
                (None, None) => need_dx.then_some(dy),
                _ => return Err(op_err("a residual block's shortcut without its saved state")),
            };
            match (db, ds) {
                (Some(mut db), Some(ds)) => {
                    be.pk_add(be.len(&db), &ds, &mut db)?;
                    Some(db)
                }
                _ => None,
            }
        }
        (op, _) => return Err(op_err(&format!("{op:?} without what its forward pass saved"))),
    })
}

impl Program {
    /// The per-row gradients of the outputs `f` at `n` rows `x` (`[n, d]`) and times `t`
    /// (`[n]`), with the output map applied (`off` `[n, K]` subtracted first when given): each
    /// parameter layer's, storage order, and the outputs `f` `[n, K]`.
    pub(crate) fn block_grads<B: Kernels>(&self, be: &B, wts: &Weights<B>, t: &B::Buf, x: B::Buf, off: Option<&B::Buf>, n: usize) -> Result<(Vec<DeviceGrad<B>>, B::Buf)> {
        if be.len(&x) != n * self.input || be.len(t) != n {
            return Err(op_err(&format!("{} inputs and {} times for {n} rows of {}", be.len(&x), be.len(t), self.input)));
        }
        let (mut g, saved) = forward_ops(be, wts, t, &self.ops, x, n)?;
        if be.len(&g) != n * self.k {
            return Err(op_err(&format!("the stack gives {} numbers for {n} rows of {} outputs", be.len(&g), self.k)));
        }
        let mut seeds = be.zeros(n * self.k * self.k)?;
        let empty = be.zeros(0)?;
        be.pk_output_seeds(n, self.k as i64, i64::from(self.log_softmax), self.alpha, i64::from(off.is_some()), off.unwrap_or(&empty), &mut g, &mut seeds)?;
        let mut grads = Vec::new();
        backward_ops(be, wts, t, &self.ops, saved, seeds, n, self.k, false, &mut grads)?;
        grads.sort_by_key(|g| g.0);
        Ok((grads.into_iter().map(|(_, g)| g).collect(), g))
    }
}
