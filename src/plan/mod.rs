//! Pure planners: upload planning (`upload-planning.md`), load planning
//! (`load-path.md` §3) and live-transfer planning and binding (`live-transfer.md`
//! §1–§3), the last two on one shared N-D core.

pub(crate) mod core;
pub mod load;
pub mod transfer;
pub mod transfer_bind;
pub mod transfer_json;
pub mod upload;
