//! Sparse delta codec for live weight sync (issue 47): the elements of a region that
//! changed since a base, encoded compactly, and applied to a buffer that holds that
//! base. Pure: slices in, bytes out, no I/O, no engine, no store.
//!
//! The source keeps a base (what the target verifiably holds). Each step, per region:
//! [`encode`] `(base, new)` appends an encoding to a buffer; the encoding moves to
//! the target; [`apply`] writes it into the target's buffer (which holds the base);
//! once the target has accepted it, the source applies the same encoding to its base
//! (base := new). A region whose changes would take more than a threshold of its
//! bytes (half by default, [`EncodeOptions`]) is encoded whole.
//!
//! The byte format (`docs/DELTA.md`): a 24-byte [`Header`] (magic `MWSD`, version
//! [`VERSION`], element size, kind, region length, body length), then either runs
//! (a varint gap of unchanged elements, a varint count, that many new values at the
//! element size) or the whole region. Nothing in it depends on the machine.
//!
//! Speed: the encoder compares 64-byte blocks into masks of changed elements
//! (AVX-512BW where the CPU has it, else SSE2 on x86-64, `u64` words elsewhere), a
//! chunk at a time, then writes the chunk's changes; the decoder checks the whole
//! encoding before it writes, so a malformed one leaves the target untouched. Both
//! run on the calling thread, and every function is safe to call from any number of
//! threads at once. Measured costs: `docs/DELTA.md`.
//!
//! ```
//! use mooncake_weight_store::delta;
//! let base = vec![0u8; 64];
//! let mut new = base.clone();
//! new[10] = 7; // element 5 of a bf16 region
//! let mut wire = Vec::new();
//! let stats = delta::encode(&base, &new, 2, &mut wire).unwrap();
//! assert_eq!((stats.changed_elements, stats.whole), (1, false));
//! let mut target = base.clone();
//! delta::apply(&wire, &mut target, 2).unwrap();
//! assert_eq!(target, new);
//! ```

mod apply;
mod encode;
mod format;

pub use apply::{apply, ApplyStats};
pub use encode::{encode, encode_with, EncodeOptions, EncodeStats};
pub use format::{Header, Kind, ELEMENT_SIZES, HEADER_LEN, MAGIC, VERSION};
