"""safetensors interop: import ``.safetensors`` files as a weight revision, and export
a revision (or one rank's shard of it) as a ``.safetensors`` file.

Both read and write the files through memory maps: an import binds each tensor's
bytes inside the mapped file directly (the store reads them from the page cache;
nothing is copied here), an export maps the new file and restores the tensors
straight into it. The ``safetensors`` package is not needed for either (the format
is an 8-byte little-endian header length, a JSON header, then the data); files are
written the way it writes them (header padded with spaces to 8 bytes, tensors in
name order, contiguous) and read by it.

dtype codes: BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64, C64,
F8_E4M3 (``float8_e4m3fn``), F8_E5M2, F8_E8M0 (see
:data:`~mooncake_weight_store.tensors.DTYPES`).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from .buffers import BufferRef
from .manifest import StoredManifest
from .state_dict import (Parallel, Sharding, StateDictError, _box_from_global, load_state_dict, resolve_shard,
                         save_state_dict)
from .tensors import DTYPES, TensorView, _SAFETENSORS

__all__ = ["SafetensorsError", "SafetensorsFile", "Layout", "import_safetensors", "export_safetensors",
           "SAFETENSORS_FINGERPRINT"]

PathLike = Union[str, "os.PathLike[str]"]
SAFETENSORS_FINGERPRINT = "mws:safetensors:v1"
MAX_HEADER = 100 << 20  # the safetensors limit


class SafetensorsError(ValueError):
    """A malformed or unsupported ``.safetensors`` file."""


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: Tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """One ``.safetensors`` file, memory-mapped read-only.

    ``tensors``: name -> entry (dtype name, shape, data offsets); ``metadata``: the
    ``__metadata__`` strings. :meth:`view` gives a :class:`TensorView` into the map.
    Close it (or use ``with``) after the views are released.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        self._f = open(self.path, "rb")
        try:
            size = os.fstat(self._f.fileno()).st_size
            head = self._f.read(8)
            if len(head) != 8:
                raise SafetensorsError(f"{self.path}: too short for a safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise SafetensorsError(f"{self.path}: header length {n} is invalid for a {size}-byte file")
            try:
                header = json.loads(self._f.read(n).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise SafetensorsError(f"{self.path}: header is not JSON: {e}") from None
            if not isinstance(header, dict):
                raise SafetensorsError(f"{self.path}: header is not a JSON object")
            self.data_start = 8 + n
            self.data_len = size - self.data_start
            meta = header.pop("__metadata__", None) or {}
            if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in meta.items()):
                raise SafetensorsError(f"{self.path}: __metadata__ must map strings to strings")
            self.metadata: Dict[str, str] = dict(meta)
            self.tensors: Dict[str, _Entry] = {}
            for name, entry in header.items():
                self.tensors[name] = self._entry(name, entry)
            spans = sorted((e.begin, e.end, e.name) for e in self.tensors.values() if e.end > e.begin)
            for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
                if b1 < e0:
                    raise SafetensorsError(f"{self.path}: tensors {n0!r} and {n1!r} overlap")
            self._mm: Optional[mmap.mmap] = (mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
                                             if size else None)
            if self._mm is not None and hasattr(mmap, "MADV_WILLNEED"):
                try:  # read ahead: the store streams through every tensor once
                    self._mm.madvise(mmap.MADV_WILLNEED)
                    self._mm.madvise(mmap.MADV_SEQUENTIAL)
                except OSError:  # pragma: no cover - advice only
                    pass
            self._ref: Optional[BufferRef] = BufferRef(self._mm) if self._mm is not None else None
        except BaseException:
            self._f.close()
            raise

    def _entry(self, name: str, e: Any) -> _Entry:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(e, dict):
            raise SafetensorsError(f"{where}: entry is not an object")
        code = e.get("dtype")
        if code not in _SAFETENSORS:
            raise SafetensorsError(f"{where}: unsupported dtype {code!r} (supported: {', '.join(_SAFETENSORS)})")
        shape = e.get("shape")
        offs = e.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                   for x in shape)):
            raise SafetensorsError(f"{where}: shape must be a list of non-negative integers")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in offs)):
            raise SafetensorsError(f"{where}: data_offsets must be [begin, end]")
        begin, end = offs
        dtype = _SAFETENSORS[code]
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        if not 0 <= begin <= end <= self.data_len:
            raise SafetensorsError(f"{where}: data_offsets {offs} outside the {self.data_len}-byte data section")
        if end - begin != nbytes:
            raise SafetensorsError(f"{where}: data_offsets {offs} hold {end - begin} bytes, {code}{shape} "
                                   f"needs {nbytes}")
        return _Entry(name, dtype, tuple(shape), begin, end)

    def view(self, name: str) -> TensorView:
        """A read-only view of tensor ``name`` inside the map (no copy)."""
        e = self.tensors[name]
        if self._ref is None:  # pragma: no cover - an empty file has no tensors
            raise SafetensorsError(f"{self.path}: no data")
        if e.end == e.begin:
            raise SafetensorsError(f"{self.path}: tensor {name!r} is empty (shape {list(e.shape)}); a stored "
                                   "tensor needs at least one element (pass names= to leave it out)")
        return TensorView(address=self._ref.address + self.data_start + e.begin, shape=e.shape, dtype=e.dtype,
                          readonly=True, source="safetensors", obj=self)

    def close(self) -> None:
        if self._ref is not None:
            self._ref.release()
            self._ref = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self._f.close()

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def import_safetensors(
    store: Any,
    paths: Union[PathLike, Iterable[PathLike]],
    *,
    resource_id: str,
    revision: str,
    generation: int,
    names: Optional[Iterable[str]] = None,
    fingerprint: str = SAFETENSORS_FINGERPRINT,
    **save_kw: Any,
) -> StoredManifest:
    """Writes revision ``revision`` of ``resource_id`` from one or more
    ``.safetensors`` files (a sharded Hugging Face checkpoint: pass every
    ``model-0000N-of-0000M.safetensors``, or the directory holding them).

    Every tensor is stored whole (one fragment); restore it into any layout with
    :func:`~mooncake_weight_store.state_dict.load_state_dict`. ``names`` selects
    tensors (default: all). A name in two files is an error. Further keywords go to
    :func:`~mooncake_weight_store.state_dict.save_state_dict` (``namespace``,
    ``created_at``, ...). Returns the committed manifest."""
    files: List[Path] = []
    for p in ([paths] if isinstance(paths, (str, os.PathLike)) else list(paths)):
        p = Path(p)
        files.extend(sorted(p.glob("*.safetensors")) if p.is_dir() else [p])
    if not files:
        raise SafetensorsError(f"no .safetensors files in {paths!r}")
    opened: List[SafetensorsFile] = []
    views: Dict[str, TensorView] = {}
    try:
        where: Dict[str, Path] = {}
        for f in files:
            sf = SafetensorsFile(f)
            opened.append(sf)
            for name in sf.tensors:
                if name in where:
                    raise SafetensorsError(f"tensor {name!r} is in both {where[name]} and {f}")
                where[name] = f
        wanted = set(names) if names is not None else None
        if wanted is not None:
            missing = sorted(wanted - set(where))
            if missing:
                raise SafetensorsError(f"not in the files: {', '.join(missing)}")
        for sf in opened:
            for name in sf.tensors:
                if wanted is None or name in wanted:
                    views[name] = sf.view(name)
        return save_state_dict(store, views, resource_id=resource_id, revision=revision, generation=generation,
                               fingerprint=fingerprint, **save_kw)
    finally:
        for v in views.values():
            v.release()
        for sf in opened:
            sf.close()


@dataclass(frozen=True, eq=False)
class Layout:
    """One rank's shard: its :class:`~mooncake_weight_store.state_dict.Parallel`
    coordinates and the ``sharding`` (as for ``load_state_dict``)."""

    parallel: Parallel = Parallel()
    sharding: Sharding = None


def export_safetensors(
    store: Any,
    key: Union[str, StoredManifest],
    path: PathLike,
    *,
    layout: Optional[Layout] = None,
    names: Optional[Iterable[str]] = None,
    metadata: Optional[Mapping[str, str]] = None,
) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """Writes the revision at manifest ``key`` (``names``: a subset) to the
    ``.safetensors`` file ``path``: whole tensors, or with ``layout`` one rank's
    shards. Written to a temporary file beside ``path`` and renamed into place
    (atomic on POSIX). Returns name -> (safetensors dtype code, shape)."""
    own = isinstance(key, StoredManifest)
    manifest = key if isinstance(key, StoredManifest) else store.load_manifest(key)
    lay = layout or Layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        stored = {t["tensor_id"]: t for t in manifest.wire()["tensors"]}
        wanted = sorted(stored if names is None else set(names))
        unknown = [n for n in wanted if n not in stored]
        if unknown:
            raise StateDictError(f"not in the revision: {', '.join(unknown)}")
        entries: Dict[str, Any] = {}
        offset = 0
        shapes: Dict[str, Tuple[int, ...]] = {}
        for n in wanted:
            d = stored[n]
            info = DTYPES.get(d["dtype"])
            if info is None or info.safetensors is None:
                raise SafetensorsError(f"tensor {n!r}: dtype {d['dtype']!r} has no safetensors code")
            _, local = _box_from_global(n, resolve_shard(lay.sharding, n), tuple(d["global_shape"]),
                                        lay.parallel.sizes, lay.parallel.rank)
            nbytes = math.prod(local) * info.itemsize
            entries[n] = {"dtype": info.safetensors, "shape": list(local), "data_offsets": [offset, offset + nbytes]}
            shapes[n] = local
            offset += nbytes
        header: Dict[str, Any] = {}
        if metadata:
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
                raise SafetensorsError("metadata must map strings to strings")
            header["__metadata__"] = dict(metadata)
        header.update(entries)
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        data_start = 8 + len(raw)
        total = data_start + offset
        with open(tmp, "wb+") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(total)
            f.flush()
            if offset:
                mm = mmap.mmap(f.fileno(), total, access=mmap.ACCESS_WRITE)
                ref = BufferRef(mm, writable=True)
                views: Dict[str, TensorView] = {}
                try:
                    for n in wanted:
                        views[n] = TensorView(address=ref.address + data_start + entries[n]["data_offsets"][0],
                                              shape=shapes[n], dtype=stored[n]["dtype"], readonly=False,
                                              source="safetensors")
                    load_state_dict(store, manifest, into=views, sharding=lay.sharding, parallel=lay.parallel)
                    mm.flush()
                finally:
                    for v in views.values():
                        v.release()
                    ref.release()
                    mm.close()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return {n: (entries[n]["dtype"], shapes[n]) for n in wanted}
    finally:
        if tmp.exists():
            tmp.unlink()
        if not own:
            manifest.close()
