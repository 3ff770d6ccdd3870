"""The library's log records reach Python (issue 12, item 5): plan sizes and commits
are logged through ``mws_set_log_callback``; removing the callback stops them."""

from __future__ import annotations

import logging

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store import Store
from mooncake_weight_store.logs import INFO, OFF
from mooncake_weight_store.testing import Model, ModelSpec


def _snapshot(store):
    m = Model(ModelSpec(hidden=16, layers=1, experts=2))
    bufs = {p: m.source_buffers(p) for p in m.participant_ids}
    bindings = [m.bind(p, bufs[p]) for p in m.participant_ids]
    plan = store.plan_upload(m.placement, bindings)
    with store.transaction(plan) as tx:
        for b in bindings:
            tx.upload(m.placement, b)
    for b in bindings:
        b.close()
    return plan


def test_acc_125_log_callback_receives_plan_and_commit_records():
    records = []
    mws.set_log_callback(lambda lvl, target, msg: records.append((lvl, target, msg)), INFO)
    try:
        store = Store.memory()
        plan = _snapshot(store)
        store.close()
    finally:
        mws.set_log_callback(None)
    msgs = [m for _, _, m in records]
    assert any(m.startswith("upload plan for " + plan.manifest_key) and "operations" in m for m in msgs), msgs
    assert any("commit of " + plan.manifest_key in m for m in msgs), msgs
    assert all(lvl <= INFO for lvl, _, _ in records)
    assert all(t.startswith("mooncake_weight_store") for _, t, _ in records)
    # Removed: nothing more arrives.
    n = len(records)
    store = Store.memory()
    _snapshot(store)
    store.close()
    assert len(records) == n


def test_acc_125_default_routes_to_python_logging(caplog):
    with caplog.at_level(logging.INFO, logger="mooncake_weight_store.native"):
        mws.set_log_callback(level=INFO)
        try:
            store = Store.memory()
            _snapshot(store)
            store.close()
        finally:
            mws.set_log_callback(None, OFF)
    assert any("upload plan for" in r.getMessage() for r in caplog.records)


def test_acc_125_bad_level_is_rejected():
    with pytest.raises(ValueError):
        mws.set_log_callback(level=9)
