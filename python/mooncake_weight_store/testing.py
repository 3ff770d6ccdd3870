"""Test and benchmark support: a small sharded transformer model with deterministic
bytes, its placements in several layouts, and byte-exact verification.

The model (itemsize 2, ``bfloat16``) has an embedding, and per layer a fused QKV
projection (TP split on dim 0), an output projection (TP split on dim 1), a norm
(TP-replicated) and a stacked expert tensor ``(E, 2h, h)``:

* ``layout="tp"``: ``tp_size x dp_size`` (experts TP-split on dim 1);
* ``layout="ep"``: ``ep_size x tp_size`` (experts EP-split on dim 0 and TP-split on
  dim 1; dense tensors EP-replicated).

Every tensor's global bytes are ``random.Random(f"{seed}/{tensor_id}").randbytes(n)``;
a fragment's bytes are its box in row-major order.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .binding import Binding
from .placement import Placement, PlacementBuilder, Rank, Replicated, Split, TensorSpec

__all__ = ["ModelSpec", "box_bytes", "Model"]

ITEMSIZE = 2
FINGERPRINT = "mws-test:transformer:bf16:v1"


@dataclass(frozen=True)
class ModelSpec:
    hidden: int = 64
    layers: int = 2
    experts: int = 4
    resource_id: str = "test-model"
    revision: str = "step-1"
    generation: int = 1
    seed: str = "mws"

    def tensors(self, layout: str) -> List[TensorSpec]:
        h, out = self.hidden, []
        ep = layout == "ep"
        rep_ep = (Replicated("ep"),) if ep else ()
        out.append(TensorSpec("model.embed_tokens.weight", (4 * h, h), "bfloat16", ITEMSIZE,
                              (Replicated("dp"), *rep_ep, Split("tp", 0)), FINGERPRINT))
        for l in range(self.layers):
            p = f"model.layers.{l}"
            out.append(TensorSpec(f"{p}.self_attn.qkv_proj.weight", (3 * h, h), "bfloat16", ITEMSIZE,
                                  (Replicated("dp"), *rep_ep, Split("tp", 0)), FINGERPRINT, layer_id=l))
            out.append(TensorSpec(f"{p}.self_attn.o_proj.weight", (h, h), "bfloat16", ITEMSIZE,
                                  (Replicated("dp"), *rep_ep, Split("tp", 1)), FINGERPRINT, layer_id=l))
            out.append(TensorSpec(f"{p}.input_layernorm.weight", (h,), "bfloat16", ITEMSIZE,
                                  (Replicated("dp"), *rep_ep, Replicated("tp")), FINGERPRINT, layer_id=l))
            exp_axes = (Replicated("dp"), Split("ep", 0), Split("tp", 1)) if ep else (Replicated("dp"), Split("tp", 1))
            out.append(TensorSpec(f"{p}.mlp.experts.w1", (self.experts, 2 * h, h), "bfloat16", ITEMSIZE,
                                  exp_axes, FINGERPRINT, layer_id=l))
        return out

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors("tp"))

    def global_bytes(self, tensor: TensorSpec) -> bytes:
        return random.Random(f"{self.seed}/{tensor.tensor_id}").randbytes(tensor.nbytes)


def box_bytes(data: bytes, global_shape: Sequence[int], itemsize: int,
              offset: Sequence[int], shape: Sequence[int]) -> bytearray:
    """The bytes of box ``(offset, shape)`` of a row-major tensor, row-major."""
    nd = len(global_shape)
    gstr = [0] * nd
    acc = itemsize
    for d in range(nd - 1, -1, -1):
        gstr[d] = acc
        acc *= global_shape[d]
    k = nd - 1  # dims k+1.. are full, so dims k.. form one contiguous run
    while k > 0 and shape[k] == global_shape[k]:
        k -= 1
    run = math.prod(shape[k:]) * itemsize
    outer = list(shape[:k])
    mv = memoryview(data)
    base = sum(offset[d] * gstr[d] for d in range(nd))
    out = bytearray()
    if not outer:
        out += mv[base:base + run]
        return out
    idx = [0] * k
    for _ in range(math.prod(outer)):
        pos = base + sum(idx[d] * gstr[d] for d in range(k))
        out += mv[pos:pos + run]
        for d in range(k - 1, -1, -1):
            idx[d] += 1
            if idx[d] < outer[d]:
                break
            idx[d] = 0
    return out


class Model:
    """One layout of the model: its placement and, per participant, buffers."""

    def __init__(self, spec: ModelSpec, layout: str = "tp", *, tp: int = 4, dp: int = 2, ep: int = 1,
                 placement_set_id: Optional[str] = None) -> None:
        self.spec = spec
        self.layout = layout
        b = PlacementBuilder(spec.resource_id, spec.revision, spec.generation,
                             placement_set_id or f"{layout}-tp{tp}-dp{dp}-ep{ep}",
                             tp_size=tp, dp_size=dp, ep_size=ep)
        self.participant_ids = b.add_grid("rank")
        self.tensors = {t.tensor_id: t for t in spec.tensors(layout)}
        for t in self.tensors.values():
            b.add_tensor(t)
            b.shard(t.tensor_id)
        self.builder = b
        self.placement: Placement = b.build()
        self._global: Dict[str, bytes] = {}

    def global_bytes(self, tensor_id: str) -> bytes:
        g = self._global.get(tensor_id)
        if g is None:
            g = self._global[tensor_id] = self.spec.global_bytes(self.tensors[tensor_id])
        return g

    def expected(self, fragment) -> bytearray:  # FragmentInfo
        t = self.tensors[fragment.tensor_id]
        return box_bytes(self.global_bytes(t.tensor_id), t.global_shape, t.itemsize,
                         fragment.global_offset, fragment.local_shape)

    def source_buffers(self, participant_id: str) -> Dict[str, bytearray]:
        """Buffers filled with the model's bytes (a live source)."""
        return {f.placement_fragment_id: self.expected(f)
                for f in self.placement.participant_fragments(participant_id)}

    def target_buffers(self, participant_id: str, fill: int = 0xFF) -> Dict[str, bytearray]:
        return {f.placement_fragment_id: bytearray([fill]) * f.nbytes
                for f in self.placement.participant_fragments(participant_id)}

    def bind(self, participant_id: str, buffers: Dict[str, bytearray], *, lease_id: str = "lease-1",
             instance_id: Optional[str] = None, lease_generation: Optional[int] = None) -> Binding:
        binding = Binding(self.placement, participant_id, lease_id=lease_id,
                          instance_id=instance_id, lease_generation=lease_generation)
        for fid, buf in buffers.items():
            binding.add(fid, buf)
        return binding

    def verify(self, participant_id: str, buffers: Dict[str, bytearray]) -> List[str]:
        """Fragment ids whose bytes differ from the model (empty = all good)."""
        bad = []
        for f in self.placement.participant_fragments(participant_id):
            if bytes(buffers[f.placement_fragment_id]) != bytes(self.expected(f)):
                bad.append(f.placement_fragment_id)
        return bad
