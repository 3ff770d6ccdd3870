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
                            weight_generation=1)
    # uint16 itself still works, as does a V2 dtype named by the object (bfloat16).
    assert mws.tensor_view(np.arange(3, dtype=np.uint16)).dtype == "uint16"


# -- defect 2: negative integers wrapped into huge unsigned ones ------------------------


def test_out_of_range_integers_are_refused_at_every_entry_point():
    store = mws.Store.memory()
    sd = {"w": np.zeros(4, dtype=np.float32)}
    with pytest.raises(mws.InvalidArgumentError, match="got -1"):
        mws.save_state_dict(store, sd, resource_id="r", revision="v", weight_generation=-1)
    with pytest.raises(mws.InvalidArgumentError, match=r"got 18446744073709551616"):
        mws.save_state_dict(store, sd, resource_id="r", revision="v", weight_generation=1 << 64)
    with pytest.raises(mws.InvalidArgumentError, match="tp_size"):
        mws.PlacementBuilder("r", "v", 1, tp_size=-2)
    p = Model(ModelSpec(layers=1), "tp", tp=1).placement
    with pytest.raises(mws.InvalidArgumentError, match="generation"):
        mws.Binding(p, p.fragments()[0].participant_id, lease_generation=-5)
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
    m = mws.import_safetensors(store, src, resource_id="r", revision="v", weight_generation=1)
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
    m = mws.import_safetensors(store, ck, resource_id="r", revision="v", weight_generation=1)
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
        mws.import_safetensors(store, ck, resource_id="r", revision="v2", weight_generation=1)


# -- defect 6: re-saving a revision ----------------------------------------------------


def test_resaving_an_identical_revision_is_a_no_op_and_other_content_a_precise_conflict(tmp_path):
    store = mws.Store.directory(tmp_path / "store")
    sd = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    first = mws.save_state_dict(store, sd, resource_id="m", revision="r1", weight_generation=1)
    again = mws.save_state_dict(store, sd, resource_id="m", revision="r1", weight_generation=1)
    assert again.key == first.key and again.digest == first.digest, "the stored revision, unchanged"
    with pytest.raises(mws.StateDictError) as ei:
        mws.save_state_dict(store, {"w": np.ones((3, 4), dtype=np.float32)}, resource_id="m", revision="r1",
                            weight_generation=1)
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


# -- issue 29: revisions without hand-built keys ----------------------------------------


def _save(store, revision, generation, value, *, namespace=None, created_at=None, resource_id="m"):
    sd = {"w": np.full((2, 3), value, dtype=np.float32)}
    return mws.save_state_dict(store, sd, resource_id=resource_id, revision=revision, weight_generation=generation,
                               namespace=namespace, created_at=created_at)


def test_store_lists_revisions_and_finds_the_newest(tmp_path):
    store = mws.Store.directory(tmp_path / "store")
    assert store.revisions("m") == [] and store.latest("m") is None
    first = _save(store, "step-1", 1, 1.0, created_at="2026-01-01T00:00:00Z")
    _save(store, "step-2", 1, 2.0, created_at="2026-01-02T00:00:00Z")
    _save(store, "b", 2, 4.0, created_at="2026-01-01T00:00:00Z")
    _save(store, "a", 2, 3.0, created_at="2026-01-01T00:00:00Z")
    _save(store, "other-ns", 9, 9.0, namespace="prod")
    _save(store, "other-model", 9, 9.0, resource_id="mx")

    revs = store.revisions("m")
    assert all(isinstance(r, mws.RevisionInfo) for r in revs)
    # Generation first, then created_at, then the revision name (code-point order).
    assert [(r.revision, r.weight_generation) for r in revs] == [("step-1", 1), ("step-2", 1), ("a", 2), ("b", 2)]
    r0 = revs[0]
    assert (r0.namespace, r0.resource_id, r0.manifest_key, r0.manifest_digest, r0.created_at) == \
        ("default", "m", first.key, first.digest, "2026-01-01T00:00:00Z")
    latest = store.latest("m")
    assert latest == revs[-1] and latest.revision == "b"
    # Namespaces and key prefixes are respected.
    assert [r.revision for r in store.revisions("m", namespace="prod")] == ["other-ns"]
    assert [r.revision for r in store.revisions("mx")] == ["other-model"]
    other_prefix = mws.Store.directory(tmp_path / "store", key_prefix="ckpt")
    assert other_prefix.revisions("m") == [] and other_prefix.latest("m") is None
    _save(other_prefix, "elsewhere", 1, 5.0)
    assert [r.revision for r in other_prefix.revisions("m")] == ["elsewhere"]
    assert [r.revision for r in store.revisions("m")] == ["step-1", "step-2", "a", "b"]

    # The state-dict API takes "latest" (or a RevisionInfo) instead of a key.
    got = mws.load_state_dict(store, mws.LATEST, resource_id="m")
    assert (got["w"] == 4.0).all()
    assert (mws.load_state_dict(store, revs[1])["w"] == 2.0).all()
    assert (mws.load_state_dict(store, "latest", resource_id="m", namespace="prod")["w"] == 9.0).all()
    out = tmp_path / "latest.safetensors"
    mws.export_safetensors(store, "latest", out, resource_id="m")
    assert (safetensors_numpy.load_file(str(out))["w"] == 4.0).all()


def test_latest_resolution_errors_name_what_was_asked():
    store = mws.Store.memory()
    with pytest.raises(mws.NotFoundError, match=r"no committed revision of 'ghost' in namespace 'default'"):
        mws.load_state_dict(store, "latest", resource_id="ghost")
    with pytest.raises(mws.ArgumentError, match="needs resource_id="):
        mws.load_state_dict(store, "latest")
    m = _save(store, "v", 1, 1.0)
    with pytest.raises(mws.ArgumentError, match="only go with key='latest'"):
        mws.load_state_dict(store, m.key, resource_id="m")
    with pytest.raises(mws.ArgumentError, match="resource_id must be a str, not NoneType"):
        store.revisions(None)
    with pytest.raises(mws.InvalidArgumentError, match="resource_id must be a non-empty string"):
        store.revisions("")
    # A backend that cannot list its keys (Mooncake Store's client cannot) lists
    # through the revision index its commits write: nothing before the first commit,
    # then every committed revision, the newest last.
    backend = mws.DictBackend()
    listless = mws.Store.from_backend(backend)
    assert listless.revisions("m") == []
    with pytest.raises(mws.NotFoundError, match=r"no committed revision of 'm'"):
        mws.load_state_dict(listless, "latest", resource_id="m")
    first, second = _save(listless, "v1", 1, 1.0), _save(listless, "v2", 2, 2.0)
    assert [r.manifest_key for r in listless.revisions("m")] == [first.key, second.key]
    assert listless.latest("m").manifest_key == second.key
    assert sum("/m/%revisions/" in k for k in backend.objects) == 2, "one index entry per commit"


def test_every_rank_loads_the_revision_rank_0_resolved_as_latest():
    import threading

    store = mws.Store.memory()
    _save(store, "v1", 1, 1.0)
    exs = mws.ThreadExchange.group(2, timeout=60)
    out = [None, None]

    class NoLatest:
        """Rank 1's view of the store: it must take rank 0's answer."""

        def __getattr__(self, name):
            if name == "latest":
                raise AssertionError("only rank 0 resolves 'latest'")
            return getattr(store, name)

    def rank(r):
        try:
            out[r] = mws.load_state_dict(store if r == 0 else NoLatest(), "latest", resource_id="m", exchange=exs[r],
                                         parallel=mws.Parallel(tp_rank=r, tp_size=2), sharding={"w": 0})
        except BaseException as e:  # noqa: BLE001
            out[r] = e

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert all(isinstance(o, dict) for o in out), out
    assert [o["w"].shape for o in out] == [(1, 3), (1, 3)]
    assert all((o["w"] == 1.0).all() for o in out)


# -- issue 29: typed Store and StoredManifest (no Any) ----------------------------------


def _mentions_any(t) -> bool:
    import typing

    return t is typing.Any or any(_mentions_any(a) for a in typing.get_args(t))


def test_store_and_manifest_signatures_are_typed_without_any():
    import inspect
    import typing

    from mooncake_weight_store import binding, placement, store as store_mod

    names = dict(vars(mws))
    names.update({"Binding": binding.Binding, "Placement": placement.Placement, "Decision": store_mod.Decision})
    seen, problems = set(), []

    def classes_in(t):
        if isinstance(t, type) and t.__module__.startswith("mooncake_weight_store"):
            yield t
        for a in typing.get_args(t):
            yield from classes_in(a)

    def check(cls):
        if cls in seen:
            return
        seen.add(cls)
        for name, member in inspect.getmembers(cls):
            if name.startswith("_") and name not in ("__init__", "__enter__", "__exit__"):
                continue
            raw = inspect.getattr_static(cls, name, None)
            fn = member.fget if isinstance(member, property) else getattr(raw, "__func__", member)
            if not callable(fn):
                continue
            hints = typing.get_type_hints(fn, localns=names)
            if isinstance(member, property) and "return" not in hints:
                problems.append(f"{cls.__name__}.{name}: property without a return type")
            for arg, t in hints.items():
                if _mentions_any(t):
                    problems.append(f"{cls.__name__}.{name} ({arg}): {t}")
                if arg == "return":
                    for c in classes_in(t):
                        check(c)

    for cls in (mws.Store, mws.StoredManifest):
        check(cls)
    assert {mws.RevisionInfo, mws.StoredFragment, mws.UploadPlan, mws.Writer, mws.Receipts} <= seen
    assert not problems, "\n".join(problems)
    hints = typing.get_type_hints(mws.RevisionInfo)
    assert hints["weight_generation"] is int and hints["manifest_key"] is str
    assert typing.get_type_hints(mws.Store.latest, localns=names)["return"] == typing.Optional[mws.RevisionInfo]


# -- issue 29: zero-size tensors are refused at save time, by name ------------------------


def test_zero_size_tensors_are_refused_naming_the_tensor(tmp_path):
    store = mws.Store.memory()
    sd = {"ok": np.ones(3, dtype=np.float32), "empty.bias": np.zeros((0, 4), dtype=np.float32)}
    with pytest.raises(mws.StateDictError, match=r"tensor 'empty.bias' is empty \(shape \(0, 4\)\).*at least 1"):
        mws.save_state_dict(store, sd, resource_id="r", revision="v", weight_generation=1)
    assert store.revisions("r") == [], "nothing was committed"
    # safetensors: the file's zero-size tensor is named with the file; names= leaves it out.
    src = tmp_path / "with-empty.safetensors"
    safetensors_numpy.save_file(sd, str(src))
    with pytest.raises(mws.SafetensorsError, match=r"with-empty.safetensors: tensor 'empty.bias' is empty"):
        mws.import_safetensors(store, src, resource_id="r", revision="v", weight_generation=1)
    m = mws.import_safetensors(store, src, resource_id="r", revision="v", weight_generation=1, names=["ok"])
    assert [t["tensor_id"] for t in m.wire()["tensors"]] == ["ok"]


# -- issue 29: messages that name what the user passed -------------------------------------


def test_an_empty_state_dict_is_refused_by_name():
    with pytest.raises(mws.StateDictError, match=r"the state dict is empty \(\{\}\): nothing to save as revision "
                                                 r"'v' of 'r'"):
        mws.save_state_dict(mws.Store.memory(), {}, resource_id="r", revision="v", weight_generation=1)
    with pytest.raises(mws.StateDictError, match="must be a mapping"):
        mws.save_state_dict(mws.Store.memory(), [np.ones(2)], resource_id="r", revision="v", weight_generation=1)


def test_a_regular_file_where_a_store_directory_belongs_is_named(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("127.0.0.1 localhost\n")
    with pytest.raises(mws.MwsError, match=rf"{f}: it is a file, not a directory") as ei:
        mws.Store.directory(f)
    assert isinstance(ei.value, mws.LocalIOError)
    with pytest.raises(mws.LocalIOError, match=rf"{f / 'store'}: {f} is a file, not a directory"):
        mws.Store.directory(f / "store")
    assert f.read_text() == "127.0.0.1 localhost\n"


def test_safetensors_paths_of_the_wrong_kind_are_named(tmp_path):
    store = mws.Store.memory()
    m = _save(store, "v", 1, 1.0)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a checkpoint")
    missing = tmp_path / "missing"
    cases = [
        # (call, the path that must be in the message, what it says)
        (lambda: mws.export_safetensors(store, m, missing / "x.safetensors"), missing / "x.safetensors",
         "does not exist"),
        (lambda: mws.export_safetensors(store, m, a_file / "x.safetensors"), a_file / "x.safetensors",
         "is a regular file, not a directory"),
        (lambda: mws.export_safetensors(store, m, missing, max_shard_bytes=64), missing, "does not exist"),
        (lambda: mws.export_safetensors(store, m, a_file, max_shard_bytes=64), a_file,
         "is a regular file, not a directory"),
        (lambda: mws.import_safetensors(store, a_file, resource_id="r", revision="v", weight_generation=1), a_file,
         "not a safetensors file"),
        (lambda: mws.import_safetensors(store, missing, resource_id="r", revision="v", weight_generation=1), missing,
         "no such file or directory"),
        (lambda: mws.import_safetensors(store, a_file / "x.safetensors", resource_id="r", revision="v",
                                        weight_generation=1), a_file / "x.safetensors", "is a regular file"),
        (lambda: mws.SafetensorsFile(tmp_path), tmp_path, "is a directory, not a .safetensors file"),
        (lambda: mws.SafetensorsFile(missing), missing, "no such file"),
    ]
    for call, path, says in cases:
        with pytest.raises(mws.MwsError) as ei:
            call()
        assert str(path) in str(ei.value) and says in str(ei.value), (path, str(ei.value))
    assert not missing.exists(), "a missing export directory is not created"
    assert a_file.read_text() == "not a checkpoint"
