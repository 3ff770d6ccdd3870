//! Address-free contracts (`data-model.md`): ranks, axes, tensor descriptors,
//! placement fragments, topology, parts, the complete placement and the stored
//! manifest, with their canonical JSON and SHA-256 identities (`wire-format.md`).

mod axes;
mod digest;
pub mod keys;
mod manifest;
pub(crate) mod placement;
mod tensor;
pub(crate) mod typed;

pub use axes::{AxisKind, ParallelAxis, ParallelRank};
pub use keys::{encode_key_segment, stored_fragment_id, KeyLayout, DEFAULT_NAMESPACE};
pub(crate) use manifest::ManifestDocSeed;
pub use manifest::{StoredFragment, StoredFragmentSpec, StoredManifest, StoredManifestIdentity, StoredManifestSpec};
pub use placement::{
    BuilderFragment, FlatPlacementSpec, ParallelTopology, Placement, PlacementBuilder, PlacementBuilderSpec,
    PlacementFragment, PlacementFragmentSpec, PlacementPart, PlacementPartSpec, PlacementSpec, TopologyParticipant,
    TopologySpec,
};
pub use tensor::{TensorDescriptor, TensorSpec};

use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha256_hex_parts(&[bytes])
}

/// Lowercase hex SHA-256 of the concatenation of `parts`.
pub(crate) fn sha256_hex_parts(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    hex_of(h)
}

/// A map key for an interned id: a bijection of its address (so equal keys mean
/// the same allocation), mixed so that the low bits (aligned, equal stride in
/// an allocator's size class) do not crowd a hash table's buckets.
pub(crate) fn id_key(id: &std::sync::Arc<str>) -> u64 {
    let h = (id.as_ptr() as usize as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 32)
}

/// Asks the CPU to bring the cache line at `p` closer (a hint: no effect on
/// results). The serializers walk fragments in id order, which is not the order
/// their strings and vectors were allocated in: at a million fragments each of
/// those is a cache miss, so they prefetch a few fragments ahead.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes nothing architecturally visible,
    // whatever the address (SSE is part of the x86_64 baseline).
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// How many fragments ahead the serializers prefetch.
pub(crate) const PREFETCH_AHEAD: usize = 8;

/// Lowercase hex of a finished SHA-256 state.
pub(crate) fn hex_of(h: Sha256) -> String {
    let digest = h.finalize();
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
        out.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
    }
    out
}

/// True for exactly 64 characters of `0-9a-f`.
pub fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub(crate) fn non_empty(value: &str, field: &str) -> crate::Result<()> {
    if value.is_empty() {
        crate::error::invalid(format!("{field} must be a non-empty string"))
    } else {
        Ok(())
    }
}

/// Canonical row-major byte strides of `shape` with item size `itemsize`.
/// Saturates instead of overflowing (callers bound shapes first).
pub fn canonical_strides(shape: &[u64], itemsize: u64) -> Vec<u64> {
    let mut strides = vec![0u64; shape.len()];
    let mut acc = itemsize;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc = acc.saturating_mul(shape[d]);
    }
    strides
}
