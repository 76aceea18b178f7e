//! The CNN preset's fast path (conv → activation → max-pool → dense): its step in im2col
//! factors (`step`), its structured Gram ([`gram`]) and its exact piecewise rule between the
//! kinks (`pieces`).

pub mod gram;
pub(crate) mod model;
pub(crate) mod pieces;
pub(crate) mod step;
