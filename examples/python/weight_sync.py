"""Trainer -> inference-server weight sync over Mooncake's Transfer Engine.

    python weight_sync.py                      # runs both roles as child processes
    python weight_sync.py --role trainer --dir D
    python weight_sync.py --role server  --dir D

A "trainer" holds its weights in a TP4 x DP2 layout, a "server" wants them in TP2 x
EP2. Both run a real ``mooncake.engine.TransferEngine`` (loopback TCP, P2PHANDSHAKE:
no metadata server, TE picks the ports). Only JSON crosses between them, as files in
``--dir`` (written to a temp name, then renamed):

  trainer-G.json   placement + bindings (fragment addresses, TE segment)
  server-G.json    placement + bindings of the server + the logical transfer plan
  pull-G.json      the server's receipt of its pull (reader mode)
  push-G.json      the trainer's receipt of its push (sink mode)
  done-G.json      the server's verification of the pushed bytes

Per generation G the trainer writes new weights and publishes; the server pulls them
(``Loader.load_live``) and checks every byte of every target fragment (the demo's
weights are deterministic per generation, so the server can recompute them); then
the trainer pushes the same plan (``Sink.execute``) into freshly cleared targets and
the server checks again. Bytes move only through TE between registered memory.

On failure (the peer dies, a lease or generation changed) the call raises, the
receipt says ``"failed"`` and no target is reported updated; a failed legacy TE
batch leaves the engine restart-required (the wheel cannot say which ranges landed),
so a real server would start a fresh engine before the next generation.

Replace ``testing.Model`` with your own placements (``PlacementBuilder``) and point
bindings at your tensors' memory.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
os.environ.setdefault("GLOG_minloglevel", "1")

import mooncake_weight_store as mws  # noqa: E402
from mooncake_weight_store.te_backend import MooncakeTransferEngine  # noqa: E402
from mooncake_weight_store.testing import Model, ModelSpec  # noqa: E402

WAIT_S = 60.0


def publish(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def wait_for(path: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {WAIT_S}s")
        time.sleep(0.02)
    with open(path) as f:
        return json.load(f)


class Side:
    """One process's engine, one registered arena, and its bindings."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.engine = MooncakeTransferEngine()  # 127.0.0.1, P2PHANDSHAKE, tcp
        self.arena = None
        self.layout: dict = {}

    def model(self, gen: int) -> Model:
        spec = ModelSpec(generation=gen, seed=f"weights-{gen}")
        if self.role == "trainer":
            return Model(spec, "tp", tp=4, dp=2, placement_set_id="trainer")
        return Model(spec, "ep", tp=2, dp=1, ep=2, placement_set_id="server")

    def bind(self, m: Model) -> list:
        frags = [f for p in m.participant_ids for f in m.placement.participant_fragments(p)]
        off = 0
        for f in frags:
            self.layout[f.placement_fragment_id] = (off, f.nbytes)
            off += (f.nbytes + 63) // 64 * 64
        if self.arena is None:  # one allocation, registered once as a whole
            self.arena = (ctypes.c_char * off)()
            self.engine.register_memory(ctypes.addressof(self.arena), off)
        base = ctypes.addressof(self.arena)
        out = []
        for p in m.participant_ids:
            b = mws.Binding(m.placement, p, instance_id=f"{self.role}-{p}", endpoint=self.engine.segment)
            for f in m.placement.participant_fragments(p):
                o, n = self.layout[f.placement_fragment_id]
                b.add_address(f.placement_fragment_id, base + o, n)
            out.append(b)
        return out

    def frag(self, fid: str) -> bytes:
        o, n = self.layout[fid]
        return ctypes.string_at(ctypes.addressof(self.arena) + o, n)

    def clear(self) -> None:
        for o, n in self.layout.values():
            ctypes.memset(ctypes.addressof(self.arena) + o, 0xFF, n)

    def close(self) -> None:
        if self.arena is not None:
            self.engine.unregister_memory(ctypes.addressof(self.arena))
            self.arena = None


def wire(b: mws.Binding) -> dict:
    return {"participant_id": b.participant_id, "instance_id": b.instance_id, "lease_id": b.lease_id,
            "generation": b.lease_generation, "endpoint": b.endpoint,
            "fragments": [[fid, a, b._infos[fid].nbytes, b.fragment_ids[fid]] for fid, a in b.addresses.items()]}


def unwire(placement: mws.Placement, w: dict) -> mws.Binding:
    b = mws.Binding(placement, w["participant_id"], instance_id=w["instance_id"], lease_id=w["lease_id"],
                    lease_generation=w["generation"], endpoint=w["endpoint"])
    for fid, addr, n, rid in w["fragments"]:
        b.add_address(fid, addr, n, fragment_id=rid)
    return b


def trainer(d: str, generations: int) -> None:
    side = Side("trainer")
    try:
        for g in range(1, generations + 1):
            m = side.model(g)
            mine = side.bind(m)
            for f in (f for p in m.participant_ids for f in m.placement.participant_fragments(p)):
                o, n = side.layout[f.placement_fragment_id]  # "train": write generation g's weights
                ctypes.memmove(ctypes.addressof(side.arena) + o, bytes(m.expected(f)), n)
            publish(f"{d}/trainer-{g}.json", {"placement": m.placement.to_json(),
                                             "bindings": [wire(b) for b in mine]})
            srv = wait_for(f"{d}/server-{g}.json")
            wait_for(f"{d}/pull-{g}.json")  # the server pulled; now push the same plan
            tp = mws.Placement.from_json(srv["placement"])
            targets = [unwire(tp, w) for w in srv["bindings"]]
            plan = mws.TransferPlan.from_json(srv["plan"]).bind(targets, mine)
            receipt = {"outcome": "ok", "generation": g, "bytes": 0}
            try:
                with mws.Sink(side.engine) as sink:
                    for b in mine:
                        receipt["bytes"] += sink.execute(plan, m.placement, b, tp, targets,
                                                         local_pre_registered=True).bytes
            except mws.MwsError as e:
                receipt = {"outcome": "failed", "generation": g, "reason": str(e)}
            publish(f"{d}/push-{g}.json", receipt)
            done = wait_for(f"{d}/done-{g}.json")
            print(f"trainer: generation {g}: pushed {receipt.get('bytes')} B, server says {done['outcome']}")
            if done["outcome"] != "ok":
                raise SystemExit(1)
    finally:
        side.close()


def server(d: str, generations: int) -> None:
    side = Side("server")
    try:
        for g in range(1, generations + 1):
            src = wait_for(f"{d}/trainer-{g}.json")
            sp = mws.Placement.from_json(src["placement"])
            sources = [unwire(sp, w) for w in src["bindings"]]
            m = side.model(g)
            mine = side.bind(m)
            side.clear()
            logical = mws.TransferPlan.plan(sp, m.placement)
            publish(f"{d}/server-{g}.json", {"placement": m.placement.to_json(),
                                            "bindings": [wire(b) for b in mine], "plan": logical.to_json()})

            def check() -> list:
                # every target fragment must equal the trainer's bytes for its tensor box
                return [f.placement_fragment_id for p in m.participant_ids
                        for f in m.placement.participant_fragments(p)
                        if side.frag(f.placement_fragment_id) != bytes(m.expected(f))]

            t0 = time.perf_counter()
            receipt = {"outcome": "ok", "generation": g, "bytes": 0}
            try:
                plan = logical.bind(mine, sources)
                with mws.Loader(side.engine) as loader:
                    for b in mine:
                        receipt["bytes"] += loader.load_live(plan, sp, sources, m.placement, b,
                                                             local_pre_registered=True).bytes
                receipt["bad"] = check()
                receipt["updated"] = [] if receipt["bad"] else [b.participant_id for b in mine]
            except mws.MwsError as e:
                receipt = {"outcome": "failed", "generation": g, "reason": str(e), "updated": []}
            receipt["seconds"] = round(time.perf_counter() - t0, 4)
            side.clear()
            publish(f"{d}/pull-{g}.json", receipt)
            push = wait_for(f"{d}/push-{g}.json")
            bad = check() if push["outcome"] == "ok" else ["push failed"]
            ok = receipt["outcome"] == "ok" and not receipt["bad"] and not bad
            publish(f"{d}/done-{g}.json", {"outcome": "ok" if ok else "failed", "bad": bad})
            print(f"server: generation {g}: pulled {receipt.get('bytes')} B in {receipt['seconds']}s, "
                  f"pushed bytes verified: {not bad}")
            if not ok:
                raise SystemExit(1)
    finally:
        side.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["trainer", "server"])
    ap.add_argument("--dir", help="exchange folder (default: a fresh temporary one)")
    ap.add_argument("--generations", type=int, default=3)
    a = ap.parse_args()
    if a.role:
        (trainer if a.role == "trainer" else server)(a.dir, a.generations)
        return 0
    with tempfile.TemporaryDirectory() as d:
        kids = []
        try:
            for role in ("server", "trainer"):
                kids.append(subprocess.Popen([sys.executable, __file__, "--role", role, "--dir", d,
                                              "--generations", str(a.generations)]))
            deadline = time.monotonic() + WAIT_S * (a.generations + 1)
            rcs = []
            for k in kids:
                rcs.append(k.wait(timeout=max(1.0, deadline - time.monotonic())))
            print("weight sync:", "ok" if rcs == [0, 0] else f"failed {rcs}")
            return 0 if rcs == [0, 0] else 1
        finally:
            for k in kids:  # every child stopped by its PID on every exit path
                if k.poll() is None:
                    k.kill()
                    k.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
