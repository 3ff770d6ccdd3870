"""Snapshot / restore / races / crash recovery through a live Mooncake Store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mooncake_weight_store import ConflictError, Decision, Store, plan_upload
from mooncake_weight_store.mooncake_backend import (
    NO_AVAILABLE_HANDLE,
    OBJECT_HAS_LEASE,
    MooncakeStoreBackend,
)
from mooncake_weight_store.testing import Model, ModelSpec

WORKER = Path(__file__).with_name("mc_worker.py")
HIDDEN = 64  # model size: ~230 KiB per replica; small enough for 2 cores, real sharding


def run_worker(*args, timeout=120):
    p = subprocess.run([sys.executable, str(WORKER), *args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"worker {args[0]} failed rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return p


def snapshot(store, spec):
    src = Model(spec)
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    with store.begin_snapshot(src.placement, bindings) as w:
        w.write_all()
    return src, w.manifest, bindings


def test_snapshot_tp4dp2_restore_tp2_and_ep_in_another_process(mc_store, master, prefix, tmp_path):
    spec = ModelSpec(hidden=HIDDEN)
    src, manifest, _ = snapshot(mc_store, spec)
    assert manifest.total_bytes == spec.total_bytes  # one DP replica stored
    assert src.placement.participant_count == 8
    out = tmp_path / "restore.json"
    run_worker("restore", "--master", master, "--prefix", prefix, "--hidden", str(HIDDEN),
               "--manifest-key", manifest.key, "--out", str(out))
    res = json.loads(out.read_text())
    assert res["callback_errors"] == []
    for name, r in res["layouts"].items():
        assert r["bad"] == [], name
        assert r["bytes"] == r["target_bytes"], name
    assert res["layouts"]["tp2"]["fragments"] == 18
    assert res["layouts"]["ep2xtp2"]["fragments"] == 36
    # every byte the second process restored crossed loopback TCP from our segment
    total = sum(r["target_bytes"] for r in res["layouts"].values())
    assert res["lo_rx_bytes"] >= total


def test_two_writers_race_one_revision(mc_store, holder, master, prefix, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = []
    for name in ("w1", "w2"):
        out = tmp_path / f"{name}.json"
        procs.append((out, subprocess.Popen(
            [sys.executable, str(WORKER), "race", "--master", master, "--prefix", prefix,
             "--hidden", str(HIDDEN), "--barrier", str(barrier), "--name", name, "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results = []
    for out, p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.read_text()))
    won = [r for r in results if r["outcome"] == "committed"]
    lost = [r for r in results if r["outcome"] != "committed"]
    assert len(won) == 1 and len(lost) == 1, results
    winner, loser = won[0], lost[0]
    assert loser["status"] == "MWS_CONFLICT", (loser.get("status"), loser.get("message"))
    assert winner["digest"] != loser["digest"]
    # one manifest: the winner's
    manifest = mc_store.load_manifest(winner["manifest_key"])
    assert manifest.digest == winner["manifest_digest"]
    # the loser's payloads are gone, the winner's are all there
    assert [k for k in loser["payload_keys"] if holder.exists(k) != 0] == []
    assert all(holder.exists(k) == 1 for k in winner["payload_keys"])
    assert winner["finalize"] == "ok" and loser["finalize"] == "ok"
    assert loser["decision"] == "COMMIT"  # decided commit, lost the manifest race


def test_writer_killed_mid_upload_then_recovered_by_another_process(mc_store, holder, master, prefix, tmp_path):
    plan_file, marker, out = tmp_path / "plan.json", tmp_path / "marker.json", tmp_path / "recover.json"
    a = subprocess.Popen([sys.executable, str(WORKER), "crash", "--master", master, "--prefix", prefix,
                          "--hidden", str(HIDDEN), "--plan-out", str(plan_file), "--marker", str(marker),
                          "--hang-after-calls", "3"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not marker.exists() and time.monotonic() < deadline and a.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), f"writer did not reach the crash point (rc={a.poll()})"
        time.sleep(0.1)
        os.kill(a.pid, signal.SIGKILL)  # dies mid-upload, no cleanup of any kind
    finally:
        if a.poll() is None:
            a.kill()
        a.wait(timeout=30)
    info = json.loads(marker.read_text())
    assert "error" not in info, info
    written = info["written"]
    assert written and all(holder.exists(k) == 1 for k in written)  # orphans exist now
    run_worker("recover", "--master", master, "--prefix", prefix, "--plan", str(plan_file), "--out", str(out))
    res = json.loads(out.read_text())
    assert res["decision_before"] == "NONE"
    assert res["finalize_before"] == "MWS_CONFLICT"  # no terminal decision yet
    assert res["decision_after"] == "ABORT"
    assert res["finalize_after"] == "ok"
    assert res["present_after"] == []  # no orphaned payload
    assert res["manifest_present"] == 0  # no partial revision
    assert [k for k in res["payload_keys"] if holder.exists(k) != 0] == []


class InjectingBackend:
    """Wraps a backend; the first call of each (operation, key) returns a transient
    code: -200 for writes and size/exists queries, -706 for removals, reads and
    ``batch_get_size`` keys."""

    def __init__(self, inner):
        self.inner = inner
        self.seen = set()
        self.injected = {"-200": 0, "-706": 0}

    def _first(self, op, key):
        k = (op, key)
        if k in self.seen:
            return False
        self.seen.add(k)
        return True

    def put(self, key, value, group_id, record_type):
        if self._first("put", key):
            self.injected["-200"] += 1
            return NO_AVAILABLE_HANDLE
        return self.inner.put(key, value, group_id, record_type)

    def upsert(self, key, value, group_id, record_type):
        return self.inner.upsert(key, value, group_id, record_type)

    def get_size(self, key):
        if self._first("get_size", key):
            self.injected["-706"] += 1
            return OBJECT_HAS_LEASE
        return self.inner.get_size(key)

    def get_into(self, key, address, cap):
        if self._first("get_into", key):
            self.injected["-200"] += 1
            return NO_AVAILABLE_HANDLE
        return self.inner.get_into(key, address, cap)

    def exists(self, key):
        if self._first("exists", key):
            self.injected["-706"] += 1
            return OBJECT_HAS_LEASE
        return self.inner.exists(key)

    def remove(self, key):
        if self._first("remove", key):
            self.injected["-706"] += 1
            return OBJECT_HAS_LEASE
        return self.inner.remove(key)

    def batch_put_from(self, items, record_type):
        out = [None] * len(items)
        fwd = []
        for i, it in enumerate(items):
            if self._first("bpf", it.key):
                self.injected["-200"] += 1
                out[i] = NO_AVAILABLE_HANDLE
            else:
                fwd.append(i)
        rcs = self.inner.batch_put_from([items[i] for i in fwd], record_type) if fwd else []
        for i, rc in zip(fwd, rcs):
            out[i] = rc
        return out

    def get_into_ranges(self, items):
        out = [None] * len(items)
        fwd = []
        for i, it in enumerate(items):
            if self._first("gir", (it.key, it.object_offset, it.dest_address)):
                self.injected["-200"] += 1
                out[i] = NO_AVAILABLE_HANDLE
            else:
                fwd.append(i)
        rcs = self.inner.get_into_ranges([items[i] for i in fwd]) if fwd else []
        for i, rc in zip(fwd, rcs):
            out[i] = rc
        return out

    def batch_get_size(self, keys):
        out = [None] * len(keys)
        fwd = []
        for i, k in enumerate(keys):
            if self._first("bgs", k):
                self.injected["-706"] += 1
                out[i] = OBJECT_HAS_LEASE
            else:
                fwd.append(i)
        rcs = self.inner.batch_get_size([keys[i] for i in fwd]) if fwd else []
        for i, rc in zip(fwd, rcs):
            out[i] = rc
        return out

    def register_buffer(self, *a):
        return self.inner.register_buffer(*a)

    def unregister_buffer(self, *a):
        return self.inner.unregister_buffer(*a)


def test_transient_codes_are_retried_not_surfaced(holder, prefix):
    inj = InjectingBackend(holder)
    spec = ModelSpec(hidden=32)
    with Store.from_backend(inj, key_prefix=prefix) as store:
        src, manifest, bindings = snapshot(store, spec)
        tgt = Model(spec, "ep", tp=2, dp=1, ep=2)
        bufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
        stats = store.restore(manifest.key, tgt.placement, [tgt.bind(p, bufs[p]) for p in tgt.participant_ids])
        assert stats.bytes > 0
        assert [f for p in tgt.participant_ids for f in tgt.verify(p, bufs[p])] == []
        # an aborted transaction: removals get -706 first
        plan = store.plan_upload(src.placement, bindings, namespace="second")
        for b in bindings:
            store.upload(plan, src.placement, b).close()
        store.abort_upload(plan)
        assert store.read_decision(plan) == Decision.ABORT
        assert [k for k in plan.payload_keys if holder.exists(k)] == []
        assert store.callback_errors == []
    assert inj.injected["-200"] > 0 and inj.injected["-706"] > 0, inj.injected
    # The restore's size checks went through batch_get_size, its -706 keys through get_size.
    batched = {k for op, k in inj.seen if op == "bgs"}
    assert batched and batched <= {k for op, k in inj.seen if op == "get_size"}
    holder.remove_prefix(prefix)


class FlakyMooncake:
    """A MooncakeDistributedStore proxy: -200 on the first write of each key, -706 on
    the first removal (as eviction lag and read leases do)."""

    def __init__(self, inner):
        self.inner = inner
        self.seen = set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def batch_put_from(self, keys, ptrs, sizes, cfg):
        fresh = [k not in self.seen for k in keys]
        self.seen.update(keys)
        if any(fresh):
            return [NO_AVAILABLE_HANDLE] * len(keys)
        return self.inner.batch_put_from(keys, ptrs, sizes, cfg)

    def put(self, key, value, cfg):
        if ("put", key) not in self.seen:
            self.seen.add(("put", key))
            return NO_AVAILABLE_HANDLE
        return self.inner.put(key, value, cfg)

    def remove(self, key, force=False):
        if ("rm", key) not in self.seen:
            self.seen.add(("rm", key))
            return OBJECT_HAS_LEASE
        return self.inner.remove(key, force)


def test_mooncake_backend_retries_transients_itself(holder, prefix):
    be = MooncakeStoreBackend(FlakyMooncake(holder.store), backoff_s=0.001)
    with Store.from_backend(be, key_prefix=prefix) as store:
        _, manifest, _ = snapshot(store, ModelSpec(hidden=32))
        store.put(f"{prefix}/x", b"v")
        store.remove(f"{prefix}/x")
        assert not store.exists(f"{prefix}/x")
        assert store.callback_errors == []
    assert be.stats["retried_200"] > 0 and be.stats["retried_706"] > 0
    holder.remove_prefix(prefix)


def test_real_read_lease_does_not_block_forced_removal(holder, prefix):
    key = f"{prefix}/leased"
    assert holder.put(key, b"value", "", 1) == 0
    assert holder.get(key) == b"value"  # the read takes a lease (500 ms)
    assert holder.store.remove(key) == OBJECT_HAS_LEASE  # what a plain remove sees
    assert holder.remove(key) == 0  # force: the contract's remove succeeds
    assert holder.exists(key) == 0


def test_backend_contract_against_live_store(holder, prefix):
    import ctypes

    from mooncake_weight_store import PutItem, RangeItem

    k1, k2 = f"{prefix}/a", f"{prefix}/b"
    assert holder.put(k1, b"first", "g", 1) == 0
    assert holder.put(k1, b"second", "g", 1) == 0  # insert-if-absent
    assert holder.get(k1) == b"first"
    assert holder.upsert(k1, b"third!", "g", 1) == 0 and holder.get(k1) == b"third!"
    assert holder.get_size(f"{prefix}/missing") == -704
    with pytest.raises(KeyError):
        holder.get(f"{prefix}/missing")
    src = bytearray(range(256)) * 4
    dst = bytearray(64)
    cs, cd = (ctypes.c_char * len(src)).from_buffer(src), (ctypes.c_char * 64).from_buffer(dst)
    ps, pd = ctypes.addressof(cs), ctypes.addressof(cd)
    assert holder.register_buffer(ps, len(src)) == 0 and holder.register_buffer(pd, 64) == 0
    try:
        assert holder.batch_put_from([PutItem(k2, "g", ps, 512), PutItem(f"{prefix}/c", "h", ps + 512, 512)], 0) == [0, 0]
        assert holder.exists(k2) == 1 and holder.batch_exists([k2, f"{prefix}/nope"]) == [1, 0]
        items = [RangeItem(k2, 10, pd, 4, pd), RangeItem(f"{prefix}/c", 0, pd + 8, 4, pd),
                 RangeItem(k2, 100, pd + 32, 8, pd + 32), RangeItem(f"{prefix}/nope", 0, pd + 48, 1, pd + 32)]
        res = holder.get_into_ranges(items)
        assert res[:3] == [4, 4, 8] and res[3] < 0
        assert dst[0:4] == src[10:14] and dst[8:12] == src[512:516] and dst[32:40] == src[100:108]
        assert holder.batch_put_from([PutItem("", "g", ps, 1)], 0)[0] < 0
        assert holder.batch_put_from([PutItem(f"{prefix}/d", "g", ps, 1, 1)], 0) == [-600]  # device memory
    finally:
        holder.unregister_buffer(ps)
        holder.unregister_buffer(pd)
    assert holder.remove(k1) == 0 and holder.remove(k1) == -704


def test_registration_leases_and_batch_exists_against_live_store(mc_store, holder):
    """Snapshot and restore with one registration lease per participant: Mooncake sees
    each buffer registered once, every existence check of the payloads is batched."""
    from mooncake_weight_store import LoadPlan

    calls = {"register": 0, "unregister": 0, "batch_exists": 0}
    orig = {k: getattr(holder, k) for k in ("register_buffer", "unregister_buffer", "batch_exists")}

    def counted(name, key):
        def f(*a, **kw):
            calls[key] += 1
            return orig[name](*a, **kw)
        return f

    spec = ModelSpec(hidden=HIDDEN)
    src = Model(spec)
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    holder.register_buffer = counted("register_buffer", "register")
    holder.unregister_buffer = counted("unregister_buffer", "unregister")
    holder.batch_exists = counted("batch_exists", "batch_exists")
    try:
        plan = mc_store.plan_upload(src.placement, bindings)
        leases = [mc_store.register_buffers(b, plan.source_fragment_ids(b.participant_id))
                  for b in bindings if plan.source_fragment_ids(b.participant_id)]
        registered = calls["register"]
        assert 0 < registered <= len(plan)  # each source buffer once
        with mc_store.transaction(plan) as tx:
            for lease in leases:
                tx.upload(src.placement, lease.binding, lease=lease)
                mc_store.upload(plan, src.placement, lease.binding, lease=lease)  # a retry: nothing registered
        assert calls["register"] == registered and calls["unregister"] == 0
        assert calls["batch_exists"] > 0
        for lease in leases:
            lease.close()
            lease.close()
        assert calls["unregister"] == registered
        target = Model(spec, "tp", tp=2, dp=1)
        tbufs = {p: target.target_buffers(p) for p in target.participant_ids}
        tb = [target.bind(p, tbufs[p]) for p in target.participant_ids]
        with mc_store.load_manifest(tx.manifest.key) as m, LoadPlan.new(m, target.placement, tb) as lp:
            staging = 0
            for b in tb:
                with mc_store.register_buffers(b, side="target") as lease:
                    n = calls["register"]
                    assert mc_store.load(lp, b, lease=lease).bytes > 0
                    # Nothing per call: only the store's restore staging buffer,
                    # registered once for every restore of this store.
                    staging += calls["register"] - n
            assert staging == 1
        assert [f for p in target.participant_ids for f in target.verify(p, tbufs[p])] == []
        assert mc_store.pending_registration_count == 0
    finally:
        for k, f in orig.items():
            setattr(holder, k, f)


def test_batch_get_size_equals_get_size_against_live_store(holder, prefix):
    """The backend's ``batch_get_size`` (one ``batch_get_replica_desc`` round trip)
    answers exactly what ``get_size`` answers, for objects of several sizes and a
    missing key among them; only the missing key is asked with ``get_size``."""
    sizes = [1, 7, 4096, 100_000, (1 << 20) + 3]
    keys = [f"{prefix}/s{n}" for n in sizes]
    for k, n in zip(keys, sizes):
        assert holder.put(k, bytes([n % 251]) * n, "g", 0) == 0
    missing = f"{prefix}/missing"
    asked = keys[:2] + [missing] + keys[2:]
    expected = [holder.get_size(k) for k in asked]
    assert expected == sizes[:2] + [-704] + sizes[2:]
    single = []
    orig = holder.get_size

    def counted(key):
        single.append(key)
        return orig(key)

    holder.get_size = counted
    try:
        assert holder.batch_get_size(asked) == expected
        assert single == [missing]  # present keys: from their replica descriptors
        assert holder.batch_get_size([]) == []
    finally:
        del holder.get_size
    assert holder.get_size(keys[0]) == 1
    holder.remove_prefix(prefix)


def test_device_tensors_through_the_live_store(holder, prefix):
    """Device memory (the fenced device: any host access crashes the process) through a
    live Mooncake Store: the weight store stages it in buffers it registers with the
    store, so the backend sees host memory only (no -600), and restores are verified
    before a byte reaches the device."""
    import numpy as np

    from mooncake_weight_store import (DeviceEngine, MemoryKind, Parallel, TensorView, dtype_name, load_state_dict,
                                       save_state_dict)

    engine = DeviceEngine.fenced(16 << 20)

    def on_device(a, writable=False):
        address = engine.fenced_alloc(a.nbytes)
        engine.copy([(a.ctypes.data, address, a.nbytes)], "h2d")
        return TensorView(address=address, shape=a.shape, dtype=dtype_name(a.dtype), readonly=not writable,
                          source="test", obj=engine, memory_kind=MemoryKind.DEVICE, device_ordinal=0)

    src = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    with Store.from_backend(holder, key_prefix=prefix, device_engine=engine) as store:
        m = save_state_dict(store, {"w": on_device(src)}, resource_id="dev", revision="r", weight_generation=1)
        target = on_device(np.zeros((256, 32), np.float32), True)
        load_state_dict(store, m.key, into={"w": target}, sharding={"w": 1}, parallel=Parallel(tp_rank=1, tp_size=2))
        out = np.empty((256, 32), np.float32)
        engine.copy([(target.address, out.ctypes.data, out.nbytes)], "d2h")
        assert (out == src[:, 32:]).all()
        assert store.callback_errors == []
        m.close()
    assert engine.stats()["batches"] >= 3
    holder.remove_prefix(prefix)
