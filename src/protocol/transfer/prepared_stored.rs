//! Prepared restores from a store ([`Loader::prepare_stored`]): a target participant
//! whose buffers and layout stay put restores, step after step, the newest revision
//! (or weight generation) a trainer committed, given only its revision and
//! generation.
//!
//! The preparation keeps the store, the layout (the load plan's stored manifest,
//! target placement and the local binding) and the guard. A step derives the
//! manifest key of the revision and generation (`wire-format.md` key layout),
//! reads and strictly decodes that manifest, refuses it unless it holds the
//! prepared layout (the same tensors and the same stored fragments, whatever their
//! object keys), attests the same placement and binding for that identity (the
//! runtime fences and every fragment shared), plans the local participant's part
//! and restores it (committed-manifest check, pin, registration, reads, integrity
//! as every restore). What a step does in proportion to the fragments: the manifest
//! read and compare, the placement's identity digest and the local part's plan;
//! unlike a live step it cannot skip them, since every revision is a new manifest.

use super::loader::{Front, Loader, TransferStats};
use super::prepared::{LeaseRotation, PreparedInfo, StepArgs};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{KeyLayout, Placement, PlacementPart, PlacementPartSpec, PlacementSpec, StoredManifest};
use crate::protocol::guards::{GuardProvider, StaticGuard};
use crate::protocol::{LoadArgs, LoadPlan, LoadStats, ProgressFn, WeightStore};
use crate::runtime::{validate_runtime_binding, RuntimeBinding};
use parking_lot::Mutex;
use std::sync::Arc;

/// The suffix of every refusal of stale prepared state.
const PREPARE_AGAIN: &str = "prepare the transfer again";

/// Options of [`Loader::prepare_stored`].
#[derive(Clone, Default)]
pub struct StoredPrepareArgs {
    /// Restricts every step to the target fragments on one worker.
    pub worker_id: Option<String>,
    /// Pins the target allocations during each step's reads (`None`: [`StaticGuard`]).
    pub guard: Option<Arc<dyn GuardProvider>>,
}

/// The arguments of one [`PreparedRestore::step`].
#[derive(Clone, Copy, Debug, Default)]
pub struct StoredStepArgs<'a> {
    /// The revision to restore (`None`: the prepared one).
    pub revision: Option<&'a str>,
    /// Its weight generation.
    pub weight_generation: u64,
    /// Transfer id handed to the guard (default: random hex).
    pub transfer_id: Option<&'a str>,
}

/// One step of a prepared call as a caller that holds either kind names it (the C
/// ABI's `mws_step_args`): a live step may rotate leases, a stored step may name the
/// revision to read; each kind refuses the other's field.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepRequest<'a> {
    /// The weight generation the step moves (live) or restores (stored).
    pub weight_generation: u64,
    /// Leases rotated since the previous live step (a stored step takes none).
    pub leases: &'a [LeaseRotation<'a>],
    /// Transfer id handed to the guards (default: random hex).
    pub transfer_id: Option<&'a str>,
    /// The revision a stored step restores (`None`: the prepared one; a live step
    /// takes none).
    pub revision: Option<&'a str>,
}

impl<'a> StepRequest<'a> {
    /// The request as a live step's arguments. Errors (`InvalidArgument`): `a live
    /// step takes no revision`.
    pub fn live(&self) -> Result<StepArgs<'a>> {
        if self.revision.is_some() {
            return Err(Error::invalid("a live step takes no revision"));
        }
        Ok(StepArgs {
            weight_generation: self.weight_generation,
            leases: self.leases,
            transfer_id: self.transfer_id,
            notify: None,
            delta: None,
        })
    }

    /// The request as a stored step's arguments. Errors (`InvalidArgument`): `a
    /// prepared restore takes no lease rotation`.
    pub fn stored(&self) -> Result<StoredStepArgs<'a>> {
        if !self.leases.is_empty() {
            return Err(Error::invalid("a prepared restore takes no lease rotation"));
        }
        Ok(StoredStepArgs {
            revision: self.revision,
            weight_generation: self.weight_generation,
            transfer_id: self.transfer_id,
        })
    }
}

/// A restore prepared once for many steps ([`Loader::prepare_stored`]); each
/// [`Self::step`] restores one revision / weight generation of the prepared layout.
/// Steps honour the loader's cancellation token and progress callback and record its
/// statistics. Thread safety: `Send + Sync`; steps run one at a time.
pub struct PreparedRestore {
    front: Arc<Front>,
    store: Arc<WeightStore>,
    /// The layout: the template manifest (namespace, resource, revision, tensors,
    /// stored fragments), the target placement and limits.
    template: LoadPlan,
    binding: RuntimeBinding,
    args: StoredPrepareArgs,
    /// Bytes one step restores.
    bytes: u64,
    /// The identity of the last step and what it derived (placement and binding).
    last: Mutex<Option<(String, u64, Arc<Placement>, RuntimeBinding)>>,
}

impl std::fmt::Debug for PreparedRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedRestore")
            .field("manifest", &self.template.manifest().manifest_key())
            .field("participant", &self.binding.participant_id())
            .finish_non_exhaustive()
    }
}

fn stale(message: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::StaleBinding, format!("prepared restore is stale: {message}; {PREPARE_AGAIN}"))
}

/// `manifest` holds the layout of `template`: the same tensors and the same stored
/// fragments in the same order (object keys and offsets may differ).
fn same_layout(template: &StoredManifest, manifest: &StoredManifest) -> bool {
    let (a, b) = (template.fragments(), manifest.fragments());
    template.resource_id() == manifest.resource_id()
        && template.tensors().len() == manifest.tensors().len()
        && template.tensors().iter().zip(manifest.tensors()).all(|(x, y)| x == y)
        && a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.fragment_id() == y.fragment_id()
                && x.tensor_id() == y.tensor_id()
                && x.global_offset() == y.global_offset()
                && x.local_shape() == y.local_shape()
                && x.nbytes() == y.nbytes()
                && x.aliases() == y.aliases()
        })
}

/// `placement` with another revision and weight generation (every part re-stamped;
/// the identity digests are recomputed).
fn restamped(placement: &Placement, revision: &str, generation: u64) -> Result<Placement> {
    let parts = placement
        .parts()
        .iter()
        .map(|p| {
            PlacementPart::new(PlacementPartSpec {
                resource_id: p.resource_id().to_string(),
                revision: revision.to_string(),
                placement_set_id: p.placement_set_id().to_string(),
                topology_id: p.topology_id().to_string(),
                participant_id: p.participant_id().to_string(),
                weight_generation: generation,
                rank: p.rank(),
                tensors: p.tensors().to_vec(),
                fragments: p.fragments().to_vec(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Placement::from_parts(PlacementSpec {
        resource_id: placement.resource_id().to_string(),
        revision: revision.to_string(),
        weight_generation: generation,
        placement_set_id: placement.placement_set_id().to_string(),
        topology: placement.topology().clone(),
        parts,
        placement_id: None,
    })
}

impl Loader {
    /// Prepares restores of `binding`'s part of `plan`'s layout from `store`, one
    /// revision or weight generation per [`PreparedRestore::step`] (see the module
    /// documentation). `plan` is any load plan of that layout (for example the first
    /// revision's); `binding` must be one of its bindings. Errors: `invalid target
    /// runtime binding: <detail>` ([`ErrorKind::InvalidBinding`]), `target executor
    /// snapshot mismatch: unknown instance` (not one of the plan's bindings).
    pub fn prepare_stored(
        &self,
        store: Arc<WeightStore>,
        plan: &LoadPlan,
        binding: &RuntimeBinding,
        args: StoredPrepareArgs,
    ) -> Result<PreparedRestore> {
        validate_runtime_binding(plan.logical().target(), binding).map_err(|e| {
            Error::new(ErrorKind::InvalidBinding, format!("invalid target runtime binding: {}", e.message()))
        })?;
        let Some(bi) = plan.bindings().iter().position(|b| b == binding) else {
            return Err(Error::new(ErrorKind::StaleBinding, "target executor snapshot mismatch: unknown instance"));
        };
        let bytes = plan
            .region_targets()
            .iter()
            .zip(plan.regions())
            .filter(|((b, f), _)| {
                *b as usize == bi
                    && args.worker_id.as_deref().is_none_or(|w| binding.fragments()[*f as usize].worker_id() == w)
            })
            .map(|(_, r)| r.total_bytes())
            .sum();
        Ok(PreparedRestore {
            bytes,
            front: self.front.clone(),
            store,
            template: plan.clone(),
            binding: binding.clone(),
            args,
            last: Mutex::new(None),
        })
    }
}

impl PreparedRestore {
    /// Bytes one step restores.
    pub fn total_bytes(&self) -> u64 {
        self.bytes
    }

    /// What it holds: a step submits no engine batch (it reads the store), pins its
    /// one binding, restores [`Self::total_bytes`] (empty when that is 0).
    pub fn info(&self) -> PreparedInfo {
        PreparedInfo { empty: self.bytes == 0, batches: 0, pinned_bindings: 1, bytes: self.bytes }
    }

    /// The manifest key a step of `revision` / `weight_generation` reads.
    pub fn manifest_key(&self, revision: Option<&str>, weight_generation: u64) -> Result<String> {
        let m = self.template.manifest();
        let layout = KeyLayout::new(
            self.store.key_prefix(),
            m.namespace(),
            m.resource_id(),
            revision.unwrap_or(m.revision()),
            weight_generation,
        )?;
        Ok(layout.manifest_key())
    }

    /// Restores one revision / weight generation of the prepared layout into the
    /// prepared binding's buffers (see the module documentation). Errors: `load was
    /// cancelled before it started` (kind `Store`); the manifest read's (`NotFound`
    /// when nothing was committed there); `prepared restore is stale: <key> holds
    /// another layout; prepare the transfer again`, and a stale pin (buffers freed
    /// or moved, as the guard observes them) with the same suffix
    /// ([`ErrorKind::StaleBinding`]); every error of [`WeightStore::load`].
    ///
    /// # Safety
    /// As [`WeightStore::load`]: every target view of the prepared binding is valid
    /// for writes and untouched by anyone else during the step; the guard pins it.
    pub unsafe fn step(&self, args: &StoredStepArgs<'_>) -> Result<LoadStats> {
        if self.front.cancel.is_cancelled() {
            return Err(Error::new(ErrorKind::Store, "load was cancelled before it started"));
        }
        let template = self.template.manifest();
        let revision = args.revision.unwrap_or(template.revision());
        let key = self.manifest_key(Some(revision), args.weight_generation)?;
        let manifest = self.store.load_manifest(&key)?;
        if !same_layout(template, &manifest) {
            return Err(stale(format!("{key} holds another layout")));
        }
        let mut last = self.last.lock();
        let (placement, binding) = match &*last {
            Some((r, g, p, b)) if r == revision && *g == args.weight_generation => (p.clone(), b.clone()),
            _ => {
                let target = self.template.logical().target();
                let p = if target.revision() == revision && target.weight_generation() == args.weight_generation {
                    target.clone()
                } else {
                    Arc::new(restamped(target, revision, args.weight_generation)?)
                };
                let b = self.binding.attesting(&p);
                *last = Some((revision.to_string(), args.weight_generation, p.clone(), b.clone()));
                (p, b)
            }
        };
        drop(last);
        let plan = self.store.plan_load(
            Arc::new(manifest),
            placement,
            std::slice::from_ref(&binding),
            self.template.logical().limits(),
        )?;
        let guard: Arc<dyn GuardProvider> = self.args.guard.clone().unwrap_or_else(|| Arc::new(StaticGuard));
        let progress = self.front.progress.lock().clone();
        let load = LoadArgs {
            worker_id: self.args.worker_id.as_deref(),
            guard: Some(&*guard),
            transfer_id: args.transfer_id,
            progress: progress.as_deref().map(|p| p as ProgressFn<'_>),
            ..Default::default()
        };
        // SAFETY: forwarded contract (this function's `# Safety`).
        let s = unsafe { self.store.load(&plan, &binding, load) }.map_err(|e| {
            if e.kind() == ErrorKind::StaleBinding {
                stale(e.message())
            } else {
                e
            }
        })?;
        *self.front.stats.lock() = TransferStats::from(&s);
        Ok(s)
    }
}
