"""``Store.from_backend(..., verify_integrity=True)`` (issue 30: the cluster test
restores from Mooncake Store with integrity on): a payload changed behind the
library's back fails a verifying restore through a Python backend, as it does for
the embedded stores (test_integrity.py)."""

from __future__ import annotations

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.store import DictBackend
from mooncake_weight_store.testing import Model, ModelSpec


def test_from_backend_verifies_integrity_when_asked():
    src = Model(ModelSpec(hidden=16, layers=1, experts=2))
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    backend = DictBackend()
    with mws.Store.from_backend(backend, verify_integrity=True) as store:
        plan = store.plan_upload(src.placement, bindings)
        with store.transaction(plan) as tx:
            for b in bindings:
                tx.upload(src.placement, b)
        tgt = Model(ModelSpec(hidden=16, layers=1, experts=2), "tp", tp=2, dp=1)
        tbufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
        tb = [tgt.bind(p, tbufs[p]) for p in tgt.participant_ids]
        store.restore(plan.manifest_key, tgt.placement, tb)  # clean: verified
        key = plan.payload_keys[0]
        data = bytearray(backend.get(key))
        data[0] ^= 0x01
        assert backend.upsert(key, bytes(data)) == 0
        with pytest.raises(mws.IntegrityError):
            store.restore(plan.manifest_key, tgt.placement, tb)
        for b in tb:
            b.close()
    for b in bindings:
        b.close()
