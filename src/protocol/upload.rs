//! `upload` (`writer-and-snapshot.md` §4): freshness checks with no store I/O, then
//! pin, register and write one participant's payloads, and return receipts.
//! `upload_many` does the same for several participants of this process in one call:
//! every check of every binding first, then one stream of put batches across all of
//! them (fewer, fuller batches), with the source checksums computed alongside the
//! puts instead of in a separate pass before them. Both are [`WeightStore`] methods,
//! defined here.

use super::guards::{acquire_pin, GuardProvider, LifetimeToken, TerminalState};
use super::integrity::SourceChecksums;
use super::progress::{ProgressPhase, Reporter};
use super::receipt::UploadReceipt;
use super::registration::registration_requests;
use super::registration::RegistrationLease;
use super::state::WeightStore;
use crate::error::{Error, ErrorKind, Result};
use crate::model::Placement;
use crate::plan::upload::{UploadOperation, UploadPlan};
use crate::runtime::MemoryRegion;
use crate::runtime::{validate_runtime_binding, MemoryKind, RuntimeBinding, RuntimeFragment};
use crate::store::{PutFrom, RecordType, WriteConfig};
use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Options of [`WeightStore::upload`].
#[derive(Clone, Copy, Default)]
pub struct UploadArgs<'a> {
    /// Selects one worker of a multi-worker binding.
    pub worker_id: Option<&'a str>,
    /// Pins the source allocations during I/O (required).
    pub guard: Option<&'a dyn GuardProvider>,
    /// Transfer id handed to the guard (default: random hex).
    pub transfer_id: Option<&'a str>,
    /// A registration lease that already pins and registers exactly these source
    /// fragments (then `guard` is not used and nothing is registered per call).
    /// [`WeightStore::upload_many`] takes one lease per source instead
    /// ([`UploadSource::lease`]) and refuses this one.
    pub lease: Option<&'a RegistrationLease>,
    /// Called with throttled [`Progress`](super::Progress) reports of the payload
    /// writes ([`ProgressPhase::Upload`](super::ProgressPhase), items = objects), on
    /// the calling thread. `None`: no reports.
    pub progress: Option<super::ProgressFn<'a>>,
}

/// One participant of [`WeightStore::upload_many`]: its binding and, optionally,
/// a registration lease over exactly its planned source fragments (`None`: pinned
/// with the call's guard and registered for the call only).
#[derive(Clone, Copy)]
pub struct UploadSource<'a> {
    /// The participant's source binding.
    pub binding: &'a RuntimeBinding,
    /// Its registration lease, if any.
    pub lease: Option<&'a RegistrationLease>,
}

fn stale(kind: ErrorKind, msg: String) -> Error {
    Error::new(kind, msg)
}

/// One participant after the pure freshness checks.
struct Checked<'p> {
    binding: &'p RuntimeBinding,
    lease: Option<&'p RegistrationLease>,
    /// The guard that pins this source (the call's unless the source has its own).
    guard: Option<&'p dyn GuardProvider>,
    ops: Vec<&'p UploadOperation>,
    current: Vec<RuntimeFragment>,
}

/// Every freshness check of one binding (no store I/O, no callback). `None`: the
/// participant has no operations in the plan.
fn check<'p>(
    ws: &WeightStore,
    plan: &'p UploadPlan,
    placement: &Placement,
    binding: &'p RuntimeBinding,
    worker_id: Option<&str>,
) -> Result<Option<Vec<&'p UploadOperation>>> {
    ws.check_plan_prefix(plan)?;
    validate_runtime_binding(placement, binding)
        .map_err(|e| stale(ErrorKind::InvalidBinding, format!("invalid source runtime binding: {}", e.message())))?;
    let m = plan.manifest();
    if placement.resource_id() != m.resource_id() || placement.revision() != m.revision() {
        return Err(stale(ErrorKind::StaleBinding, "source placement revision mismatch".into()));
    }
    if placement.weight_generation() != m.weight_generation() {
        return Err(stale(ErrorKind::StaleBinding, "source placement weight generation mismatch".into()));
    }
    if placement.placement_id() != plan.source_placement_id() || placement.digest() != plan.source_placement_digest() {
        return Err(stale(ErrorKind::StaleBinding, "source placement identity mismatch".into()));
    }
    let mine: Vec<&UploadOperation> =
        plan.operations().iter().filter(|o| o.source_participant_id() == binding.participant_id()).collect();
    if mine.is_empty() {
        return Ok(None);
    }
    let workers: BTreeSet<&str> = mine.iter().map(|o| o.source_snapshot().worker_id()).collect();
    let worker = match worker_id {
        None if workers.len() > 1 => {
            return Err(stale(
                ErrorKind::InvalidArgument,
                "source worker selector is required for a multi-worker binding".into(),
            ))
        }
        None => *workers.iter().next().expect("non-empty"),
        Some("") => {
            return Err(stale(ErrorKind::InvalidArgument, "source_worker_id must be a non-empty string".into()))
        }
        Some(w) if !workers.contains(w) => {
            return Err(stale(ErrorKind::InvalidArgument, format!("unknown source worker: {w}")))
        }
        Some(w) => w,
    };
    let ops: Vec<&UploadOperation> = mine.into_iter().filter(|o| o.source_snapshot().worker_id() == worker).collect();
    if ops.iter().any(|o| o.source_instance_id() != binding.instance_id()) {
        return Err(stale(ErrorKind::StaleBinding, format!("stale source instance: {}", binding.participant_id())));
    }
    // Indexed by runtime fragment id once (a scan per operation was quadratic).
    let by_id: HashMap<&str, &RuntimeFragment> = binding.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
    let missing: BTreeSet<&str> =
        ops.iter().map(|o| o.source_snapshot().fragment_id()).filter(|id| !by_id.contains_key(id)).collect();
    if !missing.is_empty() {
        return Err(stale(
            ErrorKind::StaleBinding,
            format!("missing planned source fragment: {}", missing.into_iter().collect::<Vec<_>>().join(", ")),
        ));
    }
    let part = placement.part(binding.participant_id()).expect("binding validated against the placement");
    for o in &ops {
        let pfid = o.source_placement().placement_fragment_id();
        if part.fragment(pfid) != Some(o.source_placement()) {
            return Err(stale(ErrorKind::StaleBinding, format!("stale source placement: {pfid}")));
        }
        let rid = o.source_snapshot().fragment_id();
        if binding.lease_id() != o.source_lease_id() || binding.lease_generation() != o.source_lease_generation() {
            return Err(stale(ErrorKind::StaleBinding, format!("stale source lease: {rid}")));
        }
        if !by_id.get(rid).is_some_and(|f| f.same_as_snapshot(o.source_snapshot())) {
            return Err(stale(ErrorKind::StaleBinding, format!("stale source fragment: {rid}")));
        }
        let kind = o.source_snapshot().memory();
        if kind != MemoryKind::Host && ws.device.is_none() && !ws.store.supports_memory(kind) {
            return Err(stale(
                ErrorKind::Unsupported,
                format!("source fragment {rid} is device memory: give the weight store a device engine"),
            ));
        }
    }
    Ok(Some(ops))
}

/// One participant ready to write: its operations, the fragments to read (from the
/// lease's binding or re-read through the guard's pin) and the pin token, if pinned.
struct Ready<'p> {
    ops: Vec<&'p UploadOperation>,
    frags: Vec<RuntimeFragment>,
    token: Option<Box<dyn LifetimeToken>>,
}

fn release_all(ready: Vec<Ready<'_>>) {
    for r in ready {
        if let Some(mut token) = r.token {
            let _ = token.release(TerminalState::Aborted);
        }
    }
}

/// Validates the lease, or pins through the guard (no store I/O).
fn make_ready<'p>(ws: &WeightStore, c: Checked<'p>, args: &UploadArgs<'_>) -> Result<Ready<'p>> {
    let guard = c.guard;
    match c.lease {
        Some(lease) => {
            lease.validate(c.binding, &c.current.iter().collect::<Vec<_>>())?;
            Ok(Ready { ops: c.ops, frags: c.current, token: None })
        }
        None => {
            let guard = guard.ok_or_else(|| {
                stale(ErrorKind::InvalidArgument, "source allocation guard providers are required".into())
            })?;
            ws.registrar.check_unblocked()?;
            let transfer_id =
                args.transfer_id.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let ids: Vec<String> = c.ops.iter().map(|o| o.source_snapshot().fragment_id().to_string()).collect();
            let (fresh, mut token) = acquire_pin(guard, "source", &transfer_id, c.binding, &ids)?;
            let by_id: HashMap<&str, &RuntimeFragment> =
                fresh.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
            let mut frags: Vec<RuntimeFragment> = Vec::with_capacity(c.ops.len());
            for o in &c.ops {
                let rid = o.source_snapshot().fragment_id();
                match by_id.get(rid) {
                    Some(f) if f.same_as_snapshot(o.source_snapshot()) => frags.push((*f).clone()),
                    _ => {
                        let _ = token.release(TerminalState::Aborted);
                        return Err(stale(ErrorKind::StaleBinding, format!("stale source fragment: {rid}")));
                    }
                }
            }
            Ok(Ready { ops: c.ops, frags, token: Some(token) })
        }
    }
}

impl WeightStore {
    /// Uploads the payloads of `binding`'s participant (only the operations of one
    /// worker when `args.worker_id` is given) and returns their receipts in plan order.
    ///
    /// Every freshness check runs before any store call; errors are store errors
    /// (`invalid source runtime binding`, `source placement ... mismatch`,
    /// `stale source ...`, `weight upload already chose abort`, ...). A payload
    /// failure never deletes payloads: cleanup is the caller's decision
    /// ([`WeightStore::abort_upload`]). For a stateful front that collects receipts,
    /// see [`super::Transaction`].
    ///
    /// # Safety
    /// Every source view of `binding` (address, nbytes) must be valid for reads and
    /// must not be written for the duration of the call; `args.guard` must pin them.
    pub unsafe fn upload(
        &self,
        plan: &UploadPlan,
        placement: &Placement,
        binding: &RuntimeBinding,
        args: UploadArgs<'_>,
    ) -> Result<Vec<UploadReceipt>> {
        let sources = [UploadSource { binding, lease: args.lease }];
        // SAFETY: the caller upholds `upload_many`'s contract for this one binding (this function's contract).
        unsafe { self.upload_many(plan, placement, &sources, UploadArgs { lease: None, ..args }) }
    }

    /// Uploads the payloads of several participants of this process in one call and
    /// returns their receipts: those of `sources[0]` in plan order, then `sources[1]`'s,
    /// ... — exactly what one [`WeightStore::upload`] per source, in order, would
    /// return. The puts of all of them go out as one stream of batches (up to
    /// `max_ranges_per_request` objects each) and the block checksums are computed
    /// while the puts run.
    ///
    /// `args.worker_id`, `args.guard`, `args.transfer_id` and `args.progress` apply to
    /// every source (one progress stream for the whole call); `args.lease` must be
    /// `None` (give leases per source).
    ///
    /// Every freshness check of every source (and the lease validations and pins) runs
    /// before any payload is written; on any failure before the first put, pins taken
    /// are released and nothing is written. Errors: those of [`WeightStore::upload`],
    /// plus [`ErrorKind::InvalidArgument`] for a participant given twice or
    /// `args.lease` set. A payload failure never deletes payloads. Thread safety: as
    /// [`WeightStore::upload`].
    ///
    /// # Safety
    /// Every source view of every binding must be valid for reads and must not be
    /// written for the duration of the call; `args.guard` must pin those not leased.
    pub unsafe fn upload_many(
        &self,
        plan: &UploadPlan,
        placement: &Placement,
        sources: &[UploadSource<'_>],
        args: UploadArgs<'_>,
    ) -> Result<Vec<UploadReceipt>> {
        let sources: Vec<(UploadSource<'_>, Option<&dyn GuardProvider>)> =
            sources.iter().map(|s| (*s, args.guard)).collect();
        // SAFETY: this function's contract, with the call's guard for every source.
        unsafe { self.upload_guarded(plan, placement, &sources, args) }
    }

    /// [`WeightStore::upload_many`] with a guard per source (the snapshot writer's
    /// participants each have their own); `args.guard` is not used.
    ///
    /// # Safety
    /// As [`WeightStore::upload_many`], each source pinned by its own guard.
    pub(crate) unsafe fn upload_guarded(
        &self,
        plan: &UploadPlan,
        placement: &Placement,
        sources: &[(UploadSource<'_>, Option<&dyn GuardProvider>)],
        args: UploadArgs<'_>,
    ) -> Result<Vec<UploadReceipt>> {
        if args.lease.is_some() {
            return Err(stale(
                ErrorKind::InvalidArgument,
                "upload_many takes one lease per source binding, not a lease in the call's arguments".into(),
            ));
        }
        let mut seen: HashSet<&str> = HashSet::with_capacity(sources.len());
        for (s, _) in sources {
            if !seen.insert(s.binding.participant_id()) {
                return Err(stale(
                    ErrorKind::InvalidArgument,
                    format!("source participant given twice: {}", s.binding.participant_id()),
                ));
            }
        }
        if sources.is_empty() {
            self.check_plan_prefix(plan)?;
        }
        let mut checked: Vec<Checked<'_>> = Vec::with_capacity(sources.len());
        for &(s, guard) in sources {
            if let Some(ops) = check(self, plan, placement, s.binding, args.worker_id)? {
                let by_id: HashMap<&str, &RuntimeFragment> =
                    s.binding.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
                let current = ops.iter().map(|o| (*by_id[o.source_snapshot().fragment_id()]).clone()).collect();
                checked.push(Checked { binding: s.binding, lease: s.lease, guard, ops, current });
            }
        }
        if checked.is_empty() {
            return Ok(Vec::new());
        }
        // I/O phase.
        self.require_writable(plan, &[])?;
        let mut ready: Vec<Ready<'_>> = Vec::with_capacity(checked.len());
        for c in checked {
            match make_ready(self, c, &args) {
                Ok(r) => ready.push(r),
                Err(e) => {
                    release_all(ready);
                    return Err(e);
                }
            }
        }
        // Device sources staged through the device engine are never registered with the store.
        let staged = |f: &&RuntimeFragment| self.device.is_none() || f.memory() == MemoryKind::Host;
        let pinned: Vec<&RuntimeFragment> =
            ready.iter().filter(|r| r.token.is_some()).flat_map(|r| &r.frags).filter(staged).collect();
        let requests = match registration_requests(&pinned) {
            Ok(r) => r,
            Err(e) => {
                release_all(ready);
                return Err(e);
            }
        };
        let mut ops: Vec<&UploadOperation> = Vec::new();
        let mut frags: Vec<RuntimeFragment> = Vec::new();
        let mut tokens: Vec<Box<dyn LifetimeToken>> = Vec::new();
        for r in ready {
            ops.extend(r.ops);
            frags.extend(r.frags);
            tokens.extend(r.token);
        }
        let keys: Vec<&str> = ops.iter().map(|o| o.target().object_key()).collect();
        let started = Cell::new(false);
        let mut checksums: Vec<Option<Vec<u32>>> = Vec::new();
        let mut body = || -> Result<()> {
            let total: u64 = frags.iter().map(|f| f.nbytes()).sum();
            let mut progress = Reporter::start(args.progress, ProgressPhase::Upload, total, ops.len() as u64);
            // SAFETY: the source views are valid and unchanged for the call (this function's `# Safety`).
            checksums = unsafe {
                super::device_staging::stage_sources(self, &ops, &frags, |ops, frags| {
                    // SAFETY: host views (and staged copies) valid and unchanged for the call.
                    write_payloads(self, plan, ops, frags, &mut progress, &started)
                })
            }?;
            self.require_complete_payloads(&keys)?;
            progress.finish();
            Ok(())
        };
        nest(self, tokens.into_iter(), &requests, &started, &mut body)?;
        self.require_writable(plan, &keys)?;
        Ok(ops
            .iter()
            .zip(&frags)
            .zip(checksums)
            .map(|((o, f), block_checksums)| UploadReceipt {
                fragment_id: o.target().fragment_id().into(),
                object_key: o.target().object_key().into(),
                worker_id: f.worker_id().into(),
                block_checksums,
            })
            .collect())
    }
}

/// Runs `body` inside one registration scope per pin token (outermost first); the
/// innermost scope registers `requests` (so they are unregistered before any pin is
/// released). Without tokens (every source leased) `body` runs directly.
fn nest(
    ws: &WeightStore,
    mut tokens: std::vec::IntoIter<Box<dyn LifetimeToken>>,
    requests: &[MemoryRegion],
    started: &Cell<bool>,
    body: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let Some(token) = tokens.next() else {
        ws.registrar.check_unblocked()?;
        return body();
    };
    let here: &[MemoryRegion] = if tokens.as_slice().is_empty() { requests } else { &[] };
    ws.registrar.scoped(&*ws.store, here, token, |io_started| {
        let r = nest(ws, tokens, requests, started, body);
        *io_started = started.get();
        r
    })
}

/// Below this many host source bytes the checksums are computed on the calling
/// thread before the puts (a helper thread costs more than it hides).
const OVERLAP_MIN_BYTES: u64 = 4 << 20;

/// The put batches of `ops` from `frags` (in order), with the block checksums of
/// the host sources computed meanwhile by background helper threads at idle
/// priority (they read the same unchanged bytes the puts read; the calling thread
/// runs the puts, then sums whatever blocks the helpers have not reached). Returns
/// the checksums in `frags` order. Sets `started` before the first put.
///
/// # Safety
/// Every host fragment's `(address, nbytes)` must be valid for reads and not written
/// for the duration of the call.
unsafe fn write_payloads(
    ws: &WeightStore,
    plan: &UploadPlan,
    ops: &[&UploadOperation],
    frags: &[RuntimeFragment],
    progress: &mut Reporter<'_>,
    started: &Cell<bool>,
) -> Result<Vec<Option<Vec<u32>>>> {
    let group = plan.manifest().group_id();
    if !ws.limits.write_integrity {
        // No integrity record will be written: no checksums (receipts without them).
        return put_batches(ws, ops, frags, group, progress, started).map(|()| vec![None; frags.len()]);
    }
    // SAFETY: the host sources are valid for reads and unchanged for the call (this function's `# Safety`).
    let sums = unsafe { SourceChecksums::new(frags) };
    if sums.bytes() < OVERLAP_MIN_BYTES {
        sums.work();
        return put_batches(ws, ops, frags, group, progress, started).map(|()| sums.finish());
    }
    // One thread fewer than the store's I/O threads: the calling thread puts.
    let helpers = crate::store::io_threads().saturating_sub(1).max(1);
    let puts = std::thread::scope(|sc| {
        let sums = &sums;
        for _ in 0..helpers {
            sc.spawn(move || {
                super::integrity::lower_to_idle_priority();
                sums.work();
            });
        }
        let puts = put_batches(ws, ops, frags, group, progress, started);
        match puts {
            Ok(()) => sums.work(),
            Err(_) => sums.cancel(),
        }
        puts
    });
    puts.map(|()| sums.finish())
}

fn put_batches(
    ws: &WeightStore,
    ops: &[&UploadOperation],
    frags: &[RuntimeFragment],
    group: &str,
    progress: &mut Reporter<'_>,
    started: &Cell<bool>,
) -> Result<()> {
    let batch = ws.limits.max_ranges_per_request;
    let groups = vec![group.to_string(); batch.min(ops.len())];
    for (chunk_ops, chunk_frags) in ops.chunks(batch).zip(frags.chunks(batch)) {
        let items: Vec<PutFrom<'_>> = chunk_ops
            .iter()
            .zip(chunk_frags)
            .map(|(o, f)| PutFrom {
                key: o.target().object_key(),
                source: MemoryRegion { address: f.address(), len: f.nbytes(), kind: f.memory() },
            })
            .collect();
        started.set(true);
        let results =
            // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
            unsafe { ws.store.batch_put_from(&items, &WriteConfig { group_ids: &groups[..items.len()], record_type: RecordType::Payload }) };
        // A re-run of `upload` for the same plan finds its own payloads: the key
        // holds this transaction's id, objects are only ever published whole,
        // and the size must match, so "already exists" counts as written.
        let results: Vec<Result<()>> = results
            .into_iter()
            .zip(&items)
            .map(|(r, item)| match r {
                Err(e) if e.kind() == ErrorKind::AlreadyExists => match ws.store.object_size(item.key) {
                    Ok(n) if n == item.source.len => Ok(()),
                    _ => Err(e),
                },
                other => other,
            })
            .collect();
        if results.len() != items.len() || results.iter().any(|r| r.is_err()) {
            let text: Vec<String> = results
                .iter()
                .zip(&items)
                .map(|(r, i)| match r {
                    Ok(()) => "0".to_string(),
                    Err(e) => format!("{}: {}", i.key, e.message()),
                })
                .collect();
            return Err(stale(ErrorKind::Store, format!("batch_put_from failed: [{}]", text.join(", "))));
        }
        progress.advance(items.iter().map(|i| i.source.len).sum(), items.len() as u64);
    }
    Ok(())
}
