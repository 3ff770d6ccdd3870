"""Sparse delta steps from Python (issue 47): after a full, verified step each
target that holds the source's base generation is sent only the changed elements
into its inbox, its acceptor applies and verifies them; a target that holds nothing
is sent every byte. The bytes are checked bit for bit by changing the sources and
changing them back. The engine is the embedded test engine (Python). No Mooncake."""

from __future__ import annotations

import ctypes
import random

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.engine_bridge import Direction
from test_prepared_notify import KEY, Live, NotifyingEngine


def _addr(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def _change_one_percent(live: Live, seed: int) -> list:
    """Flips about 1% of the bytes of every source buffer of ``live`` (deterministic in
    ``seed``); returns what :func:`_revert` needs to put them back."""
    rng = random.Random(seed)
    changed = []
    for bufs in live.sbufs.values():
        for buf in bufs.values():
            for _ in range(max(1, len(buf) // 100)):
                i = rng.randrange(len(buf))
                changed.append((buf, i, buf[i]))
                buf[i] ^= 0x5A
    return changed


def _revert(changed: list) -> None:
    """Puts back the bytes :func:`_change_one_percent` flipped."""
    for buf, i, old in reversed(changed):
        buf[i] = old


def test_delta_steps_send_the_changes_and_every_byte_ends_right():
    live = Live()
    backend = NotifyingEngine()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.tb:
        engine.register_binding(b)
    inboxes = {}
    keep = []
    for b in live.tb:
        size = sum(len(x) for x in live.dbufs[b.participant_id].values())
        box = bytearray(max(4096, size // 4))
        keep.append(box)
        engine.register_memory(_addr(box), len(box))
        inboxes[b.participant_id] = (_addr(box), len(box))
    acceptors = {}
    for b in live.tb:
        a = mws.NotifyAcceptor(live.plan, b.participant_id, key=KEY)
        a.verify_content()
        a.accept_deltas(*inboxes[b.participant_id])
        acceptors[b.participant_id] = a
    router = mws.NotifyRouter(tuple(acceptors.values()))

    def deliver():
        return [router.accept(m)[0] for m in backend.take()]

    def held():
        return {t: a.held_generation() for t, a in acceptors.items() if a.held_generation() is not None}

    with mws.Sink(engine) as sink:
        prepared = [sink.prepare(live.plan, live.src.placement, b, live.dst.placement, live.tb) for b in live.sb]
        for p in prepared:
            p.enable_delta(inboxes)
        assert all(a.held_generation() is None for a in acceptors.values())
        # Generation 2: full (nothing held).
        for p in prepared:
            p.step_delta(2, held=held(), key=KEY)
        assert set(deliver()) == {"accepted"}
        assert {t: a.held_generation() for t, a in acceptors.items()} == {t: 2 for t in acceptors}
        stats = [s for s in (p.delta_stats() for p in prepared) if s]
        assert stats and all(s["delta_targets"] == 0 and s["wire_bytes"] == s["logical_bytes"] for s in stats)
        # Generation 3: ~1% of the source bytes change; generation 4 changes them back.
        changed = _change_one_percent(live, seed=7)
        for g, started in ((3, False), (4, True)):
            if g == 4:
                _revert(changed)
            h = held()
            if started:
                for p in prepared:
                    p.start_step(g, key=KEY, held=h).wait(30)
            else:
                for p in prepared:
                    p.step_delta(g, held=h, key=KEY)
            assert set(deliver()) == {"accepted"}
            assert all(a.outcome().verdict == "updated" and a.held_generation() == g for a in acceptors.values())
            stats = [s for s in (p.delta_stats() for p in prepared) if s and s["logical_bytes"]]
            assert all(s["full_targets"] == 0 and s["weight_generation"] == g for s in stats), stats
            wire = sum(s["wire_bytes"] for s in stats)
            logical = sum(s["logical_bytes"] for s in stats)
            assert 0 < wire < logical // 2, (wire, logical)
        # Back to the model's bytes: every target byte is right.
        for b in live.tb:
            assert live.dst.verify(b.participant_id, live.dbufs[b.participant_id]) == []
        # A target that restarted (a fresh acceptor holds nothing): refused if told a
        # delta, then repaired by the full step its "held" asks for.
        t0 = live.tb[0].participant_id
        router.remove(acceptors[t0])
        acceptors[t0].close()
        fresh = mws.NotifyAcceptor(live.plan, t0, key=KEY)
        fresh.verify_content()
        fresh.accept_deltas(*inboxes[t0])
        acceptors[t0] = fresh
        router.add(fresh)
        lie = {t: 4 for t in acceptors}
        for p in prepared:
            p.step_delta(5, held=lie, key=KEY)
        verdicts = deliver()
        assert "delta_base" in verdicts
        assert fresh.outcome().verdict == "torn" and fresh.held_generation() is None
        for p in prepared:
            p.step_delta(6, held=held(), key=KEY)
        assert set(deliver()) == {"accepted"}
        assert all(a.outcome().verdict == "updated" and a.held_generation() == 6 for a in acceptors.values())
        for b in live.tb:
            assert live.dst.verify(b.participant_id, live.dbufs[b.participant_id]) == []
        for p in prepared:
            p.close()
    router.close()
    for a in acceptors.values():
        a.close()
    for box in keep:
        engine.unregister_memory(_addr(box))
    for b in live.tb:
        engine.unregister_binding(b)


class DeviceNotifyingEngine(NotifyingEngine):
    """:class:`NotifyingEngine` over the fenced device as well: ranges in the device
    allocations the test made move device to device through the device engine (the
    host never touches them), the delta inboxes and outboxes (host memory) with
    memmove. Device memory is registered as host memory here (a test double)."""

    def __init__(self, dev: mws.DeviceEngine) -> None:
        super().__init__()
        self.dev = dev
        self.device_ranges: list = []

    def register_memory(self, address, length, device):
        return super().register_memory(address, length, -1)

    def transfer_sync(self, direction, endpoint, local, remote, sizes):
        if not any(s <= local[0] < s + n for s, n in self.device_ranges):
            return super().transfer_sync(direction, endpoint, local, remote, sizes)
        pairs = zip(local, remote, sizes) if direction == Direction.WRITE else zip(remote, local, sizes)
        self.dev.copy([(s, t, n) for s, t, n in pairs], "d2d")
        return 0


def test_delta_steps_between_device_buffers():
    """Delta steps of device sources into device targets (the fenced device: any host
    access of its memory crashes the process): the source's engine stages its bytes
    through the device engine (``TransferEngine.from_backend(..., device_engine=)``),
    the acceptors apply and verify through theirs (``use_device_engine``); without
    one each is refused. Every device byte checked."""
    live = Live()
    dev = mws.DeviceEngine.fenced(64 << 20)

    def on_device(model, bufs, pid):
        b = mws.Binding(model.placement, pid, lease_id="lease-1")
        for fid, buf in bufs.items():
            address = dev.fenced_alloc(len(buf))
            dev.copy([(_addr(buf), address, len(buf))], "h2d")
            b.add_address(fid, address, len(buf), device="cuda:0", memory_kind=mws.MemoryKind.DEVICE)
            backend.device_ranges.append((address, len(buf)))
        return b

    def pulled(b, bufs):
        out = {}
        for fid, buf in bufs.items():
            host = bytearray(len(buf))
            dev.copy([(b.addresses[fid], _addr(host), len(buf))], "d2h")
            out[fid] = host
        return out

    backend = DeviceNotifyingEngine(dev)
    sb = [on_device(live.src, live.sbufs[p], p) for p in live.src.participant_ids]
    tb = [on_device(live.dst, live.dbufs[p], p) for p in live.dst.participant_ids]
    plan = mws.TransferPlan.plan(live.src.placement, live.dst.placement).bind(tb, sb)
    plain = mws.TransferEngine.from_backend(DeviceNotifyingEngine(dev))  # no device_engine=
    engine = mws.TransferEngine.from_backend(backend, device_engine=dev)
    assert engine.device_engine is dev and plain.device_engine is None
    for b in tb:
        engine.register_binding(b)
    inboxes, keep, acceptors = {}, [], {}
    for b in tb:
        box = bytearray(max(4096, sum(len(x) for x in live.dbufs[b.participant_id].values()) // 2))
        keep.append(box)
        engine.register_memory(_addr(box), len(box))
        inboxes[b.participant_id] = (_addr(box), len(box))
        a = mws.NotifyAcceptor(plan, b.participant_id, key=KEY)
        with pytest.raises(mws.UnsupportedError, match="device engine"):
            a.verify_content()
        a.use_device_engine(dev)
        a.verify_content()
        a.accept_deltas(*inboxes[b.participant_id])
        acceptors[b.participant_id] = a
    router = mws.NotifyRouter(tuple(acceptors.values()))

    def held():
        return {t: a.held_generation() for t, a in acceptors.items() if a.held_generation() is not None}

    with mws.Sink(plain) as refusing:
        p = refusing.prepare(plan, live.src.placement, sb[0], live.dst.placement, tb)
        with pytest.raises(mws.UnsupportedError, match="device engine"):
            p.enable_delta(inboxes)
        p.close()
    with mws.Sink(engine) as sink:
        prepared = [sink.prepare(plan, live.src.placement, b, live.dst.placement, tb) for b in sb]
        for p in prepared:
            p.enable_delta(inboxes)
        rng = random.Random(47)
        for g in (2, 3, 4):
            if g > 2:  # ~1% of every source buffer changes, on the device
                for b in sb:
                    for fid, buf in live.sbufs[b.participant_id].items():
                        for _ in range(max(1, len(buf) // 100)):
                            i = rng.randrange(len(buf))
                            buf[i] ^= 0x21
                        dev.copy([(_addr(buf), b.addresses[fid], len(buf))], "h2d")
            for p in prepared:
                p.step_delta(g, held=held(), key=KEY)
            assert {router.accept(m)[0] for m in backend.take()} == {"accepted"}
            assert all(a.outcome().verdict == "updated" and a.held_generation() == g for a in acceptors.values())
            stats = [s for s in (p.delta_stats() for p in prepared) if s and s["logical_bytes"]]
            if g > 2:
                assert all(s["full_targets"] == 0 for s in stats), stats
                assert sum(s["wire_bytes"] for s in stats) * 4 < sum(s["logical_bytes"] for s in stats)
        # Every target byte equals what a host transfer of the generation-4 sources
        # (the host copies, changed as the device ones were) writes.
        ref = {p: live.dst.target_buffers(p) for p in live.dst.participant_ids}
        rb = [live.dst.bind(p, ref[p]) for p in live.dst.participant_ids]
        hb = [live.src.bind(p, live.sbufs[p]) for p in live.src.participant_ids]
        host_plan = mws.TransferPlan.plan(live.src.placement, live.dst.placement).bind(rb, hb)
        he = mws.TransferEngine.from_backend(NotifyingEngine())
        for b in rb:
            he.register_binding(b)
        with mws.Sink(he) as hs:
            for s in hb:
                hs.execute(host_plan, live.src.placement, s, live.dst.placement, rb)
        for b in tb:
            assert pulled(b, live.dbufs[b.participant_id]) == ref[b.participant_id], b.participant_id
        for p in prepared:
            p.close()
    router.close()
    for a in acceptors.values():
        a.close()


def test_pulled_delta_steps_verify_every_byte():
    """Pulled delta steps (``DeltaPublisher`` on the source side, ``enable_delta_pull``
    on each server reader): the first step is full, then the readers pull only the
    changes and verify them; a step before its generation is published is refused
    with nothing moved; a target changed behind the reader's back is caught as torn
    and repaired by the next (full) step. Every target byte checked."""
    live = Live()
    backend = NotifyingEngine()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.sb:
        engine.register_binding(b)  # the readers read the sources: registered by their owner
    publishers = []
    for p in live.src.participant_ids:
        try:
            least = mws.DeltaPublisher.min_outbox_capacity(live.plan, p)
        except mws.InvalidArgumentError as e:  # a DP replica the plan does not read
            assert "has 0 source executors" in str(e)
            continue
        publishers.append(mws.DeltaPublisher(live.plan, p, engine, max(least, 1 << 16)))
    assert len(publishers) == live.plan.executor_count("source")
    with pytest.raises(mws.InvalidArgumentError, match="too small"):
        mws.DeltaPublisher(live.plan, publishers[0].outbox.participant_id, engine, 10)
    outboxes = [p.outbox for p in publishers]
    assert all(o.capacity >= 1 << 16 and o.address for o in outboxes)
    with mws.Loader(engine) as loader:
        readers = [loader.prepare_live(live.plan, live.src.placement, live.sb, live.dst.placement, b) for b in live.tb]
        for r in readers:
            r.enable_delta_pull(outboxes)
            assert r.held_generation() is None
        with pytest.raises(mws.ConflictError, match="publish"):
            readers[0].step(2)
        for g in (2, 3, 4):
            if g == 3:
                changed = _change_one_percent(live, seed=11)
            if g == 4:
                _revert(changed)
            published = [p.publish(g) for p in publishers]
            assert all((s["delta_targets"] == 0) == (g == 2) for s in published), published
            for r in readers:
                r.step(g)
                assert r.held_generation() == g
            stats = [r.delta_stats() for r in readers]
            wire = sum(s["wire_bytes"] for s in stats)
            logical = sum(s["logical_bytes"] for s in stats)
            assert (wire > logical) if g == 2 else (wire < logical // 2), (g, wire, logical)
        for b in live.tb:
            assert live.dst.verify(b.participant_id, live.dbufs[b.participant_id]) == []
        # A target byte changed behind the reader's back: torn, then repaired.
        t0 = live.tb[0].participant_id
        next(iter(live.dbufs[t0].values()))[0] ^= 0x01
        for p in publishers:
            p.publish(5)
        with pytest.raises(mws.IntegrityError, match="does not match"):
            readers[0].step(5)
        assert readers[0].held_generation() is None
        for r in readers[1:]:
            r.step(5)
        for p in publishers:
            p.publish(6)
        for r in readers:
            r.step(6)
        assert readers[0].delta_stats()["delta_targets"] == 0 and readers[1].delta_stats()["delta_targets"] == 1
        for b in live.tb:
            assert live.dst.verify(b.participant_id, live.dbufs[b.participant_id]) == []
        for r in readers:
            r.close()
    for p in publishers:
        p.close()
    for b in live.sb:
        engine.unregister_binding(b)

