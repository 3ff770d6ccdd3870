"""Restore: plan a stored manifest into a target placement, then load each
participant's buffers."""

from __future__ import annotations

import dataclasses

import ctypes
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .errors import ArgumentError
from . import _abi, _lib
from ._lib import LIB, OwnedHandle, call
from .binding import Binding
from .manifest import StoredManifest
from .placement import Placement

__all__ = ["PlanningLimits", "LoadPlan", "LoadStats"]


@dataclass(frozen=True)
class PlanningLimits:
    """Fail-closed planning bounds; 0 means the library default."""

    max_transfer_regions: int = 0
    max_segments_per_region: int = 0
    max_total_lowered_segments: int = 0

    def to_c(self) -> _abi.mws_planning_limits:
        for name in ("max_transfer_regions", "max_segments_per_region", "max_total_lowered_segments"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
                raise ArgumentError(f"{name} must be an unsigned 64-bit integer")
        return _abi.mws_planning_limits(self.max_transfer_regions, self.max_segments_per_region,
                                        self.max_total_lowered_segments)


@dataclass(frozen=True)
class LoadStats:
    """What one load moved."""

    regions: int = 0
    ranges: int = 0
    requests: int = 0
    bytes: int = 0
    #: How regions were read: whole by a store with native strided reads, row by row
    #: as ranges, or as one span into the staging buffer (the store's cost model
    #: chooses between the last two per region).
    strided_regions: int = 0
    direct_regions: int = 0
    staged_regions: int = 0
    #: Bytes read into the staging buffer (staged spans, gaps included).
    staged_bytes: int = 0

    def __add__(self, other: "LoadStats") -> "LoadStats":
        return LoadStats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


class LoadPlan(OwnedHandle):
    """A restore plan (``mws_load_plan``); immutable and thread-safe.

    It records the bindings' buffer addresses: keep the buffers (and the
    :class:`Binding` objects, which hold them) alive until the loads ran (the plan
    references the bindings it was made with until it is closed).
    """

    _FREE = "mws_load_plan_free"
    _WHAT = "load plan"

    def __init__(self, handle: Optional[int], bindings: Sequence[Binding] = ()) -> None:
        super().__init__(handle, keep=bindings)

    @classmethod
    def new(
        cls,
        manifest: StoredManifest,
        target: Placement,
        bindings: Sequence[Binding],
        limits: Optional[PlanningLimits] = None,
    ) -> "LoadPlan":
        """Plans the restore of ``manifest`` into ``target`` for the participants of
        ``bindings`` (all, or the caller's subset). Pure: no store I/O."""
        arr = _lib.handle_array(bindings)
        lim = ctypes.byref(limits.to_c()) if limits is not None else None
        out = ctypes.c_void_p()
        call("mws_load_plan_new", manifest, target, arr, len(bindings), lim, ctypes.byref(out))
        return cls(out.value, bindings)

    @property
    def region_count(self) -> int:
        return int(LIB.fn("mws_load_plan_region_count")(self))

    @property
    def total_bytes(self) -> int:
        return int(LIB.fn("mws_load_plan_total_bytes")(self))

    def participants(self) -> List[str]:
        n = int(LIB.fn("mws_load_plan_participant_count")(self))
        out = []
        for i in range(n):
            size = ctypes.c_size_t(0)
            ptr = LIB.fn("mws_load_plan_participant")(self, i, ctypes.byref(size))
            if not ptr:
                _lib.check(int(_lib.Status.INVALID_ARGUMENT))
            out.append(ctypes.string_at(ptr, size.value).decode("utf-8"))
        return out

    def __repr__(self) -> str:
        if self._h is None:
            return "LoadPlan(<closed>)"
        return f"LoadPlan(regions={self.region_count}, bytes={self.total_bytes})"
