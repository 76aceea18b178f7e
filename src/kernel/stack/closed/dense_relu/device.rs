//! The closed form on a device, on any backend of [`Kernels`] — a GPU with `--device cuda`,
//! the host in the tests, which hold it to the host path.
//!
//! - The rows: [`super::pieces::row_factors`] as the kernel `pk_mlp_pieces` of
//!   `kernels/epk.cu` (one item per row point, the same arithmetic in the same order; bit for
//!   bit the Rust integration on the host backend).
//! - The whole step ([`RowsOnDevice::step`]), when the Gram is resident on the same backend
//!   (`kernel::backend::resident`): the row points go up once per computation, and per step
//!   only the weights, the training side (its activations, softmax, layer 0's sensitivities)
//!   and the prediction weights go up; layer 0 at the rows (two GEMMs), their integration, the
//!   contraction of both layers, layer 0's training sensitivities (`pk_mlp_delta0`) and the
//!   prediction run there, and only the predictions, the pieces' counts and (when asked) the
//!   self-kernel come down. The training side's forward and its output layer's sensitivities at
//!   `w_s`, and the prediction weights (the coefficients folded in before one backward pass:
//!   no `[M, K, h]` sensitivities), stay on the host.

use std::sync::{Arc, Mutex};

use crate::device::kernels::Kernels;
use crate::device::Gemm;
use crate::error::Result;
use crate::kernel::backend::resident::{plain, transposed, Resident, ResidentGram};
use crate::kernel::backend::{Site, Stamp};
use crate::kernel::gram::{self, GramAccumulator, LayerFactors};
use crate::kernel::layout::TrainDeltas;
use crate::kernel::quadrature::gauss_legendre;
use crate::kernel::quadrature::piece::ORDERS;
use crate::kernel::stack::closed::dense_relu::pieces::{applies, PointStats, RowFactors};
use crate::kernel::stack::closed::dense_relu::step::{FirstLayer, MlpStep};
use crate::kernel::step_model::StepInput;
use crate::model::OutputKind;

/// Row points a device integrates at once (one item each: a GPU wants thousands).
pub(crate) const DEVICE_CHUNK_POINTS: usize = 1 << 14;

/// What [`RowsOnDevice::step`] hands back to the host.
pub(crate) struct DeviceStep {
    /// The step's prediction `⟨∫∇f, v⟩` `[P, K]`.
    pub pred: Vec<f64>,
    /// Each row point's pieces.
    pub stats: Vec<PointStats>,
    /// Wall seconds until the rows' factors were formed (layer 0 at the rows and their
    /// integration): the host waits for the device's queue there, so what was queued before
    /// (a previous step's layer-0 contraction, launched without waiting) is counted here too.
    pub rows_seconds: f64,
    /// Wall seconds of the contraction and the prediction after them (until the predictions
    /// come down), and of launching layer 0's training side.
    pub contraction_seconds: f64,
    /// The contraction's GEMM flops.
    pub flops: f64,
}

/// Where a step's rows are integrated: object-safe, so that the step model holds any backend.
pub(crate) trait RowsOnDevice: Send + Sync {
    /// [`super::pieces::row_factors`] of the points `x` (`[n, d]`, layer 0 of the step at them
    /// in `first`, offsets `off` `[n, K]`).
    fn row_factors(&self, step: &MlpStep, first: &FirstLayer, x: &[f64], off: Option<&[f64]>, tol: f64, cosine: bool) -> Result<RowFactors>;

    /// The whole step on the device (module docs) when `acc`'s Gram is resident on this
    /// backend and the training side is at `w_s` (not the path kernel's integrated one);
    /// `None` otherwise. `train` are the training points' factors of both layers at `w_s`
    /// (layer 0's sensitivities are not read: they are formed on the device),
    /// `v` the prediction weights ([`gram::prediction_weights`]); the self-kernel is added to
    /// `diag` (`[P, K, K]`) when the input asks for it.
    fn step(&self, step: &MlpStep, input: &StepInput<'_>, train: &[LayerFactors<'_>], v: &[Vec<f64>], acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<Option<DeviceStep>>;
}

/// What stays on the device for a whole computation: the row points with the bias column, and
/// per chunk of [`DEVICE_CHUNK_POINTS`] their squared norms and offsets.
struct RunSide<Buf> {
    /// Which rows and offsets (their addresses and lengths: a computation's do not move).
    key: [usize; 4],
    /// `[x, 1]` (or `x` without biases) `[P, d(+1)]`.
    xe: Buf,
    /// Per chunk: `|x|² + [bias]` `[chunk]` and the offsets `[chunk, K]` (empty without).
    chunks: Vec<(Buf, Buf)>,
    /// The Gauss–Legendre rules `pk_mlp_pieces` compares.
    gl: Buf,
}

/// [`RowsOnDevice`] on a backend of [`Kernels`].
pub(crate) struct OnDevice<B: Kernels> {
    be: Arc<B>,
    run: Mutex<Option<RunSide<B::Buf>>>,
}

impl<B: Kernels> OnDevice<B> {
    /// The closed form on `be`.
    pub(crate) fn new(be: Arc<B>) -> Self {
        OnDevice { be, run: Mutex::new(None) }
    }
}

impl<B> RowsOnDevice for OnDevice<B>
where
    B: Kernels + Send + Sync + 'static,
    B::Buf: Send + 'static,
{
    fn row_factors(&self, step: &MlpStep, first: &FirstLayer, x: &[f64], off: Option<&[f64]>, tol: f64, cosine: bool) -> Result<RowFactors> {
        row_factors_on(&*self.be, step, first, x, off, tol, cosine)
    }

    fn step(&self, step: &MlpStep, input: &StepInput<'_>, train: &[LayerFactors<'_>], v: &[Vec<f64>], acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<Option<DeviceStep>> {
        if input.train_integrated || !applies(step) || step.k < 2 || step.alpha == 0.0 {
            return Ok(None);
        }
        let Some(res) = acc.resident_mut().and_then(|r| r.as_any_mut().downcast_mut::<ResidentGram<B>>()) else {
            return Ok(None);
        };
        let mut run = self.run.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let rows = input.rows;
        let off = input.off_rows.unwrap_or(&[]);
        let key = [rows.x.as_ptr() as usize, rows.x.len(), off.as_ptr() as usize, off.len()];
        if run.as_ref().is_none_or(|r| r.key != key) {
            *run = None;
            *run = Some(run_side(&*self.be, &rows.x, rows.dim, input.off_rows, step.k, step.bias, key)?);
        }
        let out = whole_step(&*self.be, res, run.as_ref().expect("set above"), step, input, train, v, diag)?;
        Ok(Some(out))
    }
}

/// `|x|² + [bias]` of each point of `x` (`[n, d]`).
fn squared_norms(x: &[f64], d: usize, bias: bool) -> Vec<f64> {
    x.chunks_exact(d).map(|xp| xp.iter().map(|v| v * v).sum::<f64>() + if bias { 1.0 } else { 0.0 }).collect()
}

/// The row points of a computation (and their offsets `off` `[P, K]`) on `be`.
#[allow(clippy::too_many_arguments)]
fn run_side<B: Kernels>(be: &B, x: &[f64], d: usize, off: Option<&[f64]>, k: usize, bias: bool, key: [usize; 4]) -> Result<RunSide<B::Buf>> {
    let p = x.len() / d.max(1);
    let xb = be.upload(x)?;
    let xe = if bias {
        let mut xe = be.zeros(p * (d + 1))?;
        be.pk_append_one(p * (d + 1), d as i64, &xb, &mut xe)?;
        xe
    } else {
        xb
    };
    let xsq = squared_norms(x, d, bias);
    let chunks = (0..p)
        .step_by(DEVICE_CHUNK_POINTS)
        .map(|c0| {
            let c1 = (c0 + DEVICE_CHUNK_POINTS).min(p);
            Ok((be.upload(&xsq[c0..c1])?, off.map_or_else(|| be.zeros(0), |o| be.upload(&o[c0 * k..c1 * k]))?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RunSide { key, xe, chunks, gl: be.upload(&rules())? })
}

/// `c = x[c0..c0 + n] · wᵀ (+ b)`: `x` the row points with `ld` numbers a row (the first `kdim`
/// used), `w` `[out, kdim]`, `b` `[out]`.
#[allow(clippy::too_many_arguments)]
fn rows_times<B: Kernels>(be: &B, x: &B::Buf, c0: usize, n: usize, ld: usize, kdim: usize, w: &B::Buf, b: Option<&B::Buf>, out: usize) -> Result<B::Buf> {
    let mut c = be.zeros(n * out)?;
    let g = Gemm { m: n, n: out, k: kdim, batch: 1, alpha: 1.0, accumulate: false, a: plain(c0 * ld, ld), b: transposed(0, kdim), c: plain(0, out) };
    be.gemm(&g, x, w, &mut c)?;
    if let Some(b) = b {
        be.pk_add_bias(n * out, out as i64, 1, b, &mut c)?;
    }
    Ok(c)
}

/// [`RowsOnDevice::step`] on `be` with the Gram `res`.
#[allow(clippy::too_many_arguments)]
fn whole_step<B>(be: &B, res: &mut ResidentGram<B>, run: &RunSide<B::Buf>, step: &MlpStep, input: &StepInput<'_>, train: &[LayerFactors<'_>], v: &[Vec<f64>], diag: &mut [f64]) -> Result<DeviceStep>
where
    B: Kernels + Send + Sync + 'static,
    B::Buf: Send + 'static,
{
    let (p, m, k, layout) = (res.p(), res.m(), res.k(), res.layout());
    let (d, h, bias, alpha) = (step.input_dim(), step.layers[0].n_out, step.bias, step.alpha);
    let (de, ne) = (d + usize::from(bias), h + usize::from(bias));
    assert_eq!(input.rows.len(), p, "the rows are the Gram's");
    // The step's training side: the output layer's activations and structured sensitivities,
    // layer 0's scale at the first step.
    if !res.has_scale() {
        res.scale(&input.rows.x, input.x_train, d, if bias { 1.0 } else { 0.0 })?;
    }
    let dt = TrainDeltas::output(layout, train[1].deltas, m, k, input.colw, alpha);
    res.ensure_step(&gram::train_acts_ext(&train[1], bias), ne, &dt, Stamp::fresh(Site::Deep(0)).version)?;
    let (l0, l1) = (&step.layers[0], &step.layers[1]);
    let up = |v: &[f64]| be.upload(v);
    let (w0, dw0, b0, db0) = (up(&l0.w)?, up(&l0.dw)?, up(&l0.b)?, up(&l0.db)?);
    let (w1, dw1, b1, db1) = (up(&l1.w)?, up(&l1.dw)?, up(&l1.b)?, up(&l1.db)?);
    let (v0, v1) = (up(&v[0])?, up(&v[1])?);
    let slots = gram::layer0_slots(layout, p, m, k, h);
    let int = |v: bool| i64::from(v);
    let mut out = DeviceStep { pred: vec![0.0; p * k], stats: Vec::with_capacity(p), rows_seconds: 0.0, contraction_seconds: 0.0, flops: 0.0 };
    // The uploads above are the host's share (neither rows nor contraction).
    let mut mark = std::time::Instant::now();
    let mut lap = |to: &mut f64| {
        let now = std::time::Instant::now();
        *to += (now - mark).as_secs_f64();
        mark = now;
    };
    for (c0, (xs, offb)) in (0..p).step_by(DEVICE_CHUNK_POINTS).zip(&run.chunks) {
        let pc = DEVICE_CHUNK_POINTS.min(p - c0);
        // Layer 0 at the rows, their integration; the counts' download waits for both.
        let z = rows_times(be, &run.xe, c0, pc, de, d, &w0, Some(&b0), h)?;
        let u = rows_times(be, &run.xe, c0, pc, de, d, &dw0, Some(&db0), h)?;
        let mut scratch = be.zeros(pc * (5 * h + 2 + 2 * ne + 13 * k + 6 * k * k))?;
        let (mut dbar, mut ab, mut dg, mut st) = (be.zeros(pc * k * h)?, be.zeros(pc * (k + 1) * ne)?, be.zeros(pc * k * k)?, be.zeros(pc * 4)?);
        be.pk_mlp_pieces(pc, h as i64, k as i64, int(bias), int(step.output == OutputKind::LogSoftmax), int(input.off_rows.is_some()), int(input.cosine), alpha, input.tol_step, &z, &u, xs, offb, &w1, &dw1, &b1, &db1, &run.gl, &mut scratch, &mut dbar, &mut ab, &mut dg, &mut st)?;
        drop((z, u, scratch));
        out.stats.extend(be.download(&st)?.chunks_exact(4).map(|s| PointStats { pieces: s[0] as usize, unconverged: s[1] as usize, cosine_sum: s[2], cosine_count: s[3] as usize }));
        lap(&mut out.rows_seconds);
        // Both layers' contraction and the prediction, from the factors where they are.
        res.put_rows(c0, pc, &dbar, h, slots)?;
        let nbmax = res.output_block_points();
        for p0 in (c0..c0 + pc).step_by(nbmax) {
            let nb = nbmax.min(c0 + pc - p0);
            res.output_from(p0, nb, &ab, (p0 - c0) * (k + 1) * ne, ne, &dt, alpha)?;
            out.flops += 2.0 * (nb * (k + 1)) as f64 * m as f64 * ne as f64;
        }
        let vx = rows_times(be, &run.xe, c0, pc, de, de, &v0, None, h)?;
        let mut pb = be.zeros(pc * k)?;
        be.pk_mlp_predict(pc * k, k as i64, h as i64, ne as i64, alpha, &dbar, &vx, &ab, &v1, &mut pb)?;
        out.pred[c0 * k..(c0 + pc) * k].iter_mut().zip(be.download(&pb)?).for_each(|(a, b)| *a += b);
        if input.self_kernel {
            diag[c0 * k * k..(c0 + pc) * k * k].iter_mut().zip(be.download(&dg)?).for_each(|(a, b)| *a += b);
        }
        lap(&mut out.contraction_seconds);
    }
    // Layer 0's training side ends the step (its buffer contracted when full), formed here
    // from the output layer's sensitivities (`[M, K, K]`, not `[M, K, h]`, go up).
    let mut dtrain = be.zeros(m * k * h)?;
    be.pk_mlp_delta0(m * k * h, k as i64, h as i64, ne as i64, &up(train[1].deltas)?, res.step_acts(), &w1, &mut dtrain)?;
    let colw = input.colw.map(up).transpose()?;
    out.flops += res.put_train(&dtrain, colw.as_ref())?;
    lap(&mut out.contraction_seconds);
    Ok(out)
}

/// The two Gauss–Legendre rules the pieces compare, on `[−1, 1]`: nodes then weights of each.
fn rules() -> Vec<f64> {
    assert_eq!(ORDERS, (8, 16), "pk_mlp_pieces compares Gauss–Legendre 8 and 16");
    [ORDERS.0, ORDERS.1]
        .into_iter()
        .flat_map(|o| {
            let r = gauss_legendre(o);
            r.iter().map(|p| p.0).chain(r.iter().map(|p| p.1)).collect::<Vec<f64>>()
        })
        .collect()
}

/// [`super::pieces::row_factors`] on `be`.
///
/// # Panics
/// If [`applies`] does not hold.
pub(crate) fn row_factors_on<B: Kernels>(be: &B, step: &MlpStep, first: &FirstLayer, x: &[f64], off: Option<&[f64]>, tol: f64, cosine: bool) -> Result<RowFactors> {
    assert!(applies(step), "the integrated MLP rows need one hidden ReLU layer and a structured output");
    let (d, k, h, bias) = (step.input_dim(), step.k, first.h, step.bias);
    let n = x.len() / d;
    let ne = h + usize::from(bias);
    let mut out = RowFactors { dbar: Vec::new(), ab: Vec::new(), diag: Vec::new(), stats: Vec::new() };
    if n == 0 {
        return Ok(out);
    }
    let xsq = squared_norms(x, d, bias);
    let l1 = &step.layers[1];
    let up = |v: &[f64]| be.upload(v);
    let (z, u, xs) = (up(&first.z[..n * h])?, up(&first.u[..n * h])?, up(&xsq)?);
    let offb = match off {
        Some(o) => up(&o[..n * k])?,
        None => be.zeros(0)?,
    };
    let (w, dw, b, db, gl) = (up(&l1.w)?, up(&l1.dw)?, up(&l1.b)?, up(&l1.db)?, up(&rules())?);
    let mut scratch = be.zeros(n * (5 * h + 2 + 2 * ne + 13 * k + 6 * k * k))?;
    let (mut dbar, mut ab, mut diag, mut stats) = (be.zeros(n * k * h)?, be.zeros(n * (k + 1) * ne)?, be.zeros(n * k * k)?, be.zeros(n * 4)?);
    let int = |v: bool| i64::from(v);
    be.pk_mlp_pieces(n, h as i64, k as i64, int(bias), int(step.output == OutputKind::LogSoftmax), int(off.is_some()), int(cosine), step.alpha, tol, &z, &u, &xs, &offb, &w, &dw, &b, &db, &gl, &mut scratch, &mut dbar, &mut ab, &mut diag, &mut stats)?;
    out.dbar = be.download(&dbar)?;
    out.ab = be.download(&ab)?;
    out.diag = be.download(&diag)?;
    out.stats = be
        .download(&stats)?
        .chunks_exact(4)
        .map(|s| PointStats { pieces: s[0] as usize, unconverged: s[1] as usize, cosine_sum: s[2], cosine_count: s[3] as usize })
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::host::Host;
    use crate::kernel::stack::closed::dense_relu::pieces::row_factors;
    use crate::kernel::stack::closed::dense_relu::pieces::tests::random_step;

    /// The kernel on the host backend gives the Rust integration's factors, self-kernel and
    /// counts bit for bit (the same operations in the same order), on random steps with many
    /// kinks, both output maps, with and without biases and offsets, with a tight tolerance
    /// (bisected pieces) and a loose one.
    #[test]
    fn device_rows_equal_the_rust_integration() {
        let mut pieces = 0;
        for (seed, output, bias, with_off) in [(1, OutputKind::LogSoftmax, true, true), (2, OutputKind::LogSoftmax, false, false), (3, OutputKind::Identity, true, true), (4, OutputKind::LogSoftmax, true, false)] {
            let (step, x, off, _) = random_step(2000 + seed, seed, output, bias, (5, 11, 4, 9), 2.0, 1.5);
            let off = with_off.then_some(&off[..]);
            let first = step.first_layer(&x);
            for tol in [1e-15, 1e-6] {
                let want = row_factors(&step, &first, &x, off, tol, true);
                let got = row_factors_on(&Host, &step, &first, &x, off, tol, true).unwrap();
                let what = format!("seed {seed} tol {tol}");
                assert_eq!(got.dbar, want.dbar, "{what}: δ̄");
                assert_eq!(got.ab, want.ab, "{what}: [Ā; B̄]");
                assert_eq!(got.diag, want.diag, "{what}: self-kernel");
                for (g, w) in got.stats.iter().zip(&want.stats) {
                    assert_eq!((g.pieces, g.unconverged, g.cosine_sum, g.cosine_count), (w.pieces, w.unconverged, w.cosine_sum, w.cosine_count), "{what}: counts");
                }
                pieces += want.stats.iter().map(|s| s.pieces).sum::<usize>();
            }
        }
        assert!(pieces > 100, "too few pieces ({pieces}) for a meaningful test");
    }
}
