//! The benchmark's TRAK stage: TRAK ([`mod@crate::attribution::trak`]) on the run and on an
//! ensemble trained by the fast retrainer, over every projection dimension and ridge.

use std::time::Instant;

use super::score::{fmt_g, line, Scorer, Sweep};
use super::{Bench, Checks, MethodResult};
use crate::attribution::mlp::Mlp1;
use crate::attribution::ridge::scale_columns;
use crate::attribution::trak::{regressions, Grid};
use crate::datamodels::cache::Stages;
use crate::datamodels::retrain::gd;
use crate::error::Result;

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
