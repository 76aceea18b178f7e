//! `[sweep]`: the same training for several MLP widths (the NTK notebook's lazy training).

use std::path::Path;

use super::cache::Clock;
use super::{StudyConfig, StudyOptions, SweepSpec};
use crate::api::{Gram, Trained};
use crate::error::Result;
use crate::io::{self, Column, Table};
use crate::kernel::Rule;
use crate::plot::{self, Scale, Series};
use crate::train::TrainLog;

/// The `[sweep]` section: train one run per width (each a cached stage of the study's
/// [`Clock`]) and report the lazy-training measures.
pub(super) fn sweep(cfg: &StudyConfig, sw: &SweepSpec, clock: &mut Clock, cache: &Path, out: &Path, opts: &StudyOptions) -> Result<Vec<String>> {
    let mut notes = vec!["- Width sweep (lazy training, the NTK notebook): relative weight change ‖w_s − w_0‖/‖w_0‖, loss, and the NTK's relative change ‖K_N − K_0‖/‖K_0‖ on the training points.".to_string()];
    let mut t_name = Vec::new();
    let mut t_step = Vec::new();
    let mut t_loss = Vec::new();
    let mut t_change = Vec::new();
    let mut change_series = Vec::new();
    let mut loss_series = Vec::new();
    for h in &sw.hidden {
        let name = format!("hidden {h:?}");
        let rc = cfg.sweep_config(h);
        let dir = cache.join("sweep").join(h.iter().map(|w| w.to_string()).collect::<Vec<_>>().join("x")).join("run");
        clock.train(&format!("sweep run {name}"), "sweep", &rc, &dir, &opts.base_dir, opts.progress)?;
        let net = Trained::open(&dir)?;
        let (run, states) = (net.run(), net.states());
        let w0 = states[0].flat();
        let n0 = w0.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-300);
        let change: Vec<f64> = states.iter().map(|w| w.flat().iter().zip(&w0).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt() / n0).collect();
        let loss = TrainLog::read(&dir)?.loss;
        let steps: Vec<f64> = (0..states.len()).map(|s| s as f64).collect();
        // NTK on the training points at w_0 and at w_N.
        let ntk = |s: usize| -> Result<Gram> { net.ntk().train_side().rule(Rule::Gauss(1)).at_step(s).compute() };
        let (g0, gn) = (ntk(0)?, ntk(run.manifest.steps)?);
        let (k0, kn) = (&g0.output().gram, &gn.output().gram);
        let fro = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let ntk_change = fro(&k0.iter().zip(kn).map(|(a, b)| b - a).collect::<Vec<_>>()) / fro(k0).max(1e-300);
        notes.push(format!(
            "  - {name}: {} parameters, loss {:.3e} → {:.3e}, ‖w_N − w_0‖/‖w_0‖ = {:.3e}, NTK change {:.3e}",
            run.manifest.num_params,
            loss.first().copied().unwrap_or(f64::NAN),
            loss.last().copied().unwrap_or(f64::NAN),
            change.last().copied().unwrap_or(f64::NAN),
            ntk_change
        ));
        for s in 0..states.len() {
            t_name.push(name.clone());
            t_step.push(s as i64);
            t_loss.push(loss.get(s).copied().unwrap_or(f64::NAN));
            t_change.push(change[s]);
        }
        change_series.push(Series::new(name.clone(), steps.clone(), change));
        loss_series.push(Series::new(name, steps, loss));
    }
    Table::new()
        .with("run", Column::Str(t_name))
        .with("step", Column::I64(t_step))
        .with("loss", Column::F64(t_loss))
        .with("relative_weight_change", Column::F64(t_change))
        .write_parquet(&out.join("sweep.parquet"))?;
    if cfg.analysis.charts {
        let charts = out.join("charts");
        io::create_dir_all(&charts)?;
        plot::line_chart(&charts.join("lazy_weight_change.png"), "Relative change of the weights from initialisation", "step", "‖w_s − w_0‖ / ‖w_0‖", &change_series, Scale::Linear, Scale::Log)?;
        plot::line_chart(&charts.join("lazy_loss.png"), "Training loss", "step", "loss", &loss_series, Scale::Linear, Scale::Log)?;
        notes.push("- `charts/lazy_weight_change.png`, `charts/lazy_loss.png`, table `sweep.parquet`.".into());
    }
    Ok(notes)
}
