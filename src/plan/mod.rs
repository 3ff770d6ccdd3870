//! Pure planners: upload planning (`upload-planning.md`).

pub(crate) mod core;
pub mod load;
pub mod upload;
