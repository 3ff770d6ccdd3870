"""Progress callbacks from Python (issue 12, item 5): uploads, restores, the snapshot
writer and state dicts report throttled, monotonic :class:`Progress` whose totals
match the work; exceptions in a callback never reach the library; the ready-made
:class:`ProgressBar` prints a final line."""

from __future__ import annotations

import io

import numpy as np

import mooncake_weight_store as mws
from mooncake_weight_store import LoadPlan, Progress, ProgressBar, Store
from mooncake_weight_store.state_dict import Parallel, load_state_dict, save_state_dict
from mooncake_weight_store.testing import Model, ModelSpec

SPEC = ModelSpec(hidden=32, layers=2, experts=2)


def _calls(reports):
    """Reports split into calls (each starts with a 0-done report)."""
    calls = []
    for p in reports:
        if p.bytes_done == 0 and (not calls or calls[-1][-1].done or p.bytes_total != calls[-1][0].bytes_total):
            calls.append([])
        if not calls:
            calls.append([])
        calls[-1].append(p)
    return calls


def _check_call(call, phase):
    assert call[0].bytes_done == 0 and call[0].items_done == 0, call[0]
    assert call[-1].done and call[-1].bytes_done == call[-1].bytes_total, call[-1]
    for a, b in zip(call, call[1:]):
        assert a.bytes_done <= b.bytes_done and a.items_done <= b.items_done
        assert a.bytes_total == b.bytes_total and a.items_total == b.items_total
    assert all(p.phase == phase for p in call)


def test_upload_and_restore_report_progress_with_matching_totals():
    store = Store.memory()
    m = Model(SPEC, "tp", tp=4, dp=1)
    bufs = {p: m.source_buffers(p) for p in m.participant_ids}
    bindings = [m.bind(p, bufs[p]) for p in m.participant_ids]
    plan = store.plan_upload(m.placement, bindings)
    up: list = []
    receipts = [store.upload(plan, m.placement, b, progress=up.append) for b in bindings]
    calls = _calls(up)
    assert len(calls) == len(bindings)
    for c in calls:
        _check_call(c, "upload")
    assert sum(c[0].bytes_total for c in calls) == sum(op.nbytes for op in plan.operations())
    assert sum(c[0].items_total for c in calls) == len(plan.operations())
    store.commit(plan, mws.Receipts.concat(receipts))
    key = plan.manifest_key

    dst = Model(SPEC, "tp", tp=2, dp=1)
    tbufs = {p: dst.target_buffers(p) for p in dst.participant_ids}
    tb = [dst.bind(p, tbufs[p]) for p in dst.participant_ids]
    down: list = []
    with store.load_manifest(key) as manifest, LoadPlan.new(manifest, dst.placement, tb) as lp:
        stats = [store.load(lp, b, progress=down.append) for b in tb]
        total = lp.total_bytes
    calls = _calls(down)
    assert len(calls) == len(tb)
    for c, st in zip(calls, stats):
        _check_call(c, "restore")
        assert c[-1].bytes_done == st.bytes and c[-1].items_done == st.regions
    assert sum(c[0].bytes_total for c in calls) == total
    assert [e for p in dst.participant_ids for e in dst.verify(p, tbufs[p])] == []


def test_writer_progress_spans_the_whole_snapshot_and_errors_are_swallowed():
    store = Store.memory()
    m = Model(SPEC, "tp", tp=2, dp=1)
    bufs = {p: m.source_buffers(p) for p in m.participant_ids}
    bindings = [m.bind(p, bufs[p]) for p in m.participant_ids]
    seen: list = []

    def flaky(p: Progress) -> None:
        seen.append(p)
        raise RuntimeError("a buggy callback must not break the snapshot")

    with store.begin_snapshot(m.placement, bindings) as w:
        w.set_progress(flaky)
        for tid in w.tensor_ids():
            w.write_tensor(tid).close()
        total = sum(op.nbytes for op in w.plan.operations())
        ops = len(w.plan.operations())
    assert w.committed
    assert seen and all(p.bytes_total == total and p.items_total == ops for p in seen)
    assert seen[-1].done and all(p.phase == "upload" for p in seen)
    assert all(a.bytes_done <= b.bytes_done for a, b in zip(seen, seen[1:]))


def test_progress_bar_prints_a_final_line():
    out = io.StringIO()
    bar = ProgressBar("restore", stream=out, width=10)
    bar(Progress("restore", 0, 100, 0, 4))
    bar(Progress("restore", 50, 100, 2, 4))
    assert out.getvalue() == ""  # not a terminal: only the final line
    bar(Progress("restore", 100, 100, 4, 4))
    line = out.getvalue()
    assert line.startswith("restore [##########] 100.0%") and line.endswith("4/4\n"), line


def test_state_dicts_take_a_progress_callable():
    store = Store.memory()
    sd = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.arange(8, dtype=np.float32)}
    up: list = []
    manifest = save_state_dict(store, sd, resource_id="sd", revision="r1", weight_generation=1, progress=up.append)
    assert up and up[-1].done and up[-1].bytes_total == sum(a.nbytes for a in sd.values())
    down: list = []
    out = load_state_dict(store, manifest.key, progress=down.append, parallel=Parallel())
    assert down and down[-1].done and down[-1].phase == "restore"
    assert np.array_equal(out["w"], sd["w"]) and np.array_equal(out["b"], sd["b"])
    assert mws.Progress is Progress
