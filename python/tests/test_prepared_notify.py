"""Prepared pushes that notify and content-verified flips from Python (issue 46,
items 1 and 3): a prepared sink's steps tell each target what landed with the step's
generation, a router hands each message to the acceptor of its plan and target, the
acceptors follow the newest generation (an older one is stale), and a verifying
acceptor catches a byte flipped in its target as "torn" with the range named. The
engine is the embedded test engine with a notify channel. No Mooncake needed."""

from __future__ import annotations

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.engine_bridge import MemmoveEngine
from mooncake_weight_store.testing import Model, ModelSpec

KEY = b"shared-secret-0123456789"


class Live:
    """A TP4 x DP2 source and a TP2 x EP2 target in this process, plan bound."""

    def __init__(self) -> None:
        spec = ModelSpec(layers=2)
        self.src = Model(spec, "tp", tp=4, dp=2, placement_set_id="trainer")
        self.dst = Model(spec, "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
        self.sbufs = {p: self.src.source_buffers(p) for p in self.src.participant_ids}
        self.dbufs = {p: self.dst.target_buffers(p) for p in self.dst.participant_ids}
        self.sb = [self.src.bind(p, self.sbufs[p]) for p in self.src.participant_ids]
        self.tb = [self.dst.bind(p, self.dbufs[p]) for p in self.dst.participant_ids]
        self.plan = mws.TransferPlan.plan(self.src.placement, self.dst.placement).bind(self.tb, self.sb)


class NotifyingEngine(MemmoveEngine):
    """The test engine with a notify channel (one inbox, as one process's notify
    poll returns them) and a byte flipped in the target of the next batch on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox: list = []
        self.flip_next = False

    def send_notify(self, endpoint, name, message):
        self.inbox.append(bytes(message))
        return 0

    def transfer_sync(self, direction, endpoint, local, remote, sizes):
        code = super().transfer_sync(direction, endpoint, local, remote, sizes)
        if self.flip_next and sizes:
            self.flip_next = False
            import ctypes

            ctypes.c_uint8.from_address(remote[0]).value ^= 0x80
        return code

    def take(self):
        out, self.inbox = self.inbox, []
        return out


def test_prepared_steps_notify_verified_and_routed():
    live = Live()
    backend = NotifyingEngine()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.tb:
        engine.register_binding(b)
    acceptors = [mws.NotifyAcceptor(live.plan, b.participant_id, key=KEY) for b in live.tb]
    for a in acceptors:
        a.verify_content()
    router = mws.NotifyRouter(tuple(acceptors))
    with mws.Sink(engine) as sink:
        prepared = [sink.prepare(live.plan, live.src.placement, b, live.dst.placement, live.tb) for b in live.sb]
        old = []
        for g in (2, 3):
            for p in prepared:
                p.step_notified(g, key=KEY, verify_content=True)
                assert all(t.weight_generation == g for t in p.last_report().targets)
            msgs = backend.take()
            old += msgs if g == 2 else []
            for m in msgs:
                verdict, acc, outcome, why = router.accept(m)
                assert verdict == "accepted", why
                assert acc in acceptors and outcome is not None
            for a, b in zip(acceptors, live.tb):
                assert a.outcome() == mws.NotifyOutcome("updated", g, 0)
                assert a.mismatches() == []
                assert live.dst.verify(b.participant_id, live.dbufs[b.participant_id]) == []
        # An older generation's messages are stale and change nothing.
        assert {router.accept(m)[0] for m in old} == {"stale"}
        assert all(a.outcome() == mws.NotifyOutcome("updated", 3, 0) for a in acceptors)
        # A flipped target byte: that target is torn, the range named.
        backend.flip_next = True
        for p in prepared:
            p.step_notified(4, key=KEY, verify_content=True)
        for m in backend.take():
            assert router.accept(m)[0] == "accepted"
        torn = [a for a in acceptors if a.outcome().verdict == "torn"]
        assert len(torn) == 1
        mm = torn[0].mismatches()
        assert mm and mm[0].bytes > 0 and torn[0].outcome().incomplete == 1
        # An unverified done at a verifying acceptor is refused.
        for p in prepared:
            p.step_notified(5, key=KEY)
        verdicts = {router.accept(m)[0] for m in backend.take()}
        assert verdicts == {"accepted", "unverified"}
        # A short key is refused before anything moves.
        with pytest.raises(mws.InvalidArgumentError, match="16 bytes"):
            prepared[0].step_notified(6, key=b"short")
        assert backend.take() == []
        for p in prepared:
            p.close()
    # The router forgets a removed acceptor; an unknown message is refused, not raised.
    assert router.remove(acceptors[0]) and not router.remove(acceptors[0])
    assert router.accept(b"not a notification")[0] == "malformed"
    acceptors[1].expect_generation(9)
    with pytest.raises(mws.StaleBindingError):
        acceptors[1].expect_generation(8)
    router.close()
    for a in acceptors:
        a.close()
    for b in live.tb:
        engine.unregister_binding(b)
