"""Sparse delta steps from Python (issue 47): after a full, verified step each
target that holds the source's base generation is sent only the changed elements
into its inbox, its acceptor applies and verifies them; a target that holds nothing
is sent every byte. The bytes are checked bit for bit by changing the sources and
changing them back. The engine is the embedded test engine (Python). No Mooncake."""

from __future__ import annotations

import ctypes
import random

import mooncake_weight_store as mws
from test_prepared_notify import KEY, Live, NotifyingEngine


def _addr(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


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
        rng = random.Random(7)
        changed = []
        for bufs in live.sbufs.values():
            for buf in bufs.values():
                for _ in range(max(1, len(buf) // 100)):
                    i = rng.randrange(len(buf))
                    changed.append((buf, i, buf[i]))
                    buf[i] ^= 0x5A
        for g, started in ((3, False), (4, True)):
            if g == 4:
                for buf, i, old in reversed(changed):
                    buf[i] = old
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
