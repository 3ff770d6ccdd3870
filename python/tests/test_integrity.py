"""End-to-end integrity from Python (issue 12, item 4): a flipped byte in a payload
of a directory store fails a verifying restore with the fragment id."""

from __future__ import annotations

import os

import pytest

from mooncake_weight_store import ArgumentError, IntegrityError, Store
from mooncake_weight_store.testing import Model, ModelSpec

SPEC = ModelSpec(hidden=16, layers=1, experts=2)


def _path(root, key):
    segs = key.split("/")
    return os.path.join(root, "objects", *["d." + s for s in segs[:-1]], "f." + segs[-1])


def _restore(store, key):
    tgt = Model(SPEC, "tp", tp=2, dp=1)
    bufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
    bindings = [tgt.bind(p, bufs[p]) for p in tgt.participant_ids]
    try:
        return store.restore(key, tgt.placement, bindings)
    finally:
        for b in bindings:
            b.close()


def test_acc_124_flipped_byte_fails_verifying_restore_with_fragment_id(tmp_path):
    root = str(tmp_path / "store")
    src = Model(SPEC)
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    with Store.directory(root, verify_integrity=True) as store:
        plan = store.plan_upload(src.placement, bindings)
        with store.transaction(plan) as tx:
            for b in bindings:
                tx.upload(src.placement, b)
        manifest = store.load_manifest(plan.manifest_key)
        _restore(store, plan.manifest_key)  # clean: verified and fine
        frag = manifest.fragment(0)
        path = _path(root, frag.object_key)
        with open(path, "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([b[0] ^ 0x01]))
        with pytest.raises(IntegrityError) as e:
            _restore(store, plan.manifest_key)
        assert frag.fragment_id in str(e.value)
    for b in bindings:
        b.close()


def test_snapshot_without_integrity_record_restores_unverified(tmp_path):
    """``write_integrity=False``: no checksums and no integrity record (what the
    reference writes); a verifying store restores the revision unverified, so a
    flipped byte goes through; the option must be a bool."""
    root = str(tmp_path / "store")
    src = Model(SPEC)
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    with Store.directory(root, write_integrity=False) as writer:
        plan = writer.plan_upload(src.placement, bindings)
        with writer.transaction(plan) as tx:
            for b in bindings:
                tx.upload(src.placement, b)
        record = f"{plan.group_id}/integrity/{plan.transaction_id}"
        assert not writer.exists(record)
    for b in bindings:
        b.close()
    with Store.directory(root) as reader:
        _restore(reader, plan.manifest_key)
        frag = reader.load_manifest(plan.manifest_key).fragment(0)
        with open(_path(root, frag.object_key), "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([b[0] ^ 0x01]))
        _restore(reader, plan.manifest_key)  # nothing to verify against
    with pytest.raises(ArgumentError):
        Store.memory(write_integrity=1)  # type: ignore[arg-type]
