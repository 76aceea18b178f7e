//! The structured Gram contraction ([`crate::kernel::gram::GramAccumulator::add_integrated`],
//! the `dense → relu → dense` closed form) resident on a device: the Gram, layer 0's scale
//! `x_p·x_i + 1` and each step's training side stay on the backend, and only the row points'
//! factors go up (per block of points, and layer 0's step buffers once per flush); the Gram
//! comes down once, when the accumulator is flushed.
//!
//! Per step and block of row points this is what the host accumulator does, in the same order:
//! the GEMM `T = [Ā; B̄]·Aᵀ` and the output layer's fold, and, every few steps, layer 0's GEMM
//! of the buffered steps and its fold scaled by `x_p·x_i + 1` — the GEMMs on the backend's
//! ([`crate::device::Backend::gemm`]: cuBLAS on a GPU), the folds as the kernels
//! `pk_fold_soft`, `pk_fold_output_full` and `pk_fold_scaled` of `kernels/epk.cu` (compiled
//! for the host too, so that the ordinary tests run every line here against the host
//! accumulator: this module's tests, and `kernel::stack`'s end to end). Before it, each block's product made a round trip to the host
//! for the fold (the H100 run of 2026-11-27: 74 GFLOP/s on a device doing 61 827 in DGEMM).

use std::sync::Arc;

use rayon::prelude::*;

use crate::device::kernels::Kernels;
use crate::device::{Gemm, Operand};
use crate::error::Result;
use crate::kernel::layout::{GramSink, Layout, TrainDeltas, TrainParts};

/// Numbers of the Gram brought down per part (64 MiB; the tests' Grams take several parts).
#[cfg(not(test))]
const DOWNLOAD_NUMBERS: usize = 8 << 20;
#[cfg(test)]
const DOWNLOAD_NUMBERS: usize = 1000;

/// Layer 0's step buffers as the host accumulator holds them (`gram::Layer0Sum`): `slots`
/// steps side by side, the first `filled` of them written.
///
/// # Shapes
/// `full`: `rows` `[(p, k), slot, o]`, `train` `[(i, k'), slot, o]`; `diag`: `[c, p, slot, o]`,
/// `[c, i, slot, o]`; `trace`: `[p, slot, k, o]`, `[i, slot, k, o]` (`o < h`).
pub(crate) struct Layer0View<'a> {
    pub p: usize,
    pub m: usize,
    pub k: usize,
    pub h: usize,
    pub slots: usize,
    pub filled: usize,
    pub rows: &'a [f64],
    pub train: &'a [f64],
}

/// A Gram accumulation resident on a backend (object-safe, so that the accumulator holds any).
pub(crate) trait Resident: Send {
    /// Forms layer 0's scale `x_p·x_i + bias` (`[P, M]`) there.
    ///
    /// # Shapes
    /// `x_rows` `[P, d]`, `acts` `[M, d]`.
    fn scale(&mut self, x_rows: &[f64], acts: &[f64], d: usize, bias: f64) -> Result<()>;
    /// Whether [`Resident::scale`] has run.
    fn has_scale(&self) -> bool;
    /// Adds layer 0's buffered steps `scale ∘ Σ_slots rows·trainᵀ`; returns the GEMM flops.
    fn layer0(&mut self, l0: &Layer0View<'_>) -> Result<f64>;
    /// Adds the structured output layer of the row points `p0..p0 + nb`: `ab` their `[Ā; B̄]`
    /// (`[nb·(K+1), ne]`), against the step's training activations `acts` (`[M, ne]`) and
    /// sensitivities `dt`, both uploaded when `version` changes.
    #[allow(clippy::too_many_arguments)]
    fn output(&mut self, p0: usize, nb: usize, ab: &[f64], acts: &[f64], ne: usize, dt: &TrainDeltas, alpha: f64, version: u64) -> Result<()>;
    /// Adds what was accumulated since the last call into `sink` (its accumulation rows) and
    /// starts again from zero.
    fn add_into(&mut self, sink: &mut GramSink) -> Result<()>;
}

/// The step's training side on the backend.
struct StepSide<Buf> {
    version: u64,
    acts: Buf,
    /// `q` (`diag`, `trace`) or the formed sensitivities (`full`).
    deltas: Buf,
    w: Option<Buf>,
}

/// [`Resident`] on any backend of [`Kernels`].
pub(crate) struct ResidentGram<B: Kernels> {
    be: Arc<B>,
    layout: Layout,
    p: usize,
    m: usize,
    k: usize,
    /// Bytes one block's product may take.
    block_bytes: usize,
    /// The accumulation rows (`GramSink`'s order).
    g: B::Buf,
    s0: Option<B::Buf>,
    step: Option<StepSide<B::Buf>>,
    /// A block's product.
    prod: Option<B::Buf>,
    /// Something was added since the last [`Resident::add_into`].
    dirty: bool,
}

impl<B: Kernels> ResidentGram<B> {
    /// A zero Gram of `layout` for P row points, M training points and K outputs on `be`,
    /// products in blocks of at most `block_bytes`.
    pub(crate) fn new(be: Arc<B>, layout: Layout, p: usize, m: usize, k: usize, block_bytes: usize) -> Result<Self> {
        let g = be.zeros(p * m * layout.per_pair(k))?;
        Ok(ResidentGram { be, layout, p, m, k, block_bytes, g, s0: None, step: None, prod: None, dirty: false })
    }
}

/// `slot` holding at least `n` numbers (its contents undefined).
fn scratch<'a, B: Kernels>(be: &B, slot: &'a mut Option<B::Buf>, n: usize) -> Result<&'a mut B::Buf> {
    if slot.as_ref().is_none_or(|b| be.len(b) < n) {
        *slot = None;
        *slot = Some(be.zeros(n)?);
    }
    Ok(slot.as_mut().expect("allocated above"))
}

/// Row-major `[rows, ld]`, read as is.
fn plain(offset: usize, ld: usize) -> Operand {
    Operand { offset, ld, stride: 0, trans: false }
}

/// Row-major `[n, ld]` read transposed (the training side of `A·Bᵀ`).
fn transposed(offset: usize, ld: usize) -> Operand {
    Operand { offset, ld, stride: 0, trans: true }
}

impl<B> Resident for ResidentGram<B>
where
    B: Kernels + Send + Sync,
    B::Buf: Send,
{
    fn scale(&mut self, x_rows: &[f64], acts: &[f64], d: usize, bias: f64) -> Result<()> {
        let (be, p, m) = (&*self.be, self.p, self.m);
        let mut s0 = be.zeros(p * m)?;
        if d > 0 && p > 0 && m > 0 {
            let (x, a) = (be.upload(&x_rows[..p * d])?, be.upload(&acts[..m * d])?);
            let g = Gemm { m: p, n: m, k: d, batch: 1, alpha: 1.0, accumulate: false, a: plain(0, d), b: transposed(0, d), c: plain(0, m) };
            be.gemm(&g, &x, &a, &mut s0)?;
        }
        if bias != 0.0 {
            be.pk_add_scalar(p * m, bias, &mut s0)?;
        }
        self.s0 = Some(s0);
        Ok(())
    }

    fn has_scale(&self) -> bool {
        self.s0.is_some()
    }

    fn layer0(&mut self, l0: &Layer0View<'_>) -> Result<f64> {
        let (layout, p, m, k) = (self.layout, self.p, self.m, self.k);
        assert_eq!((l0.p, l0.m, l0.k), (p, m, k), "layer 0's buffers are for another Gram");
        let (h, sl, f) = (l0.h, l0.slots, l0.filled);
        if f == 0 || p == 0 || m == 0 {
            return Ok(0.0);
        }
        let be = &*self.be;
        let s0 = self.s0.as_ref().expect("layer 0's scale is formed before its first flush");
        let (rows, train) = (be.upload(l0.rows)?, be.upload(l0.train)?);
        let per_point = 8 * m * layout.per_pair(k);
        let pb = (self.block_bytes / per_point.max(1)).clamp(1, p);
        let (rpp, cols) = (layout.rows_per_point(k), layout.cols_per_train(k));
        let prod = scratch(be, &mut self.prod, pb * m * layout.per_pair(k))?;
        for p0 in (0..p).step_by(pb) {
            let nb = pb.min(p - p0);
            let g = match layout {
                Layout::Full => Gemm { m: nb * k, n: m * k, k: f * h, batch: 1, alpha: 1.0, accumulate: false, a: plain(p0 * k * sl * h, sl * h), b: transposed(0, sl * h), c: plain(0, m * k) },
                Layout::Trace => Gemm { m: nb, n: m, k: f * k * h, batch: 1, alpha: 1.0, accumulate: false, a: plain(p0 * sl * k * h, sl * k * h), b: transposed(0, sl * k * h), c: plain(0, m) },
                // One product per class, class-major [c, p, i].
                Layout::Diag => Gemm {
                    m: nb,
                    n: m,
                    k: f * h,
                    batch: k,
                    alpha: 1.0,
                    accumulate: false,
                    a: Operand { offset: p0 * sl * h, ld: sl * h, stride: p * sl * h, trans: false },
                    b: Operand { offset: 0, ld: sl * h, stride: m * sl * h, trans: true },
                    c: Operand { offset: 0, ld: m, stride: nb * m, trans: false },
                },
            };
            be.gemm(&g, &rows, &train, prod)?;
            let n = nb * rpp * m * cols;
            be.pk_fold_scaled(n, m as i64, cols as i64, rpp as i64, k as i64, i64::from(layout == Layout::Diag), nb as i64, p0 as i64, s0, prod, &mut self.g)?;
        }
        self.dirty = true;
        Ok(2.0 * p as f64 * m as f64 * (k * cols * f * h) as f64)
    }

    fn output(&mut self, p0: usize, nb: usize, ab: &[f64], acts: &[f64], ne: usize, dt: &TrainDeltas, alpha: f64, version: u64) -> Result<()> {
        let (layout, m, k) = (self.layout, self.m, self.k);
        assert_eq!(dt.layout(), layout, "training sensitivities arranged for another layout");
        assert!(p0 + nb <= self.p, "row points beyond the Gram");
        if nb == 0 || m == 0 {
            return Ok(());
        }
        let be = &*self.be;
        if self.step.as_ref().is_none_or(|s| s.version != version) {
            self.step = None;
            let (deltas, w) = match dt.parts() {
                TrainParts::Soft { q, w, .. } => (be.upload(q)?, w.map(|w| be.upload(w)).transpose()?),
                TrainParts::Formed { data, no } => {
                    assert!(layout == Layout::Full && no == k, "only the full layout keeps an output layer's formed sensitivities");
                    (be.upload(data)?, None)
                }
            };
            self.step = Some(StepSide { version, acts: be.upload(&acts[..m * ne])?, deltas, w });
        }
        let st = self.step.as_ref().expect("uploaded above");
        let k1 = k + 1;
        let a = be.upload(&ab[..nb * k1 * ne])?;
        let t = scratch(be, &mut self.prod, nb * k1 * m)?;
        let g = Gemm { m: nb * k1, n: m, k: ne, batch: 1, alpha: 1.0, accumulate: false, a: plain(0, ne), b: transposed(0, ne), c: plain(0, m) };
        be.gemm(&g, &a, &st.acts, t)?;
        match dt.parts() {
            TrainParts::Soft { alpha: a_train, w, .. } => {
                // Without weights the kernel reads none: any buffer stands in.
                let wb = st.w.as_ref().unwrap_or(&st.deltas);
                be.pk_fold_soft(nb * m, m as i64, k as i64, i64::from(layout == Layout::Trace), i64::from(w.is_some()), alpha * a_train, p0 as i64, t, &st.deltas, wb, &mut self.g)?;
            }
            TrainParts::Formed { .. } => be.pk_fold_output_full(nb * k * m * k, m as i64, k as i64, alpha, p0 as i64, t, &st.deltas, &mut self.g)?,
        }
        self.dirty = true;
        Ok(())
    }

    fn add_into(&mut self, sink: &mut GramSink) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let rows = sink.rows_mut(0..self.p);
        let n = self.be.len(&self.g);
        assert_eq!(rows.len(), n, "the sink is for another Gram");
        // In parts, so that the host holds one part besides the Gram (the full MNIST Gram is
        // 48 GB in `diag`).
        let mut part = vec![0.0; n.min(DOWNLOAD_NUMBERS)];
        for (c, dst) in rows.chunks_mut(DOWNLOAD_NUMBERS).enumerate() {
            let got = &mut part[..dst.len()];
            self.be.download_part(&self.g, c * DOWNLOAD_NUMBERS, got)?;
            dst.par_iter_mut().zip(got.par_iter()).for_each(|(a, b)| *a += b);
        }
        // The old Gram goes before the new one is allocated.
        self.g = self.be.zeros(0)?;
        self.g = self.be.zeros(n)?;
        self.dirty = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::host::Host;
    use crate::kernel::gram::{GramAccumulator, LayerFactors};

    /// Deterministic numbers in (−1, 1).
    fn numbers(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect()
    }

    /// The resident contraction (on the host backend, products in blocks of three points)
    /// gives the host accumulator's Gram in every layout, with and without Chen's column
    /// weights, over steps that fill layer 0's buffer and one that leaves it part-filled, with
    /// row chunks added out of order (so that blocks start past point 0), and adds to what a
    /// sink already held.
    #[test]
    fn resident_accumulation_equals_the_host_accumulator() {
        let (p, m, k, h, d, alpha) = (80, 80, 3, 2, 4, 0.7);
        let ne = h + 1;
        let x_rows = numbers(p * d, 1);
        let x_train = numbers(m * d, 2);
        for layout in [Layout::Full, Layout::Diag, Layout::Trace] {
            for chen in [false, true] {
                let colw = chen.then(|| numbers(m * k, 3).iter().map(|v| 1.5 + v).collect::<Vec<f64>>());
                let mk = |resident: bool| {
                    let acc = GramAccumulator::with_layout(layout, p, m, k, true).with_output_alpha(alpha);
                    if resident {
                        let r = ResidentGram::new(Arc::new(Host), layout, p, m, k, 8 * m * layout.per_pair(k) * 3).unwrap();
                        acc.with_resident(Box::new(r))
                    } else {
                        acc
                    }
                };
                let (mut host, mut dev) = (mk(false), mk(true));
                // Something the sink held before: the resident Gram is added to it.
                let before = numbers(p * m * layout.per_pair(k), 9);
                for acc in [&mut host, &mut dev] {
                    acc.sink_mut().rows_mut(0..p).copy_from_slice(&before);
                }
                for s in 0..7u64 {
                    // The training side of step s: layer 0's sensitivities, the output layer's
                    // activations and structured sensitivities α(δ_co − q_io).
                    let d0 = numbers(m * k * h, 10 + s);
                    let a1: Vec<f64> = numbers(m * h, 20 + s).iter().map(|v| v.max(0.0)).collect();
                    let q = numbers(m * k, 30 + s);
                    let d1: Vec<f64> = (0..m * k * k).map(|j| alpha * (f64::from(u8::from((j / k) % k == j % k)) - q[(j / (k * k)) * k + j % k])).collect();
                    let train = [LayerFactors { acts: &x_train, deltas: &d0, n_in: d, n_out: h }, LayerFactors { acts: &a1, deltas: &d1, n_in: h, n_out: k }];
                    for (first, last) in [(30, 80), (0, 29), (29, 30)] {
                        let n = last - first;
                        let dbar = numbers(n * k * h, 100 * s + first as u64);
                        let ab = numbers(n * (k + 1) * ne, 200 * s + first as u64);
                        for acc in [&mut host, &mut dev] {
                            acc.add_integrated(&dbar, &ab, &train, &x_rows, colw.as_deref(), first..last);
                        }
                    }
                    for acc in [&mut host, &mut dev] {
                        acc.end_step(&train[0], colw.as_deref());
                    }
                }
                let (g_host, _) = host.finish_layers();
                dev.check().unwrap();
                let (g_dev, _) = dev.finish_layers();
                let scale = crate::kernel::max_abs(&g_host);
                let diff = crate::kernel::max_abs_diff(&g_dev, &g_host);
                assert!(scale > 1.0 && diff <= 1e-14 * scale, "{layout:?} chen {chen}: {diff:e} of {scale:e}");
            }
        }
    }

    /// A call whose buffers are too short is one error line, not a write outside them.
    #[test]
    fn short_buffers_are_refused() {
        let be = Host;
        let mut g = vec![0.0; 10];
        let e = be.pk_fold_scaled(12, 2, 1, 1, 1, 0, 6, 0, &vec![0.0; 12], &vec![0.0; 12], &mut g).unwrap_err();
        assert!(e.to_string().contains("buffer `g` holds 10 numbers"), "{e}");
        let e = be.pk_fold_soft(4, 2, 2, 0, 1, 1.0, 0, &vec![0.0; 12], &vec![0.0; 4], &vec![0.0; 3], &mut vec![0.0; 8]).unwrap_err();
        assert!(e.to_string().contains("buffer `w`"), "{e}");
    }
}
