//! The closed form of `conv2d → relu → max_pool2d → flatten → dense` under the auto rule: its
//! step in im2col factors (`step`), its Gram ([`gram`]), its rows integrated exactly between the
//! kinks (`pieces`) and its step model (`model`).

pub(crate) mod gram;
pub(crate) mod model;
pub(crate) mod pieces;
pub(crate) mod step;
