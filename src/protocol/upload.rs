//! `upload` (`writer-and-snapshot.md` §4): freshness checks with no store I/O, then
//! pin, register and write one participant's payloads, and return receipts.

use super::commit;
use super::guards::{acquire_pin, GuardProvider, TerminalState};
use super::progress::{ProgressPhase, Reporter};
use super::receipt::UploadReceipt;
use super::registration::registration_requests;
use super::registration::RegistrationLease;
use super::state::{check_plan_prefix, WeightStore};
use crate::error::{Error, ErrorKind, Result};
use crate::model::Placement;
use crate::plan::upload::{UploadOperation, UploadPlan};
use crate::runtime::{validate_runtime_binding, MemoryKind, RuntimeBinding, RuntimeFragment};
use crate::store::{MemoryRegion, PutFrom, RecordType, WriteConfig};
use std::collections::BTreeSet;

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
    pub lease: Option<&'a RegistrationLease>,
    /// Called with throttled [`Progress`](super::Progress) reports of the payload
    /// writes ([`ProgressPhase::Upload`](super::ProgressPhase), items = objects), on
    /// the calling thread. `None`: no reports.
    pub progress: Option<super::ProgressFn<'a>>,
}

fn stale(kind: ErrorKind, msg: String) -> Error {
    Error::new(kind, msg)
}

/// Uploads the payloads of `binding`'s participant (only the operations of one
/// worker when `args.worker_id` is given) and returns their receipts in plan order.
///
/// Every freshness check runs before any store call; errors are store errors
/// (`invalid source runtime binding`, `source placement ... mismatch`,
/// `stale source ...`, `weight upload already chose abort`, ...). A payload
/// failure never deletes payloads: cleanup is the caller's decision
/// ([`WeightStore::abort_upload`]).
///
/// # Safety
/// Every source view of `binding` (address, nbytes) must be valid for reads and
/// must not be written for the duration of the call; `args.guard` must pin them.
pub(crate) unsafe fn upload(
    ws: &WeightStore,
    plan: &UploadPlan,
    placement: &Placement,
    binding: &RuntimeBinding,
    args: UploadArgs<'_>,
) -> Result<Vec<UploadReceipt>> {
    check_plan_prefix(ws, plan)?;
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
        return Ok(Vec::new());
    }
    let workers: BTreeSet<&str> = mine.iter().map(|o| o.source_snapshot().worker_id()).collect();
    let worker = match args.worker_id {
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
    let by_id: std::collections::HashMap<&str, &RuntimeFragment> =
        binding.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
    let find = |_: &'_ RuntimeBinding, id: &str| -> Option<RuntimeFragment> { by_id.get(id).map(|f| (*f).clone()) };
    let missing: BTreeSet<&str> =
        ops.iter().map(|o| o.source_snapshot().fragment_id()).filter(|id| find(binding, id).is_none()).collect();
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
        if binding.lease_id() != o.source_lease_id() || binding.generation() != o.source_generation() {
            return Err(stale(ErrorKind::StaleBinding, format!("stale source lease: {rid}")));
        }
        if !find(binding, rid).is_some_and(|f| f.same_as_snapshot(o.source_snapshot())) {
            return Err(stale(ErrorKind::StaleBinding, format!("stale source fragment: {rid}")));
        }
        let kind = o.source_snapshot().memory();
        if kind != MemoryKind::Host && !ws.store.supports_memory(kind) {
            return Err(stale(
                ErrorKind::Unsupported,
                format!("source fragment {rid} is device memory and the store has no device copy path"),
            ));
        }
    }
    // I/O phase.
    commit::require_writable(ws, plan, &[])?;
    let current: Vec<RuntimeFragment> =
        ops.iter().map(|o| find(binding, o.source_snapshot().fragment_id()).expect("checked above")).collect();
    let (fresh_frags, token) = match args.lease {
        Some(lease) => {
            lease.validate(binding, &current.iter().collect::<Vec<_>>())?;
            (current, None)
        }
        None => {
            let guard = args.guard.ok_or_else(|| {
                stale(ErrorKind::InvalidArgument, "source allocation guard providers are required".into())
            })?;
            ws.registrar.check_unblocked()?;
            let transfer_id =
                args.transfer_id.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let ids: Vec<String> = ops.iter().map(|o| o.source_snapshot().fragment_id().to_string()).collect();
            let (fresh, mut token) = acquire_pin(guard, "source", &transfer_id, binding, &ids)?;
            let mut fresh_frags: Vec<RuntimeFragment> = Vec::with_capacity(ops.len());
            for o in &ops {
                let rid = o.source_snapshot().fragment_id();
                match find(&fresh, rid) {
                    Some(f) if f.same_as_snapshot(o.source_snapshot()) => fresh_frags.push(f),
                    _ => {
                        let _ = token.release(TerminalState::Aborted);
                        return Err(stale(ErrorKind::StaleBinding, format!("stale source fragment: {rid}")));
                    }
                }
            }
            (fresh_frags, Some(token))
        }
    };
    let frag_refs: Vec<&RuntimeFragment> = fresh_frags.iter().collect();
    let requests = match registration_requests(&frag_refs) {
        Ok(r) => r,
        Err(e) => {
            if let Some(mut token) = token {
                let _ = token.release(TerminalState::Aborted);
            }
            return Err(e);
        }
    };
    let keys: Vec<&str> = ops.iter().map(|o| o.target().object_key()).collect();
    let group = m.group_id().to_string();
    // SAFETY: the source views are valid and unchanged for the call (this function's `# Safety`).
    let checksums = unsafe { super::integrity::source_checksums(&fresh_frags) };
    let body = |io_started: &mut bool| {
        let total: u64 = fresh_frags.iter().map(|f| f.nbytes()).sum();
        let mut progress = Reporter::start(args.progress, ProgressPhase::Upload, total, ops.len() as u64);
        let batch = ws.limits.max_ranges_per_request;
        for (chunk_ops, chunk_frags) in ops.chunks(batch).zip(fresh_frags.chunks(batch)) {
            let items: Vec<PutFrom<'_>> = chunk_ops
                .iter()
                .zip(chunk_frags)
                .map(|(o, f)| PutFrom {
                    key: o.target().object_key(),
                    source: MemoryRegion { address: f.address(), len: f.nbytes(), kind: f.memory() },
                })
                .collect();
            let groups = vec![group.clone(); items.len()];
            *io_started = true;
            let results =
                // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
                unsafe { ws.store.batch_put_from(&items, &WriteConfig { group_ids: &groups, record_type: RecordType::Payload }) };
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
        commit::require_complete_payloads(ws, &keys)?;
        progress.finish();
        Ok(())
    };
    match token {
        Some(token) => ws.registrar.scoped(&*ws.store, &requests, token, body)?,
        None => {
            ws.registrar.check_unblocked()?;
            body(&mut false)?
        }
    }
    commit::require_writable(ws, plan, &keys)?;
    Ok(ops
        .iter()
        .zip(&fresh_frags)
        .zip(checksums)
        .map(|((o, f), block_checksums)| UploadReceipt {
            fragment_id: o.target().fragment_id().into(),
            object_key: o.target().object_key().into(),
            worker_id: f.worker_id().into(),
            block_checksums,
        })
        .collect())
}
