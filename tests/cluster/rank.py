"""One rank of the emulated cluster: one participant of the trainer (TP4 x DP2) or of
the server (TP2 x EP2), in its own process inside its host's network namespace.

    ip netns exec <host ns> python rank.py --role trainer|server --participant P --ip A ...

It reads one JSON command per line on stdin and answers one JSON line on stdout
(``{"event": ...}`` lines are progress notices sent while a call runs). Only JSON
crosses between processes: bindings (addresses, segment names), plans, receipts,
reports. Mooncake's logs go to stderr.

The rank holds ONE arena (a numpy byte array) for its fragments, registered once with
its own Transfer Engine (``MooncakeTransferEngine`` on this host's address, P2P
handshake, tcp). As a Mooncake Store client it mounts a segment of its own memory
(``global_segment_size``) when asked to.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import mooncake_weight_store as mws  # noqa: E402
from mooncake_weight_store.te_backend import MooncakeTransferEngine  # noqa: E402

from cluster_model import ClusterModel, mutate  # noqa: E402

ALIGN = 4096
POISON = 0xFF
#: The notify key the trainer ranks' delta steps and the server ranks' acceptors share.
DELTA_KEY = b"mws-cluster-delta-steps-key"


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


def routing_kw(routing: str) -> dict:
    """``TransferPlan.plan`` keyword for a source routing, when this library has it."""
    return {} if routing in ("", "target_dp") else {"source_routing": routing}


class Rank:
    def __init__(self, args) -> None:
        self.args = args
        self.role = args.role
        self.pid_name = args.participant
        self.ip = args.ip
        self.engine = MooncakeTransferEngine(hostname=args.ip)
        self.registered = {}  # TE registrations of this process: address -> length
        self.te_log = self._time_te_calls()
        self.arena = None
        self.layout = {}  # placement fragment id -> (offset, nbytes)
        self.model = None
        self.binding = None
        self.peers = {}  # role -> (placement, [bindings])
        self.plan = None
        self.store = None
        self.store_backend = None
        self.dims = (args.layers, args.hidden, args.experts, False)
        # delta phase: trainer: the prepared sink; server: inbox, acceptor, expected image
        self.sink = None
        self.prepared = None
        self.inbox = None
        self.acceptor = None
        self.expect = None
        # pulled delta phase: trainer: the publisher; server: the loader, prepared reader, outboxes
        self.publisher = None
        self.loader = None
        self.reader = None
        self.outboxes = []

    def _time_te_calls(self) -> list:
        """Records (ranges, bytes, seconds) of every Transfer Engine batch call, to
        tell the time spent inside TE from the library's own time."""
        log: list = []
        backend = self.engine._adapter
        te = backend.te

        registered = self.registered

        class Timed:
            def register_memory(self, address, length, location="*"):
                rc = te.register_memory(address, length, location)
                if rc == 0:
                    registered[address] = length
                return rc

            def unregister_memory(self, address):
                rc = te.unregister_memory(address)
                if rc == 0:
                    registered.pop(address, None)
                return rc

            def __getattr__(self, name):
                fn = getattr(te, name)
                if name not in ("batch_transfer_sync_read", "batch_transfer_sync_write"):
                    return fn

                def timed(endpoint, local, remote, sizes):
                    t = time.perf_counter()
                    rc = fn(endpoint, local, remote, sizes)
                    log.append((len(sizes), sum(sizes), time.perf_counter() - t))
                    return rc

                return timed

        backend.te = Timed()
        return log

    # -- arena and model --------------------------------------------------------------

    def model_for(self, role: str, gen: int) -> ClusterModel:
        layers, hidden, experts, bulk = self.dims
        return ClusterModel(role, gen, layers=layers, hidden=hidden, experts=experts, bulk=bulk)

    def setup(self, gen: int, keep: bool, dims=None) -> dict:
        if dims is not None:
            dims = (*dims, False)[:4] if len(dims) == 3 else tuple(dims)
            if dims != self.dims:
                self.dims = dims
                keep = False
        m = self.model = self.model_for(self.role, gen)
        frags = m.placement.participant_fragments(self.pid_name)
        off, layout = 0, {}
        for f in frags:
            layout[f.placement_fragment_id] = (off, f.nbytes)
            off += (f.nbytes + ALIGN - 1) // ALIGN * ALIGN
        if self.arena is None or self.arena.nbytes != off:
            self.release_arena()
            self.arena = np.full(max(off, 1), POISON, dtype=np.uint8)
            self.engine.register_memory(self.arena.ctypes.data, self.arena.nbytes)
            keep = False
        self.layout = layout
        if self.role == "trainer":
            for f in frags:
                o, n = layout[f.placement_fragment_id]
                self.arena[o:o + n] = m.expected(f)
        elif not keep:
            self.arena[:] = POISON
        if self.binding is not None:
            self.binding.close()
        base = self.arena.ctypes.data
        b = mws.Binding(m.placement, self.pid_name, instance_id=f"{self.role}-{self.pid_name}-{os.getpid()}",
                        lease_id=f"lease-{gen}", endpoint=self.engine.segment)
        for f in frags:
            o, n = layout[f.placement_fragment_id]
            b.add_address(f.placement_fragment_id, base + o, n)
        self.binding = b
        nbytes = {fid: n for fid, (_, n) in layout.items()}
        return {"binding": binding_to_wire(b, nbytes), "segment": self.engine.segment, "arena_bytes": off}

    def release_arena(self) -> None:
        if self.arena is not None:
            self.engine.unregister_memory(self.arena.ctypes.data)
            self.arena = None

    def verify(self, gen: int) -> dict:
        """Per fragment: equal to generation ``gen``, to ``gen - 1``, poison, or other."""
        m = self.model if self.model.generation == gen else self.model_for(self.role, gen)
        prev = self.model_for(self.role, gen - 1) if gen > 1 else None
        out = {"new": 0, "old": 0, "poison": 0, "other": 0, "bad": []}
        for f in m.placement.participant_fragments(self.pid_name):
            o, n = self.layout[f.placement_fragment_id]
            got = self.arena[o:o + n]
            if np.array_equal(got, m.expected(f)):
                out["new"] += 1
                continue
            out["bad"].append(f.placement_fragment_id)
            if prev is not None and np.array_equal(got, prev.expected(f)):
                out["old"] += 1
            elif bool((got == POISON).all()):
                out["poison"] += 1
            else:
                out["other"] += 1
        return out

    # -- live transfer ----------------------------------------------------------------

    def plan_cmd(self, routing: str) -> dict:
        """The logical plan trainer -> server for this generation (whole target)."""
        gen = self.model.generation
        src, dst = self.model_for("trainer", gen), self.model_for("server", gen)
        t = time.perf_counter()
        plan = mws.TransferPlan.plan(src.placement, dst.placement, **routing_kw(routing))
        return {"plan": plan.to_json(), "bytes": plan.total_bytes, "regions": plan.region_count,
                "seconds": time.perf_counter() - t}

    def bind(self, plan_json: str, wires: dict) -> dict:
        gen = self.model.generation
        self.peers = {}
        for role in ("trainer", "server"):
            pl = self.model.placement if role == self.role else self.model_for(role, gen).placement
            bs = [self.binding if w["participant_id"] == self.pid_name and role == self.role
                  else binding_from_wire(pl, w) for w in wires[role]]
            self.peers[role] = (pl, bs)
        t = time.perf_counter()
        logical = mws.TransferPlan.from_json(plan_json)
        self.plan = logical.bind(self.peers["server"][1], self.peers["trainer"][1])
        return {"seconds": time.perf_counter() - t}

    def _progress(self, announce):
        """Prints one progress event once ``announce`` (a fraction; True = any
        progress) of the call's bytes are done."""
        seen = []
        at = 1e-9 if announce is True else float(announce or 0)

        def progress(p) -> None:
            if announce and not seen and p.bytes_total and p.bytes_done / p.bytes_total >= at:
                seen.append(p.bytes_done)
                print(json.dumps({"event": "progress", "bytes_done": p.bytes_done, "bytes_total": p.bytes_total}),
                      flush=True)

        return progress

    def live(self, mode: str, announce: bool) -> dict:
        """``pull`` (this server rank reads its part) or ``push`` (this trainer rank
        writes its part); the outcome with the call's report."""
        (spl, sbs), (tpl, tbs) = self.peers["trainer"], self.peers["server"]
        cls = mws.Loader if mode == "pull" else mws.Sink
        out = {"mode": mode, "participant": self.pid_name, "generation": self.model.generation}
        self.te_log.clear()
        t0 = time.monotonic()
        with cls(self.engine) as ex:
            ex.set_progress(self._progress(announce))
            try:
                if mode == "pull":
                    st = ex.load_live(self.plan, spl, sbs, tpl, self.binding, local_pre_registered=True)
                else:
                    st = ex.execute(self.plan, spl, self.binding, tpl, tbs, local_pre_registered=True)
                out.update(outcome="ok", bytes=st.bytes, operations=st.operations,
                           engine_operations=st.engine_operations)
            except mws.MwsError as e:
                out.update(outcome="failed", reason=str(e)[:400])
            finally:
                out["t0"], out["t1"] = t0, time.monotonic()
                r = ex.last_report()
                if r is not None:
                    out.update(verdicts=r.verdicts(), submitted=r.submitted, guard_release=r.guard_release,
                               pending_transfer_id=r.pending_transfer_id)
        out["resources"] = self.resources()
        out["te"] = [len(self.te_log), sum(x[0] for x in self.te_log), sum(x[1] for x in self.te_log),
                     sum(x[2] for x in self.te_log)]
        return out

    def resources(self) -> dict:
        r = self.engine.resources()
        own = {self.arena.ctypes.data} if self.arena is not None else set()
        own.add(self.engine._adapter.notify_scratch)  # the notify carrier's buffer (delta phase)
        return {"pending_transfers": r.pending_transfers, "quarantined_registrations": r.quarantined_registrations,
                "pinned_tokens": r.pinned_tokens, "pending_count": self.engine.pending_count,
                "callback_errors": len(self.engine.callback_errors),
                "te_registrations": len(self.registered),
                "te_registrations_not_own": len([a for a in self.registered if a not in own])}

    # -- delta steps (issue 47) -------------------------------------------------------

    def delta_open(self) -> dict:
        """Server: an inbox (a quarter of the arena, at least 1 MiB) registered with
        this rank's engine, a content-verifying acceptor of the bound plan that
        accepts deltas into it, and the expected image of the current generation."""
        n = max(1 << 20, (self.arena.nbytes // 4 + ALIGN - 1) // ALIGN * ALIGN)
        self.inbox = np.zeros(n, dtype=np.uint8)
        self.engine.register_memory(self.inbox.ctypes.data, n)
        self.acceptor = mws.NotifyAcceptor(self.plan, self.pid_name, key=DELTA_KEY)
        self.acceptor.verify_content()
        self.acceptor.accept_deltas(self.inbox.ctypes.data, n)
        self.expect = np.full_like(self.arena, POISON)
        for f in self.model.placement.participant_fragments(self.pid_name):
            o, nb = self.layout[f.placement_fragment_id]
            self.expect[o:o + nb] = self.model.expected(f)
        return {"inbox": [self.inbox.ctypes.data, n]}

    def delta_prepare(self, inboxes: dict) -> dict:
        """Trainer: prepares its push once and enables delta steps into the inboxes."""
        (spl, _sbs), (tpl, tbs) = self.peers["trainer"], self.peers["server"]
        t = time.perf_counter()
        self.sink = mws.Sink(self.engine)
        self.prepared = self.sink.prepare(self.plan, spl, self.binding, tpl, tbs, local_pre_registered=True)
        self.prepared.enable_delta({k: (int(a), int(n)) for k, (a, n) in inboxes.items()})
        return {"seconds": time.perf_counter() - t}

    def delta_mutate(self, gen: int, density: float) -> dict:
        """Applies generation ``gen``'s sparse change: a trainer to its weights, a
        server to its expected image (never to the bytes it serves)."""
        buf = self.arena if self.role == "trainer" else self.expect
        t = time.perf_counter()
        changed = total = 0
        for f in self.model.placement.participant_fragments(self.pid_name):
            o, n = self.layout[f.placement_fragment_id]
            changed += mutate(self.model.linear_index(f), buf[o:o + n], f.tensor_id, gen, density)
            total += n // 2
        return {"changed": changed, "elements": total, "seconds": time.perf_counter() - t}

    def delta_step(self, gen: int, held: dict) -> dict:
        """Trainer: one delta step of generation ``gen`` (``held``: what each target
        verifiably holds; empty: every byte)."""
        out = {"participant": self.pid_name, "generation": gen}
        self.te_log.clear()
        notifies0 = self.engine._adapter.notifies
        t0 = time.monotonic()
        try:
            st = self.prepared.step_delta(gen, held={k: int(v) for k, v in held.items()}, key=DELTA_KEY)
            out.update(outcome="ok", bytes=st.bytes, engine_operations=st.engine_operations)
        except mws.MwsError as e:
            out.update(outcome="failed", reason=str(e)[:400])
        out["t0"], out["t1"] = t0, time.monotonic()
        r = self.prepared.last_report()
        out["verdicts"] = r.verdicts() if r is not None else {}
        out["stats"] = self.prepared.delta_stats()
        out["notifies"] = self.engine._adapter.notifies - notifies0
        out["te"] = [len(self.te_log), sum(x[0] for x in self.te_log), sum(x[1] for x in self.te_log),
                     sum(x[2] for x in self.te_log)]
        return out

    def delta_accept(self, gen: int) -> dict:
        """Server: hands every notification received to the acceptor (a delta
        ``done`` applies the inbox, then verifies), then compares every byte of the
        arena with the expected image of generation ``gen``."""
        t0 = time.monotonic()
        verdicts = []
        for name, msg in self.engine.poll_notifies():
            v, _o, why = self.acceptor.accept(msg)
            verdicts.append(v if v == "accepted" else f"{v}: {why[:200]}")
        t1 = time.monotonic()
        o = self.acceptor.outcome()
        wrong, bad = 0, []
        for f in self.model.placement.participant_fragments(self.pid_name):
            off, n = self.layout[f.placement_fragment_id]
            k = int(np.count_nonzero(self.arena[off:off + n] != self.expect[off:off + n]))
            if k:
                wrong += k
                bad.append(f.placement_fragment_id)
        return {"participant": self.pid_name, "messages": verdicts, "t0": t0, "t1": t1,
                "verdict": o.verdict, "weight_generation": o.weight_generation,
                "held": self.acceptor.held_generation(), "wrong_bytes": wrong, "bad": bad}

    def delta_close(self) -> dict:
        """Releases what the delta phase holds (prepared sink and its outboxes;
        acceptor and inbox; the notify carrier's buffer)."""
        for name in ("prepared", "sink", "acceptor"):  # the prepared transfer before its sink
            handle = getattr(self, name)
            if handle is not None:
                handle.close()
                setattr(self, name, None)
        if self.inbox is not None:
            self.engine.unregister_memory(self.inbox.ctypes.data)
            self.inbox = None
        self.expect = None
        self.engine._adapter.release_notify()
        return {"resources": self.resources()}

    # -- pulled delta steps (issue 47) -------------------------------------------------

    def pull_open(self) -> dict:
        """Trainer: a delta publisher of its source executor, its outbox a quarter of
        its arena (``None`` when the plan reads nothing of this rank)."""
        try:
            least = mws.DeltaPublisher.min_outbox_capacity(self.plan, self.pid_name)
        except mws.InvalidArgumentError:
            return {"outbox": None}
        self.publisher = mws.DeltaPublisher(self.plan, self.pid_name, self.engine,
                                            max(least, self.arena.nbytes // 4))
        o = self.publisher.outbox
        return {"outbox": [o.participant_id, o.worker_id, o.address, o.capacity]}

    def pull_prepare(self, outboxes: list) -> dict:
        """Server: prepares its pull once (its arena pre-registered) and enables pulled
        delta steps from the trainers' outboxes; the expected image of the current
        generation."""
        (spl, sbs), (tpl, _tbs) = self.peers["trainer"], self.peers["server"]
        t = time.perf_counter()
        self.outboxes = [mws.DeltaOutbox(p, w, int(a), int(n)) for p, w, a, n in outboxes]
        self.loader = mws.Loader(self.engine)
        self.reader = self.loader.prepare_live(self.plan, spl, sbs, tpl, self.binding, local_pre_registered=True)
        self.reader.enable_delta_pull(self.outboxes)
        if self.expect is None:
            self.expect = np.full_like(self.arena, POISON)
            for f in self.model.placement.participant_fragments(self.pid_name):
                o, nb = self.layout[f.placement_fragment_id]
                self.expect[o:o + nb] = self.model.expected(f)
        return {"seconds": time.perf_counter() - t}

    def pull_publish(self, gen: int) -> dict:
        """Trainer: publishes generation ``gen`` (its arena holds it)."""
        t0 = time.monotonic()
        stats = self.publisher.publish(gen) if self.publisher is not None else None
        return {"participant": self.pid_name, "stats": stats, "t0": t0, "t1": time.monotonic()}

    def pull_step(self, gen: int, full: bool) -> dict:
        """Server: one step of generation ``gen`` of the delta-enabled reader (``full``:
        forget what it holds first, so it pulls every byte), then every byte of the
        arena compared with the expected image."""
        if full:
            self.reader.enable_delta_pull(self.outboxes)
        out = {"participant": self.pid_name, "generation": gen}
        t0 = time.monotonic()
        try:
            self.reader.step(gen)
            out["outcome"] = "ok"
        except mws.MwsError as e:
            out.update(outcome="failed", reason=str(e)[:400])
        out["t0"], out["t1"] = t0, time.monotonic()
        out["stats"] = self.reader.delta_stats()
        out["held"] = self.reader.held_generation()
        wrong = 0
        for f in self.model.placement.participant_fragments(self.pid_name):
            off, n = self.layout[f.placement_fragment_id]
            wrong += int(np.count_nonzero(self.arena[off:off + n] != self.expect[off:off + n]))
        out["wrong_bytes"] = wrong
        return out

    def pull_close(self) -> dict:
        """Releases what the pulled delta phase holds (reader, loader, publisher)."""
        for name in ("reader", "loader", "publisher"):  # the prepared transfer before its loader
            handle = getattr(self, name)
            if handle is not None:
                handle.close()
                setattr(self, name, None)
        self.expect = None
        return {"resources": self.resources()}

    # -- Mooncake Store ---------------------------------------------------------------

    def store_connect(self, master: str, metadata: str, segment_bytes: int, buffer_bytes: int, prefix: str) -> dict:
        from mooncake_weight_store.mooncake_backend import MooncakeStoreBackend

        t = time.perf_counter()
        self.store_backend = MooncakeStoreBackend.connect(
            master, local_hostname=self.ip, metadata_server=metadata, global_segment_size=segment_bytes,
            local_buffer_size=buffer_bytes)
        self.store = mws.Store.from_backend(self.store_backend, key_prefix=prefix, verify_integrity=True)
        return {"seconds": time.perf_counter() - t, "hostname": self.store_backend.store.get_hostname()}

    def store_close(self) -> dict:
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.store_backend is not None:
            self.store_backend.close()
            self.store_backend = None
        return {}

    def plan_upload(self, wires: list, txid: str) -> dict:
        """The coordinator's upload plan for the trainer placement (every binding)."""
        pl = self.model.placement
        bs = [self.binding if w["participant_id"] == self.pid_name else binding_from_wire(pl, w) for w in wires]
        plan = self.store.plan_upload(pl, bs, transaction_id=txid)
        per = {}
        for op in plan.operations():
            per[op.source_participant_id] = per.get(op.source_participant_id, 0) + op.nbytes
        return {"plan": plan.to_json(), "manifest_key": plan.manifest_key, "bytes_per_participant": per,
                "objects": len(plan)}

    def upload(self, plan_json: str, announce: bool) -> dict:
        plan = mws.UploadPlan.from_json(plan_json)
        t0 = time.monotonic()
        try:
            receipts = self.store.upload(plan, self.model.placement, self.binding,
                                         progress=self._progress(announce))
            return {"outcome": "ok", "receipts": receipts.to_json(), "count": len(receipts), "t0": t0,
                    "t1": time.monotonic()}
        except mws.MwsError as e:
            return {"outcome": "failed", "reason": str(e)[:400], "status": e.status_name, "t0": t0,
                    "t1": time.monotonic()}

    def commit(self, plan_json: str, receipts: list) -> dict:
        plan = mws.UploadPlan.from_json(plan_json)
        rs = mws.Receipts.concat([mws.Receipts.from_json(r) for r in receipts]) if receipts else None
        try:
            m = self.store.commit(plan, rs)
            return {"outcome": "committed", "digest": m.digest}
        except mws.MwsError as e:
            return {"outcome": "failed", "status": e.status_name, "reason": str(e)[:400],
                    "decision_may_exist": bool(getattr(e, "decision_may_exist", False))}

    def recover(self, plan_json: str) -> dict:
        """After a failed snapshot: abort when allowed, then finalize (idempotent)."""
        plan = mws.UploadPlan.from_json(plan_json)
        out = {"decision_before": self.store.read_decision(plan).name}
        try:
            self.store.abort_upload(plan)
            out["abort"] = "ok"
        except mws.MwsError as e:
            out["abort"] = e.status_name
        try:
            self.store.finalize_upload(plan)
            out["finalize"] = "ok"
        except mws.MwsError as e:
            out["finalize"] = e.status_name
        out["decision_after"] = self.store.read_decision(plan).name
        return out

    def restore(self, manifest_key: str, gen: int) -> dict:
        """Loads this rank's part of ``manifest_key`` into its arena (integrity on),
        then checks every byte against generation ``gen``."""
        self.arena[:] = POISON
        t0 = time.monotonic()
        try:
            with self.store.load_manifest(manifest_key) as manifest, \
                    mws.LoadPlan.new(manifest, self.model.placement, [self.binding]) as lp:
                st = self.store.load(lp, self.binding)
            out = {"outcome": "ok", "bytes": st.bytes, "requests": st.requests}
        except mws.MwsError as e:
            out = {"outcome": "failed", "status": e.status_name, "reason": str(e)[:400]}
        out["t0"], out["t1"] = t0, time.monotonic()
        out["verify"] = self.verify(gen)
        return out

    def readable(self, manifest_key: str) -> dict:
        """Whether ``manifest_key`` loads (strictly validated) from the store."""
        try:
            with self.store.load_manifest(manifest_key) as m:
                return {"readable": True, "digest": m.digest}
        except mws.MwsError as e:
            return {"readable": False, "status": e.status_name}

    # -- dispatch ---------------------------------------------------------------------

    def handle(self, cmd: dict) -> dict:
        op = cmd["op"]
        if op == "setup":
            return self.setup(cmd["generation"], cmd.get("keep", False), cmd.get("dims"))
        if op == "plan":
            return self.plan_cmd(cmd.get("routing", ""))
        if op == "bind":
            return self.bind(cmd["plan"], cmd["wires"])
        if op in ("pull", "push"):
            return self.live(op, cmd.get("announce", False))
        if op == "verify":
            return self.verify(cmd["generation"])
        if op == "delta_open":
            return self.delta_open()
        if op == "delta_prepare":
            return self.delta_prepare(cmd["inboxes"])
        if op == "delta_mutate":
            return self.delta_mutate(cmd["generation"], cmd["density"])
        if op == "delta_step":
            return self.delta_step(cmd["generation"], cmd["held"])
        if op == "delta_accept":
            return self.delta_accept(cmd["generation"])
        if op == "delta_close":
            return self.delta_close()
        if op == "pull_open":
            return self.pull_open()
        if op == "pull_prepare":
            return self.pull_prepare(cmd["outboxes"])
        if op == "pull_publish":
            return self.pull_publish(cmd["generation"])
        if op == "pull_step":
            return self.pull_step(cmd["generation"], cmd["full"])
        if op == "pull_close":
            return self.pull_close()
        if op == "reset":
            self.arena[:] = POISON
            return {}
        if op == "resources":
            return self.resources()
        if op == "store_connect":
            return self.store_connect(cmd["master"], cmd["metadata"], cmd["segment_bytes"], cmd["buffer_bytes"],
                                      cmd["prefix"])
        if op == "store_close":
            return self.store_close()
        if op == "plan_upload":
            return self.plan_upload(cmd["wires"], cmd["txid"])
        if op == "upload":
            return self.upload(cmd["plan"], cmd.get("announce", False))
        if op == "commit":
            return self.commit(cmd["plan"], cmd["receipts"])
        if op == "recover":
            return self.recover(cmd["plan"])
        if op == "restore":
            return self.restore(cmd["manifest_key"], cmd["generation"])
        if op == "readable":
            return self.readable(cmd["manifest_key"])
        if op == "quit":
            self.pull_close()
            self.delta_close()
            self.store_close()
            self.release_arena()
            return {"errors": self.engine.callback_errors}
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", required=True, choices=["trainer", "server"])
    ap.add_argument("--participant", required=True)
    ap.add_argument("--ip", required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--experts", type=int, required=True)
    args = ap.parse_args()
    rank = Rank(args)
    print(json.dumps({"ready": True, "segment": rank.engine.segment, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            reply = rank.handle(cmd)
        except Exception as e:  # reported to the driver, which fails the run
            reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
        if cmd.get("op") == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
