"""Any Python object as a transfer engine: the generic bridge from the engine
protocol below to the C vtable ``mws_transfer_engine_vtable`` (the engine side of
:meth:`TransferEngine.from_backend <mooncake_weight_store.TransferEngine.from_backend>`,
as :meth:`Store.from_backend <mooncake_weight_store.Store.from_backend>` is for stores).

The library's executors (``Loader``, ``Sink``) plan and track the transfers; the
backend only registers memory and moves byte ranges between this process and a
remote endpoint. Addresses are absolute integers; the lists hold one entry per
range and are plain Python lists, valid beyond the call.

Required methods (return ``0`` for success, any other ``int`` is the engine's code,
which the library reports by number):

===========================================================  ===============================
``engine_id() -> int``                                       the engine's identity (> 0,
                                                             stable; two wrappers of one
                                                             native engine report the same)
``register_memory(address, length, device) -> int``          registers a region; ``device``
                                                             -1 = host memory, else the
                                                             device ordinal
``unregister_memory(address) -> int``                        the region registered at
                                                             ``address``
``transfer_sync(direction, endpoint, local, remote, sizes)``  one batch, synchronously:
``-> int``                                                   ``direction`` a
                                                             :class:`Direction`,
                                                             ``endpoint`` the remote segment
                                                             name (a binding's
                                                             ``endpoint``); 0 = every range
                                                             completed, anything else =
                                                             completion unknown
===========================================================  ===============================

Optional, ticketed completion (all three or none; ``ticket_release`` alone is
optional): when present, the library submits with a ticket and asks for the outcome,
so a failed batch can be known to have failed (drained) instead of unknown.

====================================================  =====================================
``submit(direction, endpoint, local, remote, sizes)``  starts a batch; returns a ticket id
``-> int``                                             (> 0); anything else = no ticket
``ticket_status(ticket) -> int``                       a :class:`TicketStatus` value now
``ticket_wait(ticket, timeout_ms) -> int``             the status after waiting at most
                                                       ``timeout_ms``
``ticket_release(ticket)``                             the library no longer tracks it
====================================================  =====================================

Optional, the notify channel (``Sink.execute_notified``, the notify hook):

====================================================  =====================================
``send_notify(endpoint, name, message) -> int``        delivers ``message`` (``bytes``) under
                                                       the notify ``name`` to the engine at
                                                       ``endpoint``; 0 once the peer has it
====================================================  =====================================

Error mapping: a callback never lets an exception reach C. A raising method is
recorded (:attr:`EngineBridge.errors`, at most 64 lines, and
:attr:`EngineBridge.last_exception`) and reported to the library as
:data:`CALLBACK_FAILED` (-900), as a failed submission, as an unreadable ticket
status, or as identity 0 (refused). The call that failed then raises its
:class:`~mooncake_weight_store.MwsError` with the backend's exception named in the
message and chained as ``__cause__``. A non-``int`` return (``bool`` included) is a
``TypeError`` of the backend, handled the same way; values outside ``int32`` are
clamped.

Threading: callbacks run on the thread of the library call (one submission per
engine at a time; registrations may come from other threads), so the backend must
be thread-safe. Lifetime: the C vtable has no ``destroy``; the bridge (and so the
backend) lives as long as the :class:`~mooncake_weight_store.TransferEngine` object,
and every ``Loader`` / ``Sink`` keeps its engine object, so the thunks outlive every
C object that can call them.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import threading
from typing import Any, Dict, List, Optional, Sequence, Set

from . import _abi, _lib
from ._lib import call
from .errors import ArgumentError, error_for_status

__all__ = ["EngineBridge", "Direction", "TicketStatus", "CALLBACK_FAILED", "ENGINE_VTABLE_VERSION",
           "MemmoveEngine", "TicketedMemmoveEngine"]

log = logging.getLogger("mooncake_weight_store.engine")

#: Returned to the library when a Python callback raised (distinct from engine codes).
CALLBACK_FAILED = -900
#: ``MWS_TRANSFER_ENGINE_VTABLE_VERSION``.
ENGINE_VTABLE_VERSION = _abi.MWS_TRANSFER_ENGINE_VTABLE_VERSION

_REQUIRED = ("engine_id", "register_memory", "unregister_memory", "transfer_sync")
_TICKETS = ("submit", "ticket_status", "ticket_wait")


class Direction(enum.IntEnum):
    """Which way a batch moves bytes (``MWS_TRANSFER_READ`` / ``_WRITE``)."""

    READ = _abi.MWS_TRANSFER_READ  #: pull: ``local`` are targets, ``remote`` sources
    WRITE = _abi.MWS_TRANSFER_WRITE  #: push: ``local`` are sources, ``remote`` targets


class TicketStatus(enum.IntEnum):
    """Ticket statuses the library knows by name; any other value is a known failure
    reported by number."""

    COMPLETED = 0
    FAILED_DRAINED = -1  #: failed, and nothing of the batch is still moving
    UNKNOWN = -2  #: completion unknown (still running, or cannot tell)


def _int(rc: Any, what: str) -> int:
    if isinstance(rc, bool) or not isinstance(rc, int):
        raise ArgumentError(f"{what} returned {type(rc).__name__}, expected int")
    return rc


def _i32(rc: Any, what: str) -> int:
    return max(min(_int(rc, what), 2**31 - 1), -(2**31))


class EngineBridge:
    """The CFUNCTYPE thunks over one engine backend (see the module doc), and the
    C handle made from them (:meth:`open`)."""

    MAX_ERRORS = 64

    def __init__(self, backend: Any) -> None:
        missing = [n for n in _REQUIRED if not callable(getattr(backend, n, None))]
        tickets = [n for n in _TICKETS if callable(getattr(backend, n, None))]
        if tickets and len(tickets) != len(_TICKETS):
            missing += [n for n in _TICKETS if n not in tickets]
        if missing:
            raise ArgumentError(f"engine backend {type(backend).__name__} lacks: {', '.join(missing)}")
        self.backend = backend
        self.errors: List[str] = []
        #: the last exception a callback raised (cleared when a call reports it)
        self.last_exception: Optional[BaseException] = None
        #: how many callbacks failed so far (monotonic; errors beyond 64 still count)
        self.failures = 0
        self._lock = threading.Lock()

        vt = _abi.mws_transfer_engine_vtable()
        vt.size = ctypes.sizeof(_abi.mws_transfer_engine_vtable)
        vt.version = _abi.MWS_TRANSFER_ENGINE_VTABLE_VERSION
        vt.get_engine_id = _abi.ENGINE_ID_FN(self._engine_id)
        vt.register_memory = _abi.ENGINE_REGISTER_FN(self._register)
        vt.unregister_memory = _abi.ENGINE_UNREGISTER_FN(self._unregister)
        vt.batch_transfer_sync_write = _abi.ENGINE_BATCH_FN(self._write)
        vt.batch_transfer_sync_read = _abi.ENGINE_BATCH_FN(self._read)
        if tickets:
            vt.submit_with_ticket = _abi.ENGINE_SUBMIT_FN(self._submit)
            vt.ticket_status = _abi.ENGINE_TICKET_STATUS_FN(self._ticket_status)
            vt.ticket_drain = _abi.ENGINE_TICKET_DRAIN_FN(self._ticket_wait)
        if callable(getattr(backend, "ticket_release", None)):
            vt.ticket_release = _abi.ENGINE_TICKET_RELEASE_FN(self._ticket_release)
        if callable(getattr(backend, "send_notify", None)):
            vt.send_notify = _abi.ENGINE_SEND_NOTIFY_FN(self._send_notify)
        self.vtable = vt  # the struct references every thunk: they live as long as the bridge

    @property
    def tickets(self) -> bool:
        """Whether the backend offers ticketed completion."""
        return bool(self.vtable.submit_with_ticket)

    def open(self, device_engine: Any = None) -> Optional[int]:
        """A new ``mws_transfer_engine`` handle over this bridge (the caller owns it);
        with ``device_engine``, the library reads and writes the device buffers of its
        transfers through it (``mws_transfer_engine_from_vtable_device``)."""
        out = ctypes.c_void_p()
        if device_engine is None:
            call("mws_transfer_engine_from_vtable", ctypes.byref(self.vtable), None, ctypes.byref(out))
        else:
            call("mws_transfer_engine_from_vtable_device", ctypes.byref(self.vtable), None, device_engine,
                 ctypes.byref(out))
        return out.value

    def check(self, status: int, failures_before: int) -> None:
        """Raises the :class:`~mooncake_weight_store.MwsError` of a library call that
        returned ``status`` (call it right after that call, on the same thread); when
        a callback failed since ``failures_before`` (:attr:`failures` read before the
        call), the backend's exception is named in the message and chained as
        ``__cause__`` (with concurrent calls on one engine, the last exception of
        any of them)."""
        if status == 0:
            return
        msg = _lib.last_error()
        with self._lock:
            exc = self.last_exception if self.failures != failures_before else None
            if exc is not None:
                self.last_exception = None
        if exc is None:
            raise error_for_status(status, msg, _lib.status_name(status))
        raise error_for_status(status, f"{msg} (engine backend: {type(exc).__name__}: {exc})",
                               _lib.status_name(status)) from exc

    # -- error containment ----------------------------------------------------------

    def _fail(self, op: str, exc: BaseException) -> int:
        msg = f"{op}: {type(exc).__name__}: {exc}"
        with self._lock:
            self.failures += 1
            self.last_exception = exc.with_traceback(None)  # no frames of the thunk kept
            if len(self.errors) < self.MAX_ERRORS:
                self.errors.append(msg)
        log.warning("transfer engine callback failed: %s", msg)
        return CALLBACK_FAILED

    # -- callbacks: each catches everything -------------------------------------------

    def _engine_id(self, ctx):  # type: ignore[no-untyped-def]
        try:
            v = _int(self.backend.engine_id(), "engine_id")
            if not 0 < v < 1 << 64:
                raise ArgumentError(f"engine_id returned {v}, expected 1 .. 2**64-1")
            return v
        except BaseException as e:  # noqa: BLE001 - never unwind into C
            self._fail("engine_id", e)
            return 0  # refused by the library as an invalid identity

    def _register(self, ctx, address, length, device):  # type: ignore[no-untyped-def]
        try:
            return _i32(self.backend.register_memory(int(address), int(length), int(device)), "register_memory")
        except BaseException as e:  # noqa: BLE001
            return self._fail("register_memory", e)

    def _unregister(self, ctx, address):  # type: ignore[no-untyped-def]
        try:
            return _i32(self.backend.unregister_memory(int(address)), "unregister_memory")
        except BaseException as e:  # noqa: BLE001
            return self._fail("unregister_memory", e)

    @staticmethod
    def _lists(endpoint: Any, local: Any, remote: Any, sizes: Any, n: int) -> Any:
        seg = ctypes.string_at(endpoint.ptr, endpoint.len).decode("utf-8") if endpoint.len else ""
        if n == 0:
            return seg, [], [], []
        # Slicing a POINTER(c_uint64) copies n ints: nothing borrowed outlives the call.
        return seg, local[:n], remote[:n], sizes[:n]

    def _batch(self, direction: Direction, endpoint: Any, local: Any, remote: Any, sizes: Any, n: int) -> int:
        try:
            seg, ls, rs, ss = self._lists(endpoint, local, remote, sizes, n)
            return _i32(self.backend.transfer_sync(direction, seg, ls, rs, ss), "transfer_sync")
        except BaseException as e:  # noqa: BLE001
            return self._fail("transfer_sync", e)

    def _write(self, ctx, endpoint, local, remote, sizes, n):  # type: ignore[no-untyped-def]
        return self._batch(Direction.WRITE, endpoint, local, remote, sizes, n)

    def _read(self, ctx, endpoint, local, remote, sizes, n):  # type: ignore[no-untyped-def]
        return self._batch(Direction.READ, endpoint, local, remote, sizes, n)

    def _submit(self, ctx, direction, endpoint, local, remote, sizes, n, ticket):  # type: ignore[no-untyped-def]
        try:
            seg, ls, rs, ss = self._lists(endpoint, local, remote, sizes, n)
            t = _int(self.backend.submit(Direction(direction), seg, ls, rs, ss), "submit")
            if not 0 < t < 1 << 64:
                return _i32(t, "submit") or -1  # no ticket: completion unknown
            ticket[0] = t
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("submit", e)

    def _ticket_status(self, ctx, ticket, status):  # type: ignore[no-untyped-def]
        try:
            status[0] = _i32(self.backend.ticket_status(int(ticket)), "ticket_status")
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("ticket_status", e)

    def _ticket_wait(self, ctx, ticket, timeout_ms, status):  # type: ignore[no-untyped-def]
        try:
            status[0] = _i32(self.backend.ticket_wait(int(ticket), int(timeout_ms)), "ticket_wait")
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("ticket_wait", e)

    def _ticket_release(self, ctx, ticket):  # type: ignore[no-untyped-def]
        try:
            self.backend.ticket_release(int(ticket))
        except BaseException as e:  # noqa: BLE001
            self._fail("ticket_release", e)

    def _send_notify(self, ctx, endpoint, name, message):  # type: ignore[no-untyped-def]
        try:
            view = lambda b: ctypes.string_at(b.ptr, b.len) if b.len else b""  # noqa: E731
            return _i32(self.backend.send_notify(view(endpoint).decode("utf-8"), view(name).decode("utf-8"),
                                                 view(message)), "send_notify")
        except BaseException as e:  # noqa: BLE001
            return self._fail("send_notify", e)


class MemmoveEngine:
    """A reference implementation of the engine protocol: every endpoint is this
    process, bytes move with ``memmove`` between registered host regions (a batch
    with a range outside them fails with -1 and moves nothing). A test double:
    ``calls`` counts method calls, ``batches`` records ``(direction, endpoint, n)``.
    """

    _next_id = 1 << 32
    _id_lock = threading.Lock()

    def __init__(self) -> None:
        with MemmoveEngine._id_lock:
            MemmoveEngine._next_id += 1
            self.id = MemmoveEngine._next_id  # unique per instance, never reused
        self.regions: Dict[int, int] = {}
        self.batches: List[Any] = []
        self.calls: Dict[str, int] = {}
        self._lock = threading.RLock()

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    def engine_id(self) -> int:
        return self.id

    def register_memory(self, address: int, length: int, device: int) -> int:
        with self._lock:
            self._count("register_memory")
            if device != -1 or length <= 0:
                return -600
            if any(a < address + length and address < a + n for a, n in self.regions.items()):
                return -7  # overlaps a registered region
            self.regions[address] = length
            return 0

    def unregister_memory(self, address: int) -> int:
        with self._lock:
            self._count("unregister_memory")
            return 0 if self.regions.pop(address, None) is not None else -3

    def _inside(self, address: int, n: int) -> bool:
        return any(a <= address and address + n <= a + m for a, m in self.regions.items())

    def transfer_sync(self, direction: Direction, endpoint: str, local: Sequence[int], remote: Sequence[int],
                      sizes: Sequence[int]) -> int:
        with self._lock:
            self._count("transfer_sync")
            self.batches.append((Direction(direction), endpoint, len(sizes)))
            if not all(self._inside(a, n) and self._inside(b, n) for a, b, n in zip(local, remote, sizes)):
                return -1
            for lo, re, n in zip(local, remote, sizes):
                if direction == Direction.WRITE:
                    ctypes.memmove(re, lo, n)
                else:
                    ctypes.memmove(lo, re, n)
            return 0


class TicketedMemmoveEngine(MemmoveEngine):
    """:class:`MemmoveEngine` with ticketed completion: a batch runs at submission
    and its status (completed, or failed-drained) is kept until the library
    releases the ticket; ``released`` lists the released tickets."""

    def __init__(self) -> None:
        super().__init__()
        self.tickets: Dict[int, int] = {}
        self.released: Set[int] = set()
        self._ticket_ids = 0

    def submit(self, direction: Direction, endpoint: str, local: Sequence[int], remote: Sequence[int],
               sizes: Sequence[int]) -> int:
        with self._lock:
            self._count("submit")
            rc = self.transfer_sync(direction, endpoint, local, remote, sizes)
            self._ticket_ids += 1
            self.tickets[self._ticket_ids] = TicketStatus.COMPLETED if rc == 0 else TicketStatus.FAILED_DRAINED
            return self._ticket_ids

    def ticket_status(self, ticket: int) -> int:
        with self._lock:
            self._count("ticket_status")
            return int(self.tickets[ticket])

    def ticket_wait(self, ticket: int, timeout_ms: int) -> int:
        with self._lock:
            self._count("ticket_wait")
            return int(self.tickets[ticket])

    def ticket_release(self, ticket: int) -> None:
        with self._lock:
            self._count("ticket_release")
            del self.tickets[ticket]
            self.released.add(ticket)
