"""A trainer's state dict straight into live transfer (issue 46, item 4): the
placements and bindings of both sides of a live transfer from state dicts and their
parallel layouts, in one call per side, as :func:`save_state_dict` does for
snapshots; then prepare once and step every weight generation.

* :func:`live_state_dict` describes one side (``side="source"``: the trainer's
  tensors, read; ``side="target"``: the server's preallocated tensors, written)
  with the sharding terms of :mod:`~mooncake_weight_store.state_dict`
  (:class:`Parallel`, :class:`Shard`, shorthands, patterns) and returns a
  :class:`LiveStateDict`: the side's address-free placement (every rank's boxes) and
  the binding of every rank (every rank's buffer addresses). A multi-rank side is
  gathered through an :class:`~mooncake_weight_store.exchange.Exchange` (every rank
  calls it, as for a multi-rank save) or given whole by one process (``ranks=``).
* :func:`plan_live_transfer` checks that the two sides hold the same tensors (names,
  dtypes, global shapes, layout fingerprints) with messages naming both, plans the
  placement-to-placement transfer and binds it to both sides' bindings.
* :func:`prepare_live_transfer` plans, registers this process's tensors with the
  engine and prepares a :class:`~mooncake_weight_store.transfer.PreparedTransfer`
  for each of its executing ranks (``mode="sink"``: the sources push;
  ``mode="reader"``: the targets pull); :meth:`LiveTransfer.step` /
  :meth:`LiveTransfer.step_notified` move one weight generation.

Across processes: each side gathers itself with its exchange; the other side gets
it as :meth:`LiveStateDict.to_json` (every rank's boxes and buffer addresses,
shipped by any channel) and rebuilds it with :meth:`LiveStateDict.from_json`; the
side whose memory the other's engine reads or writes registers it with its own
engine (:meth:`LiveStateDict.register`). Bindings name each rank's transfer-engine
``endpoint`` (e.g. :attr:`MooncakeTransferEngine.segment
<mooncake_weight_store.te_backend.MooncakeTransferEngine.segment>`).

The placement's weight generation is a layout identity (both sides name the same,
default 0): each step names the weight generation it moves. The tensors are
transferred where they are: a trainer updates them in place (optimizer steps,
``param.copy_``); one that reallocates them (``model.to``, a new ``param.data``)
must describe its side and prepare again, or the old memory is what moves.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .binding import Binding, MemoryKind
from .errors import ArgumentError, MwsError
from .exchange import Exchange, LocalExchange
from .guard import Guard
from .load import PlanningLimits
from .placement import Placement
from .state_dict import (DEFAULT_FINGERPRINT, Parallel, Sharding, StateDictError, _bind, _build_placement,
                         _check_infos, _gather_infos, _rank_info, _release, _views)
from .tensors import TensorView
from .transfer import (LeaseRotation, LiveReport, Loader, PreparedTransfer, Sink, TransferEngine, TransferPlan,
                       TransferStats)

__all__ = ["LiveStateDict", "live_state_dict", "plan_live_transfer", "prepare_live_transfer", "LiveTransfer",
           "LiveStepReport", "LIVE_FORMAT", "SIDES", "MODES"]

#: The ``format`` of :meth:`LiveStateDict.to_json`.
LIVE_FORMAT = "mws-live-state-dict/1"
#: What a side of a live transfer is: ``"source"`` (read) or ``"target"`` (written).
SIDES = ("source", "target")
#: Who executes a prepared live transfer: ``"sink"`` (the sources push) or
#: ``"reader"`` (the targets pull).
MODES = ("sink", "reader")


def _side_name(side: str) -> str:
    return {"source": "source (trainer)", "target": "target (server)"}[side]


class LiveStateDict:
    """One side of a live transfer, described from state dicts
    (:func:`live_state_dict`) or received from another process (:meth:`from_json`).

    ``placement``: the side's placement (every rank's boxes, no address);
    ``bindings``: every rank's binding, sorted by participant id; ``local``: the
    bindings of the ranks whose tensors this process holds (empty for a side
    received with :meth:`from_json`).

    Ownership: the bindings are this object's. A local binding holds its tensors'
    memory (their DLPack or buffer exports) until it is freed: :meth:`close` (or
    ``with``) frees the bindings, and a binding still lent to a bound plan or a
    prepared transfer is freed (and lets its tensors go) after them. The tensors must
    stay where they are (updated in place) for as long as a plan prepared from this
    object is used. Thread safety: read-only after construction; do not close it
    while another thread uses it.
    """

    def __init__(self, side: str, placement: Placement, infos: Sequence[Mapping[str, Any]],
                 bindings: Sequence[Binding], local: Sequence[str], lease_id: str, placement_set_id: str) -> None:
        """Internal: use :func:`live_state_dict` or :meth:`from_json`."""
        self.side = side
        self.placement = placement
        self.lease_id = lease_id
        self.placement_set_id = placement_set_id
        self._infos = [dict(i) for i in infos]
        self.bindings: Tuple[Binding, ...] = tuple(bindings)
        mine = set(local)
        self.local: Tuple[Binding, ...] = tuple(b for b in self.bindings if b.participant_id in mine)
        self._registered: List[Tuple[TransferEngine, List[int]]] = []

    # -- reading --------------------------------------------------------------------------

    @property
    def participant_ids(self) -> List[str]:
        """Every rank's participant id (``rank-d<dp>-p<pp>-e<ep>-t<tp>``), sorted."""
        return [b.participant_id for b in self.bindings]

    def binding(self, rank: Union[Parallel, str]) -> Binding:
        """The binding of one rank (a :class:`Parallel` or a participant id); raises
        :class:`StateDictError` for a rank this side does not have."""
        pid = rank.participant_id if isinstance(rank, Parallel) else str(rank)
        for b in self.bindings:
            if b.participant_id == pid:
                return b
        raise StateDictError(f"the {_side_name(self.side)} has no rank {pid} (its ranks: "
                             f"{', '.join(self.participant_ids)})")

    def tensors(self) -> Dict[str, Dict[str, Any]]:
        """Per tensor name, what both sides of a transfer must agree on: ``dtype``,
        ``global_shape``, ``fingerprint``, ``layer_id``, ``expert_id`` (and, for
        messages, ``rank``, ``offset`` and ``local_shape`` of the first rank that holds
        it)."""
        out: Dict[str, Dict[str, Any]] = {}
        for info in self._infos:
            for e in info["tensors"]:
                out.setdefault(e["name"], {"dtype": e["dtype"], "global_shape": list(e["global_shape"]),
                                           "fingerprint": e["fingerprint"], "layer_id": e["layer_id"],
                                           "expert_id": e["expert_id"], "rank": info["participant_id"],
                                           "offset": list(e["offset"]), "local_shape": list(e["local_shape"])})
        return out

    # -- shipping -------------------------------------------------------------------------

    def to_json(self) -> str:
        """This side as JSON for the other side's processes: identity, every rank's
        boxes, instance, endpoint and buffer addresses (no tensor data). Addresses
        are only meaningful to a transfer engine that reaches this process."""
        p = self.placement
        return json.dumps({"format": LIVE_FORMAT, "side": self.side, "resource_id": p.resource_id,
                           "revision": p.revision, "weight_generation": p.weight_generation,
                           "placement_set_id": self.placement_set_id, "lease_id": self.lease_id,
                           "placement_digest": p.digest, "ranks": self._infos})

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "LiveStateDict":
        """A side described by :meth:`to_json` in another process: its placement
        (rebuilt, and checked to be the sender's by digest) and every rank's binding
        to the sender's addresses; ``local`` is empty. Raises :class:`StateDictError`
        for text that is not such a description. The result owns its bindings
        (:meth:`close`)."""
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("format") != LIVE_FORMAT:
                raise ValueError(f"format is not {LIVE_FORMAT!r}")
            side, infos = doc["side"], doc["ranks"]
            if side not in SIDES or not isinstance(infos, list) or not infos:
                raise ValueError("no side or no ranks")
            ident = (str(doc["resource_id"]), str(doc["revision"]), int(doc["weight_generation"]))
            set_id, lease_id, digest = str(doc["placement_set_id"]), str(doc["lease_id"]), doc["placement_digest"]
        except (ValueError, TypeError, KeyError) as e:
            raise StateDictError(f"not a live state dict description ({LIVE_FORMAT}): {type(e).__name__}: {e}") from e
        try:
            placement = _build_placement(*ident, infos[0]["sizes"], infos, set_id)
            if placement.digest != digest:
                raise StateDictError(f"the rebuilt placement has digest {placement.digest}, the sender's {digest}: "
                                     "both processes must run the same mooncake_weight_store version")
            bindings = _bind_all(placement, infos, lease_id, {})
        except MwsError:
            raise
        except (ValueError, TypeError, KeyError) as e:
            raise StateDictError(f"not a live state dict description ({LIVE_FORMAT}): a rank is malformed: "
                                 f"{type(e).__name__}: {e}") from e
        return cls(side, placement, infos, bindings, (), lease_id, set_id)

    # -- engine registration ----------------------------------------------------------------

    def register(self, engine: TransferEngine) -> None:
        """Registers the memory of this process's tensors of this side with
        ``engine``, as their owner (overlapping tensors once), until
        :meth:`unregister` or :meth:`close`: the side that another process's engine
        writes (a sink's targets) or reads (a reader's sources) does so before the
        other side runs. :func:`prepare_live_transfer` registers what it needs itself
        unless told ``pre_registered=True``. Raises :class:`StateDictError` naming the
        range (its ``status`` and ``__cause__`` the engine's: memory registered
        already, device memory on an embedded engine without a device engine);
        nothing stays registered then. Not concurrently with other calls on this
        object."""
        self._registered.append((engine, _register(engine, _ranges(self._infos, self._local_ids()))))

    def unregister(self, engine: Optional[TransferEngine] = None) -> None:
        """Undoes :meth:`register` (with ``engine``, or with every engine); raises the
        engine's first failure once every registration was tried. Not concurrently
        with other calls on this object."""
        keep: List[Tuple[TransferEngine, List[int]]] = []
        first: Optional[BaseException] = None
        for e, addresses in self._registered:
            if engine is not None and e is not engine:
                keep.append((e, addresses))
                continue
            err = _unregister(e, addresses)
            first = first or err
        self._registered = keep
        if first is not None:
            raise first

    def _local_ids(self) -> List[str]:
        return [b.participant_id for b in self.local]

    def close(self) -> None:
        """Undoes :meth:`register` (close the transfers that rely on it first) and
        frees the bindings (see the class for when the tensors are let go).
        Idempotent."""
        try:
            self.unregister()
        finally:
            for b in self.bindings:
                b.close()

    def __enter__(self) -> "LiveStateDict":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        p = self.placement
        return (f"LiveStateDict({self.side}, {p.resource_id!r} rev {p.revision!r}, {len(self.bindings)} ranks, "
                f"{len(self.local)} local)")


def _bind_all(placement: Placement, infos: Sequence[Mapping[str, Any]], lease_id: str,
              views: Mapping[str, Mapping[str, TensorView]]) -> List[Binding]:
    """Every rank's binding; a rank with ``views`` (held here) gets them held by its
    binding. On failure nothing stays bound (the views are the caller's to release)."""
    out: List[Binding] = []
    try:
        for info in infos:
            out.append(_bind(placement, info, lease_id))
    except BaseException:
        for b in out:
            b.close()
        raise
    for b in out:
        for v in views.get(b.participant_id, {}).values():
            b._hold(v)
    return out


def live_state_dict(
    state_dict: Optional[Mapping[str, Any]] = None,
    *,
    side: str,
    resource_id: str,
    sharding: Sharding = None,
    parallel: Optional[Parallel] = None,
    exchange: Optional[Exchange] = None,
    ranks: Optional[Mapping[Parallel, Mapping[str, Any]]] = None,
    revision: str = "live",
    weight_generation: int = 0,
    placement_set_id: Optional[str] = None,
    instance_id: Optional[str] = None,
    endpoint: Optional[str] = None,
    lease_id: str = "live",
    fingerprint: str = DEFAULT_FINGERPRINT,
    fingerprints: Optional[Mapping[str, str]] = None,
) -> LiveStateDict:
    """One side of a live transfer from this rank's ``state_dict`` (name -> tensor:
    torch, numpy, anything :func:`~mooncake_weight_store.tensors.tensor_view`
    accepts, host or CUDA) under ``sharding`` and ``parallel`` (the terms of
    :func:`save_state_dict`): its placement and every rank's binding.

    ``side="source"``: the trainer's tensors (read); ``side="target"``: the server's
    preallocated tensors (written; they must be writable). Both sides of one
    transfer name the same ``resource_id``, ``revision`` and ``weight_generation``
    (a layout identity: steps name the generation they move).

    Ranks: a layout of one rank needs nothing more. With several, either every rank
    calls this collectively with its own ``state_dict``/``parallel`` and an
    ``exchange`` spanning the side's ranks (the descriptions, with buffer addresses,
    are all-gathered; a failure on any rank raises on every rank, naming it), or one
    process passes ``ranks={Parallel(...): state_dict, ...}`` holding every rank (then
    no ``state_dict``/``parallel``/``exchange``). ``instance_id``: this process's
    incarnation (each rank's binding is instance ``<instance_id>/<participant id>``;
    default a fresh random one, so a restarted process is a new instance).
    ``endpoint``: this process's transfer-engine endpoint, written into its ranks'
    bindings (default ``"localhost:0"``, in-process engines). ``fingerprint`` /
    ``fingerprints`` as for :func:`save_state_dict` (both sides must agree).

    Ownership: the tensors are borrowed, not copied: the result holds their memory
    (see :class:`LiveStateDict`) until it is closed and every plan and prepared
    transfer made from it is closed; update them in place. Raises, before anything
    is bound: :class:`StateDictError` (not a mapping, empty, a zero-size tensor,
    a split that does not fit, ranks that disagree or are missing, an exchange whose
    size is not the layout's), :class:`~mooncake_weight_store.NonContiguousError`,
    :class:`~mooncake_weight_store.TensorError` (a read-only target),
    :class:`~mooncake_weight_store.UnsupportedDTypeError`, ``ArgumentError`` (a bad
    ``side``, conflicting arguments). Thread safety: independent calls may run
    concurrently; the tensors are not touched.
    """
    if side not in SIDES:
        raise ArgumentError(f"side must be one of {SIDES}, not {side!r}")
    set_id = placement_set_id or f"live-{side}"
    prefix = instance_id or f"{side}-{uuid.uuid4().hex[:16]}"
    views: Dict[str, Dict[str, TensorView]] = {}
    sources: Dict[str, Mapping[str, Any]] = {}

    def empty() -> str:
        return (f"the {_side_name(side)} state dict is empty: nothing to transfer for {resource_id!r} (a live "
                "transfer moves at least one tensor)")

    def describe(sd: Mapping[str, Any], par: Parallel) -> Dict[str, Any]:
        if not isinstance(sd, Mapping):
            raise StateDictError(f"the state dict of {par.participant_id} must be a mapping of tensor names to "
                                 f"tensors, not {type(sd).__name__}")
        pid = par.participant_id
        sources[pid] = sd
        views[pid] = _views(sd, writable=side == "target")
        return _rank_info(sd, views[pid], sharding, par, fingerprint, fingerprints, f"{prefix}/{pid}", endpoint)

    try:
        if ranks is not None:
            if state_dict is not None or parallel is not None or exchange is not None:
                raise ArgumentError("ranks= holds every rank's state dict: pass no state_dict, parallel or exchange")
            if not isinstance(ranks, Mapping) or not ranks:
                raise ArgumentError("ranks must be a non-empty mapping of Parallel to state dicts")
            for par in ranks:
                if not isinstance(par, Parallel):
                    raise ArgumentError(f"ranks keys must be Parallel, not {type(par).__name__}")
            infos = _check_infos([describe(sd, par) for par, sd in ranks.items()], empty)
            world = next(iter(ranks)).world_size
            if len(infos) != world:
                held = {i["participant_id"] for i in infos}
                grid = _grid(next(iter(ranks)))
                raise StateDictError(f"ranks= holds {len(infos)} of the {world} ranks of the {_side_name(side)} "
                                     f"layout; missing: {', '.join(p for p in grid if p not in held)} (pass every "
                                     "rank, or call live_state_dict on every rank with an exchange)")
        else:
            if state_dict is None:
                raise ArgumentError("pass state_dict (this rank's tensors) or ranks= (every rank's)")
            par = parallel or Parallel()
            ex = exchange or LocalExchange()
            if par.world_size != ex.world_size:
                raise StateDictError(
                    f"the parallel sizes give {par.world_size} ranks, the exchange has {ex.world_size}: a live "
                    f"transfer needs every rank's boxes and buffer addresses; pass an exchange spanning every rank "
                    f"of the {_side_name(side)} (each calls live_state_dict), or ranks= with every rank's state "
                    "dict (one process)")
            infos = _gather_infos(ex, lambda: describe(state_dict, par), "describing the live state dict", empty)
        placement = _build_placement(resource_id, revision, weight_generation, infos[0]["sizes"], infos, set_id)
        # A caller's own TensorView stays the caller's: the bindings hold the views made here.
        made = {pid: {n: v for n, v in vs.items() if sources[pid].get(n) is not v} for pid, vs in views.items()}
        bindings = _bind_all(placement, infos, lease_id, made)
    except BaseException:
        for pid, vs in views.items():
            _release(vs, sources.get(pid))
        raise
    return LiveStateDict(side, placement, infos, bindings, list(views), lease_id, set_id)


def _grid(par: Parallel) -> List[str]:
    return [Parallel(tp_rank=t, tp_size=par.tp_size, pp_rank=p, pp_size=par.pp_size, ep_rank=e, ep_size=par.ep_size,
                     dp_rank=d, dp_size=par.dp_size).participant_id
            for d in range(par.dp_size) for p in range(par.pp_size) for e in range(par.ep_size)
            for t in range(par.tp_size)]


# --------------------------------------------------------------------------- the pair


def _names(names: Sequence[str]) -> str:
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _check_pair(source: LiveStateDict, target: LiveStateDict) -> None:
    """Refuses, naming both sides, a pair that cannot be one transfer."""
    for obj, want in ((source, "source"), (target, "target")):
        if not isinstance(obj, LiveStateDict):
            raise ArgumentError(f"{want} must be a LiveStateDict (live_state_dict(..., side={want!r})), "
                                f"not {type(obj).__name__}")
        if obj.side != want:
            raise ArgumentError(f"the {want} argument is a LiveStateDict of side {obj.side!r}, not {want!r}")
    sp, tp = source.placement, target.placement
    ids = [(sp.resource_id, tp.resource_id, "resource_id"), (sp.revision, tp.revision, "revision"),
           (sp.weight_generation, tp.weight_generation, "weight_generation")]
    bad = [f"{what} {s!r} vs {t!r}" for s, t, what in ids if s != t]
    if bad:
        raise StateDictError("the source and the target name different layouts (" + "; ".join(bad) + "): both sides "
                             "of a live transfer pass the same resource_id, revision and weight_generation")
    st, tt = source.tensors(), target.tensors()
    problems = []
    missing = sorted(set(st) - set(tt))
    unknown = sorted(set(tt) - set(st))
    if missing:
        problems.append(f"in the source (trainer) but not in the target (server): {_names(missing)}")
    if unknown:
        problems.append(f"in the target (server) but not in the source (trainer): {_names(unknown)}")
    for n in sorted(set(st) & set(tt)):
        s, t = st[n], tt[n]
        if s["dtype"] != t["dtype"]:
            problems.append(f"tensor {n!r}: source dtype {s['dtype']}, target dtype {t['dtype']} (bytes are "
                            "copied as they are: convert on one side)")
        elif s["global_shape"] != t["global_shape"]:
            problems.append(f"tensor {n!r}: source global shape {s['global_shape']} ({s['rank']} holds "
                            f"{s['local_shape']} at {s['offset']}), target global shape {t['global_shape']} "
                            f"({t['rank']} holds {t['local_shape']} at {t['offset']}): check both sides' sharding "
                            "and parallel sizes")
        else:
            for k in ("fingerprint", "layer_id", "expert_id"):
                if s[k] != t[k]:
                    problems.append(f"tensor {n!r}: source {k} {s[k]!r}, target {k} {t[k]!r}")
    if problems:
        raise StateDictError("the source and the target do not hold the same tensors: " + "; ".join(problems[:12]) +
                             (f" (and {len(problems) - 12} more)" if len(problems) > 12 else ""))


def plan_live_transfer(source: LiveStateDict, target: LiveStateDict, *, limits: Optional[PlanningLimits] = None,
                       source_routing: str = "target_dp") -> TransferPlan:
    """The transfer plan from ``source``'s layout to ``target``'s, bound to both
    sides' bindings (every rank's): what a sink or a reader prepares, and what a
    :class:`~mooncake_weight_store.NotifyAcceptor` checks notifications against.

    Checks first, naming both sides (:class:`StateDictError`): the same identity,
    the same tensor names, and per tensor the same dtype, global shape, fingerprint,
    layer and expert; ``ArgumentError`` for arguments that are not a source and a
    target :class:`LiveStateDict`. Then the library plans (``limits``,
    ``source_routing`` as :meth:`TransferPlan.plan`) and binds (its
    :class:`MwsError` on failure). Pure: no I/O. The plan borrows the bindings
    (they stay held until it is closed); close it (or ``with``). Thread-safe."""
    _check_pair(source, target)
    logical = TransferPlan.plan(source.placement, target.placement, limits=limits, source_routing=source_routing)
    try:
        return logical.bind(list(target.bindings), list(source.bindings))
    finally:
        logical.close()


# --------------------------------------------------------------------------- registration


def _ranges(infos: Sequence[Mapping[str, Any]], pids: Sequence[str]) -> List[Tuple[int, int, int, int]]:
    """The memory of the tensors of ranks ``pids``: ``(address, nbytes, memory kind,
    device ordinal)``, overlapping ranges (aliases, a tensor shared by two ranks)
    merged."""
    spans: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}
    for info in infos:
        if info["participant_id"] in pids:
            for e in info["tensors"]:
                spans.setdefault((int(e["memory_kind"]), int(e["device_ordinal"])), []).append(
                    (int(e["address"]), int(e["address"]) + int(e["nbytes"])))
    out = []
    for (kind, ordinal), items in sorted(spans.items()):
        items.sort()
        start, end = items[0]
        for a, b in items[1:]:
            if a < end:
                end = max(end, b)
            else:
                out.append((start, end - start, kind, ordinal))
                start, end = a, b
        out.append((start, end - start, kind, ordinal))
    return out


def _register(engine: TransferEngine, ranges: Sequence[Tuple[int, int, int, int]], hint: str = "") -> List[int]:
    """Registers ``ranges``; on failure unregisters what it registered, then raises
    (a library refusal as :class:`StateDictError` naming the range, with its status)."""
    done: List[int] = []
    try:
        for address, nbytes, kind, ordinal in ranges:
            try:
                engine.register_memory(address, nbytes, MemoryKind(kind), ordinal)
            except MwsError as e:
                where = "host memory" if kind == MemoryKind.HOST else f"device memory (cuda:{ordinal})"
                raise StateDictError(f"registering the tensors' {where} [{address:#x}, +{nbytes}) with the transfer "
                                     f"engine failed: {e}{hint}", status=e.status) from e
            done.append(address)
    except BaseException:
        _unregister(engine, done)
        raise
    return done


def _unregister(engine: TransferEngine, addresses: Sequence[int]) -> Optional[BaseException]:
    """Unregisters every address; returns the first failure (the others are still
    attempted)."""
    first: Optional[BaseException] = None
    for a in addresses:
        try:
            engine.unregister_memory(a)
        except MwsError as e:
            first = first or e
    return first


# --------------------------------------------------------------------------- prepared


def _add_stats(parts: Sequence[TransferStats]) -> TransferStats:
    return TransferStats(*(sum(getattr(s, f) for s in parts)
                           for f in ("bytes", "regions", "operations", "receipts", "engine_operations")))


@dataclass(frozen=True)
class LiveStepReport:
    """What one :meth:`LiveTransfer.step` did in this process: the weight generation
    it moved, the report of each prepared transfer (one per executing local rank,
    in :attr:`LiveTransfer.prepared` order) and their summed statistics."""

    weight_generation: int
    reports: Tuple[LiveReport, ...]
    stats: TransferStats

    def verdicts(self) -> Dict[str, str]:
        """``{target participant: verdict}`` over this process's prepared transfers:
        ``"updated"`` when every one that writes it says so, ``"unchanged"`` when
        none wrote, else ``"torn"``. A target written by other processes too is
        updated once all of them say so (notify: :meth:`LiveTransfer.step_notified`)."""
        seen: Dict[str, List[str]] = {}
        for r in self.reports:
            for t in r.targets:
                seen.setdefault(t.participant_id, []).append(t.verdict)
        return {p: vs[0] if len(set(vs)) == 1 and vs[0] in ("updated", "unchanged") else "torn"
                for p, vs in sorted(seen.items())}

    @property
    def updated(self) -> bool:
        """Every target this process's transfers write is ``"updated"`` to
        :attr:`weight_generation`."""
        return all(t.verdict == "updated" and t.weight_generation == self.weight_generation
                   for r in self.reports for t in r.targets)


class LiveTransfer:
    """A live transfer between two :class:`LiveStateDict` sides, prepared once in
    this process (:func:`prepare_live_transfer`): ``plan`` (bound),
    ``prepared`` (one :class:`~mooncake_weight_store.PreparedTransfer` per executing
    local rank: the sources' in sink mode, the targets' in reader mode).

    Ownership: holds the plan, the prepared transfers, the sink or loader, and the
    engine registrations it made; :meth:`close` (or ``with``) releases them (not the
    sides, which are the caller's and must stay open until then). Thread safety:
    steps run one at a time (a lock); the engine runs one call at a time, so two
    transfers on one engine step in turn."""

    def __init__(self, source: LiveStateDict, target: LiveStateDict, engine: TransferEngine, mode: str,
                 plan: TransferPlan, front: Union[Sink, Loader], prepared: Sequence[PreparedTransfer],
                 lease_keys: Sequence[frozenset], registered: List[int]) -> None:
        """Internal: use :func:`prepare_live_transfer`."""
        self.source, self.target, self.engine, self.mode = source, target, engine, mode
        self.plan = plan
        self.prepared: Tuple[PreparedTransfer, ...] = tuple(prepared)
        self._front = front
        self._lease_keys = list(lease_keys)
        self._registered = registered
        self._lock = threading.Lock()
        self._closed = False

    def step(self, weight_generation: int, *, leases: Sequence[LeaseRotation] = (),
             transfer_id: Optional[str] = None) -> LiveStepReport:
        """Moves weight generation ``weight_generation``: every prepared transfer's
        :meth:`~mooncake_weight_store.PreparedTransfer.step`, in order. ``leases``:
        rotations since the last step (each handed to the prepared transfers holding
        that binding; one naming no binding here raises ``ArgumentError`` before any
        byte moves). Raises the first failing step's :class:`MwsError` (its
        ``.report`` attached; the transfers before it in :attr:`prepared` moved their
        share: their targets are updated, the failing one's are as its report says,
        the later ones' unchanged); stale prepared state is
        :class:`~mooncake_weight_store.StaleBindingError` ("prepare the transfer
        again") before its bytes."""
        return self._step(weight_generation, leases, lambda p, ls: p.step(weight_generation, leases=ls,
                                                                           transfer_id=transfer_id))

    def step_notified(self, weight_generation: int, *, key: Optional[bytes] = None, verify_content: bool = False,
                      leases: Sequence[LeaseRotation] = (), transfer_id: Optional[str] = None) -> LiveStepReport:
        """:meth:`step` with the notify hook
        (:meth:`~mooncake_weight_store.PreparedTransfer.step_notified`: ``key``,
        ``verify_content``); sink mode only (``ArgumentError`` in reader mode)."""
        if self.mode != "sink":
            raise ArgumentError("step_notified is for mode='sink' (a reader's step notifies no one: its report is "
                                "its targets' outcome)")
        return self._step(weight_generation, leases,
                          lambda p, ls: p.step_notified(weight_generation, key=key, verify_content=verify_content,
                                                        leases=ls, transfer_id=transfer_id))

    def _step(self, weight_generation: int, leases: Sequence[LeaseRotation],
              run: Callable[[PreparedTransfer, Sequence[LeaseRotation]], TransferStats]) -> LiveStepReport:
        if isinstance(weight_generation, bool) or not isinstance(weight_generation, int) or weight_generation < 0:
            raise ArgumentError(f"weight_generation must be a non-negative int, not {weight_generation!r}")
        known = frozenset().union(*self._lease_keys) if self._lease_keys else frozenset()
        for r in leases:
            if (r.instance_id, r.participant_id) not in known:
                raise ArgumentError(f"lease rotation names no binding of this transfer: ({r.instance_id}, "
                                    f"{r.participant_id})")
        with self._lock:
            if self._closed:
                raise ArgumentError("live transfer is closed")
            stats, reports = [], []
            for p, keys in zip(self.prepared, self._lease_keys):
                stats.append(run(p, [r for r in leases if (r.instance_id, r.participant_id) in keys]))
                report = p.last_report()
                if report is not None:
                    reports.append(report)
            return LiveStepReport(weight_generation, tuple(reports), _add_stats(stats))

    def close(self) -> None:
        """Closes the prepared transfers (unregistering what they registered), the
        sink or loader and the plan, then unregisters this transfer's registrations;
        raises the first failure once all were attempted. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        first = _close_all([*self.prepared, self._front, self.plan])
        err = _unregister(self.engine, self._registered)
        first = first or err
        if first is not None:
            raise first

    def __enter__(self) -> "LiveTransfer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _close_all(objs: Sequence[Any]) -> Optional[BaseException]:
    first: Optional[BaseException] = None
    for o in objs:
        try:
            o.close()
        except MwsError as e:
            first = first or e
    return first


def prepare_live_transfer(
    source: LiveStateDict,
    target: LiveStateDict,
    engine: TransferEngine,
    *,
    mode: str = "sink",
    limits: Optional[PlanningLimits] = None,
    source_routing: str = "target_dp",
    pre_registered: bool = False,
    guard: Optional[Guard] = None,
    worker_id: Optional[str] = None,
    transfer_id: Optional[str] = None,
    coalesce: bool = True,
) -> LiveTransfer:
    """Plans ``source`` -> ``target`` (:func:`plan_live_transfer`), registers this
    process's tensors of both sides with ``engine`` (their memory once, as its
    owner; skipped with ``pre_registered=True``, when the caller registered them,
    e.g. with :meth:`LiveStateDict.register`) and prepares one transfer per
    executing local rank: ``mode="sink"`` (:meth:`Sink.prepare` for each of
    ``source.local``: the sources push into every target) or ``mode="reader"``
    (:meth:`Loader.prepare_live` for each of ``target.local``: the targets pull).
    Then :meth:`LiveTransfer.step` per weight generation.

    In one process holding both sides everything is here. Across processes, the
    other side is a :meth:`LiveStateDict.from_json` and registers its own memory
    with its own engine (:meth:`LiveStateDict.register`) before the first step.

    ``limits``, ``source_routing``: as :meth:`TransferPlan.plan`; ``guard``,
    ``worker_id``, ``transfer_id``: as :meth:`Sink.prepare`; ``coalesce``: as
    :class:`Sink`. Raises, with nothing left registered or prepared:
    :class:`StateDictError` (the sides do not match, see
    :func:`plan_live_transfer`; this process holds no executing rank; device tensors
    on an embedded engine without a device engine), ``ArgumentError`` (a bad
    ``mode``), the library's :class:`MwsError` (planning, binding, registration,
    preparation). Ownership: the result borrows ``source``, ``target`` and
    ``engine`` (keep them open until it is closed). Thread safety: as
    :class:`LiveTransfer`.
    """
    if mode not in MODES:
        raise ArgumentError(f"mode must be one of {MODES}, not {mode!r}")
    plan = plan_live_transfer(source, target, limits=limits, source_routing=source_routing)
    registered: List[int] = []
    front: Optional[Union[Sink, Loader]] = None
    prepared: List[PreparedTransfer] = []
    try:
        executing = source.local if mode == "sink" else target.local
        if not executing:
            who = "source (trainer)" if mode == "sink" else "target (server)"
            raise StateDictError(f"this process holds no rank of the {who}, which executes mode={mode!r}; prepare it "
                                 f"where those tensors are (or use mode={'reader' if mode == 'sink' else 'sink'!r})")
        local = [(s, b.participant_id) for s in (source, target) for b in s.local]
        if engine.backend is None and engine.device_engine is None:
            dev = [e for s, pid in local for i in s._infos if i["participant_id"] == pid for e in i["tensors"]
                   if int(e["memory_kind"]) != int(MemoryKind.HOST)]
            if dev:
                raise StateDictError(
                    f"{len(dev)} tensor(s) are in device memory (e.g. {dev[0]['name']!r} on cuda:"
                    f"{dev[0]['device_ordinal']}) and this embedded transfer engine has no device engine: make it "
                    "with TransferEngine.local(device_engine=mooncake_weight_store.DeviceEngine.for_torch()) (or "
                    "move the tensors to the CPU)")
        if not pre_registered:
            for s in (source, target):
                registered += _register(engine, _ranges(s._infos, s._local_ids()),
                                        " (memory registered already, e.g. by LiveStateDict.register, is passed with "
                                        "pre_registered=True)")
        keys: List[frozenset] = []
        if mode == "sink":
            front = Sink(engine, coalesce=coalesce)
            for b in executing:
                prepared.append(front.prepare(plan, source.placement, b, target.placement, list(target.bindings),
                                              local_pre_registered=True, worker_id=worker_id, transfer_id=transfer_id,
                                              guard=guard))
                keys.append(frozenset((x.instance_id, x.participant_id) for x in (b, *target.bindings)))
        else:
            front = Loader(engine, coalesce=coalesce)
            for b in executing:
                prepared.append(front.prepare_live(plan, source.placement, list(source.bindings), target.placement, b,
                                                   local_pre_registered=True, worker_id=worker_id,
                                                   transfer_id=transfer_id, guard=guard))
                keys.append(frozenset((x.instance_id, x.participant_id) for x in (b, *source.bindings)))
    except BaseException:
        _close_all([*prepared, *([front] if front is not None else []), plan])
        _unregister(engine, registered)
        raise
    return LiveTransfer(source, target, engine, mode, plan, front, prepared, keys, registered)
