"""The planner's source replica routing from Python (issue 30): the reference's
routing reads a one-replica target entirely from source replica 0; ``source_routing=
"spread_targets"`` spreads the target participants over both complete replicas of a
TP4 x DP2 source, every target byte still lands (in-process engine), and the routing
travels in the plan's JSON."""

from __future__ import annotations

import json

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.engine_bridge import MemmoveEngine
from mooncake_weight_store.testing import Model, ModelSpec

SPEC = ModelSpec(layers=2)


def _models():
    src = Model(SPEC, "tp", tp=4, dp=2, placement_set_id="trainer")
    dst = Model(SPEC, "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
    return src, dst


def _source_replicas(plan: mws.TransferPlan) -> dict:
    """target participant -> the source DP ranks it reads."""
    out: dict = {}
    for r in json.loads(plan.to_json())["regions"]:
        out.setdefault(r["target"]["participant_id"], set()).add(r["source"]["rank"]["dp"])
    return out


def test_reference_routing_reads_one_replica_spreading_reads_both():
    src, dst = _models()
    ref = mws.TransferPlan.plan(src.placement, dst.placement)
    assert ref.source_routing == "target_dp"
    assert set().union(*_source_replicas(ref).values()) == {0}
    spread = mws.TransferPlan.plan(src.placement, dst.placement, source_routing="spread_targets")
    assert spread.source_routing == "spread_targets"
    assert spread.total_bytes == ref.total_bytes
    reads = _source_replicas(spread)
    assert all(len(v) == 1 for v in reads.values()), reads
    assert sorted(next(iter(v)) for v in reads.values()) == [0, 0, 1, 1], reads
    # The routing travels with the plan's JSON (re-planned on arrival).
    again = mws.TransferPlan.from_json(spread.to_json())
    assert again.source_routing == "spread_targets"
    assert again.to_json() == spread.to_json()
    assert "source_routing" not in json.loads(ref.to_json())
    # Reader mode for one target participant routes as the whole plan does.
    pid = dst.participant_ids[1]
    local = mws.TransferPlan.plan(src.placement, dst.placement, pid, source_routing="spread_targets")
    assert _source_replicas(local) == {pid: reads[pid]}
    with pytest.raises(ValueError):
        mws.TransferPlan.plan(src.placement, dst.placement, source_routing="round_robin")


def test_a_spread_plan_moves_every_byte():
    src, dst = _models()
    sbufs = {p: src.source_buffers(p) for p in src.participant_ids}
    dbufs = {p: dst.target_buffers(p) for p in dst.participant_ids}
    sb = [src.bind(p, sbufs[p]) for p in src.participant_ids]
    tb = [dst.bind(p, dbufs[p]) for p in dst.participant_ids]
    logical = mws.TransferPlan.plan(src.placement, dst.placement, source_routing="spread_targets")
    plan = logical.bind(tb, sb)
    assert plan.source_routing == "spread_targets"
    engine = mws.TransferEngine.from_backend(MemmoveEngine())
    for b in tb:
        engine.register_binding(b)
    senders = set()
    with mws.Sink(engine) as sink:
        for b in sb:
            st = sink.execute(plan, src.placement, b, dst.placement, tb)
            if st.bytes:
                senders.add(b.participant_id.split("-")[1])  # "d0" / "d1"
    for b in tb:
        engine.unregister_binding(b)
    assert senders == {"d0", "d1"}
    for p in dst.participant_ids:
        assert dst.verify(p, dbufs[p]) == [], p
