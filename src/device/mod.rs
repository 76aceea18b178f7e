//! The node evaluation of a layer stack on a backend: what a GPU runs, exercised on the host.
//!
//! A block of node rows (each a point at its own time `t` of a step, `w_s + t·Δw`) goes through
//! every layer as GEMMs against `W_s` and `ΔW` combined by `t` per row, plus a small set of
//! kernels (`kernels/epk.cu`: combine by t, im2col / col2im, activations and their derivatives,
//! pooling with its winners, layer norm, the output seeds, row and segment sums). [`program`]
//! lowers a stack to those calls; a [`Backend`] runs them:
//!
//! - [`host::Host`]: the kernels compiled for the host as C (`build.rs`, the `cc` crate), faer
//!   for the GEMMs. The ordinary tests run every kernel and every lowered layer kind through it
//!   against the CPU engine's layers (`tests.rs`), so the device's code is tested before a GPU is
//!   lent.
//! - [`cuda::Cuda`]: the same source compiled to PTX by NVRTC, cuBLAS for the GEMMs; the same
//!   program on the device, tested on a GPU (`tests/device.rs`, `#[ignore]`d without one).
//!
//! Data flows one way: `model::layers` says what each layer kind is on a backend
//! ([`program::Op`], one method of the layer contract), this module knows nothing of the kinds.

pub(crate) mod cuda;
#[cfg(test)]
pub(crate) mod host;
pub(crate) mod kernels;
pub(crate) mod program;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::error::Result;
use kernels::Kernels;
use program::{DeviceGrad, Program, Weights};

/// One GEMM operand: row-major at `offset`, rows `ld` apart, batch entries `stride` apart (0: the
/// same matrix for every entry), read transposed when `trans`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Operand {
    pub offset: usize,
    pub ld: usize,
    pub stride: usize,
    pub trans: bool,
}

impl Operand {
    /// A dense row-major matrix with `ld` columns, the same for every batch entry.
    pub(crate) fn shared(ld: usize, trans: bool) -> Operand {
        Operand { offset: 0, ld, stride: 0, trans }
    }
}

/// `C_b = α·op(A_b)·op(B_b) + β·C_b` for `b < batch`, row-major: `op(A_b)` `[m, k]`, `op(B_b)`
/// `[k, n]`, `C_b` `[m, n]` (its `trans` ignored). `β` is 0 (overwrite) or 1 (accumulate).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub alpha: f64,
    pub accumulate: bool,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
}

/// Where the node evaluation runs: buffers of `f64` and the two kinds of work on them, GEMMs and
/// the kernels of [`kernels::Kernels`].
pub(crate) trait Backend {
    /// A buffer of `f64` on the backend.
    type Buf;
    /// A buffer holding `x`.
    fn upload(&self, x: &[f64]) -> Result<Self::Buf>;
    /// A buffer of `n` zeros.
    fn zeros(&self, n: usize) -> Result<Self::Buf>;
    /// A buffer's numbers.
    fn download(&self, b: &Self::Buf) -> Result<Vec<f64>>;
    /// Its numbers `offset..offset + dst.len()` into `dst` (a large buffer in parts).
    fn download_part(&self, b: &Self::Buf, offset: usize, dst: &mut [f64]) -> Result<()>;
    /// Its length.
    fn len(&self, b: &Self::Buf) -> usize;
    /// A copy (a residual block's two branches each take the input).
    fn copy(&self, b: &Self::Buf) -> Result<Self::Buf>;
    /// [`Gemm`] on `a`, `b` into `c`; the extents it reads and writes must lie in the buffers
    /// (checked).
    fn gemm(&self, g: &Gemm, a: &Self::Buf, b: &Self::Buf, c: &mut Self::Buf) -> Result<()>;
}

/// One parameter layer's per-row gradients brought back to the host (the CPU engine's form).
pub(crate) enum Downloaded {
    /// `acts` `[n, ne]` (with the bias column), `deltas` `[n, K, out]`.
    Factor { acts: Vec<f64>, deltas: Vec<f64>, ne: usize, out: usize },
    /// `[n, K, width]`.
    Formed { g: Vec<f64>, width: usize },
    /// A formed layer's rows summed with their weights over each run of equal consecutive
    /// points ([`runs`]): `[runs, K, width]`; with the self-kernel, also `Σ_r w_r g_r g_rᵀ` per
    /// run, `[runs, K, K]`.
    Summed { g: Vec<f64>, width: usize, gram: Option<Vec<f64>> },
}

/// The runs of equal consecutive entries of `idx`: `(first, length)` each.
pub(crate) fn runs(idx: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (j, &q) in idx.iter().enumerate() {
        match out.last_mut() {
            Some((s, len)) if idx[*s] == q => *len += 1,
            _ => out.push((j, 1)),
        }
    }
    out
}

/// One step's node evaluation on a backend, as the kernel engine uses it: the step's weights
/// resident there, blocks of node rows in, their gradients out.
pub(crate) trait StepNodes: Send + Sync {
    /// The per-row gradients (each parameter layer's, storage order) of rows `idx` of `x`
    /// (`[·, d]`, output offsets `off` `[·, K]`) at times `t`. With `weights` (`[rows]`), formed
    /// layers come back summed on the backend over each run of equal points, each row times its
    /// weight ([`Downloaded::Summed`]): a point's nodes leave the device as one row; with
    /// `self_kernel`, with their weighted `g gᵀ` summed the same way.
    fn block_grads(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], weights: Option<&[f64]>, self_kernel: bool) -> Result<Vec<Downloaded>>;
    /// Rows per call that keep the backend busy (a GPU wants thousands, the host few).
    fn block_rows(&self) -> usize;
}

/// A backend that evaluates a program's nodes step by step.
pub(crate) trait NodeBackend: Send + Sync {
    /// The step at `w` (`[tensor][·]`) with direction `dw` (absent at t = 0 only steps).
    fn step(&self, program: &Program, w: &[Vec<f64>], dw: Option<&[Vec<f64>]>) -> Result<Box<dyn StepNodes>>;
}

/// [`NodeBackend`] on any backend of [`Kernels`]: one call at a time (the engine's threads
/// share one device, and a call's buffers are sized for the whole device).
pub(crate) struct OnBackend<B> {
    pub be: Arc<B>,
    pub rows: usize,
    pub gate: Arc<std::sync::Mutex<()>>,
}

impl<B> OnBackend<B> {
    /// `be` with `rows` node rows per call.
    pub(crate) fn new(be: Arc<B>, rows: usize) -> Self {
        OnBackend { be, rows, gate: Default::default() }
    }
}

struct OnStep<B: Kernels> {
    be: Arc<B>,
    program: Program,
    wts: Weights<B>,
    rows: usize,
    gate: Arc<std::sync::Mutex<()>>,
}

impl<B> NodeBackend for OnBackend<B>
where
    B: Kernels + Send + Sync + 'static,
    B::Buf: Send + Sync,
{
    fn step(&self, program: &Program, w: &[Vec<f64>], dw: Option<&[Vec<f64>]>) -> Result<Box<dyn StepNodes>> {
        let _one = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Box::new(OnStep { be: self.be.clone(), program: program.clone(), wts: Weights::upload(&*self.be, w, dw)?, rows: self.rows, gate: self.gate.clone() }))
    }
}

impl<B> StepNodes for OnStep<B>
where
    B: Kernels + Send + Sync,
    B::Buf: Send + Sync,
{
    fn block_grads(&self, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], weights: Option<&[f64]>, self_kernel: bool) -> Result<Vec<Downloaded>> {
        let (d, k, be) = (self.program.input, self.program.k, &*self.be);
        let _one = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        let xs: Vec<f64> = idx.iter().flat_map(|&i| x[i * d..(i + 1) * d].iter().copied()).collect();
        let os: Option<Vec<f64>> = off.map(|o| idx.iter().flat_map(|&i| o[i * k..(i + 1) * k].iter().copied()).collect());
        let os = os.map(|o| be.upload(&o)).transpose()?;
        let (grads, _) = self.program.block_grads(be, &self.wts, &be.upload(t)?, be.upload(&xs)?, os.as_ref(), idx.len())?;
        // The runs' row ranges and the weights, uploaded once for every formed layer.
        let segments = match weights {
            Some(w) => {
                let r = runs(idx);
                let start: Vec<f64> = r.iter().map(|&(s, _)| s as f64).chain(std::iter::once(idx.len() as f64)).collect();
                Some((r.len(), be.upload(&start)?, be.upload(w)?))
            }
            None => None,
        };
        grads
            .into_iter()
            .map(|g| {
                Ok(match (g, &segments) {
                    (DeviceGrad::Factor { acts, deltas, ne, out }, _) => Downloaded::Factor { acts: be.download(&acts)?, deltas: be.download(&deltas)?, ne, out },
                    (DeviceGrad::Formed { g, width }, None) => Downloaded::Formed { g: be.download(&g)?, width },
                    (DeviceGrad::Formed { g, width }, Some((nseg, start, wt))) => {
                        let (per, rows) = (k * width, idx.len());
                        let mut sum = be.zeros(nseg * per)?;
                        be.pk_segment_sum(nseg * per, per as i64, rows as i64, start, wt, &g, &mut sum)?;
                        let gram = if self_kernel {
                            // g_r g_rᵀ per row, [rows, K, K], then summed per run with the weights.
                            let mut gg = be.zeros(rows * k * k)?;
                            let gm = Gemm {
                                m: k,
                                n: k,
                                k: width,
                                batch: rows,
                                alpha: 1.0,
                                accumulate: false,
                                a: Operand { offset: 0, ld: width, stride: per, trans: false },
                                b: Operand { offset: 0, ld: width, stride: per, trans: true },
                                c: Operand { offset: 0, ld: k, stride: k * k, trans: false },
                            };
                            be.gemm(&gm, &g, &g, &mut gg)?;
                            let mut gs = be.zeros(nseg * k * k)?;
                            be.pk_segment_sum(nseg * k * k, (k * k) as i64, rows as i64, start, wt, &gg, &mut gs)?;
                            Some(be.download(&gs)?)
                        } else {
                            None
                        };
                        Downloaded::Summed { g: be.download(&sum)?, width, gram }
                    }
                })
            })
            .collect()
    }
    fn block_rows(&self) -> usize {
        self.rows
    }
}

/// The last index a batched operand reaches, plus one: `offset + (batch−1)·stride + (rows−1)·ld
/// + cols` for a stored `[rows, cols]` (0 for an empty one).
pub(crate) fn extent(op: &Operand, batch: usize, rows: usize, cols: usize) -> usize {
    if batch == 0 || rows == 0 || cols == 0 {
        return 0;
    }
    op.offset + (batch - 1) * op.stride + (rows - 1) * op.ld + cols
}

/// Checks a [`Gemm`]'s operands against the lengths of its buffers (a backend calls it before
/// it runs one): every read and write inside its buffer, `ld` at least a stored row.
pub(crate) fn check_gemm(g: &Gemm, a: usize, b: usize, c: usize) -> Result<()> {
    let stored = |op: &Operand, rows: usize, cols: usize| if op.trans { (cols, rows) } else { (rows, cols) };
    let (ar, ac) = stored(&g.a, g.m, g.k);
    let (br, bc) = stored(&g.b, g.k, g.n);
    let bad = |what: &str| Err(crate::error::Error::Backend(format!("device GEMM {what}: {g:?} with buffers of {a}, {b}, {c}")));
    if g.a.ld < ac || g.b.ld < bc || g.c.ld < g.n {
        return bad("leading dimension below a row");
    }
    if extent(&g.a, g.batch, ar, ac) > a || extent(&g.b, g.batch, br, bc) > b || extent(&g.c, g.batch, g.m, g.n) > c {
        return bad("beyond its buffer");
    }
    Ok(())
}
