"""Benchmark: our reader (``Loader.load_live`` over :class:`MooncakeTransferEngine`)
against raw ``batch_transfer_sync_read`` of the same ranges, on the real Mooncake
Transfer Engine between two processes (loopback TCP, P2PHANDSHAKE). Not a test.

    python python/bench_te.py [--mib 512] [--reshard-mib 64] [--repeat 3]

Cases (each: raw TE first, then ours, best of ``--repeat``; both results compared
byte for byte, SHA-256 of the whole target arena):

* ``same``: TP4 -> TP4, the same layout: one range per fragment (~``--mib`` MiB);
* ``reshard``: TP4 -> TP2 (column splits: short rows), ~``--reshard-mib`` MiB.

Prints GB/s, microseconds per TE range, and the ratio ours/raw. The peer process
holds the source arena (registered once); this process holds the target arena.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import subprocess
import sys
import time

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
os.environ.setdefault("GLOG_minloglevel", "1")

import mooncake_weight_store as mws  # noqa: E402
from mooncake_weight_store.te_backend import MooncakeTransferEngine  # noqa: E402
from mooncake_weight_store.testing import Model, ModelSpec  # noqa: E402

PEER = r"""
import ctypes, json, os, sys
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
size = int(sys.argv[1])
buf = (ctypes.c_char * size)()
a = ctypes.addressof(buf)
chunk = os.urandom(1 << 20)
for off in range(0, size, 1 << 20):
    n = min(1 << 20, size - off)
    ctypes.memmove(a + off, chunk[:n], n)
    chunk = chunk[7:] + chunk[:7]
assert e.register_memory(a, size) == 0
print(json.dumps({"segment": f"127.0.0.1:{e.get_rpc_port()}", "addr": a}), flush=True)
sys.stdin.readline()
e.unregister_memory(a)
"""


def layout(m: Model) -> tuple:
    off, lay = 0, {}
    for p in m.participant_ids:
        for f in m.placement.participant_fragments(p):
            lay[f.placement_fragment_id] = off
            off += (f.nbytes + 63) // 64 * 64
    return lay, off


def strides(shape, isz):
    st, acc = [0] * len(shape), isz
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= shape[d]
    return st


def raw_ranges(src: Model, slay: dict, sbase: int, dst: Model, dlay: dict, dbase: int) -> list:
    """(local, remote, len) of every contiguous run source box -> target box (one
    source copy per distinct shard)."""
    shards = {}
    for p in src.participant_ids:
        for f in src.placement.participant_fragments(p):
            shards.setdefault((f.tensor_id, tuple(f.global_offset), tuple(f.local_shape)), f)
    by_tensor: dict = {}
    for f in shards.values():
        by_tensor.setdefault(f.tensor_id, []).append(f)
    out = []
    for p in dst.participant_ids:
        for t in dst.placement.participant_fragments(p):
            for s in by_tensor[t.tensor_id]:
                nd = len(t.local_shape)
                lo = [max(t.global_offset[d], s.global_offset[d]) for d in range(nd)]
                hi = [min(t.global_offset[d] + t.local_shape[d], s.global_offset[d] + s.local_shape[d])
                      for d in range(nd)]
                shp = [hi[d] - lo[d] for d in range(nd)]
                if nd == 0 or any(x <= 0 for x in shp):
                    continue
                isz = t.itemsize
                ts, ss = strides(t.local_shape, isz), strides(s.local_shape, isz)
                k = nd - 1
                while k > 0 and shp[k] == t.local_shape[k] == s.local_shape[k]:
                    k -= 1
                run = math.prod(shp[k:]) * isz
                tb = dbase + dlay[t.placement_fragment_id] + sum((lo[d] - t.global_offset[d]) * ts[d]
                                                                 for d in range(nd))
                sb = sbase + slay[s.placement_fragment_id] + sum((lo[d] - s.global_offset[d]) * ss[d]
                                                                 for d in range(nd))
                idx = [0] * k
                for _ in range(math.prod(shp[:k]) if k else 1):
                    out.append((tb + sum(idx[d] * ts[d] for d in range(k)),
                                sb + sum(idx[d] * ss[d] for d in range(k)), run))
                    for d in range(k - 1, -1, -1):
                        idx[d] += 1
                        if idx[d] < shp[d]:
                            break
                        idx[d] = 0
    return out


def case(name: str, src: Model, dst: Model, repeat: int) -> dict:
    slay, ssize = layout(src)
    dlay, dsize = layout(dst)
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(ssize)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        hello = json.loads(peer.stdout.readline())  # type: ignore[union-attr]
        seg, sbase = hello["segment"], hello["addr"]
        eng = MooncakeTransferEngine()
        arena = (ctypes.c_char * dsize)()
        dbase = ctypes.addressof(arena)
        eng.register_memory(dbase, dsize)
        sources = []
        for p in src.participant_ids:
            b = mws.Binding(src.placement, p, endpoint=seg)
            for f in src.placement.participant_fragments(p):
                b.add_address(f.placement_fragment_id, sbase + slay[f.placement_fragment_id], f.nbytes)
            sources.append(b)
        targets = []
        for p in dst.participant_ids:
            b = mws.Binding(dst.placement, p, endpoint=eng.segment)
            for f in dst.placement.participant_fragments(p):
                b.add_address(f.placement_fragment_id, dbase + dlay[f.placement_fragment_id], f.nbytes)
            targets.append(b)
        plan = mws.TransferPlan.plan(src.placement, dst.placement).bind(targets, sources)
        ranges = raw_ranges(src, slay, sbase, dst, dlay, dbase)
        total = sum(r[2] for r in ranges)
        assert total == plan.total_bytes, (total, plan.total_bytes)

        def raw() -> int:
            te = eng.te
            for i in range(0, len(ranges), 1024):
                part = ranges[i:i + 1024]
                rc = te.batch_transfer_sync_read(seg, [r[0] for r in part], [r[1] for r in part],
                                                 [r[2] for r in part])
                assert rc == 0, rc
            return len(ranges)

        def ours() -> int:
            ops = 0
            with mws.Loader(eng) as loader:
                for b in targets:
                    ops += loader.load_live(plan, src.placement, sources, dst.placement, b,
                                            local_pre_registered=True).operations
            return ops

        res = {}
        digests = {}
        for label, fn in (("raw", raw), ("ours", ours)):
            best = float("inf")
            for _ in range(repeat):
                ctypes.memset(dbase, 0, dsize)
                t0 = time.perf_counter()
                ops = fn()
                best = min(best, time.perf_counter() - t0)
            digests[label] = hashlib.sha256(memoryview(arena)).hexdigest()
            res[label] = {"seconds": round(best, 4), "GB/s": round(total / best / 1e9, 3), "ops": ops,
                          "us_per_op": round(best / ops * 1e6, 2)}
        assert digests["raw"] == digests["ours"], "ours and raw moved different bytes"
        eng.unregister_memory(dbase)
        out = {"case": name, "bytes": total, **{f"{k}_{m}": v for k, d in res.items() for m, v in d.items()},
               "ratio_ours_over_raw_GBps": round(res["ours"]["GB/s"] / res["raw"]["GB/s"], 3)}
        print(json.dumps(out), flush=True)
        return out
    finally:
        if peer.poll() is None:
            try:
                peer.stdin.write("quit\n")  # type: ignore[union-attr]
                peer.stdin.flush()  # type: ignore[union-attr]
                peer.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                peer.kill()
                peer.wait(timeout=10)


def spec_for(mib: int) -> ModelSpec:
    h = 1024
    layers = max(1, round(mib * (1 << 20) / (24 * h * h)))
    return ModelSpec(hidden=h, layers=layers)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reshard-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    s = spec_for(a.mib)
    case("same TP4->TP4", Model(s, "tp", tp=4, dp=1, placement_set_id="a"),
         Model(s, "tp", tp=4, dp=1, placement_set_id="b"), a.repeat)
    s = spec_for(a.reshard_mib)
    case("reshard TP4->TP2", Model(s, "tp", tp=4, dp=1, placement_set_id="a"),
         Model(s, "tp", tp=2, dp=1, placement_set_id="b"), a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
