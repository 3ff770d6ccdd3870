"""Checkpoint a TP4 trainer into a directory store, restore it at TP2.

    python examples/python/checkpoint_reshard.py [--store DIR] [--save-tp 4] [--load-tp 2]

The four "trainer ranks" are threads here (ThreadExchange); in a real job each rank
is a process and passes TorchDistributedExchange() (torch.distributed) or
FileExchange(dir, rank, world) instead. Each rank saves only its own shards; rank 0
plans the upload and commits once every rank's receipts are in. The restore side
needs no exchange: each TP2 rank derives its boxes from the sharding.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

import numpy as np

import mooncake_weight_store as mws

H, LAYERS = 256, 4
# Megatron-style sharding: column-parallel weights split dim 0, row-parallel dim 1.
SHARDING = {
    "embed.weight": "colwise",
    "*.qkv.weight": "colwise",
    "*.o_proj.weight": "rowwise",
    "*.up.weight": "colwise",
    "*.down.weight": "rowwise",
    "*.norm.weight": "replicated",
}


def full_model() -> dict:
    rng = np.random.default_rng(0)
    sd = {"embed.weight": rng.standard_normal((16 * H, H), dtype=np.float32)}
    for l in range(LAYERS):
        sd[f"layers.{l}.qkv.weight"] = rng.standard_normal((3 * H, H), dtype=np.float32)
        sd[f"layers.{l}.o_proj.weight"] = rng.standard_normal((H, H), dtype=np.float32)
        sd[f"layers.{l}.up.weight"] = rng.standard_normal((4 * H, H), dtype=np.float32).astype(np.float16)
        sd[f"layers.{l}.down.weight"] = rng.standard_normal((H, 4 * H), dtype=np.float32).astype(np.float16)
        sd[f"layers.{l}.norm.weight"] = np.ones(H, dtype=np.float32)
    return sd


def shard(sd: dict, rank: int, size: int) -> dict:
    out = {}
    for name, a in sd.items():
        d = mws.state_dict.resolve_shard(SHARDING, name).dim
        if d is None:
            out[name] = a
        else:
            n = a.shape[d] // size
            out[name] = np.ascontiguousarray(np.take(a, range(rank * n, (rank + 1) * n), axis=d))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="directory store (default: a temporary directory)")
    ap.add_argument("--save-tp", type=int, default=4)
    ap.add_argument("--load-tp", type=int, default=2)
    a = ap.parse_args()
    root = a.store or tempfile.mkdtemp(prefix="mws-example-")
    full = full_model()
    total = sum(t.nbytes for t in full.values())
    print(f"model: {len(full)} tensors, {total / 2**20:.1f} MiB; store: {root}")

    # -- save: one thread per trainer rank ------------------------------------------------
    exchanges = mws.ThreadExchange.group(a.save_tp)
    manifests = [None] * a.save_tp

    def trainer_rank(r: int) -> None:
        with mws.Store.directory(root) as store:  # each rank opens its own handle
            manifests[r] = mws.save_state_dict(
                store, shard(full, r, a.save_tp), resource_id="example-model", revision="step-100", weight_generation=100,
                sharding=SHARDING, parallel=mws.Parallel(tp_rank=r, tp_size=a.save_tp), exchange=exchanges[r])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=trainer_rank, args=(r,)) for r in range(a.save_tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    manifest = manifests[0]
    print(f"saved at TP{a.save_tp} in {time.perf_counter() - t0:.2f}s: {manifest.key} "
          f"({manifest.fragment_count} fragments)")

    # -- restore at another TP degree -----------------------------------------------------
    with mws.Store.directory(root) as store:
        for r in range(a.load_tp):
            t0 = time.perf_counter()
            got = mws.load_state_dict(store, manifest.key, sharding=SHARDING,
                                      parallel=mws.Parallel(tp_rank=r, tp_size=a.load_tp))
            want = shard(full, r, a.load_tp)
            bad = [n for n in want if got[n].tobytes() != want[n].tobytes()]
            print(f"TP{a.load_tp} rank {r}: {len(got)} tensors in {time.perf_counter() - t0:.2f}s, "
                  f"{'all equal' if not bad else f'MISMATCH: {bad}'}")
            if bad:
                raise SystemExit(1)


if __name__ == "__main__":
    main()
