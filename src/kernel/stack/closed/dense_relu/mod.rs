//! The closed form of `[flatten,] dense → relu → dense`: its rows integrated exactly between
//! their kinks under the auto rule (`pieces`), its step in the structured form the Gram needs
//! (`step`) and its step model (`model`); the tests' slow obvious path, gradients at nodes
//! (`nodes`). The Gram of dense layers from activations ⊗ back-propagated deltas is
//! [`crate::kernel::gram`], shared with the layer stack's dense layers.

pub(crate) mod device;
pub(crate) mod model;
#[cfg(test)]
pub(crate) mod nodes;
pub(crate) mod pieces;
pub(crate) mod step;
