"""Placements: the address-free description of a sharded model.

:class:`PlacementBuilder` builds the placement wire JSON (``wire-format.md`` §2,
canonical Profile A: ``json.dumps(sort_keys=True, separators=(",", ":"))``) in pure
Python, including ``topology_id``, ``placement_id`` and derived fragment ids.
:class:`Placement` is the library's parsed and validated placement handle.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib
from ._lib import LIB, OwnedHandle, call

__all__ = [
    "Rank",
    "Split",
    "Replicated",
    "Ownership",
    "Axis",
    "TensorSpec",
    "PlacementBuilder",
    "Placement",
    "FragmentInfo",
    "canonical_json",
]

AXIS_KINDS = ("dp", "pp", "ep", "tp")  # canonical order


def canonical_json(value: Any) -> str:
    """Profile A canonical JSON (sorted keys, compact, ASCII-escaped)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Rank:
    """A parallel rank ``(dp, pp, ep, tp)``."""

    dp: int = 0
    pp: int = 0
    ep: int = 0
    tp: int = 0

    def to_wire(self) -> Dict[str, int]:
        return {"dp": self.dp, "ep": self.ep, "pp": self.pp, "tp": self.tp}

    def get(self, kind: str) -> int:
        return getattr(self, kind)


@dataclass(frozen=True)
class Split:
    """The ranks along ``kind`` (``tp`` or ``ep``) partition dimension ``dim``."""

    kind: str
    dim: int

    def to_wire(self) -> Dict[str, Any]:
        return {"dim": self.dim, "kind": self.kind, "semantics": "split"}


@dataclass(frozen=True)
class Replicated:
    """Every rank along ``kind`` holds a complete copy."""

    kind: str

    def to_wire(self) -> Dict[str, Any]:
        return {"kind": self.kind, "semantics": "replicated"}


@dataclass(frozen=True)
class Ownership:
    """Only the ranks along ``kind`` that hold fragments hold the tensor."""

    kind: str

    def to_wire(self) -> Dict[str, Any]:
        return {"kind": self.kind, "semantics": "ownership"}


Axis = Union[Split, Replicated, Ownership]


@dataclass(frozen=True)
class TensorSpec:
    """A tensor descriptor. ``shard_dims`` is derived from the split axes."""

    tensor_id: str
    global_shape: Tuple[int, ...]
    dtype: str
    itemsize: int
    parallel_axes: Tuple[Axis, ...] = ()
    layout_fingerprint: str = "mws:python:v1"
    layer_id: Optional[int] = None
    expert_id: Optional[int] = None

    @property
    def shard_dims(self) -> List[int]:
        return sorted(a.dim for a in self.parallel_axes if isinstance(a, Split))

    @property
    def nbytes(self) -> int:
        return math.prod(self.global_shape) * self.itemsize

    def to_wire(self) -> Dict[str, Any]:
        axes = sorted(self.parallel_axes, key=lambda a: AXIS_KINDS.index(a.kind))
        return {
            "dtype": self.dtype,
            "expert_id": self.expert_id,
            "global_shape": list(self.global_shape),
            "itemsize": self.itemsize,
            "layer_id": self.layer_id,
            "layout_fingerprint": self.layout_fingerprint,
            "parallel_axes": [a.to_wire() for a in axes],
            "shard_dims": self.shard_dims,
            "tensor_id": self.tensor_id,
        }


@dataclass
class _Fragment:
    participant_id: str
    tensor_id: str
    global_offset: Tuple[int, ...]
    local_shape: Tuple[int, ...]
    nbytes: int
    rank: Rank
    aliases: Tuple[str, ...] = ()
    pipeline_stage_id: Optional[int] = None
    placement_fragment_id: Optional[str] = None

    def derived_id(self) -> str:
        obj: Dict[str, Any] = {
            "aliases": sorted(self.aliases),
            "global_offset": list(self.global_offset),
            "local_shape": list(self.local_shape),
            "nbytes": self.nbytes,
            "rank": self.rank.to_wire(),
            "schema": "weight-placement-fragment",
            "tensor_id": self.tensor_id,
        }
        if self.pipeline_stage_id is not None:
            obj["pipeline_stage_id"] = self.pipeline_stage_id
        return "sha256:" + _sha(canonical_json(obj))

    def to_wire(self) -> Dict[str, Any]:
        obj: Dict[str, Any] = {
            "aliases": sorted(self.aliases),
            "global_offset": list(self.global_offset),
            "local_shape": list(self.local_shape),
            "nbytes": self.nbytes,
            "placement_fragment_id": self.placement_fragment_id or self.derived_id(),
            "rank": self.rank.to_wire(),
            "tensor_id": self.tensor_id,
        }
        if self.pipeline_stage_id is not None:
            obj["pipeline_stage_id"] = self.pipeline_stage_id
        return obj


class PlacementBuilder:
    """Builds a complete placement's wire JSON.

    Example::

        b = PlacementBuilder("model", "step-1", weight_generation=1, tp_size=2)
        b.add_participant("rank-0", Rank(tp=0)); b.add_participant("rank-1", Rank(tp=1))
        b.add_tensor(TensorSpec("w", (8, 4), "bfloat16", 2, (Split("tp", 0),)))
        b.shard("w")                      # one fragment per participant, even split
        placement = b.build()             # parsed and validated by the library

    Validation (coverage, axes, ...) is the library's: :meth:`build` raises
    :class:`~mooncake_weight_store.errors.InvalidArgumentError` for an invalid placement.
    """

    def __init__(
        self,
        resource_id: str,
        revision: str,
        weight_generation: int,
        placement_set_id: str = "placement",
        *,
        tp_size: int = 1,
        pp_size: int = 1,
        ep_size: int = 1,
        dp_size: int = 1,
    ) -> None:
        self.resource_id = resource_id
        self.revision = revision
        self.weight_generation = weight_generation
        self.placement_set_id = placement_set_id
        self.sizes = {"tp": tp_size, "pp": pp_size, "ep": ep_size, "dp": dp_size}
        self.participants: Dict[str, Rank] = {}
        self.tensors: Dict[str, TensorSpec] = {}
        self.fragments: List[_Fragment] = []

    # -- construction ---------------------------------------------------------------

    def add_participant(self, participant_id: str, rank: Rank) -> "PlacementBuilder":
        if participant_id in self.participants:
            raise ValueError(f"duplicate participant: {participant_id}")
        self.participants[participant_id] = rank
        return self

    def add_grid(self, name: str = "rank") -> List[str]:
        """Adds one participant per point of the ``dp x pp x ep x tp`` grid, named
        ``f"{name}-d{dp}-p{pp}-e{ep}-t{tp}"``; returns the ids in rank order."""
        ids = []
        for dp in range(self.sizes["dp"]):
            for pp in range(self.sizes["pp"]):
                for ep in range(self.sizes["ep"]):
                    for tp in range(self.sizes["tp"]):
                        pid = f"{name}-d{dp}-p{pp}-e{ep}-t{tp}"
                        self.add_participant(pid, Rank(dp=dp, pp=pp, ep=ep, tp=tp))
                        ids.append(pid)
        return ids

    def add_tensor(self, spec: TensorSpec) -> "PlacementBuilder":
        if spec.tensor_id in self.tensors:
            raise ValueError(f"duplicate tensor: {spec.tensor_id}")
        self.tensors[spec.tensor_id] = spec
        return self

    def add_fragment(
        self,
        participant_id: str,
        tensor_id: str,
        global_offset: Sequence[int],
        local_shape: Sequence[int],
        *,
        placement_fragment_id: Optional[str] = None,
        aliases: Sequence[str] = (),
        pipeline_stage_id: Optional[int] = None,
    ) -> str:
        """Adds one fragment (box) held by ``participant_id``; returns its
        ``placement_fragment_id`` (derived from the content when not given)."""
        if participant_id not in self.participants:
            raise KeyError(f"unknown participant: {participant_id}")
        spec = self.tensors[tensor_id]
        frag = _Fragment(
            participant_id=participant_id,
            tensor_id=tensor_id,
            global_offset=tuple(global_offset),
            local_shape=tuple(local_shape),
            nbytes=math.prod(local_shape) * spec.itemsize,
            rank=self.participants[participant_id],
            aliases=tuple(aliases),
            pipeline_stage_id=pipeline_stage_id,
            placement_fragment_id=placement_fragment_id,
        )
        self.fragments.append(frag)
        return frag.placement_fragment_id or frag.derived_id()

    def shard(
        self,
        tensor_id: str,
        participants: Optional[Iterable[str]] = None,
        *,
        explicit_ids: bool = True,
    ) -> List[str]:
        """Adds the even-split fragment of ``tensor_id`` for each participant (all by
        default): along each ``Split(kind, dim)`` axis, participant coordinate ``c``
        of ``size`` gets rows ``[c*n/size, (c+1)*n/size)`` of ``dim``. Replicated axes
        give every participant its copy. Pass ``participants`` to restrict to owners
        (``Ownership`` axes). Returns the fragment ids."""
        spec = self.tensors[tensor_id]
        ids = []
        for pid in participants if participants is not None else list(self.participants):
            rank = self.participants[pid]
            off = [0] * len(spec.global_shape)
            shape = list(spec.global_shape)
            for ax in spec.parallel_axes:
                if isinstance(ax, Split):
                    size = self.sizes[ax.kind]
                    n = spec.global_shape[ax.dim]
                    if n % size:
                        raise ValueError(f"{tensor_id}: dim {ax.dim} ({n}) not divisible by {ax.kind}={size}")
                    shape[ax.dim] = n // size
                    off[ax.dim] = rank.get(ax.kind) * (n // size)
            fid = f"{pid}/{tensor_id}#0" if explicit_ids else None
            ids.append(self.add_fragment(pid, tensor_id, off, shape, placement_fragment_id=fid))
        return ids

    # -- wire form ------------------------------------------------------------------

    def topology_wire(self) -> Dict[str, Any]:
        parts = [
            {"participant_id": pid, "rank": r.to_wire()} for pid, r in sorted(self.participants.items())
        ]
        tid_obj = {
            "dp_size": self.sizes["dp"],
            "ep_size": self.sizes["ep"],
            "participants": parts,
            "pp_size": self.sizes["pp"],
            "schema": "weight-parallel-topology",
            "tp_size": self.sizes["tp"],
        }
        topology_id = "sha256:" + _sha(canonical_json(tid_obj))
        return {
            "dp_size": self.sizes["dp"],
            "ep_size": self.sizes["ep"],
            "participants": parts,
            "pp_size": self.sizes["pp"],
            "topology_id": topology_id,
            "tp_size": self.sizes["tp"],
        }

    def to_wire(self) -> Dict[str, Any]:
        """The placement wire object (with its ``placement_id``)."""
        by_part: Dict[str, List[Dict[str, Any]]] = {pid: [] for pid in self.participants}
        for f in self.fragments:
            by_part[f.participant_id].append(f.to_wire())
        parts = []
        for pid in sorted(self.participants):
            frags = sorted(by_part[pid], key=lambda f: f["placement_fragment_id"])
            parts.append({"fragments": frags, "participant_id": pid, "rank": self.participants[pid].to_wire()})
        obj: Dict[str, Any] = {
            "parts": parts,
            "placement_set_id": self.placement_set_id,
            "resource_id": self.resource_id,
            "revision": self.revision,
            "tensors": [self.tensors[t].to_wire() for t in sorted(self.tensors)],
            "topology": self.topology_wire(),
            "weight_generation": self.weight_generation,
        }
        pid_obj = dict(obj, schema="complete-weight-placement")
        obj["placement_id"] = "sha256:" + _sha(canonical_json(pid_obj))
        obj["resource_kind"] = "model_weight"
        return obj

    def to_json(self) -> str:
        """Canonical placement JSON (Profile A)."""
        return canonical_json(self.to_wire())

    def build(self) -> "Placement":
        """Parses and validates the placement with the library."""
        return Placement.from_json(self.to_json())


@dataclass(frozen=True)
class FragmentInfo:
    """One fragment of a parsed placement (``mws_placement_fragment_info``)."""

    placement_fragment_id: str
    participant_id: str
    tensor_id: str
    global_offset: Tuple[int, ...]
    local_shape: Tuple[int, ...]
    nbytes: int
    itemsize: int

    @property
    def strides(self) -> Tuple[int, ...]:
        """Canonical row-major byte strides of the fragment."""
        st = [0] * len(self.local_shape)
        acc = self.itemsize
        for d in range(len(self.local_shape) - 1, -1, -1):
            st[d] = acc
            acc *= self.local_shape[d]
        return tuple(st)


class Placement(OwnedHandle):
    """A parsed, validated, immutable placement (``mws_placement``).

    Thread-safe; free it with :meth:`close` (or a ``with`` block), or let the garbage
    collector do it.
    """

    _FREE = "mws_placement_free"
    _WHAT = "placement"

    def __init__(self, handle: int) -> None:
        super().__init__(handle)
        self._fragments: Optional[List[FragmentInfo]] = None

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "Placement":
        """Parses placement JSON (strict; see ``wire-format.md`` §2.1)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out = ctypes.c_void_p()
        call("mws_placement_from_json", data, len(data), ctypes.byref(out))
        return cls(out.value)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> "Placement":
        return cls.from_json(canonical_json(obj))

    def to_json(self) -> str:
        return self._s("mws_placement_to_json")

    @property
    def placement_id(self) -> str:
        return self._s("mws_placement_id")

    @property
    def digest(self) -> str:
        return self._s("mws_placement_digest")

    @property
    def topology_id(self) -> str:
        return self._s("mws_placement_topology_id")

    @property
    def resource_id(self) -> str:
        return self._s("mws_placement_resource_id")

    @property
    def revision(self) -> str:
        return self._s("mws_placement_revision")

    @property
    def weight_generation(self) -> int:
        return int(LIB.fn("mws_placement_weight_generation")(self.handle))

    @property
    def participant_count(self) -> int:
        return int(LIB.fn("mws_placement_participant_count")(self.handle))

    @property
    def tensor_count(self) -> int:
        return int(LIB.fn("mws_placement_tensor_count")(self.handle))

    def fragments(self) -> List[FragmentInfo]:
        """All fragments, ordered by participant id then fragment id."""
        if self._fragments is None:
            n = int(LIB.fn("mws_placement_fragment_count")(self.handle))
            out = []
            for i in range(n):
                info = _lib.mws_placement_fragment_info()
                call("mws_placement_fragment", self.handle, i, ctypes.byref(info))
                nd = info.ndim
                out.append(
                    FragmentInfo(
                        placement_fragment_id=info.placement_fragment_id.decode("utf-8"),
                        participant_id=info.participant_id.decode("utf-8"),
                        tensor_id=info.tensor_id.decode("utf-8"),
                        global_offset=tuple(info.global_offset[k] for k in range(nd)),
                        local_shape=tuple(info.local_shape[k] for k in range(nd)),
                        nbytes=int(info.nbytes),
                        itemsize=int(info.itemsize),
                    )
                )
            self._fragments = out
        return list(self._fragments)

    def fragment(self, index: int) -> FragmentInfo:
        """Fragment ``index`` (raises :class:`InvalidArgumentError` out of range)."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError("index must be an int")
        if index < 0:
            raise IndexError(index)
        info = _lib.mws_placement_fragment_info()
        call("mws_placement_fragment", self.handle, index, ctypes.byref(info))
        return self.fragments()[index]

    def participant_fragments(self, participant_id: str) -> List[FragmentInfo]:
        return [f for f in self.fragments() if f.participant_id == participant_id]

    def participants(self) -> List[str]:
        """Participants that hold at least one fragment (sorted)."""
        return sorted({f.participant_id for f in self.fragments()})

    def wire(self) -> Dict[str, Any]:
        return json.loads(self.to_json())

    def __repr__(self) -> str:
        if self._h is None:
            return "Placement(<closed>)"
        return f"Placement({self.resource_id!r}, {self.revision!r}, gen={self.weight_generation}, fragments={len(self.fragments())})"
