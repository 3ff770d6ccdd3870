//! `plan_upload` (`upload-planning.md`): choose one complete, generation-consistent
//! DP replica, one source per stored geometry, and lay out keys and operations.
//! Pure: no store I/O (apart from the clock and a random transaction id, both of
//! which [`UploadOptions`] can fix).

use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::geometry::{self, BoxRef, HIGH_DIM_COMPARISON_BUDGET};
use crate::json::{self, Obj, Profile, Value};
use crate::model::{
    is_hex64, stored_fragment_id, AxisKind, KeyLayout, ParallelAxis, Placement, PlacementFragment, StoredFragment,
    StoredFragmentSpec, StoredManifest, StoredManifestSpec, TensorDescriptor,
};
use crate::runtime::{pair_bindings, RuntimeBinding, RuntimeFragment, RuntimeFragmentSnapshot};
use std::sync::Arc;

/// Options of [`plan_upload`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadOptions {
    /// Namespace (raw; percent-encoded into keys). Default `"default"`.
    pub namespace: String,
    /// Key prefix (stripped of leading/trailing `/`, not encoded). Default `"weights"`.
    pub key_prefix: String,
    /// Fixed transaction id (non-empty, no `/`); default: a random UUIDv4 in hex.
    pub transaction_id: Option<String>,
    /// Fixed `created_at` (non-empty); default: now, UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub created_at: Option<String>,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            namespace: crate::model::DEFAULT_NAMESPACE.into(),
            key_prefix: "weights".into(),
            transaction_id: None,
            created_at: None,
        }
    }
}

/// A commit or abort decision of an upload transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// The transaction's manifest is (to be) published.
    Commit,
    /// The transaction is abandoned; its payloads are garbage.
    Abort,
}

impl Decision {
    /// `"commit"` or `"abort"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Commit => "commit",
            Decision::Abort => "abort",
        }
    }

    /// The decision record bytes (`wire-format.md` §7, profile A).
    pub fn record(self, plan_digest: &str) -> String {
        let mut out = String::from("{\"decision\":\"");
        out.push_str(self.as_str());
        out.push_str("\",\"plan_digest\":");
        json::write_str(&mut out, plan_digest, Profile::Ascii);
        out.push_str(",\"record_type\":\"weight-upload-decision\"}");
        out
    }

    /// Decodes a decision record strictly; returns the decision and plan digest.
    /// Errors name the rule (`upload decision schema fields do not match contract`,
    /// `invalid upload decision record_type`, `invalid upload decision`,
    /// `invalid upload decision plan_digest`).
    pub fn parse_record(bytes: &[u8]) -> Result<(Decision, String)> {
        let v = json::parse_bytes(bytes, "upload decision")?;
        let o = Obj::new(&v, || "upload decision schema fields do not match contract".into())?;
        o.expect_keys(&["decision", "plan_digest", "record_type"], || {
            "upload decision schema fields do not match contract".into()
        })?;
        if o.get("record_type") != &Value::Str("weight-upload-decision".into()) {
            return invalid("invalid upload decision record_type");
        }
        let decision = match o.get("decision") {
            Value::Str(s) if s == "commit" => Decision::Commit,
            Value::Str(s) if s == "abort" => Decision::Abort,
            _ => return invalid("invalid upload decision"),
        };
        match o.get("plan_digest") {
            Value::Str(s) if is_hex64(s) => Ok((decision, s.to_string())),
            _ => invalid("invalid upload decision plan_digest"),
        }
    }
}

/// One payload to upload: the source placement fragment, its runtime evidence and
/// the stored fragment it becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadOperation {
    source_placement: PlacementFragment,
    source_snapshot: RuntimeFragmentSnapshot,
    // Shared by all operations of one binding.
    source_participant_id: Arc<str>,
    source_instance_id: Arc<str>,
    target: StoredFragment,
    source_lease_generation: u64,
    source_lease_id: Arc<str>,
}

impl UploadOperation {
    /// Builds an operation, enforcing the cross-checks of `upload-planning.md` §3.
    ///
    /// Errors: `InvalidArgument` naming the first check that fails (empty ids,
    /// source placement and snapshot differ, geometry differs, non-zero target
    /// object offset, generation differs). Takes ownership of every argument.
    pub fn new(
        source_placement: PlacementFragment,
        source_snapshot: RuntimeFragmentSnapshot,
        source_participant_id: String,
        source_instance_id: String,
        target: StoredFragment,
        source_lease_generation: u64,
        source_lease_id: String,
    ) -> Result<Self> {
        Self::with_shared_ids(
            source_placement,
            source_snapshot,
            Arc::from(source_participant_id),
            Arc::from(source_instance_id),
            target,
            source_lease_generation,
            Arc::from(source_lease_id),
        )
    }

    /// [`Self::new`] with the binding's ids given as shared strings (one
    /// allocation per binding, not per operation).
    pub(crate) fn with_shared_ids(
        source_placement: PlacementFragment,
        source_snapshot: RuntimeFragmentSnapshot,
        source_participant_id: Arc<str>,
        source_instance_id: Arc<str>,
        target: StoredFragment,
        source_lease_generation: u64,
        source_lease_id: Arc<str>,
    ) -> Result<Self> {
        crate::model::non_empty(&source_participant_id, "source_participant_id")?;
        crate::model::non_empty(&source_instance_id, "source_instance_id")?;
        crate::model::non_empty(&source_lease_id, "source_lease_id")?;
        let p = &source_placement;
        let s = &source_snapshot;
        if s.placement_fragment_id() != p.placement_fragment_id() {
            return invalid("upload source placement and binding differ");
        }
        if s.nbytes() != p.nbytes()
            || s.local_shape() != p.local_shape()
            || s.tensor_id() != p.tensor_id()
            || s.global_offset() != p.global_offset()
        {
            return invalid("upload source geometry differs");
        }
        if target.tensor_id() != p.tensor_id()
            || target.global_offset() != p.global_offset()
            || target.local_shape() != p.local_shape()
            || target.nbytes() != p.nbytes()
            || target.aliases() != p.aliases()
        {
            return invalid("upload source and target geometry differ");
        }
        if target.object_offset() != 0 {
            return invalid("upload target object_offset must be zero");
        }
        if s.lease_generation() != source_lease_generation {
            return invalid("upload source snapshot generation differs");
        }
        Ok(UploadOperation {
            source_placement,
            source_snapshot,
            source_participant_id,
            source_instance_id,
            target,
            source_lease_generation,
            source_lease_id,
        })
    }

    /// Source placement fragment.
    pub fn source_placement(&self) -> &PlacementFragment {
        &self.source_placement
    }
    /// Runtime evidence of the source (owner-free).
    pub fn source_snapshot(&self) -> &RuntimeFragmentSnapshot {
        &self.source_snapshot
    }
    /// Participant that holds the source.
    pub fn source_participant_id(&self) -> &str {
        &self.source_participant_id
    }
    /// Instance of the source binding.
    pub fn source_instance_id(&self) -> &str {
        &self.source_instance_id
    }
    /// The stored fragment written by this operation.
    pub fn target(&self) -> &StoredFragment {
        &self.target
    }
    /// Lease generation of the source binding (the wire name is `source_generation`).
    pub fn source_lease_generation(&self) -> u64 {
        self.source_lease_generation
    }
    /// Lease id of the source binding.
    pub fn source_lease_id(&self) -> &str {
        &self.source_lease_id
    }
}

/// An immutable upload plan (`WeightUploadPlan`): the manifest to publish, one
/// operation per stored fragment, and the transaction's keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadPlan {
    manifest: StoredManifest,
    source_placement_id: String,
    source_placement_digest: String,
    transaction_group_id: String,
    control_key: String,
    operations: Vec<UploadOperation>,
}

impl UploadPlan {
    /// Builds a plan, enforcing the invariants of `upload-planning.md` §4.
    ///
    /// Errors: `InvalidArgument` naming the first invariant that fails (empty ids,
    /// no operations, a transaction group, control key or payload key outside the
    /// manifest's group, operations that are not the manifest's fragments). Takes
    /// ownership of every argument.
    pub fn new(
        manifest: StoredManifest,
        source_placement_id: String,
        source_placement_digest: String,
        transaction_group_id: String,
        control_key: String,
        operations: Vec<UploadOperation>,
    ) -> Result<Self> {
        UploadPlan {
            manifest,
            source_placement_id,
            source_placement_digest,
            transaction_group_id,
            control_key,
            operations,
        }
        .validated(false)
    }

    /// Checks the plan's invariants (see [`Self::new`]); `planned`: `plan_upload`'s
    /// own output, one operation per manifest fragment in its order, each key under
    /// the transaction, by construction. A release build then skips those two
    /// per-operation checks; debug builds (the tests) run them and panic should the
    /// planner break them.
    fn validated(self, planned: bool) -> Result<Self> {
        let plan = self;
        for (v, name) in [
            (&plan.source_placement_id, "source_placement_id"),
            (&plan.source_placement_digest, "source_placement_digest"),
            (&plan.transaction_group_id, "transaction_group_id"),
            (&plan.control_key, "control_key"),
        ] {
            crate::model::non_empty(v, name)?;
        }
        if plan.operations.is_empty() {
            return invalid("upload plan operations are invalid");
        }
        let tx_prefix = format!("{}/transactions/", plan.manifest.group_id());
        let tx = plan
            .transaction_group_id
            .strip_prefix(&tx_prefix)
            .ok_or_else(|| Error::invalid("upload transaction group does not belong to manifest group"))?;
        if tx.is_empty() || tx.contains('/') {
            return invalid("upload transaction group has an invalid upload ID");
        }
        if plan.control_key != format!("{}/decision", plan.transaction_group_id) {
            return invalid("upload control key does not belong to transaction group");
        }
        if planned && !cfg!(debug_assertions) {
            return Ok(plan);
        }
        let checked = plan.check_operations();
        debug_assert!(!planned || checked.is_ok(), "the planner's operations are its manifest's fragments");
        checked.map(|()| plan)
    }

    /// The per-operation invariants: the operations are the manifest's fragments
    /// and the transaction owns every payload key.
    fn check_operations(&self) -> Result<()> {
        let (manifest, operations, tx) = (&self.manifest, &self.operations, self.transaction_id());
        // Planned operations follow the manifest's order; other orders compare as
        // multisets sorted by fragment id.
        let in_order = operations.len() == manifest.fragments().len()
            && operations.iter().zip(manifest.fragments()).all(|(o, f)| o.target == *f);
        if !in_order {
            let mut targets: Vec<&StoredFragment> = operations.iter().map(|o| &o.target).collect();
            let mut fragments: Vec<&StoredFragment> = manifest.fragments().iter().collect();
            targets.sort_unstable_by(|a, b| a.fragment_id().cmp(b.fragment_id()));
            fragments.sort_unstable_by(|a, b| a.fragment_id().cmp(b.fragment_id()));
            if targets != fragments {
                return invalid("upload plan operations and manifest differ");
            }
        }
        let payload_prefix = format!("{}/payload/", manifest.group_id());
        for op in operations {
            let rest = op.target.object_key().strip_prefix(&payload_prefix).unwrap_or("");
            if rest.split('/').next() != Some(tx) {
                return invalid("upload transaction does not own payload members");
            }
        }
        Ok(())
    }

    /// The manifest to publish.
    pub fn manifest(&self) -> &StoredManifest {
        &self.manifest
    }
    /// Source placement id.
    pub fn source_placement_id(&self) -> &str {
        &self.source_placement_id
    }
    /// Source placement digest.
    pub fn source_placement_digest(&self) -> &str {
        &self.source_placement_digest
    }
    /// `<group>/transactions/<transaction_id>`.
    pub fn transaction_group_id(&self) -> &str {
        &self.transaction_group_id
    }
    /// `<transaction group>/decision`.
    pub fn control_key(&self) -> &str {
        &self.control_key
    }
    /// The transaction id.
    pub fn transaction_id(&self) -> &str {
        self.transaction_group_id.rsplit('/').next().unwrap_or("")
    }
    /// The operations, in manifest fragment order.
    pub fn operations(&self) -> &[UploadOperation] {
        &self.operations
    }
    /// The plan digest (= the manifest digest).
    pub fn plan_digest(&self) -> &str {
        self.manifest.manifest_digest()
    }
    /// The decision record bytes for `decision`.
    pub fn decision_record(&self, decision: Decision) -> String {
        decision.record(self.plan_digest())
    }
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now_timestamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_utc(secs)
}

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian, UTC).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// One source fragment: fragment `k` of binding `bi`, paired with its placement
/// fragment (built where it is needed, from an [`Entry`] and its tensor).
#[derive(Clone, Copy)]
struct Source<'a> {
    placement: &'a PlacementFragment,
    runtime: &'a RuntimeFragment,
    binding: &'a RuntimeBinding,
    /// Index of `binding` in the bindings.
    bi: u32,
    tensor: &'a TensorDescriptor,
}

/// A source fragment in the replica search: its DP coordinate and owner tuple
/// (the sort keys), and where it is (fragment `k` of binding `bi`).
#[derive(Clone, Copy)]
struct Entry {
    dp: u64,
    /// Coordinates on the tensor's ownership kinds (others zero), in canonical
    /// kind order, so array order is the owner tuples' order.
    owner: [u64; 4],
    bi: u32,
    k: u32,
}

/// The tensor's owner tuple: coordinates on its ownership kinds, canonical order.
fn owner_of(t: &TensorDescriptor, f: &PlacementFragment) -> [u64; 4] {
    let rank = f.rank();
    let mut owner = [0u64; 4];
    for a in t.parallel_axes() {
        if let ParallelAxis::Ownership(k) = a {
            owner[*k as usize] = rank.coord(*k);
        }
    }
    owner
}

/// Plans the upload of one complete DP replica of `placement` from `bindings`.
///
/// Errors: contract errors (`InvalidArgument`) for bad options, DP-owned tensors,
/// duplicate runtime fragment ids, and when no complete generation-consistent
/// replica exists; `InvalidBinding` for binding pairing failures
/// (`invalid source runtime binding: ...`). See `upload-planning.md` §6.
pub fn plan_upload<'a>(
    placement: &'a Placement,
    bindings: &'a [RuntimeBinding],
    options: &UploadOptions,
) -> Result<UploadPlan> {
    let arguments = check_arguments(placement, options)?;
    let (ids, repeats) = pair_sources(placement, bindings)?;
    check_dp_replicated(placement)?;
    check_unique_source_ids(&ids, repeats)?;
    drop(ids);
    let (parts, tensor_of_source) = collect_sources(placement, bindings);
    let total = tensor_of_source.len();
    let (start, entries) = group_sources(placement.tensors(), &parts, tensor_of_source);
    let dps = dp_coordinates(&parts);
    let complete = complete_replicas(placement.tensors(), &parts, &start, &entries, &dps, total)?;
    let eligible = check_generation_consistency(&complete, &entries, bindings)?;
    // Step 7: choose the smallest eligible DP replica and its generation.
    let (selected, generation) = eligible[0];
    let picks = pick_sources(placement.tensors(), bindings, &parts, &entries, selected, generation, total)?;
    drop(entries);
    let operations = plan_operations(&picks, bindings, &arguments)?;
    let manifest = build_manifest(placement, options, &arguments, &operations)?;
    build_plan(placement, arguments, manifest, operations)
}

/// The checked options of one plan (step 1).
struct Arguments {
    keys: KeyLayout,
    transaction_id: String,
    created_at: String,
}

/// Step 1: arguments (and key layout): the options checked, the transaction id and
/// creation time fixed (drawn when the options leave them open).
fn check_arguments(placement: &Placement, options: &UploadOptions) -> Result<Arguments> {
    let keys = KeyLayout::new(
        &options.key_prefix,
        &options.namespace,
        placement.resource_id(),
        placement.revision(),
        placement.weight_generation(),
    )?;
    let transaction_id = match &options.transaction_id {
        Some(id) if id.is_empty() || id.contains('/') => {
            return invalid("transaction_id must be a non-empty string without '/'");
        }
        Some(id) => id.clone(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let created_at = match &options.created_at {
        Some(c) if c.is_empty() => return invalid("created_at must be a non-empty string"),
        Some(c) => c.clone(),
        None => utc_now_timestamp(),
    };
    Ok(Arguments { keys, transaction_id, created_at })
}

/// Step 2: pairing. Returns the runtime fragment ids of every binding in binding
/// order, and whether one of them repeats. Runtime fragment ids, unique within each
/// binding (its constructor), must be unique across them too (step 4); a large
/// input checks that on a second thread meanwhile.
fn pair_sources<'a>(placement: &Placement, bindings: &'a [RuntimeBinding]) -> Result<(Vec<&'a str>, bool)> {
    let ids: Vec<&str> = bindings.iter().flat_map(|b| b.fragments().iter().map(|r| r.fragment_id())).collect();
    let (paired, repeats) = crate::par::join(
        crate::par::workers(ids.len()) > 1,
        || pair_bindings(placement, bindings, "source"),
        || crate::fxhash::has_duplicate(ids.len(), |i| ids[i]),
    );
    paired?;
    Ok((ids, repeats))
}

/// Step 3: DP ownership.
fn check_dp_replicated(placement: &Placement) -> Result<()> {
    if placement.tensors().iter().any(|t| t.axis(AxisKind::Dp) == Some(&ParallelAxis::Ownership(AxisKind::Dp))) {
        return invalid(
            "Weight Store upload requires replicated DP source tensors; DP-owned tensor snapshots are not supported",
        );
    }
    Ok(())
}

/// Step 4, the ids of the sources (from [`pair_sources`]): the first repeated runtime
/// id in binding order is named.
fn check_unique_source_ids(ids: &[&str], repeats: bool) -> Result<()> {
    if repeats {
        let mut seen: HashSet<&str> = crate::fxhash::set_with_capacity(ids.len());
        if let Some(id) = ids.iter().find(|id| !seen.insert(id)) {
            return invalid(format!("duplicate source fragment_id: {id}"));
        }
    }
    Ok(())
}

/// Step 4: sources. One source per fragment of every binding, in binding order:
/// source `i` is fragment `i - first[b]` of binding `b`. Returns each binding's
/// placement part (its fragments) and each source's tensor index, looked up in
/// parallel; nothing else is stored per source before the replica search.
fn collect_sources<'a>(
    placement: &'a Placement,
    bindings: &[RuntimeBinding],
) -> (Vec<&'a [PlacementFragment]>, Vec<u32>) {
    // Fragment tensor ids are interned (the descriptor's own id), so the pointer
    // finds the tensor; the string is the fallback.
    let tensors = placement.tensors();
    let by_ptr: HashMap<u64, u32> =
        tensors.iter().enumerate().map(|(i, t)| (crate::model::id_key(t.tensor_id_arc()), i as u32)).collect();
    let tensor_of = |p: &PlacementFragment| -> u32 {
        match by_ptr.get(&crate::model::id_key(p.tensor_id_arc())) {
            Some(&i) => i,
            None => tensors
                .binary_search_by(|t| t.tensor_id().cmp(p.tensor_id()))
                .expect("a placement's fragments name its tensors") as u32,
        }
    };
    let parts: Vec<&[PlacementFragment]> = bindings
        .iter()
        .map(|b| placement.part(b.participant_id()).expect("pairing checked the participant").fragments())
        .collect();
    let mut first: Vec<usize> = Vec::with_capacity(bindings.len() + 1);
    first.push(0);
    for b in bindings {
        first.push(first[first.len() - 1] + b.fragments().len());
    }
    let total = first[bindings.len()];
    let tensor_index = |i: usize| -> std::result::Result<u32, std::convert::Infallible> {
        let bi = first.partition_point(|&f| f <= i) - 1;
        Ok(tensor_of(&parts[bi][i - first[bi]]))
    };
    let tis: Vec<u32> =
        crate::par::try_map(total, crate::par::workers(total), tensor_index).unwrap_or_else(|never| match never {});
    (parts, tis)
}

/// Step 5, the search's order: a counting sort by tensor, then a sort of each
/// tensor's sources by (DP coordinate, owner tuple) on compact keys, puts each
/// replica's sources of each owner in one run. Returns `start` (tensor `t`'s
/// sources are `entries[start[t]..start[t + 1]]`) and the entries; `tis` is each
/// source's tensor index ([`collect_sources`]).
fn group_sources(
    tensors: &[Arc<TensorDescriptor>],
    parts: &[&[PlacementFragment]],
    tis: Vec<u32>,
) -> (Vec<u32>, Vec<Entry>) {
    let nt = tensors.len();
    let mut start = vec![0u32; nt + 1];
    for &ti in &tis {
        start[ti as usize + 1] += 1;
    }
    for t in 0..nt {
        start[t + 1] += start[t];
    }
    let mut entries = vec![Entry { dp: 0, owner: [0; 4], bi: 0, k: 0 }; tis.len()];
    let mut next = start.clone();
    let mut i = 0;
    for (bi, part) in parts.iter().enumerate() {
        for (k, p) in part.iter().enumerate() {
            let ti = tis[i] as usize;
            i += 1;
            let slot = &mut next[ti];
            entries[*slot as usize] =
                Entry { dp: p.rank().dp, owner: owner_of(&tensors[ti], p), bi: bi as u32, k: k as u32 };
            *slot += 1;
        }
    }
    drop((next, tis));
    // (bi, k) orders sources as their binding order does.
    for t in 0..nt {
        entries[start[t] as usize..start[t + 1] as usize].sort_unstable_by_key(|e| (e.dp, e.owner, e.bi, e.k));
    }
    (start, entries)
}

/// Step 5: the DP coordinates of the sources, ascending (few; consecutive sources
/// usually share one).
fn dp_coordinates(parts: &[&[PlacementFragment]]) -> Vec<u64> {
    let mut dps: Vec<u64> = Vec::new();
    let mut last_dp = None;
    for p in parts.iter().flat_map(|part| part.iter()) {
        let dp = p.rank().dp;
        if last_dp != Some(dp) {
            if let Err(at) = dps.binary_search(&dp) {
                dps.insert(at, dp);
            }
            last_dp = Some(dp);
        }
    }
    dps
}

/// Step 5: complete replicas, per DP coordinate of `dps` that is one (ascending):
/// per tensor, its chosen (smallest) owner's run of `entries`.
fn complete_replicas(
    tensors: &[Arc<TensorDescriptor>],
    parts: &[&[PlacementFragment]],
    start: &[u32],
    entries: &[Entry],
    dps: &[u64],
    total: usize,
) -> Result<Vec<Vec<(u32, u32)>>> {
    let nt = tensors.len();
    let placement_of = |e: &Entry| &parts[e.bi as usize][e.k as usize];
    // Per tensor and DP coordinate (ascending): whether that replica's boxes of
    // every owner cover the tensor exactly, and the run of its chosen (smallest)
    // owner. Tensors are checked in parallel; the verdicts are read below in the
    // sequential order (DP, then tensor), so errors are the same either way.
    let covers = |t: usize| -> Result<Vec<(Result<bool>, (u32, u32))>> {
        let tensor = &*tensors[t];
        let zeros = vec![0u64; tensor.ndim()];
        let whole = BoxRef::new(&zeros, tensor.global_shape());
        let mut boxes: Vec<BoxRef<'_>> = Vec::new();
        let mut at = start[t] as usize;
        let end = start[t + 1] as usize;
        let mut out = Vec::with_capacity(dps.len());
        for &dp in dps {
            let len = entries[at..end].iter().take_while(|e| e.dp == dp).count();
            let run = &entries[at..at + len];
            let mut owners = run.chunk_by(|a, b| a.owner == b.owner);
            let chosen = owners.clone().next().map_or(0, |r| r.len());
            let mut verdict = Ok(!run.is_empty());
            for owner_run in &mut owners {
                boxes.clear();
                boxes.extend(owner_run.iter().map(|e| placement_of(e).as_box()));
                boxes.sort_unstable_by(|a, b| (a.offset, a.shape).cmp(&(b.offset, b.shape)));
                boxes.dedup();
                verdict = geometry::boxes_exactly_cover(whole, &boxes, HIGH_DIM_COMPARISON_BUDGET);
                if !matches!(verdict, Ok(true)) {
                    break;
                }
            }
            out.push((verdict, (at as u32, (at + chosen) as u32)));
            at += len;
        }
        Ok(out)
    };
    let mut verdicts = crate::par::try_map(nt, crate::par::workers(total), covers)?;
    // A complete replica: per tensor its chosen owner's run of `entries`.
    let mut complete: Vec<Vec<(u32, u32)>> = Vec::new();
    'dp: for d in 0..dps.len() {
        let mut chosen: Vec<(u32, u32)> = Vec::with_capacity(nt);
        for per_dp in &mut verdicts {
            let (verdict, run) = std::mem::replace(&mut per_dp[d], (Ok(false), (0, 0)));
            if !verdict? {
                continue 'dp;
            }
            chosen.push(run);
        }
        complete.push(chosen);
    }
    drop(verdicts);
    if complete.is_empty() {
        return Err(no_replica());
    }
    Ok(complete)
}

/// The error of steps 5 and 6 when no replica is left.
fn no_replica() -> Error {
    Error::invalid("source manifests have no complete generation-consistent DP replica")
}

/// Step 6: generation consistency. The complete replicas whose sources share one
/// lease generation, with it (in DP order); they must all share the same one.
fn check_generation_consistency<'c>(
    complete: &'c [Vec<(u32, u32)>],
    entries: &[Entry],
    bindings: &[RuntimeBinding],
) -> Result<Vec<(&'c [(u32, u32)], u64)>> {
    let run = |r: (u32, u32)| &entries[r.0 as usize..r.1 as usize];
    let mut eligible: Vec<(&[(u32, u32)], u64)> = Vec::new();
    for chosen in complete {
        let mut generations = chosen.iter().flat_map(|&r| run(r)).map(|e| bindings[e.bi as usize].lease_generation());
        let first = generations.next().expect("a complete replica has sources");
        if generations.all(|g| g == first) {
            eligible.push((chosen, first));
        }
    }
    if eligible.is_empty() {
        return Err(no_replica());
    }
    if eligible.iter().any(|e| e.1 != eligible[0].1) {
        return invalid("complete source DP replicas have inconsistent lease generations");
    }
    Ok(eligible)
}

/// Step 8: one source per geometry: the smallest by rank, then worker and fragment
/// id. Tensor indices follow tensor id order, so with each run sorted by geometry
/// the picks come in (tensor id, offset, shape) order (steps 9-12).
fn pick_sources<'a>(
    tensors: &'a [Arc<TensorDescriptor>],
    bindings: &'a [RuntimeBinding],
    parts: &[&'a [PlacementFragment]],
    entries: &[Entry],
    selected: &[(u32, u32)],
    generation: u64,
    total: usize,
) -> Result<Vec<Source<'a>>> {
    let run = |r: (u32, u32)| &entries[r.0 as usize..r.1 as usize];
    // Pairing checked that a binding's fragments and its placement part hold the
    // same ids in the same order.
    let source = |e: &Entry, tensor: &'a TensorDescriptor| -> Source<'a> {
        let b = &bindings[e.bi as usize];
        let k = e.k as usize;
        Source { placement: &parts[e.bi as usize][k], runtime: &b.fragments()[k], binding: b, bi: e.bi, tensor }
    };
    let rank_key = |s: &Source<'a>| {
        let r = s.placement.rank();
        (r.dp, r.pp, r.ep, r.tp, s.runtime.worker_id(), s.runtime.fragment_id())
    };
    let picks_of = |t: usize| -> Result<Vec<Source<'a>>> {
        let tensor = &*tensors[t];
        let mut by_geometry: Vec<Source<'a>> = run(selected[t])
            .iter()
            .map(|e| source(e, tensor))
            .filter(|s| s.binding.lease_generation() == generation)
            .collect();
        by_geometry.sort_unstable_by(|a, b| {
            (a.placement.global_offset(), a.placement.local_shape(), rank_key(a)).cmp(&(
                b.placement.global_offset(),
                b.placement.local_shape(),
                rank_key(b),
            ))
        });
        by_geometry.dedup_by(|b, a| a.placement.as_box() == b.placement.as_box());
        Ok(by_geometry)
    };
    Ok(crate::par::try_map(tensors.len(), crate::par::workers(total), picks_of)?.into_iter().flatten().collect())
}

/// Steps 9-10: keys, stored fragments and operations, one per pick, in pick order.
fn plan_operations(
    picks: &[Source<'_>],
    bindings: &[RuntimeBinding],
    arguments: &Arguments,
) -> Result<Vec<UploadOperation>> {
    let Arguments { keys, transaction_id, .. } = arguments;
    // Each binding's ids, shared by its operations.
    let shared_ids: Vec<[Arc<str>; 3]> = bindings
        .iter()
        .map(|b| [Arc::from(b.participant_id()), Arc::from(b.instance_id()), Arc::from(b.lease_id())])
        .collect();
    let operation = |k: usize| -> Result<UploadOperation> {
        let s = &picks[k];
        let p = s.placement;
        let fragment_id = stored_fragment_id(p.tensor_id(), p.global_offset(), p.local_shape());
        // The stored fragment shares the placement fragment's offset and shape.
        let target = StoredFragment::with_geometry(
            StoredFragmentSpec {
                object_key: keys.payload_key(transaction_id, &fragment_id),
                fragment_id,
                object_offset: 0,
                nbytes: p.nbytes(),
                aliases: p.aliases().to_vec(),
                ..StoredFragmentSpec::default()
            },
            s.tensor.tensor_id_arc().clone(),
            p.geometry().clone(),
        )?;
        let b = s.binding;
        let [participant, instance, lease] = shared_ids[s.bi as usize].clone();
        UploadOperation::with_shared_ids(
            p.clone(),
            RuntimeFragmentSnapshot::new(p, s.runtime, b.lease_generation()),
            participant,
            instance,
            target,
            b.lease_generation(),
            lease,
        )
    };
    crate::par::try_map(picks.len(), crate::par::workers(picks.len()), operation)
}

/// Step 11: the manifest of the operations' targets.
fn build_manifest(
    placement: &Placement,
    options: &UploadOptions,
    arguments: &Arguments,
    operations: &[UploadOperation],
) -> Result<StoredManifest> {
    let fragments: Vec<StoredFragment> = operations.iter().map(|op| op.target.clone()).collect();
    StoredManifest::new_planned(StoredManifestSpec {
        namespace: options.namespace.clone(),
        resource_id: placement.resource_id().to_string(),
        revision: placement.revision().to_string(),
        weight_generation: placement.weight_generation(),
        group_id: arguments.keys.group_id().to_string(),
        manifest_key: arguments.keys.manifest_key(),
        tensors: placement.tensors().to_vec(),
        fragments,
        created_at: arguments.created_at.clone(),
    })
}

/// Step 12: the plan, validated, and its log record.
fn build_plan(
    placement: &Placement,
    arguments: Arguments,
    manifest: StoredManifest,
    operations: Vec<UploadOperation>,
) -> Result<UploadPlan> {
    let Arguments { keys, transaction_id, .. } = arguments;
    let plan = UploadPlan {
        manifest,
        source_placement_id: placement.placement_id().to_string(),
        source_placement_digest: placement.digest().to_string(),
        transaction_group_id: keys.transaction_group_id(&transaction_id),
        control_key: keys.control_key(&transaction_id),
        operations,
    }
    .validated(true)?;
    // A log record is the planner's only side effect (no I/O of its own).
    log::info!(
        "upload plan for {}: {} operations, {} bytes, transaction {}",
        plan.manifest().manifest_key(),
        plan.operations().len(),
        plan.operations().iter().map(|op| op.target().nbytes()).sum::<u64>(),
        plan.transaction_id()
    );
    Ok(plan)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn formats_utc_like_python_isoformat() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(1_784_291_696), "2026-07-17T12:34:56Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn decision_record_round_trips() {
        let d = "2d2336a4c82b34a48ec8b5c942196cf7bdd7dca294a6c5047432b30fd721d8a5";
        let rec = Decision::Commit.record(d);
        assert_eq!(
            rec,
            "{\"decision\":\"commit\",\"plan_digest\":\"2d2336a4c82b34a48ec8b5c942196cf7bdd7dca294a6c5047432b30fd721d8a5\",\"record_type\":\"weight-upload-decision\"}"
        );
        assert_eq!(Decision::parse_record(rec.as_bytes()).unwrap(), (Decision::Commit, d.to_string()));
        assert!(Decision::parse_record(
            b"{\"decision\":\"maybe\",\"plan_digest\":\"x\",\"record_type\":\"weight-upload-decision\"}"
        )
        .is_err());
    }

    /// A runtime binding in the conformance fixtures' JSON form.
    pub(crate) fn fixture_binding(b: &serde_json::Value) -> Result<RuntimeBinding> {
        use crate::runtime::{MemoryKind, RuntimeBindingSpec, RuntimeFragmentSpec};
        let text = |v: &serde_json::Value, k: &str| v[k].as_str().expect("string field").to_string();
        let int = |v: &serde_json::Value, k: &str| v[k].as_u64().expect("integer field");
        let ints = |v: &serde_json::Value, k: &str| -> Vec<u64> {
            v[k].as_array().expect("array field").iter().map(|x| x.as_u64().expect("integer")).collect()
        };
        let fragments = b["fragments"]
            .as_array()
            .expect("fragments")
            .iter()
            .map(|f| {
                RuntimeFragment::new(RuntimeFragmentSpec {
                    placement_fragment_id: text(f, "placement_fragment_id"),
                    fragment_id: text(f, "fragment_id"),
                    address: int(f, "address"),
                    nbytes: int(f, "nbytes"),
                    worker_id: text(f, "worker_id"),
                    endpoint: text(f, "endpoint"),
                    device: text(f, "device"),
                    itemsize: int(f, "itemsize"),
                    local_shape: ints(f, "local_shape"),
                    strides_bytes: ints(f, "strides_bytes"),
                    storage_address: int(f, "storage_address"),
                    storage_nbytes: int(f, "storage_nbytes"),
                    storage_offset_bytes: int(f, "storage_offset_bytes"),
                    memory: MemoryKind::Host,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        RuntimeBinding::new(RuntimeBindingSpec {
            resource_id: text(b, "resource_id"),
            placement_id: text(b, "placement_id"),
            placement_digest: text(b, "placement_digest"),
            instance_id: text(b, "instance_id"),
            lease_generation: int(b, "generation"),
            lease_id: text(b, "lease_id"),
            revision: text(b, "revision"),
            participant_id: text(b, "participant_id"),
            fragments,
        })
    }

    /// The parallel paths (par.rs) give the same placements, plans and errors as
    /// a sequential run: every placement and upload fixture, decoded and planned
    /// with 1, 2, 3 and 8 workers per stage.
    #[test]
    fn worker_count_changes_no_placement_plan_or_error() {
        let mut uploads = 0;
        for (name, fixture) in crate::testutil::conformance_fixtures("") {
            let inputs = &fixture["inputs"];
            let Some(placement) = inputs.get("placement") else { continue };
            let text = match placement {
                serde_json::Value::String(t) => t.clone(),
                other => other.to_string(),
            };
            let run = |workers: usize| {
                crate::par::with_workers(Some(workers), || {
                    let placement = Placement::from_json(text.as_bytes())?;
                    let Some(bindings) = inputs.get("bindings").and_then(|b| b.as_array()) else {
                        return Ok((placement, None));
                    };
                    let bindings = bindings.iter().map(fixture_binding).collect::<Result<Vec<_>>>()?;
                    let options = UploadOptions {
                        namespace: inputs["namespace"].as_str().unwrap_or("default").into(),
                        key_prefix: inputs["key_prefix"].as_str().unwrap_or("weights").into(),
                        transaction_id: Some("t".into()),
                        created_at: Some("2026-01-01T00:00:00Z".into()),
                    };
                    let plan = plan_upload(&placement, &bindings, &options)?;
                    Ok((placement, Some(plan)))
                })
            };
            let sequential: Result<(Placement, Option<UploadPlan>)> = run(1);
            uploads += usize::from(matches!(&sequential, Ok((_, Some(_)))));
            for workers in [2, 3, 8] {
                match (&sequential, &run(workers)) {
                    (Ok(a), Ok(b)) => assert!(a == b, "{}: {workers} workers differ", name),
                    (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{}", name),
                    (a, b) => {
                        panic!("{}: sequential {:?} but {workers} workers {:?}", name, a.is_ok(), b.is_ok())
                    }
                }
            }
        }
        assert!(uploads >= 9, "the upload fixtures were found and planned ({uploads})");
    }
}
