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
//! 1×1 `Conv2d`, as the stack resolves it); on token rows (`vocab` beside `input`) `Embedding` and
//! `torch_model.ScaledEmbedding` (no `padding_idx`, no `max_norm`), `torch_model.SelfAttention`
//! (ExPLAIND's heads), `torch_model.MHSelfAttention` (PyTorch's `nn.MultiheadAttention` as its
//! attribute `attn`, used as self-attention `attn(x, x, x)[0]`, causal mask or none, either
//! `batch_first`: the layer `self_attention` with `layout = "packed"`, whose parameters are
//! `attn.in_proj_weight`, `attn.in_proj_bias`, `attn.out_proj.weight`, `attn.out_proj.bias`
//! under PyTorch's names), `torch_model.LastToken` and `torch_model.MeanTokens`. Refused with the
//! reason: batch norm (a point's output depends on its batch), dropout in training mode (a
//! `Dropout` module, or an `nn.MultiheadAttention` with `dropout` > 0), an
//! `nn.MultiheadAttention` with `kdim`/`vdim` other than `embed_dim`, `add_bias_kv` or
//! `add_zero_attn`, a bare `nn.MultiheadAttention` child (it takes query, key and value and
//! returns a tuple), and any other module (named by its class).

use serde_json::Value;

use crate::model::layers::recorded::{refuse, repr};
use crate::model::layers::{resolve_list, Layer, LayerSpec, Shape, Stack};

/// The layer list of recorded modules.
pub(crate) fn list(modules: &[Value], at: &str) -> Result<Vec<LayerSpec>, String> {
    LayerSpec::from_torch_list(modules, at)
}

/// The input shape of one recorded sample: `[F]`, `[C, H, W]`, or `[T]` token ids of a
/// vocabulary of `vocab`.
pub(crate) fn input_shape(input: &[usize], vocab: Option<usize>) -> Result<Shape, String> {
    match (input, vocab) {
        (&[t], Some(v)) if t > 0 && v > 0 => Ok(Shape::Tokens(t, v)),
        (_, Some(v)) => Err(format!("model.input {input:?} with model.vocab = {v}: token rows must be [T], T ≥ 1, from a vocabulary ≥ 1")),
        (&[f], None) if f > 0 => Ok(Shape::Flat(f)),
        (&[c, h, w], None) if c * h * w > 0 => Ok(Shape::Map(c, h, w)),
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
                (Some("ChannelLayerNorm"), Shape::Flat(_) | Shape::Seq(..)) => return Err(refuse(&at, m, format!("ChannelLayerNorm needs a [C, H, W] map, its input is {}: use nn.LayerNorm", n.input))),
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
        assert_eq!(specs[0], LayerSpec::Conv2d(crate::model::layers::Conv2dSpec { channels: 2, kernel: 3, stride: 1, padding: 1, bias: true }));
        assert_eq!(specs[2], LayerSpec::MaxPool2d(crate::model::layers::MaxPool2dSpec { kernel: 2, stride: 2 }));
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

    /// ExPLAIND's block as `torch_model` modules describe it (`ScaledEmbedding`, `SelfAttention`,
    /// `LastToken`, `Residual`, `Linear`) on token rows: read back as the stack that trains it,
    /// and the refusals (no vocabulary for token rows, a padding index, a width that is not the
    /// input's).
    #[test]
    fn sequence_modules_map_to_layers() {
        let ms = vec![
            json!({"type": "ScaledEmbedding", "repr": "ScaledEmbedding(9, 8, scale=2.8)", "num_embeddings": 9, "embedding_dim": 8, "padding_idx": null, "max_norm": null, "scale": 2.5}),
            json!({"type": "SelfAttention", "repr": "SelfAttention()", "d": 8, "heads": 2, "head_dim": 4, "shared_qkv": true, "bias": false, "causal": false}),
            json!({"type": "LastToken", "repr": "LastToken()"}),
            json!({"type": "Residual", "repr": "Residual", "body": [
                {"type": "Linear", "in_features": 8, "out_features": 16, "bias": true}, {"type": "ReLU"},
                {"type": "Linear", "in_features": 16, "out_features": 8, "bias": true}, {"type": "ReLU"}], "shortcut": null}),
            json!({"type": "Linear", "in_features": 8, "out_features": 9, "bias": false}),
        ];
        let specs = list(&ms, "model.modules").unwrap();
        let written: Vec<serde_json::Value> = specs.iter().map(LayerSpec::to_value).collect();
        assert_eq!(written[0], json!({ "embedding": { "vocab": 9, "dim": 8, "scale": 2.5, "positions": false } }));
        assert_eq!(written[1], json!({ "self_attention": { "heads": 2, "head_dim": 4, "shared_qkv": true, "bias": false, "causal": false } }));
        assert_eq!(written[2], json!("last_token"));
        let input = input_shape(&[4], Some(9)).unwrap();
        assert_eq!(input, Shape::Tokens(4, 9));
        assert_eq!(outputs(input, &specs).unwrap(), 9);
        let stack = Stack::resolve(input, &specs, 9).unwrap();
        check_resolved(&ms, &stack).unwrap();
        assert!(input_shape(&[4, 2], Some(9)).unwrap_err().contains("token rows must be [T]"));
        let e = list(&[json!({"type": "Embedding", "repr": "Embedding(9, 8, padding_idx=0)", "num_embeddings": 9, "embedding_dim": 8, "padding_idx": 0})], "m").unwrap_err();
        assert!(e.contains("Embedding(9, 8, padding_idx=0): an Embedding with `padding_idx` is not supported"), "{e}");
        // A position embedding recorded for another length than the rows'.
        let mut pos = ms.clone();
        pos[0]["positions"] = json!(5);
        let specs = list(&pos, "model.modules").unwrap();
        let stack = Stack::resolve(input, &specs, 9).unwrap();
        let e = check_resolved(&pos, &stack).unwrap_err();
        assert!(e.contains("positions = 5") && e.contains("[4]"), "{e}");
        pos[0]["positions"] = json!(4);
        check_resolved(&pos, &stack).unwrap();
        let mut wide = ms.clone();
        wide[1]["d"] = json!(6);
        let e = check_resolved(&wide, &stack).unwrap_err();
        assert!(e.contains("model.modules[1]") && e.contains("d = 6"), "{e}");
    }

    /// `torch_model.MHSelfAttention` as `describe_module` writes it: `self_attention` with
    /// `layout = "packed"` (PyTorch's tensor names), and each attribute our layer cannot express
    /// refused in one line naming the module and the attribute.
    #[test]
    fn multihead_attention_maps_to_packed_attention_or_is_refused() {
        let mha = json!({"type": "MHSelfAttention", "repr": "MHSelfAttention(8, num_heads=2, bias=True, causal=True)", "embed_dim": 8, "num_heads": 2, "bias": true,
                         "causal": true, "batch_first": true, "kdim": 8, "vdim": 8, "add_bias_kv": false, "add_zero_attn": false, "dropout": 0.0, "training": true});
        let ms = vec![
            json!({"type": "Embedding", "repr": "Embedding(9, 8)", "num_embeddings": 9, "embedding_dim": 8, "padding_idx": null, "max_norm": null, "scale": 1.0}),
            mha.clone(),
            json!({"type": "LastToken", "repr": "LastToken()"}),
            json!({"type": "Linear", "in_features": 8, "out_features": 9, "bias": true}),
        ];
        let specs = list(&ms, "model.modules").unwrap();
        assert_eq!(specs[1].to_value(), json!({ "self_attention": { "heads": 2, "shared_qkv": false, "bias": true, "causal": true, "layout": "packed" } }));
        let input = input_shape(&[4], Some(9)).unwrap();
        let stack = Stack::resolve(input, &specs, 9).unwrap();
        check_resolved(&ms, &stack).unwrap();
        assert!(stack.torch_description().contains("MHSelfAttention(8, num_heads=2, bias=True, causal=True)"), "{}", stack.torch_description());
        // embed_dim is checked against the width the stack gives it.
        let mut wide = ms.clone();
        wide[1]["embed_dim"] = json!(6);
        let e = check_resolved(&wide, &stack).unwrap_err();
        assert!(e.starts_with("model.modules[1] MHSelfAttention(8, num_heads=2, bias=True, causal=True): embed_dim = 6"), "{e}");
        let refused = |key: &str, v: serde_json::Value, needle: &str| {
            let mut m = mha.clone();
            m[key] = v;
            let e = list(&[m], "model.modules").unwrap_err();
            assert!(e.starts_with("model.modules[0] MHSelfAttention(8, num_heads=2, bias=True, causal=True): ") && e.contains(needle) && !e.contains('\n'), "{key}: {e}");
        };
        refused("kdim", json!(4), "kdim = 4: keys and values of another width");
        refused("vdim", json!(5), "vdim = 5:");
        refused("add_bias_kv", json!(true), "add_bias_kv = true: learned key/value biases");
        refused("add_zero_attn", json!(true), "add_zero_attn = true: a zero key/value position");
        refused("dropout", json!(0.1), "dropout = 0.1 in training mode: its random mask");
        // Dropout that is off (evaluation mode) is the same function; batch_first either way.
        let mut m = mha.clone();
        m["dropout"] = json!(0.1);
        m["training"] = json!(false);
        m["batch_first"] = json!(false);
        assert!(list(&[m], "m").is_ok());
        // nn.MultiheadAttention itself: not a layer of an nn.Sequential.
        let e = list(&[json!({"type": "MultiheadAttention", "repr": "MultiheadAttention(8, num_heads=2)", "embed_dim": 8, "num_heads": 2})], "model.modules").unwrap_err();
        assert!(e.starts_with("model.modules[0] MultiheadAttention(8, num_heads=2): nn.MultiheadAttention takes (query, key, value)") && e.contains("torch_model.MHSelfAttention"), "{e}");
    }
}
