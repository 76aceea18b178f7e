//! TRAK (Park et al. 2023, Algorithm 1) on the run and on an ensemble: per model, the kernel
//! regression of the log-odds gradients for every projection dimension and ridge (and the
//! unprojected form), then `1 − p` reweighting; [`trak`] is the same for one model at one setting,
//! for notebooks.

use std::time::Instant;

use super::score::{fmt_g, line, one_minus_p, scale_columns, Scorer, Sweep};
use super::{Bench, Checks, MethodResult};
use crate::api::Trained;
use crate::datamodels::cache::Stages;
use crate::datamodels::grads::{directions, Direction, Projection, ScalarGrads};
use crate::datamodels::mlp::Mlp1;
use crate::datamodels::retrain::gd;
use crate::datamodels::ridge::Ridge;
use crate::error::{Error, Result};

/// What one model's regressions cover: projection dimensions (each a prefix of one Gaussian
/// projection of the largest), ridges, whether the unprojected form is included, the projection's
/// seed.
struct Grid<'a> {
    dims: &'a [usize],
    ridges: &'a [f64],
    full: bool,
    seed: u64,
}

/// One model's unweighted regressions `φ(x)(ΦᵀΦ + λI)⁻¹Φᵀ` (and `g(x)ᵀGᵀ(GGᵀ + λI)⁻¹` when
/// `grid.full`), each handed to `add(slot, τ)` with `slot = di·|ridges| + li` for dimension `di`
/// and `dims.len()·|ridges| + li` for the unprojected form. Returns `1 − p_i` at the training
/// points and the seconds of the unprojected and the projected regressions.
///
/// # Shapes
/// `xt [P, d]`, `yt [P]`, `x [M, d]`, `y [M]`; every `τ [P, M]`.
fn regressions(w: &Mlp1, (xt, yt): (&[f64], &[usize]), (x, y): (&[f64], &[usize]), grid: &Grid, add: &mut dyn FnMut(usize, Vec<f64>)) -> Result<(Vec<f64>, f64, f64)> {
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
pub(super) fn check_dims(dims: &[usize]) -> Result<()> {
    match dims.iter().find(|&&d| d == 0 || d > MAX_DIM) {
        Some(d) => Err(Error::Config(format!("TRAK projection dimension {d}: it must lie in 1..={MAX_DIM}"))),
        None => Ok(()),
    }
}

/// The largest projection dimension ([`crate::datamodels::grads::gaussian_row`]).
const MAX_DIM: usize = 4096;

/// TRAK's attributions with one model, the run at `w_N`, of `log p_y` at inputs `x` with labels
/// `labels`: `τ = φ(x)(ΦᵀΦ + λI)⁻¹Φᵀ diag(1 − p_i)` with `φ` the gradient of TRAK's model output
/// `log(p/(1 − p))` projected to `dim` by the seeded Gaussian projection (`None`: unprojected,
/// `g(x)ᵀGᵀ(GGᵀ + λI)⁻¹`), `λ = ridge · tr(ΦᵀΦ)/M` (relative, as in the benchmark).
///
/// # Shapes
/// `x [P, d]`, `labels [P]` → `τ [P, M]`.
///
/// Errors: a run the benchmark does not cover ([`Mlp1::check_architecture`]), inputs of the wrong
/// width, a dimension of 0 or above 4 096, a failed eigendecomposition.
pub fn trak(net: &Trained, x: &[f64], labels: &[usize], dim: Option<usize>, ridge: f64, seed: u64) -> Result<Vec<f64>> {
    let arch = &net.run().manifest.architecture;
    let ds = &net.run().dataset;
    if x.len() != labels.len() * ds.dim {
        return Err(Error::ShapeMismatch { what: "trak: inputs".into(), expected: vec![labels.len(), ds.dim], got: vec![x.len()] });
    }
    check_dims(dim.as_slice())?;
    let w = Mlp1::from_params(arch, net.states().last().expect("a run has states"))?;
    let dims: Vec<usize> = dim.into_iter().collect();
    let grid = Grid { dims: &dims, ridges: &[ridge], full: dim.is_none(), seed };
    let mut tau = Vec::new();
    let (q, _, _) = regressions(&w, (x, labels), (&ds.x_train, ds.train_labels()?), &grid, &mut |_, t| tau = t)?;
    scale_columns(&mut tau, &q);
    Ok(tau)
}

impl<C: Stages> Bench<'_, C> {
    /// TRAK with one model (the run) and with the ensemble (`ensemble_seeds`, each trained on
    /// the full set by the fast retrainer, cached), projected over `trak_dims` and unprojected,
    /// over `trak_ridges`; the ensemble averages `φ(ΦᵀΦ + λI)⁻¹Φᵀ` over models and `1 − p_i`
    /// separately. Returns the methods and the ensemble's training seconds; the retrainer's
    /// seed-0 network against the recorded run goes to `checks`.
    pub(super) fn trak(&self, sc: &Scorer, checks: &mut Checks) -> Result<(Vec<MethodResult>, f64)> {
        let (spec, arch) = (self.spec, self.arch);
        let man = &self.net.run().manifest;
        let t_ens = Instant::now();
        let (ensemble, ens_train_s): (Vec<Vec<f64>>, f64) = self.cache.stage("ensemble", &self.key("ensemble"), || {
            let e = spec
                .ensemble_seeds
                .iter()
                .map(|&s| {
                    let w = gd(&Mlp1::from_params(arch, &arch.init(s))?, self.x, &self.y, self.lr, self.steps)?;
                    self.log(&format!("ensemble seed {s} trained ({:.0} s)", t_ens.elapsed().as_secs_f64()));
                    Ok(w.flat())
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((e, t_ens.elapsed().as_secs_f64()))
        })?;
        if let Some(pos) = spec.ensemble_seeds.iter().position(|&s| s == man.seed) {
            if self.net.states()[0] == arch.init(man.seed) {
                let (a, b) = (&ensemble[pos], self.wn.flat());
                let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max);
                checks.retrain_vs_run = Some(a.iter().zip(&b).map(|(u, v)| (u - v).abs()).fold(0.0, f64::max) / scale);
            }
        }
        // The run first; the ensemble's copy of the run's seed is dropped when it is the run.
        let models: Vec<Mlp1> = std::iter::once(Ok(self.wn.clone()))
            .chain(ensemble.iter().zip(&spec.ensemble_seeds).filter(|(_, &s)| !(s == man.seed && checks.retrain_vs_run.is_some())).map(|(f, _)| {
                let params = crate::model::Params::from_flat(arch.param_specs(), f)?;
                Mlp1::from_params(arch, &params)
            }))
            .take(spec.ensemble_seeds.len().max(1))
            .collect::<Result<_>>()?;
        // Sums over models of the unweighted regressions, per (d or full, λ), and of 1 − p.
        let grid = Grid { dims: &spec.trak_dims, ridges: &spec.trak_ridges, full: true, seed: spec.projection_seed };
        let (p, m) = (self.yt.len(), self.m);
        let (nd, nl) = (spec.trak_dims.len() + 1, spec.trak_ridges.len()); // slot nd − 1: unprojected
        let mut sums: Vec<Vec<f64>> = vec![vec![0.0; p * m]; nd * nl];
        let mut qsum = vec![0.0; m];
        let (mut t1_proj, mut t1_full, mut ens_s) = (0.0, 0.0, 0.0);
        let mut one: Option<Vec<Vec<f64>>> = None;
        for (mi, w) in models.iter().enumerate() {
            let (q, tf, tp) = regressions(w, (self.xt, self.yt), (self.x, &self.y), &grid, &mut |slot, tau| sums[slot].iter_mut().zip(tau).for_each(|(a, b)| *a += b))?;
            qsum.iter_mut().zip(&q).for_each(|(a, b)| *a += b);
            if mi == 0 {
                (t1_full, t1_proj) = (tf, tp);
                one = Some(sums.iter().map(|s| s.iter().zip(q.iter().cycle()).map(|(a, b)| a * b).collect()).collect());
            }
            ens_s += tf + tp;
            self.log(&format!("trak: model {}/{} ({:.0} s)", mi + 1, models.len(), ens_s));
        }
        let one = one.expect("at least one model");
        let nm = models.len() as f64;
        let qbar: Vec<f64> = qsum.iter().map(|v| v / nm).collect();
        let setting = |di: usize, l: f64, full: bool| if full { (format!("λ={}", fmt_g(l)), None) } else { (format!("d={} λ={}", spec.trak_dims[di], fmt_g(l)), Some(spec.trak_dims[di])) };
        let mut methods = Vec::new();
        for (name, full) in [("trak-1", false), ("trak-1-full", true)] {
            let mut sw = Sweep::new(name, 1);
            for di in (0..nd).filter(|&di| (di == nd - 1) == full) {
                for (li, &l) in spec.trak_ridges.iter().enumerate() {
                    let (s, dim) = setting(di, l, full);
                    sw.add(sc, s, dim, Some(l), &one[di * nl + li])?;
                }
            }
            methods.push(sw.finish(sc, if full { t1_full } else { t1_proj }));
        }
        if models.len() > 1 {
            let ens_name = format!("trak-{}", models.len());
            for full in [false, true] {
                let name = if full { format!("{ens_name}-full") } else { ens_name.clone() };
                let mut sw = Sweep::new(&name, models.len());
                for di in (0..nd).filter(|&di| (di == nd - 1) == full) {
                    for (li, &l) in spec.trak_ridges.iter().enumerate() {
                        let mut tau: Vec<f64> = sums[di * nl + li].iter().map(|v| v / nm).collect();
                        scale_columns(&mut tau, &qbar);
                        let (s, dim) = setting(di, l, full);
                        sw.add(sc, s, dim, Some(l), &tau)?;
                    }
                }
                methods.push(sw.finish(sc, 0.0));
            }
            // The ensemble's cost: all models' regressions (its sweep's own time is in `seconds`).
            let n = methods.len();
            methods[n - 2].seconds += ens_s;
        }
        methods.iter().for_each(|r| self.log(&line(r)));
        Ok((methods, ens_train_s))
    }
}
