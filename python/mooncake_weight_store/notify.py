"""The notify hook (issue 27) over the C ABI, target side: :class:`NotifyAcceptor`
checks each notification its engine's notify poll received against its own bound
plan and generation, and keeps the per-target outcome. The sink side is
:meth:`Sink.execute_notified <mooncake_weight_store.Sink.execute_notified>`, over an
engine backend with ``send_notify`` (the Python Mooncake backend has none: the
wheel's binding does not expose ``sendNotifyByName``).

Ownership: an acceptor owns its handle (``close()`` / ``with``). Threading: an
acceptor may be shared between threads (calls are serialized inside).
"""

from __future__ import annotations

import ctypes
from ctypes import c_uint32, c_void_p
from dataclasses import dataclass
from typing import Optional, Tuple

from . import _abi, _lib
from ._lib import LIB, OwnedHandle, call, cstr
from .transfer import _VERDICTS, TransferPlan

__all__ = ["NotifyAcceptor", "NotifyOutcome", "notify_name", "VERDICTS"]

_p = c_void_p

#: ``mws_notify_acceptor_accept`` verdicts, by number.
VERDICTS = {_abi.MWS_NOTIFY_ACCEPTED: "accepted", _abi.MWS_NOTIFY_MALFORMED: "malformed",
            _abi.MWS_NOTIFY_TRUNCATED: "truncated", _abi.MWS_NOTIFY_FORGED: "forged",
            _abi.MWS_NOTIFY_REPLAYED: "replayed", _abi.MWS_NOTIFY_STALE: "stale",
            _abi.MWS_NOTIFY_OTHER_PLAN: "other_plan", _abi.MWS_NOTIFY_MISROUTED: "misrouted",
            _abi.MWS_NOTIFY_TOO_MANY: "too_many"}


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
