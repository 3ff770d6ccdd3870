"""Steps that do not block, from Python (issue 46, item 2): a started step's handle
is a ``concurrent.futures.Future`` and an ``asyncio`` awaitable; it can be polled,
waited on with a timeout and cancelled; started steps that notify and verify content
update the targets generation after generation, and a flipped byte is caught as
"torn". The engine is the embedded test engine implemented in Python (its batches
run on the library's threads). No Mooncake needed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

import mooncake_weight_store as mws
from test_prepared_notify import KEY, Live, NotifyingEngine


class HeldEngine(NotifyingEngine):
    """The notifying test engine whose batches wait while ``hold`` is clear."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()
        self.hold.set()
        self.held_calls = 0

    def transfer_sync(self, direction, endpoint, local, remote, sizes):
        self.held_calls += 1
        assert self.hold.wait(30)
        return super().transfer_sync(direction, endpoint, local, remote, sizes)


def setup(backend):
    live = Live()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.tb:
        engine.register_binding(b)
    return live, engine


def test_started_steps_are_futures_and_awaitables_that_notify_and_verify():
    backend = NotifyingEngine()
    live, engine = setup(backend)
    acceptors = [mws.NotifyAcceptor(live.plan, b.participant_id, key=KEY) for b in live.tb]
    for a in acceptors:
        a.verify_content()
    router = mws.NotifyRouter(tuple(acceptors))
    with mws.Sink(engine) as sink:
        prepared = [sink.prepare(live.plan, live.src.placement, b, live.dst.placement, live.tb) for b in live.sb]
        for g in (2, 3, 4):
            backend.flip_next = g == 4
            if g == 3:
                async def run_all():
                    return [await p.start_step(g, key=KEY, verify_content=True) for p in prepared]

                stats = asyncio.run(run_all())
            else:
                handles = [p.start_step(g, key=KEY, verify_content=True) for p in prepared]
                stats = [f.result(timeout=30) for f in concurrent.futures.as_completed([h.future for h in handles])]
                for h in handles:
                    assert h.poll()
                    report = h.report()
                    assert report is not None and all(t == ("updated", g) for t in
                                                      [(t.verdict, t.weight_generation) for t in report.targets])
                    assert h.wait(0) == h.future.result()
            assert sum(s.bytes for s in stats) == live.plan.total_bytes
            for m in backend.take():
                assert router.accept(m)[0] == "accepted"
            verdicts = [a.outcome() for a in acceptors]
            if g < 4:
                assert verdicts == [mws.NotifyOutcome("updated", g, 0)] * len(acceptors)
                for b in live.tb:
                    assert live.dst.verify(b.participant_id, live.dbufs[b.participant_id]) == []
            else:
                assert sum(v.verdict == "torn" for v in verdicts) == 1, verdicts
        for p in prepared:
            p.close()
    for b in live.tb:
        engine.unregister_binding(b)


def test_a_started_step_can_be_polled_timed_out_refused_and_cancelled():
    backend = HeldEngine()
    live, engine = setup(backend)
    with mws.Sink(engine) as sink:
        prepared = [sink.prepare(live.plan, live.src.placement, b, live.dst.placement, live.tb) for b in live.sb]
        p, q = prepared[0], prepared[1]
        backend.hold.clear()
        h = p.start_step(7)
        assert not h.poll()
        with pytest.raises(TimeoutError):
            h.wait(0.02)
        assert h.report() is None
        # A second step of the same prepared transfer is refused through its handle.
        second = p.start_step(8)
        with pytest.raises(mws.InvalidArgumentError, match="a step of this prepared transfer is running"):
            second.wait(30)
        assert isinstance(second.future.exception(timeout=30), mws.InvalidArgumentError)
        # A step of another prepared transfer on the same engine queues behind it;
        # cancelled there, it ends without moving a byte.
        queued = q.start_step(7)
        with pytest.raises(TimeoutError):
            queued.wait(0.02)
        queued.cancel()
        with pytest.raises(mws.MwsError, match="cancelled") as e:
            queued.wait(30)
        assert e.value.report is not None and not e.value.report.submitted
        assert {t.verdict for t in e.value.report.targets} == {"unchanged"}
        backend.hold.set()
        assert h.wait(30).bytes == p.info.bytes
        assert backend.held_calls == p.info.batches, "the cancelled step submitted nothing"
        # A dropped handle's step still runs to its end (its future too).
        fut = p.start_step(9).future
        assert fut.result(timeout=30).bytes == p.info.bytes
        for x in prepared:
            x.close()
    for b in live.tb:
        engine.unregister_binding(b)


def test_plain_calls_start_without_blocking():
    backend = NotifyingEngine()
    live, engine = setup(backend)
    with mws.Sink(engine) as sink:
        futures = []
        for b in live.sb:
            h = sink.start_execute(live.plan, live.src.placement, b, live.dst.placement, live.tb)
            futures.append(h.future)
            h.wait(30)
        assert sum(f.result(timeout=30).bytes for f in futures) == live.plan.total_bytes
    for b in live.tb:
        assert live.dst.verify(b.participant_id, live.dbufs[b.participant_id]) == []
        engine.unregister_binding(b)
    for b in live.sb:
        engine.register_binding(b)
    dst = {p: live.dst.target_buffers(p) for p in live.dst.participant_ids}
    tb = [live.dst.bind(p, dst[p]) for p in live.dst.participant_ids]
    plan = mws.TransferPlan.plan(live.src.placement, live.dst.placement).bind(tb, live.sb)
    with mws.Loader(engine) as loader:
        async def pull_all():
            return [await loader.start_load_live(plan, live.src.placement, live.sb, live.dst.placement, b) for b in tb]

        stats = asyncio.run(pull_all())
        assert sum(s.bytes for s in stats) == plan.total_bytes
    for b in tb:
        assert live.dst.verify(b.participant_id, dst[b.participant_id]) == []
    for b in live.sb:
        engine.unregister_binding(b)


def test_one_step_handle_read_from_many_threads_at_once():
    """Waits, reports and the completion callback read one handle together: its
    report is kept once and lent until the handle is freed (no thread sees it change)."""
    backend = NotifyingEngine()
    live, engine = setup(backend)
    with mws.Sink(engine) as sink:
        prepared = [sink.prepare(live.plan, live.src.placement, b, live.dst.placement, live.tb) for b in live.sb]
        for g in range(2, 12):
            for p in prepared:
                h = p.start_step(g)
                seen = []

                def read() -> None:
                    for _ in range(20):
                        h.wait(30)
                        seen.append(h.report())

                threads = [threading.Thread(target=read) for _ in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert h.future.result(timeout=30).bytes == p.info.bytes
                assert len(seen) == 80 and all(r == seen[0] for r in seen)
                assert all(t.weight_generation == g for t in seen[0].targets)
        for p in prepared:
            p.close()
    for b in live.tb:
        engine.unregister_binding(b)
