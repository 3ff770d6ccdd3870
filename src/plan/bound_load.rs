//! A logical load plan bound to target runtime bindings (`WeightLoadPlan`,
//! `docs/spec/load-path.md` §4–§5). Pure: binding checks pairs and bounds, it does no
//! I/O and dereferences no address. Execution is `protocol::load`.

use super::load::{LogicalLoadPlan, PlanningLimits, TransferRegion};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::model::{Placement, StoredManifest};
use crate::runtime::{validate_binding_subset, RuntimeBinding, RuntimeFragment};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// A load plan bound to target runtime bindings (`WeightLoadPlan`): every region's
/// target is a runtime fragment whose bounds were checked against the region.
/// Immutable, `Send + Sync`.
#[derive(Clone, Debug)]
pub struct LoadPlan {
    logical: LogicalLoadPlan,
    bindings: Vec<RuntimeBinding>,
    /// Per region: (binding index, fragment index in the binding).
    targets: Vec<(u32, u32)>,
    /// The manifest's canonical JSON, made on first use ([`LoadPlan::manifest_json`]).
    manifest_json: OnceLock<Box<str>>,
    /// The manifest's integrity record key, found on first use ([`LoadPlan::integrity_key`]).
    integrity_key: OnceLock<Option<Box<str>>>,
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
            return Err(Error::new(ErrorKind::InvalidBinding, "target runtime bindings must not be empty"));
        }
        validate_binding_subset(&target, bindings).map_err(|e| {
            Error::new(ErrorKind::InvalidBinding, format!("invalid target runtime binding: {}", e.message()))
        })?;
        if target.resource_id() != manifest.resource_id()
            || target.revision() != manifest.revision()
            || target.weight_generation() != manifest.weight_generation()
        {
            return invalid("target placement revision mismatch");
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
            manifest_json: OnceLock::new(),
            integrity_key: OnceLock::new(),
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
    /// The manifest's canonical JSON ([`StoredManifest::to_json`]), serialized once
    /// per plan on first use and kept (thread-safe). A restore compares the committed
    /// manifest's bytes with it before it falls back to decoding them.
    pub fn manifest_json(&self) -> &str {
        self.manifest_json.get_or_init(|| self.manifest().to_json().into_boxed_str())
    }
    /// The key of the manifest's integrity record
    /// ([`crate::plan::integrity::manifest_integrity_key`]: `None` when the revision
    /// cannot have one), found once per plan on first use and kept (thread-safe): a
    /// restore of many participants looks it up once, not once per participant.
    pub fn integrity_key(&self) -> Option<&str> {
        self.integrity_key
            .get_or_init(|| crate::plan::integrity::manifest_integrity_key(self.manifest()).map(String::into_boxed_str))
            .as_deref()
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
    /// The bindings the plan was bound to (in the order given).
    pub fn bindings(&self) -> &[RuntimeBinding] {
        &self.bindings
    }
    /// Per region: (index into [`LoadPlan::bindings`], index of the fragment in that
    /// binding).
    pub fn region_targets(&self) -> &[(u32, u32)] {
        &self.targets
    }
    /// Participants with regions, sorted.
    pub fn participants(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.logical.target_executors().map(|(p, _, _)| p).collect();
        v.sort_unstable();
        v
    }
}
