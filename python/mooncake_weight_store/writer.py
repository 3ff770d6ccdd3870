"""Snapshot writer: write a model tensor by tensor; each participant is uploaded as
soon as all its fragments were written; commit publishes the manifest."""

from __future__ import annotations

import ctypes
import itertools
import threading
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from . import _abi, _lib
from ._lib import LIB, OwnedHandle, call, cstr
from .errors import ArgumentError, MwsError
from .manifest import StoredManifest
from .progress import Progress, c_progress
from .receipts import Receipts
from .upload_plan import UploadPlan

if TYPE_CHECKING:  # pragma: no cover
    from .binding import Binding
    from .placement import Placement
    from .store import Store

__all__ = ["Writer"]

#: ``resolver(tensor_id, tensor) -> placement fragment ids`` (``tensor``: what was
#: passed to :meth:`Writer.write_tensor`).
Resolver = Callable[[str, object], Sequence[str]]


class Writer(OwnedHandle):
    """A snapshot in progress (``mws_writer``) of ``placement`` from ``bindings``
    into ``store``.

    Args:
        resolver: ``resolver(tensor_id, tensor) -> placement fragment ids`` that the
            framework tensor backs. Default: every fragment of ``tensor_id`` that the
            writer's plan uploads (one complete replica).
        namespace, transaction_id, created_at: plan options.

    As a context manager: a normal exit commits if not committed; an exception
    aborts (unless the commit decision may exist), and the exception propagates.
    Calls are serialized by the library; adapter exceptions are contained and fail
    the call. The writer keeps the store and the bindings' buffers alive.
    """

    _FREE = "mws_writer_free"
    _WHAT = "writer"
    _GONE = "freed"

    def __init__(
        self,
        store: "Store",
        placement: "Placement",
        bindings: Sequence["Binding"],
        *,
        resolver: Optional[Resolver] = None,
        namespace: Optional[str] = None,
        transaction_id: Optional[str] = None,
        created_at: Optional[str] = None,
        resource_id: Optional[str] = None,
        revision: Optional[str] = None,
        weight_generation: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.placement = placement
        self.bindings = list(bindings)
        self.resolver = resolver
        self.adapter_errors: List[str] = []
        self._tensors: Dict[int, Any] = {}
        self._ids = itertools.count(1)
        self._last_ids: Any = None
        self._lock = threading.Lock()
        self._progress: Any = None
        self._plan: Optional[UploadPlan] = None
        self._frag_tensor = {f.placement_fragment_id: f.tensor_id for f in placement.fragments()}
        self.manifest: Optional["StoredManifest"] = None
        self.committed = False
        self.closed = False

        vt = _abi.mws_snapshot_adapter_vtable()
        vt.size = ctypes.sizeof(_abi.mws_snapshot_adapter_vtable)
        vt.version = _abi.MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION
        vt.export_source = _abi.EXPORT_SOURCE_FN(self._export_source)
        vt.resolve_fragment_ids = _abi.RESOLVE_IDS_FN(self._resolve)
        self._vt = vt
        desc = _abi.mws_snapshot_descriptor(
            resource_id=cstr(resource_id if resource_id is not None else placement.resource_id, "resource_id"),
            revision=cstr(revision if revision is not None else placement.revision, "revision"),
            weight_generation=placement.weight_generation if weight_generation is None else weight_generation,
            store_namespace=cstr(namespace, "namespace"),
        )
        opts = _abi.mws_upload_options(transaction_id=cstr(transaction_id, "transaction_id"),
                                       created_at=cstr(created_at, "created_at"))
        self._export_keep: Any = None
        out = ctypes.c_void_p()
        call("mws_writer_new", store, ctypes.byref(desc), ctypes.byref(vt), None, ctypes.byref(opts),
             ctypes.byref(out))
        self._export_keep = None
        self._adopt(out.value)
        _ = self.plan  # fetched now: stays readable after the writer is freed

    # -- adapter callbacks ------------------------------------------------------------

    def _fail(self, op: str, e: BaseException) -> int:
        self.adapter_errors.append(f"{op}: {type(e).__name__}: {e}")
        return -1

    def _export_source(self, ctx, descriptor, placement_out, bindings_out, count_out):  # type: ignore[no-untyped-def]
        try:
            arr = (ctypes.c_void_p * len(self.bindings))(*[b.handle for b in self.bindings])
            self._export_keep = arr
            placement_out[0] = self.placement.handle
            bindings_out[0] = ctypes.cast(arr, ctypes.POINTER(ctypes.c_void_p))
            count_out[0] = len(self.bindings)
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("export_source", e)

    def _resolve(self, ctx, tensor_id, tensor, ids_out, count_out):  # type: ignore[no-untyped-def]
        try:
            tid = tensor_id.decode("utf-8")
            obj = self._tensors.get(int(tensor or 0))
            if self.resolver is not None:
                ids = list(self.resolver(tid, obj))
            else:
                ids = self.default_fragment_ids(tid)
            enc = [cstr(str(i), "fragment id") for i in ids]
            arr = (ctypes.c_char_p * max(len(enc), 1))(*enc)
            self._last_ids = (arr, enc)
            ids_out[0] = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
            count_out[0] = len(enc)
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("resolve_fragment_ids", e)

    # -- API ----------------------------------------------------------------------------

    @property
    def plan(self) -> UploadPlan:
        """The writer's upload plan (still available after :meth:`close`)."""
        if self._plan is None:
            out = ctypes.c_void_p()
            call("mws_writer_upload_plan", self, ctypes.byref(out))
            self._plan = UploadPlan(out.value)
        return self._plan

    def default_fragment_ids(self, tensor_id: str) -> List[str]:
        """Placement fragments of ``tensor_id`` that the plan uploads."""
        return [op.source_placement_fragment_id for op in self.plan.operations()
                if self._frag_tensor.get(op.source_placement_fragment_id) == tensor_id]

    def tensor_ids(self) -> List[str]:
        """Every tensor the plan uploads (sorted)."""
        return sorted({self._frag_tensor[op.source_placement_fragment_id] for op in self.plan.operations()})

    def set_progress(self, fn: Optional[Callable[[Progress], object]]) -> None:
        """From now on, reports the snapshot's uploads to ``fn`` (a callable taking a
        :class:`~mooncake_weight_store.progress.Progress`, phase ``"upload"``, totals:
        every object of the plan); ``None`` removes it. Exceptions it raises are
        swallowed."""
        with self._lock:
            c_fn, keep = c_progress(fn)
            call("mws_writer_set_progress", self, c_fn, None)
            self._progress = keep

    def write_tensor(self, tensor_id: str, tensor: object = None) -> Receipts:
        """Marks ``tensor_id`` written (``tensor`` is handed to the resolver) and
        uploads every participant that is now complete; returns those receipts."""
        with self._lock:
            token = next(self._ids)
            self._tensors[token] = tensor
            out = ctypes.c_void_p()
            try:
                st = LIB.fn("mws_writer_write_tensor")(self, cstr(tensor_id, "tensor_id"),
                                                         ctypes.c_void_p(token), ctypes.byref(out))
                if st != 0:
                    msg = _lib.last_error()
                    if self.adapter_errors:
                        msg += f" (adapter: {self.adapter_errors[-1]})"
                    raise _lib.error_for_status(st, msg, _lib.status_name(st))
            finally:
                self._tensors.pop(token, None)
                self._last_ids = None
            return Receipts(out.value)

    def write_all(self) -> None:
        """Writes every tensor of the plan (with ``tensor=None``)."""
        for tid in self.tensor_ids():
            self.write_tensor(tid).close()

    def defer_uploads(self, defer: bool = True) -> None:
        """Defers the uploads to :meth:`commit` (``True``) or not (``False``, the
        default): deferred, :meth:`write_tensor` returns no receipts and :meth:`commit`
        uploads every participant in one upload call (one stream of put batches where
        the default makes one per participant); the bindings' buffers must stay
        unchanged until :meth:`commit` returns. An upload failure at commit aborts the
        writer. :class:`ConflictError` on a closed writer."""
        if not isinstance(defer, bool):
            raise ArgumentError("defer must be True or False")
        with self._lock:
            call("mws_writer_defer_uploads", self, 1 if defer else 0)

    def commit(self) -> "StoredManifest":
        """Publishes the manifest (uploading first whatever :meth:`defer_uploads` left
        for it). Transaction errors leave the writer open (retry)."""
        if self.committed and self.manifest is not None:
            return self.manifest
        out = ctypes.c_void_p()
        call("mws_writer_commit", self, ctypes.byref(out))
        self.manifest = StoredManifest(out.value)
        self.committed = self.closed = True
        return self.manifest

    def abort(self) -> None:
        """Aborts (records abort, removes payloads). :class:`ConflictError` when the
        commit decision may exist: retry :meth:`commit` instead."""
        call("mws_writer_abort", self)
        self.closed = True

    def close(self) -> None:
        """Frees the writer (an open writer is aborted, best effort)."""
        self._free()

    def _on_exit(self, exc_type: Any, exc: Any) -> None:
        """A ``with`` block's end: commit if not committed; on an exception, abort
        (a failed abort is added to the exception as a note)."""
        if exc_type is None:
            if not self.committed:
                self.commit()
        elif not self.closed:
            try:
                self.abort()
            except MwsError as e:
                if hasattr(exc, "add_note"):
                    exc.add_note(f"writer abort during cleanup failed: {e}")

    def __repr__(self) -> str:
        state = "committed" if self.committed else ("closed" if self.closed else "open")
        return f"Writer({self.placement.resource_id!r}, {state})"
