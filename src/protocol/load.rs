//! Restore: `load_manifest`, binding a logical plan to target buffers, and
//! executing it with ranged reads straight into the target buffers
//! (`load-path.md` §1, §4–§6). The execution is [`WeightStore::load`], defined
//! here as a sequence of named steps.

use super::guards::{acquire_pin, GuardProvider, LifetimeToken, TerminalState};
use super::progress::{ProgressFn, ProgressPhase, Reporter};
use super::registration::{registration_requests, RegistrationLease};
use super::state::WeightStore;

use super::device_staging::{self as staging, InFlight, MIRROR_ALIGN, WINDOW_BYTES};
use super::integrity::{CheckLimits, Delivered, Verifier};
use crate::device::{coalesce_into, Batches, CopyDirection, CopyRange, DeviceEngine};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::model::StoredManifest;
use crate::plan::bound_load::LoadPlan;
use crate::plan::integrity::BLOCK_BYTES;
use crate::plan::load::TransferRegion;
use crate::runtime::MemoryRegion;
use crate::runtime::{validate_runtime_binding, MemoryKind, RuntimeBinding, RuntimeFragment};
use crate::store::{ObjectStore, RangeRead, StridedRead};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

fn store_err(kind: ErrorKind, msg: impl Into<String>) -> Error {
    Error::new(kind, msg)
}

/// Reads and strictly decodes the manifest at `manifest_key` (`load-path.md` §1).
///
/// Errors: `manifest get failed: <key>` (the backend's kind, e.g. `NotFound`),
/// `invalid weight manifest: <key>: <detail>` ([`ErrorKind::InvalidManifest`]),
/// `manifest key mismatch: expected <key>, got <key2>` (`InvalidManifest`).
///
/// Reads at most [`crate::store::DEFAULT_MAX_METADATA_BYTES`]; see
/// [`load_manifest_limited`].
pub fn load_manifest(store: &dyn ObjectStore, manifest_key: &str) -> Result<StoredManifest> {
    load_manifest_limited(store, manifest_key, crate::store::DEFAULT_MAX_METADATA_BYTES)
}

/// As [`load_manifest`], reading at most `max_bytes`: a larger object fails with
/// `manifest get failed: <key>: object <key> holds N bytes, more than the limit of M
/// bytes` ([`ErrorKind::LimitExceeded`]) before it is read or allocated.
pub fn load_manifest_limited(store: &dyn ObjectStore, manifest_key: &str, max_bytes: u64) -> Result<StoredManifest> {
    let bytes = store
        .get_limited(manifest_key, max_bytes)
        .map_err(|e| store_err(e.kind(), format!("manifest get failed: {manifest_key}: {}", e.message())))?;
    decode_manifest(manifest_key, &bytes)
}

/// Checks that the store's manifest at the plan's manifest key is the plan's
/// manifest. Fast path: the stored bytes equal the plan's canonical JSON (which
/// decodes to exactly the plan's manifest, digest included), so they are not decoded
/// again on every restore call; any other bytes are decoded strictly and compared, as
/// before, with the same errors: `weight manifest is not committed: <detail>`
/// (`NotFound`) and `committed weight manifest differs from load plan` (`Conflict`).
fn check_committed(ws: &WeightStore, plan: &LoadPlan) -> Result<()> {
    let key = plan.manifest().manifest_key();
    let not_committed =
        |e: Error| store_err(ErrorKind::NotFound, format!("weight manifest is not committed: {}", e.message()));
    let bytes = ws
        .store
        .get_limited(key, ws.limits.max_metadata_bytes)
        .map_err(|e| store_err(e.kind(), format!("manifest get failed: {key}: {}", e.message())))
        .map_err(not_committed)?;
    if bytes == plan.manifest_json().as_bytes() {
        return Ok(());
    }
    let committed = decode_manifest(key, &bytes).map_err(not_committed)?;
    if committed != *plan.manifest() {
        return Err(store_err(ErrorKind::Conflict, "committed weight manifest differs from load plan"));
    }
    Ok(())
}

/// Strictly decodes manifest bytes read from `manifest_key` (the decoding half of
/// [`load_manifest_limited`], same errors).
fn decode_manifest(manifest_key: &str, bytes: &[u8]) -> Result<StoredManifest> {
    let m = StoredManifest::from_json(bytes).map_err(|e| {
        store_err(ErrorKind::InvalidManifest, format!("invalid weight manifest: {manifest_key}: {}", e.message()))
    })?;
    if m.manifest_key() != manifest_key {
        return Err(store_err(
            ErrorKind::InvalidManifest,
            format!("manifest key mismatch: expected {manifest_key}, got {}", m.manifest_key()),
        ));
    }
    Ok(m)
}

/// Execution limits of a restore (`store-protocol.md` §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Largest single range read (bytes). Default 64 MiB.
    pub max_range_bytes: u64,
    /// Ranges per `get_into_ranges` call. Default 1024.
    pub max_ranges_per_request: usize,
    /// Largest `segment_count` of one region at execution. Default 2^32.
    pub max_region_segments: u64,
    /// Check that the plan's manifest is the committed one before reading.
    /// Default true.
    pub require_committed: bool,
    /// Budget of the host staging buffer for regions of many short rows (see
    /// `StoreLimits::staging_bytes`); 0 = never stage.
    pub staging_bytes: u64,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_range_bytes: 64 << 20,
            max_ranges_per_request: 1024,
            max_region_segments: 1 << 32,
            require_committed: true,
            staging_bytes: super::state::DEFAULT_STAGING_BYTES,
        }
    }
}

impl LoadOptions {
    /// The three limits must be positive (`range limits must be positive`).
    pub fn validate(&self) -> Result<()> {
        if self.max_range_bytes == 0 || self.max_ranges_per_request == 0 || self.max_region_segments == 0 {
            return invalid("range limits must be positive");
        }
        Ok(())
    }
}

/// Statistics of one executed restore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Regions executed.
    pub regions: u64,
    /// Ranges read.
    pub ranges: u64,
    /// `get_into_ranges` calls.
    pub requests: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Regions read as whole regions by a store with native strided reads
    /// (embedded stores).
    pub strided_regions: u64,
    /// Regions read row by row as ranges straight into the target.
    pub direct_regions: u64,
    /// Regions read as one span into a staging buffer and scattered locally (chosen
    /// by the store's cost model when many short rows would each pay a range).
    pub staged_regions: u64,
    /// Bytes read into staging buffers (the staged regions' spans: their rows plus
    /// the gaps between them).
    pub staged_bytes: u64,
    /// Bytes of the stored 1 MiB blocks checked against the revision's integrity
    /// record (0 when the restore was not verified: verification off, or a revision
    /// without a record).
    pub verified_bytes: u64,
    /// Bytes read only to complete that check: the parts of blocks this restore did
    /// not read itself (the gaps of partly read blocks), and blocks read again
    /// (delivered to device memory by a store that cannot sum it, or by overlapping
    /// reads).
    pub verify_read_bytes: u64,
}

struct PendingRange {
    key_index: u32,
    object_offset: u64,
    dest: MemoryRegion,
}

/// Options of [`WeightStore::load`].
#[derive(Clone, Copy, Default)]
pub struct LoadArgs<'a> {
    /// Restricts the load to the target fragments on one worker (default: all
    /// workers of the participant, which one process may serve).
    pub worker_id: Option<&'a str>,
    /// Pins the target allocations during I/O (required).
    pub guard: Option<&'a dyn GuardProvider>,
    /// Transfer id handed to the guard (default: random hex).
    pub transfer_id: Option<&'a str>,
    /// Skip the committed-manifest check (only for callers that verified it).
    pub skip_committed_check: bool,
    /// A registration lease that already pins and registers exactly these target
    /// fragments (then `guard` is not used and nothing is registered per call).
    pub lease: Option<&'a RegistrationLease>,
    /// Called with throttled [`Progress`](super::Progress) reports of the reads
    /// ([`ProgressPhase::Restore`](super::ProgressPhase), items = transfer regions),
    /// on the calling thread. `None`: no reports.
    pub progress: Option<super::ProgressFn<'a>>,
}

impl WeightStore {
    /// Executes the part of `plan` that belongs to `binding`'s participant
    /// (`load-path.md` §6): checks the binding still matches the plan (`stale
    /// target fragment: <id>`, `target executor snapshot mismatch`), that the plan's
    /// manifest is the committed one, pins and registers the target buffers, then
    /// reads every range straight into them in bounded batches and checks each
    /// range's result. Nothing is registered or read before every check passed.
    ///
    /// # Safety
    /// Every target view of `binding` (address, nbytes) must be valid for writes and
    /// not accessed by anyone else for the duration of the call; `args.guard` must
    /// pin them.
    pub unsafe fn load(&self, plan: &LoadPlan, binding: &RuntimeBinding, args: LoadArgs<'_>) -> Result<LoadStats> {
        let options = load_options(self, &args);
        let ops = select_binding(plan, binding, &options, args.worker_id)?;
        if ops.is_empty() {
            return Ok(LoadStats::default());
        }
        let shared = self.shared_checks(plan, &ops, &options)?;
        // SAFETY: this function's contract.
        unsafe { self.execute(plan, binding, &ops, &args, &options, &shared) }
    }

    /// Loads several participants of this process in one call: what one
    /// [`WeightStore::load`] per binding, in order, does, with the checks of the
    /// plan done once for all of them (`load-path.md` §6 step 5, the committed
    /// manifest; the objects' sizes; the integrity record) where the loads in turn
    /// repeat them per binding. Returns each binding's statistics (in `bindings`
    /// order).
    ///
    /// Every binding's own checks (steps 1-4, 6) run before any store call; then the
    /// plan's checks for the union of their regions; then each binding is pinned,
    /// registered and read as by `load` (a binding with no region of the plan loads
    /// nothing), on up to [`crate::store::io_threads`] threads at once (as concurrent
    /// `load` calls of different participants may; their targets are disjoint), or
    /// one after the other on the calling thread when `args.progress` is set (each
    /// binding reports its own restore there). A failure stops the call: no binding
    /// starts after it, those that started finish, the others stay untouched; the
    /// error of the first failed binding (in `bindings` order) is returned. Errors:
    /// those of `load`, plus
    /// [`ErrorKind::InvalidArgument`] for a participant given twice or `args.lease`
    /// set (a lease covers one binding). Thread safety: as `load`.
    ///
    /// # Safety
    /// As [`WeightStore::load`], for every binding.
    pub unsafe fn load_many(
        &self,
        plan: &LoadPlan,
        bindings: &[&RuntimeBinding],
        args: LoadArgs<'_>,
    ) -> Result<Vec<LoadStats>> {
        if args.lease.is_some() {
            return Err(store_err(
                ErrorKind::InvalidArgument,
                "load_many takes no registration lease (a lease covers one binding)",
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(bindings.len());
        for b in bindings {
            if !seen.insert((b.participant_id(), b.instance_id())) {
                return Err(store_err(
                    ErrorKind::InvalidArgument,
                    format!("target participant given twice: {}", b.participant_id()),
                ));
            }
        }
        let options = load_options(self, &args);
        let mut selected = Vec::with_capacity(bindings.len());
        for b in bindings {
            selected.push(select_binding(plan, b, &options, args.worker_id)?);
        }
        let all: Vec<usize> = selected.iter().flatten().copied().collect();
        if all.is_empty() {
            return Ok(vec![LoadStats::default(); bindings.len()]);
        }
        let shared = self.shared_checks(plan, &all, &options)?;
        let work: Vec<usize> = (0..bindings.len()).filter(|&i| !selected[i].is_empty()).collect();
        // Progress is reported on the calling thread: with a callback, in turn.
        let threads = if args.progress.is_some() { 1 } else { crate::store::io_threads().min(work.len()) };
        let mut out = vec![LoadStats::default(); bindings.len()];
        if threads <= 1 {
            for &i in &work {
                // SAFETY: this function's contract, for this binding.
                out[i] = unsafe { self.execute(plan, bindings[i], &selected[i], &args, &options, &shared) }?;
            }
            return Ok(out);
        }
        // The bindings' targets are disjoint (the plan refuses conflicting target
        // ranges, and each binding was checked against the plan), so their loads run
        // on `threads` threads, as concurrent `load` calls may; after a failure no
        // further binding starts.
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let results: Vec<Mutex<Option<Result<LoadStats>>>> = work.iter().map(|_| Mutex::new(None)).collect();
        // The arguments without lease and progress (both `None` here), shareable.
        let (worker_id, guard, transfer_id, skip) =
            (args.worker_id, args.guard, args.transfer_id, args.skip_committed_check);
        let worker = || loop {
            let args =
                LoadArgs { worker_id, guard, transfer_id, skip_committed_check: skip, lease: None, progress: None };
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= work.len() || failed.load(Ordering::Relaxed) {
                break;
            }
            let i = work[k];
            // SAFETY: this function's contract, for this binding (its targets are
            // disjoint from the other bindings').
            let r = unsafe { self.execute(plan, bindings[i], &selected[i], &args, &options, &shared) };
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            *results[k].lock() = Some(r);
        };
        std::thread::scope(|sc| {
            for _ in 1..threads {
                sc.spawn(worker);
            }
            worker();
        });
        for (k, r) in results.into_iter().enumerate() {
            if let Some(r) = r.into_inner() {
                out[work[k]] = r?;
            }
        }
        Ok(out)
    }

    /// The checks of `plan` before any target is touched, for the regions `ops`: the
    /// committed manifest (unless skipped), memory support, the objects' sizes, and
    /// the integrity record a verified restore checks against.
    fn shared_checks<'p>(&self, plan: &'p LoadPlan, ops: &[usize], options: &LoadOptions) -> Result<Shared<'p>> {
        if options.require_committed {
            check_committed(self, plan)?;
        }
        check_memory_support(self, plan, ops)?;
        let name = |key: &str| describe_object(plan, ops, key);
        let object_sizes = check_object_sizes(self, plan, ops, &name)?;
        let verifier = super::integrity::prepare(self, plan)?;
        Ok(Shared { object_sizes, verifier })
    }

    /// Pins, registers and reads the regions `ops` of `binding` (checked by
    /// [`select_binding`] and [`WeightStore::shared_checks`]).
    ///
    /// # Safety
    /// As [`WeightStore::load`].
    unsafe fn execute(
        &self,
        plan: &LoadPlan,
        binding: &RuntimeBinding,
        ops: &[usize],
        args: &LoadArgs<'_>,
        options: &LoadOptions,
        shared: &Shared<'_>,
    ) -> Result<LoadStats> {
        let (object_sizes, verifier) = (&shared.object_sizes, shared.verifier.as_ref());
        // How integrity errors name an object: its stored fragment (tensor, box, ids),
        // looked up only when an error needs it.
        let name = |key: &str| describe_object(plan, ops, key);
        // Group by target runtime fragment (sorted by runtime id).
        let by_target = group_by_target(plan, ops);
        let targets: Vec<&RuntimeFragment> = by_target.values().map(|l| plan.target_fragment(l[0])).collect();
        let mut token = pin_targets(self, binding, args, &by_target, &targets)?;
        // Device targets go through the device engine (staged); the store never sees them.
        let (by_target, on_device) = staging::split_device_targets(self, plan, by_target);
        let store_targets: Vec<&RuntimeFragment> = by_target.values().map(|l| plan.target_fragment(l[0])).collect();
        let requests = registration_requests_or_release(&store_targets, &mut token)?;
        let mut stats = start_tally(plan, ops, args.progress, verifier.is_some());
        let body = |io_started: &mut bool| {
            *io_started = true;
            // SAFETY: the caller upholds this function's `# Safety` contract, which is
            // `read_regions`'s; every bound was checked above.
            let read = unsafe { read_regions(self, plan, &by_target, options, &mut stats, None) };
            let mut checked = verify_reads(self, read, verifier, object_sizes, &name, options, &mut stats);
            if checked.is_ok() && !on_device.is_empty() {
                let verify = WindowCheck { verifier, object_sizes, name: &name };
                // SAFETY: as above; the device targets are valid device memory of the
                // engine's device (this function's contract).
                checked = unsafe { restore_on_device(self, plan, &on_device, options, &mut stats, &verify) };
            }
            if checked.is_ok() {
                stats.progress.finish();
            }
            checked
        };
        run_registered(self, &requests, token, body)?;
        let st = stats.stats;
        log_restore(self, plan, binding, options, &st);
        Ok(st)
    }
}

/// What [`WeightStore::shared_checks`] found: the objects' sizes and the verifier.
struct Shared<'p> {
    object_sizes: BTreeMap<&'p str, u64>,
    verifier: Option<Verifier>,
}

/// `binding`'s regions of `plan` (on `worker_id` when given), after its own checks:
/// the binding against the plan's target placement, its planned twin, each target
/// fragment, the worker (`load-path.md` §6 steps 1-4, 6). No store I/O.
fn select_binding(
    plan: &LoadPlan,
    binding: &RuntimeBinding,
    options: &LoadOptions,
    worker_id: Option<&str>,
) -> Result<Vec<usize>> {
    check_target_binding(plan, binding)?;
    let (bi, planned) = planned_binding(plan, binding)?;
    let ops = select_regions(plan, bi, planned, binding, worker_id, options.max_region_segments)?;
    check_worker(planned, worker_id)?;
    Ok(ops)
}

/// The execution limits of one load: the store's, and `args`' committed check.
fn load_options(ws: &WeightStore, args: &LoadArgs<'_>) -> LoadOptions {
    LoadOptions {
        max_range_bytes: ws.limits.max_range_bytes,
        max_ranges_per_request: ws.limits.max_ranges_per_request,
        max_region_segments: ws.limits.max_region_segments,
        require_committed: !args.skip_committed_check,
        staging_bytes: ws.limits.staging_bytes,
    }
}

/// `binding` paired with the plan's target placement (`invalid target runtime
/// binding: <detail>`, [`ErrorKind::InvalidBinding`]).
fn check_target_binding(plan: &LoadPlan, binding: &RuntimeBinding) -> Result<()> {
    let target = plan.logical().target();
    validate_runtime_binding(target, binding)
        .map_err(|e| store_err(ErrorKind::InvalidBinding, format!("invalid target runtime binding: {}", e.message())))
}

/// The plan's binding of `binding`'s participant and instance (its index and the
/// binding as planned), under the same lease (`target executor snapshot mismatch`,
/// [`ErrorKind::StaleBinding`]).
fn planned_binding<'p>(plan: &'p LoadPlan, binding: &RuntimeBinding) -> Result<(usize, &'p RuntimeBinding)> {
    let bi = plan
        .bindings()
        .iter()
        .position(|b| b.participant_id() == binding.participant_id() && b.instance_id() == binding.instance_id())
        .ok_or_else(|| store_err(ErrorKind::StaleBinding, "target executor snapshot mismatch: unknown instance"))?;
    let planned = &plan.bindings()[bi];
    if planned.lease_id() != binding.lease_id() || planned.lease_generation() != binding.lease_generation() {
        return Err(store_err(ErrorKind::StaleBinding, "target executor snapshot mismatch"));
    }
    Ok((bi, planned))
}

/// The regions (indices into `plan.regions()`) that target the planned binding
/// `bi` (on `worker_id` when given), in plan order; each target fragment must be
/// the one planned (`stale target fragment: <id>`) and each region within
/// `max_region_segments`.
fn select_regions(
    plan: &LoadPlan,
    bi: usize,
    planned: &RuntimeBinding,
    binding: &RuntimeBinding,
    worker_id: Option<&str>,
    max_region_segments: u64,
) -> Result<Vec<usize>> {
    let mut ops: Vec<usize> = Vec::new();
    for (i, &(b, f)) in plan.region_targets().iter().enumerate() {
        if b as usize != bi {
            continue;
        }
        let planned_frag = &planned.fragments()[f as usize];
        if worker_id.is_some_and(|w| w != planned_frag.worker_id()) {
            continue;
        }
        match binding.fragment_for(planned_frag.placement_fragment_id()) {
            Some(cur) if cur == planned_frag => {}
            _ => {
                return Err(store_err(
                    ErrorKind::StaleBinding,
                    format!("stale target fragment: {}", planned_frag.fragment_id()),
                ))
            }
        }
        let r = &plan.regions()[i];
        let count = r.segment_count();
        if count > max_region_segments {
            return Err(store_err(
                ErrorKind::LimitExceeded,
                format!(
                    "transfer region exceeds max_region_segments: {}: {count} > {}",
                    plan.logical().source_of(r).tensor_id(),
                    max_region_segments
                ),
            ));
        }
        ops.push(i);
    }
    Ok(ops)
}

/// A given `worker_id` must hold a fragment of the planned binding (`unknown target
/// worker: <id>`).
fn check_worker(planned: &RuntimeBinding, worker_id: Option<&str>) -> Result<()> {
    if let Some(w) = worker_id {
        if !planned.fragments().iter().any(|f| f.worker_id() == w) {
            return Err(store_err(ErrorKind::InvalidArgument, format!("unknown target worker: {w}")));
        }
    }
    Ok(())
}

/// Every target of `ops` in device memory needs a device engine or a store that
/// reaches device memory itself.
fn check_memory_support(ws: &WeightStore, plan: &LoadPlan, ops: &[usize]) -> Result<()> {
    if ws.device.is_some() {
        return Ok(());
    }
    if let Some(f) = ops
        .iter()
        .map(|&i| plan.target_fragment(i))
        .find(|f| f.memory() != MemoryKind::Host && !ws.store.supports_memory(f.memory()))
    {
        return Err(store_err(
            ErrorKind::Unsupported,
            format!("target fragment {} is device memory: give the weight store a device engine", f.fragment_id()),
        ));
    }
    Ok(())
}

/// How integrity errors name the object `key`: the stored fragment of the first
/// region of `ops` it holds, else the key alone.
fn describe_object(plan: &LoadPlan, ops: &[usize], key: &str) -> String {
    let source = |&i: &usize| plan.logical().source_of(&plan.regions()[i]);
    match ops.iter().map(source).find(|f| f.object_key() == key) {
        Some(f) => super::integrity::describe(f),
        None => format!("payload of object {key}"),
    }
}

/// The size of every object `ops` read from (keyed by object key). Never trust the
/// store: every object must be at least as long as the manifest claims before any
/// byte is written.
fn check_object_sizes<'p>(
    ws: &WeightStore,
    plan: &'p LoadPlan,
    ops: &[usize],
    name: &dyn Fn(&str) -> String,
) -> Result<BTreeMap<&'p str, u64>> {
    let mut needed: BTreeMap<&str, u64> = BTreeMap::new();
    for &i in ops {
        let src = plan.logical().source_of(&plan.regions()[i]);
        let end = src.object_offset() + src.nbytes(); // fits: checked at decode
        let e = needed.entry(src.object_key()).or_insert(0);
        *e = (*e).max(end);
    }
    let keys: Vec<&str> = needed.keys().copied().collect();
    let sizes = ws.store.object_sizes(&keys);
    if sizes.len() != keys.len() {
        return Err(store_err(ErrorKind::Store, "object_sizes returned invalid result count"));
    }
    let mut object_sizes: BTreeMap<&str, u64> = BTreeMap::new();
    for ((key, end), size) in needed.iter().zip(sizes) {
        let size =
            size.map_err(|e| store_err(e.kind(), format!("get_into_ranges failed for {key}: {}", e.message())))?;
        if size < *end {
            return Err(store_err(
                ErrorKind::Integrity,
                format!("get_into_ranges failed for {key}: {} holds {size} bytes, the manifest needs {end}", name(key)),
            ));
        }
        object_sizes.insert(key, size);
    }
    Ok(object_sizes)
}

/// The regions of `ops` grouped by target runtime fragment id (sorted).
fn group_by_target<'p>(plan: &'p LoadPlan, ops: &[usize]) -> BTreeMap<&'p str, Vec<usize>> {
    let mut by_target: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &i in ops {
        by_target.entry(plan.target_fragment(i).fragment_id()).or_default().push(i);
    }
    by_target
}

/// Pins the targets for the call: through `args.lease` (which must hold them; no
/// token: nothing to release), or through `args.guard` (required then), whose
/// fresh binding must still hold every target (`stale target fragment: <id>`, the
/// pin released as aborted). Returns the pin's token.
fn pin_targets(
    ws: &WeightStore,
    binding: &RuntimeBinding,
    args: &LoadArgs<'_>,
    by_target: &BTreeMap<&str, Vec<usize>>,
    targets: &[&RuntimeFragment],
) -> Result<Option<Box<dyn LifetimeToken>>> {
    Ok(match args.lease {
        Some(lease) => {
            lease.validate(binding, targets)?;
            None
        }
        None => {
            let guard = args.guard.ok_or_else(|| {
                store_err(ErrorKind::InvalidArgument, "target allocation guard providers are required")
            })?;
            ws.registrar.check_unblocked()?;
            let ids: Vec<String> = by_target.keys().map(|s| s.to_string()).collect();
            let transfer_id =
                args.transfer_id.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let (fresh, mut token) = acquire_pin(guard, "target", &transfer_id, binding, &ids)?;
            for t in targets {
                if fresh.fragment_for(t.placement_fragment_id()) != Some(*t) {
                    let _ = token.release(TerminalState::Aborted);
                    return Err(store_err(
                        ErrorKind::StaleBinding,
                        format!("stale target fragment: {}", t.fragment_id()),
                    ));
                }
            }
            Some(token)
        }
    })
}

/// The registration requests of `targets`; on failure the pin's `token` (if any) is
/// released as aborted.
fn registration_requests_or_release(
    targets: &[&RuntimeFragment],
    token: &mut Option<Box<dyn LifetimeToken>>,
) -> Result<Vec<MemoryRegion>> {
    match registration_requests(targets) {
        Ok(r) => Ok(r),
        Err(e) => {
            if let Some(mut token) = token.take() {
                let _ = token.release(TerminalState::Aborted);
            }
            Err(e)
        }
    }
}

/// The statistics of a load of `ops` and its progress reporter (bytes and regions
/// of `ops`), collecting what the reads deliver when `verify`.
fn start_tally<'p>(plan: &LoadPlan, ops: &[usize], progress: Option<ProgressFn<'p>>, verify: bool) -> Tally<'p> {
    let total_bytes: u64 = ops.iter().map(|&i| plan.regions()[i].total_bytes()).sum();
    Tally {
        stats: LoadStats::default(),
        progress: Reporter::start(progress, ProgressPhase::Restore, total_bytes, ops.len() as u64),
        delivered: verify.then(Delivered::default),
    }
}

/// Reads every region of `by_target` into its target: strided where the store reads
/// strided regions natively, else staged (when `options.staging_bytes` allows), else
/// range by range.
///
/// # Safety
/// As [`WeightStore::load`]: every target of `by_target` must be valid for writes
/// and not accessed by anyone else for the duration of the call, and the regions
/// must have been checked against the plan and the objects' sizes.
unsafe fn read_regions(
    ws: &WeightStore,
    plan: &LoadPlan,
    by_target: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    mirrors: Mirrors<'_>,
) -> Result<()> {
    if ws.store.supports_strided_reads() {
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        let r = unsafe { read_strided(&*ws.store, plan, by_target, stats, mirrors) };
        stats.strided_regions = stats.regions;
        r
    } else if options.staging_bytes > 0 {
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        unsafe { read_staged(ws, plan, by_target, options, stats, mirrors) }
    } else {
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        let r = unsafe { read_ranges(&*ws.store, plan, by_target, options, stats, mirrors) };
        stats.direct_regions = stats.regions;
        r
    }
}

/// After successful reads of a verified restore, checks what they delivered
/// against the integrity record (reading the gaps of partly read blocks); else
/// `read` as it is.
fn verify_reads(
    ws: &WeightStore,
    read: Result<()>,
    verifier: Option<&Verifier>,
    object_sizes: &BTreeMap<&str, u64>,
    name: &dyn Fn(&str) -> String,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
) -> Result<()> {
    match (verifier, stats.delivered.take()) {
        (Some(v), Some(delivered)) if read.is_ok() => {
            let limits = CheckLimits {
                max_range_bytes: options.max_range_bytes,
                max_ranges_per_request: options.max_ranges_per_request,
            };
            v.check(&*ws.store, &ws.staging, delivered, object_sizes, name, &limits).map(|done| {
                stats.verified_bytes += done.bytes;
                stats.verify_read_bytes += done.extra_bytes;
            })
        }
        _ => read,
    }
}

/// Runs `body` (the reads): registered for the call and pinned by `token`, or, under
/// a registration lease (no token), once no quarantined registration blocks I/O.
fn run_registered(
    ws: &WeightStore,
    requests: &[MemoryRegion],
    token: Option<Box<dyn LifetimeToken>>,
    body: impl FnOnce(&mut bool) -> Result<()>,
) -> Result<()> {
    match token {
        Some(token) => ws.registrar.scoped(&*ws.store, requests, token, body),
        None => {
            ws.registrar.check_unblocked()?;
            body(&mut false)
        }
    }
}

/// The debug record of one restore (when debug records are on).
fn log_restore(ws: &WeightStore, plan: &LoadPlan, binding: &RuntimeBinding, options: &LoadOptions, st: &LoadStats) {
    if log::log_enabled!(log::Level::Debug) {
        // Which request pattern each region used, and why (`docs/STORE-VTABLE.md`).
        let c = ws.store.cost();
        let why = if ws.store.supports_strided_reads() {
            "the store reads strided regions natively".to_string()
        } else if options.staging_bytes == 0 {
            "staging is off (staging_bytes = 0)".to_string()
        } else {
            format!(
                "regions of many short rows are staged when one span read costs less than a read per row at \
                 {} ns/request, {} ns/range, {} MB/s (staging budget {} B)",
                c.per_request_ns,
                c.per_range_ns,
                c.bytes_per_second / 1_000_000,
                options.staging_bytes
            )
        };
        log::debug!(
            "restore of {} into {}: {} regions, {} B in {} requests ({} ranges): {} strided, {} direct, {} staged \
             ({} B of spans); {why}",
            plan.manifest().manifest_key(),
            binding.participant_id(),
            st.regions,
            st.bytes,
            st.requests,
            st.ranges,
            st.strided_regions,
            st.direct_regions,
            st.staged_regions,
            st.staged_bytes
        );
    }
}

/// Where the reads of a load write: every target fragment itself, or, for the
/// device targets of a staged restore, host staging mirrors of them (runtime
/// fragment id -> mirror address; a mirror has the fragment's `nbytes`).
pub(super) type Mirrors<'a> = Option<&'a HashMap<&'a str, u64>>;

/// The address and memory kind the reads of region `i` write into (see [`Mirrors`]).
fn dest_of(plan: &LoadPlan, i: usize, mirrors: Mirrors<'_>) -> (u64, MemoryKind) {
    let t = plan.target_fragment(i);
    match mirrors.and_then(|m| m.get(t.fragment_id())) {
        Some(&address) => (address, MemoryKind::Host),
        None => (t.address(), t.memory()),
    }
}

/// The statistics of one load and its progress reporter, updated together: every
/// read path adds to the statistics (through `Deref`) and reports after each store
/// call (`report`: bytes read, regions counted so far).
struct Tally<'p> {
    stats: LoadStats,
    progress: Reporter<'p>,
    /// What the reads delivered, with checksums, when the restore is verified.
    delivered: Option<Delivered>,
}

impl Tally<'_> {
    fn report(&mut self) {
        self.progress.advance_to(self.stats.bytes, self.stats.regions);
    }
}

impl std::ops::Deref for Tally<'_> {
    type Target = LoadStats;
    fn deref(&self) -> &LoadStats {
        &self.stats
    }
}

impl std::ops::DerefMut for Tally<'_> {
    fn deref_mut(&mut self) -> &mut LoadStats {
        &mut self.stats
    }
}

/// `get_into_strided`, or its checked form when the restore is verified.
///
/// # Safety
/// As [`ObjectStore::get_into_strided`].
unsafe fn checked_strided(
    store: &dyn ObjectStore,
    reads: &[StridedRead<'_>],
    checked: bool,
) -> Vec<Result<crate::store::CheckedRead>> {
    if checked {
        // SAFETY: the caller's contract.
        unsafe { store.get_into_strided_checked(reads, BLOCK_BYTES) }
    } else {
        // SAFETY: the caller's contract.
        let results = unsafe { store.get_into_strided(reads) };
        results.into_iter().map(|r| r.map(|bytes| crate::store::CheckedRead { bytes, crcs: None })).collect()
    }
}

/// `get_into_ranges`, or its checked form when the restore is verified: then every
/// delivered range's checksums go to `stats.delivered` (per-item results unchanged).
///
/// # Safety
/// As [`ObjectStore::get_into_ranges`].
unsafe fn checked_ranges(store: &dyn ObjectStore, reads: &[RangeRead<'_>], stats: &mut Tally<'_>) -> Vec<Result<u64>> {
    let Some(delivered) = &mut stats.delivered else {
        // SAFETY: the caller's contract.
        return unsafe { store.get_into_ranges(reads) };
    };
    // SAFETY: the caller's contract.
    let results = unsafe { store.get_into_ranges_checked(reads, BLOCK_BYTES) };
    if results.len() != reads.len() {
        return results.into_iter().map(|r| r.map(|c| c.bytes)).collect();
    }
    results
        .into_iter()
        .zip(reads)
        .map(|(res, r)| {
            let c = res?;
            if c.bytes == r.dest.len {
                delivered.add(r.key, c.bytes, c.crcs, |f| {
                    f(r.object_offset, r.dest.len);
                    Ok(())
                })?;
            }
            Ok(c.bytes)
        })
        .collect()
}

/// Regions handed to a backend with native strided reads per call (at least; the
/// regions of one target are never split across calls).
const STRIDED_BATCH: usize = 256;

/// The strided path: whole regions per item (embedded backends have no staging
/// buffer to bound, so no chunking); bounds are checked by the backend against the
/// object and against the target view, which is the registered binding fragment.
unsafe fn read_strided(
    store: &dyn ObjectStore,
    plan: &LoadPlan,
    by_target: &BTreeMap<&str, Vec<usize>>,
    stats: &mut Tally<'_>,
    mirrors: Mirrors<'_>,
) -> Result<()> {
    // Device mirrors: large regions are read in pieces, so that the store copies one
    // region on several threads (a batch's items run in parallel); host targets keep
    // whole regions.
    let pieces = match mirrors {
        Some(_) => split_regions(plan, by_target),
        None => Vec::new(),
    };
    let mut reads: Vec<StridedRead<'_>> = Vec::with_capacity(STRIDED_BATCH);
    // Per read: whether it completes a region (pieces count once).
    let mut whole: Vec<bool> = Vec::with_capacity(STRIDED_BATCH);
    let run = |reads: &mut Vec<StridedRead<'_>>, whole: &mut Vec<bool>, stats: &mut Tally<'_>| -> Result<()> {
        if reads.is_empty() {
            return Ok(());
        }
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        let results = unsafe { checked_strided(store, reads, stats.delivered.is_some()) };
        stats.requests += 1;
        if results.len() != reads.len() {
            return Err(store_err(ErrorKind::Store, "get_into_strided returned invalid result count"));
        }
        for ((r, res), &last) in reads.iter().zip(results).zip(whole.iter()) {
            let res = res.and_then(|c| {
                if let Some(d) = &mut stats.delivered {
                    d.add(r.key, c.bytes, c.crcs, |f| {
                        r.for_each_segment(|s, _, n| {
                            f(s, n);
                            Ok(())
                        })
                    })?;
                }
                Ok(c.bytes)
            });
            match res {
                Ok(n) if n == r.total_bytes() => {
                    stats.ranges += r.segment_count();
                    stats.bytes += n;
                    stats.regions += u64::from(last);
                }
                Ok(n) => {
                    return Err(store_err(
                        ErrorKind::Integrity,
                        format!("get_into_ranges failed for {}: expected {}, got {n}", r.key, r.total_bytes()),
                    ))
                }
                Err(e) => {
                    return Err(store_err(e.kind(), format!("get_into_ranges failed for {}: {}", r.key, e.message())))
                }
            }
        }
        reads.clear();
        whole.clear();
        stats.report();
        Ok(())
    };
    if mirrors.is_some() {
        let mut last_target = usize::MAX;
        for p in &pieces {
            let r = &plan.regions()[p.region];
            let s = plan.logical().source_of(r);
            let t = plan.target_fragment(p.region);
            let (address, kind) = dest_of(plan, p.region, mirrors);
            // A target's pieces stay in one batch (one store call reads a target whole).
            if p.target != last_target && reads.len() >= STRIDED_BATCH {
                run(&mut reads, &mut whole, stats)?;
            }
            last_target = p.target;
            // Each piece's own view of the mirror (first to last byte it writes): pieces
            // are separate destinations, which the store copies in parallel.
            let reach =
                p.inner_bytes + p.counts.iter().zip(&r.target_strides).map(|(&c, &st)| (c - 1) * st).sum::<u64>();
            let start = r.target_base_offset + p.target_delta;
            debug_assert!(start + reach <= t.nbytes());
            reads.push(StridedRead {
                key: s.object_key(),
                object_offset: s.object_offset() + r.source_base_offset + p.source_delta,
                dest: MemoryRegion { address: address + start, len: reach, kind },
                dest_offset: 0,
                inner_bytes: p.inner_bytes,
                counts: &p.counts,
                src_strides: &r.source_strides,
                dst_strides: &r.target_strides,
            });
            whole.push(p.last);
        }
        return run(&mut reads, &mut whole, stats);
    }
    for list in by_target.values() {
        for &i in list {
            let r = &plan.regions()[i];
            let s = plan.logical().source_of(r);
            let t = plan.target_fragment(i);
            let (address, kind) = dest_of(plan, i, mirrors);
            reads.push(StridedRead {
                key: s.object_key(),
                object_offset: s.object_offset() + r.source_base_offset,
                dest: MemoryRegion { address, len: t.nbytes(), kind },
                dest_offset: r.target_base_offset,
                inner_bytes: r.inner_bytes,
                counts: &r.outer_loop_counts,
                src_strides: &r.source_strides,
                dst_strides: &r.target_strides,
            });
            whole.push(true);
        }
        // A target's regions stay in one batch: the store merges them by destination.
        if reads.len() >= STRIDED_BATCH {
            run(&mut reads, &mut whole, stats)?;
        }
    }
    run(&mut reads, &mut whole, stats)
}

/// Bytes of one piece of a region split for parallel reads into device mirrors.
const PIECE_BYTES: u64 = 4 << 20;

/// One piece of a region (see [`split_regions`]): the region's rows (or bytes)
/// `[delta, delta + len)`, as offsets from the region's bases and its loop counts.
struct Piece {
    region: usize,
    /// Index of the target in `by_target` order (pieces of one target stay together).
    target: usize,
    source_delta: u64,
    target_delta: u64,
    inner_bytes: u64,
    counts: Vec<u64>,
    /// The region's last piece (the region counts once).
    last: bool,
}

/// The regions of `by_target` in pieces of about [`PIECE_BYTES`]: a contiguous region
/// (no outer loop) is cut into byte ranges, a region with outer loops into runs of its
/// outermost loop; a small region is one piece.
fn split_regions(plan: &LoadPlan, by_target: &BTreeMap<&str, Vec<usize>>) -> Vec<Piece> {
    let mut out = Vec::new();
    for (ti, list) in by_target.values().enumerate() {
        for &i in list {
            let r = &plan.regions()[i];
            let total = r.total_bytes();
            let whole = |out: &mut Vec<Piece>| {
                out.push(Piece {
                    region: i,
                    target: ti,
                    source_delta: 0,
                    target_delta: 0,
                    inner_bytes: r.inner_bytes,
                    counts: r.outer_loop_counts.clone(),
                    last: true,
                })
            };
            if total <= PIECE_BYTES {
                whole(&mut out);
            } else if r.outer_loop_counts.is_empty() {
                let mut off = 0;
                while off < r.inner_bytes {
                    let len = PIECE_BYTES.min(r.inner_bytes - off);
                    out.push(Piece {
                        region: i,
                        target: ti,
                        source_delta: off,
                        target_delta: off,
                        inner_bytes: len,
                        counts: Vec::new(),
                        last: off + len == r.inner_bytes,
                    });
                    off += len;
                }
            } else {
                let rows = r.outer_loop_counts[0];
                let per_row = total / rows.max(1);
                let step = (PIECE_BYTES / per_row.max(1)).clamp(1, rows);
                let mut first = 0;
                while first < rows {
                    let n = step.min(rows - first);
                    let mut counts = r.outer_loop_counts.clone();
                    counts[0] = n;
                    out.push(Piece {
                        region: i,
                        target: ti,
                        source_delta: first * r.source_strides[0],
                        target_delta: first * r.target_strides[0],
                        inner_bytes: r.inner_bytes,
                        counts,
                        last: first + n == rows,
                    });
                    first += n;
                }
            }
        }
    }
    out
}

/// Scatter copies run at about this rate (a local memcpy of short rows).
const SCATTER_BYTES_PER_SECOND: u64 = 8_000_000_000;

/// Byte span of the source rows of `r` (first byte of the first row to the last byte
/// of the last row), or `None` on overflow.
fn source_span(r: &TransferRegion) -> Option<u64> {
    let mut span = r.inner_bytes;
    for (&n, &stride) in r.outer_loop_counts.iter().zip(&r.source_strides) {
        span = span.checked_add(n.checked_sub(1)?.checked_mul(stride)?)?;
    }
    Some(span)
}

/// Chooses, per region, between reading each row as its own range (`direct`) and
/// reading the region's whole source span into a staging buffer, then scattering the
/// rows locally (`staged`), by the store's cost model ([`crate::store::StoreCost`]):
/// a span is staged when `ranges(span) * per_range + span / bandwidth + bytes /
/// scatter_rate` is below `segments * per_range + bytes / bandwidth`, it fits the
/// staging budget, and the target is host memory. Returns the staged span (bytes)
/// or `None` for direct.
fn staged_span(r: &TransferRegion, cost: &crate::store::StoreCost, cap: u64, max_range_bytes: u64) -> Option<u64> {
    let segments = r.segment_count();
    if segments < 2 {
        return None;
    }
    let span = source_span(r)?;
    if span > cap {
        return None;
    }
    let bytes = r.total_bytes();
    let per_range = cost.per_range_ns as u128;
    let bw = cost.bytes_per_second.max(1) as u128;
    let direct = segments as u128 * per_range + bytes as u128 * 1_000_000_000 / bw;
    let pieces = span.div_ceil(max_range_bytes) as u128;
    let staged = pieces * per_range
        + span as u128 * 1_000_000_000 / bw
        + bytes as u128 * 1_000_000_000 / SCATTER_BYTES_PER_SECOND as u128;
    (staged < direct).then_some(span)
}

/// The restore path for stores that pay per range: each region is read either row
/// by row as ranges straight into the target, or as one span into a registered host
/// staging buffer (several spans per request) and scattered locally, whichever the
/// store's cost model says is cheaper (see [`staged_span`]). Staging buffers are
/// registered once per weight store and reused by later restores. Target bytes are
/// written only after their span was read completely.
unsafe fn read_staged(
    ws: &WeightStore,
    plan: &LoadPlan,
    by_target: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    mirrors: Mirrors<'_>,
) -> Result<()> {
    let store = &*ws.store;
    let cost = store.cost();
    let cap = options.staging_bytes.min(options.max_range_bytes.saturating_mul(options.max_ranges_per_request as u64));
    let mut direct: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut staged: Vec<(usize, u64)> = Vec::new();
    for (id, list) in by_target {
        for &i in list {
            let r = &plan.regions()[i];
            match staged_span(r, &cost, cap, options.max_range_bytes) {
                Some(span) if dest_of(plan, i, mirrors).1 == MemoryKind::Host => staged.push((i, span)),
                _ => direct.entry(id).or_default().push(i),
            }
        }
    }
    if !direct.is_empty() {
        let before = stats.regions;
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        unsafe { read_ranges(store, plan, &direct, options, stats, mirrors) }?;
        stats.direct_regions += stats.regions - before;
    }
    if staged.is_empty() {
        return Ok(());
    }
    let buffer = ws.staging.take(store, cap)?;
    let region = buffer.region();
    let result = (|| -> Result<()> {
        let mut batch: Vec<(usize, u64)> = Vec::new(); // (region index, offset in the buffer)
        let mut used = 0u64;
        let mut ranges = 0usize;
        let pieces = |span: u64| span.div_ceil(options.max_range_bytes) as usize;
        for &(i, span) in &staged {
            if used + span > region.len || ranges + pieces(span) > options.max_ranges_per_request {
                // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
                unsafe { flush_staged(store, plan, &batch, region, options, stats, mirrors) }?;
                batch.clear();
                used = 0;
                ranges = 0;
            }
            batch.push((i, used));
            used += span;
            ranges += pieces(span);
        }
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        unsafe { flush_staged(store, plan, &batch, region, options, stats, mirrors) }
    })();
    ws.staging.give_back(buffer);
    result
}

unsafe fn flush_staged(
    store: &dyn ObjectStore,
    plan: &LoadPlan,
    batch: &[(usize, u64)],
    staging: MemoryRegion,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    mirrors: Mirrors<'_>,
) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let mut reads: Vec<RangeRead<'_>> = Vec::new();
    for &(i, off) in batch {
        let r = &plan.regions()[i];
        let s = plan.logical().source_of(r);
        let span = source_span(r).expect("checked when the region was chosen for staging");
        let mut c = 0;
        while c < span {
            let len = options.max_range_bytes.min(span - c);
            reads.push(RangeRead {
                key: s.object_key(),
                object_offset: s.object_offset() + r.source_base_offset + c,
                dest: MemoryRegion { address: staging.address + off + c, len, kind: MemoryKind::Host },
            });
            c += len;
        }
    }
    // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
    let results = unsafe { checked_ranges(store, &reads, stats) };
    stats.requests += 1;
    if results.len() != reads.len() {
        return Err(store_err(ErrorKind::Store, "get_into_ranges returned invalid range count"));
    }
    for (read, res) in reads.iter().zip(results) {
        match res {
            Ok(n) if n == read.dest.len => stats.ranges += 1,
            Ok(n) => {
                return Err(store_err(
                    ErrorKind::Integrity,
                    format!("get_into_ranges failed for {}: expected {}, got {n}", read.key, read.dest.len),
                ))
            }
            Err(e) => {
                return Err(store_err(e.kind(), format!("get_into_ranges failed for {}: {}", read.key, e.message())))
            }
        }
    }
    // Scatter: every span was read whole; rows stay inside the target view (the
    // planner checked the region against the target fragment's size) and inside the
    // span (offsets below are at most `span - inner_bytes`).
    let base = staging.address as *const u8;
    for &(i, off) in batch {
        let r = &plan.regions()[i];
        let dst = dest_of(plan, i, mirrors).0 as *mut u8;
        let dims = r.outer_loop_counts.len();
        let mut idx = vec![0u64; dims];
        'rows: loop {
            let (mut so, mut to) = (off, r.target_base_offset);
            for ((&i, &ss), &ts) in idx.iter().zip(&r.source_strides).zip(&r.target_strides) {
                so += i * ss;
                to += i * ts;
            }
            // SAFETY: `so..so + inner_bytes` lies in this region's span of the staging
            // buffer (which we own and which the store filled), and `to..to +
            // inner_bytes` in the target view the caller guarantees writable and
            // unaliased (this function's contract); the two never overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(base.add(so as usize), dst.add(to as usize), r.inner_bytes as usize)
            };
            // The next outer index, last dimension fastest; done after the last row.
            let mut d = dims;
            loop {
                if d == 0 {
                    break 'rows;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < r.outer_loop_counts[d] {
                    continue 'rows;
                }
                idx[d] = 0;
            }
        }
        stats.bytes += r.total_bytes();
        stats.regions += 1;
        stats.staged_regions += 1;
        stats.staged_bytes += source_span(r).unwrap_or(0);
    }
    stats.report();
    Ok(())
}

unsafe fn read_ranges(
    store: &dyn ObjectStore,
    plan: &LoadPlan,
    by_target: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    mirrors: Mirrors<'_>,
) -> Result<()> {
    let mut keys: Vec<&str> = Vec::new();
    let mut key_index: HashMap<&str, u32> = HashMap::new();
    let mut batch: Vec<PendingRange> = Vec::with_capacity(options.max_ranges_per_request);
    for list in by_target.values() {
        let mut list = list.clone();
        let src = |i: usize| plan.logical().source_of(&plan.regions()[i]);
        list.sort_by(|&a, &b| {
            let (ra, rb) = (&plan.regions()[a], &plan.regions()[b]);
            (ra.target_base_offset, src(a).object_key(), ra.source_base_offset).cmp(&(
                rb.target_base_offset,
                src(b).object_key(),
                rb.source_base_offset,
            ))
        });
        for i in list {
            let r = &plan.regions()[i];
            let s = src(i);
            let (address, kind) = dest_of(plan, i, mirrors);
            let ki = *key_index.entry(s.object_key()).or_insert_with(|| {
                keys.push(s.object_key());
                (keys.len() - 1) as u32
            });
            let mut err = None;
            r.for_each_segment(options.max_region_segments, |so, to, n| {
                let mut c = 0;
                while c < n && err.is_none() {
                    let len = options.max_range_bytes.min(n - c);
                    batch.push(PendingRange {
                        key_index: ki,
                        object_offset: s.object_offset() + so + c,
                        dest: MemoryRegion { address: address + to + c, len, kind },
                    });
                    if batch.len() == options.max_ranges_per_request {
                        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
                        if let Err(e) = unsafe { flush(store, &keys, &mut batch, stats) } {
                            err = Some(e);
                        }
                    }
                    c += len;
                }
            })?;
            if let Some(e) = err {
                return Err(e);
            }
            stats.regions += 1;
        }
    }
    // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
    unsafe { flush(store, &keys, &mut batch, stats) }
}

unsafe fn flush(
    store: &dyn ObjectStore,
    keys: &[&str],
    batch: &mut Vec<PendingRange>,
    stats: &mut Tally<'_>,
) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let reads: Vec<RangeRead<'_>> = batch
        .iter()
        .map(|p| RangeRead { key: keys[p.key_index as usize], object_offset: p.object_offset, dest: p.dest })
        .collect();
    // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
    let results = unsafe { checked_ranges(store, &reads, stats) };
    stats.requests += 1;
    if results.len() != reads.len() {
        return Err(store_err(ErrorKind::Store, "get_into_ranges returned invalid range count"));
    }
    for (read, res) in reads.iter().zip(results) {
        match res {
            Ok(n) if n == read.dest.len => {
                stats.ranges += 1;
                stats.bytes += n;
            }
            Ok(n) => {
                return Err(store_err(
                    ErrorKind::Integrity,
                    format!("get_into_ranges failed for {}: expected {}, got {n}", read.key, read.dest.len),
                ))
            }
            Err(e) => {
                return Err(store_err(e.kind(), format!("get_into_ranges failed for {}: {}", read.key, e.message())))
            }
        }
    }
    batch.clear();
    stats.report();
    Ok(())
}

// Device targets (see `device_staging`): read into host mirrors window by window,
// verified, then copied to the device.

/// How a window's reads are verified: the restore's verifier (none: unverified),
/// the objects' sizes and how errors name an object.
struct WindowCheck<'a> {
    verifier: Option<&'a Verifier>,
    object_sizes: &'a BTreeMap<&'a str, u64>,
    name: &'a dyn Fn(&str) -> String,
}

/// Restores the device targets `on_device` (runtime id -> regions) through the
/// weight store's device engine (see the module documentation). Statistics go to
/// `stats` as for host targets.
///
/// # Safety
/// Every target of `on_device` is device memory of its ordinal, valid for writes and
/// not accessed by anyone else for the duration of the call.
unsafe fn restore_on_device(
    ws: &WeightStore,
    plan: &LoadPlan,
    on_device: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    check: &WindowCheck<'_>,
) -> Result<()> {
    let engine = ws.device.as_deref().ok_or_else(|| Error::new(ErrorKind::Unsupported, "no device engine"))?;
    let mut in_flight: Option<InFlight> = None;
    // SAFETY: forwarded from this function's contract.
    let result = unsafe { restore_windows(ws, engine, plan, on_device, options, stats, check, &mut in_flight) };
    match in_flight.take() {
        Some(f) => {
            let waited = f.wait(engine);
            result.and(waited)
        }
        None => result,
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn restore_windows(
    ws: &WeightStore,
    engine: &dyn DeviceEngine,
    plan: &LoadPlan,
    on_device: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    check: &WindowCheck<'_>,
    in_flight: &mut Option<InFlight>,
) -> Result<()> {
    let list: Vec<(&str, &Vec<usize>)> = on_device.iter().map(|(k, v)| (*k, v)).collect();
    let mirror_len = |l: &Vec<usize>| plan.target_fragment(l[0]).nbytes().div_ceil(MIRROR_ALIGN) * MIRROR_ALIGN;
    let mut k = 0;
    while k < list.len() {
        let start = k;
        let mut size = 0u64;
        while k < list.len() && (k == start || size + mirror_len(list[k].1) <= WINDOW_BYTES) {
            size += mirror_len(list[k].1);
            k += 1;
        }
        let window = &list[start..k];
        let buffer = engine.staging(size)?;
        let mut mirrors: HashMap<&str, u64> = HashMap::with_capacity(window.len());
        let mut off = 0;
        for (id, l) in window {
            mirrors.insert(id, buffer.address() + off);
            off += mirror_len(l);
        }
        // Read the window into its mirrors, registered with the store for the reads.
        let region = MemoryRegion { address: buffer.address(), len: buffer.len(), kind: MemoryKind::Host };
        ws.store.register_buffer(region)?;
        let by: BTreeMap<&str, Vec<usize>> = window.iter().map(|(id, l)| (*id, (*l).clone())).collect();
        if check.verifier.is_some() {
            stats.delivered = Some(Delivered::default());
        }
        // SAFETY: the mirrors lie in `buffer` (host memory owned here, sized for every
        // mirror); the reads write only inside each target's `nbytes`.
        let read = unsafe { read_regions(ws, plan, &by, options, stats, Some(&mirrors)) };
        let read = verify_reads(ws, read, check.verifier, check.object_sizes, check.name, options, stats);
        let _ = ws.store.unregister_buffer(region.address);
        read?;
        // The previous window's copies had this window's reads to run; its buffer is
        // free once they are done.
        if let Some(f) = in_flight.take() {
            f.wait(engine)?;
        }
        // The written spans of every target, one batch per device ordinal; each
        // target's copies stay inside it (a copy never spans two allocations).
        let mut batches: Batches<u32> = Batches::default();
        for (id, l) in window {
            let t = plan.target_fragment(l[0]);
            let MemoryKind::Device(ordinal) = t.memory() else {
                return Err(Error::invalid("a host target was staged for the device"));
            };
            let mirror = mirrors[id];
            let ranges: Vec<CopyRange> = staging::written_spans(plan, l, options.max_region_segments)?
                .into_iter()
                .map(|(a, b)| CopyRange { source: mirror + a, target: t.address() + a, len: b - a })
                .collect();
            coalesce_into(batches.of(ordinal), &ranges);
        }
        let mut flight = InFlight { tickets: Vec::with_capacity(batches.len()), _buffer: buffer };
        for (ordinal, ops) in batches.iter() {
            // SAFETY: sources are the mirrors (host, owned by `flight` until waited);
            // targets are the caller's device targets (this function's contract).
            match unsafe { engine.submit(*ordinal, CopyDirection::HostToDevice, ops) } {
                Ok(t) => flight.tickets.push(t),
                Err(e) => {
                    let _ = flight.wait(engine);
                    return Err(e.context("copy of restored bytes to the device: "));
                }
            }
        }
        *in_flight = Some(flight);
    }
    Ok(())
}
