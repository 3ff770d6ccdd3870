//! Sparse delta steps of prepared readers (pull; issue 47): the source side
//! *publishes* each weight generation into an outbox of its own ([`DeltaPublisher`]),
//! the changed elements of every target executor it feeds encoded against what it
//! published before; a delta-enabled prepared reader
//! ([`PreparedTransfer::enable_delta_pull`](super::PreparedTransfer::enable_delta_pull))
//! reads the publication's header, pulls only the encoded changes when it holds the
//! publication's base, else every byte, applies them to its buffers and verifies the
//! content of every range it read against the publication's checksums before it
//! reports Updated.
//!
//! # When a reader pulls a delta (full whenever in doubt)
//!
//! The publisher keeps, per target executor, a *base*: a host copy of the bytes it
//! last published for it and their generation. Each [`DeltaPublisher::publish`]
//! encodes the changes against that base when there is one and they fit the
//! executor's slot of the outbox, writes the checksums of the new bytes, and makes
//! them the new base. The reader keeps, per source executor, the generation its
//! ranges of that source hold, verified by content and untouched since. A step of
//! generation `g` pulls a delta from a source endpoint only when every publication
//! there is of `g`, carries a delta, and its base is the generation the reader holds
//! of that source; otherwise every byte at that endpoint (the first step, a reader
//! that restarted, a step that failed or was torn, a generation skipped, a
//! publication without a delta). A new layout is a new plan: a new publisher and
//! new readers, full again.
//!
//! Every step of a delta-enabled reader is content-verified: a publication of
//! another generation (not yet published, or already replaced) or of another plan
//! fails the step before any byte of the targets moves (`Unchanged`); a mismatch
//! after the bytes moved (a delta on a base that was changed behind the reader's
//! back, a source written after it published, a torn read of a publication being
//! replaced) fails the step with the ranges' sources named, the target `Torn`, and
//! the next step full.
//!
//! # The outbox
//!
//! One host buffer of the source side, registered with the source's engine (the
//! publisher allocates it), split among the target executors the source executor
//! feeds, in (participant, worker) order and in proportion to the bytes it feeds
//! each ([`outbox_slot`]). A slot holds a
//! [`PUBLICATION_HEADER_BYTES`]-byte header, then the records (as a pushed delta's:
//! per changed segment, `u64` LE segment ordinal, then one [`crate::delta`]
//! encoding). The header, integers little-endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0-3 | magic `MWSP` |
//! | 4 | version 1 |
//! | 5 | kind: 0 records follow (a delta), 1 no delta |
//! | 6-7 | reserved, 0 |
//! | 8-15 | weight generation of the published bytes |
//! | 16-23 | the delta's base generation (kind 0), else 0 |
//! | 24-31 | record bytes (kind 0), else 0 |
//! | 32-39 | bytes the target executor's operations of this source hold |
//! | 40-43 | checksum groups `n` ([`super::notify::content_groups`]) |
//! | 44-55 | the first 12 bytes of the plan identity (SHA-256) |
//! | 56-59 | reserved, 0 |
//! | 60-63 | CRC-32C of bytes 0-59 and of the checksums |
//! | 64-... | `n` CRC-32C of the new bytes, one per group of operations |
//!
//! The records are written before the header, but a reader may read while a
//! publication is being replaced; the checksums catch any mixture. Ordering is the
//! caller's: publish generation `g`, then let the readers step `g`, and publish
//! `g + 1` only after they are done (as the source's buffers themselves must stay
//! unchanged while readers pull them).
//!
//! # Memory and cost
//!
//! The publisher keeps per target executor a base (the bytes it feeds it, host
//! memory) and, when its sources are device memory, a second host buffer of that
//! size (each publication stages the device bytes there through the engine's device
//! engine, [`TransferEngine::device_engine`]); plus the outbox. A publication costs
//! one compare pass over the bytes (the encoder), the changes written into the base
//! and one CRC-32C pass over the new bytes. The reader keeps a staging buffer (its
//! slots, registered with its engine); a step costs a header read per source, the
//! records or every byte, the apply, and a content-check read of its ranges.

use super::delta::{zeroed, Base};
use super::device_bytes::check_reachable;
use super::notify::{content_checksums, content_groups, plan_identity};
use crate::device::DeviceEngine;
use crate::engine::{Direction, TransferBatch, TransferBatchRange, TransferEngine};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use crate::runtime::{MemoryKind, MemoryRegion};
use parking_lot::Mutex;
use std::sync::Arc;

pub use super::delta::{DeltaReport, TargetDelta};

/// Bytes of a publication's header at the start of each outbox slot (room for the
/// most checksum groups, [`super::notify::MAX_CONTENT_GROUPS`]).
pub const PUBLICATION_HEADER_BYTES: u64 = 64 + 4 * super::notify::MAX_CONTENT_GROUPS as u64;

const MAGIC: &[u8; 4] = b"MWSP";
const VERSION: u8 = 1;
/// Record bytes per target executor an outbox has at least.
const MIN_SLOT_RECORDS: u64 = 64;

/// A source executor's outbox for published delta steps: a host buffer of the
/// source side, registered with the source's engine, that the readers read
/// ([`DeltaPublisher::outbox`]; told to the readers out of band, as bindings are).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeltaOutbox {
    /// First byte (a source-side host address).
    pub address: u64,
    /// Bytes.
    pub capacity: u64,
}

/// Names the outbox of one source executor for a reader
/// ([`PreparedTransfer::enable_delta_pull`](super::PreparedTransfer::enable_delta_pull)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceOutbox<'a> {
    /// The source participant.
    pub participant_id: &'a str,
    /// The source executor's worker.
    pub worker_id: &'a str,
    /// Its outbox.
    pub outbox: DeltaOutbox,
}

/// The target executors `(participant, worker)` that `executor`'s operations feed
/// under `plan`, sorted, each with its operations (ascending).
fn readers_of(plan: &TransferPlan, executor: &ExecutorTransferPlan) -> Vec<((String, String), Vec<u32>)> {
    let mine: std::collections::BTreeSet<u32> = executor.operation_indices.iter().copied().collect();
    let mut out: Vec<((String, String), Vec<u32>)> = plan
        .executors(Side::Target)
        .iter()
        .map(|t| {
            let mut ops: Vec<u32> = t.operation_indices.iter().copied().filter(|i| mine.contains(i)).collect();
            ops.sort_unstable();
            ((t.participant_id.clone(), t.worker_id.clone()), ops)
        })
        .filter(|(_, ops)| !ops.is_empty())
        .collect();
    out.sort();
    out
}

/// The slot `(offset, len)` of target executor `reader` in the outbox of `capacity`
/// bytes of source executor `source` under `plan`. The outbox is split among the `n`
/// target executors the source feeds, in (participant, worker) order: each slot is
/// a [`PUBLICATION_HEADER_BYTES`] header and a share of the rest (`capacity - n *
/// header`) in proportion to the bytes the source feeds it. `None` when either is not
/// an executor of the plan, the source does not feed the reader, or the capacity is
/// under [`min_outbox_capacity`].
pub fn outbox_slot(
    plan: &TransferPlan,
    source: (&str, &str),
    reader: (&str, &str),
    capacity: u64,
) -> Option<(u64, u64)> {
    let e = plan.executors(Side::Source).iter().find(|e| e.participant_id == source.0 && e.worker_id == source.1)?;
    let readers = readers_of(plan, e);
    if capacity < MIN_SLOT_RECORDS.saturating_add(PUBLICATION_HEADER_BYTES).saturating_mul(readers.len() as u64) {
        return None;
    }
    let bytes =
        |ops: &[u32]| -> u128 { ops.iter().map(|&i| u128::from(plan.regions()[i as usize].total_bytes())).sum() };
    let k = readers.iter().position(|((p, w), _)| p == reader.0 && w == reader.1)?;
    let total: u128 = readers.iter().map(|(_, ops)| bytes(ops)).sum::<u128>().max(1);
    let before: u128 = readers[..k].iter().map(|(_, ops)| bytes(ops)).sum();
    let header = u128::from(PUBLICATION_HEADER_BYTES);
    let rest = u128::from(capacity) - header * readers.len() as u128;
    let (start, end) = (rest * before / total, rest * (before + bytes(&readers[k].1)) / total);
    Some(((header * k as u128 + start) as u64, (header + end - start) as u64))
}

/// The least outbox capacity of source executor `source` under `plan`: a header and
/// 64 bytes of records per target executor it feeds (0 when it is not a source
/// executor of the plan).
pub fn min_outbox_capacity(plan: &TransferPlan, source: (&str, &str)) -> u64 {
    let Some(e) = plan.executors(Side::Source).iter().find(|e| e.participant_id == source.0 && e.worker_id == source.1)
    else {
        return 0;
    };
    (PUBLICATION_HEADER_BYTES + MIN_SLOT_RECORDS) * readers_of(plan, e).len() as u64
}

/// The first 12 bytes of the plan identity (a publication is for one plan).
fn plan_tag(plan: &TransferPlan) -> [u8; 12] {
    let hex = plan_identity(plan);
    let mut tag = [0u8; 12];
    for (k, b) in tag.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).unwrap_or(0);
    }
    tag
}

/// A publication's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Publication {
    pub generation: u64,
    /// `Some((base, record bytes))`: a delta follows.
    pub delta: Option<(u64, u64)>,
    pub logical: u64,
    pub tag: [u8; 12],
    pub checksums: Vec<u32>,
}

impl Publication {
    fn header_crc(head: &[u8], sums: &[u8]) -> u32 {
        crate::crc::crc32c_append(crate::crc::crc32c_append(0, &head[..60]), sums)
    }

    /// Writes the header into `out` (at least [`PUBLICATION_HEADER_BYTES`]).
    fn write(&self, out: &mut [u8]) {
        let h = &mut out[..PUBLICATION_HEADER_BYTES as usize];
        h.fill(0);
        h[0..4].copy_from_slice(MAGIC);
        h[4] = VERSION;
        h[5] = if self.delta.is_some() { 0 } else { 1 };
        h[8..16].copy_from_slice(&self.generation.to_le_bytes());
        let (base, records) = self.delta.unwrap_or_default();
        h[16..24].copy_from_slice(&base.to_le_bytes());
        h[24..32].copy_from_slice(&records.to_le_bytes());
        h[32..40].copy_from_slice(&self.logical.to_le_bytes());
        h[40..44].copy_from_slice(&(self.checksums.len() as u32).to_le_bytes());
        h[44..56].copy_from_slice(&self.tag);
        for (k, c) in self.checksums.iter().enumerate() {
            h[64 + 4 * k..68 + 4 * k].copy_from_slice(&c.to_le_bytes());
        }
        let n = 64 + 4 * self.checksums.len();
        let crc = Self::header_crc(&h[..64], &h[64..n]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads a header. Errors (`InvalidArgument`, the reason): no publication (another
    /// magic), another version, a header whose checksum does not match (torn or
    /// corrupted), malformed fields.
    pub(crate) fn read(bytes: &[u8]) -> Result<Publication> {
        let h = bytes
            .get(..PUBLICATION_HEADER_BYTES as usize)
            .ok_or_else(|| Error::invalid("publication header truncated"))?;
        let u64_at = |k: usize| u64::from_le_bytes(h[k..k + 8].try_into().expect("8 bytes"));
        if &h[0..4] != MAGIC {
            return Err(Error::invalid("no publication in the outbox slot"));
        }
        if h[4] != VERSION {
            return Err(Error::invalid(format!("publication version {} (this library reads {VERSION})", h[4])));
        }
        let groups = u32::from_le_bytes(h[40..44].try_into().expect("4 bytes")) as usize;
        if groups > super::notify::MAX_CONTENT_GROUPS {
            return Err(Error::invalid(format!("publication header has {groups} checksum groups")));
        }
        let n = 64 + 4 * groups;
        let crc = u32::from_le_bytes(h[60..64].try_into().expect("4 bytes"));
        if crc != Self::header_crc(&h[..64], &h[64..n]) {
            return Err(Error::invalid("publication header checksum mismatch (torn or corrupted)"));
        }
        if h[5] > 1 || h[6] != 0 || h[7] != 0 || h[56..60] != [0; 4] {
            return Err(Error::invalid("publication header has an unknown kind or reserved bytes set"));
        }
        let delta = (h[5] == 0).then(|| (u64_at(16), u64_at(24)));
        Ok(Publication {
            generation: u64_at(8),
            delta,
            logical: u64_at(32),
            tag: h[44..56].try_into().expect("12 bytes"),
            checksums: (0..groups)
                .map(|k| u32::from_le_bytes(h[64 + 4 * k..68 + 4 * k].try_into().expect("4 bytes")))
                .collect(),
        })
    }
}

/// The content checksums of a base's bytes ([`content_checksums`] of its operations
/// as the target reads them: one CRC-32C per group of operations).
fn base_checksums(base: &Base, plan: &TransferPlan) -> Vec<u32> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for g in content_groups(base.ops.len()) {
        let mut crc = 0u32;
        for &i in &base.ops[g] {
            let n = plan.regions()[i as usize].total_bytes() as usize;
            crc = crate::crc::crc32c_append(crc, &base.base[at..at + n]);
            at += n;
        }
        out.push(crc);
    }
    out
}

/// What a publisher keeps of one target executor.
struct Fed {
    /// (participant, worker).
    reader: (String, String),
    base: Base,
    slot: (u64, u64),
}

struct PublisherState {
    fed: Vec<Fed>,
    /// Owned, registered with the engine until the close, never reallocated.
    outbox: Vec<u8>,
    registered: bool,
    closed: bool,
    last: Option<DeltaReport>,
}

/// The source side of pulled delta steps: publishes each weight generation of one
/// source executor for the target executors it feeds (see the module
/// documentation). Created on the source side with the bound plan (the readers'
/// plan), its source executor and its transfer engine; the readers learn its
/// [`Self::outbox`] out of band.
///
/// Thread safety: `Send + Sync`; [`Self::publish`] and [`Self::close`] take an
/// internal lock (one runs at a time). Dropping closes it.
pub struct DeltaPublisher {
    plan: TransferPlan,
    executor: (String, String),
    engine: Arc<dyn TransferEngine>,
    identity: u64,
    device: Option<Arc<dyn DeviceEngine>>,
    tag: [u8; 12],
    outbox: DeltaOutbox,
    state: Mutex<PublisherState>,
}

impl std::fmt::Debug for DeltaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaPublisher")
            .field("executor", &self.executor)
            .field("capacity", &self.outbox.capacity)
            .finish_non_exhaustive()
    }
}

impl DeltaPublisher {
    /// A publisher for the source executor of `participant` (its only one, or the
    /// one of `worker`) under the bound `plan`, with an outbox of `capacity` bytes
    /// (allocated here, registered with `engine` until the close, split among the
    /// target executors it feeds in proportion to their bytes, [`outbox_slot`]).
    /// Device source fragments are read through the engine's device engine
    /// ([`TransferEngine::device_engine`]). Nothing is published until
    /// [`Self::publish`]: a reader's step fails until then.
    ///
    /// Errors (nothing kept): `InvalidArgument`: not a source participant of the plan,
    /// several executors and no `worker` (or an unknown one), an executor that feeds
    /// no target, a capacity under [`min_outbox_capacity`]; `LimitExceeded`: a
    /// capacity that cannot be allocated; `Unsupported`: device source fragments
    /// while the engine has no device engine; `Store`: the engine refused to
    /// register the outbox or has no identity.
    pub fn new(
        plan: &TransferPlan,
        participant: &str,
        worker: Option<&str>,
        engine: Arc<dyn TransferEngine>,
        capacity: u64,
    ) -> Result<DeltaPublisher> {
        let mine: Vec<&ExecutorTransferPlan> = plan
            .executors(Side::Source)
            .iter()
            .filter(|e| e.participant_id == participant && worker.is_none_or(|w| e.worker_id == w))
            .collect();
        let executor = match mine[..] {
            [e] => e,
            [] => {
                return Err(Error::invalid(match worker {
                    None => format!("{participant} is not a source participant of this plan"),
                    Some(w) => format!("{participant} has no source executor of worker {w} in this plan"),
                }))
            }
            _ => {
                return Err(Error::invalid(format!(
                    "{participant} has {} source executors in this plan: name the worker",
                    mine.len()
                )))
            }
        };
        let identity = engine
            .identity()
            .map_err(|e| Error::new(ErrorKind::Store, format!("the transfer engine has no identity: {e}")))?;
        let device = engine.device_engine();
        let readers = readers_of(plan, executor);
        if readers.is_empty() {
            return Err(Error::invalid(format!("the source executor of {participant} feeds no target")));
        }
        let least = min_outbox_capacity(plan, (&executor.participant_id, &executor.worker_id));
        if capacity < least {
            return Err(Error::invalid(format!(
                "a delta outbox of {capacity} bytes is too small: the source executor of {participant} feeds {} target executors and needs at least {least} bytes",
                readers.len()
            )));
        }
        let mut fed = Vec::with_capacity(readers.len());
        for (reader, ops) in readers {
            let slot =
                outbox_slot(plan, (&executor.participant_id, &executor.worker_id), (&reader.0, &reader.1), capacity)
                    .unwrap_or_default();
            let base = Base::new(plan, reader.0.clone(), ops, device.as_deref())?;
            fed.push(Fed { reader, base, slot });
        }
        let outbox = zeroed(capacity, "the delta outbox")?;
        let region = MemoryRegion { address: outbox.as_ptr() as u64, len: capacity, kind: MemoryKind::Host };
        // SAFETY: the outbox is owned by this publisher, never reallocated, and
        // unregistered (`close`) before it is dropped.
        match unsafe { engine.register_memory(region) } {
            Ok(0) => {}
            Ok(c) => {
                return Err(Error::new(ErrorKind::Store, format!("registering the delta outbox failed: code {c}")))
            }
            Err(e) => {
                return Err(Error::new(ErrorKind::Store, format!("registering the delta outbox failed: {}", e.message)))
            }
        }
        Ok(DeltaPublisher {
            plan: plan.clone(),
            executor: (executor.participant_id.clone(), executor.worker_id.clone()),
            tag: plan_tag(plan),
            outbox: DeltaOutbox { address: region.address, capacity },
            engine,
            identity,
            device,
            state: Mutex::new(PublisherState { fed, outbox, registered: true, closed: false, last: None }),
        })
    }

    /// The outbox the readers read (tell it to them with the source executor's
    /// participant and worker, [`SourceOutbox`]).
    pub fn outbox(&self) -> DeltaOutbox {
        self.outbox
    }

    /// The source executor `(participant, worker)` it publishes.
    pub fn executor(&self) -> (&str, &str) {
        (&self.executor.0, &self.executor.1)
    }

    /// Publishes weight generation `weight_generation` (the bytes its source
    /// fragments hold now) for every target executor it feeds: per target executor,
    /// the changes against the base when there is one and they fit its slot (else no
    /// delta: its readers pull every byte), and the checksums of the new bytes; the
    /// new bytes become the base. Returns what it published (per target executor:
    /// `base_generation` `Some` for a delta, `wire_bytes` what a reader pulls of it:
    /// the header and records, or the header and every byte).
    ///
    /// Errors: a closed publisher or a restarted engine (`InvalidArgument`; the
    /// outbox is no longer registered), the device engine's (the publication is
    /// unchanged... its slots may hold a partial one: readers fail, never apply it).
    ///
    /// # Safety
    /// The source fragments of the executor are valid for reads (of their memory
    /// kind) at their planned addresses and not written during the call; nothing
    /// but readers reads the outbox meanwhile (a reader that does fails its step).
    pub unsafe fn publish(&self, weight_generation: u64) -> Result<DeltaReport> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(Error::invalid("the delta publisher is closed"));
        }
        if self.engine.identity().ok() != Some(self.identity) {
            return Err(Error::invalid("the transfer engine restarted since the delta publisher was made"));
        }
        let st = &mut *st;
        let mut report = DeltaReport { weight_generation, targets: Vec::with_capacity(st.fed.len()) };
        let mut scratch = Vec::new();
        let header = PUBLICATION_HEADER_BYTES as usize;
        for f in &mut st.fed {
            let slot = &mut st.outbox[f.slot.0 as usize..(f.slot.0 + f.slot.1) as usize];
            // Invalidate the slot first: a reader never takes a half-written
            // publication for the previous one.
            slot[..4].fill(0);
            // SAFETY: this function's contract.
            unsafe { f.base.stage(&self.plan, self.device.as_deref()) }?;
            let encoded = match f.base.generation {
                // SAFETY: this function's contract (staged above).
                Some(_) => unsafe { f.base.encode(&self.plan, &mut slot[header..], &mut scratch) }?,
                None => None,
            };
            let delta = match encoded {
                Some((n, changed)) => {
                    let base = f.base.generation.unwrap_or_default();
                    f.base.advance(&self.plan, &slot[header..header + n as usize], weight_generation)?;
                    Some((base, n, changed))
                }
                None => {
                    // SAFETY: this function's contract (staged above).
                    unsafe { f.base.refresh(&self.plan, weight_generation) }?;
                    None
                }
            };
            let p = Publication {
                generation: weight_generation,
                delta: delta.map(|(b, n, _)| (b, n)),
                logical: f.base.bytes,
                tag: self.tag,
                checksums: base_checksums(&f.base, &self.plan),
            };
            p.write(slot);
            report.targets.push(TargetDelta {
                participant_id: f.reader.0.clone(),
                base_generation: delta.map(|d| d.0),
                wire_bytes: PUBLICATION_HEADER_BYTES + delta.map_or(f.base.bytes, |d| d.1),
                logical_bytes: f.base.bytes,
                changed_elements: delta.map_or(0, |d| d.2),
            });
        }
        st.last = Some(report.clone());
        Ok(report)
    }

    /// What the last [`Self::publish`] published, `None` before the first.
    pub fn last_publication(&self) -> Option<DeltaReport> {
        self.state.lock().last.clone()
    }

    /// Unregisters the outbox (readers reading it from then on fail) and refuses
    /// later publications. Idempotent; also run on drop. A failed unregistration is
    /// logged (the outbox is then kept, never freed, so that the engine never writes
    /// or reads freed memory).
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        if !std::mem::take(&mut st.registered) {
            return;
        }
        if self.engine.identity().ok() != Some(self.identity) {
            return;
        }
        if !matches!(self.engine.unregister_memory(self.outbox.address), Ok(0)) {
            log::warn!("unregistering a delta outbox failed; its memory is kept");
            std::mem::forget(std::mem::take(&mut st.outbox));
        }
    }
}

impl Drop for DeltaPublisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// What a reader keeps of one source executor it reads.
struct Pulled {
    source: (String, String),
    /// The operations of the source into the reader's executor, ascending.
    ops: Vec<u32>,
    planned: u64,
    bytes: u64,
    outbox: DeltaOutbox,
    slot: (u64, u64),
    /// Offset of this source's area (`slot.1` bytes) in the staging buffer.
    at: usize,
    /// The generation the reader's ranges of this source hold, verified.
    held: Option<u64>,
}

/// The staging buffer of a reader: registered with its engine; an `Arc` so that a
/// pending transfer can keep it alive while DMA may still write it.
pub(crate) struct Staging {
    bytes: Mutex<Vec<u8>>,
    address: u64,
    len: u64,
}

impl Staging {
    fn region(&self) -> MemoryRegion {
        MemoryRegion { address: self.address, len: self.len, kind: MemoryKind::Host }
    }
}

/// How a step treats one source.
#[derive(Clone, Debug)]
pub(crate) enum PullPlan {
    /// Records of `bytes` on base `base`, then verify.
    Delta { base: u64, bytes: u64 },
    /// Every byte, then verify.
    Full,
}

/// A delta-enabled reader's step, between its header reads and its end.
pub(crate) struct PullStep {
    pub generation: u64,
    /// Per source (as [`DeltaPull::sources`]): its plan and the publication's checksums.
    plans: Vec<(PullPlan, Vec<u32>)>,
}

/// The reader side of pulled delta steps of one prepared reader.
pub(crate) struct DeltaPull {
    sources: Vec<Pulled>,
    /// Per prepared endpoint, indices into `sources`.
    by_endpoint: Vec<Vec<usize>>,
    staging: Arc<Staging>,
    registered: bool,
    tag: [u8; 12],
    device: Option<Arc<dyn DeviceEngine>>,
    participant: String,
}

/// A delta batch of a step: (batch, planned segments, bytes it leaves).
pub(crate) type PullBatch = (Option<TransferBatch>, u64, u64);

impl DeltaPull {
    /// Sets up pulled delta steps of the reader executor `reader` of `plan` whose
    /// batches read from `endpoints` (the prepared ones, in order): per source
    /// executor it reads, its outbox slot, and one registered staging buffer.
    /// Errors (`InvalidArgument` unless named): a source executor without an outbox,
    /// an outbox named twice, an outbox under [`min_outbox_capacity`], a
    /// source read at an endpoint without prepared batches, device target memory
    /// without a device engine (`Unsupported`), a staging buffer that cannot be
    /// allocated (`LimitExceeded`), a refused registration (`Store`).
    pub(crate) fn new(
        plan: &TransferPlan,
        reader: &ExecutorTransferPlan,
        endpoints: &[String],
        outboxes: &[SourceOutbox<'_>],
        engine: &dyn TransferEngine,
    ) -> Result<DeltaPull> {
        let device = engine.device_engine();
        let mut given = std::collections::BTreeMap::new();
        for o in outboxes {
            if given.insert((o.participant_id, o.worker_id), o.outbox).is_some() {
                return Err(Error::invalid(format!(
                    "delta outbox of source executor ({}, {}) given twice",
                    o.participant_id, o.worker_id
                )));
            }
        }
        let mine: std::collections::BTreeSet<u32> = reader.operation_indices.iter().copied().collect();
        let mut sources = Vec::new();
        let mut by_endpoint = vec![Vec::new(); endpoints.len()];
        let mut at = 0usize;
        let me = (reader.participant_id.as_str(), reader.worker_id.as_str());
        for e in plan.executors(Side::Source) {
            let mut ops: Vec<u32> = e.operation_indices.iter().copied().filter(|i| mine.contains(i)).collect();
            if ops.is_empty() {
                continue;
            }
            ops.sort_unstable();
            check_reachable(plan, &ops, Side::Target, device.as_deref(), "delta steps")?;
            let key = (e.participant_id.as_str(), e.worker_id.as_str());
            let Some(outbox) = given.get(&key).copied() else {
                return Err(Error::invalid(format!(
                    "no delta outbox for source executor ({}, {})",
                    e.participant_id, e.worker_id
                )));
            };
            let Some(slot) = outbox_slot(plan, key, me, outbox.capacity) else {
                return Err(Error::invalid(format!(
                    "the delta outbox of source executor ({}, {}) ({} bytes) is under its least capacity of {} bytes",
                    e.participant_id,
                    e.worker_id,
                    outbox.capacity,
                    min_outbox_capacity(plan, key)
                )));
            };
            let endpoint = plan.operation_fragment(ops[0] as usize, Side::Source).1.endpoint();
            let Some(k) = endpoints.iter().position(|x| x == endpoint) else {
                return Err(Error::invalid(format!(
                    "source executor ({}, {})'s endpoint {endpoint} has no prepared batches",
                    e.participant_id, e.worker_id
                )));
            };
            if ops.iter().any(|&i| plan.operation_fragment(i as usize, Side::Source).1.endpoint() != endpoint) {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "source executor ({}, {}) is read at several endpoints: pulled delta steps need one",
                        e.participant_id, e.worker_id
                    ),
                ));
            }
            by_endpoint[k].push(sources.len());
            sources.push(Pulled {
                source: (e.participant_id.clone(), e.worker_id.clone()),
                planned: ops.iter().map(|&i| plan.regions()[i as usize].segment_count()).sum(),
                bytes: ops.iter().map(|&i| plan.regions()[i as usize].total_bytes()).sum(),
                ops,
                outbox,
                slot,
                at,
                held: None,
            });
            at = usize::try_from(slot.1).ok().and_then(|n| at.checked_add(n)).ok_or_else(|| {
                Error::new(
                    ErrorKind::LimitExceeded,
                    "the delta outboxes' slots of this reader exceed the address space",
                )
            })?;
        }
        let buf = zeroed(at.max(1) as u64, "the delta staging buffer")?;
        let staging = Arc::new(Staging { address: buf.as_ptr() as u64, len: buf.len() as u64, bytes: Mutex::new(buf) });
        // SAFETY: the staging buffer is owned by this reader (kept alive by a pending
        // transfer while DMA may write it), never reallocated, and unregistered
        // before it is dropped.
        match unsafe { engine.register_memory(staging.region()) } {
            Ok(0) => {}
            Ok(c) => {
                return Err(Error::new(ErrorKind::Store, format!("registering the delta staging failed: code {c}")))
            }
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::Store,
                    format!("registering the delta staging failed: {}", e.message),
                ))
            }
        }
        Ok(DeltaPull {
            sources,
            by_endpoint,
            staging,
            registered: true,
            tag: plan_tag(plan),
            device,
            participant: reader.participant_id.clone(),
        })
    }

    /// The staging buffer (a resource a pending transfer keeps alive).
    pub(crate) fn staging(&self) -> Arc<Staging> {
        self.staging.clone()
    }

    /// Unregisters the staging buffer (unless a pending transfer took it over:
    /// `handed`).
    pub(crate) fn close(&mut self, engine: &dyn TransferEngine, handed: bool) {
        if std::mem::take(&mut self.registered)
            && !handed
            && !matches!(engine.unregister_memory(self.staging.address), Ok(0))
        {
            log::warn!("unregistering a delta staging buffer failed");
        }
    }

    /// The registration a pending transfer takes over (the staging's address), once.
    pub(crate) fn hand_over(&mut self) -> Option<u64> {
        std::mem::take(&mut self.registered).then_some(self.staging.address)
    }

    /// The header reads of a step: one batch per endpoint with sources, reading each
    /// source's header into its staging area.
    pub(crate) fn header_batches(&self, endpoints: &[String]) -> Result<Vec<TransferBatch>> {
        let mut out = Vec::new();
        for (k, idx) in self.by_endpoint.iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let ranges = idx
                .iter()
                .map(|&s| {
                    let s = &self.sources[s];
                    self.range(s, 0, PUBLICATION_HEADER_BYTES)
                })
                .collect();
            out.push(TransferBatch::from_ranges(&endpoints[k], Direction::Read, ranges)?);
        }
        Ok(out)
    }

    fn range(&self, s: &Pulled, offset: u64, len: u64) -> TransferBatchRange {
        TransferBatchRange {
            source_base_address: s.outbox.address,
            source_capacity: s.outbox.capacity,
            target_base_address: self.staging.address,
            target_capacity: self.staging.len,
            source_offsets: vec![s.slot.0 + offset],
            target_offsets: vec![s.at as u64 + offset],
            sizes: vec![len],
        }
    }

    /// Plans a step of `generation` from the headers read into the staging: per
    /// endpoint, `Some(batches)` (every source there pulls a delta: one records read
    /// each) or `None` (the prepared batches). Errors (`Conflict`, before any target
    /// byte moves): a source without a valid publication of `generation` under this
    /// plan, named.
    pub(crate) fn plan_step(
        &mut self,
        generation: u64,
        endpoints: &[String],
    ) -> Result<(PullStep, Vec<Option<Vec<PullBatch>>>)> {
        let staging = self.staging.bytes.lock();
        let mut plans = Vec::with_capacity(self.sources.len());
        for s in &self.sources {
            let head = &staging[s.at..s.at + PUBLICATION_HEADER_BYTES as usize];
            let who = format!("source executor ({}, {})", s.source.0, s.source.1);
            let p = Publication::read(head).map_err(|e| {
                Error::new(
                    ErrorKind::Conflict,
                    format!("{who} has no readable publication ({}): publish before the readers step", e.message()),
                )
            })?;
            if p.tag != self.tag {
                return Err(Error::new(ErrorKind::Conflict, format!("{who} published for another plan")));
            }
            if p.generation != generation {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "{who} published generation {}, not {generation}: publish each generation before its readers step",
                        p.generation
                    ),
                ));
            }
            if p.logical != s.bytes || p.checksums.len() != content_groups(s.ops.len()).len() {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!("{who}'s publication does not match this reader's operations"),
                ));
            }
            let plan = match p.delta {
                Some((base, bytes)) if s.held == Some(base) && bytes <= s.slot.1 - PUBLICATION_HEADER_BYTES => {
                    PullPlan::Delta { base, bytes }
                }
                _ => PullPlan::Full,
            };
            plans.push((plan, p.checksums));
        }
        drop(staging);
        let mut over = Vec::with_capacity(endpoints.len());
        for (k, idx) in self.by_endpoint.iter().enumerate() {
            let delta = !idx.is_empty() && idx.iter().all(|&s| matches!(plans[s].0, PullPlan::Delta { .. }));
            if !delta {
                for &s in idx {
                    plans[s].0 = PullPlan::Full;
                }
                over.push(None);
                continue;
            }
            let mut batches = Vec::with_capacity(idx.len());
            for &s in idx {
                let src = &self.sources[s];
                let PullPlan::Delta { bytes, .. } = plans[s].0 else { unreachable!("every source here pulls a delta") };
                let batch = if bytes == 0 {
                    None
                } else {
                    let r = self.range(src, PUBLICATION_HEADER_BYTES, bytes);
                    Some(TransferBatch::from_ranges(&endpoints[k], Direction::Read, vec![r])?)
                };
                batches.push((batch, src.planned, src.bytes));
            }
            over.push(Some(batches));
        }
        // A step under way: nothing is held until it verified.
        for s in &mut self.sources {
            s.held = None;
        }
        Ok((PullStep { generation, plans }, over))
    }

    /// The end of a step whose batches all completed: applies the deltas, then
    /// verifies every source's ranges against its publication's checksums; each
    /// source that matches is held at the step's generation. Returns the report, or
    /// the error naming the sources that did not match (`Integrity`) or the first
    /// apply error (the target is torn either way).
    ///
    /// # Safety
    /// The reader's target fragments are valid for reads and writes (of their
    /// memory kind) and nobody else accesses them during the call.
    pub(crate) unsafe fn finish(&mut self, plan: &TransferPlan, step: &PullStep) -> Result<DeltaReport> {
        let staging = self.staging.bytes.lock();
        let mut failed = Vec::new();
        let mut first_error = None;
        let (mut wire, mut changed, mut logical) = (0u64, 0u64, 0u64);
        let mut bases = std::collections::BTreeSet::new();
        for (s, (how, sums)) in self.sources.iter().zip(&step.plans) {
            wire += PUBLICATION_HEADER_BYTES;
            logical += s.bytes;
            let applied = match how {
                PullPlan::Delta { base, bytes } => {
                    wire += bytes;
                    bases.insert(Some(*base));
                    let at = s.at + PUBLICATION_HEADER_BYTES as usize;
                    let records = &staging[at..at + *bytes as usize];
                    // SAFETY: this function's contract.
                    unsafe { super::delta::apply_to_target(plan, &s.ops, records, self.device.as_deref()) }
                }
                PullPlan::Full => {
                    wire += s.bytes;
                    bases.insert(None);
                    Ok(0)
                }
            };
            let verified = applied.and_then(|n| {
                changed += n;
                // SAFETY: this function's contract.
                let got = unsafe { content_checksums(plan, &s.ops, Side::Target, self.device.as_deref()) }?;
                Ok(got == *sums)
            });
            match verified {
                Ok(true) => {}
                Ok(false) => failed.push(format!("({}, {})", s.source.0, s.source.1)),
                Err(e) => {
                    failed.push(format!("({}, {})", s.source.0, s.source.1));
                    first_error.get_or_insert(e);
                }
            }
        }
        drop(staging);
        if let Some(e) = first_error {
            return Err(e.context("applying a pulled delta: "));
        }
        if !failed.is_empty() {
            return Err(Error::new(
                ErrorKind::Integrity,
                format!(
                    "the content of {} read from source executors {} does not match their publication of generation {} (torn; the next step pulls every byte)",
                    self.participant,
                    failed.join(", "),
                    step.generation
                ),
            ));
        }
        for s in &mut self.sources {
            s.held = Some(step.generation);
        }
        let base = match (bases.len(), bases.first()) {
            (1, Some(b)) => *b,
            _ => None,
        };
        Ok(DeltaReport {
            weight_generation: step.generation,
            targets: vec![TargetDelta {
                participant_id: self.participant.clone(),
                base_generation: base,
                wire_bytes: wire,
                logical_bytes: logical,
                changed_elements: changed,
            }],
        })
    }

    /// The generation the reader's bytes hold, verified: `Some(g)` when every
    /// source's ranges hold `g`.
    pub(crate) fn held_generation(&self) -> Option<u64> {
        let first = self.sources.first()?.held?;
        self.sources.iter().all(|s| s.held == Some(first)).then_some(first)
    }

    /// Forgets what the reader holds (a failed step).
    pub(crate) fn forget(&mut self) {
        for s in &mut self.sources {
            s.held = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publication_header_reads_back_and_refuses_damage() {
        let p = Publication {
            generation: 7,
            delta: Some((6, 1234)),
            logical: 99,
            tag: [3; 12],
            checksums: vec![1, 2, 0xdead_beef],
        };
        let mut buf = vec![0u8; PUBLICATION_HEADER_BYTES as usize];
        p.write(&mut buf);
        assert_eq!(Publication::read(&buf).unwrap(), p);
        let full = Publication { delta: None, ..p.clone() };
        full.write(&mut buf);
        assert_eq!(Publication::read(&buf).unwrap(), full);
        for k in [0usize, 4, 5, 9, 17, 25, 33, 41, 45, 57, 61, 64, 68, 72] {
            let mut bad = buf.clone();
            bad[k] ^= 1;
            let e = Publication::read(&bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "byte {k}: {e}");
        }
        assert!(Publication::read(&buf[..10]).unwrap_err().message().contains("truncated"));
        assert!(Publication::read(&vec![0u8; 320]).unwrap_err().message().contains("no publication"));
    }
}
