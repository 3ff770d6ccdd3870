"""Prepared live transfers through the ctypes binding, on the embedded engine and on
Python engines behind ``TransferEngine.from_backend`` (legacy batches and tickets):
prepare once, then each step moves a new weight generation (new source bytes, every
byte verified) in sink and reader mode; and each refusal of stale prepared state
(another placement, a new instance, another lease, moved buffers, freed buffers, a
rotation under another instance, an engine restart, registrations held by a pending
transfer) happens before any byte moves and says "prepare the transfer again"."""

from __future__ import annotations

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.engine_bridge import MemmoveEngine, TicketedMemmoveEngine
from mooncake_weight_store.errors import Status
from mooncake_weight_store.testing import Model, ModelSpec

KINDS = ["local", "bridge-sync", "bridge-tickets"]


def _engine(kind: str):
    if kind == "local":
        return mws.TransferEngine.local(), None
    backend = MemmoveEngine() if kind == "bridge-sync" else TicketedMemmoveEngine()
    return mws.TransferEngine.from_backend(backend), backend


class Live:
    """A TP4 x DP2 trainer and a TP2 x EP2 server in this process, plan bound."""

    def __init__(self) -> None:
        spec = ModelSpec(layers=2)
        self.src = Model(spec, "tp", tp=4, dp=2, placement_set_id="trainer")
        self.dst = Model(spec, "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
        self.sbufs = {p: self.src.source_buffers(p) for p in self.src.participant_ids}
        self.dbufs = {p: self.dst.target_buffers(p) for p in self.dst.participant_ids}
        self.sb = [self.src.bind(p, self.sbufs[p], instance_id=f"trainer-{p}") for p in self.src.participant_ids]
        self.tb = [self.dst.bind(p, self.dbufs[p], instance_id=f"serving-{p}") for p in self.dst.participant_ids]
        self.plan = mws.TransferPlan.plan(self.src.placement, self.dst.placement).bind(self.tb, self.sb)

    def flip_sources(self) -> None:
        """A new generation in the same buffers: every source byte flipped."""
        for bufs in self.sbufs.values():
            for buf in bufs.values():
                buf[:] = bytes(x ^ 0xFF for x in buf)

    def reset_targets(self) -> None:
        for bufs in self.dbufs.values():
            for buf in bufs.values():
                buf[:] = b"\xa5" * len(buf)

    def untouched(self, participants=None) -> bool:
        ps = participants or self.dst.participant_ids
        return all(set(bytes(buf)) <= {0xA5} for p in ps for buf in self.dbufs[p].values())

    def bad(self, flipped: bool, participants=None) -> list:
        out = []
        for p in participants or self.dst.participant_ids:
            for f in self.dst.placement.participant_fragments(p):
                want = bytes(self.dst.expected(f))
                if flipped:
                    want = bytes(x ^ 0xFF for x in want)
                if bytes(self.dbufs[p][f.placement_fragment_id]) != want:
                    out.append(f.placement_fragment_id)
        return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["sink", "reader"])
def test_prepared_once_every_generation_moves(kind, mode):
    live = Live()
    engine, backend = _engine(kind)
    owners = live.tb if mode == "sink" else live.sb
    for b in owners:
        engine.register_binding(b)  # the remote side's owner registers it
    if mode == "sink":
        front = mws.Sink(engine)
        prepared = [front.prepare(live.plan, live.src.placement, b, live.dst.placement, live.tb) for b in live.sb]
    else:
        front = mws.Loader(engine)
        prepared = [front.prepare_live(live.plan, live.src.placement, live.sb, live.dst.placement, b)
                    for b in live.tb]
    live.reset_targets()
    assert live.untouched(), "preparing moves no byte"
    assert sum(p.info.bytes for p in prepared) == live.plan.total_bytes
    for gen in (2, 3, 4):
        live.reset_targets()
        moved = 0
        for p in prepared:
            moved += p.step(gen).bytes
            report = p.last_report()
            assert all(v == "updated" for v in report.verdicts().values())
            assert all(t.weight_generation == gen for t in report.targets)
        assert moved == live.plan.total_bytes
        assert live.bad(flipped=(gen == 3)) == []
        live.flip_sources()
    for p in prepared:
        p.close()
    with pytest.raises(ValueError, match="prepared transfer is closed"):
        prepared[0].step(5)
    for b in owners:
        engine.unregister_binding(b)
    res = engine.resources()
    assert res.pending_transfers == 0
    if res.registered_regions is not None:
        assert res.registered_regions == 0, "closing unregistered what the preparations registered"
    front.close()
    assert engine.callback_errors == []


class ObservingGuard(mws.Guard):
    """Reports, for the bindings of one instance, what a test makes it observe: a
    binding (compared by the library) or freed buffers (StaleBindingError)."""

    def __init__(self) -> None:
        self.observe = {}  # instance id -> callable returning a Binding or raising
        self.acquires = 0
        self.states = []

    def acquire(self, transfer_id, participant_id, fragment_ids):
        self.acquires += 1
        seen = self.observe.get(fragment_ids[0].split(":")[0])
        return self.acquires if seen is None else (self.acquires, seen())

    def release(self, token, state):
        self.states.append(state)


def observed(b: mws.Binding, placement=None, instance=None, lease=None, generation=None, shift=0) -> mws.Binding:
    """`b` as a guard may observe it: another placement, instance, lease or generation,
    or its buffers moved by `shift` bytes (same runtime fragment ids)."""
    placement = placement or b.placement
    o = mws.Binding(placement, b.participant_id, instance_id=instance or b.instance_id,
                    lease_id=lease or b.lease_id, lease_generation=b.lease_generation if generation is None else generation,
                    endpoint=b.endpoint)
    sizes = {f.placement_fragment_id: f.nbytes for f in b.placement.participant_fragments(b.participant_id)}
    for pfid, addr in b.addresses.items():
        o.add_address(pfid, addr + shift, sizes[pfid], fragment_id=b.fragment_ids[pfid])
    return o


def _freed():
    raise mws.StaleBindingError(int(Status.STALE_BINDING), "the buffers were freed")


@pytest.mark.parametrize("kind", KINDS)
def test_every_staleness_is_refused_before_a_byte_moves(kind):
    live = Live()
    engine, backend = _engine(kind)
    for b in live.sb:
        engine.register_binding(b)
    guard = ObservingGuard()
    local = live.tb[0]
    p = mws.Loader(engine).prepare_live(live.plan, live.src.placement, live.sb, live.dst.placement, local,
                                        guard=guard)
    pinned = p.info.pinned_bindings
    before = guard.acquires
    p.step(2)
    assert guard.acquires - before == pinned, "one pin per binding per step"
    assert live.bad(False, [local.participant_id]) == []
    other = Model(live.dst.spec, "ep", tp=2, dp=1, ep=2, placement_set_id="serving-b")
    cases = {
        "another placement": (lambda: observed(local, placement=other.placement), "placement_id differs"),
        "a new instance": (lambda: observed(local, instance="serving-restarted"), "instance_id differs"),
        "another lease": (lambda: observed(local, lease="lease-2", generation=2), "generation differs"),
        "moved buffers": (lambda: observed(local, shift=4096), "address differs"),
        "freed buffers": (_freed, "freed or moved"),
    }
    for what, (seen, text) in cases.items():
        guard.observe = {local.instance_id: seen}
        live.reset_targets()
        n = len(guard.states)
        with pytest.raises(mws.StaleBindingError) as e:
            p.step(3)
        assert text in str(e.value) and "prepare the transfer again" in str(e.value), (what, str(e.value))
        assert live.untouched(), what
        assert not e.value.report.submitted and e.value.report.guard_release in ("aborted", "not_pinned"), what
        assert e.value.report.verdicts() == {local.participant_id: "unchanged"}, what
        assert all(s == mws.TerminalState.ABORTED for s in guard.states[n:]), what
    guard.observe = {}
    # A rotation under another instance of a prepared participant; one naming nothing.
    live.reset_targets()
    with pytest.raises(mws.StaleBindingError, match="now runs as instance"):
        p.step(3, leases=[mws.LeaseRotation("serving-x", local.participant_id, "lease-3", 3)])
    with pytest.raises(mws.MwsError, match="names no binding"):
        p.step(3, leases=[mws.LeaseRotation("nowhere", "nobody", "lease-3", 3)])
    assert live.untouched()
    # A rotation the guard observes is taken, and holds for later steps.
    guard.observe = {local.instance_id: lambda: observed(local, lease="lease-9", generation=9)}
    p.step(4, leases=[mws.LeaseRotation(local.instance_id, local.participant_id, "lease-9", 9)])
    p.step(5)
    assert live.bad(False, [local.participant_id]) == []
    if backend is not None:
        # An engine restart behind the same handle: a new identity.
        backend.id += 1
        live.reset_targets()
        with pytest.raises(mws.StaleBindingError, match="restarted since the transfer was prepared"):
            p.step(6)
        assert live.untouched()
        backend.id -= 1
        p.step(6)
    p.close()
    engine.resources()


def test_registrations_held_by_a_pending_transfer_are_refused():
    live = Live()
    backend = MemmoveEngine()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.sb:
        engine.register_binding(b)
    p = mws.Loader(engine).prepare_live(live.plan, live.src.placement, live.sb, live.dst.placement, live.tb[0])
    original = backend.transfer_sync
    backend.transfer_sync = lambda *a: -1  # a legacy batch that fails: completion unknown
    with pytest.raises(mws.MwsError, match="completion is unknown") as e:
        p.step(2)
    assert e.value.report.guard_release == "pending" and e.value.report.pending_transfer_id
    backend.transfer_sync = original
    live.reset_targets()
    with pytest.raises(mws.StaleBindingError, match="held by pending transfer"):
        p.step(3)
    assert live.untouched()
    assert engine.pending_count == 1


def test_stored_source_restores_every_generation_prepared_once():
    """A server prepared once restores, step after step, the weight generation a
    trainer committed (same layout, new bytes), given only that generation."""
    store = mws.Store.memory()

    def spec(gen: int, layers: int = 2) -> ModelSpec:
        return ModelSpec(layers=layers, generation=gen, seed=f"gen-{gen}")

    def commit(gen: int, layers: int = 2):
        src = Model(spec(gen, layers), "tp", tp=2, dp=1, placement_set_id="trainer")
        bufs = {p: src.source_buffers(p) for p in src.participant_ids}
        bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
        with store.begin_snapshot(src.placement, bindings) as w:
            w.write_all()
        return w.manifest

    first = commit(1)
    dst = Model(spec(1), "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
    dbufs = {p: dst.target_buffers(p) for p in dst.participant_ids}
    tb = [dst.bind(p, dbufs[p]) for p in dst.participant_ids]
    local = tb[0]
    plan = mws.LoadPlan.new(first, dst.placement, tb)
    guard = ObservingGuard()
    loader = mws.Loader(mws.TransferEngine.local())
    p = loader.prepare_stored(store, plan, local, guard=guard)
    assert p.info.bytes > 0 and p.info.batches == 0

    def bad(gen: int) -> list:
        m = Model(spec(gen), "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
        return [f.placement_fragment_id for f in m.placement.participant_fragments(local.participant_id)
                if bytes(dbufs[local.participant_id][f.placement_fragment_id]) != bytes(m.expected(f))]

    def untouched() -> bool:
        return all(set(bytes(b)) <= {0xA5} for b in dbufs[local.participant_id].values())

    def reset() -> None:
        for b in dbufs[local.participant_id].values():
            b[:] = b"\xa5" * len(b)

    assert p.step(1).bytes == p.info.bytes and bad(1) == []
    for gen in (2, 3):
        commit(gen)
        reset()
        assert p.step(gen).bytes == p.info.bytes
        assert bad(gen) == [], gen
    reset()
    with pytest.raises(mws.NotFoundError):
        p.step(9)  # never committed
    commit(4, layers=3)  # another layout under the same resource and revision
    with pytest.raises(mws.StaleBindingError, match="holds another layout.*prepare the transfer again"):
        p.step(4)
    guard.observe = {local.instance_id: _freed}
    with pytest.raises(mws.StaleBindingError, match="freed or moved.*prepare the transfer again"):
        p.step(3)
    assert untouched()
    guard.observe = {}
    p.step(3)
    assert bad(3) == []
    with pytest.raises(mws.MwsError, match="no lease rotation"):
        p.step(3, leases=[mws.LeaseRotation(local.instance_id, local.participant_id, "l", 1)])
    p.close()
