//! The engine: how one kernel computation runs, from the one entry ([`compute`](crate::kernel::compute)) through
//! the checks every computation shares (`prepare`) to the plain driver of GD/SGD runs
//! (`driver`) or the backward recursion of momentum, Adam(W) and weight-decay runs
//! (`stateful`), over the step models of each network (`kernel::step_model`), in row blocks under a
//! memory budget ([`blocked`]) or column blocks of the training points ([`columns`]).

pub mod blocked;
pub mod columns;
pub(crate) mod driver;
pub(crate) mod entry;
pub(crate) mod prepare;
pub(crate) mod stateful;
