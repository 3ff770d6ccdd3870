"""Placements: the address-free description of a sharded model.

:class:`PlacementBuilder` builds a placement through the library's placement
builder (``mws_placement_builder_*``): the canonical JSON, ``topology_id``,
``placement_id`` and derived fragment ids are the library's.
:class:`Placement` is the library's parsed and validated placement handle.
"""

from __future__ import annotations

import ctypes
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, cast

from .errors import ArgumentError, OutOfRangeError
from . import _abi, _lib
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


_AXIS_KIND_CODES = {"dp": _abi.MWS_AXIS_DP, "pp": _abi.MWS_AXIS_PP, "ep": _abi.MWS_AXIS_EP, "tp": _abi.MWS_AXIS_TP}


def _axis_struct(a: Axis) -> "_abi.mws_parallel_axis":
    if a.kind not in _AXIS_KIND_CODES:
        raise ArgumentError(f"unsupported parallel axis kind: {a.kind}")
    semantics = (_abi.MWS_AXIS_SPLIT if isinstance(a, Split) else _abi.MWS_AXIS_REPLICATED if isinstance(a, Replicated)
                 else _abi.MWS_AXIS_OWNERSHIP)
    return _abi.mws_parallel_axis(_AXIS_KIND_CODES[a.kind], semantics, a.dim if isinstance(a, Split) else 0)


def _u64_array(values: Sequence[int]) -> Any:
    return (ctypes.c_uint64 * max(len(values), 1))(*values)


def _opt_u64(value: Optional[int]) -> Any:
    return ctypes.pointer(ctypes.c_uint64(value)) if value is not None else None


class PlacementBuilder(OwnedHandle):
    """Builds a complete placement through the library's placement builder
    (``mws_placement_builder``): canonical JSON, topology, placement and fragment ids
    are all computed by the library, never here.

    Example::

        b = PlacementBuilder("model", "step-1", weight_generation=1, tp_size=2)
        b.add_participant("rank-0", Rank(tp=0)); b.add_participant("rank-1", Rank(tp=1))
        b.add_tensor(TensorSpec("w", (8, 4), "bfloat16", 2, (Split("tp", 0),)))
        b.shard("w")                      # one fragment per participant, even split
        placement = b.build()             # validated by the library

    Duplicates and unknown names are refused at once; the whole placement (coverage,
    axes, ...) is validated by :meth:`build`, which raises
    :class:`~mooncake_weight_store.errors.InvalidArgumentError` (a ``ValueError``).
    """

    _FREE = "mws_placement_builder_free"
    _WHAT = "placement builder"

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
        self.fragment_ids: List[str] = []
        opts = _abi.mws_placement_builder_options(
            _lib.cstr(resource_id, "resource_id"), _lib.cstr(revision, "revision"), weight_generation,
            _lib.cstr(placement_set_id, "placement_set_id"), tp_size, pp_size, ep_size, dp_size)
        out = ctypes.c_void_p()
        call("mws_placement_builder_new", ctypes.byref(opts), ctypes.byref(out))
        super().__init__(out.value)

    # -- construction ---------------------------------------------------------------

    def add_participant(self, participant_id: str, rank: Rank) -> "PlacementBuilder":
        r = _abi.mws_rank(rank.dp, rank.pp, rank.ep, rank.tp)
        call("mws_placement_builder_add_participant", self, _lib.cstr(participant_id, "participant_id"),
             ctypes.byref(r))
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
        axes = (_abi.mws_parallel_axis * max(len(spec.parallel_axes), 1))(
            *[_axis_struct(a) for a in spec.parallel_axes])
        shape = _u64_array(spec.global_shape)
        c = _abi.mws_tensor_spec(
            _lib.cstr(spec.tensor_id, "tensor_id"), ctypes.cast(shape, ctypes.POINTER(ctypes.c_uint64)),
            len(spec.global_shape), _lib.cstr(spec.dtype, "dtype"), spec.itemsize,
            _lib.cstr(spec.layout_fingerprint, "layout_fingerprint"),
            ctypes.cast(axes, ctypes.POINTER(_abi.mws_parallel_axis)), len(spec.parallel_axes),
            _opt_u64(spec.layer_id), _opt_u64(spec.expert_id))
        call("mws_placement_builder_add_tensor", self, ctypes.byref(c))
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
        ``placement_fragment_id`` (the library's canonical id when not given)."""
        if len(global_offset) != len(local_shape):
            raise ArgumentError("global_offset and local_shape differ in length")
        off, shape = _u64_array(global_offset), _u64_array(local_shape)
        names = [_lib.cstr(a, "alias") for a in aliases]
        alias_arr = (ctypes.c_char_p * max(len(names), 1))(*names)
        c = _abi.mws_fragment_spec(
            _lib.cstr(participant_id, "participant_id"), _lib.cstr(tensor_id, "tensor_id"),
            ctypes.cast(off, ctypes.POINTER(ctypes.c_uint64)), ctypes.cast(shape, ctypes.POINTER(ctypes.c_uint64)),
            len(local_shape), _opt_u64(pipeline_stage_id), ctypes.cast(alias_arr, ctypes.POINTER(ctypes.c_char_p)),
            len(names), _lib.cstr(placement_fragment_id, "placement_fragment_id"))
        idp = ctypes.c_void_p()
        n = ctypes.c_size_t()
        call("mws_placement_builder_add_fragment", self, ctypes.byref(c), ctypes.byref(idp), ctypes.byref(n))
        fid = ctypes.string_at(cast(int, idp.value), n.value).decode("utf-8")
        self.fragment_ids.append(fid)
        return fid

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
                        raise ArgumentError(f"{tensor_id}: dim {ax.dim} ({n}) not divisible by {ax.kind}={size}")
                    shape[ax.dim] = n // size
                    off[ax.dim] = rank.get(ax.kind) * (n // size)
            fid = f"{pid}/{tensor_id}#0" if explicit_ids else None
            ids.append(self.add_fragment(pid, tensor_id, off, shape, placement_fragment_id=fid))
        return ids

    # -- results --------------------------------------------------------------------

    def build(self) -> "Placement":
        """Validates and builds the placement (the builder stays usable)."""
        out = ctypes.c_void_p()
        call("mws_placement_builder_build", self, ctypes.byref(out))
        return Placement(out.value)

    def to_json(self) -> str:
        """Canonical placement JSON (Profile A), as the library writes it."""
        with self.build() as p:
            return p.to_json()

    def to_wire(self) -> Dict[str, Any]:
        """The placement wire object (with its ``placement_id``)."""
        return json.loads(self.to_json())

    def topology_wire(self) -> Dict[str, Any]:
        """The topology wire object (with its ``topology_id``)."""
        return self.to_wire()["topology"]


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

    def __init__(self, handle: Optional[int]) -> None:
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
        return int(LIB.fn("mws_placement_weight_generation")(self))

    @property
    def participant_count(self) -> int:
        return int(LIB.fn("mws_placement_participant_count")(self))

    @property
    def tensor_count(self) -> int:
        return int(LIB.fn("mws_placement_tensor_count")(self))

    def fragments(self) -> List[FragmentInfo]:
        """All fragments, ordered by participant id then fragment id."""
        if self._fragments is None:
            n = int(LIB.fn("mws_placement_fragment_count")(self))
            out = []
            for i in range(n):
                info = _abi.mws_placement_fragment_info()
                call("mws_placement_fragment", self, i, ctypes.byref(info))
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
            raise ArgumentError("index must be an int")
        if index < 0:
            raise OutOfRangeError(f"fragment index {index} is out of range")
        info = _abi.mws_placement_fragment_info()
        call("mws_placement_fragment", self, index, ctypes.byref(info))
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
