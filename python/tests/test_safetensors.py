"""safetensors interop: a multi-file checkpoint written with numpy + safetensors,
imported, restored into TP2 and TP4 shards and compared tensor by tensor; exports
read back by the safetensors package; malformed files refused; a failed sharded
export leaves the earlier one intact; special files refused without hanging."""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import safetensors.numpy as safetensors_numpy  # the CI venv has it (.ci/python.sh)

import mooncake_weight_store as mws  # noqa: E402
import mooncake_weight_store.safetensors_io as st_io  # noqa: E402
from mooncake_weight_store import (  # noqa: E402
    Layout,
    Parallel,
    SafetensorsError,
    Store,
    export_safetensors,
    import_safetensors,
    load_state_dict,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sd_model import SHARDING, reference, shard_of  # noqa: E402


def write_checkpoint(d: Path, sd: dict, files: int = 3) -> list:
    """A Hugging Face style sharded checkpoint: tensors dealt over `files` files."""
    names = sorted(sd)
    paths = []
    for i in range(files):
        part = {n: (sd[n].reshape(()) if sd[n].shape == () else sd[n]) for n in names[i::files]}
        p = d / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        safetensors_numpy.save_file(part, str(p), metadata={"format": "pt"})
        paths.append(p)
    index = {"metadata": {}, "weight_map": {n: paths[k % files].name for k, n in enumerate(names)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return paths


@pytest.fixture(params=["memory", "directory"])
def store(request, tmp_path):
    s = Store.memory() if request.param == "memory" else Store.directory(tmp_path / "store")
    yield s
    s.close()


def test_import_multi_file_checkpoint_restore_tp2_tp4(store, tmp_path):
    full = reference()
    paths = write_checkpoint(tmp_path, full)
    m = import_safetensors(store, paths, resource_id="qwen-mini", revision="main", weight_generation=1)
    # One more tensor than the checkpoint's: the files' __metadata__, kept for export
    # (load_state_dict leaves it out unless named).
    assert m.tensor_count == len(full) + 1
    for tp_size in (2, 4):
        for r in range(tp_size):
            got = load_state_dict(store, m.key, sharding=SHARDING, parallel=Parallel(tp_rank=r, tp_size=tp_size))
            exp = shard_of(full, r, tp_size)
            assert sorted(got) == sorted(exp)
            for n in exp:
                e = exp[n]  # 0-d tensors keep their shape ()
                assert got[n].dtype == e.dtype and got[n].shape == e.shape, n
                assert got[n].tobytes() == e.tobytes(), n
    # a directory argument finds the same files; names= selects
    m2 = import_safetensors(store, tmp_path, resource_id="qwen-mini", revision="sub", weight_generation=1,
                            names=["lm_head.weight", "step"])
    assert m2.tensor_count == 3  # and the metadata


def test_export_whole_and_shard_read_by_safetensors(store, tmp_path):
    full = reference()
    paths = write_checkpoint(tmp_path, full, files=2)
    m = import_safetensors(store, paths, resource_id="qwen-mini", revision="main", weight_generation=1)
    out = tmp_path / "whole.safetensors"
    info = export_safetensors(store, m.key, out, metadata={"format": "pt", "source": "mws"})
    back = safetensors_numpy.load_file(str(out))
    assert sorted(back) == sorted(full) and info["lm_head.weight"][0] == "BF16"
    for n, a in full.items():
        assert back[n].dtype == a.dtype and back[n].tobytes() == a.tobytes(), n
    with open(out, "rb") as f:  # header padded to 8 bytes like safetensors writes it
        (hl,) = struct.unpack("<Q", f.read(8))
        assert hl % 8 == 0 and json.loads(f.read(hl))["__metadata__"]["source"] == "mws"
    lay = Layout(Parallel(tp_rank=1, tp_size=4), SHARDING)
    shard = tmp_path / "tp1-of-4.safetensors"
    export_safetensors(store, m.key, shard, layout=lay)
    back = safetensors_numpy.load_file(str(shard))
    exp = shard_of(full, 1, 4)
    for n in exp:
        assert back[n].tobytes() == exp[n].tobytes(), n
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_stored_safetensors_roundtrip_from_state_dict(store, tmp_path):
    full = reference()
    m = mws.save_state_dict(store, full, resource_id="r", revision="v", weight_generation=2)
    export_safetensors(store, m.key, tmp_path / "x.safetensors", names=["model.embed_tokens.weight"])
    back = safetensors_numpy.load_file(str(tmp_path / "x.safetensors"))
    assert list(back) == ["model.embed_tokens.weight"]


def _raw(path: Path, header: dict, data: bytes = b"", hlen: int = None) -> Path:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if hlen is None else hlen) + h + data)
    return path


@pytest.mark.parametrize("header,data,hlen,match", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, None, "outside"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, None, "needs 8"),
    ({"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "unsupported dtype"),
    ({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b"", None, "shape"),
    ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 8, None, "overlap"),
    ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0", 1 << 40, "header length"),
    ({"__metadata__": {"k": 3}}, b"", None, "__metadata__"),
])
def test_malformed_files_are_refused(tmp_path, header, data, hlen, match):
    p = _raw(tmp_path / "bad.safetensors", header, data, hlen)
    with Store.memory() as s:
        with pytest.raises(SafetensorsError, match=match):
            import_safetensors(s, p, resource_id="r", revision="v", weight_generation=1)


def test_duplicate_names_and_empty_inputs(tmp_path):
    a = tmp_path / "a.safetensors"
    b = tmp_path / "b.safetensors"
    safetensors_numpy.save_file({"x": np.zeros(2, np.float32)}, str(a))
    safetensors_numpy.save_file({"x": np.ones(2, np.float32)}, str(b))
    (tmp_path / "empty").mkdir()
    with Store.memory() as s:
        with pytest.raises(SafetensorsError, match="in both"):
            import_safetensors(s, [a, b], resource_id="r", revision="v", weight_generation=1)
        with pytest.raises(SafetensorsError, match="no .safetensors"):
            import_safetensors(s, tmp_path / "empty", resource_id="r", revision="v", weight_generation=1)
        safetensors_numpy.save_file({"e": np.zeros((0, 3), np.float32)}, str(tmp_path / "e.safetensors"))
        with pytest.raises(SafetensorsError, match="empty"):
            import_safetensors(s, tmp_path / "e.safetensors", resource_id="r", revision="v", weight_generation=1)


def test_import_reads_the_mapped_file_directly(tmp_path, monkeypatch):
    """No copy in Python: the store's batch_put_from reads from the addresses inside
    the memory-mapped files (and the bytes there are the tensors')."""
    full = reference()
    paths = write_checkpoint(tmp_path, full, files=2)
    mapped = {}
    real_view = mws.SafetensorsFile.view

    def spy(self, name):
        v = real_view(self, name)
        base = self._ref.address
        assert base <= v.address < base + len(self._mm)  # inside this file's map
        mapped[v.address] = (name, v.nbytes)
        return v

    monkeypatch.setattr(mws.SafetensorsFile, "view", spy)
    be = mws.DictBackend()
    seen = []
    real_put = be.batch_put_from

    def put(items, rt):
        seen.extend((it.address, it.len) for it in items)
        return real_put(items, rt)

    be.batch_put_from = put
    with Store.from_backend(be) as s:
        m = import_safetensors(s, paths, resource_id="r", revision="v", weight_generation=1)
        assert m.tensor_count == len(full) + 1  # and the kept __metadata__
    # Every weight was read from its file's map; the one other put is the metadata.
    weights = sorted((a, n) for a, (_, n) in mapped.items())
    others = [x for x in seen if x not in weights]
    assert sorted(x for x in seen if x in weights) == weights and len(others) == 1


# -- a failed sharded export leaves the earlier export intact ---------------------------

def _revision(k: int) -> dict:
    """Six float32 tensors of 256 bytes, distinct per revision ``k``."""
    return {n: np.arange(64, dtype=np.float32) + 1000 * k + 100 * i for i, n in enumerate("abcdef")}


def _files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("failure", ["corrupt payload", "interrupt"])
def test_failed_sharded_export_leaves_the_earlier_export_intact(tmp_path, monkeypatch, failure):
    """Revision 2 exported over revision 1's shards fails on its second shard: every
    file in the directory is as it was (no shard of revision 2 in place, no
    temporary left), and the directory still imports as revision 1 exactly."""
    be = mws.DictBackend()
    with Store.from_backend(be) as s:
        rev1, rev2 = _revision(1), _revision(2)
        m1 = mws.save_state_dict(s, rev1, resource_id="r", revision="v1", weight_generation=1)
        m2 = mws.save_state_dict(s, rev2, resource_id="r", revision="v2", weight_generation=1)
        out = tmp_path / "export"
        out.mkdir()
        export_safetensors(s, m1.key, out, max_shard_bytes=512)  # shards {a, b}, {c, d}, {e, f}
        assert sorted(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values()) == [
            "model-00001-of-00003.safetensors"] * 2 + ["model-00002-of-00003.safetensors"] * 2 + [
            "model-00003-of-00003.safetensors"] * 2
        before = _files(out)
        if failure == "corrupt payload":  # tensor c (shard 2) of revision 2 fails its integrity check
            hit = [k for k, v in be.objects.items() if "/payload/" in k and rev2["c"].tobytes() in v]
            assert len(hit) == 1
            v = be.objects[hit[0]]
            i = v.index(rev2["c"].tobytes())
            be.objects[hit[0]] = v[:i] + bytes([v[i] ^ 0xFF]) + v[i + 1:]
            expected = mws.IntegrityError
        else:  # any exception, even one that is no Exception, while shard 2 is written
            real = st_io.load_state_dict
            writes = []

            def restore(*args, **kw):
                if kw.get("into") is not None:
                    writes.append(sorted(kw["into"]))
                    if len(writes) == 2:
                        raise KeyboardInterrupt
                return real(*args, **kw)

            monkeypatch.setattr(st_io, "load_state_dict", restore)
            expected = KeyboardInterrupt
        with pytest.raises(expected):
            export_safetensors(s, m2.key, out, max_shard_bytes=512)
        monkeypatch.undo()
        assert _files(out) == before  # byte-identical, nothing added or removed
        back = import_safetensors(s, out, resource_id="back", revision="b", weight_generation=1)
        got = load_state_dict(s, back.key)
        assert sorted(got) == sorted(rev1)
        for n, a in rev1.items():
            assert got[n].tobytes() == a.tobytes(), n


def test_sharded_reexport_with_fewer_shards_removes_the_stale_shards(tmp_path):
    """A successful export over an earlier one removes the shards the earlier index
    named that the new one does not; other files stay."""
    with Store.memory() as s:
        rev1, rev2 = _revision(1), _revision(2)
        m1 = mws.save_state_dict(s, rev1, resource_id="r", revision="v1", weight_generation=1)
        m2 = mws.save_state_dict(s, rev2, resource_id="r", revision="v2", weight_generation=1)
        out = tmp_path / "export"
        out.mkdir()
        export_safetensors(s, m1.key, out, max_shard_bytes=512)
        (out / "README.md").write_text("kept")
        export_safetensors(s, m2.key, out, max_shard_bytes=1 << 20)
        assert sorted(p.name for p in out.iterdir()) == [
            "README.md", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
        back = safetensors_numpy.load_file(str(out / "model-00001-of-00001.safetensors"))
        assert sorted(back) == sorted(rev2) and all(back[n].tobytes() == rev2[n].tobytes() for n in rev2)
        # The directory also imports as revision 2 (a glob would find no stale shard).
        m = import_safetensors(s, out, resource_id="back", revision="b", weight_generation=1)
        assert load_state_dict(s, m.key)["c"].tobytes() == rev2["c"].tobytes()
        # Only names of that directory are removed: an index naming a file outside
        # (or anything but a plain file name) removes nothing.
        victim = tmp_path / "victim.safetensors"
        victim.write_bytes(b"not mine")
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
            "x": "../victim.safetensors", "y": "model-00001-of-00001.safetensors"}}))
        export_safetensors(s, m1.key, out, max_shard_bytes=512)
        assert victim.read_bytes() == b"not mine"
        assert sorted(p.name for p in out.iterdir()) == sorted(
            ["README.md", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
            + [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)])


# -- special files are refused, never waited on ------------------------------------------

def _returns_within(call, fifos, seconds: float = 10.0):
    """Runs ``call`` in a thread and returns what it raised (``None`` when it
    returned). Fails the test when it has not returned within ``seconds``: a reader
    blocked opening a FIFO is released (a writer opens and closes it), so a
    regression fails instead of hanging."""
    result = {}

    def run():
        try:
            call()
            result["error"] = None
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for _ in range(20):
            for f in fifos:
                try:
                    os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            t.join(0.25)
            if not t.is_alive():
                break
        pytest.fail(f"still running after {seconds}s: blocked on a FIFO")
    return result["error"]


def _shard(path: Path, name: str = "x") -> Path:
    safetensors_numpy.save_file({name: np.ones(4, np.float32)}, str(path), metadata={"format": "pt"})
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("case", ["globbed", "symlinked", "indexed", "index", "index in directory",
                                  "SafetensorsFile", "given"])
def test_special_files_are_refused_without_hanging(tmp_path, case):
    d = tmp_path / "ckpt"
    d.mkdir()
    _shard(d / "a.safetensors")
    if case in ("index", "index in directory"):
        fifo = d / "model.safetensors.index.json"
    else:
        fifo = d / ("pipe" if case == "symlinked" else "b.safetensors")
    os.mkfifo(fifo)
    named = fifo
    if case == "symlinked":
        named = d / "b.safetensors"
        named.symlink_to("pipe")
    if case == "indexed":
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}))
    with Store.memory() as s:
        def imp(p):
            return lambda: import_safetensors(s, p, resource_id="r", revision="v", weight_generation=1)

        call = {"globbed": imp(d), "symlinked": imp(d), "indexed": imp(d), "index": imp(fifo),
                "index in directory": imp(d), "SafetensorsFile": lambda: mws.SafetensorsFile(fifo).close(),
                "given": imp(fifo)}[case]
        err = _returns_within(call, [fifo])
        assert isinstance(err, SafetensorsError), repr(err)
        assert str(named) in str(err) and "FIFO" in str(err), str(err)


@pytest.mark.parametrize("case", ["../", "absolute", "nested ../"])
def test_shards_outside_the_checkpoint_directory_are_refused_before_any_is_opened(tmp_path, monkeypatch, case):
    """An index entry naming a file outside its directory (``../x``, an absolute path,
    a path through a subdirectory) is refused when the index is read, before any
    shard is opened."""
    outside = _shard(tmp_path / "outside.safetensors", "y")
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "sub").mkdir()
    _shard(d / "a.safetensors")
    target = {"../": "../outside.safetensors", "absolute": str(outside),
              "nested ../": "sub/../../outside.safetensors"}[case]
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"x": "a.safetensors", "y": target}}))
    opened = []
    real_init = mws.SafetensorsFile.__init__

    def spy(self, path):
        opened.append(Path(path))
        real_init(self, path)

    monkeypatch.setattr(mws.SafetensorsFile, "__init__", spy)
    with Store.memory() as s:
        with pytest.raises(SafetensorsError) as ei:
            import_safetensors(s, d, resource_id="r", revision="v", weight_generation=1)
    assert opened == [], opened
    msg = str(ei.value)
    assert repr(target) in msg and "not a file name inside" in msg, msg


def test_a_hugging_face_cache_snapshot_links_its_shards_elsewhere_and_imports(tmp_path):
    """A Hugging Face cache snapshot: the shards in ``snapshots/<rev>/`` are symbolic
    links into ``blobs/``; they are regular files after the links, so they import."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    snap = tmp_path / "snapshots" / "abc"
    snap.mkdir(parents=True)
    _shard(blobs / "1111", "x")
    _shard(blobs / "2222", "y")
    (snap / "model-00001-of-00002.safetensors").symlink_to("../../blobs/1111")
    (snap / "model-00002-of-00002.safetensors").symlink_to("../../blobs/2222")
    (snap / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                                        "y": "model-00002-of-00002.safetensors"}}))
    with Store.memory() as s:
        m = import_safetensors(s, snap, resource_id="r", revision="v", weight_generation=1)
        assert sorted(t["tensor_id"] for t in m.wire()["tensors"] if t["tensor_id"] != "__metadata__") == ["x", "y"]


# -- no revision of nothing; malformed JSON always a SafetensorsError --------------------

@pytest.mark.parametrize("case", ["empty weight_map", "only __metadata__", "names=[]"])
def test_a_checkpoint_without_tensors_is_refused_before_anything_is_written(tmp_path, case):
    d = tmp_path / "ckpt"
    d.mkdir()
    good = _shard(d / "a.safetensors")
    names = None
    if case == "empty weight_map":
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))
        given = d
    elif case == "only __metadata__":
        given = _raw(tmp_path / "meta.safetensors", {"__metadata__": {"format": "pt"}})
    else:
        given, names = good, []
    be = mws.DictBackend()
    with Store.from_backend(be) as s:
        with pytest.raises(SafetensorsError, match="holds no tensor"):
            import_safetensors(s, given, resource_id="r", revision="v", weight_generation=1, names=names)
    assert be.objects == {}  # nothing written


def _raw_header(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


_DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("case,match", [
    ("dtype list", "dtype must be a string"),
    ("dtype object", "dtype must be a string"),
    ("deep header", "header is nested too deeply"),
    ("deep index", "index is nested too deeply"),
    ("weight_map value list", "weight_map maps tensor names to file names"),
    ("weight_map value integer", "weight_map maps tensor names to file names"),
    ("weight_map value null", "weight_map maps tensor names to file names"),
])
def test_json_of_the_wrong_shape_raises_safetensors_error(tmp_path, case, match):
    d = tmp_path / "ckpt"
    d.mkdir()
    p = d / "a.safetensors"
    if case.startswith("dtype"):
        dtype = ["F32"] if case == "dtype list" else {"F32": 1}
        _raw(p, {"a": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    elif case == "deep header":
        _raw_header(p, b'{"a": ' + _DEEP + b"}")
    else:
        _shard(p)
        index = d / "model.safetensors.index.json"
        if case == "deep index":
            index.write_bytes(b'{"metadata": ' + _DEEP + b', "weight_map": {"x": "a.safetensors"}}')
        else:
            value = {"list": ["a.safetensors"], "integer": 3, "null": None}[case.rsplit(" ", 1)[1]]
            index.write_text(json.dumps({"metadata": {}, "weight_map": {"x": value}}))
    with Store.memory() as s:
        with pytest.raises(SafetensorsError, match=match) as ei:
            import_safetensors(s, d, resource_id="r", revision="v", weight_generation=1)
    assert str(d) in str(ei.value)


@pytest.mark.parametrize("meta", [0, [], "", False, None])
def test_metadata_that_is_not_an_object_is_refused(tmp_path, meta):
    p = _raw(tmp_path / "m.safetensors", {"__metadata__": meta,
                                          "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    with Store.memory() as s:
        with pytest.raises(SafetensorsError, match="__metadata__ must be a JSON object") as ei:
            import_safetensors(s, p, resource_id="r", revision="v", weight_generation=1)
    assert str(p) in str(ei.value)
    # absent, or an object of strings, is fine
    ok = _raw(tmp_path / "ok.safetensors", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    with Store.memory() as s:
        assert import_safetensors(s, ok, resource_id="r", revision="v", weight_generation=1).tensor_count == 1
