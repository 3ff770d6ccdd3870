"""Allocation guards and the arguments of one upload or load (``mws_io_args``).

A :class:`Guard` pins a participant's buffers for the duration of one call; the
library calls it through ``mws_guard_vtable``. :func:`io_args` builds the
``mws_io_args`` that :class:`~mooncake_weight_store.store.Store`,
:class:`~mooncake_weight_store.transaction.Transaction` and registration leases pass
with every call. This module sits below ``store``, ``transaction`` and ``writer``
(none of them imports another to build its arguments).
"""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Callable, List, Optional, Tuple

from . import _abi, _lib
from ._lib import OwnedHandle, cstr
from .errors import StaleBindingError, Status
from .progress import Progress, c_progress

__all__ = ["Guard", "TerminalState", "io_args"]


class TerminalState(enum.IntEnum):
    """How I/O on pinned buffers ended (passed to a guard's ``release``)."""

    ABORTED = _abi.MWS_TERMINAL_ABORTED
    COMPLETED = _abi.MWS_TERMINAL_COMPLETED
    FAILED_DRAINED = _abi.MWS_TERMINAL_FAILED_DRAINED


class Guard:
    """An allocation guard: pins a participant's buffers for one upload, load, live
    call or step of a prepared transfer.

    Subclass and override :meth:`acquire` and :meth:`release`. ``acquire`` returns an
    integer token, or ``(token, observed)`` where ``observed`` is a
    :class:`~mooncake_weight_store.binding.Binding` describing the buffers as observed
    under the pin (the library compares a copy of it with the binding it expects and
    refuses the call, releasing the pin as aborted, if they differ); raising
    :class:`~mooncake_weight_store.errors.StaleBindingError` says the buffers were freed
    or moved (the call fails with that error; a prepared transfer asks to be prepared
    again). Any other exception is contained (the call fails with ``MWS_STORE``).
    """

    def acquire(self, transfer_id: str, participant_id: str, fragment_ids: List[str]) -> Any:
        return 0

    def release(self, token: int, state: TerminalState) -> None:
        pass


class GuardBridge:
    """The ``mws_guard_vtable`` thunks over one :class:`Guard` (exceptions are kept
    in :attr:`errors` and fail the call; none reaches C)."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.errors: List[str] = []
        self.vtable = _abi.mws_guard_vtable(
            size=ctypes.sizeof(_abi.mws_guard_vtable),
            version=_abi.MWS_GUARD_VTABLE_VERSION,
            acquire=_abi.GUARD_ACQUIRE_FN(self._acquire),
            release=_abi.GUARD_RELEASE_FN(self._release),
        )

    def _acquire(self, ctx, transfer_id, participant_id, ids, count, observed, token):  # type: ignore[no-untyped-def]
        try:
            fids = [ids[i].decode("utf-8") for i in range(count)]
            tok = self.guard.acquire(transfer_id.decode("utf-8"), participant_id.decode("utf-8"), fids)
            seen = None
            if isinstance(tok, tuple):
                tok, seen = tok
            if seen is not None:
                # The library takes ownership of what it is given: a copy.
                copy = ctypes.c_void_p()
                _lib.call("mws_binding_clone", seen, ctypes.byref(copy))
                observed[0] = copy.value
            token[0] = int(tok or 0) & ((1 << 64) - 1)
            return 0
        except StaleBindingError as e:
            self.errors.append(f"acquire: {type(e).__name__}: {e}")
            return int(Status.STALE_BINDING)
        except BaseException as e:  # noqa: BLE001
            self.errors.append(f"acquire: {type(e).__name__}: {e}")
            return -1

    def _release(self, ctx, token, state):  # type: ignore[no-untyped-def]
        try:
            self.guard.release(int(token), TerminalState(state))
            return 0
        except BaseException as e:  # noqa: BLE001
            self.errors.append(f"release: {type(e).__name__}: {e}")
            return -1


def io_args(worker_id: Optional[str], transfer_id: Optional[str], guard: Optional[Guard],
            lease: Optional["OwnedHandle"] = None,
            progress: Optional[Callable[[Progress], object]] = None) -> Tuple[_abi.mws_io_args, Any]:
    """``(mws_io_args, keep-alive)`` of one upload or load (``lease``: a
    :class:`~mooncake_weight_store.store.RegistrationLease`); keep the second alive
    for the call."""
    args = _abi.mws_io_args(worker_id=cstr(worker_id, "worker_id"), transfer_id=cstr(transfer_id, "transfer_id"))
    bridge = None
    if guard is not None:
        bridge = GuardBridge(guard)
        args.guard = ctypes.pointer(bridge.vtable)
    if lease is not None:
        args.lease = lease.handle
    c_fn, cb = c_progress(progress)
    args.progress = c_fn
    return args, (bridge, cb)
