//! Pure planners: no I/O, no pointer dereferenced.
//!
//! - [`upload`]: `plan_upload` (one complete, generation-consistent DP replica,
//!   deterministic keys, operations; `docs/spec/upload-planning.md`) and the
//!   decision record; [`upload_transport`]: the plan's JSON transport.
//! - [`load`]: the N-D load planner (stored fragments into target fragments, compact
//!   strided regions, planning limits; `load-path.md`); [`bound_load`]: a logical
//!   load plan bound to target runtime bindings ([`bound_load::LoadPlan`]).
//! - [`region`]: transfer regions and planning limits, shared by every planner;
//!   `core`: the N-D planning core shared by the load planner and the transfer
//!   planner; [`transfer`]: placement-to-placement planning (`live-transfer.md`
//!   §1–§3), [`transfer_bind`]: binding to source and target runtime bindings,
//!   [`transfer_json`]: the transfer plan's JSON transport.

//! - [`integrity`]: the key, block checksums and JSON of a revision's integrity record.

pub mod bound_load;
pub(crate) mod core;
pub mod integrity;
pub mod load;
pub mod region;
pub mod transfer;
pub mod transfer_bind;
pub mod transfer_json;
pub mod upload;
pub mod upload_transport;
