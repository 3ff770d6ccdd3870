"""Part 2 of scripts/gpu-check.sh: torch CUDA tensors through the Python binding.

A ~1 GiB bf16 state_dict in GPU memory is saved into the memory store and into a
Python-backend store (device bytes staged by the library's CUDA engine on torch's
current stream), then restored as TP2 into CUDA tensors (column and row splits) and
compared with torch.equal against slices of the source; a flipped stored byte must
fail the restore with IntegrityError and leave the CUDA target untouched. Timed
against a torch pinned host -> device copy of the same bytes. Ends with `figure:`
lines. Needs torch with a CUDA device.
"""

from __future__ import annotations

import sys
import time

import torch

import mooncake_weight_store as mws
from mooncake_weight_store import DeviceEngine, Parallel, Store, load_state_dict, save_state_dict


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check_torch: torch sees no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    hidden, layers = 4096, 8
    g = torch.Generator(device=dev).manual_seed(1)
    sd = {}
    sharding = {}
    for i in range(layers):
        for name, shape, dim in (("qkv", (3 * hidden, hidden), 0), ("o", (hidden, hidden), 1),
                                 ("up", (2 * hidden, hidden), 0), ("down", (hidden, 2 * hidden), 1)):
            key = f"model.layers.{i}.{name}.weight"
            sd[key] = torch.randn(shape, dtype=torch.bfloat16, device=dev, generator=g)
            sharding[key] = dim
        sd[f"model.layers.{i}.norm.weight"] = torch.randn(hidden, dtype=torch.bfloat16, device=dev, generator=g)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"state_dict: {len(sd)} CUDA tensors, {total / 2**30:.2f} GiB, bf16")

    # Baseline: a torch copy of the same bytes from pinned host memory.
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    flat = torch.empty(total, dtype=torch.uint8, device=dev)
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        flat.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    h2d = min(times)
    del host, flat
    print(f"baseline: torch pinned H2D {total / h2d / 1e9:.1f} GB/s")

    engine = DeviceEngine.for_torch()
    results = {}
    for kind in ("memory", "backend"):
        store = Store.memory(device_engine=engine) if kind == "memory" else Store.from_backend(
            mws.DictBackend(), device_engine=engine)
        with store:
            torch.cuda.synchronize()
            t = time.perf_counter()
            m = save_state_dict(store, sd, resource_id="gpu-check", revision="r1", weight_generation=1)
            save = time.perf_counter() - t
            restore = float("inf")
            for rank in range(2):
                into = {}
                for k, v in sd.items():
                    shape = list(v.shape)
                    if k in sharding:
                        shape[sharding[k]] //= 2
                    into[k] = torch.full(shape, 7, dtype=torch.bfloat16, device=dev)
                torch.cuda.synchronize()
                t = time.perf_counter()
                load_state_dict(store, m.key, into=into, sharding=sharding, parallel=Parallel(tp_rank=rank, tp_size=2))
                torch.cuda.synchronize()
                restore = min(restore, (time.perf_counter() - t) * 2)  # one rank reads half the bytes
                for k, v in sd.items():
                    want = v.chunk(2, dim=sharding[k])[rank] if k in sharding else v
                    if not torch.equal(into[k], want):
                        print(f"FAIL: {kind}: {k} of rank {rank} differs from the source", file=sys.stderr)
                        return 1
            print(f"check: {kind} store: saved {total} bytes from CUDA tensors in {save:.3f} s, restored as TP2 "
                  f"into CUDA tensors ({total / restore / 1e9:.1f} GB/s), every tensor equal")
            results[kind] = (save, restore)
            if kind == "memory":
                # A flipped stored byte never reaches the GPU.
                key = m.object_keys[0]
                data = bytearray(store.get(key))
                data[len(data) // 2] ^= 0x10
                store.upsert(key, bytes(data))
                name = next(f.tensor_id for f in m.fragments() if f.object_key == key)
                target = {name: torch.full(sd[name].shape, 7, dtype=torch.bfloat16, device=dev)}
                try:
                    load_state_dict(store, m.key, into=target, names=[name])
                    print("FAIL: a corrupt payload was restored", file=sys.stderr)
                    return 1
                except mws.IntegrityError as e:
                    assert bool((target[name] == 7).all()), "the CUDA target was written"
                    print(f"check: a flipped byte fails the restore ({str(e)[:60]}...), the CUDA tensor untouched")
            m.close()
    stats = engine.stats()
    print(f"device engine: {stats}")
    print(f"figure: torch_restore_vs_h2d_memcpy = {h2d / results['memory'][1]:.3f}")
    print(f"figure: torch_backend_restore_vs_h2d_memcpy = {h2d / results['backend'][1]:.3f}")
    print(f"figure: torch_save_vs_h2d_memcpy = {h2d / results['memory'][0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
