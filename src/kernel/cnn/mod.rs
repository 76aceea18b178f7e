//! The ReLU CNN preset's closed form (conv → ReLU → max-pool → dense) under the auto rule: its
//! step in im2col factors (`step`), its Gram ([`gram`]) and its rows integrated exactly between
//! the kinks (`pieces`). Every other kernel of the preset runs as its layer stack.

pub mod gram;
pub(crate) mod model;
pub(crate) mod pieces;
pub(crate) mod step;
