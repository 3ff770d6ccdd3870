"""state_dict in, state_dict out: save a trainer's (sharded) state dict as one weight
revision, and load any revision into the shards another parallel layout needs.

Each rank describes how its tensors relate to the global ones in trainer terms:

* :class:`Parallel`: this rank's coordinates and sizes (``tp_rank``/``tp_size``,
  ``pp_*``, ``ep_*``, ``dp_*``);
* ``sharding``: per tensor name a :class:`Shard` (or shorthand): ``None``/``"replicated"``
  (every TP rank holds the whole tensor), an ``int`` or ``split(dim)`` (TP ranks
  partition dimension ``dim``; ``"colwise"`` = 0, ``"rowwise"`` = 1 for ``[out, in]``
  linear weights), ``Shard(ep_dim=0)`` (stacked experts split over EP),
  ``Shard(expert_id=e)`` (a whole per-expert tensor owned by this EP rank), with
  optional ``layer_id`` and, for uneven splits, explicit ``global_shape``/``offset``.
  A mapping may use ``fnmatch`` patterns (``"*.q_proj.weight": 0``); a callable
  ``sharding(name, tensor)`` works too. Unnamed tensors are replicated.

Pipeline stages own the tensors they hold (``OwnershipAxis("pp")``), DP ranks are
replicas (``ReplicatedAxis("dp")``); the placement is built with
:class:`~mooncake_weight_store.placement.PlacementBuilder` and validated by the
library. Tensors sharing memory (tied embeddings) are declared as aliases.

Multi-rank saves go through an :class:`~mooncake_weight_store.exchange.Exchange`:
the ranks gather their tensor boxes and buffer addresses, rank 0 plans the upload and
broadcasts the plan, every rank uploads its own participant, rank 0 gathers the
receipts and commits (or aborts on any failure) and broadcasts the manifest. Loads
need no exchange when the layout is symmetric (every TP/EP peer's boxes follow from
this rank's); pass one for uneven boxes.
"""

from __future__ import annotations

import fnmatch
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, cast

from .binding import Binding, MemoryKind
from .errors import ArgumentError, LocalError, MwsError, NotFoundError, Status
from .exchange import Exchange, LocalExchange
from .load import LoadPlan, LoadStats
from .manifest import StoredManifest
from .placement import Ownership, Placement, PlacementBuilder, Rank, Replicated, Split, TensorSpec
from .receipts import Receipts
from .revisions import DEFAULT_NAMESPACE, RevisionInfo
from .tensors import DTYPES, TensorView, tensor_view
from .upload_plan import UploadPlan

__all__ = [
    "Parallel",
    "Shard",
    "split",
    "REPLICATED",
    "COLWISE",
    "ROWWISE",
    "resolve_shard",
    "save_state_dict",
    "load_state_dict",
    "StateDictError",
    "DEFAULT_FINGERPRINT",
    "LATEST",
    "RevisionKey",
]

DEFAULT_FINGERPRINT = "mws:state-dict:v1"
#: Appended to the layout fingerprint of a 0-d tensor: a placement shape has at least
#: one dimension, so a scalar is stored as shape ``(1,)`` and restored as ``()``.
SCALAR_SUFFIX = ":0d"


#: ``key`` of :func:`load_state_dict` (and ``export_safetensors``) that names the
#: newest committed revision of ``resource_id`` (:meth:`Store.latest`). No manifest
#: key can be ``"latest"`` (they all end in ``/manifest``).
LATEST = "latest"

#: What names a revision to load: a manifest key, :data:`LATEST` (with
#: ``resource_id=``), a :class:`~mooncake_weight_store.revisions.RevisionInfo` (from
#: :meth:`Store.revisions` / :meth:`Store.latest`) or an open
#: :class:`~mooncake_weight_store.manifest.StoredManifest`.
RevisionKey = Union[str, RevisionInfo, StoredManifest]


#: The layout fingerprints of tensors that hold metadata, not weights (the
#: checkpoint metadata ``import_safetensors`` keeps): ``load_state_dict`` leaves them
#: out unless they are named.
METADATA_FINGERPRINT_PREFIX = "mws:metadata:"


def is_scalar(stored: Mapping[str, Any]) -> bool:
    """True for a stored tensor (a manifest's wire tensor) that was saved from a 0-d
    tensor."""
    return str(stored.get("layout_fingerprint", "")).endswith(SCALAR_SUFFIX) and list(stored["global_shape"]) == [1]


class StateDictError(LocalError, ValueError):
    """A state dict, sharding or layout that cannot be saved or loaded as given (or a
    failure on another rank, whose message it carries)."""


# --------------------------------------------------------------------------- layout terms


@dataclass(frozen=True)
class Parallel:
    """This rank's parallel coordinates (``*_rank``) and group sizes (``*_size``)."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1

    def __post_init__(self) -> None:
        for k in ("tp", "pp", "ep", "dp"):
            r, s = getattr(self, f"{k}_rank"), getattr(self, f"{k}_size")
            for n, v in ((f"{k}_rank", r), (f"{k}_size", s)):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ArgumentError(f"{n} must be an int")
            if s < 1 or not 0 <= r < s:
                raise ArgumentError(f"{k}_rank {r} out of range for {k}_size {s}")

    @property
    def rank(self) -> Rank:
        return Rank(dp=self.dp_rank, pp=self.pp_rank, ep=self.ep_rank, tp=self.tp_rank)

    @property
    def sizes(self) -> Dict[str, int]:
        return {"tp": self.tp_size, "pp": self.pp_size, "ep": self.ep_size, "dp": self.dp_size}

    @property
    def participant_id(self) -> str:
        return f"rank-d{self.dp_rank}-p{self.pp_rank}-e{self.ep_rank}-t{self.tp_rank}"

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size * self.ep_size * self.dp_size


@dataclass(frozen=True)
class Shard:
    """How one rank's tensor relates to the global tensor (see the module doc).

    ``dim``: the dimension TP ranks partition (``None``: TP-replicated). ``ep_dim``:
    the (leading) expert dimension EP ranks partition. ``expert_id``: a whole
    per-expert tensor owned by this EP rank. ``global_shape``/``offset``: explicit
    geometry for uneven splits (default: even split, rank-major)."""

    dim: Optional[int] = None
    ep_dim: Optional[int] = None
    expert_id: Optional[int] = None
    layer_id: Optional[int] = None
    global_shape: Optional[Tuple[int, ...]] = None
    offset: Optional[Tuple[int, ...]] = None

    def __post_init__(self) -> None:
        for n in ("dim", "ep_dim", "expert_id", "layer_id"):
            v = getattr(self, n)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ArgumentError(f"Shard.{n} must be a non-negative int or None")
        if self.ep_dim not in (None, 0):
            raise ArgumentError("Shard.ep_dim must be 0: EP splits the leading (expert) dimension")
        if self.ep_dim is not None and self.expert_id is not None:
            raise ArgumentError("Shard: a per-expert tensor (expert_id) cannot also be split over EP (ep_dim)")
        if self.ep_dim is not None and self.dim == self.ep_dim:
            raise ArgumentError("Shard: TP and EP cannot split the same dimension")
        if self.global_shape is not None:
            object.__setattr__(self, "global_shape", tuple(int(x) for x in self.global_shape))
        if self.offset is not None:
            object.__setattr__(self, "offset", tuple(int(x) for x in self.offset))

    @property
    def uses_ep(self) -> bool:
        return self.ep_dim is not None or self.expert_id is not None


def split(dim: int, **kw: Any) -> Shard:
    """TP ranks partition dimension ``dim``."""
    return Shard(dim=dim, **kw)


REPLICATED = Shard()
COLWISE = Shard(dim=0)  # [out, in] linear weight split over its outputs (column parallel)
ROWWISE = Shard(dim=1)  # split over its inputs (row parallel)

ShardLike = Union[None, int, str, Shard]
Sharding = Union[None, Mapping[str, ShardLike], Callable[[str, Any], ShardLike]]
_NAMED = {"replicated": REPLICATED, "colwise": COLWISE, "rowwise": ROWWISE, "column": COLWISE, "row": ROWWISE}


def _as_shard(value: ShardLike, name: str) -> Shard:
    if value is None:
        return REPLICATED
    if isinstance(value, Shard):
        return value
    if isinstance(value, bool):
        raise ArgumentError(f"sharding for {name!r}: a bool is not a shard description")
    if isinstance(value, int):
        return Shard(dim=value)
    if isinstance(value, str):
        s = _NAMED.get(value.lower())
        if s is None:
            raise ArgumentError(f"sharding for {name!r}: unknown shorthand {value!r} (use {', '.join(_NAMED)})")
        return s
    raise ArgumentError(f"sharding for {name!r}: expected a Shard, an int dim, a shorthand string or None, "
                    f"not {type(value).__name__}")


def resolve_shard(sharding: Sharding, name: str, tensor: Any = None) -> Shard:
    """The :class:`Shard` of tensor ``name``: exact key, else the first matching
    ``fnmatch`` pattern (in mapping order), else replicated."""
    if sharding is None:
        return REPLICATED
    if callable(sharding) and not isinstance(sharding, Mapping):
        return _as_shard(sharding(name, tensor), name)
    if name in sharding:
        return _as_shard(sharding[name], name)
    for pattern, value in sharding.items():
        if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(name, pattern):
            return _as_shard(value, name)
    return REPLICATED


# --------------------------------------------------------------------------- geometry


def _split_dims(shard: Shard, sizes: Mapping[str, int]) -> List[Tuple[str, int]]:
    out = []
    if shard.dim is not None and sizes["tp"] > 1:
        out.append(("tp", shard.dim))
    if shard.ep_dim is not None and sizes["ep"] > 1:
        out.append(("ep", shard.ep_dim))
    return out


def _coords(rank: Rank) -> Dict[str, int]:
    return {"tp": rank.tp, "pp": rank.pp, "ep": rank.ep, "dp": rank.dp}


def _box_from_local(name: str, shard: Shard, local: Tuple[int, ...], sizes: Mapping[str, int],
                    rank: Rank) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(global_shape, offset) of this rank's ``local`` box (save side)."""
    for kind, d in _split_dims(shard, sizes):
        if d >= len(local):
            raise StateDictError(f"{name}: split dimension {d} out of range for shape {local}")
    if shard.global_shape is not None:
        glob = shard.global_shape
    else:
        g = list(local)
        for kind, d in _split_dims(shard, sizes):
            g[d] *= sizes[kind]
        glob = tuple(g)
    if shard.offset is not None:
        off = shard.offset
    else:
        o = [0] * len(local)
        c = _coords(rank)
        for kind, d in _split_dims(shard, sizes):
            o[d] = c[kind] * local[d]
        off = tuple(o)
    if len(glob) != len(local) or len(off) != len(local):
        raise StateDictError(f"{name}: global_shape {glob} / offset {off} do not match the rank of {local}")
    for d in range(len(local)):
        if off[d] < 0 or off[d] + local[d] > glob[d]:
            raise StateDictError(f"{name}: box offset {off} shape {local} exceeds global shape {glob}")
    return glob, off


def _box_from_global(name: str, shard: Shard, glob: Tuple[int, ...], sizes: Mapping[str, int],
                     rank: Rank) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(offset, local_shape) of ``rank``'s even-split box of a global tensor (load side)."""
    if shard.global_shape is not None and tuple(shard.global_shape) != glob:
        raise StateDictError(f"{name}: sharding says global shape {shard.global_shape}, stored is {glob}")
    local = list(glob)
    off = [0] * len(glob)
    c = _coords(rank)
    for kind, d in _split_dims(shard, sizes):
        if d >= len(glob):
            raise StateDictError(f"{name}: split dimension {d} out of range for shape {glob}")
        n = sizes[kind]
        if glob[d] % n:
            raise StateDictError(f"{name}: dimension {d} ({glob[d]}) is not divisible by {kind}_size={n}; "
                                 "give Shard(offset=...) and pass an exchange for uneven splits")
        local[d] = glob[d] // n
        off[d] = c[kind] * local[d]
    return tuple(off), tuple(local)


def _axes(shard: Shard, sizes: Mapping[str, int]) -> Tuple[Any, ...]:
    axes: List[Any] = []
    if sizes["dp"] > 1:
        axes.append(Replicated("dp"))
    if sizes["pp"] > 1:
        axes.append(Ownership("pp"))
    if sizes["ep"] > 1:
        if shard.ep_dim is not None:
            axes.append(Split("ep", shard.ep_dim))
        elif shard.expert_id is not None:
            axes.append(Ownership("ep"))
        else:
            axes.append(Replicated("ep"))
    if sizes["tp"] > 1:
        axes.append(Split("tp", shard.dim) if shard.dim is not None else Replicated("tp"))
    return tuple(axes)


def _axes_wire(axes: Sequence[Any]) -> List[Dict[str, Any]]:
    return [a.to_wire() for a in axes]


def _axes_from_wire(items: Sequence[Mapping[str, Any]]) -> Tuple[Any, ...]:
    out: List[Any] = []
    for a in items:
        if a["semantics"] == "split":
            out.append(Split(a["kind"], int(a["dim"])))
        elif a["semantics"] == "replicated":
            out.append(Replicated(a["kind"]))
        else:
            out.append(Ownership(a["kind"]))
    return tuple(out)


def _shape(view: TensorView) -> Tuple[int, ...]:
    """A placement shape: 0-d tensors are stored as shape (1,)."""
    return view.shape if view.shape else (1,)


def _aliases(views: Mapping[str, TensorView]) -> Dict[str, List[str]]:
    """Names sharing exactly the same memory (tied weights) -> their alias group."""
    groups: Dict[Tuple[Any, ...], List[str]] = {}
    for n, v in views.items():
        groups.setdefault((v.address, v.nbytes, int(v.memory_kind), v.device_ordinal, v.dtype, _shape(v)),
                          []).append(n)
    out: Dict[str, List[str]] = {}
    for names in groups.values():
        if len(names) > 1:
            for n in names:
                out[n] = sorted(names)
    return out


# --------------------------------------------------------------------------- placement + bindings


def _entry(name: str, view: TensorView, glob: Sequence[int], off: Sequence[int], local: Sequence[int],
           axes: Sequence[Any], shard: Shard, fingerprint: str, aliases: Sequence[str],
           dtype: Optional[str] = None, itemsize: Optional[int] = None,
           layer_id: Optional[int] = None, expert_id: Optional[int] = None) -> Dict[str, Any]:
    return {
        "name": name, "dtype": dtype or view.dtype, "itemsize": itemsize or view.itemsize,
        "global_shape": list(glob), "offset": list(off), "local_shape": list(local), "axes": _axes_wire(axes),
        "layer_id": shard.layer_id if layer_id is None else layer_id,
        "expert_id": shard.expert_id if expert_id is None else expert_id,
        "fingerprint": fingerprint, "aliases": list(aliases),
        "address": view.address, "nbytes": view.nbytes, "memory_kind": int(view.memory_kind),
        "device_ordinal": view.device_ordinal,
    }


def _fragment_id(pid: str, name: str) -> str:
    return f"{pid}/{name}"


def _build_placement(resource_id: str, revision: str, generation: int, sizes: Mapping[str, int],
                     infos: Sequence[Mapping[str, Any]], placement_set_id: str) -> Placement:
    b = PlacementBuilder(resource_id, revision, generation, placement_set_id, tp_size=sizes["tp"],
                         pp_size=sizes["pp"], ep_size=sizes["ep"], dp_size=sizes["dp"])
    specs: Dict[str, Tuple[TensorSpec, str]] = {}
    for info in infos:
        b.add_participant(info["participant_id"], Rank(**info["rank"]))
        for e in info["tensors"]:
            spec = TensorSpec(e["name"], tuple(e["global_shape"]), e["dtype"], int(e["itemsize"]),
                              _axes_from_wire(e["axes"]), e["fingerprint"], e["layer_id"], e["expert_id"])
            prev = specs.get(e["name"])
            if prev is None:
                specs[e["name"]] = (spec, info["participant_id"])
            elif prev[0].to_wire() != spec.to_wire():
                raise StateDictError(
                    f"tensor {e['name']!r} is described differently by {prev[1]} ({_describe(prev[0])}) and "
                    f"{info['participant_id']} ({_describe(spec)}); every rank must agree on dtype, global "
                    "shape and sharding")
    for name in sorted(specs):
        b.add_tensor(specs[name][0])
    for info in infos:
        pid = info["participant_id"]
        for e in info["tensors"]:
            b.add_fragment(pid, e["name"], e["offset"], e["local_shape"],
                           placement_fragment_id=_fragment_id(pid, e["name"]), aliases=e["aliases"])
    try:
        return b.build()
    except MwsError as err:
        raise StateDictError(f"the layout is not a complete placement: {err.message or err}") from err


def _describe(spec: TensorSpec) -> str:
    axes = ",".join(f"{a.kind}:{type(a).__name__.lower()}" + (f"@{a.dim}" if isinstance(a, Split) else "")
                    for a in spec.parallel_axes)
    return f"{spec.dtype}{list(spec.global_shape)} [{axes}]"


def _bind(placement: Placement, info: Mapping[str, Any], lease_id: str) -> Binding:
    """The binding of one described rank (:func:`_rank_info`) to its buffers' addresses
    (raw addresses: whoever holds the tensors keeps them alive)."""
    pid = info["participant_id"]
    endpoint = {"endpoint": info["endpoint"]} if info.get("endpoint") else {}
    bd = Binding(placement, pid, instance_id=info["instance_id"], lease_id=lease_id, **endpoint)
    try:
        for e in info["tensors"]:
            kind = MemoryKind(int(e["memory_kind"]))
            bd.add_address(_fragment_id(pid, e["name"]), int(e["address"]), int(e["nbytes"]),
                           device="cpu" if kind == MemoryKind.HOST else f"cuda:{int(e['device_ordinal'])}",
                           memory_kind=kind, device_ordinal=int(e["device_ordinal"]))
    except BaseException:
        bd.close()
        raise
    return bd


def _check_device_path(store: Any, views: Iterable[TensorView]) -> None:
    dev = [v for v in views if v.is_device]
    if dev and getattr(store, "device_engine", None) is None and getattr(store, "kind", "") in ("memory", "directory"):
        raise StateDictError(
            f"{len(dev)} tensor(s) are in device memory ({dev[0].device}) and this {store.kind} store has no device "
            "engine: open it with device_engine=mooncake_weight_store.DeviceEngine.for_torch() (or move the tensors "
            "to the CPU)")


def _views(state_dict: Mapping[str, Any], writable: bool) -> Dict[str, TensorView]:
    views: Dict[str, TensorView] = {}
    try:
        for name, t in state_dict.items():
            if not isinstance(name, str) or not name:
                raise StateDictError(f"state dict keys must be non-empty strings, not {name!r}")
            views[name] = tensor_view(t, writable=writable, name=name)
            if views[name].nbytes == 0:
                # The store format has no zero-size tensor: every extent of a
                # tensor's global shape and of a fragment is at least 1
                # (docs/spec/data-model.md), and the reference refuses it too.
                raise StateDictError(f"tensor {name!r} is empty (shape {views[name].shape}): a stored tensor needs "
                                     "at least one element (every dimension at least 1); leave it out of the state "
                                     "dict")
    except BaseException:
        _release(views, state_dict)
        raise
    return views


def _release(views: Mapping[str, TensorView], source: Optional[Mapping[str, Any]]) -> None:
    """Releases the views made here (a caller's own TensorView stays held)."""
    for n, v in views.items():
        if source is None or source.get(n) is not v:
            v.release()


# --------------------------------------------------------------------------- collectives with errors


def _ok(payload: Any) -> str:
    return json.dumps({"ok": payload})


def _err(e: BaseException) -> str:
    return json.dumps({"error": f"{type(e).__name__}: {e}"})


def _gather_checked(ex: Exchange, text: str, what: str) -> List[Any]:
    out = [json.loads(t) for t in ex.all_gather(text)]
    bad = [(r, o["error"]) for r, o in enumerate(out) if "error" in o]
    if bad:
        raise StateDictError(f"{what} failed on rank(s) " + "; ".join(f"{r}: {m}" for r, m in bad))
    return [o["ok"] for o in out]


def _gather_or_raise(ex: Exchange, text: str, what: str, local_error: Optional[BaseException]) -> List[Any]:
    try:
        return _gather_checked(ex, text, what)
    except StateDictError as e:
        raise e from local_error


def _broadcast_checked(ex: Exchange, text: Optional[str], what: str) -> Any:
    o = json.loads(ex.broadcast(text, root=0))
    if "error" in o:
        raise StateDictError(f"{what} failed on rank 0: {o['error']}")
    return o["ok"]


# --------------------------------------------------------------------------- describing ranks


def _rank_info(state_dict: Mapping[str, Any], views: Mapping[str, TensorView], sharding: Sharding, par: Parallel,
               fingerprint: str, fingerprints: Optional[Mapping[str, str]], instance_id: str,
               endpoint: Optional[str] = None) -> Dict[str, Any]:
    """One rank's description (JSON-able): its coordinates, sizes, instance, and per
    tensor the global box its local tensor is (from ``sharding``), the axes, the
    layout fingerprint, aliases and the buffer's address. Every rank of a layout
    builds the same placement from the descriptions of all ranks
    (:func:`_build_placement`) and binds any rank from its own (:func:`_bind`)."""
    aliases = _aliases(views)
    entries = []
    for name, v in views.items():
        shard = resolve_shard(sharding, name, state_dict[name])
        local = _shape(v)
        glob, off = _box_from_local(name, shard, local, par.sizes, par.rank)
        fp = (fingerprints or {}).get(name, fingerprint)
        fp = fp + SCALAR_SUFFIX if not v.shape else fp
        entries.append(_entry(name, v, glob, off, local, _axes(shard, par.sizes), shard, fp, aliases.get(name, ())))
    info = {"participant_id": par.participant_id, "rank": par.rank.to_wire(), "sizes": par.sizes,
            "instance_id": instance_id, "tensors": entries}
    if endpoint is not None:
        info["endpoint"] = endpoint
    return info


def _check_infos(infos: Sequence[Dict[str, Any]], empty: Callable[[], str]) -> List[Dict[str, Any]]:
    """The descriptions of every rank of one layout, checked (some tensor, one set of
    sizes, distinct coordinates) and sorted by participant id."""
    if not any(i["tensors"] for i in infos):
        raise StateDictError(empty() + f" on every one of the {len(infos)} ranks")
    if len({json.dumps(i["sizes"], sort_keys=True) for i in infos}) != 1:
        raise StateDictError("ranks disagree on the parallel sizes: " +
                             ", ".join(f"{i['participant_id']}={i['sizes']}" for i in infos))
    if len({i["participant_id"] for i in infos}) != len(infos):
        raise StateDictError("two ranks passed the same parallel coordinates")
    return sorted(infos, key=lambda i: i["participant_id"])


def _gather_infos(ex: Exchange, describe: Callable[[], Dict[str, Any]], what: str,
                  empty: Callable[[], str]) -> List[Dict[str, Any]]:
    """Every rank's description (collective over ``ex``; :func:`_check_infos`): a
    rank whose ``describe`` fails tells the others, so that no rank waits forever,
    and every rank raises :class:`StateDictError` naming it."""
    local_error: Optional[BaseException] = None
    try:
        msg = _ok(describe())
    except Exception as e:  # noqa: BLE001 - shared with the other ranks
        if ex.world_size == 1:
            raise
        msg, local_error = _err(e), e
    return _check_infos(_gather_or_raise(ex, msg, what, local_error), empty)


# --------------------------------------------------------------------------- save


def _empty_message(state_dict: Mapping[str, Any], resource_id: str, revision: str) -> str:
    return (f"the state dict is empty ({dict(state_dict)!r}): nothing to save as revision {revision!r} of "
            f"{resource_id!r} (a revision holds at least one tensor)")


def save_state_dict(
    store: Any,
    state_dict: Mapping[str, Any],
    *,
    resource_id: str,
    revision: str,
    weight_generation: int,
    sharding: Sharding = None,
    parallel: Optional[Parallel] = None,
    exchange: Optional[Exchange] = None,
    fingerprint: str = DEFAULT_FINGERPRINT,
    fingerprints: Optional[Mapping[str, str]] = None,
    namespace: Optional[str] = None,
    transaction_id: Optional[str] = None,
    created_at: Optional[str] = None,
    placement_set_id: str = "state-dict",
    commit_retries: int = 5,
    progress: Optional[Callable[[Any], Any]] = None,
) -> StoredManifest:
    """Saves this rank's ``state_dict`` (name -> tensor: torch, numpy, anything
    :func:`~mooncake_weight_store.tensors.tensor_view` accepts) as revision
    ``revision`` of ``resource_id`` with weight generation ``weight_generation``; returns the
    committed :class:`StoredManifest` (on every rank).

    Collective when ``exchange`` spans several ranks: every rank calls it with its
    own ``state_dict``, ``parallel`` and its own ``store`` handle onto the same
    backend. Tensors are read in place (no copy here) and must not change until the
    call returns. On any rank's failure the upload is aborted and every rank raises
    :class:`StateDictError` naming the failing rank(s) (an :class:`MwsError`: its
    ``status`` is the library's, e.g. ``Status.CONFLICT`` when the revision exists
    with other content, and ``__cause__`` the local exception). Re-saving a revision
    that is already committed with the same tensors (same shapes, dtypes and bytes) is
    a no-op that returns the stored manifest. ``progress``: a callable that
    receives this rank's upload :class:`~mooncake_weight_store.progress.Progress`
    (for example :class:`~mooncake_weight_store.progress.ProgressBar`). ``fingerprint`` is
    the layout fingerprint of every tensor, ``fingerprints`` overrides it per name.

    Refused before anything is written (:class:`StateDictError`, message naming what
    was passed): a ``state_dict`` that is not a mapping, an empty one (``{}``; with an
    exchange, when every rank's is empty), and a zero-size tensor (a dimension of 0:
    the store format has none; the message names the tensor and its shape). Thread
    safety: concurrent saves of different revisions are fine; the tensors are only
    read. The returned manifest is the caller's (close it or let it be collected).
    List what was saved with :meth:`Store.revisions` / :meth:`Store.latest`.
    """
    ex = exchange or LocalExchange()
    par = parallel or Parallel()
    if not isinstance(state_dict, Mapping):
        raise StateDictError(f"state_dict must be a mapping of tensor names to tensors, not "
                             f"{type(state_dict).__name__}")
    if ex.world_size == 1 and len(state_dict) == 0:
        raise StateDictError(_empty_message(state_dict, resource_id, revision))
    if par.world_size < ex.world_size:
        raise StateDictError(f"parallel sizes give {par.world_size} ranks, the exchange has {ex.world_size}")
    pid = par.participant_id
    views: Dict[str, TensorView] = {}
    binding: Optional[Binding] = None
    plan: Optional[UploadPlan] = None
    try:
        # 1. describe this rank (errors are shared, so that no rank waits forever)
        def describe() -> Dict[str, Any]:
            nonlocal views
            views = _views(state_dict, writable=False)
            _check_device_path(store, views.values())
            return _rank_info(state_dict, views, sharding, par, fingerprint, fingerprints,
                              f"{pid}:{uuid.uuid4().hex[:16]}")

        infos = _gather_infos(ex, describe, "describing the state dict",
                              lambda: _empty_message(state_dict, resource_id, revision))
        mine = next(i for i in infos if i["participant_id"] == pid)
        lease_id = "state-dict"
        # 2. the placement (every rank builds the same one) and this rank's binding
        local_error = None
        try:
            placement = _build_placement(resource_id, revision, weight_generation, par.sizes, infos, placement_set_id)
            binding = _bind(placement, mine, lease_id)
            msg = _ok(None)
        except Exception as e:  # noqa: BLE001
            if ex.world_size == 1:
                raise
            msg, local_error = _err(e), e
        if ex.world_size > 1:
            _gather_or_raise(ex, msg, "binding the state dict", local_error)
        # 3. rank 0 plans the upload over every rank's binding
        if ex.rank == 0:
            try:
                others = [_bind(placement, i, lease_id) for i in infos if i["participant_id"] != pid]
                try:
                    plan = store.plan_upload(placement, [binding, *others], namespace=namespace,
                                             transaction_id=transaction_id, created_at=created_at)
                finally:
                    for o in others:
                        o.close()
                plan_text = plan.to_json()
            except Exception as e:  # noqa: BLE001
                if ex.world_size > 1:
                    ex.broadcast(_err(e), root=0)
                raise
            _broadcast_checked(ex, _ok(plan_text), "planning the upload")
        else:
            plan_json = _broadcast_checked(ex, None, "planning the upload")
        # 4. every rank uploads its own participant
        upload_error: Optional[BaseException] = None
        try:
            if plan is None:
                plan = UploadPlan.from_json(plan_json)
            receipts = store.upload(plan, placement, binding, progress=progress)
            msg = _ok(receipts.to_json())
            receipts.close()
        except Exception as e:  # noqa: BLE001 - reported to rank 0, which aborts
            msg, upload_error = _err(e), e
        gathered = [json.loads(t) for t in ex.all_gather(msg)]
        # 5. rank 0 commits (or aborts) and broadcasts the manifest
        commit_error: Optional[BaseException] = None
        if ex.rank == 0:
            try:
                result, commit_error = _commit_or_abort(store, cast(UploadPlan, plan), gathered, commit_retries)
            except Exception as e:  # noqa: BLE001 - every rank must hear the outcome
                result, commit_error = _error_result(f"commit failed: {type(e).__name__}: {e}", e), e
            out = ex.broadcast(json.dumps(result), root=0)
        else:
            out = ex.broadcast(None, root=0)
        res = json.loads(out)
        if "error" in res:
            raise StateDictError(res["error"], status=res.get("status")) from (upload_error or commit_error)
        return StoredManifest.from_json(res["ok"])
    finally:
        if binding is not None:
            binding.close()
        if plan is not None:
            plan.close()
        _release(views, state_dict)


#: How the library's commit says that the revision it lost to holds the same tensors
#: (`protocol::integrity::ContentMatch::Same`, every 1 MiB block's CRC-32C equal).
SAME_CONTENT = "the stored revision has the same content"


def _error_result(message: str, error: Optional[BaseException]) -> Dict[str, Any]:
    """A failed outcome shared with every rank: the message and, when the failure is
    a library error, its status (``StateDictError.status`` on every rank)."""
    out: Dict[str, Any] = {"error": message}
    if isinstance(error, MwsError):
        out["status"] = int(error.status)
    return out


def _commit_or_abort(store: Any, plan: UploadPlan, gathered: Sequence[Mapping[str, Any]],
                     retries: int) -> Tuple[Dict[str, Any], Optional[BaseException]]:
    """Rank 0's commit (or abort): the outcome shared with every rank, and the local
    exception it came from (``None`` on success)."""
    bad = [(r, g["error"]) for r, g in enumerate(gathered) if "error" in g]
    parts = [Receipts.from_json(g["ok"]) for g in gathered if "ok" in g]
    try:
        if bad:
            rs = Receipts.concat(parts) if parts else None
            try:
                store.abort_upload(plan, rs)
            finally:
                if rs is not None:
                    rs.close()
            return {"error": "upload failed on rank(s) " + "; ".join(f"{r}: {m}" for r, m in bad) +
                             " (the upload was aborted)"}, None
        rs = Receipts.concat(parts)
        try:
            for attempt in range(retries + 1):
                try:
                    m = store.commit(plan, rs)
                    text = m.to_json()
                    m.close()
                    return {"ok": text}, None
                except MwsError as e:
                    may = bool(getattr(e, "decision_may_exist", False))
                    if e.status == Status.STORE and attempt < retries:
                        time.sleep(0.05 * (attempt + 1))
                        continue
                    if e.status == Status.CONFLICT and SAME_CONTENT in e.message:
                        # The revision is already committed with exactly these tensors:
                        # re-saving it is a no-op that returns the stored manifest (this
                        # upload's payloads were removed; nothing else changed).
                        stored = store.load_manifest(plan.manifest_key)
                        text = stored.to_json()
                        stored.close()
                        return {"ok": text}, None
                    if not may and e.status != Status.CONFLICT:
                        try:
                            store.abort_upload(plan, rs)
                        except MwsError:
                            pass
                    # A lost race (CONFLICT) is final: the hint to retry applies only
                    # when the commit's own outcome is unknown.
                    hint = may and e.status != Status.CONFLICT
                    return _error_result(f"commit failed: {e.status_name}: {e.message}" +
                                         (" (the commit decision may exist: retry finalize_upload)" if hint else ""),
                                         e), e
        finally:
            rs.close()
    finally:
        for p in parts:
            p.close()
    return {"error": "commit failed"}, None  # pragma: no cover - loop always returns


# --------------------------------------------------------------------------- load


def _numpy_dtype(name: str) -> Any:
    import numpy as np

    try:
        return np.dtype(DTYPES[name].numpy or name)
    except TypeError:
        pass
    try:
        import ml_dtypes  # noqa: F401 - registers bfloat16 / float8 with numpy

        return np.dtype(getattr(ml_dtypes, name))
    except (ImportError, AttributeError):
        # raw bits of the right width (view them with ml_dtypes when available)
        return np.dtype(f"<u{DTYPES[name].itemsize}")


def _load_targets(store: Any, manifest: StoredManifest, into: Optional[Mapping[str, Any]],
                  names: Optional[Iterable[str]], sharding: Sharding, par: Parallel) -> Tuple[Any, ...]:
    """(stored descriptors, target views, the dict to return, shards) of a load."""
    views: Dict[str, TensorView] = {}
    stored = {t["tensor_id"]: t for t in manifest.wire()["tensors"]}
    if into is not None:
        wanted = list(into)
    elif names is not None:
        wanted = list(names)
    else:
        wanted = sorted(n for n, d in stored.items()
                        if not str(d.get("layout_fingerprint", "")).startswith(METADATA_FINGERPRINT_PREFIX))
    unknown = [n for n in wanted if n not in stored]
    if unknown:
        raise StateDictError(f"not in revision {manifest.revision!r} of {manifest.resource_id!r}: "
                             f"{', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}")
    shards = {n: resolve_shard(sharding, n, into.get(n) if into is not None else None) for n in wanted}
    out: Dict[str, Any] = {}
    if into is None:
        import numpy as np

        for n in wanted:
            glob = tuple(stored[n]["global_shape"])
            _, local = _box_from_global(n, shards[n], glob, par.sizes, par.rank)
            shape = () if is_scalar(stored[n]) and local == (1,) else local
            out[n] = np.empty(shape, dtype=_numpy_dtype(stored[n]["dtype"]))
        targets: Mapping[str, Any] = out
    else:
        targets = into
        out = dict(into)
    views = _views(targets, writable=True)
    try:
        _check_device_path(store, views.values())
        for n, v in views.items():
            if v.dtype != stored[n]["dtype"]:
                raise StateDictError(f"tensor {n!r}: target dtype {v.dtype}, stored dtype {stored[n]['dtype']}")
    except BaseException:
        _release(views, into)
        raise
    return stored, views, out, shards


def _manifest_key(store: Any, key: RevisionKey, resource_id: Optional[str],
                  namespace: Optional[str]) -> Union[str, StoredManifest]:
    """The manifest key (or the open manifest) that ``key`` names (see
    :data:`RevisionKey`); :data:`LATEST` is resolved here (one listing)."""
    if isinstance(key, StoredManifest):
        if resource_id is not None or namespace is not None:
            raise ArgumentError(f"resource_id= and namespace= only go with key={LATEST!r}, not with a StoredManifest")
        return key
    if isinstance(key, RevisionInfo):
        if resource_id is not None or namespace is not None:
            raise ArgumentError(f"resource_id= and namespace= only go with key={LATEST!r}, not with a RevisionInfo")
        return key.manifest_key
    if not isinstance(key, str):
        raise ArgumentError(f"key must be a manifest key, {LATEST!r}, a RevisionInfo or a StoredManifest, "
                            f"not {type(key).__name__} ({key!r})")
    if key != LATEST:
        if resource_id is not None or namespace is not None:
            raise ArgumentError(f"resource_id= and namespace= only go with key={LATEST!r}; {key!r} is a manifest key")
        return key
    if resource_id is None:
        raise ArgumentError(f"key={LATEST!r} needs resource_id= (the model whose newest revision to load)")
    info = store.latest(resource_id, namespace=namespace)
    if info is None:
        ns = DEFAULT_NAMESPACE if namespace is None else namespace
        raise NotFoundError(int(Status.NOT_FOUND), f"no committed revision of {resource_id!r} in namespace {ns!r} "
                            f"under key prefix {store.key_prefix!r} (key={LATEST!r})", "MWS_NOT_FOUND")
    return str(info.manifest_key)


def _open_revision(store: Any, key: RevisionKey, resolved: Union[str, StoredManifest]) -> Tuple[StoredManifest, bool]:
    """(the manifest, whether the caller must close it) of a resolved key; a
    :class:`RevisionInfo` must still describe the manifest at its key."""
    if isinstance(resolved, StoredManifest):
        return resolved, False
    manifest: StoredManifest = store.load_manifest(resolved)
    if isinstance(key, RevisionInfo) and manifest.digest != key.manifest_digest:
        digest = manifest.digest
        manifest.close()
        raise StateDictError(f"the manifest at {resolved} has digest {digest}, not {key.manifest_digest} as "
                             "listed: the revision was replaced since it was listed", status=Status.CONFLICT)
    return manifest, True


def load_state_dict(
    store: Any,
    key: RevisionKey,
    into: Optional[Mapping[str, Any]] = None,
    *,
    resource_id: Optional[str] = None,
    namespace: Optional[str] = None,
    sharding: Sharding = None,
    parallel: Optional[Parallel] = None,
    exchange: Optional[Exchange] = None,
    names: Optional[Iterable[str]] = None,
    stats: Optional[List[LoadStats]] = None,
    progress: Optional[Callable[[Any], Any]] = None,
) -> Dict[str, Any]:
    """Loads a revision into this rank's shards.

    ``key`` names the revision: its manifest key (``StoredManifest.key``), a
    :class:`~mooncake_weight_store.revisions.RevisionInfo` from
    :meth:`Store.revisions` / :meth:`Store.latest`, an open :class:`StoredManifest`
    (borrowed, not closed), or :data:`LATEST` (``"latest"``) with ``resource_id=``
    (and ``namespace=``, default ``"default"``): the newest committed revision of
    that model (highest weight generation, see :meth:`Store.latest`; a store that
    cannot list its keys, such as Mooncake, through the revision index), a model
    without a revision :class:`NotFoundError` naming it. With an ``exchange``, rank 0
    resolves :data:`LATEST` and every rank loads that revision; without one each rank
    resolves it on its own (resolve once with :meth:`Store.latest` and pass the
    ``RevisionInfo`` when revisions may be committed meanwhile).

    ``into``: name -> preallocated writable tensor (any
    :func:`~mooncake_weight_store.tensors.tensor_view` source, host or device) whose
    shape is this rank's box under ``sharding``/``parallel``; filled in place and
    returned. Without ``into``, numpy arrays are allocated for ``names`` (default:
    every stored tensor); bfloat16/float8 use ``ml_dtypes`` when importable, else
    unsigned integers of the same width. A 0-d tensor (saved with shape ``()``) comes back
    with shape ``()``.

    The target layout may differ in every way from the saved one. Without an
    ``exchange`` the other TP/EP ranks' boxes are derived by symmetry (even splits);
    with one, the ranks gather their boxes (collective). ``stats``: a list that
    receives the :class:`LoadStats`. ``progress``: a callable that receives this
    rank's restore :class:`~mooncake_weight_store.progress.Progress`.
    """
    par = parallel or Parallel()
    ex = exchange if exchange is not None and exchange.world_size > 1 else None
    if isinstance(key, str) and key == LATEST and ex is not None:
        # One rank resolves "latest", so that every rank loads the same revision.
        if ex.rank == 0:
            try:
                resolved: Union[str, StoredManifest] = _manifest_key(store, key, resource_id, namespace)
            except Exception as e:  # noqa: BLE001 - every rank must hear the outcome
                ex.broadcast(_err(e), root=0)
                raise
            _broadcast_checked(ex, _ok(resolved), f"resolving key={LATEST!r}")
        else:
            resolved = str(_broadcast_checked(ex, None, f"resolving key={LATEST!r}"))
    else:
        resolved = _manifest_key(store, key, resource_id, namespace)
    manifest: Optional[StoredManifest] = None
    own = False
    views: Dict[str, TensorView] = {}
    binding: Optional[Binding] = None
    try:
        try:
            manifest, own = _open_revision(store, key, resolved)
            stored, views, out, shards = _load_targets(store, manifest, into, names, sharding, par)
        except Exception as e:  # noqa: BLE001 - a collective load tells the other ranks
            if ex is not None:
                _gather_or_raise(ex, _err(e), "describing the load targets", e)
            raise
        placement, info = _load_layout(manifest.resource_id, manifest.revision, manifest.weight_generation,
                                       stored, views, shards, par, ex)
        binding = _bind(placement, info, "load")
        with LoadPlan.new(manifest, placement, [binding]) as lp:
            st = store.load(lp, binding, progress=progress)
        if stats is not None:
            stats.append(st)
        return out
    finally:
        if binding is not None:
            binding.close()
        _release(views, into)
        if own and manifest is not None:
            manifest.close()


UNBOUND_PARTICIPANT = "unbound-remainder"


def _with_unbound_owner(sizes: Mapping[str, int], infos: Sequence[Dict[str, Any]], missing: Sequence[str],
                        stored: Mapping[str, Mapping[str, Any]]) -> Tuple[Dict[str, int], List[Dict[str, Any]]]:
    """A restore plan needs every stored tensor in the target placement
    (``load-path.md`` §3.2), but a rank (a pipeline stage, a subset) loads only some.
    The others go to one extra, never bound participant on an extra pipeline
    coordinate; every tensor is then owned per pipeline coordinate
    (``OwnershipAxis("pp")``), so the bound ranks' covers stay complete on their own.
    Only the bound participants are planned and loaded."""
    sizes = dict(sizes)
    extra = sizes["pp"]
    sizes["pp"] += 1
    own_pp = Ownership("pp").to_wire()
    out: List[Dict[str, Any]] = []
    for info in infos:
        info = dict(info, tensors=[dict(e) for e in info["tensors"]])
        for e in info["tensors"]:
            if own_pp not in e["axes"]:
                e["axes"] = _axes_wire(sorted(_axes_from_wire(e["axes"]) + (Ownership("pp"),),
                                              key=lambda a: ("dp", "pp", "ep", "tp").index(a.kind)))
        out.append(info)
    rank = Rank(pp=extra)
    rep = [Replicated(k) for k in ("dp", "ep", "tp") if sizes[k] > 1]
    owned: List[Any] = [Ownership("pp"), *rep]
    axes = sorted(owned, key=lambda a: ("dp", "pp", "ep", "tp").index(a.kind))
    tensors = []
    for n in missing:
        d = stored[n]
        glob = list(d["global_shape"])
        tensors.append({"name": n, "dtype": d["dtype"], "itemsize": int(d["itemsize"]), "global_shape": glob,
                        "offset": [0] * len(glob), "local_shape": glob, "axes": _axes_wire(axes),
                        "layer_id": d["layer_id"], "expert_id": d["expert_id"],
                        "fingerprint": d["layout_fingerprint"], "aliases": []})
    out.append({"participant_id": UNBOUND_PARTICIPANT, "rank": rank.to_wire(), "sizes": sizes,
                "instance_id": UNBOUND_PARTICIPANT, "tensors": tensors})
    for i in out:
        i["sizes"] = sizes
    return sizes, sorted(out, key=lambda i: i["participant_id"])


def _load_layout(resource_id: str, revision: str, generation: int, stored: Mapping[str, Mapping[str, Any]],
                 views: Mapping[str, TensorView], shards: Mapping[str, Shard], par: Parallel,
                 ex: Optional[Exchange]) -> Tuple[Placement, Dict[str, Any]]:
    """The target placement and this rank's info. With ``ex``: every rank's boxes,
    gathered. Without: a local grid of this rank's TP (and EP) peers whose boxes
    follow by symmetry; pipeline and data-parallel coordinates do not matter there."""
    aliases = _aliases(views)
    if ex is not None:
        sizes = par.sizes
        peers: List[Rank] = []
    else:
        uses_ep = any(s.uses_ep for s in shards.values()) and par.ep_size > 1
        sizes = {"tp": par.tp_size, "pp": 1, "ep": par.ep_size if uses_ep else 1, "dp": 1}
        peers = [Rank(tp=t, ep=e) for e in range(sizes["ep"]) for t in range(sizes["tp"])]
    me_rank = par.rank if ex is not None else Rank(tp=par.tp_rank, ep=par.ep_rank if sizes["ep"] > 1 else 0)

    def entries_for(rank: Rank, mine: bool) -> List[Dict[str, Any]]:
        out = []
        for n, v in views.items():
            s, d = shards[n], stored[n]
            glob = tuple(d["global_shape"])
            if not mine and s.expert_id is not None and sizes["ep"] > 1 and rank.ep != me_rank.ep:
                continue  # another EP rank's experts: not ours to describe
            if s.offset is not None:
                if not mine:
                    raise StateDictError(f"{n}: an explicit offset cannot be derived for the other ranks; "
                                         "pass an exchange")
                off, local = s.offset, _shape(v)
            else:
                off, local = _box_from_global(n, s, glob, sizes, rank)
            if mine and _shape(v) != tuple(local):
                raise StateDictError(f"tensor {n!r}: target shape {v.shape}, but the stored {list(glob)} "
                                     f"sharded as {s} over {par} gives {list(local)}")
            out.append(_entry(n, v, glob, off, local, _axes(s, sizes), s, d["layout_fingerprint"],
                              aliases.get(n, ()), dtype=d["dtype"], itemsize=int(d["itemsize"]),
                              layer_id=d["layer_id"], expert_id=d["expert_id"]))
        return out

    def pid_of(r: Rank) -> str:
        return f"rank-d{r.dp}-p{r.pp}-e{r.ep}-t{r.tp}"

    def describe_me() -> Dict[str, Any]:
        return {"participant_id": pid_of(me_rank), "rank": me_rank.to_wire(), "sizes": sizes,
                "instance_id": f"{pid_of(me_rank)}:{uuid.uuid4().hex[:16]}", "tensors": entries_for(me_rank, True)}

    if ex is not None:
        local_error: Optional[BaseException] = None
        try:
            mine = describe_me()
            msg = _ok(mine)
        except Exception as e:  # noqa: BLE001 - shared with the other ranks
            msg, local_error = _err(e), e
        infos = _gather_or_raise(ex, msg, "describing the load targets", local_error)
    else:
        mine = describe_me()
        infos = [mine] + [{"participant_id": pid_of(r), "rank": r.to_wire(), "sizes": sizes,
                           "instance_id": pid_of(r), "tensors": entries_for(r, False)}
                          for r in peers if r != me_rank]
    infos = sorted(infos, key=lambda i: i["participant_id"])
    held = {e["name"] for i in infos for e in i["tensors"]}
    missing = sorted(set(stored) - held)
    if missing:
        sizes, infos = _with_unbound_owner(sizes, infos, missing, stored)
    placement = _build_placement(resource_id, revision, generation, sizes, infos, "load-target")
    return placement, mine
