//! The snapshot writer (`writer-and-snapshot.md` §1–§3): a per-tensor API over one
//! upload plan. Each participant is uploaded as soon as all its selected fragments
//! were written (the participants one `write_tensor` call completes in one upload
//! call), or, with [`SnapshotWriter::defer_uploads`], every participant in one upload
//! call at commit; `commit` publishes the manifest. Its entry points are the
//! [`WeightStore`] methods defined here (`begin_snapshot`, `begin_snapshot_with`,
//! `snapshot`).

use super::guards::GuardProvider;
use super::progress::{Progress, ProgressPhase};
use super::receipt::UploadReceipt;
use super::state::WeightStore;
use super::upload::{UploadArgs, UploadSource};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::model::{non_empty, Placement, StoredManifest};
use crate::plan::upload::{UploadOptions, UploadPlan};
use crate::runtime::RuntimeBinding;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// The identity a caller declares before writing one immutable snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotDescriptor {
    /// Resource id (non-empty).
    pub resource_id: String,
    /// Revision (non-empty).
    pub revision: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// Namespace (non-empty; default `"default"`).
    pub namespace: String,
}

impl SnapshotDescriptor {
    /// Validates the descriptor (contract errors).
    pub fn validate(&self) -> Result<()> {
        non_empty(&self.resource_id, "resource_id")?;
        non_empty(&self.revision, "revision")?;
        non_empty(&self.namespace, "namespace")
    }
}

/// The placement and live bindings of one snapshot.
#[derive(Clone, Debug)]
pub struct SnapshotSource {
    /// The complete source placement.
    pub placement: Arc<Placement>,
    /// Live bindings (one per non-empty participant that takes part).
    pub bindings: Vec<RuntimeBinding>,
}

/// The framework side of a snapshot (`writer-and-snapshot.md` §2).
///
/// # Safety
/// Implementing this trait asserts that the memory described by the bindings that
/// [`SnapshotAdapter::export_source`] returns stays valid for reads and unchanged
/// while the guard of [`SnapshotAdapter::source_allocation_guards`] pins it (or,
/// with [`super::StaticGuard`], for the writer's whole life).
pub unsafe trait SnapshotAdapter {
    /// The framework's tensor handle (opaque to the library).
    type Tensor: ?Sized;
    /// Called once at writer construction.
    fn export_source(&self, descriptor: &SnapshotDescriptor) -> Result<SnapshotSource>;
    /// Maps a framework tensor to the placement fragment ids it backs.
    fn resolve_fragment_ids(
        &self,
        tensor_id: &str,
        tensor: &Self::Tensor,
        source: &SnapshotSource,
    ) -> Result<Vec<String>>;
    /// The guard that pins `binding`'s allocations during its flush.
    fn source_allocation_guards(&self, binding: &RuntimeBinding) -> Result<Arc<dyn GuardProvider>>;
}

/// A snapshot in progress (`WeightStoreWriter`). Dropping an open writer aborts it
/// (unless the commit decision may exist, in which case the plan's transaction is
/// left for `commit` retry or `finalize`).
pub struct SnapshotWriter<'s, A: SnapshotAdapter> {
    store: StoreRef<'s>,
    adapter: A,
    source: SnapshotSource,
    plan: UploadPlan,
    op_by_pfid: HashMap<String, usize>,
    required: BTreeMap<String, BTreeSet<String>>,
    seen: BTreeMap<String, BTreeSet<String>>,
    flushed: BTreeSet<String>,
    /// Complete participants not uploaded yet, in completion order.
    pending: Vec<String>,
    /// Uploads wait for `commit` ([`SnapshotWriter::defer_uploads`]).
    defer: bool,
    receipts: Vec<UploadReceipt>,
    closed: bool,
    committed: bool,
    decision_may_exist: bool,
    flush_attempted: bool,
    progress: Option<Box<dyn Fn(&Progress) + Send + Sync + 's>>,
    /// (bytes, objects) of the participants flushed so far.
    flushed_work: (u64, u64),
}

/// The store a writer writes to: borrowed ([`WeightStore::begin_snapshot`]) or shared
/// with the writer ([`WeightStore::begin_shared_snapshot`], a writer that owns its
/// store: a C handle, a writer kept across calls).
enum StoreRef<'s> {
    Borrowed(&'s WeightStore),
    Shared(Arc<WeightStore>),
}

impl std::ops::Deref for StoreRef<'_> {
    type Target = WeightStore;
    fn deref(&self) -> &WeightStore {
        match self {
            StoreRef::Borrowed(s) => s,
            StoreRef::Shared(s) => s,
        }
    }
}

fn store_err(kind: ErrorKind, msg: impl Into<String>) -> Error {
    Error::new(kind, msg)
}

impl WeightStore {
    /// Starts a snapshot: exports the source, checks its identity, plans the upload.
    /// No store I/O.
    pub fn begin_snapshot<A: SnapshotAdapter>(
        &self,
        descriptor: &SnapshotDescriptor,
        adapter: A,
    ) -> Result<SnapshotWriter<'_, A>> {
        self.begin_snapshot_with(descriptor, adapter, &UploadOptions::default())
    }

    /// As [`WeightStore::begin_snapshot`], with a fixed transaction id and/or
    /// `created_at` from `options` (namespace comes from the descriptor).
    pub fn begin_snapshot_with<A: SnapshotAdapter>(
        &self,
        descriptor: &SnapshotDescriptor,
        adapter: A,
        options: &UploadOptions,
    ) -> Result<SnapshotWriter<'_, A>> {
        Self::begin(StoreRef::Borrowed(self), descriptor, adapter, options)
    }

    /// As [`WeightStore::begin_snapshot_with`], for a writer that shares the store
    /// (it holds `store` until it is dropped), so that it can live as long as its
    /// owner wants: a C writer handle, a writer kept across calls.
    pub fn begin_shared_snapshot<A: SnapshotAdapter>(
        store: Arc<WeightStore>,
        descriptor: &SnapshotDescriptor,
        adapter: A,
        options: &UploadOptions,
    ) -> Result<SnapshotWriter<'static, A>> {
        Self::begin(StoreRef::Shared(store), descriptor, adapter, options)
    }

    fn begin<'s, A: SnapshotAdapter>(
        store: StoreRef<'s>,
        descriptor: &SnapshotDescriptor,
        adapter: A,
        options: &UploadOptions,
    ) -> Result<SnapshotWriter<'s, A>> {
        descriptor.validate()?;
        let source = adapter.export_source(descriptor)?;
        let p = &source.placement;
        if p.resource_id() != descriptor.resource_id
            || p.revision() != descriptor.revision
            || p.weight_generation() != descriptor.weight_generation
        {
            return Err(store_err(ErrorKind::InvalidArgument, "snapshot identity differs from source placement"));
        }
        let mut o = options.clone();
        o.namespace = descriptor.namespace.clone();
        let plan = store.plan_upload(p, &source.bindings, &o)?;
        let mut op_by_pfid = HashMap::new();
        let mut required: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (i, op) in plan.operations().iter().enumerate() {
            let pfid = op.source_placement().placement_fragment_id().to_string();
            if op_by_pfid.insert(pfid.clone(), i).is_some() {
                return Err(store_err(ErrorKind::InvalidArgument, "snapshot plan has duplicate placement fragments"));
            }
            required.entry(op.source_participant_id().to_string()).or_default().insert(pfid);
        }
        let seen = required.keys().map(|k| (k.clone(), BTreeSet::new())).collect();
        Ok(SnapshotWriter {
            store,
            adapter,
            source,
            plan,
            op_by_pfid,
            required,
            seen,
            flushed: BTreeSet::new(),
            pending: Vec::new(),
            defer: false,
            receipts: Vec::new(),
            closed: false,
            committed: false,
            decision_may_exist: false,
            flush_attempted: false,
            progress: None,
            flushed_work: (0, 0),
        })
    }

    /// Scoped snapshot: runs `body` on a new writer, then commits; if `body` fails,
    /// aborts (unless the commit decision may exist) and returns `body`'s error.
    pub fn snapshot<A: SnapshotAdapter>(
        &self,
        descriptor: &SnapshotDescriptor,
        adapter: A,
        body: impl FnOnce(&mut SnapshotWriter<'_, A>) -> Result<()>,
    ) -> Result<StoredManifest> {
        let mut writer = self.begin_snapshot(descriptor, adapter)?;
        match body(&mut writer) {
            Ok(()) => writer.commit(),
            Err(e) => {
                if !writer.decision_may_exist {
                    let _ = writer.abort();
                }
                Err(e)
            }
        }
    }
}

impl<'s, A: SnapshotAdapter> SnapshotWriter<'s, A> {
    /// The upload plan (immutable).
    pub fn plan(&self) -> &UploadPlan {
        &self.plan
    }
    /// The exported source.
    pub fn source(&self) -> &SnapshotSource {
        &self.source
    }
    /// Receipts collected so far.
    pub fn receipts(&self) -> &[UploadReceipt] {
        &self.receipts
    }
    /// True once committed.
    pub fn is_committed(&self) -> bool {
        self.committed
    }
    /// True once committed or aborted.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Installs (or, with `None`, removes) a progress callback for the rest of the
    /// snapshot: throttled [`Progress`] reports of [`ProgressPhase::Upload`] whose
    /// totals are the whole plan (every object of every participant), called on the
    /// thread that calls [`SnapshotWriter::write_tensor`] while it uploads.
    pub fn set_progress(&mut self, progress: Option<Box<dyn Fn(&Progress) + Send + Sync + 's>>) {
        self.progress = progress;
    }

    fn require_open(&self) -> Result<()> {
        if self.committed {
            return Err(store_err(ErrorKind::Conflict, "Weight snapshot has already committed"));
        }
        if self.closed {
            return Err(store_err(ErrorKind::Conflict, "Weight snapshot is closed"));
        }
        Ok(())
    }

    /// Defers the uploads to [`SnapshotWriter::commit`] (`true`) or not (`false`, the
    /// default). Deferred, `write_tensor` only records the tensors and returns no
    /// receipts, and `commit` uploads every complete participant in one upload call
    /// ([`WeightStore::upload_many`]'s stream of put batches, one guard pin per
    /// participant) before it commits: one store call where the default makes one
    /// per participant. The source memory must then stay valid and unchanged from
    /// `write_tensor` until `commit` returns (with a pinning guard: the bytes `commit`
    /// reads under the pin are the ones stored), where the default only needs it
    /// until the participant's upload. An upload failure at commit aborts the writer
    /// as a failed upload in `write_tensor` does. Participants completed before the
    /// call are uploaded by the next `write_tensor` (`false`) or by `commit`.
    pub fn defer_uploads(&mut self, defer: bool) -> Result<()> {
        self.require_open()?;
        self.defer = defer;
        Ok(())
    }

    /// True when uploads wait for commit ([`SnapshotWriter::defer_uploads`]).
    pub fn uploads_deferred(&self) -> bool {
        self.defer
    }

    /// Records that `tensor` (the caller's `tensor_id`) was written; uploads every
    /// participant that is now complete (those this call completes in one upload
    /// call) and returns the receipts of those uploads (none while uploads are
    /// deferred, [`SnapshotWriter::defer_uploads`]). Errors after fragment
    /// resolution abort the writer.
    pub fn write_tensor(&mut self, tensor_id: &str, tensor: &A::Tensor) -> Result<Vec<UploadReceipt>> {
        self.require_open()?;
        if tensor_id.is_empty() {
            return invalid("tensor_id must be a non-empty string");
        }
        let ids = self.adapter.resolve_fragment_ids(tensor_id, tensor, &self.source)?;
        if ids.is_empty() {
            return invalid("weight snapshot tensor resolved no fragments");
        }
        let distinct: BTreeSet<&String> = ids.iter().collect();
        if distinct.len() != ids.len() {
            return invalid("weight snapshot tensor resolved duplicate fragments");
        }
        let recorded = self.record(tensor_id, &ids);
        let flushed = recorded.and_then(|()| if self.defer { Ok(Vec::new()) } else { self.flush_pending() });
        match flushed {
            Ok(r) => Ok(r),
            Err(e) => Err(self.abort_after(e)),
        }
    }

    fn record(&mut self, tensor_id: &str, ids: &[String]) -> Result<()> {
        for id in ids {
            let &i = self.op_by_pfid.get(id).ok_or_else(|| {
                store_err(
                    ErrorKind::InvalidArgument,
                    format!("weight snapshot tensor resolved a fragment outside this snapshot: {id}"),
                )
            })?;
            let op = &self.plan.operations()[i];
            if op.source_placement().tensor_id() != tensor_id {
                return Err(store_err(
                    ErrorKind::InvalidArgument,
                    format!("weight snapshot tensor resolved a fragment for another tensor: {id}"),
                ));
            }
            let participant = op.source_participant_id().to_string();
            let seen = self.seen.get_mut(&participant).expect("participant of the plan");
            if !seen.insert(id.clone()) {
                return Err(store_err(
                    ErrorKind::InvalidArgument,
                    format!("weight snapshot tensor submitted a duplicate fragment: {id}"),
                ));
            }
            if *seen == self.required[&participant]
                && !self.flushed.contains(&participant)
                && !self.pending.contains(&participant)
            {
                self.pending.push(participant);
            }
        }
        Ok(())
    }

    /// Uploads the pending participants: in one upload call when each has its
    /// fragments on one worker, else one participant (and worker) at a time, in
    /// completion order. Returns their receipts in that order.
    fn flush_pending(&mut self) -> Result<Vec<UploadReceipt>> {
        if self.pending.is_empty() {
            return Ok(Vec::new());
        }
        let mut bindings: Vec<RuntimeBinding> = Vec::with_capacity(self.pending.len());
        for participant in &self.pending {
            let binding = self.source.bindings.iter().find(|b| b.participant_id() == participant).ok_or_else(|| {
                store_err(ErrorKind::InvalidBinding, format!("snapshot source binding is missing: {participant}"))
            })?;
            bindings.push(binding.clone());
        }
        let multi_worker = self.pending.iter().any(|p| self.workers_of(p).len() > 1);
        if self.pending.len() == 1 || multi_worker {
            let mut out = Vec::new();
            for (participant, binding) in std::mem::take(&mut self.pending).into_iter().zip(bindings) {
                out.extend(self.flush(&participant, binding)?);
            }
            return Ok(out);
        }
        let guards: Vec<Arc<dyn GuardProvider>> =
            bindings.iter().map(|b| self.adapter.source_allocation_guards(b)).collect::<Result<_>>()?;
        self.flush_attempted = true;
        let sources: Vec<(UploadSource<'_>, Option<&dyn GuardProvider>)> = bindings
            .iter()
            .zip(&guards)
            .map(|(b, g)| (UploadSource { binding: b, lease: None }, Some(&**g as &dyn GuardProvider)))
            .collect();
        let totals = self.totals();
        let (base, sink) = (self.flushed_work, self.progress.as_deref());
        let shifted = move |p: &Progress| shift(sink, base, totals, p);
        let args = UploadArgs {
            worker_id: None,
            guard: None,
            transfer_id: None,
            lease: None,
            progress: sink.is_some().then_some(&shifted as &(dyn Fn(&Progress) + Sync)),
        };
        // SAFETY: the adapter (an unsafe trait) vouches for the bindings' memory
        // while its guards pin it.
        let r = unsafe { self.store.upload_guarded(&self.plan, &self.source.placement, &sources, args) }?;
        let pending = std::mem::take(&mut self.pending);
        let bytes: u64 = self
            .plan
            .operations()
            .iter()
            .filter(|o| pending.iter().any(|p| p == o.source_participant_id()))
            .map(|o| o.target().nbytes())
            .sum();
        self.flushed_work = (self.flushed_work.0 + bytes, self.flushed_work.1 + r.len() as u64);
        self.receipts.extend(r.iter().cloned());
        self.flushed.extend(pending);
        Ok(r)
    }

    /// The workers a participant's planned fragments live on.
    fn workers_of(&self, participant: &str) -> BTreeSet<String> {
        self.plan
            .operations()
            .iter()
            .filter(|o| o.source_participant_id() == participant)
            .map(|o| o.source_snapshot().worker_id().to_string())
            .collect()
    }

    /// (bytes, objects) of the whole plan: the totals of the progress reports.
    fn totals(&self) -> (u64, u64) {
        (self.plan.operations().iter().map(|o| o.target().nbytes()).sum::<u64>(), self.plan.operations().len() as u64)
    }

    fn flush(&mut self, participant: &str, binding: RuntimeBinding) -> Result<Vec<UploadReceipt>> {
        let guard = self.adapter.source_allocation_guards(&binding)?;
        self.flush_attempted = true;
        // Unlike the reference, a participant whose fragments live on several
        // workers is flushed one worker at a time.
        let workers = self.workers_of(participant);
        let mut receipts = Vec::new();
        let totals = self.totals();
        for w in &workers {
            let (base, sink) = (self.flushed_work, self.progress.as_deref());
            let shifted = move |p: &Progress| shift(sink, base, totals, p);
            let args = UploadArgs {
                worker_id: Some(w),
                guard: Some(&*guard),
                transfer_id: None,
                lease: None,
                progress: sink.is_some().then_some(&shifted as &(dyn Fn(&Progress) + Sync)),
            };
            // SAFETY: the adapter (an unsafe trait) vouches for the bindings' memory
            // while its guard pins it.
            let r = unsafe { self.store.upload(&self.plan, &self.source.placement, &binding, args) };
            match r {
                Ok(r) => {
                    let bytes: u64 = self
                        .plan
                        .operations()
                        .iter()
                        .filter(|o| {
                            o.source_participant_id() == participant && o.source_snapshot().worker_id() == w.as_str()
                        })
                        .map(|o| o.target().nbytes())
                        .sum();
                    self.flushed_work = (self.flushed_work.0 + bytes, self.flushed_work.1 + r.len() as u64);
                    self.receipts.extend(r.iter().cloned());
                    receipts.extend(r);
                }
                Err(e) => return Err(e),
            }
        }
        self.flushed.insert(participant.to_string());
        Ok(receipts)
    }

    /// Publishes the manifest. Missing fragments or unflushed participants abort
    /// the writer; transaction errors leave it open for a retry.
    pub fn commit(&mut self) -> Result<StoredManifest> {
        self.require_open()?;
        let mut missing: Vec<&String> = Vec::new();
        for (p, req) in &self.required {
            missing.extend(req.difference(&self.seen[p]));
        }
        if !missing.is_empty() {
            missing.sort();
            let text = missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
            let e =
                store_err(ErrorKind::InvalidArgument, format!("Weight snapshot is missing required fragments: {text}"));
            return Err(self.abort_after(e));
        }
        if let Err(e) = self.flush_pending() {
            return Err(self.abort_after(e));
        }
        if self.required.keys().any(|p| !self.flushed.contains(p)) {
            let e = store_err(ErrorKind::InvalidArgument, "Weight snapshot has unflushed participants");
            return Err(self.abort_after(e));
        }
        let mut may_exist = false;
        let result = {
            let mut cb = || may_exist = true;
            self.store.commit(&self.plan, &self.receipts, Some(&mut cb))
        };
        self.decision_may_exist |= may_exist;
        let m = result?;
        self.closed = true;
        self.committed = true;
        Ok(m)
    }

    /// Aborts the snapshot: records `abort` and removes every payload of the plan.
    /// A no-op when closed. Fails (and stays open) when the commit decision may
    /// exist: retry `commit` instead.
    pub fn abort(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        if self.decision_may_exist {
            return Err(store_err(
                ErrorKind::Conflict,
                "Weight snapshot commit decision may exist; retry commit instead",
            ));
        }
        self.closed = true;
        // Unlike the reference, abort whenever a flush was attempted, even without
        // receipts: a failed first flush may have left payloads that only an abort
        // decision lets `finalize` clean.
        if self.receipts.is_empty() && !self.flush_attempted {
            return Ok(());
        }
        self.store.abort_upload(&self.plan, &self.receipts)
    }

    fn abort_after(&mut self, e: Error) -> Error {
        match self.abort() {
            Ok(()) => e,
            Err(a) => Error::new(e.kind(), format!("{}; abort failed: {}", e.message(), a.message())),
        }
    }
}

/// Reports one upload's progress `p` to `sink`, shifted onto the whole snapshot's
/// `totals` by `base`, the (bytes, objects) uploaded before it.
fn shift(sink: Option<&(dyn Fn(&Progress) + Send + Sync)>, base: (u64, u64), totals: (u64, u64), p: &Progress) {
    if let Some(f) = sink {
        f(&Progress {
            phase: ProgressPhase::Upload,
            bytes_done: (base.0 + p.bytes_done).min(totals.0),
            bytes_total: totals.0,
            items_done: (base.1 + p.items_done).min(totals.1),
            items_total: totals.1,
        })
    }
}

impl<A: SnapshotAdapter> Drop for SnapshotWriter<'_, A> {
    fn drop(&mut self) {
        if !self.closed && !self.decision_may_exist {
            let _ = self.abort();
        }
    }
}
