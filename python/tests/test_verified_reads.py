"""Verified reads by default (issue 29): ``Store.memory()``, ``Store.directory()`` and
``Store.from_backend()`` verify restores against the integrity record without being
asked; a default ``load_state_dict`` / ``Store.restore`` of a corrupted payload fails
with :class:`IntegrityError` naming the tensor and its stored box;
``verify_integrity=False`` opts out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mooncake_weight_store import IntegrityError, Parallel, Store, load_state_dict, save_state_dict
from mooncake_weight_store.errors import ArgumentError
from mooncake_weight_store.store import DictBackend
from mooncake_weight_store.testing import Model, ModelSpec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sd_model import SHARDING, reference  # noqa: E402

TENSOR = "model.layers.0.mlp.gate_up_proj.weight"


def _open(kind, tmp_path, **kw):
    if kind == "memory":
        return Store.memory(**kw)
    if kind == "directory":
        return Store.directory(tmp_path / "store", **kw)
    return Store.from_backend(DictBackend(), **kw)


def _corrupt(store, manifest, tensor):
    """Flips one byte of the first stored fragment of ``tensor``; returns it."""
    frag = next(f for f in manifest.fragments() if f.tensor_id == tensor)
    data = bytearray(store.get(frag.object_key))
    data[len(data) // 2] ^= 0x01
    store.upsert(frag.object_key, bytes(data))
    return frag


@pytest.mark.parametrize("kind", ["memory", "directory", "backend"])
def test_default_load_state_dict_detects_corruption_and_names_the_tensor(kind, tmp_path):
    full = reference()
    with _open(kind, tmp_path) as store:
        m = save_state_dict(store, full, resource_id="qwen-mini", revision="step-1", weight_generation=1)
        got = load_state_dict(store, m.key)  # clean: verified
        assert got[TENSOR].tobytes() == full[TENSOR].tobytes()
        frag = _corrupt(store, m, TENSOR)
        for par in (None, Parallel(tp_rank=1, tp_size=2)):
            with pytest.raises(IntegrityError) as e:
                load_state_dict(store, m.key, sharding=SHARDING, parallel=par)
            msg = str(e.value)
            assert f"payload of tensor {TENSOR} (box offset [" in msg, msg
            assert f"shape {list(frag.local_shape)}" in msg, msg
            assert frag.fragment_id in msg and frag.object_key in msg, msg
            assert "fails its integrity check" in msg, msg


def test_default_restore_detects_corruption_and_opt_out_restores_it(tmp_path):
    spec = ModelSpec(hidden=16, layers=1, experts=2)
    src = Model(spec)
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    root = tmp_path / "store"
    with Store.directory(root) as store:
        plan = store.plan_upload(src.placement, bindings)
        with store.transaction(plan) as tx:
            for b in bindings:
                tx.upload(src.placement, b)
        manifest = store.load_manifest(plan.manifest_key)
        frag = _corrupt(store, manifest, manifest.fragments()[0].tensor_id)
        tgt = Model(spec, "tp", tp=2, dp=1)
        tbufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
        tb = [tgt.bind(p, tbufs[p]) for p in tgt.participant_ids]
        with pytest.raises(IntegrityError) as e:
            store.restore(plan.manifest_key, tgt.placement, tb)
        assert f"payload of tensor {frag.tensor_id} (box offset" in str(e.value)
        for b in tb:
            b.close()
    with Store.directory(root, verify_integrity=False) as store:
        tb = [tgt.bind(p, tbufs[p]) for p in tgt.participant_ids]
        store.restore(plan.manifest_key, tgt.placement, tb)  # no error: the corruption goes through
        problems = [m for p in tgt.participant_ids for m in tgt.verify(p, tbufs[p])]
        assert problems, "the corrupted bytes were restored"
        for b in tb:
            b.close()
    for b in bindings:
        b.close()


def test_verify_integrity_must_be_a_bool():
    with pytest.raises(ArgumentError):
        Store.memory(verify_integrity=1)  # type: ignore[arg-type]
