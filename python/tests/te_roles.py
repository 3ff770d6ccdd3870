"""A trainer or server process for the two-process live-transfer tests on the real
Mooncake Transfer Engine. Run as ``python te_roles.py trainer|server``; it reads one
JSON command per line on stdin and answers one JSON line on stdout (only JSON
crosses: placements, bindings, plans, receipts). TE logs go to stderr.

Each process holds ONE arena (a ctypes array) for all its participants' fragments,
registered once with TE as a whole allocation; fragments are carved out of it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import traceback

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
os.environ.setdefault("GLOG_minloglevel", "1")

import mooncake_weight_store as mws  # noqa: E402
from mooncake_weight_store.te_backend import MooncakeTransferEngine  # noqa: E402
from mooncake_weight_store.testing import Model, ModelSpec  # noqa: E402

ALIGN = 64


def spec_for(gen: int, layers: int) -> ModelSpec:
    return ModelSpec(generation=gen, seed=f"gen-{gen}", layers=layers)


def model_for(role: str, gen: int, layers: int) -> Model:
    if role == "trainer":
        return Model(spec_for(gen, layers), "tp", tp=4, dp=2, placement_set_id="trainer")
    return Model(spec_for(gen, layers), "ep", tp=2, dp=1, ep=2, placement_set_id="serving")


def binding_to_wire(b: mws.Binding, nbytes: dict) -> dict:
    return {"participant_id": b.participant_id, "instance_id": b.instance_id, "lease_id": b.lease_id,
            "generation": b.lease_generation, "endpoint": b.endpoint,
            "fragments": [[fid, addr, nbytes[fid], b.fragment_ids[fid]] for fid, addr in b.addresses.items()]}


def binding_from_wire(placement: mws.Placement, w: dict) -> mws.Binding:
    b = mws.Binding(placement, w["participant_id"], instance_id=w["instance_id"], lease_id=w["lease_id"],
                    lease_generation=w["generation"], endpoint=w["endpoint"])
    for fid, addr, n, rid in w["fragments"]:
        b.add_address(fid, addr, n, fragment_id=rid)
    return b


class ObservingGuard(mws.Guard):
    """Pins nothing itself; reports for one instance what the driver makes it observe
    (a binding the library compares, or freed buffers)."""

    def __init__(self) -> None:
        self.observe = {}
        self.acquires = 0

    def acquire(self, transfer_id, participant_id, fragment_ids):
        self.acquires += 1
        seen = self.observe.get(fragment_ids[0].split(":")[0])
        return self.acquires if seen is None else (self.acquires, seen())

    def release(self, token, state):
        pass


def observed(b: mws.Binding, placement=None, instance=None, lease=None, generation=None, shift=0) -> mws.Binding:
    """`b` as a guard may observe it (same runtime fragment ids)."""
    o = mws.Binding(placement or b.placement, b.participant_id, instance_id=instance or b.instance_id,
                    lease_id=lease or b.lease_id, lease_generation=b.lease_generation if generation is None else generation,
                    endpoint=b.endpoint)
    sizes = {f.placement_fragment_id: f.nbytes for f in b.placement.participant_fragments(b.participant_id)}
    for pfid, addr in b.addresses.items():
        o.add_address(pfid, addr + shift, sizes[pfid], fragment_id=b.fragment_ids[pfid])
    return o


class Role:
    def __init__(self, role: str) -> None:
        self.role = role
        self.engine = MooncakeTransferEngine()
        self.arena = None
        self.arena_addr = 0
        self.model = None
        self.bindings = []
        self.layout = {}  # fid -> (offset, nbytes)
        self.peer_placement = None
        self.peer_bindings = []
        self.logical = None
        self.bound = None
        self.retired = []
        self.prepared = []
        self.guard = ObservingGuard()

    # -- local side ------------------------------------------------------------------

    def setup(self, gen: int, layers: int, lease: str) -> dict:
        for b in self.bindings:
            b.close()
        self.model = m = model_for(self.role, gen, layers)
        frags = [f for p in m.participant_ids for f in m.placement.participant_fragments(p)]
        off, layout = 0, {}
        for f in frags:
            layout[f.placement_fragment_id] = (off, f.nbytes)
            off += (f.nbytes + ALIGN - 1) // ALIGN * ALIGN
        if self.arena is None or ctypes.sizeof(self.arena) < off:
            self.release_arena()
            self.arena = (ctypes.c_char * max(off, 1))()
            self.arena_addr = ctypes.addressof(self.arena)
            self.engine.register_memory(self.arena_addr, ctypes.sizeof(self.arena))
        self.layout = layout
        for f in frags:
            o, n = layout[f.placement_fragment_id]
            if self.role == "trainer":
                ctypes.memmove(self.arena_addr + o, bytes(m.expected(f)), n)
            else:
                ctypes.memset(self.arena_addr + o, 0xFF, n)
        self.bindings = []
        for p in m.participant_ids:
            b = mws.Binding(m.placement, p, instance_id=f"{self.role}-{p}", lease_id=lease,
                            endpoint=self.engine.segment)
            for f in m.placement.participant_fragments(p):
                o, n = layout[f.placement_fragment_id]
                b.add_address(f.placement_fragment_id, self.arena_addr + o, n)
            self.bindings.append(b)
        nbytes = {fid: n for fid, (_, n) in layout.items()}
        return {"placement": m.placement.to_json(),
                "bindings": [binding_to_wire(b, nbytes) for b in self.bindings], "segment": self.engine.segment}

    def release_arena(self) -> None:
        if self.arena is not None:
            self.engine.unregister_memory(self.arena_addr)
            self.arena = None

    def verify(self) -> list:
        bad = []
        m = self.model
        for p in m.participant_ids:
            for f in m.placement.participant_fragments(p):
                o, n = self.layout[f.placement_fragment_id]
                if ctypes.string_at(self.arena_addr + o, n) != bytes(m.expected(f)):
                    bad.append(f.placement_fragment_id)
        return bad

    def verify_generation(self, gen: int) -> list:
        """Fragments whose bytes differ from generation `gen` of the model (same layout)."""
        m = model_for(self.role, gen, self.model.spec.layers)
        bad = []
        for p in m.participant_ids:
            for f in m.placement.participant_fragments(p):
                o, n = self.layout[f.placement_fragment_id]
                if ctypes.string_at(self.arena_addr + o, n) != bytes(m.expected(f)):
                    bad.append(f.placement_fragment_id)
        return bad

    def refill(self, gen: int) -> None:
        """The trainer's weights of generation `gen`, written in place (same layout)."""
        m = model_for(self.role, gen, self.model.spec.layers)
        for p in m.participant_ids:
            for f in m.placement.participant_fragments(p):
                o, n = self.layout[f.placement_fragment_id]
                ctypes.memmove(self.arena_addr + o, bytes(m.expected(f)), n)

    def untouched(self) -> bool:
        return all(set(ctypes.string_at(self.arena_addr + o, n)) <= {0xFF} for o, n in self.layout.values())

    def step_all(self, gen: int) -> dict:
        moved, verdicts = 0, {}
        for p in self.prepared:
            moved += p.step(gen).bytes
            verdicts.update(p.last_report().verdicts())
        return {"bytes": moved, "verdicts": verdicts, "te_calls": self.engine.te_calls}

    def stale_step(self, case: str, gen: int) -> dict:
        """One step of the first prepared reader under a stale observation (`case`);
        what it raised, and whether anything moved."""
        local = self.bindings[0]
        other = model_for(self.role, self.model.spec.generation, self.model.spec.layers)
        restarted = None
        if case == "another placement":
            other = Model(other.spec, "ep", tp=2, dp=1, ep=2, placement_set_id="serving-b")
            self.guard.observe = {local.instance_id: lambda: observed(local, placement=other.placement)}
        elif case == "a new instance":
            self.guard.observe = {local.instance_id: lambda: observed(local, instance="serving-restarted")}
        elif case == "another lease":
            self.guard.observe = {local.instance_id: lambda: observed(local, lease="lease-2", generation=2)}
        elif case == "moved buffers":
            self.guard.observe = {local.instance_id: lambda: observed(local, shift=4096)}
        elif case == "freed buffers":
            def freed():
                raise mws.StaleBindingError(10, "the buffers were freed")
            self.guard.observe = {local.instance_id: freed}
        elif case == "an engine restart":  # a fresh TE behind the same handle: a new identity
            from mooncake.engine import TransferEngine as _TE  # type: ignore

            restarted = _TE()
            assert restarted.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            restarted, self.engine._adapter.te = self.engine._adapter.te, restarted
        self.reset_targets()
        calls = self.engine.te_calls
        leases = []
        if case == "a rotation under another instance":
            leases = [mws.LeaseRotation("serving-x", local.participant_id, "lease-3", 3)]
        try:
            self.prepared[0].step(gen, leases=leases)
            reply = {"refusal": None}
        except mws.MwsError as e:
            r = e.report
            reply = {"refusal": str(e), "status": int(e.status), "submitted": r.submitted,
                     "verdicts": r.verdicts()}
        finally:
            self.guard.observe = {}
            if restarted is not None:
                self.retired.append(self.engine._adapter.te)
                self.engine._adapter.te = restarted
        reply.update(te_calls=self.engine.te_calls - calls, untouched=self.untouched())
        return reply

    def reset_targets(self) -> None:
        for o, n in self.layout.values():
            ctypes.memset(self.arena_addr + o, 0xFF, n)

    def peer(self, placement: str, bindings: list) -> None:
        for b in self.peer_bindings:
            b.close()
        self.peer_placement = mws.Placement.from_json(placement)
        self.peer_bindings = [binding_from_wire(self.peer_placement, w) for w in bindings]

    # -- commands --------------------------------------------------------------------

    def handle(self, cmd: dict) -> dict:
        op = cmd["op"]
        if op == "setup":
            return self.setup(cmd["generation"], cmd.get("layers", 2), cmd.get("lease", "lease-1"))
        if op == "peer":
            self.peer(cmd["placement"], cmd["bindings"])
            return {}
        if op == "plan":  # server: the logical plan source -> target, as JSON
            self.logical = mws.TransferPlan.plan(self.peer_placement, self.model.placement)
            return {"plan": self.logical.to_json(), "regions": self.logical.region_count,
                    "bytes": self.logical.total_bytes}
        if op == "bind":  # server: bind now, execute later (stale-binding checks)
            self.bound = self.logical.bind(self.bindings, self.peer_bindings)
            return {}
        if op == "pull":  # server: reader mode, every target participant
            plan = self.bound if cmd.get("use_bound") else self.logical.bind(self.bindings, self.peer_bindings)
            moved, ops = 0, 0
            calls_before = self.engine.te_calls
            # The verdict per target participant, from the loader's reports (a target
            # whose call never ran keeps its previous contents: unchanged).
            verdicts = {b.participant_id: "unchanged" for b in self.bindings}
            try:
                with mws.Loader(self.engine) as loader:
                    if cmd.get("pause_after_first_batch"):
                        paused = []

                        def progress(p: "mws.Progress") -> None:
                            # After the first completed batch (reported at once), tell the
                            # driver, then wait for its go-ahead (it kills the trainer meanwhile).
                            if not paused and 0 < p.bytes_done < p.bytes_total:
                                paused.append(p.bytes_done)
                                print(json.dumps({"progress": p.bytes_done, "total": p.bytes_total}), flush=True)
                                sys.stdin.readline()

                        loader.set_progress(progress)
                    for b in self.bindings:
                        try:
                            st = loader.load_live(plan, self.peer_placement, self.peer_bindings,
                                                  self.model.placement, b, local_pre_registered=True)
                        finally:
                            report = loader.last_report()
                            if report is not None:
                                verdicts.update(report.verdicts())
                        moved, ops = moved + st.bytes, ops + st.operations
            except mws.MwsError as e:
                r = getattr(e, "report", None)
                return {"outcome": "failed", "generation": self.model.spec.generation, "reason": str(e),
                        "verdicts": verdicts, "updated": [p for p, v in verdicts.items() if v == "updated"],
                        "submitted": bool(r and r.submitted), "guard_release": r.guard_release if r else None,
                        "pending_transfer_id": r.pending_transfer_id if r else None,
                        "te_calls": self.engine.te_calls, "calls_in_pull": self.engine.te_calls - calls_before,
                        "pending": self.engine.pending_count}
            return {"outcome": "ok", "generation": self.model.spec.generation, "bytes": moved, "operations": ops,
                    "bad": self.verify(), "te_calls": self.engine.te_calls, "verdicts": verdicts,
                    "updated": [p for p, v in verdicts.items() if v == "updated"]}
        if op == "push":  # trainer: sink mode, every source participant
            logical = mws.TransferPlan.from_json(cmd["plan"])
            plan = logical.bind(self.peer_bindings, self.bindings)
            moved, ops = 0, 0
            try:
                with mws.Sink(self.engine) as sink:
                    for b in self.bindings:
                        st = sink.execute(plan, self.model.placement, b, self.peer_placement, self.peer_bindings,
                                          local_pre_registered=True)
                        moved, ops = moved + st.bytes, ops + st.operations
            except mws.MwsError as e:
                return {"outcome": "failed", "reason": str(e)}
            return {"outcome": "ok", "bytes": moved, "operations": ops, "te_calls": self.engine.te_calls}
        if op == "prepare_pull":  # server: one prepared reader per target participant
            plan = self.logical.bind(self.bindings, self.peer_bindings)
            loader = mws.Loader(self.engine)
            self.prepared = [loader.prepare_live(plan, self.peer_placement, self.peer_bindings, self.model.placement,
                                                 b, local_pre_registered=True, guard=self.guard)
                             for b in self.bindings]
            return {"prepared": len(self.prepared), "pinned": [p.info.pinned_bindings for p in self.prepared]}
        if op == "prepare_push":  # trainer: one prepared sink per source participant
            plan = mws.TransferPlan.from_json(cmd["plan"]).bind(self.peer_bindings, self.bindings)
            sink = mws.Sink(self.engine)
            self.prepared = [sink.prepare(plan, self.model.placement, b, self.peer_placement, self.peer_bindings,
                                          local_pre_registered=True) for b in self.bindings]
            return {"prepared": len(self.prepared), "empty": sum(p.info.empty for p in self.prepared)}
        if op == "step":  # every prepared transfer, one generation
            return self.step_all(cmd["generation"])
        if op == "stale_step":
            return self.stale_step(cmd["case"], cmd["generation"])
        if op == "close_prepared":
            for p in self.prepared:
                p.close()
            self.prepared = []
            return {"pending": self.engine.pending_count}
        if op == "refill":
            self.refill(cmd["generation"])
            return {}
        if op == "verify_generation":
            return {"bad": self.verify_generation(cmd["generation"])}
        if op == "pending":
            return {"pending": self.engine.pending_count}
        if op == "drain":
            return {"remaining": self.engine.drain(cmd.get("timeout_ms", 1000)), "pending": self.engine.pending_count}
        if op == "restart":  # a restart-required engine: a fresh TE engine (new identity, new segment)
            old = self.engine
            rc = int(old.te.unregister_memory(self.arena_addr)) if self.arena is not None else 0
            self.retired.append(old)  # its pending entry may still refer to it: keep the thunks alive
            self.engine = MooncakeTransferEngine()
            if self.arena is not None:
                self.engine.register_memory(self.arena_addr, ctypes.sizeof(self.arena))
            return {"old_pending": old.pending_count, "old_unregister_rc": rc, "pending": self.engine.pending_count,
                    "segment": self.engine.segment, "same_identity": old.engine_ptr == self.engine.engine_ptr}
        if op == "verify":
            return {"bad": self.verify()}
        if op == "reset":
            self.reset_targets()
            return {}
        if op == "quit":
            self.release_arena()
            return {"errors": self.engine.callback_errors}
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    role = Role(sys.argv[1])
    print(json.dumps({"ready": True, "segment": role.engine.segment, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
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
