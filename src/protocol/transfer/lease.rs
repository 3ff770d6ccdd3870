//! Evidence of pre-registered memory (`MemoryRegistrationLease`,
//! `live-transfer.md` §7.2) and the allocation guard providers of a live transfer
//! (one provider per `(instance_id, participant_id)`, §9).
//!
//! A memory registration lease is a value: the owner of an allocation registered it
//! with the engine for *this* binding generation and runtime lease; the library
//! never registers or unregisters it. (The store path's
//! [`crate::protocol::RegistrationLease`] is a different thing: a handle that
//! registered buffers with an `ObjectStore` and holds their pin.)

use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::protocol::guards::GuardProvider;
use crate::runtime::RuntimeFragment;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Evidence that the owner registered the allocation of one runtime fragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryRegistrationLease {
    /// Runtime fragment id.
    pub fragment_id: String,
    /// Worker.
    pub worker_id: String,
    /// Device.
    pub device: String,
    /// View address.
    pub address: u64,
    /// View size.
    pub nbytes: u64,
    /// Item size.
    pub itemsize: u64,
    /// View shape.
    pub local_shape: Vec<u64>,
    /// View strides.
    pub strides_bytes: Vec<u64>,
    /// Allocation base.
    pub storage_address: u64,
    /// Allocation size.
    pub storage_nbytes: u64,
    /// View offset in the allocation.
    pub storage_offset_bytes: u64,
    /// The binding generation the registration was made for.
    pub lease_generation: u64,
    /// The binding's runtime lease id.
    pub runtime_lease_id: Option<String>,
}

impl MemoryRegistrationLease {
    /// `from_fragment(fragment, lease_generation, runtime_lease_id)`.
    pub fn from_fragment(f: &RuntimeFragment, lease_generation: u64, runtime_lease_id: Option<&str>) -> Self {
        MemoryRegistrationLease {
            fragment_id: f.fragment_id().into(),
            worker_id: f.worker_id().into(),
            device: f.device().into(),
            address: f.address(),
            nbytes: f.nbytes(),
            itemsize: f.itemsize(),
            local_shape: f.local_shape().to_vec(),
            strides_bytes: f.strides_bytes().to_vec(),
            storage_address: f.storage_address(),
            storage_nbytes: f.storage_nbytes(),
            storage_offset_bytes: f.storage_offset_bytes(),
            lease_generation,
            runtime_lease_id: runtime_lease_id.map(str::to_string),
        }
    }

    /// The construction rules of §7.2 (contract errors): `registration lease
    /// identifiers must not be empty`, `registration lease values are invalid`,
    /// `registration lease tensor geometry is invalid`, `registration lease view
    /// address is invalid`, `registration lease view exceeds allocation`,
    /// `registration runtime_lease_id must be a non-empty string`.
    pub fn validate(&self) -> Result<()> {
        if self.fragment_id.is_empty() || self.worker_id.is_empty() || self.device.is_empty() {
            return invalid("registration lease identifiers must not be empty");
        }
        if self.address == 0
            || self.nbytes == 0
            || self.itemsize == 0
            || self.storage_address == 0
            || self.storage_nbytes == 0
        {
            return invalid("registration lease values are invalid");
        }
        if self.local_shape.is_empty()
            || self.local_shape.len() != self.strides_bytes.len()
            || self.local_shape.contains(&0)
            || self.strides_bytes.contains(&0)
        {
            return invalid("registration lease tensor geometry is invalid");
        }
        if self.storage_address.checked_add(self.storage_offset_bytes) != Some(self.address) {
            return invalid("registration lease view address is invalid");
        }
        if self.nbytes > self.storage_nbytes || self.storage_offset_bytes > self.storage_nbytes - self.nbytes {
            return invalid("registration lease view exceeds allocation");
        }
        if self.runtime_lease_id.as_deref() == Some("") {
            return invalid("registration runtime_lease_id must be a non-empty string");
        }
        Ok(())
    }

    fn matches(&self, f: &RuntimeFragment, generation: u64, lease_id: &str) -> bool {
        self.worker_id == f.worker_id()
            && self.device == f.device()
            && self.address == f.address()
            && self.nbytes == f.nbytes()
            && self.itemsize == f.itemsize()
            && self.local_shape == f.local_shape()
            && self.strides_bytes == f.strides_bytes()
            && self.storage_address == f.storage_address()
            && self.storage_nbytes == f.storage_nbytes()
            && self.storage_offset_bytes == f.storage_offset_bytes()
            && self.lease_generation == generation
            && self.runtime_lease_id.as_deref() == Some(lease_id)
    }
}

/// `registration_map(leases, label)`: leases by fragment id. Errors: `<label>
/// registration leases are required` (`None`), `duplicate <label> registration
/// lease: <id>`, and the construction rules.
pub(crate) fn registration_map<'a>(
    leases: Option<&'a [MemoryRegistrationLease]>,
    label: &str,
) -> std::result::Result<HashMap<&'a str, &'a MemoryRegistrationLease>, Error> {
    let leases = leases.ok_or_else(|| Error::invalid(format!("{label} registration leases are required")))?;
    let mut map = crate::fxhash::map_with_capacity(leases.len());
    for l in leases {
        l.validate()?;
        if map.insert(l.fragment_id.as_str(), l).is_some() {
            return invalid(format!("duplicate {label} registration lease: {}", l.fragment_id));
        }
    }
    Ok(map)
}

/// `validate_registration`: the lease for `f` must exist and equal it, with the
/// binding's generation and lease id (`<label> registration lease mismatch: <id>`).
pub(crate) fn validate_registration(
    f: &RuntimeFragment,
    map: &HashMap<&str, &MemoryRegistrationLease>,
    label: &str,
    generation: u64,
    lease_id: &str,
) -> std::result::Result<(), String> {
    match map.get(f.fragment_id()) {
        Some(l) if l.matches(f, generation, lease_id) => Ok(()),
        _ => Err(format!("{label} registration lease mismatch: {}", f.fragment_id())),
    }
}

/// Allocation guard providers of one side, keyed by `(instance_id, participant_id)`,
/// with an optional provider for every other key. Cheap to clone; thread-safe.
#[derive(Clone, Default)]
pub struct GuardProviders {
    by_key: BTreeMap<(String, String), Arc<dyn GuardProvider>>,
    fallback: Option<Arc<dyn GuardProvider>>,
}

impl std::fmt::Debug for GuardProviders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardProviders")
            .field("keys", &self.by_key.keys().collect::<Vec<_>>())
            .field("fallback", &self.fallback.is_some())
            .finish()
    }
}

impl GuardProviders {
    /// One provider for every `(instance, participant)`.
    pub fn all(provider: Arc<dyn GuardProvider>) -> Self {
        GuardProviders { by_key: BTreeMap::new(), fallback: Some(provider) }
    }
    /// Adds the provider of one key.
    pub fn with(mut self, instance_id: &str, participant_id: &str, provider: Arc<dyn GuardProvider>) -> Self {
        self.by_key.insert((instance_id.into(), participant_id.into()), provider);
        self
    }
    /// The provider of a key.
    pub fn get(&self, instance_id: &str, participant_id: &str) -> Option<&dyn GuardProvider> {
        self.get_arc(instance_id, participant_id).map(|p| &**p)
    }
    /// The provider of a key, shared (a prepared transfer keeps it for its steps).
    pub(crate) fn get_arc(&self, instance_id: &str, participant_id: &str) -> Option<&Arc<dyn GuardProvider>> {
        self.by_key.get(&(instance_id.to_string(), participant_id.to_string())).or(self.fallback.as_ref())
    }
}
