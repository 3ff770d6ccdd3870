//! Pure planners: no I/O, no pointer dereferenced.
//!
//! - [`upload`]: `plan_upload` (one complete, generation-consistent DP replica,
//!   deterministic keys, operations; `docs/spec/upload-planning.md`) and the
//!   decision record; [`upload_transport`]: the plan's JSON transport.
//! - [`load`]: the N-D load planner (stored fragments into target fragments, compact
//!   strided regions, planning limits; `load-path.md`); [`bound_load`]: a logical
//!   load plan bound to target runtime bindings ([`bound_load::LoadPlan`]).
//! - [`integrity`]: the key, block checksums and JSON of a revision's integrity record.

pub mod bound_load;
pub mod integrity;
pub mod load;
pub mod upload;
pub mod upload_transport;
