"""Live weight transfer (placement -> placement, no store in between) over the C ABI:
``TransferPlan`` (``mws_transfer_plan``), ``TransferEngine`` (the embedded
in-process engine, or any Python engine through :meth:`TransferEngine.from_backend`),
``Loader`` (a target participant pulls its part) and ``Sink`` (a source participant
pushes its part).

Threading: plans are immutable and may be shared; a loader or sink runs one call at
a time (calls on one engine are serialized by the library's engine fence, a second
concurrent call fails with :class:`~mooncake_weight_store.StoreError`).
Ownership: every object owns its handle (``close()`` / ``with``); a plan bound to
bindings records their buffer addresses, so keep the bindings (which hold the
buffers) alive while the plan is executed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import functools
import json
import threading
from ctypes import c_size_t, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple

from . import _abi, _lib
from .errors import Status
from ._lib import LIB, OwnedHandle, call, cstr
from .binding import Binding, MemoryKind
from .engine_bridge import EngineBridge
from .guard import Guard, GuardBridge
from .load import PlanningLimits
from .placement import Placement
from .progress import c_progress

__all__ = ["TransferPlan", "TransferEngine", "Loader", "Sink", "TransferStats", "LiveReport", "TargetOutcome",
           "EngineResources", "PreparedTransfer", "LeaseRotation", "PreparedInfo", "DeltaPublisher", "DeltaOutbox"]

_p = c_void_p


def _limits(coalesce: bool) -> Any:
    """The default executor limits, with coalescing of adjacent segments on or off."""
    if coalesce:
        return None  # NULL: the defaults (coalescing on)
    return ctypes.byref(_abi.mws_executor_limits(1024, 1_000_000, 10_000_000, 3, 1000, 1))


SIDE_SOURCE = _abi.MWS_SIDE_SOURCE
SIDE_TARGET = _abi.MWS_SIDE_TARGET

#: ``mws_source_routing``: which complete source DP replica a target participant reads.
SOURCE_ROUTINGS = {"target_dp": _abi.MWS_SOURCE_ROUTING_TARGET_DP,
                   "spread_targets": _abi.MWS_SOURCE_ROUTING_SPREAD_TARGETS}


@dataclass(frozen=True)
class TransferStats:
    """What one live call moved: ``operations`` counts planned segments (the
    receipts' counts), ``engine_operations`` the transfers submitted to the engine for
    them (fewer when adjacent segments were merged)."""

    bytes: int = 0
    regions: int = 0
    operations: int = 0
    receipts: int = 0
    engine_operations: int = 0


def _stats(s: _abi.mws_transfer_stats) -> TransferStats:
    return TransferStats(s.bytes, s.regions, s.operations, s.receipts, s.engine_operations)


_VERDICTS = {_abi.MWS_TARGET_UPDATED: "updated", _abi.MWS_TARGET_UNCHANGED: "unchanged", _abi.MWS_TARGET_TORN: "torn"}
_GUARD_RELEASES = {_abi.MWS_GUARD_NOT_PINNED: "not_pinned", _abi.MWS_GUARD_COMPLETED: "completed",
                   _abi.MWS_GUARD_FAILED_DRAINED: "failed_drained", _abi.MWS_GUARD_ABORTED: "aborted",
                   _abi.MWS_GUARD_PENDING: "pending", _abi.MWS_GUARD_RELEASE_FAILED: "release_failed"}


@dataclass(frozen=True)
class TargetOutcome:
    """The verdict of one live call for one target participant it writes:
    ``"updated"`` (the call's share landed completely; the participant may serve
    ``weight_generation`` once every call writing it says so), ``"unchanged"`` (the call
    submitted nothing: the previous contents stand) or ``"torn"`` (part of the share
    may have been written: the bytes are undefined until a call completes)."""

    participant_id: str
    weight_generation: int
    verdict: str


@dataclass(frozen=True)
class LiveReport:
    """What a live call did, successful or not: whether anything was submitted to the
    engine (``False`` proves nothing was written), how the allocation guards' pins
    were released (``"completed"``, ``"failed_drained"``, ``"aborted"``,
    ``"pending"`` (held by ``pending_transfer_id`` until a drain), ``"not_pinned"``,
    ``"release_failed"``), the verdict per target participant and the statistics."""

    submitted: bool
    guard_release: str
    pending_transfer_id: Optional[str]
    targets: tuple
    stats: TransferStats

    def verdicts(self) -> dict:
        """``{participant_id: verdict}``."""
        return {t.participant_id: t.verdict for t in self.targets}


@dataclass(frozen=True)
class EngineResources:
    """What an engine still holds: its registered regions (``None`` when the engine
    cannot list them), its pending transfers, and the registrations and pins they
    hold (quarantined). After every call returned and every pending transfer was
    drained, the library holds nothing."""

    registered_regions: Optional[int]
    registered_bytes: Optional[int]
    pending_transfers: int
    quarantined_registrations: int
    pinned_tokens: int


def _serialized(f: Any) -> Any:
    """A method of a loader, sink or prepared transfer that runs one at a time per
    object: a call and the report it leaves (whose strings the handle lends until its
    next call) are never interleaved with another call's."""

    @functools.wraps(f)
    def serialized(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._serial:
            return f(self, *args, **kwargs)

    return serialized


def _report(fn: str, handle: Any) -> Optional[LiveReport]:
    """The last report of a loader, sink or prepared transfer, copied out while the
    handle is held (its strings are lent by the handle)."""
    with handle._use():
        return _copy_report(fn, handle)


class _Reporting:
    """What a loader, sink and prepared transfer share: the report attached to a
    failed call's exception (``None`` when the object was closed meanwhile)."""

    def _report_of_failure(self) -> Optional[LiveReport]:
        try:
            return self.last_report()  # type: ignore[attr-defined,no-any-return]
        except _lib.ArgumentError:
            return None


def _copy_report(fn: str, handle: Any) -> Optional[LiveReport]:
    r = _abi.mws_live_report()
    st = LIB.fn(fn)(handle, ctypes.byref(r))
    if st != 0:
        return None  # no live call yet (MWS_NOT_FOUND)
    targets = tuple(TargetOutcome(r.targets[i].participant_id.decode("utf-8"), int(r.targets[i].weight_generation),
                                  _VERDICTS.get(r.targets[i].verdict, str(r.targets[i].verdict)))
                    for i in range(r.n_targets))
    pending = r.pending_transfer_id.decode("utf-8") if r.pending_transfer_id else None
    return LiveReport(bool(r.submitted), _GUARD_RELEASES.get(r.guard_release, str(r.guard_release)), pending,
                      targets, _stats(r.stats))


def _handles(bindings: Sequence[Binding]) -> Any:
    return _lib.handle_array(bindings)


def _args(pre_registered: bool, worker_id: Optional[str], transfer_id: Optional[str],
          bridge: Optional[GuardBridge] = None) -> _abi.mws_live_args:
    guard = ctypes.addressof(bridge.vtable) if bridge is not None else None
    return _abi.mws_live_args(cstr(worker_id, "worker_id"), cstr(transfer_id, "transfer_id"),
                              1 if pre_registered else 0, guard, None)


@dataclass(frozen=True)
class LeaseRotation:
    """A runtime lease of one prepared binding that rotated (``mws_lease_rotation``):
    its owner moved the lease on while the buffers stayed where they were prepared."""

    instance_id: str
    participant_id: str
    lease_id: str
    lease_generation: int


@dataclass(frozen=True)
class PreparedInfo:
    """What one step of a prepared transfer does (``mws_prepared_info``)."""

    empty: bool
    batches: int
    pinned_bindings: int
    bytes: int


@dataclass(frozen=True)
class DeltaOutbox:
    """The outbox of one source executor for pulled delta steps (``mws_delta_outbox``):
    :attr:`DeltaPublisher.outbox` on the source side, told to the readers
    (:meth:`PreparedTransfer.enable_delta_pull`) out of band."""

    participant_id: str
    worker_id: str
    address: int
    capacity: int


class DeltaPublisher(OwnedHandle):
    """The source side of pulled delta steps for one source executor
    (``mws_delta_publisher``): :meth:`publish` encodes, for every target executor it
    feeds, the elements that changed since the previous publication into a
    registered outbox that the servers' delta-enabled readers read. Keeps the plan
    and the engine alive; :meth:`close` (or ``with``) unregisters the outbox.
    Publications are serialized."""

    _FREE = "mws_delta_publisher_free"
    _WHAT = "delta publisher"

    def __init__(self, plan: "TransferPlan", participant: str, engine: "TransferEngine", capacity: int, *,
                 worker: Optional[str] = None) -> None:
        """A publisher for the source executor of ``participant`` (its only one, or
        ``worker``'s) under the bound ``plan``, with an outbox of ``capacity`` bytes
        registered with ``engine`` (:meth:`min_outbox_capacity` says the least).
        Raises ``InvalidArgumentError`` (a logical plan, not a source executor, a
        capacity under the least), ``UnsupportedError`` (device sources and no device
        engine)."""
        out = _p()
        engine._call("mws_delta_publisher_new", plan, cstr(participant, "participant"),
                     cstr(worker, "worker") if worker is not None else None, engine, int(capacity), ctypes.byref(out))
        super().__init__(out.value, [plan, engine])
        self._engine = engine

    @staticmethod
    def min_outbox_capacity(plan: "TransferPlan", participant: str, worker: Optional[str] = None) -> int:
        """The least outbox capacity of that source executor: a header and 64 bytes of
        records per target executor it feeds."""
        n = ctypes.c_uint64(0)
        call("mws_delta_min_outbox_capacity", plan, cstr(participant, "participant"),
             cstr(worker, "worker") if worker is not None else None, ctypes.byref(n))
        return int(n.value)

    @property
    def outbox(self) -> DeltaOutbox:
        """The outbox the readers need."""
        o = _abi.mws_delta_outbox()
        call("mws_delta_publisher_outbox", self, ctypes.byref(o))
        return DeltaOutbox(o.participant_id.decode(), o.worker_id.decode(), int(o.address), int(o.capacity))

    def publish(self, weight_generation: int) -> Dict[str, int]:
        """Publishes ``weight_generation``: what the source executor's buffers hold now
        (they must not be written during the call, nor while the readers step it).
        Returns what was published: weight_generation, delta_targets, full_targets,
        wire_bytes (what the readers will pull), logical_bytes, changed_elements."""
        d = _abi.mws_delta_stats()
        self._engine._call("mws_delta_publisher_publish", self, int(weight_generation), ctypes.byref(d))
        return {name: int(getattr(d, name)) for name, _ in _abi.mws_delta_stats._fields_}


class PreparedTransfer(_Reporting, OwnedHandle):
    """A live transfer prepared once (:meth:`Sink.prepare`, :meth:`Loader.prepare_live`)
    and stepped many times (``mws_prepared_transfer``): each :meth:`step` moves one
    weight generation through the batches lowered at preparation, after the
    freshness checks (engine identity, rotated leases, one pin per binding through the
    guard). Stale prepared state is refused with
    :class:`~mooncake_weight_store.errors.StaleBindingError` ("prepare the transfer
    again") before any byte moves.

    Keeps the plan, placements, bindings (their buffers), guard and engine alive;
    :meth:`close` (or ``with``) unregisters the memory the preparation registered.
    Steps run one at a time."""

    _FREE = "mws_prepared_transfer_free"
    _WHAT = "prepared transfer"

    def __init__(self, handle: Optional[int], engine: "TransferEngine", keep: Sequence[Any] = ()) -> None:
        super().__init__(handle, keep)
        self._engine = engine
        self._serial = threading.RLock()

    @_serialized
    def step(self, weight_generation: int, *, leases: Sequence[LeaseRotation] = (),
             transfer_id: Optional[str] = None, revision: Optional[str] = None) -> TransferStats:
        """Moves weight generation ``weight_generation`` (``leases``: rotated since the last
        step, kept for later steps; ``revision``: for a prepared restore, the revision
        to read, default the prepared one). Returns the step's statistics; a failed
        live step attaches its report to the exception as ``.report``."""
        return self._step("mws_prepared_transfer_step", weight_generation, leases, transfer_id, revision, ())

    @_serialized
    def step_notified(self, weight_generation: int, *, key: Optional[bytes] = None, verify_content: bool = False,
                      leases: Sequence[LeaseRotation] = (), transfer_id: Optional[str] = None) -> TransferStats:
        """:meth:`step` of a prepared sink with the notify hook
        (``mws_prepared_transfer_step_notified``): ``begin`` to every target endpoint,
        the prepared batches, ``done`` when they completed, each carrying this step's
        weight generation, through the engine's ``send_notify``. ``key``: None
        (unkeyed) or the key shared with the targets' acceptors (>= 16 bytes).
        ``verify_content``: the ``done`` carries the CRC-32C of the bytes sent into
        each target (host buffers only), which a verifying
        :class:`~mooncake_weight_store.NotifyAcceptor` checks before it reports the
        target updated. Raises as :meth:`step`; ``InvalidArgumentError`` for a
        prepared reader or restore (their steps notify no one) or a short key,
        ``UnsupportedError`` when the engine cannot notify."""
        k = bytes(key) if key else None
        flags = _abi.MWS_STEP_VERIFY_CONTENT if verify_content else 0
        return self._step("mws_prepared_transfer_step_notified", weight_generation, leases, transfer_id, None,
                          (k, len(k) if k else 0, flags))

    @_serialized
    def start_step(self, weight_generation: int, *, notify: bool = False, key: Optional[bytes] = None,
                   verify_content: bool = False, held: Optional[Dict[str, int]] = None,
                   leases: Sequence[LeaseRotation] = (), transfer_id: Optional[str] = None) -> "StepHandle":
        """Starts :meth:`step` (or, with ``notify``, ``key`` or ``verify_content``,
        :meth:`step_notified` of a prepared sink) without blocking
        (``mws_prepared_transfer_step_start``) and returns its :class:`StepHandle`: a
        ``concurrent.futures.Future`` (``.future``), awaitable in ``asyncio``, that
        can be polled, waited on with a timeout and cancelled. The step runs on the
        library's step driver thread (the engine's own completion drives it; this
        thread and the GIL stay free), as do the sink's or loader's progress
        callback and, for an engine implemented in Python, its callbacks.

        Two steps of one prepared transfer never overlap: one started while another
        runs fails (``InvalidArgumentError`` through its handle); a step may run while
        this process serves reads of other buffers. The buffers of the prepared
        bindings must stay valid until the step ended: the handle keeps this object
        (and what it keeps) alive until then, even once dropped. Raises (nothing
        started): ``InvalidArgumentError`` (a prepared restore; a short key).
        ``held``: a delta step (as :meth:`step_delta`, content-verified)."""
        args, keep = _step_args(weight_generation, leases, transfer_id, None)
        notify_c = None
        if notify or key is not None or verify_content or held is not None:
            k = bytes(key) if key else None
            kbuf = ctypes.create_string_buffer(k, len(k)) if k else None
            keep.append(kbuf)
            flags = _abi.MWS_STEP_VERIFY_CONTENT if verify_content else 0
            arr, n = _held(held or {})
            keep.append(arr)
            if held is not None:
                flags |= _abi.MWS_STEP_DELTA
            notify_c = _abi.mws_step_notify(ctypes.addressof(kbuf) if kbuf is not None else None,
                                            len(k) if k else 0, flags, arr, n)
        step = StepHandle([self])
        out = _abi._p()
        self._engine._call("mws_prepared_transfer_step_start", self, ctypes.byref(args),
                           ctypes.byref(notify_c) if notify_c is not None else None, step._callback, None,
                           ctypes.byref(out))
        step._adopt(out.value)
        return step

    def enable_delta(self, inboxes: Dict[str, Tuple[int, int]]) -> None:
        """Enables delta steps of this prepared sink (``mws_prepared_transfer_enable_delta``):
        ``inboxes`` maps every target participant it writes to its inbox
        ``(address, capacity)`` (a host buffer of the target side, registered with the
        target's engine; others are ignored). Keeps a host copy of the bytes it sends
        (its base) and one registered outbox per target until closed. The first step
        after it sends every byte."""
        items = list(inboxes.items())
        arr = (_abi.mws_delta_inbox * len(items))(*[
            _abi.mws_delta_inbox(cstr(t, "participant_id"), int(a), int(c)) for t, (a, c) in items])
        self._engine._call("mws_prepared_transfer_enable_delta", self, arr if items else None, len(items))

    @_serialized
    def step_delta(self, weight_generation: int, *, held: Dict[str, int], key: Optional[bytes] = None,
                   leases: Sequence[LeaseRotation] = (), transfer_id: Optional[str] = None) -> TransferStats:
        """A delta step (``mws_prepared_transfer_step_delta``): as :meth:`step_notified`
        with ``verify_content``, but each target whose ``held`` generation (what its
        acceptor's :meth:`~mooncake_weight_store.NotifyAcceptor.held_generation` says)
        is the source's base is sent only the changed elements; the others every
        byte. :meth:`delta_stats` then says what was sent."""
        k = bytes(key) if key else None
        arr, n = _held(held)
        return self._step("mws_prepared_transfer_step_delta", weight_generation, leases, transfer_id, None,
                          (k, len(k) if k else 0, arr, n))

    def enable_delta_pull(self, outboxes: Sequence["DeltaOutbox"]) -> None:
        """Enables pulled delta steps of this prepared reader
        (``mws_prepared_transfer_enable_delta_pull``): ``outboxes`` names the outbox of
        every source executor it reads (:attr:`DeltaPublisher.outbox` on the source
        side; others are ignored). From then on every :meth:`step` reads the sources'
        publications first, pulls only the changed elements from the sources whose
        base it holds (:meth:`held_generation`) and every byte from the others,
        applies them and verifies the content against the publications. A step then
        raises ``ConflictError`` when a source has not published its generation
        (nothing moved) and ``IntegrityError`` when the content does not match (the
        target torn; the next step pulls every byte). Keeps a registered staging
        buffer until closed. Raises ``InvalidArgumentError`` (a sink or restore, a
        source executor without an outbox, an outbox under its least capacity),
        ``UnsupportedError`` (device target buffers and no device engine)."""
        items = list(outboxes)
        arr = (_abi.mws_delta_outbox * len(items))(*[
            _abi.mws_delta_outbox(cstr(o.participant_id, "participant_id"), cstr(o.worker_id, "worker_id"),
                                  int(o.address), int(o.capacity)) for o in items])
        self._engine._call("mws_prepared_transfer_enable_delta_pull", self, arr if items else None, len(items))

    def held_generation(self) -> Optional[int]:
        """The weight generation a delta-enabled reader's buffers hold, verified against
        the sources' publications and untouched by a step since (``None``: none)."""
        g = ctypes.c_uint64(0)
        st = LIB.fn("mws_prepared_transfer_held_generation")(self, ctypes.byref(g))
        if st == Status.NOT_FOUND:
            return None
        _lib.check(st)
        return int(g.value)

    def delta_stats(self) -> Optional[Dict[str, int]]:
        """What the last delta step sent (``None`` before the first): weight_generation,
        delta_targets, full_targets, wire_bytes, logical_bytes, changed_elements."""
        d = _abi.mws_delta_stats()
        st = LIB.fn("mws_prepared_transfer_delta_stats")(self, ctypes.byref(d))
        if st == Status.NOT_FOUND:  # no delta step yet
            return None
        _lib.check(st)
        return {name: int(getattr(d, name)) for name, _ in _abi.mws_delta_stats._fields_}

    def _step(self, fn: str, weight_generation: int, leases: Sequence[LeaseRotation], transfer_id: Optional[str],
              revision: Optional[str], extra: Tuple[Any, ...]) -> TransferStats:
        args, _keep = _step_args(weight_generation, leases, transfer_id, revision)
        st = _abi.mws_transfer_stats()
        try:
            self._engine._call(fn, self, ctypes.byref(args), *extra, ctypes.byref(st))
        except _lib.MwsError as e:
            e.report = self._report_of_failure()  # type: ignore[attr-defined]
            raise
        return _stats(st)

    @_serialized
    def last_report(self) -> Optional[LiveReport]:
        """The report of the last step, successful or not (``None`` before the first)."""
        return _report("mws_prepared_transfer_last_report", self)

    @property
    def info(self) -> PreparedInfo:
        i = _abi.mws_prepared_info()
        call("mws_prepared_transfer_info", self, ctypes.byref(i))
        return PreparedInfo(bool(i.empty), int(i.batches), int(i.pinned_bindings), int(i.bytes))

    def close(self) -> None:
        """Unregisters the memory the preparation registered, then frees the handle
        (raises when an unregistration failed; the handle is freed anyway)."""
        if self._h is None:
            return
        try:
            self._engine._call("mws_prepared_transfer_close", self)
        finally:
            self._free()


def _held(held: Dict[str, int]) -> Tuple[Any, int]:
    """The C array of a delta step's held generations."""
    items = list(held.items())
    arr = (_abi.mws_target_held * len(items))(*[
        _abi.mws_target_held(cstr(t, "participant_id"), int(g)) for t, g in items])
    return (arr if items else None), len(items)


def _step_args(weight_generation: int, leases: Sequence[LeaseRotation], transfer_id: Optional[str],
               revision: Optional[str]) -> Tuple[_abi.mws_step_args, List[Any]]:
    """The C arguments of a step, and what they point into (keep it for the call)."""
    arr = (_abi.mws_lease_rotation * len(leases))(*[
        _abi.mws_lease_rotation(cstr(r.instance_id, "instance_id"), cstr(r.participant_id, "participant_id"),
                                cstr(r.lease_id, "lease_id"), int(r.lease_generation)) for r in leases])
    args = _abi.mws_step_args(int(weight_generation), arr if leases else None, len(leases),
                              cstr(transfer_id, "transfer_id"), cstr(revision, "revision"))
    return args, [arr]


#: Started steps whose completion callback has not run yet (it keeps them alive).
_RUNNING: Dict[int, "StepHandle"] = {}
_RUNNING_LOCK = threading.Lock()


class StepHandle(OwnedHandle):
    """A step started by :meth:`PreparedTransfer.start_step` (``mws_step_handle``).

    * :attr:`future`: a ``concurrent.futures.Future`` completed when the step ended,
      with its :class:`TransferStats`, or its exception (an ``MwsError`` carrying the
      step's report as ``.report``). It is already running: cancel the step with
      :meth:`cancel`, not ``future.cancel()``.
    * ``await handle`` in ``asyncio`` gives the same result.
    * :meth:`poll`, :meth:`wait` (with a timeout), :meth:`cancel`, :meth:`report`.

    The step does not stop when this object is dropped or closed: it runs to its
    end, and this object (with the prepared transfer and its buffers) stays alive
    until its completion callback ran. Thread safety: any method from any thread."""

    _FREE = "mws_step_handle_free"
    _WHAT = "step handle"
    _UNHELD = ("close", "future")

    def __init__(self, keep: Sequence[Any]) -> None:
        super().__init__(None, keep)
        self._future: "concurrent.futures.Future[TransferStats]" = concurrent.futures.Future()
        self._future.set_running_or_notify_cancel()
        self._report: Optional[LiveReport] = None
        self._settling = threading.Lock()
        self._early = False
        self._callback = _abi.STEP_CALLBACK_FN(self._on_complete)
        with _RUNNING_LOCK:
            _RUNNING[id(self)] = self

    def _adopt(self, handle: Optional[int]) -> None:
        with self._settling:
            super()._adopt(handle)
            early = self._early
        if handle is None:  # the start failed: no callback will run
            with _RUNNING_LOCK:
                _RUNNING.pop(id(self), None)
        elif early:
            self._settle()

    def _on_complete(self, _user_data: Any, _status: int) -> None:
        """The completion callback (the step driver's thread, or the starting thread
        when the step ended at once): settles the future."""
        with self._settling:
            if self._h is None:  # inside the start call: _adopt settles it
                self._early = True
                return
        self._settle()

    def _settle(self) -> None:
        try:
            try:
                with self._use():  # a concurrent close waits for this read
                    stats = self._wait_ms(0)
                self._future.set_result(stats)  # type: ignore[arg-type]
            except BaseException as e:  # noqa: BLE001 - the future carries it
                self._future.set_exception(e)
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(id(self), None)

    def _wait_ms(self, timeout_ms: int) -> Optional[TransferStats]:
        finished = ctypes.c_uint32(0)
        st = _abi.mws_transfer_stats()
        status = LIB.fn("mws_step_handle_wait")(self, timeout_ms, ctypes.byref(finished), ctypes.byref(st))
        if finished.value:
            self._report = _copy_report("mws_step_handle_report", self)
        try:
            _lib.check(status)
        except _lib.MwsError as e:
            e.report = self._report  # type: ignore[attr-defined]
            raise
        return _stats(st) if finished.value else None

    @property
    def future(self) -> "concurrent.futures.Future[TransferStats]":
        """The step's ``concurrent.futures.Future`` (see the class)."""
        return self._future

    def __await__(self) -> Generator[Any, None, TransferStats]:
        return asyncio.wrap_future(self._future).__await__()

    def poll(self) -> bool:
        """True once the step ended; never blocks."""
        finished = ctypes.c_uint32(0)
        call("mws_step_handle_poll", self, ctypes.byref(finished))
        return bool(finished.value)

    def wait(self, timeout: Optional[float] = None) -> TransferStats:
        """Waits up to ``timeout`` seconds (``None``: no limit) for the step to end and
        returns its statistics; raises the step's error (with ``.report``), or
        ``TimeoutError`` while it still runs. Releases the GIL while it waits."""
        ms = 2**64 - 1 if timeout is None else max(0, int(timeout * 1000))
        stats = self._wait_ms(ms)
        if stats is None:
            raise TimeoutError(f"the step is still running after {timeout} s")
        return stats

    def cancel(self) -> None:
        """Stops the step before its next batch (a running batch completes); it then
        ends with ``StoreError`` ("... cancelled ...") unless it already ended. Does
        not wait."""
        call("mws_step_handle_cancel", self)

    def report(self) -> Optional[LiveReport]:
        """The ended step's report, successful or not (``None`` while it runs)."""
        return _copy_report("mws_step_handle_report", self)


class TransferPlan(OwnedHandle):
    """A live-transfer plan (``mws_transfer_plan``): logical (from two placements,
    address-free) or bound (to source and target bindings)."""

    _FREE = "mws_transfer_plan_free"
    _WHAT = "transfer plan"

    def __init__(self, handle: Optional[int], keep: Sequence[Any] = ()) -> None:
        super().__init__(handle, keep)

    @classmethod
    def plan(cls, source: Placement, target: Placement, target_participant_id: Optional[str] = None,
             limits: Optional[PlanningLimits] = None, *, source_routing: str = "target_dp") -> "TransferPlan":
        """Plans ``source`` -> every participant of ``target`` (or only
        ``target_participant_id``). Pure: no I/O.

        ``source_routing``: which complete source DP replica each target participant
        reads. ``"target_dp"`` (default, the reference's): DP rank ``d`` of the target
        reads replica ``d mod R``, so a target with one DP replica reads everything
        from one source replica. ``"spread_targets"``: target participant ``i`` (its
        index in the target grid, dp-pp-ep-tp order) reads replica ``i mod R``,
        spreading the load over the hosts of every complete replica (not the
        reference's plan; it travels in :meth:`to_json`)."""
        if source_routing not in SOURCE_ROUTINGS:
            raise ValueError(f"source_routing must be one of {sorted(SOURCE_ROUTINGS)}, got {source_routing!r}")
        lim = ctypes.byref(limits.to_c()) if limits is not None else None
        out = _p()
        if source_routing == "target_dp":
            call("mws_transfer_plan_new", source, target, cstr(target_participant_id), lim,
                 ctypes.byref(out))
        else:
            call("mws_transfer_plan_new_routed", source, target, cstr(target_participant_id), lim,
                 SOURCE_ROUTINGS[source_routing], ctypes.byref(out))
        return cls(out.value)

    @classmethod
    def from_json(cls, text: str) -> "TransferPlan":
        """Restores a logical plan shipped as JSON (re-planned and compared)."""
        raw = text.encode("utf-8")
        out = _p()
        call("mws_transfer_plan_from_json", raw, len(raw), ctypes.byref(out))
        return cls(out.value)

    def bind(self, targets: Sequence[Binding], sources: Sequence[Binding]) -> "TransferPlan":
        """A new plan bound to ``targets`` and ``sources`` (kept alive by it)."""
        out = _p()
        call("mws_transfer_plan_bind", self, _handles(targets), len(targets), _handles(sources), len(sources),
             ctypes.byref(out))
        return TransferPlan(out.value, [*targets, *sources])

    def to_json(self) -> str:
        n = c_size_t(0)
        ptr = LIB.fn("mws_transfer_plan_to_json")(self, ctypes.byref(n))
        if not ptr:
            _lib.check(int(_lib.Status.NULL_ARGUMENT))
        return ctypes.string_at(ptr, n.value).decode("utf-8")

    @property
    def source_routing(self) -> str:
        """The source replica routing of the plan (``"target_dp"`` or
        ``"spread_targets"``)."""
        doc = json.loads(self.to_json())
        return str((doc.get("logical", doc)).get("source_routing", "target_dp"))

    @property
    def is_bound(self) -> bool:
        return int(LIB.fn("mws_transfer_plan_is_bound")(self)) == 1

    @property
    def region_count(self) -> int:
        return int(LIB.fn("mws_transfer_plan_region_count")(self))

    @property
    def total_bytes(self) -> int:
        return int(LIB.fn("mws_transfer_plan_total_bytes")(self))

    def executor_count(self, side: str) -> int:
        code = {"source": SIDE_SOURCE, "target": SIDE_TARGET}[side]
        return int(LIB.fn("mws_transfer_plan_executor_count")(self, code))


class TransferEngine(OwnedHandle):
    """A transfer engine: :meth:`local` is the embedded in-process engine,
    :meth:`from_backend` any Python object implementing the engine protocol
    (:mod:`mooncake_weight_store.engine_bridge`), e.g. Mooncake's Transfer Engine
    through :class:`~mooncake_weight_store.te_backend.MooncakeTransferEngine`."""

    _FREE = "mws_transfer_engine_free"
    _WHAT = "transfer engine"

    def __init__(self, handle: Optional[int], bridge: Optional[EngineBridge] = None,
                 device_engine: Any = None) -> None:
        super().__init__(handle)
        # Not a kept object: loaders and sinks made from this engine may still call
        # the bridge after the handle is freed; they hold this object.
        self._bridge = bridge
        #: the device engine given to :meth:`local` or :meth:`from_backend` (else None)
        self.device_engine = device_engine

    @classmethod
    def local(cls, device_engine: Any = None) -> "TransferEngine":
        """The embedded in-process engine. With ``device_engine`` (a
        :class:`~mooncake_weight_store.device.DeviceEngine`), device memory may be
        registered and its bytes move through that engine, in batches; without one,
        device registrations are refused."""
        out = _p()
        if device_engine is None:
            call("mws_transfer_engine_new_local", ctypes.byref(out))
        else:
            call("mws_transfer_engine_new_local_device", device_engine, ctypes.byref(out))
        return cls(out.value, device_engine=device_engine)

    @classmethod
    def from_backend(cls, backend: Any, device_engine: Any = None) -> "TransferEngine":
        """Plugs a Python object implementing the engine protocol (``engine_id``,
        ``register_memory``, ``unregister_memory``, ``transfer_sync``; optional
        ``submit`` / ``ticket_status`` / ``ticket_wait`` / ``ticket_release``, see
        :mod:`~mooncake_weight_store.engine_bridge`) into the library through the C
        engine vtable. Raises ``TypeError`` when a required method is missing. An
        exception inside the backend never reaches C: it fails the library call,
        whose :class:`MwsError` names it and chains it as ``__cause__``; it is also
        listed in :attr:`callback_errors`. With ``device_engine`` (a
        :class:`~mooncake_weight_store.device.DeviceEngine`), the library reads and
        writes the device buffers of this engine's transfers on the host through it
        (content-verified and delta steps); the backend still moves every byte."""
        bridge = EngineBridge(backend)
        return TransferEngine(bridge.open(device_engine), bridge, device_engine=device_engine)

    @property
    def backend(self) -> Any:
        """The Python backend of an engine made by :meth:`from_backend` (else None)."""
        return self._bridge.backend if self._bridge else None

    @property
    def callback_errors(self) -> List[str]:
        """Exceptions raised inside the backend's callbacks (at most 64; empty for
        the embedded engine)."""
        return list(self._bridge.errors) if self._bridge else []

    def _call(self, name: str, *args: Any) -> None:
        """``call(name, *args)``, naming the backend's exception on failure."""
        if self._bridge is None:
            call(name, *args)
            return
        before = self._bridge.failures
        self._bridge.check(LIB.fn(name)(*args), before)

    def register_memory(self, address: int, nbytes: int, memory_kind: int = MemoryKind.HOST,
                        device_ordinal: int = 0) -> None:
        """The owner's registration of ``nbytes`` at ``address`` (valid until
        unregistered): host memory, or device memory (``memory_kind=MemoryKind.DEVICE``
        on device ``device_ordinal``; an embedded engine needs a device engine)."""
        self._call("mws_transfer_engine_register_memory", self, address, nbytes, int(memory_kind),
                   int(device_ordinal))

    def unregister_memory(self, address: int) -> None:
        self._call("mws_transfer_engine_unregister_memory", self, address)

    def register_binding(self, binding: Binding) -> None:
        """Registers every buffer of ``binding`` (its owner's pre-registration)."""
        for fid, address in binding.addresses.items():
            self.register_memory(address, binding._infos[fid].nbytes)

    def unregister_binding(self, binding: Binding) -> None:
        for address in binding.addresses.values():
            self.unregister_memory(address)

    @property
    def pending_count(self) -> int:
        return int(LIB.fn("mws_transfer_engine_pending_count")(self))

    def drain(self, timeout_ms: int = 1000) -> int:
        """Drains every pending transfer once; returns how many remain."""
        n = c_size_t(0)
        self._call("mws_transfer_engine_drain", self, timeout_ms, ctypes.byref(n))
        return int(n.value)

    def resources(self) -> EngineResources:
        """What the engine still holds (``mws_transfer_engine_resources``): proves that
        nothing leaked once ``pending_transfers`` is 0 and the registered regions are
        only the owners' own."""
        r = _abi.mws_engine_resources()
        call("mws_transfer_engine_resources", self, ctypes.byref(r))
        known = bool(r.registrations_known)
        return EngineResources(int(r.registered_regions) if known else None,
                               int(r.registered_bytes) if known else None, int(r.pending_transfers),
                               int(r.quarantined_registrations), int(r.pinned_tokens))


class Loader(_Reporting, OwnedHandle):
    """Fills one target participant's buffers from live sources (reader mode)."""

    _FREE = "mws_loader_free"
    _WHAT = "loader"

    def __init__(self, engine: TransferEngine, *, coalesce: bool = True) -> None:
        """``coalesce=False`` submits one engine operation per planned segment
        (default: adjacent segments are merged; the bytes moved are the same)."""
        out = _p()
        engine._call("mws_loader_new", engine, _limits(coalesce), ctypes.byref(out))
        super().__init__(out.value)
        self._engine = engine  # the engine's Python callbacks live as long as this object
        self._progress: Any = None
        self._serial = threading.RLock()

    def set_progress(self, fn: Optional[Any]) -> None:
        """Reports live loads (phase ``"transfer"``, items = engine operations) and
        stored loads (phase ``"restore"``) to ``fn``, a callable taking a
        :class:`~mooncake_weight_store.progress.Progress` (throttled; exceptions are
        swallowed); ``None`` removes it."""
        c_fn, keep = c_progress(fn)
        call("mws_loader_set_progress", self, c_fn, None)
        self._progress = keep

    def cancel(self) -> None:
        LIB.fn("mws_loader_cancel")(self)

    def reset_cancel(self) -> None:
        LIB.fn("mws_loader_reset_cancel")(self)

    @_serialized
    def load_live(self, plan: TransferPlan, source: Placement, sources: Sequence[Binding], target: Placement,
                  local: Binding, *, local_pre_registered: bool = False, worker_id: Optional[str] = None,
                  transfer_id: Optional[str] = None) -> TransferStats:
        """Pulls the local target executor's operations of the bound ``plan`` into
        ``local``'s buffers (the sources' memory must be registered by its owners)."""
        args = _args(local_pre_registered, worker_id, transfer_id)
        st = _abi.mws_transfer_stats()
        try:
            self._engine._call("mws_loader_load_live", self, plan, source, _handles(sources),
                               len(sources), target, local, ctypes.byref(args), ctypes.byref(st))
        except _lib.MwsError as e:
            e.report = self._report_of_failure()  # type: ignore[attr-defined]
            raise
        return _stats(st)

    def prepare_stored(self, store: Any, plan: Any, local: Binding, *, worker_id: Optional[str] = None,
                       guard: Optional[Guard] = None) -> PreparedTransfer:
        """Prepares restores of ``local``'s part of ``plan``'s layout (a
        :class:`~mooncake_weight_store.load.LoadPlan` of ``store``, e.g. the first
        revision's) for many steps: each :meth:`PreparedTransfer.step` restores the
        revision (default: the plan's) and weight generation it names, refused with
        :class:`~mooncake_weight_store.errors.StaleBindingError` ("prepare the transfer
        again") when that revision holds another layout or the guard reports the
        buffers freed or moved."""
        bridge = GuardBridge(guard) if guard is not None else None
        args = _args(False, worker_id, None, bridge)
        out = _p()
        call("mws_loader_prepare_stored", self, store, plan, local, ctypes.byref(args),
             ctypes.byref(out))
        return PreparedTransfer(out.value, self._engine, [self, store, plan, local, bridge])

    def start_load_live(self, plan: TransferPlan, source: Placement, sources: Sequence[Binding], target: Placement,
                        local: Binding, *, local_pre_registered: bool = False, worker_id: Optional[str] = None,
                        transfer_id: Optional[str] = None, guard: Optional[Guard] = None) -> "StepHandle":
        """:meth:`load_live` without blocking (``mws_loader_load_live_start``):
        prepared on this thread, its one step started on the library's step driver;
        returns its :class:`StepHandle` (which keeps every argument alive until the
        step ended). Raises (nothing started) as :meth:`prepare_live`."""
        bridge = GuardBridge(guard) if guard is not None else None
        args = _args(local_pre_registered, worker_id, transfer_id, bridge)
        step = StepHandle([self, plan, source, target, local, *sources, bridge])
        out = _p()
        self._engine._call("mws_loader_load_live_start", self, plan, source, _handles(sources), len(sources), target,
                           local, ctypes.byref(args), step._callback, None, ctypes.byref(out))
        step._adopt(out.value)
        return step

    def prepare_live(self, plan: TransferPlan, source: Placement, sources: Sequence[Binding], target: Placement,
                     local: Binding, *, local_pre_registered: bool = False, worker_id: Optional[str] = None,
                     transfer_id: Optional[str] = None, guard: Optional[Guard] = None) -> PreparedTransfer:
        """Prepares :meth:`load_live` with these arguments for many steps: every check
        of the call under the guard's pins, its batches lowered once, the local buffers
        registered (unless ``local_pre_registered``) until the prepared transfer is
        closed. ``guard``: pins the buffers at preparation and at every step (default:
        the caller keeps every buffer valid and in place)."""
        bridge = GuardBridge(guard) if guard is not None else None
        args = _args(local_pre_registered, worker_id, transfer_id, bridge)
        out = _p()
        self._engine._call("mws_loader_prepare_live", self, plan, source, _handles(sources),
                           len(sources), target, local, ctypes.byref(args), ctypes.byref(out))
        return PreparedTransfer(out.value, self._engine, [self, plan, source, target, local, *sources, bridge])

    @_serialized
    def last_report(self) -> Optional[LiveReport]:
        """The report of the last live load, successful or not (``None`` before the
        first); a failed :meth:`load_live` also attaches it to its exception as
        ``.report``."""
        return _report("mws_loader_last_report", self)

    @_serialized
    def stats(self) -> TransferStats:
        """The statistics of the last successful call."""
        st = _abi.mws_transfer_stats()
        call("mws_loader_stats", self, ctypes.byref(st))
        return _stats(st)


class Sink(_Reporting, OwnedHandle):
    """A source participant's side of a live transfer (pushes its part)."""

    _FREE = "mws_sink_free"
    _WHAT = "sink"

    def __init__(self, engine: TransferEngine, *, coalesce: bool = True) -> None:
        """``coalesce`` as for :class:`Loader`."""
        out = _p()
        engine._call("mws_sink_new", engine, _limits(coalesce), ctypes.byref(out))
        super().__init__(out.value)
        self._engine = engine  # the engine's Python callbacks live as long as this object
        self._progress: Any = None
        self._serial = threading.RLock()

    @_serialized
    def execute(self, plan: TransferPlan, source: Placement, local: Binding, target: Placement,
                targets: Sequence[Binding], *, local_pre_registered: bool = False, worker_id: Optional[str] = None,
                transfer_id: Optional[str] = None) -> TransferStats:
        """Pushes the local source executor's operations of the bound ``plan`` into
        the targets (whose memory must be registered by its owners)."""
        args = _args(local_pre_registered, worker_id, transfer_id)
        st = _abi.mws_transfer_stats()
        try:
            self._engine._call("mws_sink_execute", self, plan, source, local,
                               target, _handles(targets), len(targets), ctypes.byref(args), ctypes.byref(st))
        except _lib.MwsError as e:
            e.report = self._report_of_failure()  # type: ignore[attr-defined]
            raise
        return _stats(st)

    @_serialized
    def execute_notified(self, plan: TransferPlan, source: Placement, local: Binding, target: Placement,
                         targets: Sequence[Binding], *, key: Optional[bytes] = None,
                         local_pre_registered: bool = False, worker_id: Optional[str] = None,
                         transfer_id: Optional[str] = None) -> TransferStats:
        """:meth:`execute` with the notify hook: ``begin`` to every endpoint of every
        target participant the local executor writes before the call, ``done`` after
        it returned, through the engine's ``send_notify`` (the engine backend's
        optional method; :class:`UnsupportedError` without it, before any transfer).
        Each target checks them with a :class:`~mooncake_weight_store.NotifyAcceptor`
        sharing ``key`` (None: unkeyed, else at least 16 bytes)."""
        args = _args(local_pre_registered, worker_id, transfer_id)
        st = _abi.mws_transfer_stats()
        k = bytes(key) if key else None
        try:
            self._engine._call("mws_sink_execute_notified", self, k, len(k) if k else 0, plan,
                               source, local, target, _handles(targets), len(targets),
                               ctypes.byref(args), ctypes.byref(st))
        except _lib.MwsError as e:
            e.report = self._report_of_failure()  # type: ignore[attr-defined]
            raise
        return _stats(st)

    def start_execute(self, plan: TransferPlan, source: Placement, local: Binding, target: Placement,
                      targets: Sequence[Binding], *, local_pre_registered: bool = False,
                      worker_id: Optional[str] = None, transfer_id: Optional[str] = None,
                      guard: Optional[Guard] = None) -> "StepHandle":
        """:meth:`execute` without blocking (``mws_sink_execute_start``): prepared on
        this thread, its one step started on the library's step driver; returns its
        :class:`StepHandle` (which keeps every argument alive until the step ended).
        Raises (nothing started) as :meth:`prepare`."""
        bridge = GuardBridge(guard) if guard is not None else None
        args = _args(local_pre_registered, worker_id, transfer_id, bridge)
        step = StepHandle([self, plan, source, target, local, *targets, bridge])
        out = _p()
        self._engine._call("mws_sink_execute_start", self, plan, source, local, target, _handles(targets),
                           len(targets), ctypes.byref(args), step._callback, None, ctypes.byref(out))
        step._adopt(out.value)
        return step

    def prepare(self, plan: TransferPlan, source: Placement, local: Binding, target: Placement,
                targets: Sequence[Binding], *, local_pre_registered: bool = False, worker_id: Optional[str] = None,
                transfer_id: Optional[str] = None, guard: Optional[Guard] = None) -> PreparedTransfer:
        """Prepares :meth:`execute` with these arguments for many steps (as
        :meth:`Loader.prepare_live`; a source the plan does not read from prepares
        steps that do nothing)."""
        bridge = GuardBridge(guard) if guard is not None else None
        args = _args(local_pre_registered, worker_id, transfer_id, bridge)
        out = _p()
        self._engine._call("mws_sink_prepare", self, plan, source, local, target,
                           _handles(targets), len(targets), ctypes.byref(args), ctypes.byref(out))
        return PreparedTransfer(out.value, self._engine, [self, plan, source, target, local, *targets, bridge])

    @_serialized
    def last_report(self) -> Optional[LiveReport]:
        """The report of the last execution, successful or not (``None`` before the
        first): one verdict per target participant it writes, for this call's share
        (a target written by several sources is updated once all their calls say
        so); a failed :meth:`execute` also attaches it to its exception as ``.report``."""
        return _report("mws_sink_last_report", self)

    @_serialized
    def stats(self) -> TransferStats:
        """The statistics of the last successful call."""
        st = _abi.mws_transfer_stats()
        call("mws_sink_stats", self, ctypes.byref(st))
        return _stats(st)

    def set_progress(self, fn: Optional[Any]) -> None:
        """Reports executions (phase ``"transfer"``) to ``fn`` as
        :meth:`Loader.set_progress` does; ``None`` removes it."""
        c_fn, keep = c_progress(fn)
        call("mws_sink_set_progress", self, c_fn, None)
        self._progress = keep

    def cancel(self) -> None:
        LIB.fn("mws_sink_cancel")(self)

    def reset_cancel(self) -> None:
        LIB.fn("mws_sink_reset_cancel")(self)
