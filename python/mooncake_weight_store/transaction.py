"""An upload transaction over one plan: upload each participant, then commit (or
abort); recovery with finalize."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

from .errors import ConflictError, MwsError, Status
from .receipts import Receipts

if TYPE_CHECKING:  # pragma: no cover
    from .binding import Binding
    from .manifest import StoredManifest
    from .placement import Placement
    from .store import Decision, Guard, Store
    from .upload_plan import UploadPlan

__all__ = ["Transaction"]


class Transaction:
    """Upload transaction of ``plan`` in ``store``.

    As a context manager: a normal exit commits (unless already committed or
    aborted); an exception aborts (unless the commit decision may exist, in which
    case the transaction is left for a commit retry or
    :meth:`Store.finalize_upload`), and the original exception propagates.

    Example::

        with store.transaction(plan) as tx:
            for binding in bindings:
                tx.upload(placement, binding)
        manifest = tx.manifest
    """

    def __init__(self, store: "Store", plan: "UploadPlan") -> None:
        self.store = store
        self.plan = plan
        self.receipts: List[Receipts] = []
        self.manifest: Optional["StoredManifest"] = None
        self.decision_may_exist = False
        self.state = "open"  # open | committed | aborted

    def _require_open(self) -> None:
        if self.state != "open":
            raise ConflictError(int(Status.CONFLICT), f"transaction is {self.state}")

    def upload(self, placement: "Placement", binding: "Binding", **kw: Any) -> Receipts:
        """Uploads one participant (see :meth:`Store.upload`); keeps its receipts."""
        self._require_open()
        r = self.store.upload(self.plan, placement, binding, **kw)
        self.receipts.append(r)
        return r

    def add_receipts(self, receipts: Receipts) -> None:
        """Adds receipts produced elsewhere (another process's upload)."""
        self._require_open()
        self.receipts.append(receipts)

    def all_receipts(self) -> Receipts:
        return Receipts.concat(self.receipts)

    def commit(self) -> "StoredManifest":
        """Commits (idempotent once committed)."""
        if self.state == "committed" and self.manifest is not None:
            return self.manifest
        self._require_open()
        with self.all_receipts() as rs:
            try:
                self.manifest = self.store.commit(self.plan, rs)
            except MwsError as e:
                self.decision_may_exist = self.decision_may_exist or bool(getattr(e, "decision_may_exist", False))
                raise
        self.state = "committed"
        return self.manifest

    def abort(self) -> None:
        """Records abort and removes the payloads. Refused when the commit decision
        may exist (retry :meth:`commit` instead). A no-op once aborted."""
        if self.state == "aborted":
            return
        if self.state == "committed":
            raise ConflictError(int(Status.CONFLICT), "transaction is committed")
        if self.decision_may_exist:
            raise ConflictError(int(Status.CONFLICT), "commit decision may exist; retry commit instead")
        rs = self.all_receipts() if self.receipts else None
        try:
            self.store.abort_upload(self.plan, rs)
        finally:
            if rs is not None:
                rs.close()
        self.state = "aborted"

    def finalize(self) -> None:
        """:meth:`Store.finalize_upload` of the plan."""
        self.store.finalize_upload(self.plan)

    def decision(self) -> "Decision":
        return self.store.read_decision(self.plan)

    def __enter__(self) -> "Transaction":
        self._require_open()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
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
        return f"Transaction({self.plan!r}, {self.state}, receipts={len(self.receipts)})"
