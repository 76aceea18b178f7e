//! The benchmark's tables: the text summary ([`BenchmarkResult`]'s `Display`) and the report files
//! ([`write_tables`]).

use std::path::Path;

use super::{BenchmarkResult, MethodResult, SweepPoint};
use crate::error::Result;
use crate::io::{Column, Table};

impl std::fmt::Display for BenchmarkResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (m, p, k) = self.shape;
        writeln!(f, "LDS on {} evaluation subsets ({} tuning), {p} test points, M = {m}, K = {k}, lr {} x {} steps; mean [bootstrap 95 %]", self.subsets.members.len() - self.subsets.tuning, self.subsets.tuning, self.lr, self.steps)?;
        writeln!(f)?;
        writeln!(f, "| method | models | chosen (tuning subsets) | tune LDS | LDS log p | LDS margin | seconds |")?;
        writeln!(f, "|---|---:|---|---:|---|---|---:|")?;
        for r in &self.methods {
            writeln!(f, "| {} | {} | {} | {:.3} | {} | {} | {:.1} |", r.method, r.models, r.chosen, r.tune, r.lds, r.lds_margin, r.seconds)?;
        }
        if !self.noisy.is_empty() {
            writeln!(f)?;
            writeln!(f, "| noisy-label detection | setting | AUC |")?;
            writeln!(f, "|---|---|---:|")?;
            for n in &self.noisy {
                writeln!(f, "| {} | {} | {:.3} |", n.method, n.setting, n.auc)?;
            }
        }
        writeln!(f)?;
        if !self.epk_agreement.is_empty() {
            writeln!(f)?;
            let cells: Vec<String> = self.epk_agreement.iter().map(|(m, r)| format!("{m} {r:.3}")).collect();
            writeln!(f, "Rank agreement with the EPK (mean over test points of the Spearman correlation of τ(x, ·) over the training points): {}", cells.join(", "))?;
        }
        let c = &self.checks;
        writeln!(f, "EPK exactness: max |b + Σ τ − log p_y| = {:.2e} (outputs up to {:.2}); DPK's residual {:.2e}", c.epk_max_residual, c.epk_max_output, c.dpk_max_residual)?;
        if let Some(r) = c.retrain_vs_run {
            writeln!(f, "fast retrainer vs the recorded dfdx run (seed {}, full set): max relative difference {r:.2e}", self.spec.ensemble_seeds.first().copied().unwrap_or(0))?;
        }
        if let Some((it, res, diff)) = c.cg {
            writeln!(f, "CG vs direct (Woodbury) at the chosen damping: up to {it} iterations, residual {res:.1e}, max relative τ difference {diff:.2e}; GGN rank n_z = {}", c.ggn_rank)?;
        }
        if let Some(r) = c.noisy_epk_max_residual {
            writeln!(f, "noisy run's EPK exactness at the training points: {r:.2e}")?;
        }
        for (s, t) in &self.timings {
            writeln!(f, "- {s}: {t:.1} s")?;
        }
        write!(f, "this run: {:.1} s (stages taken from a cache cost nothing here; their seconds above are from when they were computed)", self.total_seconds)
    }
}

/// Writes `lds.parquet` (one row per method), `sweep.parquet` (every setting), `noisy.parquet`,
/// `result.json` (everything, with the subsets), `summary.md` and `retrained.safetensors`
/// (`logp`, `margin` `[S, P]`) into `dir`, and each method's chosen `τ [P, M]` into `tau_file`
/// (safetensors; `P·M` numbers per method, so a study keeps it in its cache, not its report).
/// `scripts/check_datamodels_lds.py` recomputes every LDS from these files.
pub fn write_tables(r: &BenchmarkResult, dir: &Path, tau_file: &Path) -> Result<()> {
    crate::io::create_dir_all(dir)?;
    let (m, p, _) = r.shape;
    let taus: Vec<crate::io::NamedArray> = r.methods.iter().filter(|x| x.tau.len() == p * m).map(|x| crate::io::NamedArray::f64(x.method.clone(), vec![p, m], x.tau.clone())).collect();
    if let Some(parent) = tau_file.parent() {
        crate::io::create_dir_all(parent)?;
    }
    crate::io::write_safetensors(tau_file, &taus, None)?;
    let s_all = r.subsets.members.len();
    if r.retrained.0.len() == s_all * p {
        crate::io::write_safetensors(
            &dir.join("retrained.safetensors"),
            &[crate::io::NamedArray::f64("logp", vec![s_all, p], r.retrained.0.clone()), crate::io::NamedArray::f64("margin", vec![s_all, p], r.retrained.1.clone())],
            None,
        )?;
    }
    let s = |f: &dyn Fn(&MethodResult) -> String| Column::Str(r.methods.iter().map(f).collect());
    let v = |f: &dyn Fn(&MethodResult) -> f64| Column::F64(r.methods.iter().map(f).collect());
    Table::new()
        .with("method", s(&|m| m.method.clone()))
        .with("models", Column::I64(r.methods.iter().map(|m| m.models as i64).collect()))
        .with("chosen", s(&|m| m.chosen.clone()))
        .with("tune", v(&|m| m.tune))
        .with("lds", v(&|m| m.lds.mean))
        .with("lds_lo", v(&|m| m.lds.lo))
        .with("lds_hi", v(&|m| m.lds.hi))
        .with("lds_margin", v(&|m| m.lds_margin.mean))
        .with("lds_margin_lo", v(&|m| m.lds_margin.lo))
        .with("lds_margin_hi", v(&|m| m.lds_margin.hi))
        .with("seconds", v(&|m| m.seconds))
        .write_parquet(&dir.join("lds.parquet"))?;
    let pts: Vec<&SweepPoint> = r.methods.iter().flat_map(|m| &m.sweep).collect();
    Table::new()
        .with("method", Column::Str(pts.iter().map(|p| p.method.clone()).collect()))
        .with("setting", Column::Str(pts.iter().map(|p| p.setting.clone()).collect()))
        .with("dim", Column::I64(pts.iter().map(|p| p.dim.map_or(-1, |d| d as i64)).collect()))
        .with("ridge", Column::F64(pts.iter().map(|p| p.ridge.unwrap_or(f64::NAN)).collect()))
        .with("tune", Column::F64(pts.iter().map(|p| p.tune).collect()))
        .with("eval", Column::F64(pts.iter().map(|p| p.eval).collect()))
        .with("eval_margin", Column::F64(pts.iter().map(|p| p.eval_margin).collect()))
        .write_parquet(&dir.join("sweep.parquet"))?;
    Table::new()
        .with("method", Column::Str(r.noisy.iter().map(|n| n.method.clone()).collect()))
        .with("setting", Column::Str(r.noisy.iter().map(|n| n.setting.clone()).collect()))
        .with("auc", Column::F64(r.noisy.iter().map(|n| n.auc).collect()))
        .write_parquet(&dir.join("noisy.parquet"))?;
    crate::io::write_json(&dir.join("result.json"), r)?;
    let mut md = format!("{r}\n\n## Sweep (every setting; tuning on subsets 0..{}, evaluation on the rest)\n\n| method | setting | tune LDS | eval LDS log p | eval LDS margin |\n|---|---|---:|---:|---:|\n", r.subsets.tuning);
    for p in pts {
        md.push_str(&format!("| {} | {} | {:.4} | {:.4} | {:.4} |\n", p.method, p.setting, p.tune, p.eval, p.eval_margin));
    }
    crate::io::write_atomic(&dir.join("summary.md"), md.as_bytes())
}
