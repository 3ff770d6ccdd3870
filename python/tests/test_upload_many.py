"""``Transaction.upload_many`` (``mws_transaction_upload_many``): several local
participants in one call. Same receipts and manifest as one ``upload`` per
participant, one put batch stream, every check before any write, duplicates refused,
leased and unleased bindings mixed."""

from __future__ import annotations

import pytest

from mooncake_weight_store import (
    DictBackend,
    InvalidArgumentError,
    StaleBindingError,
    Store,
)
from mooncake_weight_store.testing import Model, ModelSpec

SPEC = ModelSpec(hidden=16, layers=1, experts=2)


class Puts(DictBackend):
    """Counts batch_put_from calls and the items they carry."""

    def __init__(self):
        super().__init__()
        self.batches = 0
        self.items = 0

    def batch_put_from(self, items, record_type=0):
        self.batches += 1
        self.items += len(items)
        return super().batch_put_from(items, record_type)


@pytest.fixture
def src():
    m = Model(SPEC, "tp", tp=4, dp=1)
    bufs = {p: m.source_buffers(p) for p in m.participant_ids}
    bindings = [m.bind(p, bufs[p]) for p in m.participant_ids]
    yield m, bufs, bindings
    for b in bindings:
        b.close()


def test_upload_many_matches_one_upload_per_participant(src):
    m, _, bindings = src
    assert len(bindings) == 4
    many_be, one_be = Puts(), Puts()
    many, one = Store.from_backend(many_be), Store.from_backend(one_be)
    plan = many.plan_upload(m.placement, bindings)
    with many.transaction(plan) as tx_many:
        tx_many.upload_many(m.placement, bindings)
        with tx_many.receipts() as r_many:
            many_json = r_many.to_json()
    with one.transaction(plan) as tx_one:
        for b in bindings:
            tx_one.upload(m.placement, b)
        with tx_one.receipts() as r_one:
            one_json = r_one.to_json()
    assert many_json == one_json  # same receipts (checksums included), same order
    assert many_be.batches == 1 and one_be.batches == 4
    assert many_be.items == len(plan)
    assert tx_many.manifest == tx_one.manifest
    for k in plan.payload_keys:
        assert many.get(k) == one.get(k)
    assert many.callback_errors == [] and one.callback_errors == []
    many.close()
    one.close()


def test_stale_binding_or_duplicate_fails_before_any_put(src):
    m, bufs, bindings = src
    be = Puts()
    store = Store.from_backend(be)
    plan = store.plan_upload(m.placement, bindings)
    stale = m.bind(m.participant_ids[2], bufs[m.participant_ids[2]], lease_generation=2)
    tx = store.transaction(plan)
    with pytest.raises(StaleBindingError):
        tx.upload_many(m.placement, [bindings[0], bindings[1], stale, bindings[3]])
    assert be.batches == 0 and len(tx.receipts()) == 0
    with pytest.raises(InvalidArgumentError, match="given twice"):
        tx.upload_many(m.placement, [bindings[0], bindings[1], bindings[0]])
    with pytest.raises(ValueError, match="entries"):
        tx.upload_many(m.placement, bindings, leases=[None])
    assert be.batches == 0 and tx.state == "open"
    tx.upload_many(m.placement, [])  # nothing to do
    tx.upload_many(m.placement, bindings)
    assert tx.commit().digest == plan.manifest_digest
    stale.close()
    tx.close()
    store.close()


def test_leased_and_pinned_bindings_mix(src):
    m, _, bindings = src
    store = Store.memory()
    plan = store.plan_upload(m.placement, bindings)
    l1 = store.register_buffers(bindings[1], plan.source_fragment_ids(bindings[1].participant_id))
    l3 = store.register_buffers(bindings[3], plan.source_fragment_ids(bindings[3].participant_id))
    with store.transaction(plan) as tx:
        tx.upload_many(m.placement, bindings, leases=[None, l1, None, l3])
    assert tx.manifest.fragment_count == len(plan)
    # A lease over another binding's fragments is refused.
    plan2 = store.plan_upload(m.placement, bindings)
    tx2 = store.transaction(plan2)
    with pytest.raises(StaleBindingError):
        tx2.upload_many(m.placement, bindings[:2], leases=[l1, None])
    tx2.abort()
    tx2.close()
    for lease in (l1, l3):
        lease.close()
        lease.free()
    store.close()
