//! [`Rows`]: what the rows of a kernel are ([`crate::kernel::Rows`], one spelling for the CLI,
//! the studies, the notebook API and the Gram file).

pub use crate::kernel::Rows;
