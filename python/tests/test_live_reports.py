"""The report of every live call, read from Python (issue 25): per target participant
the verdict (updated / unchanged / torn) and the generation, whether anything was
submitted to the engine, how the allocation guards' pins were released, and what the
engine still holds. The interrupted call is real: a Python engine that moves part of a
batch and then fails it (as a peer killed mid-batch makes the wheel's legacy batch
fail), so completion is unknown. No Mooncake needed."""

from __future__ import annotations

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.engine_bridge import MemmoveEngine
from mooncake_weight_store.testing import Model, ModelSpec


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

    def bad(self, participant):
        return self.dst.verify(participant, self.dbufs[participant])


class DiesMidBatch(MemmoveEngine):
    """Moves the first half of the first batch's ranges, then answers -1 (the legacy
    batch API's "completion unknown"), as a peer killed in the middle of a batch."""

    def transfer_sync(self, direction, endpoint, local, remote, sizes):
        half = max(1, len(sizes) // 2)
        super().transfer_sync(direction, endpoint, local[:half], remote[:half], sizes[:half])
        return -1


def test_reports_of_successful_pulls_and_pushes():
    live = Live()
    engine = mws.TransferEngine.from_backend(MemmoveEngine())
    for b in live.sb:
        engine.register_binding(b)
    with mws.Loader(engine) as loader:
        assert loader.last_report() is None
        for b in live.tb:
            st = loader.load_live(live.plan, live.src.placement, live.sb, live.dst.placement, b)
            r = loader.last_report()
            assert r.submitted and r.guard_release == "completed" and r.pending_transfer_id is None
            assert r.verdicts() == {b.participant_id: "updated"}
            assert r.targets[0].weight_generation == 1
            assert r.stats == st == loader.stats()
            assert live.bad(b.participant_id) == []
    for b in live.sb:
        engine.unregister_binding(b)
    for b in live.tb:
        engine.register_binding(b)
    with mws.Sink(engine) as sink:
        seen = []
        sink.set_progress(lambda p: seen.append(p.bytes_done))
        shares = {}
        for b in live.sb:
            st = sink.execute(live.plan, live.src.placement, b, live.dst.placement, live.tb)
            r = sink.last_report()
            assert r.stats == st == sink.stats()
            if st.bytes == 0:  # an unselected DP replica
                assert not r.submitted and r.targets == () and r.guard_release == "not_pinned"
                continue
            assert r.submitted and r.guard_release == "completed"
            for t in r.targets:
                assert t.verdict == "updated"
                shares.setdefault(t.participant_id, []).append(b.participant_id)
        assert set(shares) == {b.participant_id for b in live.tb}, "every target got its shares"
        assert seen, "the sink reported progress"
    for b in live.tb:
        engine.unregister_binding(b)
    res = engine.resources()
    assert (res.pending_transfers, res.quarantined_registrations, res.pinned_tokens) == (0, 0, 0)


def test_an_interrupted_pull_reports_its_target_torn_and_what_stays_held():
    live = Live()
    backend = DiesMidBatch()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.sb:
        engine.register_binding(b)
    target = live.tb[0]
    with mws.Loader(engine) as loader:
        with pytest.raises(mws.MwsError) as ei:
            loader.load_live(live.plan, live.src.placement, live.sb, live.dst.placement, target)
        report = ei.value.report
        assert report == loader.last_report()
        assert report.submitted, "the batch was handed to the engine"
        assert report.verdicts() == {target.participant_id: "torn"}
        assert report.targets[0].weight_generation == 1
        # Completion unknown: the pins and the call's own registration of the target
        # buffers stay with the pending transfer (never released while DMA may run).
        assert report.guard_release == "pending" and report.pending_transfer_id
        assert report.pending_transfer_id in str(ei.value)
        assert report.stats == mws.TransferStats()
        assert live.bad(target.participant_id) != [], "not every byte landed"
    res = engine.resources()
    assert res.pending_transfers == 1 and res.quarantined_registrations >= 1 and res.pinned_tokens >= 1
    assert res.registered_regions is None  # a Python engine cannot list its registrations

    # A cancelled call on a fresh engine submits nothing: the target is unchanged.
    engine2 = mws.TransferEngine.from_backend(MemmoveEngine())
    for b in live.sb:
        engine2.register_binding(b)
    with mws.Loader(engine2) as loader:
        loader.cancel()
        with pytest.raises(mws.MwsError, match="cancelled") as ei:
            loader.load_live(live.plan, live.src.placement, live.sb, live.dst.placement, live.tb[1])
        r = ei.value.report
        assert not r.submitted and r.guard_release == "aborted" and r.pending_transfer_id is None
        assert r.verdicts() == {live.tb[1].participant_id: "unchanged"}
    for b in live.sb:
        engine2.unregister_binding(b)
    assert engine2.resources().pending_transfers == 0


def test_notify_acceptor_refuses_what_it_cannot_check_and_changes_nothing():
    """The target side of the notify hook from Python (the sink side needs an engine
    with a notify channel: C/C++ only). A refusal is a verdict, never an exception,
    and leaves the outcome as it was."""
    live = Live()
    target = live.dst.participant_ids[0]
    with mws.NotifyAcceptor(live.plan, target, key=b"k" * 16) as acc:
        assert acc.outcome() == mws.NotifyOutcome("unchanged", 1, 0)
        verdict, outcome, why = acc.accept(b"not a notification")
        assert verdict == "malformed" and why and outcome == mws.NotifyOutcome("unchanged", 1, 0)
        verdict, _, why = acc.accept(b"MWS-NOTIFY/1 hmac-sha256 " + b"0" * 64 + b" 99\n{}")
        assert verdict in ("truncated", "malformed") and why
        assert acc.outcome().verdict == "unchanged"
    with pytest.raises(mws.InvalidArgumentError, match="16 bytes"):
        mws.NotifyAcceptor(live.plan, target, key=b"short")
    with pytest.raises(mws.InvalidArgumentError, match="not a target participant"):
        mws.NotifyAcceptor(live.plan, "no-such-participant")
    assert mws.notify.notify_name()


class NotifyingEngine(MemmoveEngine):
    """The embedded test engine with a notify channel: every notification is kept
    per endpoint, as a peer's notify poll would hand them over."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox: dict = {}

    def send_notify(self, endpoint, name, message):
        self.inbox.setdefault(endpoint, []).append((name, bytes(message)))
        return 0


def test_push_with_the_notify_hook_tells_each_target_what_landed():
    live = Live()
    backend = NotifyingEngine()
    engine = mws.TransferEngine.from_backend(backend)
    key = b"shared-secret-0123456789"
    for b in live.tb:
        engine.register_binding(b)
    with mws.Sink(engine) as sink:
        for b in live.sb:
            sink.execute_notified(live.plan, live.src.placement, b, live.dst.placement, live.tb, key=key)
    for b in live.tb:
        engine.unregister_binding(b)
        assert live.bad(b.participant_id) == []
    every = [(e, n, m) for e, msgs in backend.inbox.items() for n, m in msgs]
    assert every and {n for _, n, _ in every} == {mws.notify.notify_name()}
    for b in live.tb:
        with mws.NotifyAcceptor(live.plan, b.participant_id, key=key) as acc:
            verdicts = [acc.accept(m)[0] for _, _, m in every]
            # This participant's messages are accepted, every other one misrouted.
            assert "accepted" in verdicts and set(verdicts) <= {"accepted", "misrouted"}
            assert acc.outcome() == mws.NotifyOutcome("updated", 1, 0)
            accepted = [m for (_, _, m), v in zip(every, verdicts) if v == "accepted"]
            assert acc.accept(accepted[0])[0] == "replayed"
            forged = bytearray(accepted[-1])
            forged[-2] ^= 1
            assert acc.accept(bytes(forged))[0] in ("forged", "malformed")
            assert acc.outcome().verdict == "updated"
    # Without a notify channel the call is refused before anything moves.
    plain = mws.TransferEngine.from_backend(MemmoveEngine())
    with mws.Sink(plain) as sink:
        with pytest.raises(mws.UnsupportedError, match="send_notify") as e:
            sink.execute_notified(live.plan, live.src.placement, live.sb[0], live.dst.placement, live.tb, key=key)
        assert not e.value.report.submitted and set(e.value.report.verdicts().values()) <= {"unchanged"}
