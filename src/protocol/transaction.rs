//! [`Transaction`]: one upload transaction of one plan in one store, as a state
//! machine — uploads per binding that collect receipts, receipts added from other
//! ranks, commit (tracking whether the commit decision may exist), abort, finalize.
//! The C handle `mws_transaction` and the Python `Transaction` are fronts for it.

use super::receipt::UploadReceipt;
use super::state::WeightStore;
use super::upload::{UploadArgs, UploadSource};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Placement, StoredManifest};
use crate::plan::upload::UploadPlan;
use crate::runtime::RuntimeBinding;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Where a [`Transaction`] stands, as far as calls on it know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransactionState {
    /// Uploads and receipts are accepted; not committed or aborted through this value.
    Open,
    /// [`Transaction::commit`] succeeded.
    Committed,
    /// [`Transaction::abort`] succeeded.
    Aborted,
}

enum Phase {
    Open,
    Committed(Arc<StoredManifest>),
    Aborted,
}

struct Inner {
    receipts: Vec<UploadReceipt>,
    phase: Phase,
}

impl Inner {
    fn require_open(&self) -> Result<()> {
        match self.phase {
            Phase::Open => Ok(()),
            Phase::Committed(_) => Err(Error::new(ErrorKind::Conflict, "the transaction is committed")),
            Phase::Aborted => Err(Error::new(ErrorKind::Conflict, "the transaction is aborted")),
        }
    }
}

/// An upload transaction: one plan in one store, uploaded participant by
/// participant ([`Transaction::upload`]), with receipts collected here (plus those
/// of other processes, [`Transaction::add_receipts`]), then committed or aborted.
///
/// Several transactions over the same plan (in one or several processes) are the
/// same store transaction: the one that commits must hold every receipt. Dropping a
/// transaction never aborts it: its payloads stay until someone decides, because a
/// commit decision may exist or another process may still commit the plan.
///
/// Thread safety: `Send + Sync`; calls are serialized by a mutex held for the whole
/// call, I/O included, so uploads through one transaction never run in parallel
/// (give each thread its own transaction over the same plan and merge receipts).
/// Guard callbacks run under that mutex and must not call into the same transaction.
pub struct Transaction {
    store: Arc<WeightStore>,
    plan: UploadPlan,
    inner: Mutex<Inner>,
    decision_may_exist: AtomicBool,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("manifest_key", &self.plan.manifest().manifest_key())
            .field("state", &self.state())
            .finish()
    }
}

impl Transaction {
    /// Starts a transaction of `plan` in `store`. No I/O.
    pub fn new(store: Arc<WeightStore>, plan: UploadPlan) -> Self {
        Transaction {
            store,
            plan,
            inner: Mutex::new(Inner { receipts: Vec::new(), phase: Phase::Open }),
            decision_may_exist: AtomicBool::new(false),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<WeightStore> {
        &self.store
    }

    /// The plan.
    pub fn plan(&self) -> &UploadPlan {
        &self.plan
    }

    /// Uploads `binding`'s payloads ([`WeightStore::upload`]) and keeps their
    /// receipts. A failed upload adds no receipts and leaves the transaction open;
    /// uploading a participant twice makes the commit fail with a duplicate receipt.
    ///
    /// Errors: those of [`WeightStore::upload`], plus [`ErrorKind::Conflict`] when the
    /// transaction is committed or aborted (nothing is uploaded).
    ///
    /// # Safety
    /// As [`WeightStore::upload`]: every source view of `binding` must be valid for
    /// reads and not written during the call; `args.guard` must pin them.
    pub unsafe fn upload(&self, placement: &Placement, binding: &RuntimeBinding, args: UploadArgs<'_>) -> Result<()> {
        let mut inner = self.inner.lock();
        inner.require_open()?;
        // SAFETY: the caller upholds `upload`'s contract (this function's contract).
        let r = unsafe { self.store.upload(&self.plan, placement, binding, args) }?;
        inner.receipts.extend(r);
        Ok(())
    }

    /// Uploads several participants in one call ([`WeightStore::upload_many`]) and
    /// keeps their receipts (in source order, as one [`Transaction::upload`] per
    /// source would). A failed call adds no receipts and leaves the transaction open.
    ///
    /// Errors: those of [`WeightStore::upload_many`], plus [`ErrorKind::Conflict`]
    /// when the transaction is committed or aborted (nothing is uploaded).
    ///
    /// # Safety
    /// As [`WeightStore::upload_many`].
    pub unsafe fn upload_many(
        &self,
        placement: &Placement,
        sources: &[UploadSource<'_>],
        args: UploadArgs<'_>,
    ) -> Result<()> {
        let mut inner = self.inner.lock();
        inner.require_open()?;
        // SAFETY: the caller upholds `upload_many`'s contract (this function's contract).
        let r = unsafe { self.store.upload_many(&self.plan, placement, sources, args) }?;
        inner.receipts.extend(r);
        Ok(())
    }

    /// A copy of every receipt held now (uploads and added receipts, in order).
    pub fn receipts(&self) -> Vec<UploadReceipt> {
        self.inner.lock().receipts.clone()
    }

    /// Adds receipts produced by other processes' uploads of the same plan; they are
    /// checked against the plan at commit. Errors: [`ErrorKind::Conflict`] when
    /// committed or aborted.
    pub fn add_receipts(&self, receipts: &[UploadReceipt]) -> Result<()> {
        let mut inner = self.inner.lock();
        inner.require_open()?;
        inner.receipts.extend_from_slice(receipts);
        Ok(())
    }

    /// Commits with every receipt held ([`WeightStore::commit`]) and returns the
    /// published manifest; once committed, another call returns it again (no I/O).
    /// As soon as the commit decision may have been written,
    /// [`Transaction::decision_may_exist`] is true, also when the call fails: then
    /// retry the commit (or finalize), never abort. A failed commit leaves the
    /// transaction open.
    ///
    /// Errors: those of [`WeightStore::commit`], plus [`ErrorKind::Conflict`] when
    /// aborted.
    pub fn commit(&self) -> Result<Arc<StoredManifest>> {
        let mut inner = self.inner.lock();
        match &inner.phase {
            Phase::Committed(m) => Ok(m.clone()),
            Phase::Aborted => Err(Error::new(ErrorKind::Conflict, "the transaction is aborted")),
            Phase::Open => {
                let mut flag = || self.decision_may_exist.store(true, Ordering::SeqCst);
                let m = Arc::new(self.store.commit(&self.plan, &inner.receipts, Some(&mut flag))?);
                inner.phase = Phase::Committed(m.clone());
                Ok(m)
            }
        }
    }

    /// True once a commit may have written the commit decision (then never abort).
    pub fn decision_may_exist(&self) -> bool {
        self.decision_may_exist.load(Ordering::SeqCst)
    }

    /// The state as calls on this value know it. Another transaction over the same
    /// plan, or a finalize, may have decided the store transaction
    /// ([`WeightStore::read_decision`] reads the store).
    pub fn state(&self) -> TransactionState {
        match self.inner.lock().phase {
            Phase::Open => TransactionState::Open,
            Phase::Committed(_) => TransactionState::Committed,
            Phase::Aborted => TransactionState::Aborted,
        }
    }

    /// Aborts ([`WeightStore::abort_upload`] with the receipts held): records the
    /// abort decision and removes every payload of the plan that no published
    /// manifest references. A no-op once aborted. On failure the transaction stays
    /// open (retry, or finalize later).
    ///
    /// Errors: [`ErrorKind::Conflict`] when committed or when the commit decision may
    /// exist (retry the commit instead), and those of [`WeightStore::abort_upload`].
    pub fn abort(&self) -> Result<()> {
        let mut inner = self.inner.lock();
        match inner.phase {
            Phase::Aborted => return Ok(()),
            Phase::Committed(_) => {
                return Err(Error::new(ErrorKind::Conflict, "cannot abort: the transaction is committed"))
            }
            Phase::Open => {}
        }
        if self.decision_may_exist() {
            return Err(Error::new(
                ErrorKind::Conflict,
                "cannot abort: the commit decision may exist; retry the commit instead",
            ));
        }
        self.store.abort_upload(&self.plan, &inner.receipts)?;
        inner.phase = Phase::Aborted;
        Ok(())
    }

    /// Idempotent recovery ([`WeightStore::finalize`] of the plan). Does not change
    /// the state.
    pub fn finalize(&self) -> Result<()> {
        let _serialized = self.inner.lock();
        self.store.finalize(&self.plan)
    }
}
