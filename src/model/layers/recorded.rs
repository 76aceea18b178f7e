//! Reading a recorded PyTorch module's attributes (`scripts/record_torch_trajectory.py`'s
//! `describe_module`: `type`, `repr` and the attributes the maths depends on), for each kind's
//! [`super::contract::KindSpec::from_torch`]; every refusal one line naming the module.

use serde_json::Value;

/// `repr` of a recorded module (its class when the recording gives none).
pub(crate) fn repr(m: &Value) -> String {
    m.get("repr").and_then(Value::as_str).or_else(|| m.get("type").and_then(Value::as_str)).unwrap_or("a module without `type`").to_string()
}

/// One refusal: `model.modules[3] BatchNorm2d(4, …): why`.
pub(crate) fn refuse(at: &str, m: &Value, why: impl std::fmt::Display) -> String {
    format!("{at} {}: {why}", repr(m))
}

/// A non-negative integer attribute.
pub(crate) fn uint(m: &Value, key: &str, at: &str) -> Result<usize, String> {
    m.get(key).and_then(Value::as_u64).map(|v| v as usize).ok_or_else(|| refuse(at, m, format!("`{key}` missing or not a non-negative integer")))
}

/// A true/false attribute.
pub(crate) fn boolean(m: &Value, key: &str, at: &str) -> Result<bool, String> {
    m.get(key).and_then(Value::as_bool).ok_or_else(|| refuse(at, m, format!("`{key}` missing or not true/false")))
}

/// A number attribute.
pub(crate) fn number(m: &Value, key: &str, at: &str) -> Result<f64, String> {
    m.get(key).and_then(Value::as_f64).ok_or_else(|| refuse(at, m, format!("`{key}` missing or not a number")))
}

/// A pair attribute (`kernel_size`, `stride`, …) that must have equal entries; a number is a pair of it.
pub(crate) fn square(m: &Value, key: &str, at: &str) -> Result<usize, String> {
    let v = m.get(key).ok_or_else(|| refuse(at, m, format!("`{key}` missing")))?;
    let pair: Vec<u64> = match v {
        Value::Number(n) => n.as_u64().map(|n| vec![n, n]).unwrap_or_default(),
        Value::Array(a) => a.iter().filter_map(Value::as_u64).collect(),
        _ => Vec::new(),
    };
    match pair.as_slice() {
        [a, b] if a == b => Ok(*a as usize),
        [_, _] => Err(refuse(at, m, format!("{key} {v} is not square; only square {key}s are supported"))),
        _ => Err(refuse(at, m, format!("`{key}` = {v} is not an integer or a pair of integers"))),
    }
}

/// Refuses `m` unless `key` is absent or `want` (attributes that change the maths).
pub(crate) fn require(m: &Value, key: &str, want: Value, at: &str, why: &str) -> Result<(), String> {
    match m.get(key) {
        Some(v) if *v != want && !(want.is_number() && v.as_f64() == want.as_f64()) => Err(refuse(at, m, format!("{key} = {v}: {why}"))),
        _ => Ok(()),
    }
}
