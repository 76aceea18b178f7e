//! The MLP preset's fast path: its step in the structured form the Gram needs (`step`), its
//! quadrature nodes (`nodes`), and the exact piecewise rule of one-hidden-layer ReLU networks
//! (`pieces`). The Gram of dense layers from activations ⊗ back-propagated deltas is
//! [`crate::kernel::gram`], shared with the layer stack's dense layers.

pub(crate) mod model;
pub(crate) mod nodes;
pub(crate) mod pieces;
pub(crate) mod step;
