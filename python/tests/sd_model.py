"""A small transformer-shaped state dict with deterministic values, its TP sharding
in Megatron terms, and the reference shards (shared by the state_dict tests and
their worker processes)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is in the test venv
    BF16 = np.dtype(np.float16)

H = 16
LAYERS = 2

# column parallel (dim 0), row parallel (dim 1), replicated (norms, biases of row-parallel)
SHARDING = {
    "model.embed_tokens.weight": 0,
    "*.self_attn.qkv_proj.weight": "colwise",
    "*.self_attn.o_proj.weight": "rowwise",
    "*.mlp.gate_up_proj.weight": 0,
    "*.mlp.down_proj.weight": 1,
    "*.input_layernorm.weight": None,
    "lm_head.weight": 0,
}


def reference() -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(42)
    sd: Dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((8 * H, H)).astype(BF16)}
    for l in range(LAYERS):
        p = f"model.layers.{l}"
        sd[f"{p}.self_attn.qkv_proj.weight"] = rng.standard_normal((3 * H, H)).astype(BF16)
        sd[f"{p}.self_attn.o_proj.weight"] = rng.standard_normal((H, H)).astype(np.float32)
        sd[f"{p}.mlp.gate_up_proj.weight"] = rng.standard_normal((4 * H, H)).astype(np.float16)
        sd[f"{p}.mlp.down_proj.weight"] = rng.standard_normal((H, 2 * H)).astype(BF16)
        sd[f"{p}.input_layernorm.weight"] = rng.standard_normal(H).astype(np.float32)
    sd["lm_head.weight"] = rng.standard_normal((8 * H, H)).astype(BF16)
    sd["step"] = np.array(7, dtype=np.int64)
    return sd


def split_dim(name: str):
    import mooncake_weight_store as mws

    return mws.state_dict.resolve_shard(SHARDING, name).dim


def shard_of(sd: Dict[str, np.ndarray], tp_rank: int, tp_size: int) -> Dict[str, np.ndarray]:
    """This TP rank's contiguous shards (even split)."""
    out = {}
    for name, a in sd.items():
        d = split_dim(name)
        if d is None or tp_size == 1:
            out[name] = a
        else:
            n = a.shape[d] // tp_size
            sl = [slice(None)] * a.ndim
            sl[d] = slice(tp_rank * n, (tp_rank + 1) * n)
            out[name] = np.ascontiguousarray(a[tuple(sl)])
    return out


def run_ranks(n: int, fn: Callable[[int, Any], Any]) -> List[Any]:
    """Runs ``fn(rank, exchange)`` on ``n`` threads (a ThreadExchange group); returns
    the results (or the exceptions raised)."""
    import mooncake_weight_store as mws

    exs = mws.ThreadExchange.group(n, timeout=60)
    out: List[Any] = [None] * n

    def body(r: int) -> None:
        try:
            out[r] = fn(r, exs[r])
        except BaseException as e:  # noqa: BLE001
            out[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out
