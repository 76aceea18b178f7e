//! The closed form's rows on a device: [`super::pieces::row_factors`] as the kernel
//! `pk_mlp_pieces` of `kernels/epk.cu` (one item per row point, the same arithmetic in the same
//! order), on any backend of [`Kernels`] — a GPU with `--device cuda`, the host in the tests,
//! which hold it equal to the Rust integration.

use std::sync::Arc;

use crate::device::kernels::Kernels;
use crate::error::Result;
use crate::kernel::quadrature::gauss_legendre;
use crate::kernel::quadrature::piece::ORDERS;
use crate::kernel::stack::closed::dense_relu::pieces::{applies, PointStats, RowFactors};
use crate::kernel::stack::closed::dense_relu::step::{FirstLayer, MlpStep};
use crate::model::OutputKind;

/// Where a step's rows are integrated: object-safe, so that the step model holds any backend.
pub(crate) trait RowsOnDevice: Send + Sync {
    /// [`super::pieces::row_factors`] of the points `x` (`[n, d]`, layer 0 of the step at them
    /// in `first`, offsets `off` `[n, K]`).
    fn row_factors(&self, step: &MlpStep, first: &FirstLayer, x: &[f64], off: Option<&[f64]>, tol: f64, cosine: bool) -> Result<RowFactors>;
}

/// [`RowsOnDevice`] on a backend of [`Kernels`].
pub(crate) struct OnDevice<B>(pub Arc<B>);

impl<B> RowsOnDevice for OnDevice<B>
where
    B: Kernels + Send + Sync,
{
    fn row_factors(&self, step: &MlpStep, first: &FirstLayer, x: &[f64], off: Option<&[f64]>, tol: f64, cosine: bool) -> Result<RowFactors> {
        row_factors_on(&*self.0, step, first, x, off, tol, cosine)
    }
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
    let xsq: Vec<f64> = x.chunks_exact(d).map(|xp| xp.iter().map(|v| v * v).sum::<f64>() + if bias { 1.0 } else { 0.0 }).collect();
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
