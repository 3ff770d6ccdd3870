"""safetensors interop: a multi-file checkpoint written with numpy + safetensors,
imported, restored into TP2 and TP4 shards and compared tensor by tensor; exports
read back by the safetensors package; malformed files refused."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import safetensors.numpy as safetensors_numpy  # the CI venv has it (.ci/python.sh)

import mooncake_weight_store as mws  # noqa: E402
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
    m = import_safetensors(store, paths, resource_id="qwen-mini", revision="main", generation=1)
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
    m2 = import_safetensors(store, tmp_path, resource_id="qwen-mini", revision="sub", generation=1,
                            names=["lm_head.weight", "step"])
    assert m2.tensor_count == 3  # and the metadata


def test_export_whole_and_shard_read_by_safetensors(store, tmp_path):
    full = reference()
    paths = write_checkpoint(tmp_path, full, files=2)
    m = import_safetensors(store, paths, resource_id="qwen-mini", revision="main", generation=1)
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
    m = mws.save_state_dict(store, full, resource_id="r", revision="v", generation=2)
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
            import_safetensors(s, p, resource_id="r", revision="v", generation=1)


def test_duplicate_names_and_empty_inputs(tmp_path):
    a = tmp_path / "a.safetensors"
    b = tmp_path / "b.safetensors"
    safetensors_numpy.save_file({"x": np.zeros(2, np.float32)}, str(a))
    safetensors_numpy.save_file({"x": np.ones(2, np.float32)}, str(b))
    (tmp_path / "empty").mkdir()
    with Store.memory() as s:
        with pytest.raises(SafetensorsError, match="in both"):
            import_safetensors(s, [a, b], resource_id="r", revision="v", generation=1)
        with pytest.raises(SafetensorsError, match="no .safetensors"):
            import_safetensors(s, tmp_path / "empty", resource_id="r", revision="v", generation=1)
        safetensors_numpy.save_file({"e": np.zeros((0, 3), np.float32)}, str(tmp_path / "e.safetensors"))
        with pytest.raises(SafetensorsError, match="empty"):
            import_safetensors(s, tmp_path / "e.safetensors", resource_id="r", revision="v", generation=1)


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
        m = import_safetensors(s, paths, resource_id="r", revision="v", generation=1)
        assert m.tensor_count == len(full) + 1  # and the kept __metadata__
    # Every weight was read from its file's map; the one other put is the metadata.
    weights = sorted((a, n) for a, (_, n) in mapped.items())
    others = [x for x in seen if x not in weights]
    assert sorted(x for x in seen if x in weights) == weights and len(others) == 1
