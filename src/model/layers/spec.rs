//! The `[model] layers = [...]` list as written: one entry per layer, in PyTorch's words.
//!
//! ```toml
//! layers = [
//!   { conv2d = { channels = 6, kernel = 5, padding = 2 } }, "relu", { max_pool2d = 2 },
//!   "flatten", { dense = 120 }, "gelu", "layer_norm", { dense = 10 },
//!   { residual = [ { dense = 10 }, "relu", { dense = 10 } ] },
//! ]
//! ```
//!
//! A layer without options is a string (`"relu"`, `"flatten"`, `"layer_norm"`); one with options
//! is a one-key table whose value is the main option (`{ dense = 120 }`, `{ max_pool2d = 2 }`,
//! `{ leaky_relu = 0.2 }`, `{ residual = [...] }`) or a table of options
//! (`{ dense = { features = 120, bias = false } }`). Parsed by hand (not by serde's derive) so
//! that every refusal names the layer and says why. Each kind's grammar is in its own file
//! (its `KindSpec`); here are the entry's outer form, the helpers the kinds
//! share, and the refusals of layers that are not kinds (batch norm, dropout).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use super::LayerSpec;

/// `at: msg`.
pub(crate) fn err(at: &str, msg: impl std::fmt::Display) -> String {
    format!("{at}: {msg}")
}

/// A size option: an integer in `1..=2^20`.
pub(crate) fn as_size(v: &Value, at: &str, what: &str) -> Result<usize, String> {
    match v.as_u64() {
        Some(n) if n >= 1 && n <= 1 << 20 => Ok(n as usize),
        _ => Err(err(at, format!("{what} must be an integer between 1 and {}, got {v}", 1 << 20))),
    }
}

/// A count option: an integer in `0..=2^20`.
pub(crate) fn as_count(v: &Value, at: &str, what: &str) -> Result<usize, String> {
    match v.as_u64() {
        Some(n) if n <= 1 << 20 => Ok(n as usize),
        _ => Err(err(at, format!("{what} must be a non-negative integer, got {v}"))),
    }
}

/// A true/false option.
pub(crate) fn as_bool(v: &Value, at: &str, what: &str) -> Result<bool, String> {
    v.as_bool().ok_or_else(|| err(at, format!("{what} must be true or false, got {v}")))
}

/// The options of a table-valued layer, with every key checked against `allowed`.
pub(crate) fn options<'a>(v: &'a Value, at: &str, kind: &str, allowed: &[&str]) -> Result<&'a Map<String, Value>, String> {
    let m = v.as_object().ok_or_else(|| err(at, format!("{kind} takes a number or a table of options, got {v}")))?;
    if let Some(bad) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(err(at, format!("{kind} has no option `{bad}` (options: {})", allowed.join(", "))));
    }
    Ok(m)
}

/// The options of a layer that needs some.
pub(crate) fn need<'v>(a: Option<&'v Value>, at: &str, kind: &str) -> Result<&'v Value, String> {
    a.ok_or_else(|| err(at, format!("{kind} needs options, e.g. {{ {kind} = ... }}")))
}

/// Refuses options on a layer that takes none.
pub(crate) fn no_options(a: Option<&Value>, at: &str, kind: &str) -> Result<(), String> {
    match a {
        None => Ok(()),
        Some(Value::Object(m)) if m.is_empty() => Ok(()),
        Some(a) => Err(err(at, format!("{kind} takes no options, got {a}"))),
    }
}

pub(crate) const REFUSED_BATCH_NORM: &str = "batch norm is not supported: in training mode a point's output depends on the other points of its batch, so the network is not a function of one input and the per-point kernel decomposition does not exist; it would need a fixed-statistics (eval) mode, which is not implemented. Use layer_norm";
pub(crate) const REFUSED_DROPOUT: &str = "dropout is not supported: its random mask changes the network at every step, so the recorded path is not the gradient flow of one deterministic network; train without it";

impl LayerSpec {
    /// Parses one entry; `at` names it in errors (`model.layers[3]`).
    pub fn parse(v: &Value, at: &str) -> Result<LayerSpec, String> {
        let (kind, arg) = match v {
            Value::String(s) => (s.as_str(), None),
            Value::Object(m) if m.len() == 1 => {
                let (k, a) = m.iter().next().expect("one entry");
                (k.as_str(), Some(a))
            }
            _ => return Err(err(at, format!("a layer is a name (\"relu\") or a one-key table ({{ dense = 10 }}), got {v}"))),
        };
        match kind {
            "batch_norm" | "batch_norm1d" | "batch_norm2d" | "batchnorm" => return Err(err(at, REFUSED_BATCH_NORM)),
            "dropout" | "dropout2d" => return Err(err(at, REFUSED_DROPOUT)),
            _ => {}
        }
        LayerSpec::parse_kind(kind, arg, at).unwrap_or_else(|| Err(err(at, format!("unknown layer `{kind}` (layers: {})", LayerSpec::names().join(", ")))))
    }
}

impl LayerSpec {
    /// The layer one recorded PyTorch module is, or the one-line reason it cannot be.
    pub(crate) fn from_torch(m: &Value, at: &str) -> Result<LayerSpec, String> {
        use super::recorded::{refuse, repr};
        let class = m.get("type").and_then(Value::as_str).ok_or_else(|| format!("{at}: a module without `type` (re-record with scripts/record_torch_trajectory.py)"))?;
        if let Some(spec) = LayerSpec::from_torch_kind(class, m, at) {
            return spec;
        }
        let named = |msg: &str| err(&format!("{at} {}", repr(m)), msg);
        Err(match class {
            "BatchNorm1d" | "BatchNorm2d" | "BatchNorm3d" | "SyncBatchNorm" => named(REFUSED_BATCH_NORM),
            "Dropout" | "Dropout1d" | "Dropout2d" | "AlphaDropout" => {
                if m.get("training").and_then(Value::as_bool) == Some(false) || m.get("p").and_then(Value::as_f64) == Some(0.0) {
                    refuse(at, m, "dropout (here inactive) shifts the nn.Sequential indices of the parameter names; remove it from the module")
                } else {
                    named(&REFUSED_DROPOUT.replacen("dropout is", "dropout in training mode is", 1))
                }
            }
            "Sequential" => refuse(at, m, "a nested nn.Sequential is not supported: list its layers in the outer one (or wrap a block as torch_model.Residual)"),
            other => refuse(at, m, format!("the module `{other}` is not a layer pathkernel can express (layers: {})", LayerSpec::torch_names().join(", "))),
        })
    }

    /// The layer list of recorded modules, entries named `at[i]`.
    pub(crate) fn from_torch_list(modules: &[Value], at: &str) -> Result<Vec<LayerSpec>, String> {
        modules.iter().enumerate().map(|(i, m)| LayerSpec::from_torch(m, &format!("{at}[{i}]"))).collect()
    }
}

impl Serialize for LayerSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for LayerSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        LayerSpec::parse(&v, "layer").map_err(serde::de::Error::custom)
    }
}

/// Parses a whole `layers` list, naming entries `model.layers[i]`.
pub fn parse_list(v: &[Value]) -> Result<Vec<LayerSpec>, String> {
    if v.is_empty() {
        return Err("model.layers is empty: list at least the output layer, e.g. [{ dense = 10 }]".into());
    }
    v.iter().enumerate().map(|(i, l)| LayerSpec::parse(l, &format!("model.layers[{i}]"))).collect()
}
