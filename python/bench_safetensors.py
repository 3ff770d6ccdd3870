"""Import + restore a safetensors checkpoint vs reading it with safetensors itself.

    python python/bench_safetensors.py [--gib 1.0] [--tensors 32] [--store directory|memory|both] [--dir DIR]

Writes a checkpoint of ``--gib`` GiB (float16/bfloat16 tensors, two files) with
safetensors, then times, in the same run and on the same (page-cached) files:

* ``safetensors``: ``safetensors.numpy.load_file`` of every file (the baseline: the
  bytes end up in numpy arrays);
* ``import``: :func:`import_safetensors` into the store (memory-mapped, the store
  reads the mapped pages);
* ``restore``: :func:`load_state_dict` of the whole revision into numpy arrays, and
  one TP2 rank's shards;

and prints the times, GiB/s and the ratios against the baseline. Each number is the
best of ``--repeat`` runs (default 3). Nothing is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import safetensors.numpy as stn

import mooncake_weight_store as mws

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = np.dtype(np.float16)


def write_checkpoint(d: Path, gib: float, n: int) -> list:
    per = int(gib * (1 << 30)) // n
    cols = 4096
    rows = max(1, per // (2 * cols))
    rng = np.random.default_rng(0)
    files = [{}, {}]
    for i in range(n):
        a = rng.integers(0, 1 << 16, size=(rows, cols), dtype=np.uint16)
        files[i % 2][f"model.layers.{i}.mlp.weight"] = a.view(BF16 if i % 3 else np.float16)
    paths = []
    for k, part in enumerate(files):
        p = d / f"model-{k + 1:05d}-of-00002.safetensors"
        stn.save_file(part, str(p))
        paths.append(p)
    return paths


def best(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        out = None
        gc.collect()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--store", choices=["directory", "memory", "both"], default="both")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="mws-bench-st-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        paths = write_checkpoint(work, a.gib, a.tensors)
        size = sum(os.path.getsize(p) for p in paths)
        gib = size / (1 << 30)
        print(f"checkpoint: {len(paths)} files, {a.tensors} tensors, {gib:.3f} GiB (written in "
              f"{time.perf_counter() - t:.1f}s); library {mws.library_path()}")

        def st_load():
            out = {}
            for p in paths:
                out.update(stn.load_file(str(p)))
            return out

        t_st, ref = best(st_load, a.repeat)
        print(f"{'safetensors.numpy.load_file':34s} {t_st:7.3f}s  {gib / t_st:6.2f} GiB/s  (baseline)")
        kinds = ["directory", "memory"] if a.store == "both" else [a.store]
        sharding = {"*": 0}
        for kind in kinds:
            rev = iter(range(1 << 30))

            def open_store():
                if kind == "memory":
                    return mws.Store.memory()
                d = work / f"store-{kind}"
                shutil.rmtree(d, ignore_errors=True)
                return mws.Store.directory(d)

            stores = []

            def do_import():
                s = open_store()
                stores.append(s)
                return s, mws.import_safetensors(s, paths, resource_id="bench", revision=f"r{next(rev)}",
                                                 weight_generation=1)

            t_imp, (store, man) = best(do_import, a.repeat)
            for s in stores[:-1]:
                s.close()
            t_full, got = best(lambda: mws.load_state_dict(store, man.key), a.repeat)
            bad = [n for n in ref if got[n].tobytes() != ref[n].tobytes()]
            del got
            t_tp2, _ = best(lambda: mws.load_state_dict(store, man.key, sharding=sharding,
                                                        parallel=mws.Parallel(tp_rank=1, tp_size=2)), a.repeat)
            print(f"{kind + ': import_safetensors':34s} {t_imp:7.3f}s  {gib / t_imp:6.2f} GiB/s  "
                  f"x{t_imp / t_st:.2f} of baseline")
            print(f"{kind + ': restore whole (TP1)':34s} {t_full:7.3f}s  {gib / t_full:6.2f} GiB/s  "
                  f"x{t_full / t_st:.2f} of baseline{'' if not bad else f'  MISMATCH {bad[:3]}'}")
            print(f"{kind + ': restore one TP2 rank':34s} {t_tp2:7.3f}s  {gib / 2 / t_tp2:6.2f} GiB/s  "
                  f"x{t_tp2 / t_st:.2f} of baseline")
            print(f"{kind + ': import + restore TP1':34s} {t_imp + t_full:7.3f}s  "
                  f"x{(t_imp + t_full) / t_st:.2f} of baseline")
            man.close()
            store.close()
            if bad:
                raise SystemExit(f"restore differs from safetensors for {len(bad)} tensors")
    finally:
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
