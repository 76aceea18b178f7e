//! TRAK (Park et al. 2023, Algorithm 1): per model, the kernel regression of the log-odds
//! gradients for every projection dimension and ridge (and the unprojected form), then `1 − p`
//! reweighting (`regressions` for a grid of settings, which the benchmark runs on the run and
//! on an ensemble); [`trak`] is the same for one model at one setting.

use std::time::Instant;

use super::grads::{directions, Direction, Projection, ScalarGrads};
use super::mlp::Mlp1;
use super::ridge::{one_minus_p, scale_columns, Ridge};
use crate::error::{Error, Result};
use crate::model::Params;
use crate::trajectory::Run;

/// What one model's regressions cover: projection dimensions (each a prefix of one Gaussian
/// projection of the largest), ridges, whether the unprojected form is included, the projection's
/// seed.
pub(crate) struct Grid<'a> {
    pub(crate) dims: &'a [usize],
    pub(crate) ridges: &'a [f64],
    pub(crate) full: bool,
    pub(crate) seed: u64,
}

/// One model's unweighted regressions `φ(x)(ΦᵀΦ + λI)⁻¹Φᵀ` (and `g(x)ᵀGᵀ(GGᵀ + λI)⁻¹` when
/// `grid.full`), each handed to `add(slot, τ)` with `slot = di·|ridges| + li` for dimension `di`
/// and `dims.len()·|ridges| + li` for the unprojected form. Returns `1 − p_i` at the training
/// points and the seconds of the unprojected and the projected regressions.
///
/// # Shapes
/// `xt [P, d]`, `yt [P]`, `x [M, d]`, `y [M]`; every `τ [P, M]`.
pub(crate) fn regressions(w: &Mlp1, (xt, yt): (&[f64], &[usize]), (x, y): (&[f64], &[usize]), grid: &Grid, add: &mut dyn FnMut(usize, Vec<f64>)) -> Result<(Vec<f64>, f64, f64)> {
    let (k, m, p, nl) = (w.k, y.len(), yt.len(), grid.ridges.len());
    let (fx, ft) = (w.forward(xt), w.forward(x));
    let q = one_minus_p(&ft.logp, y, k);
    let gx = ScalarGrads::new(w, xt, &fx, directions(&fx.logp, yt, k, Direction::LogOdds));
    let gt = ScalarGrads::new(w, x, &ft, directions(&ft.logp, y, k, Direction::LogOdds));
    let t = Instant::now();
    if grid.full {
        let rf = Ridge::kernel(&gx.gram(&gt), &gt.gram(&gt), m)?;
        for (li, &l) in grid.ridges.iter().enumerate() {
            add(grid.dims.len() * nl + li, rf.apply(l));
        }
    }
    let tf = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let dmax = grid.dims.iter().copied().max().unwrap_or(0);
    if dmax > 0 {
        let px = gx.project(Projection::Gaussian { seed: grid.seed, dim: dmax });
        let pt = gt.project(Projection::Gaussian { seed: grid.seed, dim: dmax });
        for (di, &dim) in grid.dims.iter().enumerate() {
            let cut = |v: &[f64], n: usize| -> Vec<f64> { (0..n).flat_map(|i| v[i * dmax..i * dmax + dim].iter().copied()).collect() };
            let r = Ridge::features(&cut(&px, p), &cut(&pt, m), dim)?;
            for (li, &l) in grid.ridges.iter().enumerate() {
                add(di * nl + li, r.apply(l));
            }
        }
    }
    Ok((q, tf, t.elapsed().as_secs_f64()))
}

/// Projection dimensions must lie in `1..=4096` (the seeded projection's rows stop there).
pub(crate) fn check_dims(dims: &[usize]) -> Result<()> {
    match dims.iter().find(|&&d| d == 0 || d > MAX_DIM) {
        Some(d) => Err(Error::Config(format!("TRAK projection dimension {d}: it must lie in 1..={MAX_DIM}"))),
        None => Ok(()),
    }
}

/// The largest projection dimension ([`super::grads::gaussian_row`]).
const MAX_DIM: usize = 4096;

/// TRAK's attributions with one model, the run at `w_N` (the last of its `states`), of `log p_y`
/// at inputs `x` with labels `labels`: `τ = φ(x)(ΦᵀΦ + λI)⁻¹Φᵀ diag(1 − p_i)` with `φ` the
/// gradient of TRAK's model output `log(p/(1 − p))` projected to `dim` by the seeded Gaussian
/// projection (`None`: unprojected, `g(x)ᵀGᵀ(GGᵀ + λI)⁻¹`), `λ = ridge · tr(ΦᵀΦ)/M` (relative,
/// as in the benchmark).
///
/// # Shapes
/// `x [P, d]`, `labels [P]` → `τ [P, M]`.
///
/// Errors: a run the benchmark does not cover ([`Mlp1::check_architecture`]), inputs of the wrong
/// width, a dimension of 0 or above 4 096, a failed eigendecomposition.
pub fn trak(run: &Run, states: &[Params], x: &[f64], labels: &[usize], dim: Option<usize>, ridge: f64, seed: u64) -> Result<Vec<f64>> {
    let arch = &run.manifest.architecture;
    let ds = &run.dataset;
    if x.len() != labels.len() * ds.dim {
        return Err(Error::ShapeMismatch { what: "trak: inputs".into(), expected: vec![labels.len(), ds.dim], got: vec![x.len()] });
    }
    check_dims(dim.as_slice())?;
    let w = Mlp1::from_params(arch, states.last().expect("a run has states"))?;
    let dims: Vec<usize> = dim.into_iter().collect();
    let grid = Grid { dims: &dims, ridges: &[ridge], full: dim.is_none(), seed };
    let mut tau = Vec::new();
    let (q, _, _) = regressions(&w, (x, labels), (&ds.x_train, ds.train_labels()?), &grid, &mut |_, t| tau = t)?;
    scale_columns(&mut tau, &q);
    Ok(tau)
}
