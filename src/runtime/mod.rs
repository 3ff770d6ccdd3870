//! Live runtime bindings (`data-model.md` §10–§13): where each placement fragment
//! lives right now. Pointers are borrowed from the framework and never persisted;
//! nothing in this module dereferences them.
//!
//! - `fragment`: [`RuntimeFragment`] (one live view, validated at construction),
//!   [`RuntimeFragmentSnapshot`] (what plans keep of one) and
//!   [`fence_binding_digest`];
//! - `binding`: [`RuntimeBinding`], one participant's fragments for one placement
//!   under a runtime lease;
//! - `validation`: pairing bindings with a placement and the address-range rule
//!   ([`validate_runtime_binding`], [`validate_runtime_bindings`],
//!   [`validate_binding_subset`], [`pair_bindings`]);
//! - `memory`: [`MemoryKind`] and [`MemoryRegion`], the memory the library borrows;
//! - [`transport`]: a binding's JSON transport.

mod binding;
mod fragment;
mod memory;
pub mod transport;
mod validation;

pub use binding::{RuntimeBinding, RuntimeBindingSpec};
pub use fragment::{fence_binding_digest, RuntimeFragment, RuntimeFragmentSnapshot, RuntimeFragmentSpec};
pub use memory::{MemoryKind, MemoryRegion};
pub(crate) use validation::{check_bindings, check_shared_instances, first_repeated_fragment_id, BindingSpaces};
pub use validation::{
    pair_bindings, validate_binding_subset, validate_runtime_binding, validate_runtime_binding_remembered,
    validate_runtime_bindings,
};
