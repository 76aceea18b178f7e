//! The names and shapes of a network's parameter tensors, and their grouping into parameter
//! layers (the unit of a kernel's per-layer split). Below the layer kinds
//! ([`super::layers`]), which declare their tensors with it, and the networks that hold them.

use serde::{Deserialize, Serialize};

/// Name and shape of one parameter tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamSpec {
    /// Tensor name, e.g. `layers.0.weight`.
    pub name: String,
    /// Shape, e.g. `[64, 100]` (dense weights are `[out, in]`).
    pub shape: Vec<usize>,
}

/// One parameter layer: the consecutive tensors of one module (`3.weight` and `3.bias` are
/// layer `3`; `layers.0.*` of an MLP layer `layers.0`; a residual block's `2.body.0.*` and
/// `2.shortcut.*` are layers of their own), the unit of the per-layer decomposition of a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamLayer {
    /// The module's name: the tensors' names without their last component.
    pub name: String,
    /// Its tensors, as indices into the specs.
    pub tensors: std::ops::Range<usize>,
    /// Its entries in the flat parameter vector `[W]`.
    pub flat: std::ops::Range<usize>,
}

/// Groups `specs` (in storage order) into parameter layers: consecutive tensors whose names
/// share everything but their last `.`-component.
pub fn param_layers(specs: &[ParamSpec]) -> Vec<ParamLayer> {
    let mut out: Vec<ParamLayer> = Vec::new();
    let mut off = 0;
    for (j, s) in specs.iter().enumerate() {
        let name = s
            .name
            .rsplit_once('.')
            .map_or(s.name.as_str(), |(head, _)| head);
        let n = s.numel();
        match out.last_mut() {
            Some(last) if last.name == name => {
                last.tensors.end = j + 1;
                last.flat.end = off + n;
            }
            _ => out.push(ParamLayer {
                name: name.to_string(),
                tensors: j..j + 1,
                flat: off..off + n,
            }),
        }
        off += n;
    }
    out
}

impl ParamSpec {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}
