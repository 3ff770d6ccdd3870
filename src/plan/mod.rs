//! Pure planners: upload planning (`upload-planning.md`).

pub mod load;
pub mod upload;
