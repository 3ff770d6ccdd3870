"""The model of the cluster tests: the package's test transformer
(:mod:`mooncake_weight_store.testing`: embedding, fused QKV, output projection, norm,
stacked experts) in the trainer layout (TP4 x DP2) and the serving layout
(TP2 x EP2), with bytes computed from coordinates instead of a random stream, so that
every process can produce the exact bytes of any fragment of any generation cheaply
(numpy) and check every target byte.

Element ``i`` (row-major linear index) of tensor ``t`` in generation ``g`` is the
top 16 bits of ``i * M + seed(g, t)`` (32-bit); a fragment's bytes are its box,
row-major, little-endian. Two generations differ in (almost) every element, so a
target that kept old bytes is told apart from an updated one.

Sparse generations (the delta phase): :func:`mutate` changes a given fraction of the
elements of a fragment for a generation, deterministically from (generation,
tensor, element index), so the sources (which apply the mutations of their
generations to their bytes) and the targets (which apply them to an expected image
built from the base generation) agree on every byte without exchanging any.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Dict, List

import numpy as np

from mooncake_weight_store.placement import Split, TensorSpec
from mooncake_weight_store.testing import Model, ModelSpec

__all__ = ["ClusterModel", "BulkSpec", "ROLES", "mutate"]

#: role -> (layout, tp, dp, ep, placement set id)
ROLES = {
    "trainer": ("tp", 4, 2, 1, "trainer"),
    "server": ("ep", 2, 1, 2, "serving"),
}

_M1 = np.uint32(0x9E3779B1)


@dataclasses.dataclass(frozen=True)
class BulkSpec(ModelSpec):
    """The test model with the output projection split on dim 0 instead of dim 1.
    Split on dim 1 (row-parallel, as in Megatron), a TP4 -> TP2 reshard moves it as
    ``hidden`` rows of ``hidden / 4`` elements per source: 512 B ranges at hidden 1024,
    which cost a Transfer Engine round trip each. Split on dim 0, every range of the
    model is a block of whole rows (64 KiB or more), so a transfer is bound by the
    links, not by the per-range cost."""

    def tensors(self, layout: str) -> List[TensorSpec]:
        out = []
        for t in super().tensors(layout):
            if t.tensor_id.endswith("o_proj.weight"):
                t = dataclasses.replace(t, parallel_axes=tuple(
                    Split("tp", 0) if isinstance(a, Split) and a.kind == "tp" else a for a in t.parallel_axes))
            out.append(t)
        return out


class ClusterModel(Model):
    """One layout of the cluster model for generation ``generation``."""

    def __init__(self, role: str, generation: int, *, layers: int, hidden: int, experts: int,
                 revision: str = "step-1", bulk: bool = False) -> None:
        layout, tp, dp, ep, set_id = ROLES[role]
        spec = (BulkSpec if bulk else ModelSpec)(hidden=hidden, layers=layers, experts=experts, generation=generation,
                         seed=f"gen-{generation}", revision=revision, resource_id="cluster-model")
        super().__init__(spec, layout, tp=tp, dp=dp, ep=ep, placement_set_id=set_id)
        self.role = role
        self.generation = generation
        self._seeds: Dict[str, np.uint64] = {}

    def _seed(self, tensor_id: str) -> np.uint32:
        s = self._seeds.get(tensor_id)
        if s is None:
            s = self._seeds[tensor_id] = np.uint32(zlib.crc32(f"{self.spec.seed}/{tensor_id}".encode()))
        return s

    def linear_index(self, fragment) -> np.ndarray:
        """The global row-major element index (mod 2^32) of every element of the
        fragment, in the fragment's row-major order (a flat uint32 array)."""
        t = self.tensors[fragment.tensor_id]
        shape, off, glob = fragment.local_shape, fragment.global_offset, t.global_shape
        nd = len(glob)
        strides = [1] * nd
        for d in range(nd - 2, -1, -1):
            strides[d] = strides[d + 1] * glob[d + 1]
        idx = np.empty(tuple(shape), dtype=np.uint32)
        idx[...] = np.uint32(0)
        with np.errstate(over="ignore"):
            for d in range(nd):
                ax = ((np.arange(shape[d], dtype=np.uint64) + off[d]) * strides[d]).astype(np.uint32)
                view = [1] * nd
                view[d] = shape[d]
                idx += ax.reshape(view)
        return idx.reshape(-1)

    def expected(self, fragment) -> np.ndarray:  # type: ignore[override]
        """The fragment's bytes (a uint8 array, row-major): element ``i`` is the top
        16 bits of ``i * M + seed(generation, tensor)`` (32-bit), so a copy from a
        wrong offset, tensor or generation differs almost everywhere."""
        t = self.tensors[fragment.tensor_id]
        idx = self.linear_index(fragment)
        with np.errstate(over="ignore"):
            idx *= _M1
            idx += self._seed(t.tensor_id)
        # the high halves of the little-endian 32-bit words
        return np.ascontiguousarray(idx.view("<u2")[1::2]).view(np.uint8)


_H1 = np.uint32(0x85EBCA6B)
_H2 = np.uint32(0x7FEB352D)
_H3 = np.uint32(0x846CA68B)


def mutate(linear: np.ndarray, data: np.ndarray, tensor_id: str, generation: int, density: float) -> int:
    """Applies generation ``generation``'s sparse change to one fragment's bytes in
    place and returns how many elements changed. ``linear``: the fragment's
    :meth:`ClusterModel.linear_index`; ``data``: its bytes (uint8, 2-byte elements,
    little-endian). Element ``i`` of tensor ``t`` changes when a 32-bit hash of
    ``(i, t, generation)`` is below ``density * 2^32``; it is XORed with the hash's
    low 16 bits with bit 0 set, so a changed element always differs from before, and
    applying the same generation twice restores it."""
    seed = np.uint32(zlib.crc32(f"delta-{generation}/{tensor_id}".encode()))
    with np.errstate(over="ignore"):
        h = linear * _H1
        h += seed
        h ^= h >> np.uint32(16)
        h *= _H2
        h ^= h >> np.uint32(15)
        h *= _H3
        h ^= h >> np.uint32(16)
    hit = np.flatnonzero(h < np.uint32(min(int(density * 2 ** 32), 2 ** 32 - 1)))
    if hit.size:
        el = data.view("<u2")
        el[hit] ^= (h[hit] & np.uint32(0xFFFF)).astype(np.uint16) | np.uint16(1)
    return int(hit.size)
