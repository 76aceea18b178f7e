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
//!             "optimizer": {"class": "RMSprop", "alpha": α, "eps": ε, "weight_decay": λ,
//!                           "momentum": 0, "centered": b, "maximize": false}
//!             "optimizer": {"class": "Adagrad", "lr_decay": δ, "eps": ε, "weight_decay": λ,
//!                           "initial_accumulator_value": v0, "maximize": false}
//! ```
//!
//! Every hyper-parameter of the class must be present (PyTorch's defaults are not assumed: a
//! recording that omits one is refused, all missing ones named in one line); other keys (`lr`,
//! `foreach`, …) are ignored — the learning rate of every step is `learning_rates`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::optim::StepFactors;
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
    /// `torch.optim.RMSprop` without momentum.
    Rmsprop {
        /// `alpha`.
        alpha: f64,
        /// `eps`.
        eps: f64,
        /// `centered`.
        centered: bool,
        /// `weight_decay` (coupled).
        weight_decay: f64,
    },
    /// `torch.optim.Adagrad`.
    Adagrad {
        /// `lr_decay`.
        lr_decay: f64,
        /// `eps`.
        eps: f64,
        /// `initial_accumulator_value`.
        initial: f64,
        /// `weight_decay` (coupled).
        weight_decay: f64,
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
        let class = map.get("class").and_then(Value::as_str).ok_or_else(|| Error::format(jpath, "optimizer: missing its `class` (SGD, Adam, AdamW, RMSprop or Adagrad)"))?;
        let required: &[&str] = match class {
            "SGD" => &["momentum", "dampening", "nesterov", "weight_decay", "maximize"],
            "Adam" | "AdamW" => &["betas", "eps", "weight_decay", "amsgrad", "maximize"],
            "RMSprop" => &["alpha", "eps", "weight_decay", "momentum", "centered", "maximize"],
            "Adagrad" => &["lr_decay", "eps", "weight_decay", "initial_accumulator_value", "maximize"],
            other => {
                return Err(Error::format(
                    jpath,
                    format!("optimizer class `{other}` is not supported: the import replays torch.optim.SGD (momentum, dampening, Nesterov, weight decay), Adam, AdamW, RMSprop and Adagrad"),
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
        if class == "RMSprop" {
            let alpha = num("alpha", 0.0, 1.0, "a number in [0, 1]")?;
            let eps = num("eps", f64::MIN_POSITIVE, f64::MAX, "a finite number > 0")?;
            let momentum = num("momentum", 0.0, f64::MAX, "a finite number >= 0")?;
            if momentum != 0.0 {
                return Err(Error::format(
                    jpath,
                    format!(
                        "optimizer RMSprop with momentum = {momentum} is not supported: its buffer accumulates gradients already divided by the preconditioner (a per-step diagonal before the buffer), \
                         which the kernel's recursion does not carry (it carries the preconditioner after the buffer), so the machine would not equal the network; record RMSprop with momentum = 0"
                    ),
                ));
            }
            return Ok(RecordedOptimizer::Rmsprop { alpha, eps, centered: flag("centered")?, weight_decay });
        }
        if class == "Adagrad" {
            let lr_decay = num("lr_decay", 0.0, f64::MAX, "a finite number >= 0")?;
            let eps = num("eps", f64::MIN_POSITIVE, f64::MAX, "a finite number > 0")?;
            let initial = num("initial_accumulator_value", 0.0, f64::MAX, "a finite number >= 0")?;
            return Ok(RecordedOptimizer::Adagrad { lr_decay, eps, initial, weight_decay });
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

    /// Checks the recorded per-step momenta (`momenta`, `[N]`): each in [0, 1), and what the
    /// replay cannot follow refused in one line — Nesterov with a changing momentum (its
    /// look-ahead weights each step by its own momentum, which the kernel's backward recursion
    /// does not carry), SGD momentum switching between 0 and > 0 (PyTorch restarts the buffer),
    /// and momenta for an optimizer without a buffer.
    pub(crate) fn check_momenta(&self, jpath: &Path, momenta: &[f64], n: usize) -> Result<()> {
        if momenta.len() != n {
            return Err(Error::format(jpath, format!("{} momenta for {n} updates", momenta.len())));
        }
        if let Some(s) = momenta.iter().position(|b| !(b.is_finite() && (0.0..1.0).contains(b))) {
            return Err(Error::format(jpath, format!("momenta[{s}] = {}; a momentum (or beta1) is in [0, 1)", momenta[s])));
        }
        match *self {
            RecordedOptimizer::Sgd { nesterov: true, .. } if momenta.windows(2).any(|w| w[0] != w[1]) => Err(Error::format(
                jpath,
                "optimizer SGD: Nesterov momentum that changes from step to step (cycle_momentum) is not supported: the Nesterov step weights each gradient by its own step's momentum, \
                 which the kernel's backward recursion does not carry; record with cycle_momentum=False or without nesterov",
            )),
            RecordedOptimizer::Sgd { .. } if momenta.contains(&0.0) && momenta.iter().any(|b| *b != 0.0) => Err(Error::format(
                jpath,
                "optimizer SGD: a momentum that is 0 at some steps and > 0 at others is not supported (PyTorch restarts its buffer from the gradient when momentum returns)",
            )),
            RecordedOptimizer::Rmsprop { .. } | RecordedOptimizer::Adagrad { .. } => {
                Err(Error::format(jpath, "momenta recorded for an optimizer without a momentum buffer (RMSprop without momentum, Adagrad)"))
            }
            _ => Ok(()),
        }
    }

    /// The manifest's record of this optimizer: `lr` the first step's learning rate, `batches`
    /// the recorded batches (`None`: full batch), `rounded` whether the updates were made in a
    /// lower precision than the f64 replay (float32), `per_step` the momenta and clip factors
    /// recorded per step.
    pub(crate) fn record(&self, lr: f64, batches: Option<&[Vec<usize>]>, rounded: bool, per_step: StepFactors) -> OptimizerRecord {
        let batch_size = batches.map(|b| b.iter().map(Vec::len).max().unwrap_or(0));
        let recorded_batches = batches.map(<[Vec<usize>]>::to_vec);
        // With per-step momenta the nominal one is the first step's.
        let first = per_step.momenta.as_ref().and_then(|m| m.first().copied());
        match (*self, batches) {
            (RecordedOptimizer::Sgd { momentum, dampening, nesterov, weight_decay }, None) => {
                let momentum = first.unwrap_or(momentum);
                let damp = if momentum == 0.0 && per_step.momenta.is_none() { 0.0 } else { dampening };
                OptimizerRecord::Gd { lr, momentum, dampening: damp, nesterov, weight_decay, decoupled_weight_decay: false, rounded_updates: rounded, per_step }
            }
            (RecordedOptimizer::Sgd { momentum, dampening, nesterov, weight_decay }, Some(b)) => OptimizerRecord::Sgd {
                lr,
                batch_size: batch_size.unwrap_or(0),
                shuffle_seed: 0,
                momentum: first.unwrap_or(momentum),
                dampening: if first.unwrap_or(momentum) == 0.0 && per_step.momenta.is_none() { 0.0 } else { dampening },
                nesterov,
                weight_decay,
                decoupled_weight_decay: false,
                rounded_updates: rounded,
                recorded_batches: Some(b.to_vec()),
                per_step,
            },
            (RecordedOptimizer::Adam { beta1, beta2, eps, weight_decay, decoupled }, _) => OptimizerRecord::Adam {
                lr,
                beta1: first.unwrap_or(beta1),
                beta2,
                eps,
                weight_decay,
                decoupled_weight_decay: decoupled,
                batch_size,
                shuffle_seed: 0,
                recorded_batches,
                per_step,
            },
            (RecordedOptimizer::Rmsprop { alpha, eps, centered, weight_decay }, _) => {
                OptimizerRecord::Rmsprop { lr, alpha, eps, centered, weight_decay, batch_size, recorded_batches, per_step }
            }
            (RecordedOptimizer::Adagrad { lr_decay, eps, initial, weight_decay }, _) => {
                OptimizerRecord::Adagrad { lr, lr_decay, eps, initial_accumulator_value: initial, weight_decay, batch_size, recorded_batches, per_step }
            }
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
        let rec = sgd.record(0.1, Some(&[vec![0, 1], vec![2]]), false, StepFactors::default());
        assert!(matches!(rec, OptimizerRecord::Sgd { momentum: 0.9, nesterov: true, weight_decay: 1e-3, batch_size: 2, .. }), "{rec:?}");
        let adamw = parse(json!({"class": "AdamW", "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.01, "amsgrad": false, "maximize": false})).unwrap();
        let rec = adamw.record(0.01, None, false, StepFactors::default());
        assert!(matches!(rec, OptimizerRecord::Adam { beta1: 0.8, beta2: 0.99, decoupled_weight_decay: true, batch_size: None, .. }), "{rec:?}");
        // Dampening without momentum is ignored, as PyTorch does.
        let d = parse(json!({"class": "SGD", "momentum": 0.0, "dampening": 0.5, "nesterov": false, "weight_decay": 0.0, "maximize": false})).unwrap();
        assert!(matches!(d.record(0.1, None, true, StepFactors::default()), OptimizerRecord::Gd { dampening: 0.0, rounded_updates: true, .. }));
        let rms = parse(json!({"class": "RMSprop", "alpha": 0.9, "eps": 1e-8, "weight_decay": 0.01, "momentum": 0, "centered": true, "maximize": false, "foreach": null})).unwrap();
        assert!(matches!(rms.record(0.01, None, true, StepFactors::default()), OptimizerRecord::Rmsprop { alpha: 0.9, centered: true, weight_decay: 0.01, batch_size: None, .. }));
        let ada = parse(json!({"class": "Adagrad", "lr_decay": 0.01, "eps": 1e-10, "weight_decay": 0.0, "initial_accumulator_value": 0.1, "maximize": false})).unwrap();
        let clip = StepFactors { momenta: None, grad_scales: Some(vec![1.0, 0.5]) };
        let rec = ada.record(0.1, Some(&[vec![0], vec![1]]), false, clip.clone());
        assert!(matches!(&rec, OptimizerRecord::Adagrad { lr_decay: 0.01, initial_accumulator_value: 0.1, batch_size: Some(1), per_step, .. } if *per_step == clip), "{rec:?}");
        // Per-step momenta: the first step's is the record's.
        let cycled = StepFactors { momenta: Some(vec![0.85, 0.95]), grad_scales: None };
        assert!(matches!(adamw.record(0.01, None, false, cycled), OptimizerRecord::Adam { beta1: 0.85, .. }));
        assert_eq!(RecordedOptimizer::parse(Path::new("t"), 1, &json!("gd")).unwrap(), RecordedOptimizer::Sgd { momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0 });
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let msg = |v: Value| parse(v).unwrap_err().to_string();
        assert!(msg(json!({"class": "Adam", "weight_decay": 0.0, "amsgrad": false})).contains("missing hyper-parameters betas, eps, maximize"));
        assert!(msg(json!({"class": "Adam", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "amsgrad": true, "maximize": false})).contains("amsgrad"));
        assert!(msg(json!({"class": "LBFGS"})).contains("`LBFGS` is not supported"));
        assert!(msg(json!({"class": "RMSprop", "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.9, "centered": false, "maximize": false})).contains("RMSprop with momentum = 0.9 is not supported"));
        assert!(msg(json!({"class": "Adagrad", "eps": 1e-10, "weight_decay": 0.0, "maximize": false})).contains("missing hyper-parameters lr_decay, initial_accumulator_value"));
        let nesterov = parse(json!({"class": "SGD", "momentum": 0.9, "dampening": 0.0, "nesterov": true, "weight_decay": 0.0, "maximize": false})).unwrap();
        let m = nesterov.check_momenta(Path::new("t"), &[0.9, 0.85], 2).unwrap_err().to_string();
        assert!(m.contains("Nesterov momentum that changes"), "{m}");
        assert!(nesterov.check_momenta(Path::new("t"), &[0.9, 1.0], 2).unwrap_err().to_string().contains("momenta[1] = 1"));
        assert!(nesterov.check_momenta(Path::new("t"), &[0.9], 2).unwrap_err().to_string().contains("1 momenta for 2 updates"));
        assert!(msg(json!({"class": "SGD", "momentum": 0.9, "dampening": 0.1, "nesterov": true, "weight_decay": 0.0, "maximize": false})).contains("Nesterov"));
        assert!(msg(json!({"class": "SGD", "momentum": 1.5, "dampening": 0.0, "nesterov": false, "weight_decay": 0.0, "maximize": false})).contains("momentum"));
        assert!(msg(json!({"class": "SGD", "momentum": 0.0, "dampening": 0.0, "nesterov": false, "weight_decay": 0.0, "maximize": true})).contains("maximize"));
        let v1 = RecordedOptimizer::parse(Path::new("t"), 1, &json!("adam")).unwrap_err().to_string();
        assert!(v1.contains("optimizer `adam` is not supported"), "{v1}");
    }
}
