"""Issue 29: the defects a new user hit in their first hour, each pinned by a test
that failed on the code before the fix, and the Python side of what such users
expect (sharded Hugging Face checkpoints, one error hierarchy)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.testing import Model, ModelSpec

safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402


# -- defect 1: numpy string arrays were reinterpreted as integers -----------------------


@pytest.mark.parametrize("array, kind", [
    (np.array(["ab", "cd"]), "unicode strings"),
    (np.array(["a", "b"]), "unicode strings"),
    (np.array(["abc"]), "unicode strings"),
    (np.array([b"ab"]), "byte strings"),
    (np.array([1, "x"], dtype=object), "Python objects"),
])
def test_arrays_whose_bytes_no_dtype_names_are_refused(array, kind):
    with pytest.raises(mws.UnsupportedDTypeError, match=kind) as ei:
        mws.tensor_view(array)
    assert ei.value.status == mws.Status.UNSUPPORTED
    assert repr(array.dtype.str) in str(ei.value), "the error names the dtype"


def test_unicode_state_dict_is_refused_not_saved_as_integers():
    with pytest.raises(mws.UnsupportedDTypeError):
        mws.save_state_dict(mws.Store.memory(), {"names": np.array(["a", "b"])}, resource_id="r", revision="v",
                            generation=1)
    # uint16 itself still works, as does a V2 dtype named by the object (bfloat16).
    assert mws.tensor_view(np.arange(3, dtype=np.uint16)).dtype == "uint16"


# -- defect 2: negative integers wrapped into huge unsigned ones ------------------------


def test_out_of_range_integers_are_refused_at_every_entry_point():
    store = mws.Store.memory()
    sd = {"w": np.zeros(4, dtype=np.float32)}
    with pytest.raises(mws.InvalidArgumentError, match="got -1"):
        mws.save_state_dict(store, sd, resource_id="r", revision="v", generation=-1)
    with pytest.raises(mws.InvalidArgumentError, match=r"got 18446744073709551616"):
        mws.save_state_dict(store, sd, resource_id="r", revision="v", generation=1 << 64)
    with pytest.raises(mws.InvalidArgumentError, match="tp_size"):
        mws.PlacementBuilder("r", "v", 1, tp_size=-2)
    p = Model(ModelSpec(layers=1), "tp", tp=1).placement
    with pytest.raises(mws.InvalidArgumentError, match="generation"):
        mws.Binding(p, p.fragments()[0].participant_id, generation=-5)
    # Every C function checks its integer arguments, not only the struct fields.
    with pytest.raises(mws.InvalidArgumentError, match="argument 2 must be an integer"):
        mws._lib.LIB.fn("mws_placement_fragment")(p.handle, -1, None)
    assert not mws.Store.memory().exists("anything")


# -- defect 3: Python adopted any non-empty directory as a store ------------------------


def test_a_directory_with_foreign_entries_is_refused_everywhere(tmp_path):
    foreign = tmp_path / "disk"
    (foreign / "lost+found").mkdir(parents=True)
    with pytest.raises(mws.InvalidArgumentError, match=r"lost\+found") as ei:
        mws.Store.directory(foreign)
    assert "nothing was changed" in str(ei.value)
    assert sorted(p.name for p in foreign.iterdir()) == ["lost+found"], "nothing was added"
    # An empty directory becomes a store the CLI recognises (marker, objects/, tmp/).
    empty = tmp_path / "empty"
    empty.mkdir()
    mws.Store.directory(empty).close()
    assert sorted(p.name for p in empty.iterdir()) == ["MOONCAKE_WEIGHT_STORE", "objects", "tmp"]
    mws.Store.directory(empty).close()  # and is opened again


# -- defect 4: the safetensors round trip was not faithful ------------------------------


def _header(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:], 8 + n


def _checkpoint():
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    return {
        "scalar": np.array(3.5, dtype=np.float32),
        "step": np.array(7, dtype=np.int64),
        "embed": rng.standard_normal((5, 3)).astype(np.float16),
        "norm": rng.standard_normal(3).astype(ml.bfloat16),
        "ids": np.arange(7, dtype=np.uint8),
        "w": rng.standard_normal((2, 3)).astype(np.float32),
        "h": np.arange(5, dtype=np.float64),
    }


def test_safetensors_round_trip_is_what_the_safetensors_package_writes(tmp_path):
    tensors = _checkpoint()
    src = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(tensors, str(src), metadata={"format": "pt", "source": "test"})
    store = mws.Store.memory()
    m = mws.import_safetensors(store, src, resource_id="r", revision="v", generation=1)
    out = tmp_path / "out.safetensors"
    mws.export_safetensors(store, m, out)
    # Shapes (0-d included), dtypes and bytes, read by the safetensors package.
    back = safetensors_numpy.load_file(str(out))
    assert sorted(back) == sorted(tensors)
    for n, a in tensors.items():
        assert back[n].shape == a.shape and back[n].dtype == a.dtype and back[n].tobytes() == a.tobytes(), n
    with safe_open(str(out), "np") as f:
        assert f.metadata() == {"format": "pt", "source": "test"}
    # Header order, offsets and data bytes equal the package's own file; every tensor
    # at a multiple of its item size.
    h_src, data_src, _ = _header(src)
    h_out, data_out, start = _header(out)
    assert list(h_out) == list(h_src) and h_out == h_src
    assert data_out == data_src
    assert start % 8 == 0
    for n, e in h_out.items():
        if n != "__metadata__":
            assert e["data_offsets"][0] % tensors[n].dtype.itemsize == 0, n
    # A restore of the 0-d tensor keeps its shape.
    got = mws.load_state_dict(store, m, names=["scalar"])
    assert got["scalar"].shape == () and got["scalar"] == 3.5


def test_sharded_hugging_face_checkpoint_import_and_export(tmp_path):
    tensors = _checkpoint()
    names = sorted(tensors)
    ck = tmp_path / "ck"
    ck.mkdir()
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {n: files[i % 2] for i, n in enumerate(names)}
    for f in files:
        safetensors_numpy.save_file({n: tensors[n] for n in names if weight_map[n] == f}, str(ck / f),
                                    metadata={"format": "pt"})
    (ck / mws.INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    store = mws.Store.memory()
    m = mws.import_safetensors(store, ck, resource_id="r", revision="v", generation=1)
    assert sorted(mws.load_state_dict(store, m)) == names, "the kept metadata is not a weight"
    out = tmp_path / "out"
    out.mkdir()
    mws.export_safetensors(store, m, out, max_shard_bytes=64)
    index = json.loads((out / mws.INDEX_NAME).read_text())
    assert sorted(index["weight_map"]) == names
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all(f"-of-{len(shards):05d}.safetensors" in s for s in shards)
    for shard in shards:
        got = safetensors_numpy.load_file(str(out / shard))
        assert sorted(got) == sorted(n for n, s in index["weight_map"].items() if s == shard)
        for n, a in got.items():
            assert a.shape == tensors[n].shape and a.tobytes() == tensors[n].tobytes(), n
        with safe_open(str(out / shard), "np") as f:
            assert f.metadata() == {"format": "pt"}
    # An index naming a tensor in the wrong file is refused.
    weight_map[names[0]] = files[1] if weight_map[names[0]] == files[0] else files[0]
    (ck / mws.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(mws.SafetensorsError, match="the index names"):
        mws.import_safetensors(store, ck, resource_id="r", revision="v2", generation=1)


# -- defect 6: re-saving a revision ----------------------------------------------------


def test_resaving_an_identical_revision_is_a_no_op_and_other_content_a_precise_conflict(tmp_path):
    store = mws.Store.directory(tmp_path / "store")
    sd = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    first = mws.save_state_dict(store, sd, resource_id="m", revision="r1", generation=1)
    again = mws.save_state_dict(store, sd, resource_id="m", revision="r1", generation=1)
    assert again.key == first.key and again.digest == first.digest, "the stored revision, unchanged"
    with pytest.raises(mws.StateDictError) as ei:
        mws.save_state_dict(store, {"w": np.ones((3, 4), dtype=np.float32)}, resource_id="m", revision="r1",
                            generation=1)
    e = ei.value
    assert isinstance(e, mws.MwsError) and e.status == mws.Status.CONFLICT
    assert "the stored revision has different content (the bytes of w differ)" in str(e)
    assert "finalize" not in str(e), "a lost race is final: no hint to retry"
    assert isinstance(e.__cause__, mws.ConflictError)
    assert mws.load_state_dict(store, first)["w"].tobytes() == sd["w"].tobytes()


def test_every_error_class_is_an_mws_error_exported_by_name():
    errors = [getattr(mws, n) for n in mws.__all__ if n.endswith("Error") or n == "ExchangeTimeout"]
    assert len(errors) >= 25
    for cls in errors:
        assert issubclass(cls, mws.MwsError), cls
    for cls in (mws.StateDictError, mws.SafetensorsError, mws.TensorError, mws.ExchangeTimeout,
                mws.DeviceUnavailableError, mws.ArgumentError):
        e = cls("boom")
        assert str(e) == "boom" and isinstance(e.status, int) and e.status_name.startswith("MWS_")
    # Python-side argument errors keep their builtin base classes.
    with pytest.raises(TypeError):
        mws._lib.cstr(3)
    with pytest.raises(ValueError):
        mws._lib.cstr("a\0b")
