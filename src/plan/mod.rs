//! Pure planners: upload planning (`upload-planning.md`).

pub mod upload;
