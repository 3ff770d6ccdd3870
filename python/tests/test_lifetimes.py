"""Handle lifetimes: a handle that borrows buffers keeps them until it is closed, and
no handle is freed under a running call.

- A binding closed while a prepared transfer (or a bound plan) uses it stops taking
  calls at once, but keeps its buffer exports until the last handle using it is
  closed: the buffers cannot be released (``BufferError``) and the next step writes
  memory that is still the caller's.
- ``close()`` racing ``step()`` from other threads, for thousands of iterations,
  with re-preparation: every step either completes or is refused as closed; no
  crash, no hang.
"""

from __future__ import annotations

import mmap
import random
import threading
import time

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.engine_bridge import MemmoveEngine
from mooncake_weight_store.testing import Model, ModelSpec


class Pair:
    """A TP2 trainer and a TP1 server in this process, the plan bound (small: the
    race test prepares thousands of times)."""

    def __init__(self, target_buffers=None) -> None:
        spec = ModelSpec(layers=1)
        self.src = Model(spec, "tp", tp=2, dp=1, placement_set_id="trainer")
        self.dst = Model(spec, "tp", tp=1, dp=1, placement_set_id="serving")
        self.sbufs = {p: self.src.source_buffers(p) for p in self.src.participant_ids}
        self.dbufs = {p: (target_buffers or self.dst.target_buffers)(p) for p in self.dst.participant_ids}
        self.sb = [self.src.bind(p, self.sbufs[p], instance_id=f"trainer-{p}") for p in self.src.participant_ids]
        self.tb = [self.dst.bind(p, self.dbufs[p], instance_id=f"serving-{p}") for p in self.dst.participant_ids]
        self.plan = mws.TransferPlan.plan(self.src.placement, self.dst.placement).bind(self.tb, self.sb)
        self.engine = mws.TransferEngine.local()
        for b in self.sb:
            self.engine.register_binding(b)

    def prepare(self, loader: mws.Loader) -> mws.PreparedTransfer:
        return loader.prepare_live(self.plan, self.src.placement, self.sb, self.dst.placement, self.tb[0])

    def wrong(self) -> list:
        p = self.dst.participant_ids[0]
        return [f.placement_fragment_id for f in self.dst.placement.participant_fragments(p)
                if bytes(self.dbufs[p][f.placement_fragment_id]) != bytes(self.dst.expected(f))]

    def clear_targets(self) -> None:
        for bufs in self.dbufs.values():
            for buf in bufs.values():
                buf[:] = bytes(len(buf))


def test_a_binding_closed_under_a_prepared_transfer_keeps_its_buffers_until_the_transfer_closes():
    pair = Pair()
    loader = mws.Loader(pair.engine)
    prep = pair.prepare(loader)
    prep.step(1)
    assert pair.wrong() == []
    local = pair.tb[0]
    buf = next(iter(pair.dbufs[local.participant_id].values()))
    pair.clear_targets()
    local.close()
    with pytest.raises(mws.ArgumentError, match="binding is closed"):
        local.validate()
    # The export is still held: the buffer cannot be resized or freed under the
    # prepared transfer (before the fix: cleared, then written by the next step).
    with pytest.raises(BufferError):
        buf.clear()
    prep.step(2)
    assert pair.wrong() == [], "the step wrote the caller's (still valid) buffers"
    prep.close()
    with pytest.raises(BufferError):
        buf.clear()  # the bound plan still records its address
    pair.plan.close()
    buf.clear()  # the last user is gone: the export is released
    assert len(buf) == 0


def test_an_mmap_target_cannot_be_closed_under_a_prepared_transfer():
    maps = []

    def mapped(participant):
        out = {}
        for f in Model(ModelSpec(layers=1), "tp", tp=1, dp=1, placement_set_id="serving").placement.participant_fragments(
                participant):
            m = mmap.mmap(-1, f.nbytes)
            maps.append(m)
            out[f.placement_fragment_id] = m
        return out

    pair = Pair(target_buffers=mapped)
    prep = pair.prepare(mws.Loader(pair.engine))
    prep.step(1)
    pair.tb[0].close()
    with pytest.raises(BufferError):
        maps[0].close()
    prep.step(2)
    assert pair.wrong() == []
    prep.close()
    pair.plan.close()
    for m in maps:
        m.close()


def test_close_racing_steps_never_frees_under_a_running_step():
    pair = Pair()
    loader = mws.Loader(pair.engine)
    rng = random.Random(43)
    deadline = time.monotonic() + 20.0
    iterations = completed = refused = 0
    errors: list = []
    while iterations < 3000 and time.monotonic() < deadline:
        prep = pair.prepare(loader)
        start = threading.Barrier(3)

        def stepper(gen0: int) -> None:
            nonlocal completed, refused
            start.wait()
            g = gen0
            while True:
                try:
                    prep.step(g)
                    completed += 1
                except (mws.ArgumentError, mws.MwsError) as e:
                    if "closed" not in str(e):
                        errors.append(repr(e))
                    refused += 1
                    return
                g += 2

        threads = [threading.Thread(target=stepper, args=(g,)) for g in (1, 2)]
        for t in threads:
            t.start()
        start.wait()
        if rng.random() < 0.5:
            time.sleep(rng.random() * 0.002)
        prep.close()
        for t in threads:
            t.join(10)
            assert not t.is_alive(), "a step hung after close"
        iterations += 1
    assert errors == []
    assert iterations >= 200, f"only {iterations} iterations ran"
    assert refused == 2 * iterations, "every stepper ends on the closed transfer"
    # The engine holds nothing: every preparation's registration was undone.
    assert pair.engine.resources().pending_transfers == 0
    prep = pair.prepare(loader)
    pair.clear_targets()
    prep.step(99)
    assert pair.wrong() == []
    prep.close()


def test_a_handle_closed_from_another_thread_waits_for_the_running_call():
    """A live load blocked inside the engine: close() of its loader from another
    thread waits, and returns only once the load's library call has returned (before
    the fix it freed the loader under the running load)."""
    entered, go = threading.Event(), threading.Event()

    class Slow(MemmoveEngine):
        def transfer_sync(self, *a, **kw):  # type: ignore[no-untyped-def]
            entered.set()
            go.wait(10)
            return super().transfer_sync(*a, **kw)

    pair = Pair()
    engine = mws.TransferEngine.from_backend(Slow())
    for b in pair.sb:
        engine.register_binding(b)
    loader = mws.Loader(engine)
    order = []

    def load() -> None:
        loader.load_live(pair.plan, pair.src.placement, pair.sb, pair.dst.placement, pair.tb[0])
        order.append("load returned")

    t = threading.Thread(target=load)
    t.start()
    assert entered.wait(10)
    closer = threading.Thread(target=lambda: (loader.close(), order.append("close returned")))
    closer.start()
    time.sleep(0.2)
    assert order == [], "close returned while the load ran"
    go.set()
    t.join(10)
    closer.join(10)
    assert sorted(order) == ["close returned", "load returned"]
    assert pair.wrong() == [], "the load completed, its bytes intact"
    with pytest.raises(mws.ArgumentError, match="loader is closed"):
        loader.last_report()
