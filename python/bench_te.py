"""Benchmark: our reader (``Loader.load_live``) and sink (``Sink.execute``) over
:class:`MooncakeTransferEngine` against raw ``batch_transfer_sync_read`` /
``batch_transfer_sync_write`` of the same ranges, on the real Mooncake Transfer
Engine between two processes (loopback TCP, P2PHANDSHAKE). Not a test.

    python python/bench_te.py [--mib 512] [--reshard-mib 64] [--small-layers 256] [--repeat 3]
                              [--cases same,reshard,small] [--directions read,write]

Cases, each in both directions (``read``: this process pulls into its arena from the
peer's; ``write``: it pushes from its arena into the peer's):

* ``same``: TP4 -> TP4, the same layout: one range per fragment (~``--mib`` MiB);
* ``reshard``: TP4 -> TP2 (column splits: many short rows), ~``--reshard-mib`` MiB;
* ``small``: TP4 -> TP4 of a model with many small tensors (hidden 32,
  ``--small-layers`` layers, fragments of 64 B to 4 KiB): per-operation cost dominates.

Every fragment of a participant lies in one allocation (its slice of the arena, as a
framework's flat parameter buffer), so adjacent ranges can be merged (coalescing,
on by default). Variants, each best of ``--repeat``, all compared byte for byte
(SHA-256 of the whole target arena): ``raw`` (TE calls on the planned ranges, 1024
per batch), ``ours`` (default: coalesced), ``ours_plain`` (``coalesce=False``, one TE
range per planned segment; run only where coalescing merged something).

Prints, per variant, GB/s, TE operations (``engine_ops``), microseconds per TE
operation and per planned segment, ``ops`` (planned segments), and the ratios
ours/raw and plain/raw (GB/s).
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

FILL = r"""
def fill(a, size):
    chunk = os.urandom(1 << 20)
    for off in range(0, size, 1 << 20):
        n = min(1 << 20, size - off)
        ctypes.memmove(a + off, chunk[:n], n)
        chunk = chunk[7:] + chunk[:7]
"""

# The peer: holds one registered arena (random contents or zeros); answers "sha"
# (SHA-256 of the arena) and "zero" (clears it) on stdin, anything else stops it.
PEER = r"""
import ctypes, hashlib, json, os, sys
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
from mooncake.engine import TransferEngine
""" + FILL + r"""
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
size = int(sys.argv[1])
buf = (ctypes.c_char * size)()
a = ctypes.addressof(buf)
if sys.argv[2] == "fill":
    fill(a, size)
assert e.register_memory(a, size) == 0
print(json.dumps({"segment": f"127.0.0.1:{e.get_rpc_port()}", "addr": a}), flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "sha":
        print(hashlib.sha256(memoryview(buf)).hexdigest(), flush=True)
    elif cmd == "zero":
        ctypes.memset(a, 0, size)
        print("ok", flush=True)
    else:
        break
e.unregister_memory(a)
"""

exec(FILL)  # defines fill(a, size) here too


def layout(m: Model) -> tuple:
    """Fragment offsets in one arena (64-byte aligned, participants one after the
    other), each participant's (start, size), and the arena size."""
    off, lay, parts = 0, {}, {}
    for p in m.participant_ids:
        start = off
        for f in m.placement.participant_fragments(p):
            lay[f.placement_fragment_id] = off
            off += (f.nbytes + 63) // 64 * 64
        parts[p] = (start, max(off - start, 1))
    return lay, parts, max(off, 1)


def bindings(m: Model, lay: dict, parts: dict, base: int, endpoint: str) -> list:
    """One binding per participant; its fragments' storage is its slice of the arena."""
    out = []
    for p in m.participant_ids:
        start, size = parts[p]
        b = mws.Binding(m.placement, p, endpoint=endpoint)
        for f in m.placement.participant_fragments(p):
            off = lay[f.placement_fragment_id]
            b.add_address(f.placement_fragment_id, base + off, f.nbytes, storage_address=base + start,
                          storage_nbytes=size, storage_offset_bytes=off - start)
        out.append(b)
    return out


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


class Peer:
    def __init__(self, size: int, fill_it: bool) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PEER, str(size), "fill" if fill_it else "zero"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        hello = json.loads(self.ask(None))
        self.segment, self.addr = hello["segment"], hello["addr"]

    def ask(self, cmd) -> str:
        if cmd is not None:
            self.proc.stdin.write(cmd + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the peer process stopped")
        return line.strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)


def case(name: str, src: Model, dst: Model, direction: str, repeat: int) -> dict:
    """``read``: the peer holds the source arena, this process the target; ``write``:
    this process holds the source arena and pushes into the peer's target arena."""
    slay, sparts, ssize = layout(src)
    dlay, dparts, dsize = layout(dst)
    read = direction == "read"
    peer = Peer(ssize if read else dsize, fill_it=read)
    try:
        eng = MooncakeTransferEngine()
        arena = (ctypes.c_char * (dsize if read else ssize))()
        base = ctypes.addressof(arena)
        if not read:
            fill(base, ssize)
        eng.register_memory(base, ctypes.sizeof(arena))
        sbase, dbase = (peer.addr, base) if read else (base, peer.addr)
        sources = bindings(src, slay, sparts, sbase, peer.segment if read else eng.segment)
        targets = bindings(dst, dlay, dparts, dbase, eng.segment if read else peer.segment)
        plan = mws.TransferPlan.plan(src.placement, dst.placement).bind(targets, sources)
        ranges = raw_ranges(src, slay, sbase, dst, dlay, dbase)  # (target, source, length)
        total = sum(r[2] for r in ranges)
        assert total == plan.total_bytes, (total, plan.total_bytes)
        seg = peer.segment

        def raw() -> tuple:
            te = eng.te
            for i in range(0, len(ranges), 1024):
                part = ranges[i:i + 1024]
                if read:
                    rc = te.batch_transfer_sync_read(seg, [r[0] for r in part], [r[1] for r in part],
                                                     [r[2] for r in part])
                else:
                    rc = te.batch_transfer_sync_write(seg, [r[1] for r in part], [r[0] for r in part],
                                                      [r[2] for r in part])
                assert rc == 0, rc
            return len(ranges), len(ranges)

        def ours(coalesce: bool) -> tuple:
            ops = eops = 0
            if read:
                with mws.Loader(eng, coalesce=coalesce) as loader:
                    for b in targets:
                        st = loader.load_live(plan, src.placement, sources, dst.placement, b, local_pre_registered=True)
                        ops, eops = ops + st.operations, eops + st.engine_operations
            else:
                with mws.Sink(eng, coalesce=coalesce) as sink:
                    for b in sources:
                        st = sink.execute(plan, src.placement, b, dst.placement, targets, local_pre_registered=True)
                        ops, eops = ops + st.operations, eops + st.engine_operations
            return ops, eops

        def reset() -> None:
            if read:
                ctypes.memset(base, 0, dsize)
            else:
                assert peer.ask("zero") == "ok"

        def digest() -> str:
            return hashlib.sha256(memoryview(arena)).hexdigest() if read else peer.ask("sha")

        res, digests = {}, {}
        variants = [("raw", raw), ("ours", lambda: ours(True)), ("ours_plain", lambda: ours(False))]
        for label, fn in variants:
            if label == "ours_plain" and res["ours"]["engine_ops"] == res["ours"]["ops"]:
                continue  # nothing merged: the same TE calls as "ours"
            best, ops, eops = float("inf"), 0, 0
            for _ in range(repeat):
                reset()
                t0 = time.perf_counter()
                ops, eops = fn()
                best = min(best, time.perf_counter() - t0)
            digests[label] = digest()
            res[label] = {"seconds": round(best, 4), "GB/s": round(total / best / 1e9, 3), "ops": ops,
                          "engine_ops": eops, "us_per_engine_op": round(best / max(eops, 1) * 1e6, 2),
                          "us_per_planned_op": round(best / max(ops, 1) * 1e6, 2)}
        assert len(set(digests.values())) == 1, f"variants moved different bytes: {digests}"
        eng.unregister_memory(base)
        out = {"case": name, "direction": direction, "bytes": total,
               **{f"{k}_{m}": v for k, d in res.items() for m, v in d.items()},
               "ratio_ours_over_raw_GBps": round(res["ours"]["GB/s"] / res["raw"]["GB/s"], 3)}
        if "ours_plain" in res:
            out["ratio_plain_over_raw_GBps"] = round(res["ours_plain"]["GB/s"] / res["raw"]["GB/s"], 3)
        print(json.dumps(out), flush=True)
        return out
    finally:
        peer.stop()


def spec_for(mib: int) -> ModelSpec:
    h = 1024
    layers = max(1, round(mib * (1 << 20) / (24 * h * h)))
    return ModelSpec(hidden=h, layers=layers)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--reshard-mib", type=int, default=64)
    ap.add_argument("--small-layers", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="same,reshard,small")
    ap.add_argument("--directions", default="read,write")
    a = ap.parse_args()
    cases = {
        "same": ("same TP4->TP4", spec_for(a.mib), 4, 4),
        "reshard": ("reshard TP4->TP2", spec_for(a.reshard_mib), 4, 2),
        "small": ("small tensors TP4->TP4", ModelSpec(hidden=32, layers=a.small_layers), 4, 4),
    }
    t0 = time.perf_counter()
    rows = []
    for key in a.cases.split(","):
        name, spec, stp, dtp = cases[key]
        for direction in a.directions.split(","):
            rows.append(case(name, Model(spec, "tp", tp=stp, dp=1, placement_set_id="a"),
                             Model(spec, "tp", tp=dtp, dp=1, placement_set_id="b"), direction, a.repeat))
    print(f"\n{'case':<24} {'dir':<5} {'MiB':>6} {'raw GB/s':>9} {'ours GB/s':>9} {'ratio':>6} "
          f"{'raw ops':>8} {'our TE ops':>10} {'raw us/op':>9} {'our us/op':>9} {'plain GB/s':>10}")
    for r in rows:
        print(f"{r['case']:<24} {r['direction']:<5} {r['bytes'] / 2**20:>6.0f} {r['raw_GB/s']:>9.3f} "
              f"{r['ours_GB/s']:>9.3f} {r['ratio_ours_over_raw_GBps']:>6.2f} {r['raw_engine_ops']:>8} "
              f"{r['ours_engine_ops']:>10} {r['raw_us_per_engine_op']:>9.1f} {r['ours_us_per_engine_op']:>9.1f} "
              f"{r.get('ours_plain_GB/s', '-'):>10}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
