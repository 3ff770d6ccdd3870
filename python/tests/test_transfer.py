"""Live weight transfer through the ctypes binding: plan a reshard between two
in-process instances, bind it, and move the bytes through the embedded engine in both
modes (sources push, targets pull), verifying every byte."""

from __future__ import annotations

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.testing import Model, ModelSpec

SPEC = ModelSpec()


def _models():
    src = Model(SPEC, "tp", tp=4, dp=2, placement_set_id="trainer")
    dst = Model(SPEC, "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
    src_bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    dst_bufs = {p: dst.target_buffers(p) for p in dst.participant_ids}
    sb = [src.bind(p, src_bufs[p], instance_id=f"trainer-{p}") for p in src.participant_ids]
    tb = [dst.bind(p, dst_bufs[p], instance_id=f"serving-{p}") for p in dst.participant_ids]
    return src, dst, dst_bufs, sb, tb


def test_live_transfer_plan_and_json():
    src, dst, _, sb, tb = _models()
    with mws.TransferPlan.plan(src.placement, dst.placement) as logical:
        assert not logical.is_bound and logical.region_count > 0
        with mws.TransferPlan.from_json(logical.to_json()) as again:
            assert again.region_count == logical.region_count
        with logical.bind(tb, sb) as bound:
            assert bound.is_bound and bound.total_bytes == logical.total_bytes
            assert bound.executor_count("target") == len(tb)
            assert "address\"" not in bound.to_json()
        with pytest.raises(mws.MwsError):
            logical.bind(tb, [])


@pytest.mark.parametrize("mode", ["sink", "reader"])
def test_live_reshard_every_byte(mode):
    src, dst, dst_bufs, sb, tb = _models()
    logical = mws.TransferPlan.plan(src.placement, dst.placement)
    plan = logical.bind(tb, sb)
    engine = mws.TransferEngine.local()
    moved = 0
    if mode == "sink":
        for b in tb:
            engine.register_binding(b)
        with mws.Sink(engine) as sink:
            for b in sb:
                moved += sink.execute(plan, src.placement, b, dst.placement, tb).bytes
        for b in tb:
            engine.unregister_binding(b)
    else:
        for b in sb:
            engine.register_binding(b)
        steps = []
        with mws.Loader(engine) as loader:
            loader.set_progress(lambda p: steps.append((p.bytes_done, p.bytes_total, p.phase)))
            for b in tb:
                moved += loader.load_live(plan, src.placement, sb, dst.placement, b).bytes
        for b in sb:
            engine.unregister_binding(b)
        assert steps and all(d <= t and ph == "transfer" for d, t, ph in steps)
        assert steps[-1][0] == steps[-1][1]
    assert moved == plan.total_bytes
    assert [f for p in dst.participant_ids for f in dst.verify(p, dst_bufs[p])] == []
    assert engine.pending_count == 0


def test_cancelled_loader_submits_nothing():
    src, dst, dst_bufs, sb, tb = _models()
    plan = mws.TransferPlan.plan(src.placement, dst.placement).bind(tb, sb)
    engine = mws.TransferEngine.local()
    for b in sb:
        engine.register_binding(b)
    loader = mws.Loader(engine)
    loader.cancel()
    with pytest.raises(mws.MwsError, match="cancelled"):
        loader.load_live(plan, src.placement, sb, dst.placement, tb[0])
    loader.reset_cancel()
    assert loader.load_live(plan, src.placement, sb, dst.placement, tb[0]).bytes > 0
    for b in sb:
        engine.unregister_binding(b)


def _flat(model, base, endpoint):
    """One binding per participant over one arena: each participant's fragments back to
    back in its slice (the slice is their storage allocation). Returns the bindings and
    the fragments' (info, offset)."""
    off, out, where = 0, [], []
    for p in model.participant_ids:
        start = off
        frags = model.placement.participant_fragments(p)
        size = sum(f.nbytes for f in frags)
        b = mws.Binding(model.placement, p, endpoint=endpoint, instance_id=f"{endpoint}-{p}")
        for f in frags:
            b.add_address(f.placement_fragment_id, base + off, f.nbytes, storage_address=base + start,
                          storage_nbytes=size, storage_offset_bytes=off - start)
            where.append((f, off))
            off += f.nbytes
        out.append(b)
    return out, where


@pytest.mark.parametrize("mode", ["sink", "reader"])
def test_coalescing_merges_adjacent_segments_and_moves_the_same_bytes(mode):
    import ctypes

    src = Model(SPEC, "tp", tp=2, dp=1, placement_set_id="a")
    dst = Model(SPEC, "tp", tp=2, dp=1, placement_set_id="b")
    size = sum(f.nbytes for p in src.participant_ids for f in src.placement.participant_fragments(p))
    sarena = (ctypes.c_char * size)()
    results = {}
    for coalesce in (True, False):
        darena = (ctypes.c_char * size)()
        sb, swhere = _flat(src, ctypes.addressof(sarena), "trainer")
        for f, off in swhere:
            data = bytes(src.expected(f))
            ctypes.memmove(ctypes.addressof(sarena) + off, data, len(data))
        tb, twhere = _flat(dst, ctypes.addressof(darena), "server")
        plan = mws.TransferPlan.plan(src.placement, dst.placement).bind(tb, sb)
        engine = mws.TransferEngine.local()
        ops = engine_ops = 0
        if mode == "sink":
            engine.register_memory(ctypes.addressof(darena), size)
            with mws.Sink(engine, coalesce=coalesce) as sink:
                for b in sb:
                    st = sink.execute(plan, src.placement, b, dst.placement, tb)
                    ops, engine_ops = ops + st.operations, engine_ops + st.engine_operations
            engine.unregister_memory(ctypes.addressof(darena))
        else:
            engine.register_memory(ctypes.addressof(sarena), size)
            with mws.Loader(engine, coalesce=coalesce) as loader:
                for b in tb:
                    st = loader.load_live(plan, src.placement, sb, dst.placement, b)
                    ops, engine_ops = ops + st.operations, engine_ops + st.engine_operations
            engine.unregister_memory(ctypes.addressof(sarena))
        got = bytes(darena)
        bad = [f.placement_fragment_id for f, off in twhere if got[off:off + f.nbytes] != bytes(dst.expected(f))]
        assert bad == [], (coalesce, bad)
        results[coalesce] = (got, ops, engine_ops)
    (merged, ops, engine_ops), (plain, ops_plain, engine_ops_plain) = results[True], results[False]
    assert merged == plain
    assert ops == ops_plain == engine_ops_plain  # receipts count planned segments either way
    assert 0 < engine_ops < ops  # fragments lie back to back on both sides
