//! PyTorch names: our parameters as the `state_dict` of the equivalent `torch.nn.Sequential`.
//!
//! | ours                   | PyTorch module                                                     | `state_dict` names      |
//! |------------------------|--------------------------------------------------------------------|-------------------------|
//! | MLP `d → h_1 → … → K`  | `Sequential(Linear, σ, Linear, σ, …, Linear)`                      | `{2l}.weight` `[n_{l+1}, n_l]`, `{2l}.bias` |
//! | CNN                    | `Sequential(Conv2d(C, Co, k, stride, padding), σ, MaxPool2d(pool), Flatten(), Linear)` | `0.weight` `[Co, C, k, k]`, `0.bias`, `4.weight` `[K, Co·Hp·Wp]`, `4.bias` |
//!
//! with σ = `ReLU()` or `Tanh()`, `bias=False` layers when the architecture has no biases. The
//! shapes are ours unchanged (dense weights are `[out, in]` in both). The CNN module takes
//! images `[B, C, H, W]`; our rows are the same images flattened in that order, and `Flatten`
//! orders the pooled maps `[Co, Hp, Wp]` as our dense layer reads them.
//!
//! # Export: logits
//! `export_bytes` writes the network at one state so that the module's output is our
//! *logits* `α (g_w(x) − [zero_output] g_{w_0}(x))` (the input of the log-softmax, or the
//! regression output):
//! - α is folded into the last layer (weight and bias multiplied by α), which a plain
//!   `Sequential` expresses;
//! - `zero_output` subtracts the frozen initial network, which a `Sequential` cannot express:
//!   its α-folded parameters w_0 are stored beside as `init.{name}`, the header says
//!   `zero_output = true`, and the module is `net(x) − init(x)` (`scripts/torch_model.py`
//!   builds it; a plain `Sequential` loaded with `strict=False` gives `α g_w(x)` alone).
//!
//! The header's `__metadata__` holds `format = "pytorch-state-dict"`, the `module` as PyTorch
//! prints it, the `architecture` (JSON, as in a run's manifest), `alpha_folded`, `zero_output`,
//! `output` (`log_softmax` or `identity`: what turns the logits into our f), and the source run
//! and step.
//!
//! # Import: a `state_dict` as our parameters
//! `read_state_dict` reads a PyTorch `state_dict` saved with `safetensors.torch.save_file`
//! and checks every name, shape and dtype (f64) against an architecture, listing all the
//! mismatches in one message. It is the `[model] init = "…"` of a run configuration and the
//! reader of every step of an imported trajectory (`crate::import`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};

use super::{Activation, Architecture, Body, OutputKind, ParamSpec, Params};
use crate::error::{Error, Result};
use crate::io::{self, NamedArray};

/// `format` entry of an exported file's metadata.
pub(crate) const FORMAT: &str = "pytorch-state-dict";

/// Prefix of the frozen initial network's tensors in an export of a `zero_output` architecture.
pub(crate) const INIT_PREFIX: &str = "init.";

/// Our parameter specs under their PyTorch names, in our order.
///
/// # Shapes
/// The shapes are [`Architecture::param_specs`]'s.
pub fn torch_specs(arch: &Architecture) -> Vec<ParamSpec> {
    arch.param_specs()
        .into_iter()
        .map(|s| ParamSpec { name: torch_name(arch, &s.name), shape: s.shape })
        .collect()
}

/// The PyTorch `state_dict` name of our parameter `name` (see the module docs).
///
/// # Panics
/// If `name` is not one of `arch`'s parameter names.
pub fn torch_name(arch: &Architecture, name: &str) -> String {
    match &arch.body {
        Body::Layers { .. } => name.to_string(),
        Body::Mlp { .. } => {
            let rest = name.strip_prefix("layers.").expect("an MLP parameter name");
            let (l, kind) = rest.split_once('.').expect("layers.{l}.{kind}");
            let l: usize = l.parse().expect("a layer index");
            format!("{}.{kind}", 2 * l)
        }
        Body::Cnn { .. } => match name {
            "conv.weight" => "0.weight".into(),
            "conv.bias" => "0.bias".into(),
            "dense.weight" => "4.weight".into(),
            "dense.bias" => "4.bias".into(),
            other => panic!("not a CNN parameter name: {other}"),
        },
    }
}

/// The module as PyTorch prints its layers, e.g. `Sequential(Linear(2, 6), ReLU(), Linear(6, 3))`.
pub(crate) fn module_description(arch: &Architecture) -> String {
    let act = match arch.activation {
        Activation::Relu => "ReLU()",
        Activation::Tanh => "Tanh()",
    };
    let bias = if arch.bias { "" } else { ", bias=False" };
    let mut layers = Vec::new();
    match &arch.body {
        Body::Layers { .. } => return arch.stack().expect("validated architecture").torch_description(),
        Body::Mlp { widths } => {
            for l in 0..widths.len() - 1 {
                if l > 0 {
                    layers.push(act.to_string());
                }
                layers.push(format!("Linear({}, {}{bias})", widths[l], widths[l + 1]));
            }
        }
        Body::Cnn { image, channels, kernel, stride, padding, pool, outputs } => {
            let g = arch.cnn_geometry().expect("validated architecture");
            layers.push(format!("Conv2d({}, {channels}, {kernel}, stride={stride}, padding={padding}{bias})", image[0]));
            layers.push(act.to_string());
            layers.push(format!("MaxPool2d({pool})"));
            layers.push("Flatten()".into());
            layers.push(format!("Linear({}, {outputs}{bias})", channels * g.hp * g.wp));
        }
    }
    format!("Sequential({})", layers.join(", "))
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A PyTorch `state_dict` read as our parameters.
#[derive(Clone, Debug)]
pub(crate) struct StateDict {
    /// The parameters, named and ordered as ours.
    pub params: Params,
    /// SHA-256 of the file (lowercase hex).
    pub sha256: String,
}

/// Reads a `state_dict` saved by `safetensors.torch.save_file` and checks it against `arch`:
/// every expected name present with its shape and dtype f64, no other tensor, every value
/// finite. All mismatches are listed in the one error.
///
/// A file written by [`export_bytes`] with α folded in (α ≠ 1) or with the `init.` tensors of
/// `zero_output` is not the raw network and is refused with that reason.
///
/// # Shapes
/// The file's tensors are [`torch_specs`]`(arch)`.
pub(crate) fn read_state_dict(path: &Path, arch: &Architecture) -> Result<StateDict> {
    let bytes = io::read_file(path)?;
    let sha256 = sha256_hex(&bytes);
    let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
    let metadata = SafeTensors::read_metadata(&bytes).ok().and_then(|(_, m)| m.metadata().clone()).unwrap_or_default();
    if metadata.get("format").map(String::as_str) == Some(FORMAT) {
        if let Some(a) = metadata.get("alpha_folded").and_then(|a| a.parse::<f64>().ok()).filter(|a| *a != 1.0) {
            return Err(Error::format(
                path,
                format!("exported by pathkernel with alpha = {a} folded into the last layer; it is the scaled network, not raw weights to start from"),
            ));
        }
    }
    let specs = torch_specs(arch);
    let mut problems: Vec<String> = Vec::new();
    let expected: BTreeMap<&str, &ParamSpec> = specs.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut found: BTreeMap<String, (Dtype, Vec<usize>)> = BTreeMap::new();
    for (name, view) in st.tensors() {
        found.insert(name, (view.dtype(), view.shape().to_vec()));
    }
    for s in &specs {
        match found.get(&s.name) {
            None => problems.push(format!("missing `{}` {:?}", s.name, s.shape)),
            Some((dt, shape)) => {
                if shape != &s.shape {
                    problems.push(format!("`{}` has shape {shape:?}, expected {:?}", s.name, s.shape));
                }
                if *dt != Dtype::F64 {
                    problems.push(format!("`{}` is {dt:?}, expected F64 (save a float64 model: `model.double()`)", s.name));
                }
            }
        }
    }
    for (name, (_, shape)) in &found {
        if !expected.contains_key(name.as_str()) {
            problems.push(format!("unexpected `{name}` {shape:?}"));
        }
    }
    if !problems.is_empty() {
        return Err(Error::format(
            path,
            format!("does not match {} ({}): {}", module_description(arch), problems.len(), problems.join("; ")),
        ));
    }
    let mut data = Vec::with_capacity(specs.len());
    for s in &specs {
        let view = st.tensor(&s.name).expect("checked above");
        let v: Vec<f64> = view.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::format(path, format!("`{}` has a non-finite value at index {i}", s.name)));
        }
        data.push(v);
    }
    Ok(StateDict { params: Params { specs: arch.param_specs(), data }, sha256 })
}

/// Where an exported network came from (written into the metadata).
#[derive(Clone, Debug, Default)]
pub(crate) struct ExportSource {
    /// The run directory, as given.
    pub run: String,
    /// The run's id.
    pub run_id: String,
    /// The state exported.
    pub step: usize,
}

/// The network at `params` as a PyTorch `state_dict` in safetensors bytes, f64, whose module
/// output is our logits (module docs: α folded into the last layer; `zero_output` adds the
/// α-folded `init.` tensors of `init`).
///
/// # Shapes
/// `params` and `init` have `arch`'s specs.
pub(crate) fn export_bytes(arch: &Architecture, params: &Params, init: Option<&Params>, source: &ExportSource) -> Result<Vec<u8>> {
    arch.check_params(params)?;
    let mut arrays = folded_arrays(arch, params, "");
    if arch.zero_output {
        let init = init.ok_or_else(|| Error::Data("zero_output needs the initial parameters".into()))?;
        arch.check_params(init)?;
        arrays.extend(folded_arrays(arch, init, INIT_PREFIX));
    }
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("module".to_string(), module_description(arch));
    meta.insert("architecture".to_string(), serde_json::to_string(arch).expect("architecture serialises"));
    meta.insert("alpha_folded".to_string(), format!("{:?}", arch.alpha));
    meta.insert("zero_output".to_string(), arch.zero_output.to_string());
    let output = match arch.output {
        OutputKind::LogSoftmax => "log_softmax",
        OutputKind::Identity => "identity",
    };
    meta.insert("output".to_string(), output.to_string());
    if let Body::Cnn { image, .. } = &arch.body {
        meta.insert("input_shape".to_string(), format!("{image:?}"));
    }
    meta.insert("source_run".to_string(), source.run.clone());
    meta.insert("run_id".to_string(), source.run_id.clone());
    meta.insert("step".to_string(), source.step.to_string());
    io::safetensors_bytes(&arrays, Some(meta))
}

/// The tensors of `params` under PyTorch names (with `prefix`), the last layer times α.
fn folded_arrays(arch: &Architecture, params: &Params, prefix: &str) -> Vec<NamedArray> {
    let last_layer = |name: &str| match &arch.body {
        Body::Mlp { widths } => name.starts_with(&format!("layers.{}.", widths.len() - 2)),
        Body::Cnn { .. } => name.starts_with("dense."),
        Body::Layers { .. } => name.starts_with(&arch.stack().expect("validated").last_prefix()),
    };
    params
        .specs
        .iter()
        .zip(&params.data)
        .map(|(s, d)| {
            let v = if last_layer(&s.name) && arch.alpha != 1.0 { d.iter().map(|x| arch.alpha * x).collect() } else { d.clone() };
            NamedArray::f64(format!("{prefix}{}", torch_name(arch, &s.name)), s.shape.clone(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;

    fn mlp(bias: bool, alpha: f64, zero_output: bool) -> Architecture {
        ModelConfig::Mlp { hidden: vec![5, 4], activation: Activation::Tanh, bias, zero_last: false, alpha, zero_output }
            .resolve(3, None, 2, OutputKind::LogSoftmax)
            .unwrap()
    }

    #[test]
    fn torch_names_of_mlp_and_cnn() {
        let names: Vec<String> = torch_specs(&mlp(true, 1.0, false)).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]);
        assert_eq!(module_description(&mlp(false, 1.0, false)), "Sequential(Linear(3, 5, bias=False), Tanh(), Linear(5, 4, bias=False), Tanh(), Linear(4, 2, bias=False))");
        let cnn = ModelConfig::Cnn { channels: 3, kernel: 3, stride: 1, padding: 1, pool: 2, activation: Activation::Relu, bias: true, zero_last: false, alpha: 1.0, zero_output: false }
            .resolve(64, Some([1, 8, 8]), 10, OutputKind::LogSoftmax)
            .unwrap();
        let specs = torch_specs(&cnn);
        assert_eq!(specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["0.weight", "0.bias", "4.weight", "4.bias"]);
        assert_eq!(specs[2].shape, vec![10, 3 * 4 * 4]);
        assert_eq!(module_description(&cnn), "Sequential(Conv2d(1, 3, 3, stride=1, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(48, 10))");
    }

    #[test]
    fn torch_state_dict_round_trip_and_mismatch_listing() {
        let dir = tempfile::tempdir().unwrap();
        let arch = mlp(true, 1.0, false);
        let p = arch.init(4);
        let path = dir.path().join("w.safetensors");
        std::fs::write(&path, export_bytes(&arch, &p, None, &ExportSource::default()).unwrap()).unwrap();
        let sd = read_state_dict(&path, &arch).unwrap();
        assert_eq!(sd.params, p);
        assert_eq!(sd.sha256, sha256_hex(&std::fs::read(&path).unwrap()));
        assert_eq!(sd.sha256.len(), 64);
        // Every mismatch in one message: a wrong shape, a missing and an unexpected tensor, an f32.
        let mut arrays: Vec<NamedArray> = torch_specs(&arch).into_iter().zip(&p.data).map(|(s, d)| NamedArray::f64(s.name, s.shape, d.clone())).collect();
        arrays[0].shape = vec![3, 5];
        arrays.remove(5);
        arrays.push(NamedArray::f64("9.weight", vec![1], vec![0.0]));
        let mut bytes = io::safetensors_bytes(&arrays, None).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let e = read_state_dict(&path, &arch).unwrap_err().to_string();
        assert!(e.contains("`0.weight` has shape [3, 5], expected [5, 3]"), "{e}");
        assert!(e.contains("missing `4.bias` [2]"), "{e}");
        assert!(e.contains("unexpected `9.weight` [1]"), "{e}");
        assert!(e.contains("(3)"), "{e}");
        assert!(!e.contains('\n'));
        // Turn the dtype of the first tensor into F32 (same byte length is not needed: rebuild).
        bytes = safetensors::serialize(
            vec![("0.weight".to_string(), safetensors::tensor::TensorView::new(Dtype::F32, vec![5, 3], &[0u8; 60]).unwrap())],
            &None,
        )
        .unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let e = read_state_dict(&path, &arch).unwrap_err().to_string();
        assert!(e.contains("`0.weight` is F32, expected F64"), "{e}");
    }

    #[test]
    fn torch_export_folds_alpha_and_keeps_the_initial_network() {
        let dir = tempfile::tempdir().unwrap();
        let arch = mlp(true, 2.5, true);
        let p0 = arch.init(1);
        let mut p = p0.clone();
        p.data[0][0] += 0.25;
        let bytes = export_bytes(&arch, &p, Some(&p0), &ExportSource { run: "r".into(), run_id: "id".into(), step: 3 }).unwrap();
        let path = dir.path().join("e.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        let f = io::SafeFile::open(&path).unwrap();
        assert_eq!(f.metadata()["alpha_folded"], "2.5");
        assert_eq!(f.metadata()["zero_output"], "true");
        assert_eq!(f.metadata()["step"], "3");
        assert_eq!(f.f64("4.weight", Some(&[2, 4])).unwrap().1, p.data[4].iter().map(|v| 2.5 * v).collect::<Vec<_>>());
        assert_eq!(f.f64("0.weight", None).unwrap().1, p.data[0]);
        assert_eq!(f.f64("init.4.bias", None).unwrap().1, p0.data[5].iter().map(|v| 2.5 * v).collect::<Vec<_>>());
        // Not raw weights: refused as an initial state.
        let e = read_state_dict(&path, &arch).unwrap_err().to_string();
        assert!(e.contains("alpha = 2.5 folded"), "{e}");
        assert!(export_bytes(&arch, &p, None, &ExportSource::default()).is_err());
    }
}
