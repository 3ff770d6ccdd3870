//! Sparse delta steps of a prepared push (issue 47): after a full, content-verified
//! step, each step moves only the elements that changed since what the target
//! verifiably holds, encoded with [`crate::delta`], into a staging area of the
//! target (its [`DeltaInbox`]); the target's acceptor applies them to its buffers,
//! then verifies the content checksums of every written range before it reports
//! Updated.
//!
//! # When a delta is sent (full whenever in doubt)
//!
//! Per target participant, the source keeps a *base*: a host copy of every byte it
//! last sent into that target (the concatenated segments of its operations into it,
//! in operation and row-major order), and the weight generation of those bytes. A
//! step sends a target a delta only when the caller says the target verifiably holds
//! exactly that generation ([`super::StepArgs::delta`], what the target's acceptor
//! reports, [`super::NotifyAcceptor::held_generation`]); otherwise (the first step,
//! a target that restarted, reported Torn or Unchanged, or holds another
//! generation) the step is full for it. A target endpoint goes delta only when every
//! target the executor writes there does and every encoding fits the writer's slot
//! of the inbox; else the whole endpoint goes full. Every step, delta or full, makes
//! the sent bytes the new base (the base's generation is the step's: a target that
//! does not confirm it gets a full step next).
//!
//! The target refuses a delta whose base generation is not the one its bytes hold
//! (verified by content, and untouched since: a full `begin` forgets it), and its
//! content check catches a delta applied to a base that was changed behind its back
//! (`Torn`, with the ranges named). A delta can never be reported Updated on wrong
//! bytes: the checksums are computed by the source from its new bytes.
//!
//! # The wire
//!
//! The writer's slot of the inbox (the inbox split evenly among the plan's writers
//! into the target, in (participant, worker) order, [`inbox_slot`]) receives, per
//! segment that changed, `u64` LE segment ordinal (in the order above), then one
//! [`crate::delta`] encoding of that segment (self-delimiting: its header gives its
//! length). The `done` (and `begin`) of a delta step carries
//! `"delta":{"base":<generation>,"bytes":<slot bytes used>}`.
//!
//! # Memory and cost
//!
//! The source keeps one base (the bytes it sends, on the host) and one outbox (the
//! size of its slot, registered with its engine) per target; the target keeps its
//! inbox. A delta step costs the source one compare pass over the bytes (encode) and
//! a write of the changed elements into the base; the target one pass applying the
//! changes and the content check's read.
//!
//! # Device memory
//!
//! The bases, outboxes and inboxes are host memory; the weights may be device
//! memory, reached only through a device copy engine ([`super::device_bytes`]):
//! the source's engine's ([`TransferEngine::device_engine`]), the target acceptor's
//! ([`super::NotifyAcceptor::use_device_engine`]). A device source's bytes are
//! gathered into a second host buffer the size of the base at each step (the
//! encoder compares it with the base; it becomes the base once sent: a swap, no
//! copy). A device target's changed segments are gathered into host memory, the
//! delta applied there, and copied back; its content check reads the device ranges
//! back through the engine, so what is reported Updated is what the device holds.

use super::device_bytes::{check_reachable, copy_ops, for_each_segment, gather, memory, scatter};
use crate::delta::{self, Header};
use crate::device::DeviceEngine;
use crate::engine::{Direction, TransferBatch, TransferBatchRange, TransferEngine};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use crate::runtime::{MemoryKind, MemoryRegion};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The `delta` member of a delta step's notify messages: the target generation the
/// delta applies to and the bytes of the writer's inbox slot it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyDelta {
    /// The weight generation the target must hold (verified) for the delta to apply.
    pub base: u64,
    /// Bytes of the writer's slot of the target's inbox holding the encoded delta.
    pub bytes: u64,
}

/// The staging area of a target participant for delta steps: a host buffer of the
/// target side, registered with the target's engine, that the sources write their
/// encoded deltas into (each writer its own slot, [`inbox_slot`]). Its owner (the
/// target) keeps it valid and registered while deltas may arrive; the sources learn
/// it out of band, as they learn the bindings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeltaInbox {
    /// First byte (a target-side host address).
    pub address: u64,
    /// Bytes.
    pub capacity: u64,
}

/// What a caller says a target verifiably holds (the generation its acceptor
/// reported Updated with content verified, [`super::NotifyAcceptor::held_generation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetHeld<'a> {
    /// The target participant.
    pub participant_id: &'a str,
    /// The weight generation its bytes hold.
    pub weight_generation: u64,
}

/// How one target was updated by the last step ([`DeltaReport`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetDelta {
    /// The target participant.
    pub participant_id: String,
    /// `Some(base)`: a delta on base generation `base`; `None`: full.
    pub base_generation: Option<u64>,
    /// Bytes moved into the target (the encoded deltas, or every byte when full).
    pub wire_bytes: u64,
    /// Bytes the target holds after the step (what a full step moves).
    pub logical_bytes: u64,
    /// Elements that changed (0 when full).
    pub changed_elements: u64,
}

/// What the last step of a delta-enabled prepared transfer sent each target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeltaReport {
    /// The step's weight generation.
    pub weight_generation: u64,
    /// Per target the executor writes, sorted.
    pub targets: Vec<TargetDelta>,
}

impl DeltaReport {
    /// Bytes moved in all.
    pub fn wire_bytes(&self) -> u64 {
        self.targets.iter().map(|t| t.wire_bytes).sum()
    }
    /// Bytes the targets hold after the step.
    pub fn logical_bytes(&self) -> u64 {
        self.targets.iter().map(|t| t.logical_bytes).sum()
    }
}

/// The writers into `participant` under `plan`, in slot order.
fn writers_into(plan: &TransferPlan, participant: &str) -> Vec<(String, String)> {
    let mut w: Vec<(String, String)> = super::outcome::calls_of(plan, super::TransferMode::Sink, participant)
        .into_iter()
        .map(|e| (e.participant_id.clone(), e.worker_id.clone()))
        .collect();
    w.sort();
    w.dedup();
    w
}

/// The slot `(offset, len)` of writer `(participant, worker)` in an inbox of
/// `capacity` bytes of target `target`: the inbox split evenly among the plan's
/// writers into the target, in (participant, worker) order. `None` when it is not a
/// writer of the target.
pub fn inbox_slot(plan: &TransferPlan, target: &str, writer: (&str, &str), capacity: u64) -> Option<(u64, u64)> {
    let w = writers_into(plan, target);
    let k = w.iter().position(|(p, wk)| p == writer.0 && wk == writer.1)? as u128;
    let n = w.len() as u128;
    let c = u128::from(capacity);
    let (start, end) = (k * c / n, (k + 1) * c / n);
    Some((start as u64, (end - start) as u64))
}

/// The element size the codec encodes operation `i` in (its tensor's, when the
/// codec has it and the segments are whole elements; else bytes).
pub(crate) fn element_size(plan: &TransferPlan, i: usize) -> usize {
    let es = plan.operation_fragment(i, Side::Source).1.itemsize() as usize;
    let inner = plan.regions()[i].inner_bytes as usize;
    if delta::ELEMENT_SIZES.contains(&es) && inner.is_multiple_of(es) {
        es
    } else {
        1
    }
}

/// `n` zero bytes, or `LimitExceeded` when they cannot be allocated (a capacity
/// from the caller is never trusted to fit in memory).
pub(crate) fn zeroed(n: u64, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    usize::try_from(n)
        .ok()
        .and_then(|n| v.try_reserve_exact(n).ok())
        .ok_or_else(|| Error::new(ErrorKind::LimitExceeded, format!("{what} of {n} bytes cannot be allocated")))?;
    v.resize(n as usize, 0);
    Ok(v)
}

/// The bytes a source last sent (or published) into one target: the concatenated
/// segments of its operations into it, in operation and row-major order
/// ([`for_each_segment`]), on the host, and their weight generation. Shared by the
/// pushed ([`DeltaSource`]) and the published ([`super::delta_pull::DeltaPublisher`])
/// delta steps.
pub(crate) struct Base {
    pub participant: String,
    /// The operations into the target, ascending.
    pub ops: Vec<u32>,
    /// Planned segments and bytes of `ops`.
    pub planned: u64,
    pub bytes: u64,
    pub base: Vec<u8>,
    pub generation: Option<u64>,
    /// When some of `ops` are device memory: the step's new bytes, staged on the
    /// host in the base's layout (swapped with the base once sent).
    staged: Option<Vec<u8>>,
}

impl Base {
    /// The base of `ops` (ascending) into `participant`, empty (no generation).
    /// Errors (`Unsupported`): a device source fragment without a device engine.
    pub(crate) fn new(
        plan: &TransferPlan,
        participant: String,
        ops: Vec<u32>,
        device: Option<&dyn DeviceEngine>,
    ) -> Result<Base> {
        check_reachable(plan, &ops, Side::Source, device, "delta steps")?;
        let on_device = ops.iter().any(|&i| memory(plan, i as usize, Side::Source) != MemoryKind::Host);
        let planned = ops.iter().map(|&i| plan.regions()[i as usize].segment_count()).sum();
        let bytes: u64 = ops.iter().map(|&i| plan.regions()[i as usize].total_bytes()).sum();
        Ok(Base {
            participant,
            ops,
            planned,
            bytes,
            base: vec![0; bytes as usize],
            generation: None,
            staged: on_device.then(|| vec![0; bytes as usize]),
        })
    }

    /// Stages the new bytes on the host when some sources are device memory (host
    /// sources copied, device ones gathered through `device`, one batch per
    /// operation); nothing otherwise.
    ///
    /// # Safety
    /// The source fragments of `ops` are valid for reads (of their memory kind) and
    /// not written during the call.
    pub(crate) unsafe fn stage(&mut self, plan: &TransferPlan, device: Option<&dyn DeviceEngine>) -> Result<()> {
        let Some(staged) = &mut self.staged else { return Ok(()) };
        // SAFETY: this function's contract.
        unsafe { copy_ops(plan, &self.ops, Side::Source, device, staged) }
    }

    /// Encodes the segments that changed against the base into `out` (records: `u64`
    /// LE segment ordinal, then one encoding): `Some((bytes, changed elements))`, or
    /// `None` when they do not fit `out`.
    ///
    /// # Safety
    /// As [`Self::stage`] (called before, for staged bases).
    pub(crate) unsafe fn encode(
        &self,
        plan: &TransferPlan,
        out: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> Result<Option<(u64, u64)>> {
        let (mut used, mut changed, mut ordinal, mut at) = (0usize, 0u64, 0u64, 0usize);
        let mut err = None;
        let mut overflow = false;
        for &i in &self.ops {
            let es = element_size(plan, i as usize);
            for_each_segment(plan, i as usize, Side::Source, |addr, len| {
                if err.is_some() || overflow {
                    return;
                }
                let len = len as usize;
                let new = match &self.staged {
                    Some(staged) => &staged[at..at + len],
                    // SAFETY: this function's contract: the segment lies in a host
                    // source fragment valid for reads (the bound plan's regions are
                    // checked against the fragments' extents).
                    None => unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) },
                };
                let base = &self.base[at..at + len];
                at += len;
                let this = ordinal;
                ordinal += 1;
                if base == new {
                    return;
                }
                scratch.clear();
                scratch.extend_from_slice(&this.to_le_bytes());
                match delta::encode(base, new, es, scratch) {
                    Ok(s) => {
                        changed += s.changed_elements as u64;
                        if used + scratch.len() > out.len() {
                            overflow = true;
                            return;
                        }
                        out[used..used + scratch.len()].copy_from_slice(scratch);
                        used += scratch.len();
                    }
                    Err(e) => err = Some(e),
                }
            });
        }
        if let Some(e) = err {
            return Err(e);
        }
        Ok((!overflow).then_some((used as u64, changed)))
    }

    /// Applies `records` (what [`Self::encode`] wrote) to the base (base := new; a
    /// staged base swaps its staged bytes in instead) and moves it to `generation`.
    pub(crate) fn advance(&mut self, plan: &TransferPlan, records: &[u8], generation: u64) -> Result<()> {
        self.generation = Some(generation);
        if let Some(staged) = &mut self.staged {
            std::mem::swap(&mut self.base, staged);
            return Ok(());
        }
        let mut starts = Vec::new();
        let mut at = 0u64;
        for &i in &self.ops {
            let es = element_size(plan, i as usize);
            for_each_segment(plan, i as usize, Side::Source, |_, len| {
                starts.push((at, len, es));
                at += len;
            });
        }
        let base = &mut self.base;
        for_each_record(records, starts.len() as u64, |ordinal, enc| {
            let (off, len, es) = starts[ordinal as usize];
            delta::apply(enc, &mut base[off as usize..(off + len) as usize], es).map(|_| ())
        })
    }

    /// Makes the base the source bytes of `generation` (a full step): the staged
    /// bytes swapped in, or host sources copied.
    ///
    /// # Safety
    /// As [`Self::stage`] (called before, for staged bases).
    pub(crate) unsafe fn refresh(&mut self, plan: &TransferPlan, generation: u64) -> Result<()> {
        self.generation = Some(generation);
        match &mut self.staged {
            Some(staged) => {
                std::mem::swap(&mut self.base, staged);
                Ok(())
            }
            // SAFETY: this function's contract; an unstaged base's sources are host memory.
            None => unsafe { copy_ops(plan, &self.ops, Side::Source, None, &mut self.base) },
        }
    }
}

/// The source's state of one target of a push.
struct TargetBase {
    base: Base,
    inbox: DeltaInbox,
    slot: (u64, u64),
    /// The encoded deltas of a step; `slot.1` bytes, registered, never reallocated.
    outbox: Vec<u8>,
}

/// A delta or full step's plan of one endpoint.
pub(crate) struct DeltaBatch {
    /// `None`: nothing changed (nothing to move).
    pub batch: Option<TransferBatch>,
    pub planned: u64,
    pub logical: u64,
}

/// What a step of a delta-enabled transfer does.
pub(crate) struct StepDelta {
    /// Per prepared endpoint: `Some` (delta batches) or `None` (its prepared batches).
    pub endpoints: Vec<Option<Vec<DeltaBatch>>>,
    /// The `delta` member of the messages to each delta target.
    pub messages: BTreeMap<String, NotifyDelta>,
    pub report: DeltaReport,
}

/// The source side of delta steps of one prepared sink.
pub(crate) struct DeltaSource {
    targets: Vec<TargetBase>,
    /// The prepared endpoints, in order.
    endpoints: Vec<String>,
    /// Per prepared endpoint, the indices into `targets` written there.
    by_endpoint: Vec<Vec<usize>>,
    /// The outboxes registered with the engine.
    registered: Vec<u64>,
    /// Reads the device sources ([`super::device_bytes`]).
    device: Option<Arc<dyn DeviceEngine>>,
}

impl DeltaSource {
    /// Sets up delta steps for `executor` of `plan` whose batches go to `endpoints`
    /// (the prepared ones, in order): a base and an outbox per target, the outboxes
    /// registered with `engine` (inboxes of targets it does not write are ignored);
    /// device sources are read through `device`, staged in host memory.
    /// Errors (`InvalidArgument` unless named): a target without an inbox, an inbox
    /// named twice, a slot under 64 bytes, a target written at several endpoints
    /// (`Unsupported`), device memory without a device engine (`Unsupported`), an
    /// outbox that cannot be allocated (`LimitExceeded`), a failed registration
    /// (`Store`).
    pub(crate) fn new(
        plan: &TransferPlan,
        executor: &ExecutorTransferPlan,
        endpoints: &[String],
        inboxes: &[(&str, DeltaInbox)],
        engine: &dyn TransferEngine,
        device: Option<Arc<dyn DeviceEngine>>,
    ) -> Result<DeltaSource> {
        let mut per_target: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for &i in &executor.operation_indices {
            let t = plan.operation_fragment(i as usize, Side::Target).0.participant_id();
            per_target.entry(t.to_string()).or_default().push(i);
        }
        let mut given: BTreeMap<&str, DeltaInbox> = BTreeMap::new();
        for (t, inbox) in inboxes {
            if given.insert(t, *inbox).is_some() {
                return Err(Error::invalid(format!("delta inbox of target {t} given twice")));
            }
        }
        let mut targets = Vec::new();
        let mut by_endpoint = vec![Vec::new(); endpoints.len()];
        for (t, mut ops) in per_target {
            ops.sort_unstable();
            let Some(inbox) = given.get(t.as_str()).copied() else {
                return Err(Error::invalid(format!("no delta inbox for target {t}")));
            };
            let writer = (executor.participant_id.as_str(), executor.worker_id.as_str());
            let slot = inbox_slot(plan, &t, writer, inbox.capacity).unwrap_or_default();
            if slot.1 < 64 {
                return Err(Error::invalid(format!(
                    "the delta inbox of target {t} ({} bytes) leaves this writer a slot of {} bytes (at least 64)",
                    inbox.capacity, slot.1
                )));
            }
            let mut at: Vec<&str> =
                ops.iter().map(|&i| plan.operation_fragment(i as usize, Side::Target).1.endpoint()).collect();
            at.sort_unstable();
            at.dedup();
            let [endpoint] = at[..] else {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "target {t} is written at {} endpoints: delta steps need one endpoint per target",
                        at.len()
                    ),
                ));
            };
            let Some(e) = endpoints.iter().position(|x| x == endpoint) else {
                return Err(Error::invalid(format!("target {t}'s endpoint {endpoint} has no prepared batches")));
            };
            by_endpoint[e].push(targets.len());
            let base = Base::new(plan, t, ops, device.as_deref())?;
            let outbox = zeroed(slot.1, "a delta outbox")?;
            targets.push(TargetBase { base, inbox, slot, outbox });
        }
        let mut source =
            DeltaSource { targets, by_endpoint, endpoints: endpoints.to_vec(), registered: Vec::new(), device };
        for k in 0..source.targets.len() {
            let o = &source.targets[k].outbox;
            let region = MemoryRegion { address: o.as_ptr() as u64, len: o.len() as u64, kind: MemoryKind::Host };
            // SAFETY: the outbox is owned by this source, never reallocated, and
            // unregistered (`close`) before it is dropped.
            let code = unsafe { engine.register_memory(region) };
            match code {
                Ok(0) => source.registered.push(region.address),
                other => {
                    source.close(engine);
                    let why = match other {
                        Ok(c) => format!("code {c}"),
                        Err(e) => e.message,
                    };
                    return Err(Error::new(ErrorKind::Store, format!("registering a delta outbox failed: {why}")));
                }
            }
        }
        Ok(source)
    }

    /// Unregisters the outboxes (ignoring failures: the engine keeps nothing of ours
    /// it could write into once the source is gone... a failed unregistration is
    /// logged).
    pub(crate) fn close(&mut self, engine: &dyn TransferEngine) {
        for a in self.registered.drain(..) {
            if !matches!(engine.unregister_memory(a), Ok(0)) {
                log::warn!("unregistering a delta outbox at {a:#x} failed");
            }
        }
    }

    /// Plans one step of generation `generation`: per endpoint delta or full (see
    /// the module documentation), the encodings written into the outboxes, the
    /// bases moved to the step's bytes.
    ///
    /// Errors: a malformed encoding (a bug), the device engine's.
    ///
    /// # Safety
    /// The source fragments of the transfer are valid for reads (of their memory
    /// kind) and not written during the call.
    pub(crate) unsafe fn plan_step(
        &mut self,
        plan: &TransferPlan,
        held: &[TargetHeld<'_>],
        generation: u64,
    ) -> Result<StepDelta> {
        let endpoints = self.endpoints.clone();
        let held: BTreeMap<&str, u64> = held.iter().map(|h| (h.participant_id, h.weight_generation)).collect();
        let mut out = StepDelta {
            endpoints: Vec::with_capacity(endpoints.len()),
            messages: BTreeMap::new(),
            report: DeltaReport { weight_generation: generation, targets: Vec::new() },
        };
        let mut scratch = Vec::new();
        let device = self.device.clone();
        for (e, endpoint) in endpoints.iter().enumerate() {
            let ts = self.by_endpoint[e].clone();
            for &k in &ts {
                // SAFETY: this function's contract.
                unsafe { self.targets[k].base.stage(plan, device.as_deref()) }?;
            }
            let wants_delta = !ts.is_empty()
                && ts.iter().all(|&k| {
                    let t = &self.targets[k].base;
                    t.generation.is_some() && held.get(t.participant.as_str()).copied() == t.generation
                });
            let mut deltas = Vec::new();
            if wants_delta {
                for &k in &ts {
                    let t = &mut self.targets[k];
                    // SAFETY: this function's contract (staged above).
                    match unsafe { t.base.encode(plan, &mut t.outbox, &mut scratch) }? {
                        Some(d) => deltas.push(d),
                        None => break,
                    }
                }
            }
            if !wants_delta || deltas.len() != ts.len() {
                // Full: the prepared batches; the bases take the bytes sent.
                for &k in &ts {
                    let t = &mut self.targets[k].base;
                    // SAFETY: this function's contract (staged above).
                    unsafe { t.refresh(plan, generation) }?;
                    out.report.targets.push(TargetDelta {
                        participant_id: t.participant.clone(),
                        base_generation: None,
                        wire_bytes: t.bytes,
                        logical_bytes: t.bytes,
                        changed_elements: 0,
                    });
                }
                out.endpoints.push(None);
                continue;
            }
            let mut batches = Vec::with_capacity(ts.len());
            for (&k, (n, changed)) in ts.iter().zip(deltas) {
                let t = &mut self.targets[k];
                let base = t.base.generation.unwrap_or_default();
                // The base takes the new bytes: the encodings applied to it.
                t.base.advance(plan, &t.outbox[..n as usize], generation)?;
                out.messages.insert(t.base.participant.clone(), NotifyDelta { base, bytes: n });
                out.report.targets.push(TargetDelta {
                    participant_id: t.base.participant.clone(),
                    base_generation: Some(base),
                    wire_bytes: n,
                    logical_bytes: t.base.bytes,
                    changed_elements: changed,
                });
                let batch = if n == 0 {
                    None
                } else {
                    let range = TransferBatchRange {
                        source_base_address: t.outbox.as_ptr() as u64,
                        source_capacity: t.outbox.len() as u64,
                        target_base_address: t.inbox.address,
                        target_capacity: t.inbox.capacity,
                        source_offsets: vec![0],
                        target_offsets: vec![t.slot.0],
                        sizes: vec![n],
                    };
                    Some(TransferBatch::from_ranges(endpoint, Direction::Write, vec![range])?)
                };
                batches.push(DeltaBatch { batch, planned: t.base.planned, logical: t.base.bytes });
            }
            out.endpoints.push(Some(batches));
        }
        out.report.targets.sort_by(|a, b| a.participant_id.cmp(&b.participant_id));
        Ok(out)
    }
}

/// Calls `f(ordinal, encoding)` for every record of a writer's slot bytes, checking
/// the framing: strictly increasing ordinals below `segments`, whole encodings.
/// Errors (`InvalidArgument`): the first framing error, or `f`'s.
pub(crate) fn for_each_record<'a>(
    mut bytes: &'a [u8],
    segments: u64,
    mut f: impl FnMut(u64, &'a [u8]) -> Result<()>,
) -> Result<()> {
    let mut last: Option<u64> = None;
    let mut offset = 0usize;
    while !bytes.is_empty() {
        let Some((ord, rest)) = bytes.split_first_chunk::<8>() else {
            return Err(Error::invalid(format!("delta record at byte {offset}: truncated segment ordinal")));
        };
        let ordinal = u64::from_le_bytes(*ord);
        if ordinal >= segments || last.is_some_and(|l| ordinal <= l) {
            return Err(Error::invalid(format!(
                "delta record at byte {offset}: segment {ordinal} out of order or past the {segments} segments"
            )));
        }
        let header = Header::read(rest).map_err(|e| e.context(&format!("delta record at byte {offset}: ")))?;
        let len = header
            .encoded_len()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= rest.len())
            .ok_or_else(|| Error::invalid(format!("delta record at byte {offset}: encoding runs past the slot")))?;
        f(ordinal, &rest[..len])?;
        last = Some(ordinal);
        offset += 8 + len;
        bytes = &rest[len..];
    }
    Ok(())
}

/// Applies a writer's delta (`bytes` of its inbox slot) to the target segments of
/// its operations `ops` (ascending) into the target: host segments in place, device
/// ones through `device` (the changed segments of an operation gathered into host
/// memory, applied, and copied back: one batch each way per operation). The framing
/// is checked before anything is written. Returns the elements written.
///
/// Errors: the framing or an encoding is malformed, or does not fit its segment
/// (`InvalidArgument`; the operations before the failing record are already
/// written, the failing one is not when it is device memory); device memory
/// without a device engine (`Unsupported`), the device engine's.
///
/// # Safety
/// `bytes` is readable; the target fragments of `ops` are valid for writes (of
/// their memory kind) and not accessed by anyone else during the call.
pub(crate) unsafe fn apply_to_target(
    plan: &TransferPlan,
    ops: &[u32],
    bytes: &[u8],
    device: Option<&dyn DeviceEngine>,
) -> Result<u64> {
    // Per segment: address, length, element size, operation (index into `ops`).
    let mut segments: Vec<(u64, u64, usize, usize)> = Vec::new();
    for (k, &i) in ops.iter().enumerate() {
        let es = element_size(plan, i as usize);
        for_each_segment(plan, i as usize, Side::Target, |addr, len| segments.push((addr, len, es, k)));
    }
    let mut records: Vec<(u64, &[u8])> = Vec::new();
    for_each_record(bytes, segments.len() as u64, |ordinal, enc| {
        records.push((ordinal, enc));
        Ok(())
    })?;
    let touched: Vec<u32> = records.iter().map(|&(o, _)| ops[segments[o as usize].3]).collect();
    check_reachable(plan, &touched, Side::Target, device, "applying a delta")?;
    let mut changed = 0u64;
    // Records ascend by ordinal, so the records of one operation are consecutive.
    for group in records.chunk_by(|a, b| segments[a.0 as usize].3 == segments[b.0 as usize].3) {
        let op = ops[segments[group[0].0 as usize].3] as usize;
        match (memory(plan, op, Side::Target), device) {
            (MemoryKind::Device(ordinal), Some(d)) => {
                let ranges: Vec<(u64, u64)> =
                    group.iter().map(|&(o, _)| (segments[o as usize].0, segments[o as usize].1)).collect();
                let mut host = vec![0u8; ranges.iter().map(|r| r.1 as usize).sum()];
                // SAFETY: this function's contract: device segments of the target
                // valid for reads and writes.
                unsafe { gather(d, ordinal, &ranges, &mut host) }?;
                let mut at = 0usize;
                for &(o, enc) in group {
                    let (_, len, es, _) = segments[o as usize];
                    changed += delta::apply(enc, &mut host[at..at + len as usize], es)?.elements_written as u64;
                    at += len as usize;
                }
                // SAFETY: as above.
                unsafe { scatter(d, ordinal, &ranges, &host) }?;
            }
            _ => {
                for &(o, enc) in group {
                    let (addr, len, es, _) = segments[o as usize];
                    // SAFETY: this function's contract: the segment lies in a host
                    // target fragment (device ones were checked reachable above)
                    // valid for writes and not accessed by anyone else.
                    let target = unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, len as usize) };
                    changed += delta::apply(enc, target, es)?.elements_written as u64;
                }
            }
        }
    }
    Ok(changed)
}
