//! The optimizer of a PyTorch recording: its class and hyper-parameters as
//! `scripts/record_torch_trajectory.py` writes them into `trajectory.json`, checked and mapped
//! onto the manifest's [`OptimizerRecord`], whose recursion ([`crate::optim`]) the import replays.
//!
//! ```text
//! version 1:  "optimizer": "gd" | "sgd"                         (plain steps; batches for sgd)
//! version 2:  "optimizer": {"class": "SGD",   "momentum": μ, "dampening": τ, "nesterov": b,
//!                           "weight_decay": λ, "maximize": false}
//!             "optimizer": {"class": "Adam" | "AdamW", "betas": [β1, β2], "eps": ε,
//!                           "weight_decay": λ, "amsgrad": false, "maximize": false}
//! ```
//!
//! Every hyper-parameter of the class must be present (PyTorch's defaults are not assumed: a
//! recording that omits one is refused, all missing ones named in one line); other keys (`lr`,
//! `foreach`, …) are ignored — the learning rate of every step is `learning_rates`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::trajectory::OptimizerRecord;

/// A recording's optimizer, as PyTorch was configured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RecordedOptimizer {
    /// `torch.optim.SGD` (version 1's `gd` and `sgd`: all zero).
    Sgd {
        /// `momentum`.
        momentum: f64,
        /// `dampening`.
        dampening: f64,
        /// `nesterov`.
        nesterov: bool,
        /// `weight_decay` (coupled: added to the gradient).
        weight_decay: f64,
    },
    /// `torch.optim.Adam` (coupled weight decay) or `torch.optim.AdamW` (decoupled).
    Adam {
        /// `betas[0]`.
        beta1: f64,
        /// `betas[1]`.
        beta2: f64,
        /// `eps`.
        eps: f64,
        /// `weight_decay`.
        weight_decay: f64,
        /// AdamW.
        decoupled: bool,
    },
}

impl RecordedOptimizer {
    /// Parses `trajectory.json`'s `optimizer` entry (`jpath` for messages; `version` 1 or 2).
    pub(crate) fn parse(jpath: &Path, version: u32, v: &Value) -> Result<Self> {
        let plain = RecordedOptimizer::Sgd { momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0 };
        match (version, v) {
            (1, Value::String(name)) if matches!(name.as_str(), "gd" | "sgd") => Ok(plain),
            (1, Value::String(name)) => Err(Error::format(
                jpath,
                format!(
                    "optimizer `{name}` is not supported as a bare name: a version-1 recording holds plain gd or sgd steps; \
                     record momentum, Adam and AdamW runs with scripts/record_torch_trajectory.py (version 2), which writes the optimizer's class and hyper-parameters"
                ),
            )),
            (2, Value::Object(map)) => Self::parse_object(jpath, map),
            _ => Err(Error::format(
                jpath,
                format!("optimizer {v}: version 1 names gd or sgd, version 2 gives an object with the class and hyper-parameters"),
            )),
        }
    }

    fn parse_object(jpath: &Path, map: &Map<String, Value>) -> Result<Self> {
        let class = map.get("class").and_then(Value::as_str).ok_or_else(|| Error::format(jpath, "optimizer: missing its `class` (SGD, Adam or AdamW)"))?;
        let required: &[&str] = match class {
            "SGD" => &["momentum", "dampening", "nesterov", "weight_decay", "maximize"],
            "Adam" | "AdamW" => &["betas", "eps", "weight_decay", "amsgrad", "maximize"],
            other => {
                return Err(Error::format(
                    jpath,
                    format!("optimizer class `{other}` is not supported: the import replays torch.optim.SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW"),
                ))
            }
        };
        let missing: Vec<&str> = required.iter().copied().filter(|k| !map.contains_key(*k)).collect();
        if !missing.is_empty() {
            return Err(Error::format(
                jpath,
                format!("optimizer {class}: missing hyper-parameters {} (the import does not assume PyTorch's defaults)", missing.join(", ")),
            ));
        }
        let bad = |key: &str, what: &str| Error::format(jpath, format!("optimizer {class}: `{key}` = {} must be {what}", map[key]));
        let num = |key: &str, lo: f64, hi: f64, what: &str| -> Result<f64> {
            map[key].as_f64().filter(|x| x.is_finite() && *x >= lo && *x <= hi).ok_or_else(|| bad(key, what))
        };
        let flag = |key: &str| -> Result<bool> { map[key].as_bool().ok_or_else(|| bad(key, "true or false")) };
        if flag("maximize")? {
            return Err(Error::format(jpath, format!("optimizer {class}: maximize = true is not supported (the import replays descent on the recorded loss)")));
        }
        let weight_decay = num("weight_decay", 0.0, f64::MAX, "a finite number >= 0")?;
        if class == "SGD" {
            let momentum = num("momentum", 0.0, 1.0, "a number in [0, 1)")?;
            let dampening = num("dampening", 0.0, 1.0, "a number in [0, 1]")?;
            let nesterov = flag("nesterov")?;
            if momentum >= 1.0 {
                return Err(bad("momentum", "a number in [0, 1)"));
            }
            if nesterov && (momentum == 0.0 || dampening != 0.0) {
                return Err(Error::format(jpath, "optimizer SGD: Nesterov momentum needs momentum > 0 and dampening 0 (as PyTorch requires)"));
            }
            return Ok(RecordedOptimizer::Sgd { momentum, dampening, nesterov, weight_decay });
        }
        if flag("amsgrad")? {
            return Err(Error::format(
                jpath,
                format!(
                    "optimizer {class} with amsgrad = true is not supported: its preconditioner divides by the running maximum of the second moments, \
                     which the Adam recursion replayed here (crate::optim) does not carry, so the imported run would not decompose the updates that were made"
                ),
            ));
        }
        let betas: Vec<f64> = map["betas"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
        if betas.len() != 2 || betas.iter().any(|b| !(b.is_finite() && (0.0..1.0).contains(b))) {
            return Err(bad("betas", "two numbers in [0, 1)"));
        }
        let eps = num("eps", f64::MIN_POSITIVE, f64::MAX, "a finite number > 0")?;
        Ok(RecordedOptimizer::Adam { beta1: betas[0], beta2: betas[1], eps, weight_decay, decoupled: class == "AdamW" })
    }

    /// The manifest's record of this optimizer: `lr` the first step's learning rate, `batches`
    /// the recorded batches (`None`: full batch), `rounded` whether the updates were made in a
    /// lower precision than the f64 replay (float32).
    pub(crate) fn record(&self, lr: f64, batches: Option<&[Vec<usize>]>, rounded: bool) -> OptimizerRecord {
        let batch_size = batches.map(|b| b.iter().map(Vec::len).max().unwrap_or(0));
        match (*self, batches) {
            (RecordedOptimizer::Sgd { momentum, dampening, nesterov, weight_decay }, None) => {
                OptimizerRecord::Gd { lr, momentum, dampening: if momentum == 0.0 { 0.0 } else { dampening }, nesterov, weight_decay, decoupled_weight_decay: false, rounded_updates: rounded }
            }
            (RecordedOptimizer::Sgd { momentum, dampening, nesterov, weight_decay }, Some(b)) => OptimizerRecord::Sgd {
                lr,
                batch_size: batch_size.unwrap_or(0),
                shuffle_seed: 0,
                momentum,
                dampening: if momentum == 0.0 { 0.0 } else { dampening },
                nesterov,
                weight_decay,
                decoupled_weight_decay: false,
                rounded_updates: rounded,
                recorded_batches: Some(b.to_vec()),
            },
            (RecordedOptimizer::Adam { beta1, beta2, eps, weight_decay, decoupled }, b) => OptimizerRecord::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled_weight_decay: decoupled,
                batch_size,
                shuffle_seed: 0,
                recorded_batches: b.map(<[Vec<usize>]>::to_vec),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<RecordedOptimizer> {
        RecordedOptimizer::parse(Path::new("t.json"), 2, &v)
    }

    #[test]
    fn every_class_parses_and_maps_onto_the_manifest_record() {
        let sgd = parse(json!({"class": "SGD", "lr": 0.1, "momentum": 0.9, "dampening": 0.0, "nesterov": true, "weight_decay": 1e-3, "maximize": false})).unwrap();
        let rec = sgd.record(0.1, Some(&[vec![0, 1], vec![2]]), false);
        assert!(matches!(rec, OptimizerRecord::Sgd { momentum: 0.9, nesterov: true, weight_decay: 1e-3, batch_size: 2, .. }), "{rec:?}");
        let adamw = parse(json!({"class": "AdamW", "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.01, "amsgrad": false, "maximize": false})).unwrap();
        let rec = adamw.record(0.01, None, false);
        assert!(matches!(rec, OptimizerRecord::Adam { beta1: 0.8, beta2: 0.99, decoupled_weight_decay: true, batch_size: None, .. }), "{rec:?}");
        // Dampening without momentum is ignored, as PyTorch does.
        let d = parse(json!({"class": "SGD", "momentum": 0.0, "dampening": 0.5, "nesterov": false, "weight_decay": 0.0, "maximize": false})).unwrap();
        assert!(matches!(d.record(0.1, None, true), OptimizerRecord::Gd { dampening: 0.0, rounded_updates: true, .. }));
        assert_eq!(RecordedOptimizer::parse(Path::new("t"), 1, &json!("gd")).unwrap(), RecordedOptimizer::Sgd { momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0 });
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let msg = |v: Value| parse(v).unwrap_err().to_string();
        assert!(msg(json!({"class": "Adam", "weight_decay": 0.0, "amsgrad": false})).contains("missing hyper-parameters betas, eps, maximize"));
        assert!(msg(json!({"class": "Adam", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "amsgrad": true, "maximize": false})).contains("amsgrad"));
        assert!(msg(json!({"class": "RMSprop"})).contains("`RMSprop` is not supported"));
        assert!(msg(json!({"class": "SGD", "momentum": 0.9, "dampening": 0.1, "nesterov": true, "weight_decay": 0.0, "maximize": false})).contains("Nesterov"));
        assert!(msg(json!({"class": "SGD", "momentum": 1.5, "dampening": 0.0, "nesterov": false, "weight_decay": 0.0, "maximize": false})).contains("momentum"));
        assert!(msg(json!({"class": "SGD", "momentum": 0.0, "dampening": 0.0, "nesterov": false, "weight_decay": 0.0, "maximize": true})).contains("maximize"));
        let v1 = RecordedOptimizer::parse(Path::new("t"), 1, &json!("adam")).unwrap_err().to_string();
        assert!(v1.contains("optimizer `adam` is not supported"), "{v1}");
    }
}
