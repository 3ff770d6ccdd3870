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
use std::collections::{BTreeMap, BTreeSet};
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
            namespace: "default".into(),
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
    source_generation: u64,
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
        source_generation: u64,
        source_lease_id: String,
    ) -> Result<Self> {
        Self::with_shared_ids(
            source_placement,
            source_snapshot,
            Arc::from(source_participant_id),
            Arc::from(source_instance_id),
            target,
            source_generation,
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
        source_generation: u64,
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
        if s.lease_generation() != source_generation {
            return invalid("upload source snapshot generation differs");
        }
        Ok(UploadOperation {
            source_placement,
            source_snapshot,
            source_participant_id,
            source_instance_id,
            target,
            source_generation,
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
    /// Runtime generation of the source binding.
    pub fn source_generation(&self) -> u64 {
        self.source_generation
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
    pub fn new(
        manifest: StoredManifest,
        source_placement_id: String,
        source_placement_digest: String,
        transaction_group_id: String,
        control_key: String,
        operations: Vec<UploadOperation>,
    ) -> Result<Self> {
        for (v, name) in [
            (&source_placement_id, "source_placement_id"),
            (&source_placement_digest, "source_placement_digest"),
            (&transaction_group_id, "transaction_group_id"),
            (&control_key, "control_key"),
        ] {
            crate::model::non_empty(v, name)?;
        }
        if operations.is_empty() {
            return invalid("upload plan operations are invalid");
        }
        let tx_prefix = format!("{}/transactions/", manifest.group_id());
        let tx = transaction_group_id
            .strip_prefix(&tx_prefix)
            .ok_or_else(|| Error::invalid("upload transaction group does not belong to manifest group"))?;
        if tx.is_empty() || tx.contains('/') {
            return invalid("upload transaction group has an invalid upload ID");
        }
        if control_key != format!("{transaction_group_id}/decision") {
            return invalid("upload control key does not belong to transaction group");
        }
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
        for op in &operations {
            let rest = op.target.object_key().strip_prefix(&payload_prefix).unwrap_or("");
            if rest.split('/').next() != Some(tx) {
                return invalid("upload transaction does not own payload members");
            }
        }
        Ok(UploadPlan {
            manifest,
            source_placement_id,
            source_placement_digest,
            transaction_group_id,
            control_key,
            operations,
        })
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

struct Source<'a> {
    placement: &'a PlacementFragment,
    runtime: &'a RuntimeFragment,
    binding: &'a RuntimeBinding,
    /// Index of `binding` in the bindings.
    bi: u32,
    tensor: &'a TensorDescriptor,
    /// Index of `tensor` in the placement's tensors.
    ti: u32,
    /// Owner tuple: coordinates on the tensor's ownership kinds (others zero), in
    /// canonical kind order, so array order is the owner tuples' order.
    owner: [u64; 4],
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
    // Step 1: arguments (and key layout).
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
    // Step 2: pairing.
    pair_bindings(placement, bindings, "source")?;
    // Step 3: DP ownership.
    if placement.tensors().iter().any(|t| t.axis(AxisKind::Dp) == Some(&ParallelAxis::Ownership(AxisKind::Dp))) {
        return invalid(
            "Weight Store upload requires replicated DP source tensors; DP-owned tensor snapshots are not supported",
        );
    }
    // Step 4: sources. Fragment tensor ids are interned (the descriptor's own
    // id), so the pointer finds the tensor; the string is the fallback.
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
    // Runtime fragment ids, unique within each binding (its constructor), must be
    // unique across them too; the first repeat in binding order is named.
    let ids: Vec<&str> = bindings.iter().flat_map(|b| b.fragments().iter().map(|r| r.fragment_id())).collect();
    if crate::fxhash::has_duplicate(ids.len(), |i| ids[i]) {
        let mut seen: HashSet<&str> = crate::fxhash::set_with_capacity(ids.len());
        if let Some(id) = ids.iter().find(|id| !seen.insert(id)) {
            return invalid(format!("duplicate source fragment_id: {id}"));
        }
    }
    let mut sources: Vec<Source<'_>> = Vec::with_capacity(ids.len());
    drop(ids);
    for (bi, b) in bindings.iter().enumerate() {
        let part = placement.part(b.participant_id()).expect("pairing checked the participant");
        // Pairing checked that both lists hold the same ids in the same order.
        for (p, r) in part.fragments().iter().zip(b.fragments()) {
            let ti = tensor_of(p);
            let tensor = &*tensors[ti as usize];
            sources.push(Source {
                placement: p,
                runtime: r,
                binding: b,
                bi: bi as u32,
                tensor,
                ti,
                owner: owner_of(tensor, p),
            });
        }
    }
    // Step 5: complete replicas.
    let mut by_dp: BTreeMap<u64, HashMap<u32, BTreeMap<[u64; 4], Vec<BoxRef<'_>>>>> = BTreeMap::new();
    let mut sources_by_dp: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, s) in sources.iter().enumerate() {
        let dp = s.placement.rank().dp;
        sources_by_dp.entry(dp).or_default().push(i);
        by_dp.entry(dp).or_default().entry(s.ti).or_default().entry(s.owner).or_default().push(s.placement.as_box());
    }
    let mut complete: Vec<(u64, Vec<[u64; 4]>)> = Vec::new();
    'dp: for (dp, by_tensor) in &by_dp {
        let mut chosen: Vec<[u64; 4]> = vec![[0; 4]; tensors.len()];
        for (ti, t) in tensors.iter().enumerate() {
            let Some(owners) = by_tensor.get(&(ti as u32)) else { continue 'dp };
            let whole_offset = vec![0u64; t.ndim()];
            let whole = BoxRef::new(&whole_offset, t.global_shape());
            for boxes in owners.values() {
                let mut unique = boxes.clone();
                unique.sort_by(|a, b| (a.offset, a.shape).cmp(&(b.offset, b.shape)));
                unique.dedup();
                if !geometry::boxes_exactly_cover(whole, &unique, HIGH_DIM_COMPARISON_BUDGET)? {
                    continue 'dp;
                }
            }
            chosen[ti] = *owners.keys().next().expect("non-empty");
        }
        complete.push((*dp, chosen));
    }
    let no_replica = || Error::invalid("source manifests have no complete generation-consistent DP replica");
    if complete.is_empty() {
        return Err(no_replica());
    }
    // Step 6: generation consistency.
    let mut eligible: Vec<(u64, u64, &[[u64; 4]])> = Vec::new();
    for (dp, chosen) in &complete {
        let generations: BTreeSet<u64> = sources_by_dp[dp]
            .iter()
            .map(|&i| &sources[i])
            .filter(|s| chosen[s.ti as usize] == s.owner)
            .map(|s| s.binding.generation())
            .collect();
        if generations.len() == 1 {
            eligible.push((*dp, *generations.iter().next().expect("one"), chosen.as_slice()));
        }
    }
    if eligible.is_empty() {
        return Err(no_replica());
    }
    if eligible.iter().any(|e| e.1 != eligible[0].1) {
        return invalid("complete source DP replicas have inconsistent lease generations");
    }
    // Step 7.
    let (selected_dp, generation, chosen) = eligible[0];
    // Step 8: one source per geometry.
    let mut picks: HashMap<(u32, &[u64], &[u64]), &Source<'_>> =
        crate::fxhash::map_with_capacity(sources_by_dp[&selected_dp].len());
    let rank_key = |s: &Source<'a>| {
        let r = s.placement.rank();
        (r.dp, r.pp, r.ep, r.tp, s.runtime.worker_id(), s.runtime.fragment_id())
    };
    for &i in &sources_by_dp[&selected_dp] {
        let s = &sources[i];
        let p = s.placement;
        if s.binding.generation() != generation || chosen[s.ti as usize] != s.owner {
            continue;
        }
        let key = (s.ti, p.global_offset(), p.local_shape());
        match picks.get(&key) {
            Some(existing) if rank_key(existing) <= rank_key(s) => {}
            _ => {
                picks.insert(key, s);
            }
        }
    }
    // Steps 9-12.
    // Tensor indices follow tensor id order, so this is (tensor id, offset, shape) order.
    let mut picks: Vec<((u32, &[u64], &[u64]), &Source<'_>)> = picks.into_iter().collect();
    picks.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut operations = Vec::with_capacity(picks.len());
    let mut fragments = Vec::with_capacity(picks.len());
    // Each binding's ids, shared by its operations.
    let shared_ids: Vec<[Arc<str>; 3]> = bindings
        .iter()
        .map(|b| [Arc::from(b.participant_id()), Arc::from(b.instance_id()), Arc::from(b.lease_id())])
        .collect();
    for (_, s) in &picks {
        let p = s.placement;
        let fragment_id = stored_fragment_id(p.tensor_id(), p.global_offset(), p.local_shape());
        let target = StoredFragment::with_tensor_id(
            StoredFragmentSpec {
                object_key: keys.payload_key(&transaction_id, &fragment_id),
                fragment_id,
                tensor_id: String::new(),
                global_offset: p.global_offset().to_vec(),
                local_shape: p.local_shape().to_vec(),
                object_offset: 0,
                nbytes: p.nbytes(),
                aliases: p.aliases().to_vec(),
            },
            s.tensor.tensor_id_arc().clone(),
        )?;
        fragments.push(target.clone());
        let b = s.binding;
        let [participant, instance, lease] = shared_ids[s.bi as usize].clone();
        operations.push(UploadOperation::with_shared_ids(
            p.clone(),
            RuntimeFragmentSnapshot::new(p, s.runtime, b.generation()),
            participant,
            instance,
            target,
            b.generation(),
            lease,
        )?);
    }
    let manifest = StoredManifest::new_planned(StoredManifestSpec {
        namespace: options.namespace.clone(),
        resource_id: placement.resource_id().to_string(),
        revision: placement.revision().to_string(),
        weight_generation: placement.weight_generation(),
        group_id: keys.group_id().to_string(),
        manifest_key: keys.manifest_key(),
        tensors: placement.tensors().to_vec(),
        fragments,
        created_at,
    })?;
    let plan = UploadPlan::new(
        manifest,
        placement.placement_id().to_string(),
        placement.digest().to_string(),
        keys.transaction_group_id(&transaction_id),
        keys.control_key(&transaction_id),
        operations,
    )?;
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
mod tests {
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
}
