"""Serve a safetensors checkpoint at TP2: import the files into a store once, then
each of two serving ranks restores only its own shards.

    python examples/python/serve_safetensors_tp2.py [--checkpoint DIR] [--store DIR]

Without --checkpoint a small Hugging Face style checkpoint (two files, numpy +
safetensors) is written first. The import binds the tensors inside the memory-mapped
files (no copy in Python); each rank's restore reads only its rows and columns.
Rank 1's shard is also exported as a .safetensors file and read back with the
safetensors package.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import safetensors.numpy as stn

import mooncake_weight_store as mws

SHARDING = {
    "model.embed_tokens.weight": 0,
    "*.self_attn.q_proj.weight": 0, "*.self_attn.k_proj.weight": 0, "*.self_attn.v_proj.weight": 0,
    "*.self_attn.o_proj.weight": 1,
    "*.mlp.gate_proj.weight": 0, "*.mlp.up_proj.weight": 0, "*.mlp.down_proj.weight": 1,
    "lm_head.weight": 0,
}  # norms: replicated


def write_checkpoint(d: Path, hidden: int = 128, layers: int = 2) -> None:
    rng = np.random.default_rng(1)
    f16 = np.float16

    def w(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(f16)

    parts = [{"model.embed_tokens.weight": w(1024, hidden)}, {"lm_head.weight": w(1024, hidden),
                                                             "model.norm.weight": np.ones(hidden, f16)}]
    for l in range(layers):
        p = f"model.layers.{l}"
        parts[l % 2].update({
            f"{p}.self_attn.q_proj.weight": w(hidden, hidden), f"{p}.self_attn.k_proj.weight": w(hidden, hidden),
            f"{p}.self_attn.v_proj.weight": w(hidden, hidden), f"{p}.self_attn.o_proj.weight": w(hidden, hidden),
            f"{p}.mlp.gate_proj.weight": w(4 * hidden, hidden), f"{p}.mlp.up_proj.weight": w(4 * hidden, hidden),
            f"{p}.mlp.down_proj.weight": w(hidden, 4 * hidden), f"{p}.input_layernorm.weight": np.ones(hidden, f16),
        })
    for i, part in enumerate(parts):
        stn.save_file(part, str(d / f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"), metadata={"format": "pt"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", help="directory of .safetensors files (default: write a small one)")
    ap.add_argument("--store", help="directory store (default: a temporary directory)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mws-serve-"))
    ckpt = Path(a.checkpoint) if a.checkpoint else work / "checkpoint"
    if not a.checkpoint:
        ckpt.mkdir()
        write_checkpoint(ckpt)
    files = sorted(ckpt.glob("*.safetensors"))
    with mws.Store.directory(a.store or work / "store") as store:
        t0 = time.perf_counter()
        m = mws.import_safetensors(store, files, resource_id="served-model", revision="main", weight_generation=1)
        print(f"imported {len(files)} files, {m.tensor_count} tensors, {m.total_bytes / 2**20:.1f} MiB "
              f"in {time.perf_counter() - t0:.2f}s -> {m.key}")
        reference = {}
        for f in files:
            reference.update(stn.load_file(str(f)))
        for rank in range(2):
            par = mws.Parallel(tp_rank=rank, tp_size=2)
            t0 = time.perf_counter()
            shards = mws.load_state_dict(store, m.key, sharding=SHARDING, parallel=par)
            dt = time.perf_counter() - t0
            bad = []
            for n, got in shards.items():
                d = mws.state_dict.resolve_shard(SHARDING, n).dim
                want = reference[n] if d is None else np.array_split(reference[n], 2, axis=d)[rank]
                if got.tobytes() != np.ascontiguousarray(want).tobytes():
                    bad.append(n)
            nbytes = sum(s.nbytes for s in shards.values())
            print(f"TP2 rank {rank}: {len(shards)} tensors, {nbytes / 2**20:.1f} MiB in {dt:.2f}s, "
                  f"{'all equal to safetensors' if not bad else f'MISMATCH: {bad}'}")
            if bad:
                raise SystemExit(1)
        out = work / "tp2-rank1.safetensors"
        mws.export_safetensors(store, m.key, out, layout=mws.Layout(mws.Parallel(tp_rank=1, tp_size=2), SHARDING))
        back = stn.load_file(str(out))
        print(f"exported rank 1's shard: {out} ({len(back)} tensors, read back by safetensors)")


if __name__ == "__main__":
    main()
