//! The structured Gram contraction ([`crate::kernel::gram::GramAccumulator::add_integrated`],
//! the `dense → relu → dense` closed form) resident on a device: the Gram, layer 0's scale
//! `x_p·x_i + 1` and each step's training side stay on the backend, and only the row points'
//! factors go up (per block of points, and layer 0's step buffers once per flush); the Gram
//! comes down once, when the accumulator is flushed. A step model that forms the rows' factors
//! on the same device (the closed form's whole step, `kernel::stack::closed::dense_relu::device`)
//! hands them over where they are instead: [`ResidentGram::put_rows`], [`ResidentGram::output_from`]
//! and [`ResidentGram::put_train`] (layer 0's step buffers then live on the device too).
//!
//! Per step and block of row points this is what the host accumulator does, in the same order:
//! the GEMM `T = [Ā; B̄]·Aᵀ` and the output layer's fold, and, every few steps, layer 0's GEMM
//! of the buffered steps and its fold scaled by `x_p·x_i + 1` — the GEMMs on the backend's
//! ([`crate::device::Backend::gemm`]: cuBLAS on a GPU), the folds as the kernels
//! `pk_fold_soft`, `pk_fold_output_full` and `pk_fold_scaled` of `kernels/epk.cu` (compiled
//! for the host too, so that the ordinary tests run every line here against the host
//! accumulator: this module's tests, and `kernel::stack`'s end to end). Before it, each block's product made a round trip to the host
//! for the fold (the H100 run of 2026-11-27: 74 GFLOP/s on a device doing 61 827 in DGEMM).

use std::any::Any;
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
    /// starts again from zero; first contracts layer 0's steps still buffered on the device
    /// ([`ResidentGram::put_train`]) and returns their GEMM flops.
    fn add_into(&mut self, sink: &mut GramSink) -> Result<f64>;
    /// Itself, for a step model that runs its whole step on the same backend
    /// (`kernel::stack::closed::dense_relu::device`).
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Layer 0's step buffers on the device (the layouts of [`Layer0View`]), filled by a step model
/// that forms its factors there ([`ResidentGram::put_rows`], [`ResidentGram::put_train`]).
struct DeviceLayer0<Buf> {
    h: usize,
    slots: usize,
    filled: usize,
    rows: Buf,
    train: Buf,
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
    /// Layer 0's step buffers when a step model writes them on the device.
    l0: Option<DeviceLayer0<B::Buf>>,
}

impl<B: Kernels> ResidentGram<B> {
    /// A zero Gram of `layout` for P row points, M training points and K outputs on `be`,
    /// products in blocks of at most `block_bytes`.
    pub(crate) fn new(be: Arc<B>, layout: Layout, p: usize, m: usize, k: usize, block_bytes: usize) -> Result<Self> {
        let g = be.zeros(p * m * layout.per_pair(k))?;
        Ok(ResidentGram { be, layout, p, m, k, block_bytes, g, s0: None, step: None, prod: None, dirty: false, l0: None })
    }

    /// Row points P.
    pub(crate) fn p(&self) -> usize {
        self.p
    }

    /// Training points M.
    pub(crate) fn m(&self) -> usize {
        self.m
    }

    /// Outputs K.
    pub(crate) fn k(&self) -> usize {
        self.k
    }

    /// The Gram's layout.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Layer 0's buffer code of the layout (`pk_put_slot`).
    fn layout_code(&self) -> i64 {
        match self.layout {
            Layout::Full => 0,
            Layout::Diag => 1,
            Layout::Trace => 2,
        }
    }

    /// Writes the current step's layer-0 `δ̄` of the row points `first..` (`dbar`
    /// `[n, K, h]` on the device) into layer 0's device buffer, created at the first call with
    /// `slots` steps.
    pub(crate) fn put_rows(&mut self, first: usize, n: usize, dbar: &B::Buf, h: usize, slots: usize) -> Result<()> {
        let (p, m, k) = (self.p, self.m, self.k);
        if self.l0.is_none() {
            let (rows, train) = (self.be.zeros(p * k * slots * h)?, self.be.zeros(m * k * slots * h)?);
            self.l0 = Some(DeviceLayer0 { h, slots, filled: 0, rows, train });
        }
        let code = self.layout_code();
        let l0 = self.l0.as_mut().expect("created above");
        assert_eq!(l0.h, h, "layer 0's device buffer is for another width");
        let nothing = self.be.zeros(0)?;
        self.be.pk_put_slot(n * k * h, k as i64, h as i64, l0.slots as i64, l0.filled as i64, code, p as i64, first as i64, 0, dbar, &nothing, &mut l0.rows)
    }

    /// Writes the current step's training `δ` (`[M, K, h]` on the device, weighted by `colw`
    /// `[M, K]`) into layer 0's device buffer and ends the step there: when the buffer is full,
    /// contracts it into the Gram. Returns the GEMM flops (0 when nothing was contracted).
    pub(crate) fn put_train(&mut self, dtrain: &B::Buf, colw: Option<&B::Buf>) -> Result<f64> {
        let (m, k) = (self.m, self.k);
        let code = self.layout_code();
        let Some(l0) = self.l0.as_mut() else { return Ok(0.0) };
        let nothing;
        let w = match colw {
            Some(w) => w,
            None => {
                nothing = self.be.zeros(0)?;
                &nothing
            }
        };
        self.be.pk_put_slot(m * k * l0.h, k as i64, l0.h as i64, l0.slots as i64, l0.filled as i64, code, m as i64, 0, i64::from(colw.is_some()), dtrain, w, &mut l0.train)?;
        l0.filled += 1;
        if l0.filled == l0.slots {
            return self.contract_device_layer0();
        }
        Ok(0.0)
    }

    /// Contracts layer 0's device buffer (its filled steps) and empties it.
    fn contract_device_layer0(&mut self) -> Result<f64> {
        let Some(l0) = self.l0.take() else { return Ok(0.0) };
        let done = self.layer0_bufs(&l0.rows, &l0.train, l0.h, l0.slots, l0.filled);
        self.l0 = Some(DeviceLayer0 { filled: 0, ..l0 });
        done
    }

    /// Step side of the structured output layer: the training activations `acts` (`[M, ne]`)
    /// and sensitivities `dt`, uploaded when `version` changes.
    pub(crate) fn ensure_step(&mut self, acts: &[f64], ne: usize, dt: &TrainDeltas, version: u64) -> Result<()> {
        let (layout, m, k) = (self.layout, self.m, self.k);
        if self.step.as_ref().is_some_and(|s| s.version == version) {
            return Ok(());
        }
        self.step = None;
        let be = &*self.be;
        let (deltas, w) = match dt.parts() {
            TrainParts::Soft { q, w, .. } => (be.upload(q)?, w.map(|w| be.upload(w)).transpose()?),
            TrainParts::Formed { data, no } => {
                assert!(layout == Layout::Full && no == k, "only the full layout keeps an output layer's formed sensitivities");
                (be.upload(data)?, None)
            }
        };
        self.step = Some(StepSide { version, acts: be.upload(&acts[..m * ne])?, deltas, w });
        Ok(())
    }

    /// Adds the structured output layer of the row points `p0..p0 + nb` whose `[Ā; B̄]` are
    /// `ab` on the device from `offset` (`[nb·(K+1), ne]`), against the step side of
    /// [`Self::ensure_step`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn output_from(&mut self, p0: usize, nb: usize, ab: &B::Buf, offset: usize, ne: usize, dt: &TrainDeltas, alpha: f64) -> Result<()> {
        let (m, k) = (self.m, self.k);
        let be = &*self.be;
        let st = self.step.as_ref().expect("the step side is set before its rows");
        let k1 = k + 1;
        let t = scratch(be, &mut self.prod, nb * k1 * m)?;
        let g = Gemm { m: nb * k1, n: m, k: ne, batch: 1, alpha: 1.0, accumulate: false, a: plain(offset, ne), b: transposed(0, ne), c: plain(0, m) };
        be.gemm(&g, ab, &st.acts, t)?;
        match dt.parts() {
            TrainParts::Soft { alpha: a_train, w, .. } => {
                // Without weights the kernel reads none: any buffer stands in.
                let wb = st.w.as_ref().unwrap_or(&st.deltas);
                be.pk_fold_soft(nb * m, m as i64, k as i64, i64::from(self.layout == Layout::Trace), i64::from(w.is_some()), alpha * a_train, p0 as i64, t, &st.deltas, wb, &mut self.g)?;
            }
            TrainParts::Formed { .. } => be.pk_fold_output_full(nb * k * m * k, m as i64, k as i64, alpha, p0 as i64, t, &st.deltas, &mut self.g)?,
        }
        self.dirty = true;
        Ok(())
    }

    /// The step's training activations `[M, ne]` on the device ([`Self::ensure_step`]).
    ///
    /// # Panics
    /// Before the step side is set.
    pub(crate) fn step_acts(&self) -> &B::Buf {
        &self.step.as_ref().expect("the step side is set").acts
    }

    /// Most row points whose output-layer product fits a block.
    pub(crate) fn output_block_points(&self) -> usize {
        (self.block_bytes / (8 * (self.k + 1) * self.m).max(1)).max(1)
    }

    /// Adds layer 0's `f` filled steps of the buffers `rows` and `train` (`slots` steps side
    /// by side, `h` numbers each; [`Layer0View`]'s layouts) scaled by `x_p·x_i + 1`; returns
    /// the GEMM flops.
    fn layer0_bufs(&mut self, rows: &B::Buf, train: &B::Buf, h: usize, sl: usize, f: usize) -> Result<f64> {
        let (layout, p, m, k) = (self.layout, self.p, self.m, self.k);
        if f == 0 || p == 0 || m == 0 {
            return Ok(0.0);
        }
        let be = &*self.be;
        let s0 = self.s0.as_ref().expect("layer 0's scale is formed before its first flush");
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
            be.gemm(&g, rows, train, prod)?;
            let n = nb * rpp * m * cols;
            be.pk_fold_scaled(n, m as i64, cols as i64, rpp as i64, k as i64, i64::from(layout == Layout::Diag), nb as i64, p0 as i64, s0, prod, &mut self.g)?;
        }
        self.dirty = true;
        Ok(2.0 * p as f64 * m as f64 * (k * cols * f * h) as f64)
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
pub(crate) fn plain(offset: usize, ld: usize) -> Operand {
    Operand { offset, ld, stride: 0, trans: false }
}

/// Row-major `[n, ld]` read transposed (the training side of `A·Bᵀ`).
pub(crate) fn transposed(offset: usize, ld: usize) -> Operand {
    Operand { offset, ld, stride: 0, trans: true }
}

impl<B> Resident for ResidentGram<B>
where
    B: Kernels + Send + Sync + 'static,
    B::Buf: Send + 'static,
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
        assert_eq!((l0.p, l0.m, l0.k), (self.p, self.m, self.k), "layer 0's buffers are for another Gram");
        if l0.filled == 0 || self.p == 0 || self.m == 0 {
            return Ok(0.0);
        }
        let (rows, train) = (self.be.upload(l0.rows)?, self.be.upload(l0.train)?);
        self.layer0_bufs(&rows, &train, l0.h, l0.slots, l0.filled)
    }

    fn output(&mut self, p0: usize, nb: usize, ab: &[f64], acts: &[f64], ne: usize, dt: &TrainDeltas, alpha: f64, version: u64) -> Result<()> {
        assert_eq!(dt.layout(), self.layout, "training sensitivities arranged for another layout");
        assert!(p0 + nb <= self.p, "row points beyond the Gram");
        if nb == 0 || self.m == 0 {
            return Ok(());
        }
        self.ensure_step(acts, ne, dt, version)?;
        let a = self.be.upload(&ab[..nb * (self.k + 1) * ne])?;
        self.output_from(p0, nb, &a, 0, ne, dt, alpha)
    }

    fn add_into(&mut self, sink: &mut GramSink) -> Result<f64> {
        let flops = self.contract_device_layer0()?;
        if !self.dirty {
            return Ok(flops);
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
        Ok(flops)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::host::Host;
    use crate::device::Backend;
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
    /// sink already held — both through the accumulator (the rows' factors uploaded) and
    /// through the device's own buffers (`put_rows`, `output_from`, `put_train`: the closed
    /// form's whole step on a device).
    #[test]
    fn resident_accumulation_equals_the_host_accumulator() {
        let (p, m, k, h, d, alpha) = (80, 80, 3, 2, 4, 0.7);
        let ne = h + 1;
        let x_rows = numbers(p * d, 1);
        let x_train = numbers(m * d, 2);
        // The training side of step s: layer 0's sensitivities, the output layer's activations
        // and structured sensitivities α(δ_co − q_io).
        let train_side = |s: u64| {
            let d0 = numbers(m * k * h, 10 + s);
            let a1: Vec<f64> = numbers(m * h, 20 + s).iter().map(|v| v.max(0.0)).collect();
            let q = numbers(m * k, 30 + s);
            let d1: Vec<f64> = (0..m * k * k).map(|j| alpha * (f64::from(u8::from((j / k) % k == j % k)) - q[(j / (k * k)) * k + j % k])).collect();
            (d0, a1, d1)
        };
        // The row points' factors of step s, chunk `first..last`.
        let rows_side = |s: u64, first: usize, last: usize| (numbers((last - first) * k * h, 100 * s + first as u64), numbers((last - first) * (k + 1) * ne, 200 * s + first as u64));
        let chunks = [(30, 80), (0, 29), (29, 30)];
        for layout in [Layout::Full, Layout::Diag, Layout::Trace] {
            for chen in [false, true] {
                let colw = chen.then(|| numbers(m * k, 3).iter().map(|v| 1.5 + v).collect::<Vec<f64>>());
                let block = 8 * m * layout.per_pair(k) * 3;
                let mk = |resident: bool| {
                    let acc = GramAccumulator::with_layout(layout, p, m, k, true).with_output_alpha(alpha);
                    if resident {
                        acc.with_resident(Box::new(ResidentGram::new(Arc::new(Host), layout, p, m, k, block).unwrap()))
                    } else {
                        acc
                    }
                };
                let (mut host, mut dev, mut own) = (mk(false), mk(true), mk(false));
                // Something the sink held before: the resident Gram is added to it.
                let before = numbers(p * m * layout.per_pair(k), 9);
                for acc in [&mut host, &mut dev, &mut own] {
                    acc.sink_mut().rows_mut(0..p).copy_from_slice(&before);
                }
                let be = Host;
                let mut r = ResidentGram::new(Arc::new(Host), layout, p, m, k, block).unwrap();
                r.scale(&x_rows, &x_train, d, 1.0).unwrap();
                let slots = crate::kernel::gram::layer0_slots(layout, p, m, k, h);
                let cw = colw.as_ref().map(|c| be.upload(c).unwrap());
                for s in 0..7u64 {
                    let (d0, a1, d1) = train_side(s);
                    let train = [LayerFactors { acts: &x_train, deltas: &d0, n_in: d, n_out: h }, LayerFactors { acts: &a1, deltas: &d1, n_in: h, n_out: k }];
                    let dt = TrainDeltas::output(layout, &d1, m, k, colw.as_deref(), alpha);
                    r.ensure_step(&crate::kernel::gram::train_acts_ext(&train[1], true), ne, &dt, 1000 + s).unwrap();
                    for (first, last) in chunks {
                        let (dbar, ab) = rows_side(s, first, last);
                        for acc in [&mut host, &mut dev] {
                            acc.add_integrated(&dbar, &ab, &train, &x_rows, colw.as_deref(), first..last);
                        }
                        r.put_rows(first, last - first, &be.upload(&dbar).unwrap(), h, slots).unwrap();
                        let abb = be.upload(&ab).unwrap();
                        for p0 in (first..last).step_by(2) {
                            r.output_from(p0, 2.min(last - p0), &abb, (p0 - first) * (k + 1) * ne, ne, &dt, alpha).unwrap();
                        }
                    }
                    for acc in [&mut host, &mut dev] {
                        acc.end_step(&train[0], colw.as_deref());
                    }
                    r.put_train(&be.upload(&d0).unwrap(), cw.as_ref()).unwrap();
                }
                r.add_into(own.sink_mut()).unwrap();
                let (g_host, _) = host.finish_layers();
                dev.check().unwrap();
                let scale = crate::kernel::max_abs(&g_host);
                for (route, acc) in [("accumulator", dev), ("device buffers", own)] {
                    let (g, _) = acc.finish_layers();
                    let diff = crate::kernel::max_abs_diff(&g, &g_host);
                    assert!(scale > 1.0 && diff <= 1e-14 * scale, "{layout:?} chen {chen} {route}: {diff:e} of {scale:e}");
                }
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
