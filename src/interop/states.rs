//! The recorded states of a PyTorch recording: one `state_dict` per step, read as f64 whatever
//! the precision it was trained in (float64, or float32 widened exactly), half precision refused.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::io;
use crate::model::torch;
use crate::model::{Architecture, ParamSpec, Params};

/// The floating-point precision a recording's states were trained and saved in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Precision {
    /// float64: the updates replay to rounding.
    Float64,
    /// float32: each update differs from the f64 replay by float32 rounding, carried as a
    /// residual term of no training point.
    Float32,
}

impl Precision {
    /// Unit roundoff: 2⁻⁵³ (float64), 2⁻²⁴ (float32).
    pub(crate) fn unit_roundoff(self) -> f64 {
        match self {
            Precision::Float64 => f64::EPSILON / 2.0,
            Precision::Float32 => f64::from(f32::EPSILON) / 2.0,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Float64 => "float64",
            Precision::Float32 => "float32",
        })
    }
}

/// Why half precision is refused (one line).
pub(crate) const HALF_REFUSED: &str = "half precision (float16/bfloat16) is not supported: its updates are rounded to 3 significant digits, \
     so the difference between a recorded update and the one replayed in f64 is as large as the update itself and the kernel would explain rounding, not training; \
     record the run in float32 or float64";

/// A recorded state read as f64.
pub(crate) struct RecordedState {
    /// The parameters, named and ordered as ours.
    pub params: Params,
    /// SHA-256 of the file.
    pub sha256: String,
    /// The precision its tensors were saved in.
    pub precision: Precision,
}

/// Reads step `s` of a recording from `path` and checks it against `arch`, whose parameters the
/// file holds under the names of `specs` (PyTorch's names of the module, or a recording's own
/// names mapped onto the stack; our order): the file's `step` metadata (when present) is `s`,
/// every tensor is float64 or float32, all of one precision (half precision refused), the names
/// and shapes are `specs`' and nothing else, every value finite. All mismatches are listed in the
/// one error. A file exported by pathkernel with α folded into its last layer is refused (not raw
/// weights).
///
/// # Shapes
/// `specs` are `arch`'s parameters in order (recorded names, our shapes).
pub(crate) fn read_state(path: &Path, arch: &Architecture, specs: &[ParamSpec], s: usize) -> Result<RecordedState> {
    let bytes = io::read_file(path)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
    let meta = SafeTensors::read_metadata(&bytes).ok().and_then(|(_, m)| m.metadata().clone()).unwrap_or_default();
    if let Some(recorded) = meta.get("step") {
        if recorded.parse::<usize>().ok() != Some(s) {
            return Err(Error::format(path, format!("holds step {recorded} (its metadata), not step {s}: the steps are out of order")));
        }
    }
    if meta.get("format").map(String::as_str) == Some(torch::FORMAT) {
        if let Some(a) = meta.get("alpha_folded").and_then(|a| a.parse::<f64>().ok()).filter(|a| *a != 1.0) {
            return Err(Error::format(
                path,
                format!("exported by pathkernel with alpha = {a} folded into the last layer; it is the scaled network, not raw weights to start from"),
            ));
        }
    }
    let dtypes: Vec<Dtype> = st.tensors().iter().map(|(_, v)| v.dtype()).collect();
    if dtypes.iter().any(|d| matches!(d, Dtype::F16 | Dtype::BF16)) {
        return Err(Error::format(path, HALF_REFUSED));
    }
    let (precision, dtype) = if dtypes.contains(&Dtype::F32) { (Precision::Float32, Dtype::F32) } else { (Precision::Float64, Dtype::F64) };
    let found: BTreeMap<String, _> = st.tensors().into_iter().collect();
    let mut problems: Vec<String> = Vec::new();
    for sp in specs {
        match found.get(&sp.name) {
            None => problems.push(format!("missing `{}` {:?}", sp.name, sp.shape)),
            Some(v) if v.shape() != sp.shape.as_slice() => problems.push(format!("`{}` has shape {:?}, expected {:?}", sp.name, v.shape(), sp.shape)),
            Some(v) if v.dtype() != dtype => problems.push(format!("`{}` is {:?} while others are {dtype:?} (one precision per state: F64 or F32)", sp.name, v.dtype())),
            Some(_) => {}
        }
    }
    for (name, v) in &found {
        if !specs.iter().any(|sp| &sp.name == name) {
            problems.push(format!("unexpected `{name}` {:?}", v.shape()));
        }
    }
    if !problems.is_empty() {
        return Err(Error::format(path, format!("does not match {} ({}): {}", torch::module_description(arch), problems.len(), problems.join("; "))));
    }
    let mut data = Vec::with_capacity(specs.len());
    for sp in specs {
        let raw = found[&sp.name].data();
        let v: Vec<f64> = match precision {
            Precision::Float32 => raw.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().expect("4 bytes")))).collect(),
            Precision::Float64 => raw.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
        };
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::format(path, format!("`{}` has a non-finite value at index {i}", sp.name)));
        }
        data.push(v);
    }
    Ok(RecordedState { params: Params { specs: arch.param_specs(), data }, sha256: torch::sha256_hex(&bytes), precision })
}
