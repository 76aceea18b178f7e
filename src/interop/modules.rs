//! The module structure a recording writes (`scripts/record_torch_trajectory.py`'s
//! `describe_module`) read as our layer list, or refused in one line naming the module.
//!
//! A recording of an `nn.Sequential` lists its children in order, each as an object with its
//! class (`type`), PyTorch's one-line description (`repr`) and the attributes the layer's maths
//! depends on:
//!
//! ```json
//! { "kind": "layers", "input": [1, 8, 8], "modules": [
//!   { "type": "Conv2d", "repr": "Conv2d(1, 4, kernel_size=(3, 3), …)", "in_channels": 1,
//!     "out_channels": 4, "kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1],
//!     "dilation": [1, 1], "groups": 1, "bias": true, "padding_mode": "zeros" },
//!   { "type": "GELU", "repr": "GELU(approximate='none')", "approximate": "none" },
//!   { "type": "Residual", "repr": "Residual", "body": [ … ], "shortcut": null }, … ] }
//! ```
//!
//! Read: `Linear`, `Conv2d` (square kernel, no dilation or groups, zero padding), `MaxPool2d` and
//! `AvgPool2d` (no padding, floor mode), `Flatten` (from dim 1), `LayerNorm` over the features of
//! a flat input, `ChannelLayerNorm` (`scripts/torch_model.py`: over the channels of a map),
//! `ReLU`, `LeakyReLU`, `Tanh`, `Sigmoid`, `Softplus` (β = 1), `GELU` (exact), `SiLU`, and
//! `scripts/torch_model.py`'s `Residual` (body `nn.Sequential`, shortcut `None`, `Linear` or a
//! 1×1 `Conv2d`, as the stack resolves it). Refused with the reason: batch norm (a point's output
//! depends on its batch), dropout in training mode, and any other module (named by its class).

use serde_json::Value;

use crate::model::layers::Act;
use crate::model::layers::{resolve_list, Layer, LayerSpec, Shape, Stack};

/// `repr` of a recorded module (its class when the recording gives none).
fn repr(m: &Value) -> String {
    m.get("repr").and_then(Value::as_str).or_else(|| m.get("type").and_then(Value::as_str)).unwrap_or("a module without `type`").to_string()
}

/// One refusal: `model.modules[3] BatchNorm2d(4, …): why`.
fn refuse(at: &str, m: &Value, why: impl std::fmt::Display) -> String {
    format!("{at} {}: {why}", repr(m))
}

fn uint(m: &Value, key: &str, at: &str) -> Result<usize, String> {
    m.get(key).and_then(Value::as_u64).map(|v| v as usize).ok_or_else(|| refuse(at, m, format!("`{key}` missing or not a non-negative integer")))
}

fn boolean(m: &Value, key: &str, at: &str) -> Result<bool, String> {
    m.get(key).and_then(Value::as_bool).ok_or_else(|| refuse(at, m, format!("`{key}` missing or not true/false")))
}

fn number(m: &Value, key: &str, at: &str) -> Result<f64, String> {
    m.get(key).and_then(Value::as_f64).ok_or_else(|| refuse(at, m, format!("`{key}` missing or not a number")))
}

/// A pair attribute (`kernel_size`, `stride`, …) that must have equal entries; a number is a pair of it.
fn square(m: &Value, key: &str, at: &str) -> Result<usize, String> {
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
fn require(m: &Value, key: &str, want: Value, at: &str, why: &str) -> Result<(), String> {
    match m.get(key) {
        Some(v) if *v != want && !(want.is_number() && v.as_f64() == want.as_f64()) => Err(refuse(at, m, format!("{key} = {v}: {why}"))),
        _ => Ok(()),
    }
}

/// The layer one recorded module is, or the one-line reason it cannot be.
fn layer(m: &Value, at: &str) -> Result<LayerSpec, String> {
    let kind =
        m.get("type").and_then(Value::as_str).ok_or_else(|| format!("{at}: a module without `type` (re-record with scripts/record_torch_trajectory.py)"))?;
    let spec = |name: &str| LayerSpec::parse(&Value::String(name.into()), at).map_err(|e| e.replacen(at, &format!("{at} {}", repr(m)), 1));
    Ok(match kind {
        "Linear" => LayerSpec::Dense { features: uint(m, "out_features", at)?, bias: boolean(m, "bias", at)? },
        "Conv2d" => {
            let padding = match m.get("padding") {
                Some(Value::String(s)) => return Err(refuse(at, m, format!("padding='{s}': give the padding as numbers"))),
                _ => square(m, "padding", at)?,
            };
            if square(m, "dilation", at)? != 1 {
                return Err(refuse(at, m, "dilation is not supported"));
            }
            require(m, "groups", Value::from(1), at, "grouped convolutions are not supported")?;
            require(m, "padding_mode", Value::from("zeros"), at, "only zero padding is supported")?;
            LayerSpec::Conv2d { channels: uint(m, "out_channels", at)?, kernel: square(m, "kernel_size", at)?, stride: square(m, "stride", at)?, padding, bias: boolean(m, "bias", at)? }
        }
        "MaxPool2d" | "AvgPool2d" => {
            let kernel = square(m, "kernel_size", at)?;
            let stride = if m.get("stride").is_some_and(|s| !s.is_null()) { square(m, "stride", at)? } else { kernel };
            if square(m, "padding", at)? != 0 {
                return Err(refuse(at, m, "pooling with padding is not supported"));
            }
            require(m, "ceil_mode", Value::Bool(false), at, "only floor mode is supported")?;
            if kind == "MaxPool2d" {
                if m.get("dilation").is_some() && square(m, "dilation", at)? != 1 {
                    return Err(refuse(at, m, "dilation is not supported"));
                }
                LayerSpec::MaxPool2d { kernel, stride }
            } else {
                require(m, "divisor_override", Value::Null, at, "a divisor override is not supported")?;
                LayerSpec::AvgPool2d { kernel, stride }
            }
        }
        "Flatten" => {
            require(m, "start_dim", Value::from(1), at, "only Flatten() from dim 1 (one sample's features) is supported")?;
            require(m, "end_dim", Value::from(-1), at, "only Flatten() to the last dim is supported")?;
            LayerSpec::Flatten
        }
        "ReLU" => spec("relu")?,
        "Tanh" => spec("tanh")?,
        "Sigmoid" => spec("sigmoid")?,
        "SiLU" => spec("silu")?,
        "GELU" => {
            require(m, "approximate", Value::from("none"), at, "only the exact (erf) GELU is supported")?;
            spec("gelu")?
        }
        "Softplus" => {
            require(m, "beta", Value::from(1.0), at, "only Softplus(beta=1) is supported")?;
            spec("softplus")?
        }
        "LeakyReLU" => LayerSpec::Act(Act::LeakyRelu(number(m, "negative_slope", at)?)),
        "LayerNorm" => {
            require(m, "elementwise_affine", Value::Bool(true), at, "a layer norm without its affine parameters is not supported")?;
            require(m, "bias", Value::Bool(true), at, "a layer norm without its bias is not supported")?;
            let shape = m.get("normalized_shape").and_then(Value::as_array).map(Vec::len).unwrap_or(0);
            if shape != 1 {
                return Err(refuse(at, m, "LayerNorm over more than the last dimension is not supported: normalise flat features, or the channels of a map with torch_model.ChannelLayerNorm"));
            }
            LayerSpec::LayerNorm { eps: number(m, "eps", at)? }
        }
        "ChannelLayerNorm" => LayerSpec::LayerNorm { eps: number(m, "eps", at)? },
        "Residual" => {
            let body = m.get("body").and_then(Value::as_array).ok_or_else(|| refuse(at, m, "a Residual needs its `body` modules"))?;
            if body.is_empty() {
                return Err(refuse(at, m, "an empty Residual body"));
            }
            LayerSpec::Residual { layers: list(body, &format!("{at}.body"))? }
        }
        "BatchNorm1d" | "BatchNorm2d" | "BatchNorm3d" | "SyncBatchNorm" => spec("batch_norm")?,
        "Dropout" | "Dropout1d" | "Dropout2d" | "AlphaDropout" => {
            if m.get("training").and_then(Value::as_bool) == Some(false) || m.get("p").and_then(Value::as_f64) == Some(0.0) {
                return Err(refuse(at, m, "dropout (here inactive) shifts the nn.Sequential indices of the parameter names; remove it from the module"));
            }
            spec("dropout").map_err(|e| e.replacen("dropout is", "dropout in training mode is", 1))?
        }
        "Sequential" => return Err(refuse(at, m, "a nested nn.Sequential is not supported: list its layers in the outer one (or wrap a block as torch_model.Residual)")),
        other => return Err(refuse(at, m, format!("the module `{other}` is not a layer pathkernel can express (layers: Linear, Conv2d, MaxPool2d, AvgPool2d, Flatten, LayerNorm, ChannelLayerNorm, ReLU, LeakyReLU, Tanh, Sigmoid, Softplus, GELU, SiLU, Residual)"))),
    })
}

/// The layer list of recorded modules.
pub(crate) fn list(modules: &[Value], at: &str) -> Result<Vec<LayerSpec>, String> {
    modules.iter().enumerate().map(|(i, m)| layer(m, &format!("{at}[{i}]"))).collect()
}

/// The input shape of one recorded sample: `[F]` or `[C, H, W]`.
pub(crate) fn input_shape(input: &[usize]) -> Result<Shape, String> {
    match *input {
        [f] if f > 0 => Ok(Shape::Flat(f)),
        [c, h, w] if c * h * w > 0 => Ok(Shape::Map(c, h, w)),
        _ => Err(format!("model.input {input:?}: a sample must be [features] or [C, H, W]")),
    }
}

/// The stack's output size K (the last layer must give a flat vector).
pub(crate) fn outputs(input: Shape, specs: &[LayerSpec]) -> Result<usize, String> {
    let mut tensors = 0;
    let nodes = resolve_list(input, specs, "model.modules", "", &mut tensors)?;
    match nodes.last().map_or(input, |n| n.output) {
        Shape::Flat(k) => Ok(k),
        out => Err(format!("model.modules: the last module gives {out} per sample; the loss needs flat logits (end with Flatten and Linear)")),
    }
}

/// Checks that every recorded `Residual`'s shortcut is the one the stack resolves (identity
/// when the body keeps the shape, else `Linear` or a 1×1 `Conv2d` with the resolved stride), and
/// that each recorded `Linear`/`Conv2d` takes the input the stack gives it.
pub(crate) fn check_resolved(modules: &[Value], stack: &Stack) -> Result<(), String> {
    fn walk(modules: &[Value], nodes: &[crate::model::layers::Node], at: &str) -> Result<(), String> {
        for (i, (m, n)) in modules.iter().zip(nodes).enumerate() {
            let at = format!("{at}[{i}]");
            let want_in = n.layer.torch_input();
            match (m.get("type").and_then(Value::as_str), n.input) {
                (Some("LayerNorm"), Shape::Map(..)) => {
                    return Err(refuse(&at, m, format!("nn.LayerNorm on the map {} normalises its last dimension; pathkernel's layer norm on a map is over the channels at each position: use torch_model.ChannelLayerNorm", n.input)))
                }
                (Some("ChannelLayerNorm"), Shape::Flat(_)) => return Err(refuse(&at, m, format!("ChannelLayerNorm needs a [C, H, W] map, its input is {}: use nn.LayerNorm", n.input))),
                _ => {}
            }
            if let Some((key, want)) = want_in {
                if let Some(got) = m.get(key).and_then(Value::as_u64).filter(|&g| g as usize != want) {
                    return Err(refuse(&at, m, format!("{key} = {got}, but its input is {} per sample", n.input)));
                }
            }
            if let Some((inner, shortcut)) = n.layer.branches() {
                let body = m.get("body").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
                walk(body, inner, &format!("{at}.body"))?;
                let sc = m.get("shortcut").filter(|s| !s.is_null());
                match (sc, shortcut) {
                    (None, None) => {}
                    (Some(s), None) => {
                        return Err(refuse(
                            &at,
                            m,
                            format!("the body keeps the shape {}, so the shortcut is the identity; the recorded shortcut {} is not", n.input, repr(s)),
                        ))
                    }
                    (None, Some(_)) => {
                        return Err(refuse(
                            &at,
                            m,
                            format!("the body turns {} into {}: it needs a projection shortcut (Linear, or a 1x1 Conv2d)", n.input, n.output),
                        ))
                    }
                    (Some(s), Some(node)) => {
                        if !node.layer.is_recorded_projection(s) {
                            let want = format!("{} with a bias", node.layer.torch());
                            return Err(refuse(&at, m, format!("the shortcut {} is not the projection the stack uses: {want}", repr(s))));
                        }
                    }
                }
            }
        }
        Ok(())
    }
    walk(modules, &stack.nodes, "model.modules")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn modules_map_to_layers_and_refusals_name_the_module() {
        let ms = vec![
            json!({"type": "Conv2d", "repr": "Conv2d(1, 2, 3)", "in_channels": 1, "out_channels": 2, "kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "bias": true, "padding_mode": "zeros"}),
            json!({"type": "GELU", "approximate": "none"}),
            json!({"type": "MaxPool2d", "kernel_size": 2, "stride": 2, "padding": 0, "dilation": 1, "ceil_mode": false}),
            json!({"type": "Flatten", "start_dim": 1, "end_dim": -1}),
            json!({"type": "Linear", "in_features": 32, "out_features": 3, "bias": true}),
        ];
        let specs = list(&ms, "model.modules").unwrap();
        assert_eq!(specs[0], LayerSpec::Conv2d { channels: 2, kernel: 3, stride: 1, padding: 1, bias: true });
        assert_eq!(specs[2], LayerSpec::MaxPool2d { kernel: 2, stride: 2 });
        assert_eq!(outputs(Shape::Map(1, 8, 8), &specs).unwrap(), 3);
        let stack = Stack::resolve(Shape::Map(1, 8, 8), &specs, 3).unwrap();
        check_resolved(&ms, &stack).unwrap();
        let e = list(&[json!({"type": "BatchNorm2d", "repr": "BatchNorm2d(2, eps=1e-05)"})], "model.modules").unwrap_err();
        assert!(e.starts_with("model.modules[0] BatchNorm2d(2, eps=1e-05): batch norm is not supported: in training mode a point's output depends on the other points of its batch"), "{e}");
        let e = list(&[json!({"type": "Dropout", "repr": "Dropout(p=0.5, inplace=False)", "p": 0.5, "training": true})], "m").unwrap_err();
        assert!(e.contains("Dropout(p=0.5, inplace=False): dropout in training mode is not supported"), "{e}");
        let e = list(&[json!({"type": "MyBlock", "repr": "MyBlock()"})], "m").unwrap_err();
        assert!(e.contains("MyBlock(): the module `MyBlock` is not a layer"), "{e}");
        let e = list(&[json!({"type": "GELU", "repr": "GELU(approximate='tanh')", "approximate": "tanh"})], "m").unwrap_err();
        assert!(e.contains("only the exact (erf) GELU"), "{e}");
        // A residual whose recorded shortcut is not the resolved one.
        let res = vec![
            json!({"type": "Flatten", "start_dim": 1, "end_dim": -1}),
            json!({"type": "Residual", "repr": "Residual", "body": [{"type": "Linear", "in_features": 4, "out_features": 4, "bias": true}], "shortcut": {"type": "Linear", "repr": "Linear(4, 4)", "bias": true}}),
        ];
        let specs = list(&res, "model.modules").unwrap();
        let stack = Stack::resolve(Shape::Map(1, 2, 2), &specs, 4).unwrap();
        let e = check_resolved(&res, &stack).unwrap_err();
        assert!(e.contains("so the shortcut is the identity"), "{e}");
        // nn.LayerNorm on a map normalises another axis than ours.
        let ln = vec![
            json!({"type": "LayerNorm", "repr": "LayerNorm((2,))", "normalized_shape": [2], "eps": 1e-5, "elementwise_affine": true, "bias": true}),
            res[0].clone(),
            json!({"type": "Linear", "in_features": 8, "out_features": 2, "bias": true}),
        ];
        let specs = list(&ln, "model.modules").unwrap();
        let stack = Stack::resolve(Shape::Map(2, 2, 2), &specs, 2).unwrap();
        let e = check_resolved(&ln, &stack).unwrap_err();
        assert!(e.contains("normalises its last dimension") && e.contains("ChannelLayerNorm"), "{e}");
    }
}
