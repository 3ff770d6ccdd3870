"""The notify hook (issue 27) over the C ABI, target side: :class:`NotifyAcceptor`
checks each notification its engine's notify poll received against its own bound
plan and generation, and keeps the per-target outcome. The sink side is
:meth:`Sink.execute_notified <mooncake_weight_store.Sink.execute_notified>` for a
call and :meth:`PreparedTransfer.step_notified
<mooncake_weight_store.PreparedTransfer.step_notified>` for a prepared step (its
messages carry the step's generation; the acceptor follows the newest generation of
its plan), over an engine backend with ``send_notify`` (the Python Mooncake backend
has none: the wheel's binding does not expose ``sendNotifyByName``). A process that
hosts several targets hands every message to one :class:`NotifyRouter`.

Content-verified steps (``verify_content=True``) carry the CRC-32C of the bytes
sent into each target; an acceptor after :meth:`NotifyAcceptor.verify_content`
reads its target buffers and reports the target ``"torn"`` with the mismatched
ranges (:meth:`NotifyAcceptor.mismatches`) when they differ.

Ownership: an acceptor and a router own their handles (``close()`` / ``with``); a
router keeps the acceptors added to it open until it is closed. Threading: both may
be shared between threads (calls are serialized inside).
"""

from __future__ import annotations

import ctypes
from ctypes import c_size_t, c_uint32, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import _abi, _lib
from .errors import Status
from ._lib import LIB, OwnedHandle, call, cstr
from .transfer import _VERDICTS, TransferPlan

__all__ = ["NotifyAcceptor", "NotifyMismatch", "NotifyOutcome", "NotifyRouter", "notify_name", "VERDICTS"]

_p = c_void_p

#: ``mws_notify_acceptor_accept`` verdicts, by number.
VERDICTS = {_abi.MWS_NOTIFY_ACCEPTED: "accepted", _abi.MWS_NOTIFY_MALFORMED: "malformed",
            _abi.MWS_NOTIFY_TRUNCATED: "truncated", _abi.MWS_NOTIFY_FORGED: "forged",
            _abi.MWS_NOTIFY_REPLAYED: "replayed", _abi.MWS_NOTIFY_STALE: "stale",
            _abi.MWS_NOTIFY_OTHER_PLAN: "other_plan", _abi.MWS_NOTIFY_MISROUTED: "misrouted",
            _abi.MWS_NOTIFY_TOO_MANY: "too_many", _abi.MWS_NOTIFY_UNVERIFIED: "unverified",
            _abi.MWS_NOTIFY_DELTA_BASE: "delta_base"}


@dataclass(frozen=True)
class NotifyOutcome:
    """A target participant's outcome from the notifications accepted so far:
    ``verdict`` ``"unchanged"`` (no writer announced anything), ``"updated"`` (every
    writer the plan routes into it reported done: it may serve ``weight_generation``) or
    ``"torn"`` (a writer began and has not reported done; ``incomplete`` counts
    them)."""

    verdict: str
    weight_generation: int
    incomplete: int


@dataclass(frozen=True)
class NotifyMismatch:
    """A target range whose verified bytes differ from what the source sent: the
    writing source executor, the target runtime fragment, the plan operation, the
    first byte of its box in the fragment and its bytes."""

    source_participant: str
    source_worker: str
    fragment_id: str
    operation: int
    offset: int
    bytes: int


def _outcome(o: _abi.mws_notify_outcome) -> NotifyOutcome:
    return NotifyOutcome(_VERDICTS.get(o.verdict, str(o.verdict)), o.weight_generation, o.incomplete)


def notify_name() -> str:
    """The notify name of this library's messages (``mws_notify_name``)."""
    return LIB.fn("mws_notify_name")().decode()


class NotifyAcceptor(OwnedHandle):
    """The target side of the notify hook for one participant of a bound plan."""

    _FREE = "mws_notify_acceptor_free"
    _WHAT = "notify acceptor"

    def __init__(self, plan: TransferPlan, participant: str, key: Optional[bytes] = None) -> None:
        """``key``: None (unkeyed) or the key shared with the sinks (>= 16 bytes).
        Raises :class:`~mooncake_weight_store.InvalidArgumentError` for a logical
        plan, a short key or a participant that is not a target of the plan."""
        out = _p()
        k = bytes(key) if key else None
        call("mws_notify_acceptor_new", plan, cstr(participant, "participant"), k, len(k) if k else 0,
             ctypes.byref(out))
        super().__init__(out.value)
        self._plan = plan

    def accept(self, message: bytes) -> Tuple[str, NotifyOutcome, str]:
        """Checks one received message: ``(verdict, outcome, why)``; a refusal is a
        verdict other than ``accepted`` (never raised) and changes nothing."""
        v = c_uint32(0)
        o = _abi.mws_notify_outcome()
        st = LIB.fn("mws_notify_acceptor_accept")(self, bytes(message), len(message), ctypes.byref(v),
                                                   ctypes.byref(o))
        why = _lib.last_error() if st != 0 else ""
        return VERDICTS.get(v.value, str(v.value)), _outcome(o), why

    def outcome(self) -> NotifyOutcome:
        o = _abi.mws_notify_outcome()
        call("mws_notify_acceptor_outcome", self, ctypes.byref(o))
        return _outcome(o)

    def verify_content(self) -> None:
        """Turns content verification on (``mws_notify_acceptor_verify_content``): a
        ``done`` must carry checksums (else ``"unverified"``) and the acceptor reads
        its participant's buffers to compare them before it counts the writer done.
        The acceptor keeps the bound plan (hence its bindings and their buffers)
        until it is closed. Device buffers are read through the acceptor's device
        engine (:meth:`use_device_engine`); without one they raise
        :class:`~mooncake_weight_store.UnsupportedError`."""
        call("mws_notify_acceptor_verify_content", self)
        # The bound plan keeps the bindings, which keep their buffers exported.
        self._keep_alive(self._plan)

    def use_device_engine(self, device_engine: Any) -> None:
        """The device engine (a :class:`~mooncake_weight_store.device.DeviceEngine`)
        through which the acceptor reads (:meth:`verify_content`) and writes
        (:meth:`accept_deltas`) its participant's device buffers, staged in host
        memory (``mws_notify_acceptor_use_device_engine``): call it before
        :meth:`verify_content` when they are device memory. The acceptor keeps its
        own reference."""
        call("mws_notify_acceptor_use_device_engine", self, device_engine)

    def accept_deltas(self, address: int, capacity: int) -> None:
        """Accepts delta steps (``mws_notify_acceptor_accept_deltas``): the sources
        write encoded changes into the inbox (``capacity`` bytes at ``address``, host
        memory of this side, registered with its engine; it must stay valid until
        the acceptor is closed), and a delta ``done`` makes the acceptor apply them to
        the target buffers, then verify them. Call :meth:`verify_content` first
        (``ArgumentError`` otherwise). A delta on another base than the one the target
        holds is refused (``"delta_base"``)."""
        call("mws_notify_acceptor_accept_deltas", self, int(address), int(capacity))
        self._keep_alive(self._plan)

    def held_generation(self) -> Optional[int]:
        """The weight generation the target's bytes hold, verified by content and
        untouched since (``None``: none): what the sources' delta steps need to be
        told (``held=`` of :meth:`PreparedTransfer.step_delta`)."""
        g = ctypes.c_uint64(0)
        st = LIB.fn("mws_notify_acceptor_held_generation")(self, ctypes.byref(g))
        if st == Status.NOT_FOUND:
            return None
        _lib.check(st)
        return int(g.value)

    def expect_generation(self, generation: int) -> None:
        """Moves the acceptor to ``generation`` (older messages are stale from then
        on). Raises :class:`~mooncake_weight_store.StaleBindingError` for an older
        generation."""
        call("mws_notify_acceptor_expect_generation", self, int(generation))

    def mismatches(self) -> List[NotifyMismatch]:
        """The target ranges whose verified bytes differ in the current generation."""
        n = c_size_t(0)
        call("mws_notify_acceptor_mismatch_count", self, ctypes.byref(n))
        out = []
        for i in range(n.value):
            m = _abi.mws_notify_mismatch()
            call("mws_notify_acceptor_mismatch", self, i, ctypes.byref(m))
            out.append(NotifyMismatch(m.source_participant.decode(), m.source_worker.decode(),
                                      m.fragment_id.decode(), m.operation, m.offset, m.bytes))
        return out


class NotifyRouter(OwnedHandle):
    """Hands each received notification to the acceptor of the plan and target it
    names (``mws_notify_router``): one per process that hosts several targets."""

    _FREE = "mws_notify_router_free"
    _WHAT = "notify router"

    def __init__(self, acceptors: Tuple[NotifyAcceptor, ...] = ()) -> None:
        out = _p()
        call("mws_notify_router_new", ctypes.byref(out))
        super().__init__(out.value)
        self._by_handle: Dict[int, NotifyAcceptor] = {}
        for a in acceptors:
            self.add(a)

    def add(self, acceptor: NotifyAcceptor) -> None:
        """Routes ``acceptor`` (kept open until the router is closed). Raises
        :class:`~mooncake_weight_store.ConflictError` when one of the same plan and
        participant is routed."""
        call("mws_notify_router_add", self, acceptor)
        self._by_handle[acceptor.handle] = acceptor
        self._keep_alive(acceptor)

    def remove(self, acceptor: NotifyAcceptor) -> bool:
        """Stops routing ``acceptor``; True when it was routed."""
        removed = c_uint32(0)
        call("mws_notify_router_remove", self, acceptor, ctypes.byref(removed))
        return bool(removed.value)

    def accept(self, message: bytes) -> Tuple[str, Optional[NotifyAcceptor], Optional[NotifyOutcome], str]:
        """Routes one received message: ``(verdict, acceptor, outcome, why)``; the
        acceptor is None when none matched (``"misrouted"`` or ``"other_plan"``); a
        refusal is a verdict, never raised, and changes nothing."""
        v = c_uint32(0)
        o = _abi.mws_notify_outcome()
        routed = _p()
        st = LIB.fn("mws_notify_router_accept")(self, bytes(message), len(message), ctypes.byref(v), ctypes.byref(o),
                                                 ctypes.byref(routed))
        why = _lib.last_error() if st != 0 else ""
        acc: Any = self._by_handle.get(routed.value) if routed.value else None
        return VERDICTS.get(v.value, str(v.value)), acc, (_outcome(o) if acc is not None else None), why
