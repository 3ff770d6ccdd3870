"""Stores: the embedded backends (memory, directory) and any Python object that
implements the store methods, bridged through the C vtable (``docs/STORE-VTABLE.md``).

A Python backend implements (return codes are Mooncake ``ErrorCode`` values: 0 ok,
-704 not found, -706 object has lease, -200 no available handle, -600 invalid params,
other negative = error):

=======================================================  ===============================
``put(key, value: bytes, group_id, record_type) -> int``  create-only (0 for an existing
                                                          key is allowed: value kept)
``upsert(key, value, group_id, record_type) -> int``      insert or replace
``get_size(key) -> int``                                  size or negative
``get_into(key, address, capacity) -> int``               bytes read or negative
``exists(key) -> int`` (or ``is_exist``)                  1 / 0 / negative
``batch_exists(keys) -> list[int]``                       optional: 1 / 0 / negative per key
``batch_get_size(keys) -> list[int]``                     optional: size or negative per
                                                          key, one round trip (restores)
``remove(key) -> int``                                    force remove; 0 or -704 = ok
``batch_put_from(items: list[PutItem], record_type)``     list of per-item codes
``get_into_ranges(items: list[RangeItem])``               list of bytes read / codes
``register_buffer(address, len, memory_kind, ordinal)``   optional
``unregister_buffer(address)``                            optional
``close()``                                               optional: called on destroy
=======================================================  ===============================

If ``get_size``/``get_into`` are missing but ``get(key) -> bytes`` exists (raising
``KeyError`` for a missing key), they are derived from it.

The bridge never lets an exception reach C: a callback that raises returns -1 (or
-704 for ``KeyError``), and the exception is kept in :attr:`Store.callback_errors`.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import logging
import os
import threading
import traceback
from ctypes import c_int32, c_int64, c_void_p
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _abi, _lib
from ._lib import LIB, OwnedHandle, borrowed_str, call, cstr
from .device import DeviceEngine
from .errors import ArgumentError, error_for_status
from .guard import Guard, TerminalState, GuardBridge, io_args
from .load import LoadPlan, LoadStats
from .manifest import StoredManifest
from .progress import Progress
from .receipts import Receipts
from .revisions import RevisionInfo, read_revisions
from .transaction import Transaction
from .upload_plan import UploadPlan, plan_upload
from .writer import Resolver, Writer

if TYPE_CHECKING:  # pragma: no cover
    from .binding import Binding
    from .placement import Placement

__all__ = ["Store", "RevisionInfo", "Decision",
           "TerminalState", "Guard", "DictBackend", "PutItem", "RangeItem", "RecordType",
           "RegistrationLease", "LeaseSide", "OK", "NO_AVAILABLE_HANDLE", "INVALID_PARAMS", "OBJECT_NOT_FOUND",
           "OBJECT_HAS_LEASE", "INTERNAL_ERROR"]

log = logging.getLogger("mooncake_weight_store.store")

# -- the Python store protocol: return codes and item types ---------------------------
# (Mooncake ``ErrorCode`` values; docs/STORE-VTABLE.md)

OK = 0
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
INTERNAL_ERROR = -1


class RecordType:
    """``record_type`` values of the vtable (Mooncake ``ObjectDataType``)."""

    PAYLOAD = _abi.MWS_RECORD_PAYLOAD  # WEIGHT
    METADATA = _abi.MWS_RECORD_METADATA  # METADATA


class PutItem(NamedTuple):
    """One ``batch_put_from`` item."""

    key: str
    group_id: str
    address: int
    len: int
    memory_kind: int = 0
    device_ordinal: int = 0


class RangeItem(NamedTuple):
    """One ``get_into_ranges`` item (flat form)."""

    key: str
    object_offset: int
    dest_address: int
    len: int
    buffer_address: int
    memory_kind: int = 0
    device_ordinal: int = 0



# Bridges stay alive until the library calls `destroy` (the store may outlive the
# Python Store object inside handles that share it, e.g. a writer or loader).
_BRIDGES: Dict[int, "_VtableBridge"] = {}
_BRIDGES_LOCK = threading.Lock()
_GRAVEYARD: List["_VtableBridge"] = []
_IDS = itertools.count(1)


def _bury() -> None:
    with _BRIDGES_LOCK:
        _GRAVEYARD.clear()


def _key(b: _abi.mws_bytes) -> str:
    if not b.len:
        return ""
    return ctypes.string_at(b.ptr, b.len).decode("utf-8", "surrogateescape")


def _int_result(rc: Any) -> int:
    if isinstance(rc, bool) or not isinstance(rc, int):
        raise ArgumentError(f"store callback returned {type(rc).__name__}, expected int")
    return rc


class _VtableBridge:
    """Holds the CFUNCTYPE thunks of one Python backend."""

    MAX_ERRORS = 64

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.errors: List[str] = []
        self.ctx_id = next(_IDS)
        self.destroyed = threading.Event()
        b = backend

        exists = getattr(b, "exists", None) or getattr(b, "is_exist", None)
        get_size = getattr(b, "get_size", None)
        get_into = getattr(b, "get_into", None)
        if (get_size is None or get_into is None) and hasattr(b, "get"):
            get_size, get_into = self._derive_get(b.get)
        missing = [n for n, f in (("put", getattr(b, "put", None)), ("upsert", getattr(b, "upsert", None)),
                                  ("get_size", get_size), ("get_into", get_into), ("exists", exists),
                                  ("remove", getattr(b, "remove", None)),
                                  ("batch_put_from", getattr(b, "batch_put_from", None)),
                                  ("get_into_ranges", getattr(b, "get_into_ranges", None))) if not callable(f)]
        if missing:
            raise ArgumentError(f"store backend {type(b).__name__} lacks: {', '.join(missing)}")
        self._get_size, self._get_into, self._exists = get_size, get_into, exists

        vt = _abi.mws_store_vtable()
        vt.size = ctypes.sizeof(_abi.mws_store_vtable)
        vt.version = _abi.MWS_STORE_VTABLE_VERSION
        vt.put = _abi.PUT_FN(self._put)
        vt.upsert = _abi.PUT_FN(self._upsert)
        vt.get_size = _abi.GET_SIZE_FN(self._cb_get_size)
        vt.get_into = _abi.GET_INTO_FN(self._cb_get_into)
        vt.exists = _abi.EXISTS_FN(self._cb_exists)
        vt.remove = _abi.REMOVE_FN(self._remove)
        vt.batch_put_from = _abi.BATCH_PUT_FN(self._batch_put_from)
        vt.get_into_ranges = _abi.RANGES_FN(self._get_into_ranges)
        if callable(getattr(b, "register_buffer", None)):
            vt.register_buffer = _abi.REGISTER_FN(self._register)
        if callable(getattr(b, "unregister_buffer", None)):
            vt.unregister_buffer = _abi.UNREGISTER_FN(self._unregister)
        vt.destroy = _abi.DESTROY_FN(self._destroy)
        self._batch_exists_name = next((n for n in ("batch_exists", "batch_is_exist")
                                        if callable(getattr(b, n, None))), None)
        if self._batch_exists_name is not None:
            vt.batch_exists = _abi.BATCH_EXISTS_FN(self._batch_exists)
        # Optional `list(prefix) -> iterable of (key, size)`; the Mooncake backend has
        # none (its client cannot enumerate keys).
        if callable(getattr(b, "list", None)):
            vt.list = _abi.LIST_FN(self._list)
        if callable(getattr(b, "cost", None)):
            vt.get_cost = _abi.GET_COST_FN(self._get_cost)
        # Optional `batch_get_size(keys) -> list[int]`: the sizes a restore checks
        # before writing, in one round trip instead of one `get_size` per key.
        if callable(getattr(b, "batch_get_size", None)):
            vt.batch_get_size = _abi.BATCH_GET_SIZE_FN(self._batch_get_size)
        self.vtable = vt

    # -- error containment ----------------------------------------------------------

    def _fail(self, op: str, exc: BaseException) -> int:
        msg = f"{op}: {type(exc).__name__}: {exc}"
        if len(self.errors) < self.MAX_ERRORS:
            self.errors.append(msg)
        log.warning("store backend callback failed: %s\n%s", msg, traceback.format_exc())
        if isinstance(exc, KeyError):
            return OBJECT_NOT_FOUND
        return INTERNAL_ERROR

    @staticmethod
    def _derive_get(get: Any) -> Any:
        def get_size(key: str) -> int:
            return len(get(key))

        def get_into(key: str, address: int, capacity: int) -> int:
            data = get(key)
            if len(data) > capacity:
                return INVALID_PARAMS
            ctypes.memmove(address, bytes(data), len(data))
            return len(data)

        return get_size, get_into

    # -- callbacks (each catches everything) ----------------------------------------

    def _write(self, op: str, key: _abi.mws_bytes, value: int, n: int, group: _abi.mws_bytes, rt: int) -> int:
        try:
            data = ctypes.string_at(value, n) if n else b""
            return _int_result(getattr(self.backend, op)(_key(key), data, _key(group), int(rt)))
        except BaseException as e:  # noqa: BLE001 - never unwind into C
            return self._fail(op, e)

    def _put(self, ctx, key, value, n, group, rt):  # type: ignore[no-untyped-def]
        return self._write("put", key, value, n, group, rt)

    def _upsert(self, ctx, key, value, n, group, rt):  # type: ignore[no-untyped-def]
        return self._write("upsert", key, value, n, group, rt)

    def _cb_get_size(self, ctx, key):  # type: ignore[no-untyped-def]
        try:
            return _int_result(self._get_size(_key(key)))
        except BaseException as e:  # noqa: BLE001
            return self._fail("get_size", e)

    def _cb_get_into(self, ctx, key, buf, cap):  # type: ignore[no-untyped-def]
        try:
            rc = _int_result(self._get_into(_key(key), buf or 0, int(cap)))
            if rc > cap:
                raise ArgumentError(f"get_into reported {rc} bytes for a {cap}-byte buffer")
            return rc
        except BaseException as e:  # noqa: BLE001
            return self._fail("get_into", e)

    def _cb_exists(self, ctx, key):  # type: ignore[no-untyped-def]
        try:
            rc = self._exists(_key(key))
            if isinstance(rc, bool):
                rc = int(rc)
            return _int_result(rc)
        except BaseException as e:  # noqa: BLE001
            return self._fail("exists", e)

    def _batch_exists(self, ctx, keys, n, results):  # type: ignore[no-untyped-def]
        try:
            f = getattr(self.backend, self._batch_exists_name)
            rcs = list(f([_key(keys[i]) for i in range(n)]))
            if len(rcs) != n:
                raise ArgumentError(f"batch_exists returned {len(rcs)} results for {n} keys")
            vals = [_int_result(int(rc) if isinstance(rc, bool) else rc) for rc in rcs]
            for i, rc in enumerate(vals):
                results[i] = max(min(rc, 2**31 - 1), -(2**31))
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("batch_exists", e)

    def _batch_get_size(self, ctx, keys, n, sizes):  # type: ignore[no-untyped-def]
        try:
            rcs = list(self.backend.batch_get_size([_key(keys[i]) for i in range(n)]))
            if len(rcs) != n:
                raise ArgumentError(f"batch_get_size returned {len(rcs)} results for {n} keys")
            vals = [_int_result(rc) for rc in rcs]
            for rc in vals:
                # i64::MIN is the library's "no result" marker; beyond int64 ctypes would wrap.
                if not -(2**63) < rc < 2**63:
                    raise ArgumentError(f"batch_get_size returned {rc}, outside int64")
            for i, rc in enumerate(vals):
                sizes[i] = rc
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("batch_get_size", e)

    def _get_cost(self, ctx, out):  # type: ignore[no-untyped-def]
        """``backend.cost()`` -> a mapping (or object) with ``per_request_ns``,
        ``per_range_ns``, ``bytes_per_second``: the restore planner's cost model."""
        try:
            c = self.backend.cost()
            get = (lambda k: c[k]) if isinstance(c, dict) else (lambda k: getattr(c, k))
            out[0].per_request_ns = int(get("per_request_ns"))
            out[0].per_range_ns = int(get("per_range_ns"))
            out[0].bytes_per_second = int(get("bytes_per_second"))
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("cost", e)
    def _list(self, ctx, prefix, emit, emit_ctx):  # type: ignore[no-untyped-def]
        try:
            for key, size in self.backend.list(_key(prefix)):
                raw = key.encode("utf-8")
                item = _abi.mws_bytes(ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p).value, len(raw))
                if emit(emit_ctx, item, int(size)) != 0:
                    break
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("list", e)

    def _remove(self, ctx, key):  # type: ignore[no-untyped-def]
        try:
            return _int_result(self.backend.remove(_key(key)))
        except BaseException as e:  # noqa: BLE001
            return self._fail("remove", e)

    def _batch_put_from(self, ctx, items, n, rt, results):  # type: ignore[no-untyped-def]
        try:
            batch = [
                PutItem(_key(it.key), _key(it.group_id), int(it.address), int(it.len),
                        int(it.memory_kind), int(it.device_ordinal))
                for it in (items[i] for i in range(n))
            ]
            rcs = list(self.backend.batch_put_from(batch, int(rt)))
            if len(rcs) != n:
                raise ArgumentError(f"batch_put_from returned {len(rcs)} results for {n} items")
            vals = [_int_result(rc) for rc in rcs]
            for i, rc in enumerate(vals):
                results[i] = max(min(rc, 2**31 - 1), -(2**31))
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("batch_put_from", e)

    def _get_into_ranges(self, ctx, items, n, results):  # type: ignore[no-untyped-def]
        try:
            batch = [
                RangeItem(_key(it.key), int(it.object_offset), int(it.dest_address), int(it.len),
                          int(it.buffer_address), int(it.memory_kind), int(it.device_ordinal))
                for it in (items[i] for i in range(n))
            ]
            rcs = list(self.backend.get_into_ranges(batch))
            if len(rcs) != n:
                raise ArgumentError(f"get_into_ranges returned {len(rcs)} results for {n} items")
            vals = [_int_result(rc) for rc in rcs]
            for i, rc in enumerate(vals):
                results[i] = rc
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("get_into_ranges", e)

    def _register(self, ctx, address, length, kind, ordinal):  # type: ignore[no-untyped-def]
        try:
            return _int_result(self.backend.register_buffer(int(address), int(length), int(kind), int(ordinal)))
        except BaseException as e:  # noqa: BLE001
            return self._fail("register_buffer", e)

    def _unregister(self, ctx, address):  # type: ignore[no-untyped-def]
        try:
            return _int_result(self.backend.unregister_buffer(int(address)))
        except BaseException as e:  # noqa: BLE001
            return self._fail("unregister_buffer", e)

    def _destroy(self, ctx):  # type: ignore[no-untyped-def]
        try:
            self.destroyed.set()
            close = getattr(self.backend, "close", None)
            if callable(close) and getattr(self, "close_backend", False):
                close()
        except BaseException as e:  # noqa: BLE001
            self._fail("destroy", e)
        finally:
            # The thunk running right now must outlive this call: move the bridge to
            # a graveyard that is emptied later, from Python code outside any callback.
            with _BRIDGES_LOCK:
                _BRIDGES.pop(self.ctx_id, None)
                _GRAVEYARD.append(self)


class Decision(enum.IntEnum):
    """``mws_decision``: the decision recorded for an upload transaction."""

    NONE = _abi.MWS_DECISION_NONE
    COMMIT = _abi.MWS_DECISION_COMMIT
    ABORT = _abi.MWS_DECISION_ABORT


class LeaseSide(enum.IntEnum):
    """``mws_lease_side``: which buffers a registration lease pins."""

    SOURCE = _abi.MWS_LEASE_SOURCE
    TARGET = _abi.MWS_LEASE_TARGET


class RegistrationLease(OwnedHandle):
    """Buffers of one binding pinned and registered once (``mws_registration_lease``)
    for any number of :meth:`Store.upload` / :meth:`Store.load` calls passed
    ``lease=``; those calls then pin and register nothing. Create it with
    :meth:`Store.register_buffers`.

    As a context manager: a normal exit closes it as ``COMPLETED``, an exception as
    ``FAILED_DRAINED`` (every call using the lease has returned, so no I/O can still
    touch the buffers). :meth:`close` is idempotent; a closed lease is refused
    (:class:`StaleBindingError`). Freeing an open lease (garbage collection) closes
    it as ``ABORTED``. The lease keeps its store, binding and guard alive.

    :meth:`close` closes the lease (the handle stays, so :attr:`closed` can be read);
    :meth:`free` frees the handle.
    """

    _FREE = "mws_registration_lease_free"
    _WHAT = "registration lease"
    _GONE = "freed"

    def __init__(self, store: "Store", binding: "Binding", fragment_ids: Sequence[str], side: LeaseSide,
                 guard: Optional[Guard] = None, transfer_id: Optional[str] = None) -> None:
        super().__init__()
        self.store = store
        self.binding = binding
        self.side = LeaseSide(side)
        self.fragment_ids = sorted(set(fragment_ids))
        self._guard_bridge = GuardBridge(guard) if guard is not None else None
        ids = (ctypes.c_char_p * max(1, len(self.fragment_ids)))(
            *[cstr(f, "fragment_id") for f in self.fragment_ids])
        out = c_void_p()
        call("mws_registration_lease_new", store, binding, ids, len(self.fragment_ids),
             int(self.side), ctypes.addressof(self._guard_bridge.vtable) if self._guard_bridge else None, None,
             cstr(transfer_id, "transfer_id"), ctypes.byref(out))
        self._adopt(out.value)

    @property
    def closed(self) -> bool:
        return self._h is None or int(LIB.fn("mws_registration_lease_is_closed")(self._h)) == 1

    def close(self, state: TerminalState = TerminalState.COMPLETED) -> None:
        """Unregisters the buffers and releases the pin with ``state`` (no-op when
        closed). An unregistration failure quarantines the pin in the store."""
        if self._h is not None:
            call("mws_registration_lease_close", self._h, int(TerminalState(state)))

    def free(self) -> None:
        """Frees the handle (closing an open lease as ``ABORTED``)."""
        self._free()

    def _on_exit(self, exc_type: Any, exc: Any) -> None:
        if self._h is not None:
            self.close(TerminalState.COMPLETED if exc_type is None else TerminalState.FAILED_DRAINED)

    def __repr__(self) -> str:
        return (f"RegistrationLease({self.binding.participant_id!r}, {self.side.name.lower()}, "
                f"{len(self.fragment_ids)} fragments, {'closed' if self.closed else 'open'})")


def _options(key_prefix: Optional[str], max_range_bytes: int, max_ranges_per_request: int,
             max_region_segments: int, staging_bytes: Optional[int] = None,
             verify_integrity: bool = True,
             device_engine: Optional[DeviceEngine] = None,
             write_integrity: bool = True) -> Optional[_abi.mws_store_options]:
    """``staging_bytes``: None = the library's default (64 MiB, chosen per region by
    the store's cost model), 0 = never stage, N = a staging budget of N bytes.
    ``verify_integrity``: True = the library's default (verify), False = off.
    ``write_integrity``: True = the library's default (snapshots write the integrity
    record), False = no checksums, no record.
    ``device_engine``: its handle goes into the options (the caller keeps the engine
    in use for the opening call, which takes the library's own reference)."""
    if not isinstance(verify_integrity, bool):
        raise ArgumentError("verify_integrity must be True or False")
    if not isinstance(write_integrity, bool):
        raise ArgumentError("write_integrity must be True or False")
    if device_engine is not None and not isinstance(device_engine, DeviceEngine):
        raise ArgumentError(f"device_engine must be a DeviceEngine, not {type(device_engine).__name__}")
    if (key_prefix is None and staging_bytes is None and verify_integrity and write_integrity
            and device_engine is None and not (max_range_bytes or max_ranges_per_request or max_region_segments)):
        return None
    for name, v in (("max_range_bytes", max_range_bytes), ("max_ranges_per_request", max_ranges_per_request),
                    ("max_region_segments", max_region_segments), ("staging_bytes", staging_bytes or 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= (1 << 64) - 1:
            raise ArgumentError(f"{name} must be an unsigned 64-bit integer")
    c_staging = 0 if staging_bytes is None else (_abi.MWS_STAGING_OFF if staging_bytes == 0 else staging_bytes)
    return _abi.mws_store_options(key_prefix=cstr(key_prefix, "key_prefix"), max_range_bytes=max_range_bytes,
                                  max_ranges_per_request=max_ranges_per_request,
                                  max_region_segments=max_region_segments, staging_bytes=c_staging,
                                  verify_integrity=_abi.MWS_VERIFY_ON if verify_integrity
                                  else _abi.MWS_VERIFY_OFF,
                                  write_integrity=_abi.MWS_WRITE_INTEGRITY_ON if write_integrity
                                  else _abi.MWS_WRITE_INTEGRITY_OFF,
                                  device_engine=device_engine.handle if device_engine is not None else None)


class Store(OwnedHandle):
    """A weight store (``mws_store``): an object store backend plus the key prefix,
    limits and registration state of the weight protocol.

    Open one with :meth:`memory`, :meth:`directory` or :meth:`from_backend` (any Python
    object implementing the store methods, e.g.
    :class:`~mooncake_weight_store.mooncake_backend.MooncakeStoreBackend`); free it
    with :meth:`close` or a ``with`` block. Thread-safe: uploads and loads of
    different participants may run concurrently.

    Common keyword options: ``key_prefix`` (default ``"weights"``),
    ``max_range_bytes`` (largest ranged read, default 64 MiB),
    ``max_ranges_per_request`` (keys or ranges per backend request, default 1024),
    ``max_region_segments``, ``staging_bytes`` (default None: 64 MiB; 0: never
    stage): the budget of the host staging buffer of restores through range-priced
    stores such as Mooncake — a region of many short rows is read as one span into a
    registered staging buffer and scattered locally when the store's cost model (the
    backend's optional ``cost()``) says that is cheaper; host targets only; ``verify_integrity``
    (default True: restores check what they read against the revision's CRC-32C
    integrity record, computed as the bytes are copied, and fail with
    :class:`IntegrityError` naming the tensor, the stored fragment's box, the fragment
    id and the object key; False opts out; revisions without a record restore
    unverified; cost: ``docs/INTEGRITY.md``), ``write_integrity`` (default True:
    snapshots compute the CRC-32C of every 1 MiB block of every payload and write the
    integrity record; False: no checksums and no record, the revision is what the
    reference writes and restores unverified).
    """

    _FREE = "mws_store_free"
    _WHAT = "store"

    def __init__(self, handle: Optional[int], bridge: Optional[_VtableBridge] = None, kind: str = "") -> None:
        super().__init__(handle)
        self._bridge = bridge
        self.kind = kind
        #: the device engine the store was opened with (device memory), if any
        self.device_engine: Optional[DeviceEngine] = None

    # -- opening --------------------------------------------------------------------

    @classmethod
    def memory(cls, *, key_prefix: Optional[str] = None, max_range_bytes: int = 0,
               max_ranges_per_request: int = 0, max_region_segments: int = 0, staging_bytes: Optional[int] = None,
               device_engine: Optional[DeviceEngine] = None, verify_integrity: bool = True,
               write_integrity: bool = True) -> "Store":
        """An in-memory store (single process; objects live as long as the store).
        ``device_engine``: a :class:`~mooncake_weight_store.device.DeviceEngine` that
        stages device memory (see :mod:`mooncake_weight_store.device`)."""
        opts = _options(key_prefix, max_range_bytes, max_ranges_per_request, max_region_segments, staging_bytes,
                        verify_integrity, device_engine, write_integrity)
        return cls._open_embedded("mws_store_open_memory", (), opts, device_engine, "memory")

    @classmethod
    def directory(cls, path: Union[str, "os.PathLike[str]"], *, key_prefix: Optional[str] = None,
                  max_range_bytes: int = 0, max_ranges_per_request: int = 0,
                  max_region_segments: int = 0, staging_bytes: Optional[int] = None,
                  device_engine: Optional[DeviceEngine] = None, verify_integrity: bool = True,
                  write_integrity: bool = True) -> "Store":
        """The crash-safe directory store rooted at ``path`` (``device_engine``: as
        :meth:`memory`)."""
        opts = _options(key_prefix, max_range_bytes, max_ranges_per_request, max_region_segments, staging_bytes,
                        verify_integrity, device_engine, write_integrity)
        return cls._open_embedded("mws_store_open_dir", (cstr(os.fspath(path), "path"),), opts, device_engine,
                                  "directory")

    @classmethod
    def _open_embedded(cls, fn: str, args: Tuple[object, ...], opts: Optional[_abi.mws_store_options],
                       device_engine: Optional[DeviceEngine], kind: str) -> "Store":
        out = c_void_p()
        if device_engine is not None:
            with device_engine._use():  # held for the opening call, which takes its own reference
                call(fn, *args, ctypes.byref(opts) if opts else None, ctypes.byref(out))
        else:
            call(fn, *args, ctypes.byref(opts) if opts else None, ctypes.byref(out))
        store = cls(out.value, kind=kind)
        store.device_engine = device_engine
        return store

    @classmethod
    def from_backend(cls, backend: object, *, close_backend: bool = False, key_prefix: Optional[str] = None,
                     max_range_bytes: int = 0, max_ranges_per_request: int = 0,
                     max_region_segments: int = 0, staging_bytes: Optional[int] = None,
                     verify_integrity: bool = True, device_engine: Optional[DeviceEngine] = None,
                     write_integrity: bool = True) -> "Store":
        """Plugs a Python object implementing the store methods (see the module doc)
        into the library through the C vtable. ``close_backend`` calls
        ``backend.close()`` when the library destroys the store. ``verify_integrity``:
        as for the embedded stores (default True: restores check what they read
        against the revision's integrity record; through a Python backend the
        checksums are computed from the host destination after each request, and
        blocks delivered to device memory are read again into host memory).
        ``device_engine``: as for :meth:`memory` (device memory is staged in host
        buffers, so the backend sees host memory only)."""
        opts = _options(key_prefix, max_range_bytes, max_ranges_per_request, max_region_segments, staging_bytes,
                        verify_integrity, device_engine, write_integrity)
        _bury()
        bridge = _VtableBridge(backend)
        bridge.close_backend = close_backend  # type: ignore[attr-defined]
        with _BRIDGES_LOCK:
            _BRIDGES[bridge.ctx_id] = bridge
        out = c_void_p()
        try:
            if opts is None:
                call("mws_store_from_vtable", ctypes.byref(bridge.vtable), c_void_p(bridge.ctx_id), ctypes.byref(out))
            elif device_engine is not None:
                with device_engine._use():  # held for the opening call, which takes its own reference
                    call("mws_store_from_vtable_with_options", ctypes.byref(bridge.vtable), c_void_p(bridge.ctx_id),
                         ctypes.byref(opts), ctypes.byref(out))
            else:
                call("mws_store_from_vtable_with_options", ctypes.byref(bridge.vtable), c_void_p(bridge.ctx_id),
                     ctypes.byref(opts), ctypes.byref(out))
        except BaseException:
            with _BRIDGES_LOCK:
                _BRIDGES.pop(bridge.ctx_id, None)
            raise
        store = cls(out.value, bridge, kind=f"vtable:{type(backend).__name__}")
        store.device_engine = device_engine
        return store

    @property
    def backend(self) -> Optional[object]:
        """The Python backend of a vtable store (:meth:`from_backend`), else None."""
        return self._bridge.backend if self._bridge else None

    @property
    def callback_errors(self) -> List[str]:
        """Exceptions raised by the Python backend's callbacks (contained, not raised)."""
        return list(self._bridge.errors) if self._bridge else []

    @property
    def key_prefix(self) -> str:
        """The key prefix of every key the store writes (default ``"weights"``)."""
        return borrowed_str("mws_store_key_prefix", self)

    def close(self) -> None:
        """Frees the handle (the backend lives on while writers use it)."""
        self._free()

    def _after_free(self) -> None:
        _bury()  # bridges the library destroyed meanwhile (never from inside a callback)

    def __repr__(self) -> str:
        return f"Store({self.kind}{', closed' if self._h is None else ''})"

    # -- raw access (tests, tools) --------------------------------------------------

    def get(self, key: str) -> bytes:
        """The whole object (raises :class:`NotFoundError`)."""
        k = cstr(key, "key")
        for _ in range(8):
            n = ctypes.c_size_t(0)
            call("mws_store_get", self, k, None, 0, ctypes.byref(n))
            buf = ctypes.create_string_buffer(max(n.value, 1))
            got = ctypes.c_size_t(0)
            st = LIB.fn("mws_store_get")(self, k, buf, n.value, ctypes.byref(got))
            if st == 0:
                return buf.raw[: got.value]
            if st != int(_lib.Status.INVALID_ARGUMENT):  # grown meanwhile: retry
                _lib.check(st)
        _lib.check(st)
        raise AssertionError("unreachable")

    def exists(self, key: str) -> bool:
        present = ctypes.c_int(0)
        call("mws_store_exists", self, cstr(key, "key"), ctypes.byref(present))
        return bool(present.value)

    def put(self, key: str, value: bytes, group_id: Optional[str] = None) -> None:
        """Create-only write of a metadata record (raises :class:`AlreadyExistsError`)."""
        data = bytes(value)
        call("mws_store_put", self, cstr(key, "key"), data, len(data), cstr(group_id, "group_id"))

    def upsert(self, key: str, value: bytes, group_id: Optional[str] = None) -> None:
        data = bytes(value)
        call("mws_store_upsert", self, cstr(key, "key"), data, len(data), cstr(group_id, "group_id"))

    def remove(self, key: str) -> None:
        """Removes ``key`` (an absent key is fine)."""
        call("mws_store_remove", self, cstr(key, "key"))

    def register_buffers(self, binding: "Binding", fragment_ids: Optional[Sequence[str]] = None, *,
                         side: Union[LeaseSide, str] = LeaseSide.SOURCE, guard: Optional[Guard] = None,
                         transfer_id: Optional[str] = None) -> RegistrationLease:
        """Pins (``guard``; ``None``: the caller keeps the buffers valid) and registers
        the buffers of ``fragment_ids`` (runtime fragment ids; default: every fragment
        of ``binding``) once; returns a :class:`RegistrationLease` to pass as
        ``lease=`` to :meth:`upload` (``side="source"``) or :meth:`load`
        (``side="target"``). Use it as a context manager or :meth:`~RegistrationLease.close` it."""
        if isinstance(side, str):
            side = LeaseSide[side.upper()]
        ids = list(binding.fragment_ids.values()) if fragment_ids is None else list(fragment_ids)
        return RegistrationLease(self, binding, ids, side, guard, transfer_id)

    @property
    def pending_registration_count(self) -> int:
        return int(LIB.fn("mws_store_pending_registration_count")(self))

    def drain_pending_registrations(self) -> None:
        call("mws_store_drain_pending_registrations", self)

    # -- upload transaction ---------------------------------------------------------

    def upload(self, plan: "UploadPlan", placement: "Placement", binding: "Binding", *,
               worker_id: Optional[str] = None, transfer_id: Optional[str] = None,
               guard: Optional[Guard] = None, lease: Optional[RegistrationLease] = None,
               progress: Optional[Callable[[Progress], object]] = None) -> "Receipts":
        """Uploads ``binding``'s participant's payloads for ``plan``; returns its
        receipts. Never deletes payloads on failure (use :meth:`abort_upload`).
        ``lease``: a source lease of this store covering exactly the fragments read
        (:meth:`UploadPlan.source_fragment_ids`); nothing is pinned or registered.
        ``progress``: called with :class:`~mooncake_weight_store.progress.Progress`
        reports (phase ``"upload"``, items = objects), see that module."""
        args, keep = io_args(worker_id, transfer_id, guard, lease, progress)
        out = c_void_p()
        call("mws_store_upload", self, plan, placement, binding,
             ctypes.byref(args), ctypes.byref(out))
        del keep
        return Receipts(out.value)

    def commit(self, plan: "UploadPlan", receipts: Optional["Receipts"] = None) -> "StoredManifest":
        """Claims the commit decision and publishes the manifest.

        On failure the raised :class:`MwsError` has ``decision_may_exist``: when
        true, keep the plan and retry :meth:`commit` (or :meth:`finalize_upload`),
        never abort. :class:`ConflictError`: the transaction chose abort or lost to
        a conflicting revision (its payloads were removed)."""
        may = ctypes.c_int(0)
        out = c_void_p()
        st = LIB.fn("mws_store_commit")(self, plan, receipts if receipts else None,
                                        ctypes.byref(may), ctypes.byref(out))
        if st != 0:
            err = error_for_status(st, _lib.last_error(), _lib.status_name(st))
            err.decision_may_exist = bool(may.value)  # type: ignore[attr-defined]
            raise err
        return StoredManifest(out.value)

    def abort_upload(self, plan: "UploadPlan", receipts: Optional["Receipts"] = None) -> None:
        """Records the abort decision and removes the plan's payloads."""
        call("mws_store_abort_upload", self, plan, receipts if receipts else None)

    def finalize_upload(self, plan: "UploadPlan") -> None:
        """Idempotent recovery to the terminal state (removes what must not stay)."""
        call("mws_store_finalize_upload", self, plan)

    def read_decision(self, plan: "UploadPlan") -> Decision:
        out = ctypes.c_int(0)
        call("mws_store_read_decision", self, plan, ctypes.byref(out))
        return Decision(out.value)

    def plan_upload(self, placement: "Placement", bindings: Sequence["Binding"], *,
                    namespace: Optional[str] = None, key_prefix: Optional[str] = None,
                    transaction_id: Optional[str] = None, created_at: Optional[str] = None) -> "UploadPlan":
        """:func:`~mooncake_weight_store.upload_plan.plan_upload` with this store's
        key prefix (the plan's keys must live under the prefix the store uses; a
        ``key_prefix`` given here overrides it)."""
        return plan_upload(placement, bindings, namespace=namespace,
                           key_prefix=self.key_prefix if key_prefix is None else key_prefix,
                           transaction_id=transaction_id, created_at=created_at)

    def transaction(self, plan: "UploadPlan") -> "Transaction":
        """A :class:`~mooncake_weight_store.transaction.Transaction` over ``plan``
        (context manager: commit on success, abort on error)."""
        return Transaction(self, plan)

    # -- revisions ------------------------------------------------------------------

    def revisions(self, resource_id: str, *, namespace: Optional[str] = None) -> List[RevisionInfo]:
        """Every committed revision of ``resource_id`` in ``namespace`` (None:
        ``"default"``, the namespace :func:`save_state_dict` and :meth:`plan_upload`
        use by default) under this store's key prefix, oldest first; ``[]`` when there
        is none. Ordered by weight generation, then ``created_at``, then revision name
        (code-point order): the last is the newest (:meth:`latest`).

        A revision is listed once its manifest is published (committed); the
        library finds the manifests by listing the store's keys and reads every one
        of them, so no key is built by hand. A store that cannot list its keys (a
        backend without ``list``, such as
        :class:`~mooncake_weight_store.mooncake_backend.MooncakeStoreBackend`) is read
        through the revision index this library's commits write there, each revision
        also checked against its decision record; revisions committed by a writer
        that keeps no index (the reference mooncake-reshard) are not found there. Each item is a
        :class:`~mooncake_weight_store.revisions.RevisionInfo`: pass it (or its
        ``manifest_key``) to :func:`load_state_dict`, :func:`export_safetensors` or
        :meth:`load_manifest`.

        Raises (each message names ``resource_id``):
        :class:`~mooncake_weight_store.errors.ArgumentError`
        / :class:`~mooncake_weight_store.errors.InvalidArgumentError` for a
        ``resource_id`` or ``namespace`` that is not a non-empty str;
        :class:`~mooncake_weight_store.errors.InvalidManifestError` for a manifest
        that does not decode or lies at another revision's key, or an indexed
        revision's decision record that does not decode (the message names the key);
        backend errors
        (:class:`~mooncake_weight_store.errors.StoreError`, ...).

        Thread-safe: may run beside uploads and commits (a revision committed
        meanwhile may or may not be listed). The result owns no handle.
        """
        return read_revisions(self, _name(resource_id, "resource_id"),
                              None if namespace is None else _name(namespace, "namespace"), latest=False)

    def latest(self, resource_id: str, *, namespace: Optional[str] = None) -> Optional[RevisionInfo]:
        """The newest committed revision of ``resource_id`` (the last of
        :meth:`revisions`: the highest weight generation; among equal generations
        the latest ``created_at``, then the greatest revision name), or None when
        there is none. Reads only the manifests of the highest generation. Raises and
        thread safety as :meth:`revisions`."""
        found = read_revisions(self, _name(resource_id, "resource_id"),
                               None if namespace is None else _name(namespace, "namespace"), latest=True)
        return found[-1] if found else None

    # -- restore --------------------------------------------------------------------

    def load_manifest(self, manifest_key: str) -> "StoredManifest":
        """Reads and strictly validates the manifest at ``manifest_key``."""
        out = c_void_p()
        call("mws_stored_manifest_from_store", self, cstr(manifest_key, "manifest_key"), ctypes.byref(out))
        return StoredManifest(out.value)

    def load(self, plan: "LoadPlan", binding: "Binding", *, worker_id: Optional[str] = None,
             transfer_id: Optional[str] = None, guard: Optional[Guard] = None,
             lease: Optional[RegistrationLease] = None,
             progress: Optional[Callable[[Progress], object]] = None) -> "LoadStats":
        """Loads ``binding``'s participant's part of ``plan`` into its buffers.
        ``lease``: a target lease of this store covering exactly the fragments
        loaded; nothing is pinned or registered. ``progress``: called with
        :class:`~mooncake_weight_store.progress.Progress` reports (phase
        ``"restore"``, items = transfer regions)."""
        args, keep = io_args(worker_id, transfer_id, guard, lease, progress)
        st = _abi.mws_load_stats()
        call("mws_store_load", self, plan, binding, ctypes.byref(args), ctypes.byref(st))
        del keep
        return LoadStats(int(st.regions), int(st.ranges), int(st.requests), int(st.bytes), int(st.strided_regions),
                         int(st.direct_regions), int(st.staged_regions), int(st.staged_bytes))

    def load_many(self, plan: "LoadPlan", bindings: Sequence["Binding"], *, worker_id: Optional[str] = None,
                  transfer_id: Optional[str] = None, guard: Optional[Guard] = None,
                  progress: Optional[Callable[[Progress], object]] = None) -> "LoadStats":
        """Loads several participants of this process in one call
        (``mws_store_load_many``): what one :meth:`load` per binding does, with the
        plan's checks (committed manifest, object sizes, integrity record) made once
        for all of them and the bindings loaded on several threads (in turn when
        ``progress`` is given); returns the totals. No lease (a lease covers one
        binding); a participant given twice is :class:`InvalidArgumentError`.
        ``progress`` sees one restore per binding."""
        bindings = list(bindings)
        if not bindings:
            return LoadStats()
        c_bindings = _lib.handle_array(bindings)
        args, keep = io_args(worker_id, transfer_id, guard, None, progress)
        st = _abi.mws_load_stats()
        call("mws_store_load_many", self, plan, c_bindings, len(bindings), ctypes.byref(args), ctypes.byref(st))
        del keep
        return LoadStats(int(st.regions), int(st.ranges), int(st.requests), int(st.bytes), int(st.strided_regions),
                         int(st.direct_regions), int(st.staged_regions), int(st.staged_bytes))

    def restore(self, manifest_key: str, placement: "Placement", bindings: Sequence["Binding"], *,
                progress: Optional[Callable[[Progress], object]] = None) -> "LoadStats":
        """Loads the manifest at ``manifest_key`` into every binding (convenience; one
        :meth:`load_many` call). ``progress`` sees one restore per binding."""
        with self.load_manifest(manifest_key) as manifest, LoadPlan.new(manifest, placement, bindings) as lp:
            return self.load_many(lp, bindings, progress=progress)

    # -- snapshot writer ------------------------------------------------------------

    def begin_snapshot(self, placement: "Placement", bindings: Sequence["Binding"], *,
                       resolver: Optional[Resolver] = None, namespace: Optional[str] = None,
                       transaction_id: Optional[str] = None, created_at: Optional[str] = None,
                       resource_id: Optional[str] = None, revision: Optional[str] = None,
                       weight_generation: Optional[int] = None) -> "Writer":
        """Starts a :class:`~mooncake_weight_store.writer.Writer` (see there for the
        keywords)."""
        return Writer(self, placement, bindings, resolver=resolver, namespace=namespace,
                      transaction_id=transaction_id, created_at=created_at, resource_id=resource_id,
                      revision=revision, weight_generation=weight_generation)


def _name(value: object, what: str) -> str:
    """``value`` when it is a str (the library checks it is non-empty)."""
    if not isinstance(value, str):
        raise ArgumentError(f"{what} must be a str, not {type(value).__name__} ({value!r})")
    return value


class DictBackend:
    """A thread-safe in-process backend implementing the store methods over a dict
    (reference implementation of the Python store protocol, and a test double)."""

    def __init__(self) -> None:
        self.objects: Dict[str, bytes] = {}
        self.groups: Dict[str, str] = {}
        self.registered: Dict[int, int] = {}
        self.lock = threading.RLock()
        self.calls: Dict[str, int] = {}

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    def put(self, key: str, value: bytes, group_id: str = "", record_type: int = 1) -> int:
        with self.lock:
            self._count("put")
            if not key:
                return INVALID_PARAMS
            if key not in self.objects:
                self.objects[key] = bytes(value)
                self.groups[key] = group_id
            return 0

    def upsert(self, key: str, value: bytes, group_id: str = "", record_type: int = 1) -> int:
        with self.lock:
            self._count("upsert")
            self.objects[key] = bytes(value)
            self.groups[key] = group_id
            return 0

    def get_size(self, key: str) -> int:
        with self.lock:
            v = self.objects.get(key)
            return OBJECT_NOT_FOUND if v is None else len(v)

    def get_into(self, key: str, address: int, capacity: int) -> int:
        with self.lock:
            v = self.objects.get(key)
            if v is None:
                return OBJECT_NOT_FOUND
            if len(v) > capacity:
                return INVALID_PARAMS
            ctypes.memmove(address, v, len(v))
            return len(v)

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.objects[key]

    def exists(self, key: str) -> int:
        with self.lock:
            return int(key in self.objects)

    def remove(self, key: str) -> int:
        with self.lock:
            self._count("remove")
            if self.objects.pop(key, None) is None:
                return OBJECT_NOT_FOUND
            self.groups.pop(key, None)
            return 0

    def batch_put_from(self, items: Sequence[PutItem], record_type: int = 0) -> List[int]:
        with self.lock:
            self._count("batch_put_from")
            out = []
            for it in items:
                if it.memory_kind != 0:
                    out.append(INVALID_PARAMS)
                    continue
                if it.key not in self.objects:
                    self.objects[it.key] = ctypes.string_at(it.address, it.len)
                    self.groups[it.key] = it.group_id
                out.append(0)
            return out

    def get_into_ranges(self, items: Sequence[RangeItem]) -> List[int]:
        with self.lock:
            self._count("get_into_ranges")
            out = []
            for it in items:
                v = self.objects.get(it.key)
                if v is None:
                    out.append(OBJECT_NOT_FOUND)
                elif it.object_offset + it.len > len(v) or it.memory_kind != 0:
                    out.append(INVALID_PARAMS)
                else:
                    ctypes.memmove(it.dest_address, v[it.object_offset:it.object_offset + it.len], it.len)
                    out.append(it.len)
            return out

    def register_buffer(self, address: int, length: int, memory_kind: int = 0, device_ordinal: int = 0) -> int:
        with self.lock:
            self.registered[address] = length
            return 0

    def unregister_buffer(self, address: int) -> int:
        with self.lock:
            return 0 if self.registered.pop(address, None) is not None else INVALID_PARAMS

    def keys(self, prefix: str = "") -> List[str]:
        with self.lock:
            return sorted(k for k in self.objects if k.startswith(prefix))
