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
* Notifications (:meth:`MooncakeEngineBackend.send_notify`, the notify hook and
  delta steps of :class:`~mooncake_weight_store.Sink`): the wheel binds no
  ``sendNotifyByName``, but ``batch_transfer_sync(..., notify=TransferNotify(name,
  msg))`` delivers ``msg`` to the peer's notify list once the batch completed. Each
  message rides on a one-byte *read* of the peer's first registered buffer (its
  bytes are left untouched) into a 64-byte scratch buffer of this side, registered
  on first use and unregistered by :meth:`MooncakeTransferEngine.close`. Messages
  must be UTF-8 (the library's are ASCII). The receiver drains its list with
  :meth:`MooncakeTransferEngine.poll_notifies`. Synchronous: 0 once the peer has
  the message; messages from one sender arrive in order.

Error mapping: a TE return code is passed to the library unchanged (0 ok, -1 failed
or completion unknown, -3 not registered, -7 overlapping registration). A
sub-batch failure stops the remaining sub-batches.

This module holds only what is Mooncake-specific: :class:`MooncakeEngineBackend`
maps the generic engine protocol (:mod:`mooncake_weight_store.engine_bridge`) onto
TE's calls. The vtable thunks, the containment of Python exceptions (recorded in
:attr:`MooncakeTransferEngine.callback_errors`, reported as :data:`CALLBACK_FAILED`,
chained into the failing call's error) and their lifetime are the generic bridge's,
the one behind :meth:`TransferEngine.from_backend
<mooncake_weight_store.TransferEngine.from_backend>`.

Threading: TE's calls are thread-safe; the library runs one submission per engine at
a time. Lifetime: loaders and sinks keep their engine object (and so its callbacks)
alive; :meth:`close` frees the handle only.
"""


from __future__ import annotations

import os
import threading
from typing import Any, List, Optional, Sequence, Tuple

from .engine_bridge import CALLBACK_FAILED, ENGINE_VTABLE_VERSION, Direction, EngineBridge
from .errors import ArgumentError, LocalError, Status
from .transfer import TransferEngine

__all__ = ["MooncakeTransferEngine", "MooncakeEngineBackend", "CALLBACK_FAILED", "TeError",
           "ENGINE_VTABLE_VERSION"]

#: The wheel's default ``MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER``.
PER_PEER_LIMIT = 1024


class TeError(LocalError, RuntimeError):
    """Transfer Engine initialisation or a direct call failed (``code`` is TE's);
    status ``STORE``."""

    default_status = Status.STORE

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} returned {code}")
        self.what = what
        self.code = code

    def __reduce__(self):  # picklable: rebuilt from (what, code)
        return (type(self), (self.what, self.code))


class MooncakeEngineBackend:
    """The engine protocol over one ``mooncake.engine.TransferEngine`` ``te``:
    identity ``get_engine_ptr()``, registration with TE's location names (``"*"``
    host, ``"cuda:<n>"``), batches through the legacy synchronous
    ``batch_transfer_sync_read`` / ``_write`` split into sub-batches of at most
    ``max_batch_operations`` ranges (a sub-batch failure stops the rest). No
    ticketed completion: the wheel's async ids are raw native pointers."""

    def __init__(self, te: Any, max_batch_operations: int = PER_PEER_LIMIT) -> None:
        if isinstance(max_batch_operations, bool) or not isinstance(max_batch_operations, int) \
                or max_batch_operations <= 0:
            raise ArgumentError("max_batch_operations must be a positive int")
        self.te = te
        self.max_batch = max_batch_operations
        self.calls = 0  # TE batch calls made (sub-batches)
        self.notifies = 0  # notifications sent
        self._lock = threading.Lock()
        self._scratch: Any = None  # the notify carrier's local buffer, registered on first use

    def engine_id(self) -> int:
        return int(self.te.get_engine_ptr())

    def register_memory(self, address: int, length: int, device: int) -> int:
        location = "*" if device < 0 else f"cuda:{device}"
        return self.te.register_memory(address, length, location)  # type: ignore[no-any-return]

    def unregister_memory(self, address: int) -> int:
        return self.te.unregister_memory(address)  # type: ignore[no-any-return]

    def transfer_sync(self, direction: Direction, endpoint: str, local: Sequence[int], remote: Sequence[int],
                      sizes: Sequence[int]) -> int:
        fn = self.te.batch_transfer_sync_write if direction == Direction.WRITE else self.te.batch_transfer_sync_read
        step = self.max_batch
        for i in range(0, len(sizes), step):
            rc = fn(endpoint, list(local[i:i + step]), list(remote[i:i + step]), list(sizes[i:i + step]))
            if isinstance(rc, bool) or not isinstance(rc, int):
                raise ArgumentError(f"Transfer Engine returned {type(rc).__name__}, expected int")
            with self._lock:
                self.calls += 1
            if rc != 0:
                return rc  # completion unknown for this sub-batch; stop here
        return 0

    def send_notify(self, endpoint: str, name: str, message: bytes) -> int:
        """Delivers ``message`` under ``name`` to the engine at ``endpoint``: a
        one-byte read of the peer's first registered buffer carrying the
        notification (the wheel's ``notify=``). TE's return code (-1 when the peer
        has no registered buffer)."""
        import ctypes

        from mooncake.engine import TransferNotify, TransferOpcode  # type: ignore  # (no stubs)

        text = bytes(message).decode("utf-8")
        with self._lock:
            if self._scratch is None:
                buf = ctypes.create_string_buffer(64)
                rc = self.te.register_memory(ctypes.addressof(buf), len(buf), "*")
                if rc != 0:
                    return rc  # type: ignore[no-any-return]
                self._scratch = buf
            local = ctypes.addressof(self._scratch)
        remote = int(self.te.get_first_buffer_address(endpoint))
        if remote == 0:
            return -1
        rc = self.te.batch_transfer_sync(endpoint, [local], [remote], [1], TransferOpcode.Read,
                                         TransferNotify(name, text))
        if isinstance(rc, bool) or not isinstance(rc, int):
            raise ArgumentError(f"Transfer Engine returned {type(rc).__name__}, expected int")
        if rc == 0:
            with self._lock:
                self.notifies += 1
        return rc

    @property
    def notify_scratch(self) -> Optional[int]:
        """The address of the notify carrier's registered scratch buffer (None
        before the first notification or after :meth:`release_notify`)."""
        import ctypes

        return ctypes.addressof(self._scratch) if self._scratch is not None else None

    def release_notify(self) -> int:
        """Unregisters the notify carrier's scratch buffer (0; TE's code on failure)."""
        import ctypes

        with self._lock:
            if self._scratch is None:
                return 0
            rc = self.te.unregister_memory(ctypes.addressof(self._scratch))
            if rc == 0:
                self._scratch = None
            return rc  # type: ignore[no-any-return]

    def poll_notifies(self) -> List[Tuple[str, bytes]]:
        """Drains the notifications received so far: ``[(name, message)]`` in
        arrival order (``get_notifies()``)."""
        return [(n.name, n.msg.encode("utf-8")) for n in self.te.get_notifies()]


class MooncakeTransferEngine(TransferEngine):
    """A library transfer engine over Mooncake's ``TransferEngine``.

    ``te``: an initialised ``mooncake.engine.TransferEngine`` to use (its owner keeps
    it initialised), or None to create one with ``hostname``, ``metadata_server``
    (``"P2PHANDSHAKE"`` or an HTTP metadata URL) and ``protocol``. Raises
    :class:`TeError` when initialisation fails and ``ImportError`` without the wheel.
    ``device_engine``: the library's own reads and writes of device buffers
    (content-verified and delta steps) go through it; TE moves every transferred byte.
    """

    def __init__(self, te: Any = None, *, hostname: str = "127.0.0.1", metadata_server: str = "P2PHANDSHAKE",
                 protocol: str = "tcp", device_name: str = "",
                 max_batch_operations: int = PER_PEER_LIMIT, device_engine: Any = None) -> None:
        if isinstance(max_batch_operations, bool) or not isinstance(max_batch_operations, int) \
                or max_batch_operations <= 0:
            raise ArgumentError("max_batch_operations must be a positive int")
        self._segment: Optional[str] = None
        if te is None:
            if hostname in ("127.0.0.1", "localhost"):
                os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            from mooncake.engine import TransferEngine as _TE  # type: ignore  # (no stubs)

            te = _TE()
            rc = te.initialize(hostname, metadata_server, protocol, device_name)
            if rc != 0:
                raise TeError(f"TransferEngine.initialize({hostname!r}, {metadata_server!r}, {protocol!r})", rc)
            if metadata_server == "P2PHANDSHAKE":
                self._segment = f"{hostname}:{te.get_rpc_port()}"
            else:
                self._segment = hostname
        self.te = te
        self._adapter = MooncakeEngineBackend(te, max_batch_operations)
        bridge = EngineBridge(self._adapter)
        super().__init__(bridge.open(device_engine), bridge, device_engine=device_engine)

    @property
    def segment(self) -> str:
        """The segment name peers pass as ``endpoint`` (known when this object
        initialised TE; otherwise pass it yourself)."""
        if self._segment is None:
            raise ArgumentError("segment unknown: the TransferEngine was initialised by its owner")
        return self._segment

    @property
    def engine_ptr(self) -> int:
        return int(self.te.get_engine_ptr())

    @property
    def te_calls(self) -> int:
        """How many TE batch calls (sub-batches) were made so far."""
        return self._adapter.calls

    def poll_notifies(self) -> List[Tuple[str, bytes]]:
        """The notifications this engine received since the last poll,
        ``[(name, message)]``; hand each message to a
        :class:`~mooncake_weight_store.NotifyAcceptor` or
        :class:`~mooncake_weight_store.NotifyRouter`."""
        return self._adapter.poll_notifies()

    def close(self) -> None:
        """Unregisters the notify carrier's scratch buffer (when one was
        registered), then frees the handle."""
        self._adapter.release_notify()
        super().close()
