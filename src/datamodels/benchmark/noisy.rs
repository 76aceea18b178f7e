//! Noisy-label detection: the network retrained (with the crate's dfdx trainer, recording every
//! state) on the training set with a seeded fraction of labels flipped, training points ranked by
//! each method's self-attribution at its LDS-chosen setting, scored by AUC at flagging the flips.

use std::path::Path;
use std::time::Instant;

use super::score::{chosen_ridge, fmt_g};
use super::{Bench, MethodResult, NoisyResult};
use crate::api::Trained;
use crate::attribution::grads::{directions, Direction, Projection, ScalarGrads};
use crate::attribution::influence::{ggn_factor, FunctionSpace};
use crate::attribution::lds::auc;
use crate::attribution::mlp::Mlp1;
use crate::attribution::path::{epk_self, path_gram};
use crate::attribution::ridge::{one_minus_p, scale_columns, Ridge};
use crate::datamodels::cache::Stages;
use crate::datamodels::subsets::flip_labels;
use crate::error::{Error, Result};

/// Removes JSON nulls (TOML has none) from a configuration value.
fn strip_nulls(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(o) => serde_json::Value::Object(o.iter().filter(|(_, x)| !x.is_null()).map(|(k, x)| (k.clone(), strip_nulls(x))).collect()),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(strip_nulls).collect()),
        x => x.clone(),
    }
}

/// The run retrained (with the crate's dfdx trainer, recording every state) on its own
/// training set with `labels` in place of its labels, into `dir`.
fn train_relabelled(net: &Trained, labels: &[usize], dir: &Path) -> Result<Trained> {
    let ds = &net.run().dataset;
    let d = ds.dim;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let data = dir.join("noisy-data.safetensors");
    let test_labels = ds.test_labels()?;
    crate::io::write_safetensors(
        &data,
        &[
            crate::io::NamedArray::f64("x_train", vec![ds.n_train(), d], ds.x_train.clone()),
            crate::io::NamedArray::i64("y_train", vec![labels.len()], labels.iter().map(|&y| y as i64).collect()),
            crate::io::NamedArray::f64("x_test", vec![test_labels.len(), d], ds.x_test.clone()),
            crate::io::NamedArray::i64("y_test", vec![test_labels.len()], test_labels.iter().map(|&y| y as i64).collect()),
        ],
        None,
    )?;
    let mut cfg = strip_nulls(&net.run().manifest.config);
    let abs = std::fs::canonicalize(&data).map_err(|e| Error::io(&data, e))?;
    cfg["data"] = serde_json::json!({ "kind": "arrays", "path": abs.to_string_lossy() });
    let toml_value = toml::Value::try_from(&cfg).map_err(|e| Error::Config(format!("noisy run configuration: {e}")))?;
    let text = toml::to_string(&toml_value).map_err(|e| Error::Config(format!("noisy run configuration: {e}")))?;
    let run_dir = dir.join("run");
    if let Ok(t) = Trained::open(&run_dir) {
        if t.run().dataset.train_labels().ok() == Some(labels) && t.states().len() == net.states().len() && t.states()[0] == net.states()[0] {
            return Ok(t);
        }
    }
    Trained::train_toml(&text, &run_dir)
}

impl<C: Stages> Bench<'_, C> {
    /// Trains the noisy-label run in `dir` and scores each method's self-attribution at its
    /// chosen setting (`methods`, `damping` for influence functions): the loss, Grad-Dot,
    /// TracIn, the DPK representer, TRAK with one model (projected and unprojected), influence
    /// functions and, last (the slowest: `M` integrated rows), the EPK. The EPK representer's
    /// self-attribution would need full EPK rows at every training point (`M × M × K²`) and is
    /// not computed. Stage seconds go to `timings`.
    pub(super) fn noisy(&self, methods: &[MethodResult], damping: f64, dir: &Path, timings: &mut Vec<(String, f64)>) -> Result<Vec<NoisyResult>> {
        let (spec, x, k, m) = (self.spec, self.x, self.k, self.m);
        let (ny, flipped) = flip_labels(&self.y, k, spec.noise_fraction, spec.noise_seed);
        let nk = self.key("noisy");
        // The run lives in `dir` (a trajectory, not a cache value); the stage records its seconds.
        let train_s: f64 = self.cache.stage("noisy-train", &nk, || {
            let t = Instant::now();
            train_relabelled(self.net, &ny, dir)?;
            Ok(t.elapsed().as_secs_f64())
        })?;
        let nnet = train_relabelled(self.net, &ny, dir)?; // the run just trained or kept in `dir`
        timings.push(("train noisy run (dfdx, recorded)".to_string(), train_s));
        let chosen = |name: &str| methods.iter().find(|r| r.method == name);
        let nwn = Mlp1::from_params(self.arch, nnet.states().last().expect("states"))?;
        let nf = nwn.forward(x);
        let ng = ScalarGrads::new(&nwn, x, &nf, directions(&nf.logp, &ny, k, Direction::LogProb));
        let nq = one_minus_p(&nf.logp, &ny, k);
        let diag = |v: &[f64]| -> Vec<f64> { (0..m).map(|i| v[i * m + i]).collect() };
        // Self-attribution `v[i] = τ(x_i, i)` of a regression `τ [M, M]` reweighted by `1 − p_i`.
        let reweighted_diag = |mut tau: Vec<f64>| {
            scale_columns(&mut tau, &nq);
            diag(&tau)
        };
        let mut noisy = Vec::new();
        let mut push = |method: &str, setting: String, score: Vec<f64>| {
            if let Some(a) = auc(&score, &flipped) {
                self.log(&format!("noisy-label detection, {method} ({setting}): AUC {a:.3}"));
                noisy.push(NoisyResult { method: method.into(), setting, auc: a });
            }
        };
        push("loss", "-".into(), ny.iter().enumerate().map(|(i, &c)| -nf.logp[i * k + c]).collect());
        push("grad-dot", "-".into(), ng.sq_norms());
        let (nkk, ndiag, gram_s) = self.cache.stage("noisy-path-gram", &nk, || {
            let t = Instant::now();
            let (g, dg) = path_gram(self.arch, nnet.states(), x, &ny, true)?;
            Ok((g.expect("full"), dg, t.elapsed().as_secs_f64()))
        })?;
        timings.push(("noisy path gram".to_string(), gram_s));
        push("tracin", "-".into(), ndiag);
        if let Some(r) = chosen("dpk-rep") {
            let tau = Ridge::kernel(&nkk, &nkk, m)?.apply(chosen_ridge(r).unwrap_or(0.0));
            push("dpk-rep", r.chosen.clone(), reweighted_diag(tau));
        }
        let ngo = ScalarGrads::new(&nwn, x, &nf, directions(&nf.logp, &ny, k, Direction::LogOdds));
        if let Some(r) = chosen("trak-1-full") {
            let g = ngo.gram(&ngo);
            let tau = Ridge::kernel(&g, &g, m)?.apply(chosen_ridge(r).unwrap_or(0.0));
            push("trak-1-full", r.chosen.clone(), reweighted_diag(tau));
        }
        if let Some(r) = chosen("trak-1") {
            let pt = r.sweep.iter().find(|s| s.setting == r.chosen).expect("chosen is a sweep point");
            if let (Some(dim), Some(l)) = (pt.dim, pt.ridge) {
                let f = ngo.project(Projection::Gaussian { seed: spec.projection_seed, dim });
                push("trak-1", r.chosen.clone(), reweighted_diag(Ridge::features(&f, &f, dim)?.apply(l)));
            }
        }
        let fs = FunctionSpace::new(ggn_factor(&nwn, x), x, &ng, &ng);
        push("if-ggn", format!("λ={}", fmt_g(damping)), diag(&fs.apply(damping, spec.ggn_tol)?.0));
        drop(fs);
        let t = Instant::now();
        let (eself, es_s): (Vec<f64>, f64) = self.cache.stage("noisy-epk-self", &nk, || {
            let self_k = epk_self(nnet.run(), nnet.states(), &ny, spec.chunk_rows, &|a, b| self.log(&format!("noisy epk self-kernel: {a}/{b} rows ({:.0} s)", t.elapsed().as_secs_f64())))?;
            Ok((self_k, t.elapsed().as_secs_f64()))
        })?;
        timings.push(("noisy epk self-kernel (train points, diag layout)".to_string(), es_s));
        push("epk", "-".into(), eself);
        self.log("noisy-label detection scored");
        Ok(noisy)
    }
}
