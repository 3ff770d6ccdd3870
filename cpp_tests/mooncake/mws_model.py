"""examples/support/mws_model.hpp in Python, for the cross-language tests on the REAL
Mooncake engines (py_role.py with te_role.cpp, store_py_role.py with store_role.cpp):
the same synthetic sharded transformer (model_tensors), its placement in any
TP x PP x EP x DP layout (placement), and the same deterministic bytes
(expected_bytes), so a C++ process and a Python process check each other's bytes
exactly. Needs numpy and the library's Python package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from mooncake_weight_store.placement import (
    Ownership,
    Placement,
    PlacementBuilder,
    Replicated,
    Split,
    TensorSpec,
)

K = np.uint64(0x9E3779B97F4A7C15)
FINGERPRINT = "test:row-major:v1"  # mws_model.hpp's layout_fingerprint


def tensor_seed(content_id: str) -> int:
    h = 0xcbf29ce484222325
    for c in content_id.encode():
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def expected_bytes(content_id: str, gshape, item: int, offset, shape) -> bytes:
    """mws_model.hpp's expected_bytes, vectorised: byte b of the element with global
    linear index L is ((seed ^ (L * item + b)) * K) >> 56 (64-bit wrap)."""
    lin = np.zeros((), dtype=np.uint64)
    for d in range(len(shape)):
        idx = np.arange(offset[d], offset[d] + shape[d], dtype=np.uint64)
        lin = lin[..., None] * np.uint64(gshape[d]) + idx
    lin = lin.reshape(-1)
    seed = np.uint64(tensor_seed(content_id))
    out = np.empty((lin.size, item), dtype=np.uint8)
    with np.errstate(over="ignore"):
        for b in range(item):
            x = (seed ^ (lin * np.uint64(item) + np.uint64(b))) * K
            out[:, b] = (x >> np.uint64(56)).astype(np.uint8)
    return out.tobytes()


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1


@dataclass
class TensorDef:
    id: str
    shape: Tuple[int, ...]
    tp_split: int = -1  # -1: TP-replicated
    expert: int = -1  # -1: EP-replicated
    experts: int = 0
    layer: int = -1  # -1: first stage
    layers: int = 1
    itemsize: int = 2
    aliases: List[str] = field(default_factory=list)


def model_tensors(layers: int, hidden: int, experts: int, dense_layers: int = 0) -> List[TensorDef]:
    """mws_model.hpp's model_tensors: the same ids, shapes and axes, in the same order."""
    v = [TensorDef("model.embed_tokens.weight", (4 * hidden, hidden), tp_split=0)]
    for l in range(layers):
        def t(name: str, shape: Tuple[int, ...], tp: int) -> TensorDef:
            return TensorDef(f"model.layers.{l}.{name}", shape, tp_split=tp, layer=l, layers=layers)

        v.append(t("input_layernorm.weight", (hidden,), -1))
        v.append(t("self_attn.qkv_proj.weight", (3 * hidden, hidden), 0))
        v.append(t("self_attn.o_proj.weight", (hidden, hidden), 1))
        if experts == 0 or l < dense_layers:
            v.append(t("mlp.up_proj.weight", (2 * hidden, hidden), 0))
            v.append(t("mlp.down_proj.weight", (hidden, 2 * hidden), 1))
            continue
        for e in range(experts):
            for name, shape, tp in ((f"mlp.experts.{e}.gate_up_proj.weight", (hidden, hidden), 0),
                                    (f"mlp.experts.{e}.down_proj.weight", (hidden, hidden // 2), 1)):
                d = t(name, shape, tp)
                d.expert, d.experts = e, experts
                v.append(d)
    return v


def placement(set_id: str, L: Layout, defs: List[TensorDef], generation: int, resource_id: str = "test-model",
              revision: str = "rev-1") -> Placement:
    """mws_model.hpp's placement_json, built through the library's placement builder:
    participants ``w-d{dp}-p{pp}-e{ep}-t{tp}``, fragments ``f:<tensor>@<participant>``."""
    b = PlacementBuilder(resource_id, revision, generation, set_id, tp_size=L.tp, pp_size=L.pp, ep_size=L.ep,
                         dp_size=L.dp)
    ranks = {p: b.participants[p] for p in b.add_grid("w")}
    for d in defs:
        axes = (Replicated("dp"), Ownership("pp"), Ownership("ep") if d.expert >= 0 else Replicated("ep"),
                Split("tp", d.tp_split) if d.tp_split >= 0 else Replicated("tp"))
        b.add_tensor(TensorSpec(d.id, d.shape, "bfloat16", d.itemsize, axes, FINGERPRINT,
                                layer_id=d.layer if d.layer >= 0 else None,
                                expert_id=d.expert if d.expert >= 0 else None))
        pp_owner = d.layer * L.pp // d.layers if d.layer >= 0 else 0
        for p, r in ranks.items():
            if r.pp != pp_owner or (d.expert >= 0 and r.ep != d.expert // (d.experts // L.ep)):
                continue
            off, shape = [0] * len(d.shape), list(d.shape)
            if d.tp_split >= 0:
                shape[d.tp_split] //= L.tp
                off[d.tp_split] = r.tp * shape[d.tp_split]
            b.add_fragment(p, d.id, off, shape, placement_fragment_id=f"f:{d.id}@{p}", aliases=d.aliases)
    try:
        return b.build()
    finally:
        b.close()


class HostModel:
    """A placement bound to host buffers (one bytearray per fragment): filled with the
    model's bytes (a source) or 0xA5 (a restore target), as mws_model.hpp's HostModel."""

    def __init__(self, placement: Placement, defs: List[TensorDef], fill: bool, salt: str = "") -> None:
        self.placement = placement
        self.defs: Dict[str, TensorDef] = {d.id: d for d in defs}
        self.salt = salt
        self.frags = placement.fragments()
        self.buffers: Dict[str, bytearray] = {}
        for f in self.frags:
            self.buffers[f.placement_fragment_id] = (bytearray(self.expected(f)) if fill
                                                     else bytearray(b"\xa5") * f.nbytes)
        self.participants = sorted({f.participant_id for f in self.frags})

    def expected(self, f) -> bytes:
        d = self.defs[f.tensor_id]
        content = d.aliases[0] if d.aliases else d.id
        return expected_bytes(content + self.salt, d.shape, f.itemsize, f.global_offset, f.local_shape)

    def bindings(self, instance: str, lease_id: Optional[str] = None) -> list:
        from mooncake_weight_store import Binding

        out = []
        for p in self.participants:
            b = Binding(self.placement, p, instance_id=f"{instance}-{p}", lease_id=lease_id or f"{instance}-lease")
            for f in self.frags:
                if f.participant_id == p:
                    b.add(f.placement_fragment_id, self.buffers[f.placement_fragment_id])
            out.append(b)
        return out

    def verify(self) -> Tuple[int, List[str]]:
        """(bytes checked, placement fragment ids whose bytes differ)."""
        bad, n = [], 0
        for f in self.frags:
            if bytes(self.buffers[f.placement_fragment_id]) != self.expected(f):
                bad.append(f.placement_fragment_id)
            n += f.nbytes
        return n, bad
