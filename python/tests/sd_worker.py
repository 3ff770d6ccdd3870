"""One rank of the multi-process state_dict tests (a separate process).

    python sd_worker.py save --store DIR --exchange DIR --rank R --world N --tp T --dp D --out F
    python sd_worker.py load --store DIR --exchange DIR --rank R --world N --tp T --key K --out F
    python sd_worker.py fail --store DIR --exchange DIR --rank R --world N --tp T --out F

``save``: rank ``R`` (tp = R % T, dp = R // T) saves its TP shard of the reference
model (tests/sd_model.py) through a FileExchange; ``load``: every rank loads its TP
shard of revision ``K`` with the exchange (uneven boxes gathered) and writes the
arrays (``.npz``); ``fail``: like save, but rank 1 passes a non-contiguous tensor.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sd_model import SHARDING, reference, shard_of  # noqa: E402

import mooncake_weight_store as mws  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["save", "load", "fail"])
    ap.add_argument("--store", required=True)
    ap.add_argument("--exchange", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--key")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ex = mws.FileExchange(a.exchange, a.rank, a.world, timeout=60)
    par = mws.Parallel(tp_rank=a.rank % a.tp, tp_size=a.tp, dp_rank=a.rank // a.tp, dp_size=a.dp)
    res = {"rank": a.rank}
    with mws.Store.directory(a.store) as store:
        try:
            if a.cmd in ("save", "fail"):
                sd = shard_of(reference(), par.tp_rank, par.tp_size)
                if a.cmd == "fail" and a.rank == 1:
                    sd["model.layers.0.mlp.down_proj.weight"] = sd["model.layers.0.mlp.down_proj.weight"].T
                m = save_state_dict_rank(store, sd, par, ex)
                res.update(key=m.key, digest=m.digest, fragments=m.fragment_count)
            else:
                out = mws.load_state_dict(store, a.key, sharding=SHARDING, parallel=par, exchange=ex)
                np.savez(a.out + ".npz", **out)
                res["names"] = sorted(out)
        except Exception as e:  # reported to the test
            res["error"] = f"{type(e).__name__}: {e}"
            res["traceback"] = traceback.format_exc()
    Path(a.out).write_text(json.dumps(res))
    return 0


def save_state_dict_rank(store, sd, par, ex):
    return mws.save_state_dict(store, sd, resource_id="qwen-mini", revision="step-7", weight_generation=7,
                               sharding=SHARDING, parallel=par, exchange=ex)


if __name__ == "__main__":
    sys.exit(main())
