"""A Python trainer or server process for the cross-language tests on the REAL
Mooncake Transfer Engine: the library's Python binding with
``mooncake_weight_store.te_backend.MooncakeTransferEngine`` (the PyPI wheel's
``mooncake.engine``), speaking the JSON-lines protocol of te_role.cpp (setup, peer,
plan, push, pull, verify, reset, quit) and using its model bytes (the placement
comes from the C++ side; every byte is examples/support/mws_model.hpp's
``expected_bytes`` of the tensor id salted with the generation), so a C++ process
and a Python process check each other's bytes exactly.

One ctypes arena holds every fragment of the process, registered once with TE by
the process itself (owner registration; calls run with local_pre_registered).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import traceback

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

import mooncake_weight_store as mws  # noqa: E402
from mooncake_weight_store.te_backend import MooncakeTransferEngine  # noqa: E402
from mws_model import expected_bytes  # noqa: E402  (this folder)

ALIGN = 64


def global_shapes(placement_json: str) -> dict:
    shapes = {}

    def walk(v) -> None:
        if isinstance(v, dict):
            if "tensor_id" in v and "global_shape" in v:
                shapes[v["tensor_id"]] = list(v["global_shape"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(json.loads(placement_json))
    return shapes


def binding_from_wire(placement: mws.Placement, w: dict) -> mws.Binding:
    b = mws.Binding(placement, w["participant_id"], instance_id=w["instance_id"], lease_id=w["lease_id"],
                    lease_generation=w["generation"], endpoint=w["endpoint"])
    for pfid, addr, n, rid in w["fragments"]:
        b.add_address(pfid, addr, n, fragment_id=rid, worker_id=w["participant_id"])
    return b


class Role:
    def __init__(self) -> None:
        self.engine = MooncakeTransferEngine()
        self.arena = None
        self.addr = 0
        self.layout = {}

    def release(self) -> None:
        if self.arena is not None:
            self.engine.te.unregister_memory(self.addr)
            self.arena = None

    def setup(self, cmd: dict) -> dict:
        self.release()
        self.role, self.gen = cmd["role"], cmd["generation"]
        self.placement_json = cmd["placement"]
        self.placement = mws.Placement.from_json(self.placement_json)
        self.shapes = global_shapes(self.placement_json)
        self.frags = self.placement.fragments()
        off, self.layout = 0, {}
        for f in self.frags:
            self.layout[f.placement_fragment_id] = (off, f.nbytes)
            off += (f.nbytes + ALIGN - 1) // ALIGN * ALIGN
        self.arena = (ctypes.c_char * max(off, 1))()
        self.addr = ctypes.addressof(self.arena)
        rc = self.engine.te.register_memory(self.addr, ctypes.sizeof(self.arena))
        if rc != 0:
            raise RuntimeError(f"register_memory returned {rc}")
        if self.role == "trainer":
            for f in self.frags:
                o, n = self.layout[f.placement_fragment_id]
                ctypes.memmove(self.addr + o, self.expected(f), n)
        else:
            self.reset()
        self.participants = sorted({f.participant_id for f in self.frags})
        lease = cmd.get("lease", f"{self.role}-lease-{self.gen}")
        self.wire = []
        for p in self.participants:
            frs = [f for f in self.frags if f.participant_id == p]
            self.wire.append({"participant_id": p, "instance_id": f"{self.role}-{p}", "lease_id": lease,
                              "generation": self.gen, "endpoint": self.engine.segment,
                              "fragments": [[f.placement_fragment_id, self.addr + self.layout[f.placement_fragment_id][0],
                                             f.nbytes, f"{p}:rt{k}"] for k, f in enumerate(frs)]})
        self.bindings = [binding_from_wire(self.placement, w) for w in self.wire]
        return {"placement": self.placement_json, "bindings": self.wire, "segment": self.engine.segment}

    def expected(self, f) -> bytes:
        return expected_bytes(f"{f.tensor_id}#gen{self.gen}", self.shapes[f.tensor_id], f.itemsize,
                              f.global_offset, f.local_shape)

    def reset(self) -> None:
        ctypes.memset(self.addr, 0xA5, ctypes.sizeof(self.arena))

    def verify(self) -> dict:
        bad = {p: None for p in self.participants}
        for f in self.frags:
            o, n = self.layout[f.placement_fragment_id]
            if ctypes.string_at(self.addr + o, n) != self.expected(f):
                bad[f.participant_id] = f.tensor_id
        return bad

    def handle(self, cmd: dict) -> dict:
        op = cmd["op"]
        if op == "setup":
            return self.setup(cmd)
        if op == "peer":
            self.peer_placement = mws.Placement.from_json(cmd["placement"])
            self.peer_bindings = [binding_from_wire(self.peer_placement, w) for w in cmd["bindings"]]
            return {}
        if op == "plan":
            logical = mws.TransferPlan.plan(self.peer_placement, self.placement)
            return {"plan": logical.to_json(), "regions": logical.region_count, "bytes": logical.total_bytes}
        if op == "push":
            plan = mws.TransferPlan.from_json(cmd["plan"]).bind(self.peer_bindings, self.bindings)
            moved = 0
            try:
                with mws.Sink(self.engine) as sink:
                    for b in self.bindings:
                        st = sink.execute(plan, self.placement, b, self.peer_placement, self.peer_bindings,
                                          local_pre_registered=True)
                        moved += st.bytes
            except mws.MwsError as e:
                return {"outcome": "failed", "reason": str(e), "bytes": moved}
            return {"outcome": "ok", "bytes": moved, "te_calls": self.engine.te_calls}
        if op == "pull":
            plan = mws.TransferPlan.from_json(cmd["plan"]).bind(self.bindings, self.peer_bindings)
            self.reset()
            moved = 0
            try:
                with mws.Loader(self.engine) as loader:
                    for b in self.bindings:
                        st = loader.load_live(plan, self.peer_placement, self.peer_bindings, self.placement, b,
                                              local_pre_registered=True)
                        moved += st.bytes
            except mws.MwsError as e:
                return {"outcome": "failed", "reason": str(e), "bytes": moved, "verify": self.verify()}
            return {"outcome": "ok", "bytes": moved, "verify": self.verify()}
        if op == "verify":
            return {"verify": self.verify()}
        if op == "reset":
            self.reset()
            return {}
        if op == "quit":
            self.release()
            return {"bye": True, "errors": self.engine.callback_errors}
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    role = Role()
    print(json.dumps({"ready": True, "segment": role.engine.segment, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            reply = role.handle(cmd)
        except Exception as e:  # reported to the driver, which fails the test
            reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
        if cmd.get("op") == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
