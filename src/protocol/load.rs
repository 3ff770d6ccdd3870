//! Restore: `load_manifest`, binding a logical plan to target buffers, and
//! executing it with ranged reads straight into the target buffers
//! (`load-path.md` §1, §4–§6).

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::model::{Placement, StoredManifest};
use crate::plan::load::{LogicalLoadPlan, PlanningLimits, TransferRegion};
use crate::runtime::{validate_binding_subset, MemoryKind, RuntimeBinding, RuntimeFragment};
use crate::store::{MemoryRegion, ObjectStore, RangeRead};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

fn store_err(kind: ErrorKind, msg: impl Into<String>) -> Error {
    Error::new(kind, msg)
}

/// Reads and strictly decodes the manifest at `manifest_key` (`load-path.md` §1).
///
/// Errors: `manifest get failed: <key>` (the backend's kind, e.g. `NotFound`),
/// `invalid weight manifest: <key>: <detail>` ([`ErrorKind::InvalidManifest`]),
/// `manifest key mismatch: expected <key>, got <key2>` (`InvalidManifest`).
pub fn load_manifest(store: &dyn ObjectStore, manifest_key: &str) -> Result<StoredManifest> {
    let bytes = store
        .get(manifest_key)
        .map_err(|e| store_err(e.kind(), format!("manifest get failed: {manifest_key}: {}", e.message())))?;
    let m = StoredManifest::from_json(&bytes).map_err(|e| {
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
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_range_bytes: 64 << 20,
            max_ranges_per_request: 1024,
            max_region_segments: 1 << 32,
            require_committed: true,
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

/// A load plan bound to target runtime bindings (`WeightLoadPlan`): every region's
/// target is a runtime fragment whose bounds were checked against the region.
/// Immutable, `Send + Sync`.
#[derive(Clone, Debug)]
pub struct LoadPlan {
    logical: LogicalLoadPlan,
    bindings: Vec<RuntimeBinding>,
    /// Per region: (binding index, fragment index in the binding).
    targets: Vec<(u32, u32)>,
}

impl LoadPlan {
    /// Plans a restore of `manifest` into `target` bound to `bindings`
    /// (`plan_load`). `bindings` may be a subset: only their participants are
    /// planned (so each rank can plan its own part); with every non-empty
    /// participant bound this is the reference's `plan_load`.
    ///
    /// Errors: `target runtime bindings must not be empty`, `invalid target runtime
    /// binding: <detail>` ([`ErrorKind::InvalidBinding`]); `target placement revision
    /// mismatch`; planner contract errors and limits.
    pub fn plan(
        manifest: Arc<StoredManifest>,
        target: Arc<Placement>,
        bindings: &[RuntimeBinding],
        limits: PlanningLimits,
    ) -> Result<LoadPlan> {
        if bindings.is_empty() {
            return Err(store_err(ErrorKind::InvalidBinding, "target runtime bindings must not be empty"));
        }
        validate_binding_subset(&target, bindings)
            .map_err(|e| store_err(ErrorKind::InvalidBinding, format!("invalid target runtime binding: {}", e.message())))?;
        if target.resource_id() != manifest.resource_id()
            || target.revision() != manifest.revision()
            || target.weight_generation() != manifest.weight_generation()
        {
            return Err(store_err(ErrorKind::InvalidArgument, "target placement revision mismatch"));
        }
        let ids: Vec<&str> = bindings
            .iter()
            .map(|b| b.participant_id())
            .filter(|p| target.part(p).is_some_and(|part| !part.fragments().is_empty()))
            .collect();
        if ids.is_empty() {
            return invalid("logical plan and target runtime binding participants differ");
        }
        let logical = LogicalLoadPlan::plan_participants(manifest, target, limits, Some(&ids))?;
        Self::bind(logical, bindings)
    }

    /// Binds a logical plan to `bindings`, which must cover every participant that
    /// has regions (`logical plan and target runtime binding participants differ`).
    pub fn bind(logical: LogicalLoadPlan, bindings: &[RuntimeBinding]) -> Result<LoadPlan> {
        validate_binding_subset(logical.target(), bindings)?;
        let by_participant: HashMap<&str, usize> =
            bindings.iter().enumerate().map(|(i, b)| (b.participant_id(), i)).collect();
        let mut targets = Vec::with_capacity(logical.regions().len());
        for r in logical.regions() {
            let pid = logical.target_participant_of(r);
            let &bi = by_participant
                .get(pid)
                .ok_or_else(|| Error::invalid("logical plan and target runtime binding participants differ"))?;
            let b = &bindings[bi];
            let pfid = logical.target_of(r).placement_fragment_id();
            let fi = b
                .fragments()
                .binary_search_by(|f| f.placement_fragment_id().cmp(pfid))
                .map_err(|_| Error::invalid(format!("missing runtime binding for placement fragment: {pfid}")))?;
            // The binding was validated: nbytes equals the placement's, so the
            // region's target bounds (checked by the planner) hold for the view.
            targets.push((bi as u32, fi as u32));
        }
        Ok(LoadPlan {
            logical,
            bindings: bindings.to_vec(),
            targets,
        })
    }

    /// The logical plan.
    pub fn logical(&self) -> &LogicalLoadPlan {
        &self.logical
    }
    /// The stored manifest.
    pub fn manifest(&self) -> &StoredManifest {
        self.logical.manifest()
    }
    /// Regions.
    pub fn regions(&self) -> &[TransferRegion] {
        self.logical.regions()
    }
    /// Bytes the plan moves.
    pub fn total_bytes(&self) -> u64 {
        self.logical.total_bytes()
    }
    /// The target runtime fragment a region writes.
    pub fn target_fragment(&self, region_index: usize) -> &RuntimeFragment {
        let (b, f) = self.targets[region_index];
        &self.bindings[b as usize].fragments()[f as usize]
    }
    /// Participants with regions, sorted.
    pub fn participants(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.logical.target_executors().map(|(p, _, _)| p).collect();
        v.sort_unstable();
        v
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
}

struct PendingRange {
    key_index: u32,
    object_offset: u64,
    dest: MemoryRegion,
}

/// Executes the part of `plan` that belongs to `binding`'s participant: checks the
/// binding still matches the plan (`stale target fragment: <id>`), that the plan's
/// manifest is the committed one, then reads every range straight into the target
/// buffers in bounded batches and checks each range's result.
///
/// Nothing is registered or read before every check passed. Target buffers of this
/// participant are registered for the duration of the call.
///
/// # Safety
/// Every target view of `binding` (address, nbytes) must be valid for writes and not
/// accessed by anyone else for the duration of the call.
pub unsafe fn execute_load(
    store: &dyn ObjectStore,
    plan: &LoadPlan,
    binding: &RuntimeBinding,
    options: &LoadOptions,
) -> Result<LoadStats> {
    options.validate()?;
    let bi = plan
        .bindings
        .iter()
        .position(|b| b.participant_id() == binding.participant_id())
        .ok_or_else(|| store_err(ErrorKind::StaleBinding, "target executor snapshot mismatch: unknown instance"))?;
    let planned = &plan.bindings[bi];
    if planned.instance_id() != binding.instance_id()
        || planned.lease_id() != binding.lease_id()
        || planned.generation() != binding.generation()
        || planned.placement_id() != binding.placement_id()
    {
        return Err(store_err(ErrorKind::StaleBinding, "target executor snapshot mismatch"));
    }
    let mut ops: Vec<usize> = Vec::new();
    for (i, &(b, f)) in plan.targets.iter().enumerate() {
        if b as usize != bi {
            continue;
        }
        let planned_frag = &planned.fragments()[f as usize];
        match binding.fragment_for(planned_frag.placement_fragment_id()) {
            Some(cur) if cur == planned_frag => {}
            _ => return Err(store_err(ErrorKind::StaleBinding, format!("stale target fragment: {}", planned_frag.fragment_id()))),
        }
        let r = &plan.regions()[i];
        let count = r.segment_count();
        if count > options.max_region_segments {
            return Err(store_err(
                ErrorKind::LimitExceeded,
                format!(
                    "transfer region exceeds max_region_segments: {}: {count} > {}",
                    plan.logical.source_of(r).tensor_id(),
                    options.max_region_segments
                ),
            ));
        }
        ops.push(i);
    }
    if ops.is_empty() {
        return Ok(LoadStats::default());
    }
    if options.require_committed {
        let committed = load_manifest(store, plan.manifest().manifest_key())
            .map_err(|e| store_err(ErrorKind::NotFound, format!("weight manifest is not committed: {}", e.message())))?;
        if committed != *plan.manifest() {
            return Err(store_err(ErrorKind::Conflict, "committed weight manifest differs from load plan"));
        }
    }
    let unsupported: Option<&RuntimeFragment> = ops
        .iter()
        .map(|&i| plan.target_fragment(i))
        .find(|f| f.memory() != MemoryKind::Host && !store.supports_memory(f.memory()));
    if let Some(f) = unsupported {
        return Err(store_err(
            ErrorKind::Unsupported,
            format!("target fragment {} is device memory and the store has no device copy path", f.fragment_id()),
        ));
    }
    // Group by target runtime fragment (sorted by runtime id), operations sorted by
    // (target base, object key, source base).
    let mut by_target: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &i in &ops {
        by_target.entry(plan.target_fragment(i).fragment_id()).or_default().push(i);
    }
    // Register each distinct target view once.
    let mut registered: Vec<u64> = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut result = Ok(());
    for list in by_target.values() {
        let f = plan.target_fragment(list[0]);
        if seen.insert(f.address()) {
            let region = MemoryRegion { address: f.address(), len: f.nbytes(), kind: f.memory() };
            if let Err(e) = store.register_buffer(region) {
                result = Err(store_err(e.kind(), format!("register_buffer failed for {}: {}", f.fragment_id(), e.message())));
                break;
            }
            registered.push(f.address());
        }
    }
    let mut stats = LoadStats::default();
    if result.is_ok() {
        result = read_ranges(store, plan, &by_target, options, &mut stats);
    }
    let mut unregister_failures = Vec::new();
    for address in registered.iter().rev() {
        if let Err(e) = store.unregister_buffer(*address) {
            unregister_failures.push(e.message().to_string());
        }
    }
    match (result, unregister_failures.is_empty()) {
        (Ok(()), true) => Ok(stats),
        (Ok(()), false) => Err(store_err(ErrorKind::Store, format!("unregister_buffer failed: {}", unregister_failures.join("; ")))),
        (Err(e), true) => Err(e),
        (Err(e), false) => Err(store_err(
            e.kind(),
            format!("{}; unregister_buffer failed: {}", e.message(), unregister_failures.join("; ")),
        )),
    }
}

unsafe fn read_ranges(
    store: &dyn ObjectStore,
    plan: &LoadPlan,
    by_target: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut LoadStats,
) -> Result<()> {
    let mut keys: Vec<&str> = Vec::new();
    let mut key_index: HashMap<&str, u32> = HashMap::new();
    let mut batch: Vec<PendingRange> = Vec::with_capacity(options.max_ranges_per_request);
    for list in by_target.values() {
        let mut list = list.clone();
        let src = |i: usize| plan.logical.source_of(&plan.regions()[i]);
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
            let t = plan.target_fragment(i);
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
                        dest: MemoryRegion { address: t.address() + to + c, len, kind: t.memory() },
                    });
                    if batch.len() == options.max_ranges_per_request {
                        if let Err(e) = flush(store, &keys, &mut batch, stats) {
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
    flush(store, &keys, &mut batch, stats)
}

unsafe fn flush(store: &dyn ObjectStore, keys: &[&str], batch: &mut Vec<PendingRange>, stats: &mut LoadStats) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let reads: Vec<RangeRead<'_>> = batch
        .iter()
        .map(|p| RangeRead { key: keys[p.key_index as usize], object_offset: p.object_offset, dest: p.dest })
        .collect();
    let results = store.get_into_ranges(&reads);
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
            Err(e) => return Err(store_err(e.kind(), format!("get_into_ranges failed for {}: {}", read.key, e.message()))),
        }
    }
    batch.clear();
    Ok(())
}
