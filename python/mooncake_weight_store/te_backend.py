"""The live-transfer engine on Mooncake's real Transfer Engine (``mooncake.engine``).

:class:`MooncakeTransferEngine` is a :class:`~mooncake_weight_store.TransferEngine`
whose engine calls go through the C vtable ``mws_transfer_engine_vtable`` into a
``mooncake.engine.TransferEngine`` (the PyPI wheel
``mooncake-transfer-engine-non-cuda``): the library's reader (``Loader``) and sink
(``Sink``) executors plan and track the transfers, TE moves the bytes between
registered memory. Only addresses, lengths and segment names cross Python; the data
never does.

* Initialisation: ``initialize(hostname, "P2PHANDSHAKE", "tcp", "")`` by default (an
  ``http://`` metadata URL also works). The segment name peers use as ``endpoint`` is
  :attr:`MooncakeTransferEngine.segment` (``"<hostname>:<rpc port>"`` under
  P2PHANDSHAKE; the port is chosen by TE).
* Registration: :meth:`register_memory` registers one whole allocation (TE refuses
  overlapping registrations with -7 and unknown ones with -3).
* Transfers: the legacy synchronous batch calls ``batch_transfer_sync_read`` /
  ``_write``, split into batches of at most ``max_batch_operations`` (default 1024,
  the wheel's per-peer TCP queue limit; an overflow fails and may wedge the peer).
  A non-zero TE return means *completion unknown* (TE does not report per range).
  The async calls are not used: their ids are raw native pointers that crash the
  process when handed back twice.
* Identity: ``get_engine_ptr()``.

Error mapping: a TE return code is passed to the library unchanged (0 ok, -1 failed
or completion unknown, -3 not registered, -7 overlapping registration); a Python
exception inside a callback never reaches C: it is recorded in
:attr:`MooncakeTransferEngine.callback_errors` and reported as
:data:`CALLBACK_FAILED`. A sub-batch failure stops the remaining sub-batches.

Threading: TE's calls are thread-safe; the library runs one submission per engine at
a time. Lifetime: the vtable thunks live as long as this object, and loaders/sinks
keep their engine object alive, so keep this object (or a loader/sink using it)
alive while the library may call it; :meth:`close` frees the handle only.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from ctypes import POINTER, Structure, c_int32, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, List, Optional

from . import _lib
from ._lib import call
from .transfer import TransferEngine

__all__ = ["MooncakeTransferEngine", "CALLBACK_FAILED", "TeError", "ENGINE_VTABLE_VERSION"]

log = logging.getLogger(__name__)

#: Returned to the library when a Python callback raised (distinct from TE's codes).
CALLBACK_FAILED = -900
#: ``MWS_TRANSFER_ENGINE_VTABLE_VERSION``.
ENGINE_VTABLE_VERSION = 1
#: The wheel's default ``MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER``.
PER_PEER_LIMIT = 1024

_U64P = POINTER(c_uint64)
ENGINE_ID_FN = ctypes.CFUNCTYPE(c_uint64, c_void_p)
REGISTER_FN = ctypes.CFUNCTYPE(c_int32, c_void_p, c_uint64, c_uint64, c_int32)
UNREGISTER_FN = ctypes.CFUNCTYPE(c_int32, c_void_p, c_uint64)
BATCH_FN = ctypes.CFUNCTYPE(c_int32, c_void_p, _lib.mws_bytes, _U64P, _U64P, _U64P, c_size_t)


class mws_transfer_engine_vtable(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("get_engine_id", ENGINE_ID_FN),
        ("register_memory", REGISTER_FN),
        ("unregister_memory", UNREGISTER_FN),
        ("batch_transfer_sync_write", BATCH_FN),
        ("batch_transfer_sync_read", BATCH_FN),
        ("submit_with_ticket", c_void_p),
        ("ticket_status", c_void_p),
        ("ticket_drain", c_void_p),
        ("ticket_release", c_void_p),
    ]


class TeError(RuntimeError):
    """Transfer Engine initialisation or a direct call failed (``code`` is TE's)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} returned {code}")
        self.code = code


def _clamp(rc: Any) -> int:
    if isinstance(rc, bool) or not isinstance(rc, int):
        raise TypeError(f"Transfer Engine returned {type(rc).__name__}, expected int")
    return max(min(rc, 2**31 - 1), -(2**31))


class _EngineBridge:
    """The CFUNCTYPE thunks over one ``mooncake.engine.TransferEngine``."""

    MAX_ERRORS = 64

    def __init__(self, te: Any, max_batch_operations: int) -> None:
        self.te = te
        self.max_batch = max_batch_operations
        self.errors: List[str] = []
        self.calls = 0  # TE batch calls made (sub-batches)
        self._lock = threading.Lock()
        vt = mws_transfer_engine_vtable()
        vt.size = ctypes.sizeof(mws_transfer_engine_vtable)
        vt.version = ENGINE_VTABLE_VERSION
        vt.get_engine_id = ENGINE_ID_FN(self._engine_id)
        vt.register_memory = REGISTER_FN(self._register)
        vt.unregister_memory = UNREGISTER_FN(self._unregister)
        vt.batch_transfer_sync_write = BATCH_FN(self._write)
        vt.batch_transfer_sync_read = BATCH_FN(self._read)
        self.vtable = vt

    def _fail(self, op: str, exc: BaseException) -> int:
        msg = f"{op}: {type(exc).__name__}: {exc}"
        with self._lock:
            if len(self.errors) < self.MAX_ERRORS:
                self.errors.append(msg)
        log.warning("transfer engine callback failed: %s", msg)
        return CALLBACK_FAILED

    # -- callbacks: each catches everything ------------------------------------------

    def _engine_id(self, ctx):  # type: ignore[no-untyped-def]
        try:
            v = int(self.te.get_engine_ptr())
            return v if 0 < v < 1 << 64 else 0
        except BaseException as e:  # noqa: BLE001 - never unwind into C
            self._fail("get_engine_ptr", e)
            return 0  # refused by the library as an invalid identity

    def _register(self, ctx, address, length, device):  # type: ignore[no-untyped-def]
        try:
            location = "*" if device < 0 else f"cuda:{device}"
            return _clamp(self.te.register_memory(int(address), int(length), location))
        except BaseException as e:  # noqa: BLE001
            return self._fail("register_memory", e)

    def _unregister(self, ctx, address):  # type: ignore[no-untyped-def]
        try:
            return _clamp(self.te.unregister_memory(int(address)))
        except BaseException as e:  # noqa: BLE001
            return self._fail("unregister_memory", e)

    def _batch(self, fn: Any, op: str, endpoint: Any, local: Any, remote: Any, sizes: Any, n: int) -> int:
        try:
            if n == 0:
                return 0
            seg = ctypes.string_at(endpoint.ptr, endpoint.len).decode("utf-8") if endpoint.len else ""
            # Addresses and lengths only (slicing a POINTER(c_uint64) copies n ints).
            ls, rs, ss = local[:n], remote[:n], sizes[:n]
            step = self.max_batch
            for i in range(0, n, step):
                rc = _clamp(fn(seg, ls[i:i + step], rs[i:i + step], ss[i:i + step]))
                with self._lock:
                    self.calls += 1
                if rc != 0:
                    return rc  # completion unknown for this sub-batch; stop here
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail(op, e)

    def _write(self, ctx, endpoint, local, remote, sizes, n):  # type: ignore[no-untyped-def]
        return self._batch(self.te.batch_transfer_sync_write, "batch_transfer_sync_write", endpoint, local, remote,
                           sizes, n)

    def _read(self, ctx, endpoint, local, remote, sizes, n):  # type: ignore[no-untyped-def]
        return self._batch(self.te.batch_transfer_sync_read, "batch_transfer_sync_read", endpoint, local, remote,
                           sizes, n)


class MooncakeTransferEngine(TransferEngine):
    """A library transfer engine over Mooncake's ``TransferEngine``.

    ``te``: an initialised ``mooncake.engine.TransferEngine`` to use (its owner keeps
    it initialised), or None to create one with ``hostname``, ``metadata_server``
    (``"P2PHANDSHAKE"`` or an HTTP metadata URL) and ``protocol``. Raises
    :class:`TeError` when initialisation fails and ``ImportError`` without the wheel.
    """

    def __init__(self, te: Any = None, *, hostname: str = "127.0.0.1", metadata_server: str = "P2PHANDSHAKE",
                 protocol: str = "tcp", device_name: str = "",
                 max_batch_operations: int = PER_PEER_LIMIT) -> None:
        if isinstance(max_batch_operations, bool) or not isinstance(max_batch_operations, int) \
                or max_batch_operations <= 0:
            raise ValueError("max_batch_operations must be a positive int")
        self._segment: Optional[str] = None
        if te is None:
            if hostname in ("127.0.0.1", "localhost"):
                os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            from mooncake.engine import TransferEngine as _TE

            te = _TE()
            rc = te.initialize(hostname, metadata_server, protocol, device_name)
            if rc != 0:
                raise TeError(f"TransferEngine.initialize({hostname!r}, {metadata_server!r}, {protocol!r})", rc)
            if metadata_server == "P2PHANDSHAKE":
                self._segment = f"{hostname}:{te.get_rpc_port()}"
            else:
                self._segment = hostname
        self.te = te
        self._bridge = _EngineBridge(te, max_batch_operations)
        out = c_void_p()
        call("mws_transfer_engine_from_vtable", ctypes.byref(self._bridge.vtable), None, ctypes.byref(out))
        super().__init__(out.value)

    @property
    def segment(self) -> str:
        """The segment name peers pass as ``endpoint`` (known when this object
        initialised TE; otherwise pass it yourself)."""
        if self._segment is None:
            raise ValueError("segment unknown: the TransferEngine was initialised by its owner")
        return self._segment

    @property
    def engine_ptr(self) -> int:
        return int(self.te.get_engine_ptr())

    @property
    def callback_errors(self) -> List[str]:
        """Exceptions raised inside callbacks (reported to the library as
        :data:`CALLBACK_FAILED`), at most 64."""
        return list(self._bridge.errors)

    @property
    def te_calls(self) -> int:
        """How many TE batch calls (sub-batches) were made so far."""
        return self._bridge.calls
