//! The MLP preset's fast path: its step in the structured form the Gram needs (`step`), the
//! Gram of dense layers from activations ⊗ back-propagated deltas ([`gram`], shared by the layer
//! stack's dense layers), and the exact piecewise rule of one-hidden-layer ReLU networks
//! (`pieces`).

pub(crate) mod nodes;
pub(crate) mod pieces;
pub(crate) mod step;
