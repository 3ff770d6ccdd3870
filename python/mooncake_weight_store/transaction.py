"""An upload transaction over one plan (``mws_transaction``): upload each
participant, add receipts from other processes, then commit (or abort); recovery with
finalize. The state machine is the library's (``protocol::Transaction``); this class
only binds it."""

from __future__ import annotations

import ctypes
from ctypes import c_void_p
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from . import _abi, _lib
from ._lib import LIB, OwnedHandle, call
from .errors import ArgumentError, MwsError, error_for_status
from .guard import Guard, io_args
from .manifest import StoredManifest
from .progress import Progress
from .receipts import Receipts

if TYPE_CHECKING:  # pragma: no cover
    from .binding import Binding
    from .placement import Placement
    from .store import Decision, RegistrationLease, Store
    from .upload_plan import UploadPlan

__all__ = ["Transaction"]

_STATES = {_abi.MWS_TRANSACTION_OPEN: "open", _abi.MWS_TRANSACTION_COMMITTED: "committed",
           _abi.MWS_TRANSACTION_ABORTED: "aborted"}


class Transaction(OwnedHandle):
    """Upload transaction of ``plan`` in ``store`` (``mws_transaction``).

    As a context manager: a normal exit commits (unless already committed or
    aborted); an exception aborts (unless the commit decision may exist, in which
    case the transaction is left for a commit retry or
    :meth:`Store.finalize_upload`), and the original exception propagates. Closing
    (or collecting) the object never aborts: recovery is explicit.

    Thread safety: calls are serialized by the library; uploads through one
    transaction never run in parallel.

    Example::

        with store.transaction(plan) as tx:
            for binding in bindings:
                tx.upload(placement, binding)
        manifest = tx.manifest
    """

    _FREE = "mws_transaction_free"
    _WHAT = "transaction"
    _FREE_ON_EXIT = False  # the outcome stays readable after the block

    def __init__(self, store: "Store", plan: "UploadPlan") -> None:
        out = c_void_p()
        call("mws_transaction_new", store, plan, ctypes.byref(out))
        super().__init__(out.value)
        self.store = store
        self.plan = plan
        self.manifest: Optional["StoredManifest"] = None

    def upload(self, placement: "Placement", binding: "Binding", *, worker_id: Optional[str] = None,
               transfer_id: Optional[str] = None, guard: Optional[Guard] = None,
               lease: Optional["RegistrationLease"] = None,
               progress: Optional[Callable[[Progress], object]] = None) -> None:
        """Uploads one participant (as :meth:`Store.upload`, including
        ``progress``) and keeps its receipts in the transaction (:meth:`receipts`).
        Raises :class:`ConflictError` once committed or aborted."""
        args, keep = io_args(worker_id, transfer_id, guard, lease, progress)
        call("mws_transaction_upload", self, placement, binding, ctypes.byref(args))
        del keep

    def upload_many(self, placement: "Placement", bindings: Sequence["Binding"], *,
                    leases: Optional[Sequence[Optional["RegistrationLease"]]] = None,
                    worker_id: Optional[str] = None, transfer_id: Optional[str] = None,
                    guard: Optional[Guard] = None, progress: Optional[Callable[[Progress], object]] = None) -> None:
        """Uploads several participants of this process in one call
        (``mws_transaction_upload_many``): the same checks, errors and receipts as one
        :meth:`upload` per binding in order, but every check of every binding runs
        before any payload is written and the puts of all of them go out as one
        stream of batches (the fastest way to snapshot the ranks of one process).

        ``leases`` is ``None`` or one entry per binding (``None``: that binding is
        pinned through ``guard`` and registered for the call). ``worker_id``,
        ``transfer_id``, ``guard`` and ``progress`` apply to every binding. Raises
        :class:`ValueError` when ``leases`` has another length than ``bindings``."""
        bindings = list(bindings)
        n = len(bindings)
        if leases is not None and len(leases) != n:
            raise ArgumentError(f"leases has {len(leases)} entries for {n} bindings")
        c_bindings = _lib.handle_array(bindings)
        c_leases = None
        if leases is not None:
            c_leases = _lib.handle_array(leases)
        args, keep = io_args(worker_id, transfer_id, guard, None, progress)
        call("mws_transaction_upload_many", self, placement, c_bindings, n, c_leases,
             ctypes.byref(args))
        del keep

    def receipts(self) -> Receipts:
        """A copy of every receipt the transaction holds now (send it to the
        committing process with :meth:`Receipts.to_json`)."""
        out = c_void_p()
        call("mws_transaction_receipts", self, ctypes.byref(out))
        return Receipts(out.value)

    def add_receipts(self, receipts: Receipts) -> None:
        """Adds receipts produced elsewhere (another process's upload)."""
        call("mws_transaction_add_receipts", self, receipts)

    def commit(self) -> "StoredManifest":
        """Commits with every receipt held; idempotent once committed. On failure the
        raised :class:`MwsError` has ``decision_may_exist`` (see
        :attr:`decision_may_exist`)."""
        if self.manifest is not None:
            return self.manifest
        out = c_void_p()
        st = LIB.fn("mws_transaction_commit")(self, ctypes.byref(out))
        if st != 0:
            err = error_for_status(st, _lib.last_error(), _lib.status_name(st))
            err.decision_may_exist = self.decision_may_exist  # type: ignore[attr-defined]
            raise err
        self.manifest = StoredManifest(out.value)
        return self.manifest

    @property
    def decision_may_exist(self) -> bool:
        """True once a commit may have written the decision: then retry the commit
        (or finalize), never abort."""
        return bool(LIB.fn("mws_transaction_commit_decision_may_exist")(self))

    @property
    def state(self) -> str:
        """``"open"``, ``"committed"`` or ``"aborted"`` (as calls on this object know)."""
        return _STATES[int(LIB.fn("mws_transaction_get_state")(self))]

    def abort(self) -> None:
        """Records abort and removes the payloads. Refused when committed or when the
        commit decision may exist (retry :meth:`commit` instead). A no-op once aborted."""
        call("mws_transaction_abort", self)

    def finalize(self) -> None:
        """Idempotent recovery of the plan (:meth:`Store.finalize_upload`)."""
        call("mws_transaction_finalize", self)

    def decision(self) -> "Decision":
        return self.store.read_decision(self.plan)

    def _on_exit(self, exc_type: Any, exc: Any) -> None:
        if exc_type is None:
            if self.state == "open":
                self.commit()
            return
        if self.state == "open" and not self.decision_may_exist:
            try:
                self.abort()
            except MwsError as e:  # keep the original error
                if hasattr(exc, "add_note"):
                    exc.add_note(f"abort during cleanup failed: {e}")

    def __repr__(self) -> str:
        state = "closed" if self._h is None else self.state
        return f"Transaction({self.plan!r}, {state})"
