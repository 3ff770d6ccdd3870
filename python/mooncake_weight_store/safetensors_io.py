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
import stat
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from .buffers import BufferRef
from .errors import LocalError
from .manifest import StoredManifest
from .state_dict import (Parallel, RevisionKey, Sharding, StateDictError, _box_from_global, _manifest_key,
                         _open_revision, is_scalar, load_state_dict, resolve_shard, save_state_dict)
from .tensors import DTYPES, TensorView, _SAFETENSORS

__all__ = ["SafetensorsError", "SafetensorsFile", "Layout", "import_safetensors", "export_safetensors",
           "SAFETENSORS_FINGERPRINT", "METADATA_TENSOR", "INDEX_NAME"]

PathLike = Union[str, "os.PathLike[str]"]
SAFETENSORS_FINGERPRINT = "mws:safetensors:v1"
MAX_HEADER = 100 << 20  # the safetensors limit


class SafetensorsError(LocalError, ValueError):
    """A malformed or unsupported ``.safetensors`` file."""


#: The largest ``model.safetensors.index.json`` read (real ones are a few MiB at most).
MAX_INDEX = 100 << 20


def _json_kind(v: Any) -> str:
    """A JSON value's kind, in words (for error messages)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    kinds = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}
    return kinds.get(type(v), type(v).__name__)


def _parse_json(raw: bytes, what: str) -> Any:
    """``raw`` as JSON; ``what`` starts the message of the :class:`SafetensorsError`
    raised when it is not (also when it nests too deeply for the parser)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{what} is not JSON: {e}") from None
    except RecursionError:
        raise SafetensorsError(f"{what} is nested too deeply (arrays or objects nested beyond the parser's "
                               "limit)") from None


def _file_kind(mode: int) -> str:
    """What a file that is not regular is, in words."""
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a special file"


def _check_regular(path: Path, mode: int, what: str, directory_hint: str = "") -> None:
    if stat.S_ISDIR(mode):
        raise SafetensorsError(f"{path}: is a directory, not {what}{directory_hint}")
    if not stat.S_ISREG(mode):
        raise SafetensorsError(f"{path}: is {_file_kind(mode)}, not a regular file; {what} must be a regular "
                               "file (special files are never opened)")


def _stat_regular(path: Path, what: str) -> None:
    """Refuses ``path`` unless it is a regular file (after symbolic links), by name
    and without opening it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        dangling = " (a symbolic link to nothing)" if os.path.islink(path) else ""
        raise SafetensorsError(f"{path}: no such file{dangling}") from None
    except (OSError, ValueError) as e:
        raise SafetensorsError(f"{path}: cannot stat: {getattr(e, 'strerror', None) or e}") from None
    _check_regular(path, st.st_mode, what)


def _open_regular(path: Path, what: str, directory_hint: str = "") -> int:
    """A read-only descriptor of ``path``, which must be a regular file (after
    symbolic links). Opened with ``O_NONBLOCK`` (opening a FIFO or a device never
    waits) and checked with ``fstat`` on the descriptor itself, so a special file put
    in place after a check by name is refused too, never read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise SafetensorsError(f"{path}: is a directory, not {what}{directory_hint}") from None
    except FileNotFoundError:
        raise SafetensorsError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise SafetensorsError(f"{path}: cannot open: {getattr(e, 'strerror', None) or e}") from None
    try:
        _check_regular(path, os.fstat(fd).st_mode, what, directory_hint)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
    Close it (or use ``with``) after the views are released. Only a regular file is
    read: a FIFO, device or socket is refused without waiting on it.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        # Opened without blocking and checked on the open descriptor: a FIFO, a device
        # or a socket (even one swapped in after a check by name) is refused, never read.
        fd = _open_regular(self.path, "a .safetensors file", directory_hint=(
            " (import_safetensors takes a checkpoint directory)"))
        try:
            self._f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        try:
            size = os.fstat(self._f.fileno()).st_size
            head = self._f.read(8)
            if len(head) != 8:
                raise SafetensorsError(f"{self.path}: not a safetensors file (too short: {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise SafetensorsError(f"{self.path}: not a safetensors file (header length {n} is invalid for a "
                                       f"{size}-byte file)")
            header = _parse_json(self._f.read(n), f"{self.path}: header")
            if not isinstance(header, dict):
                raise SafetensorsError(f"{self.path}: header is not a JSON object")
            self.data_start = 8 + n
            self.data_len = size - self.data_start
            meta = header.pop("__metadata__", {})  # absent: none; present: an object of strings
            if not isinstance(meta, dict):
                raise SafetensorsError(f"{self.path}: __metadata__ must be a JSON object mapping strings to "
                                       f"strings, got {_json_kind(meta)}")
            for k, v in meta.items():
                if not isinstance(v, str):
                    raise SafetensorsError(f"{self.path}: __metadata__ must map strings to strings; {k!r} maps "
                                           f"to {_json_kind(v)}")
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
        if not isinstance(code, str):
            raise SafetensorsError(f"{where}: dtype must be a string (a safetensors code: "
                                   f"{', '.join(_SAFETENSORS)}), got {_json_kind(code)}")
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


#: The revision tensor that keeps the checkpoint's ``__metadata__`` (UTF-8 JSON as
#: uint8; safetensors reserves the name, so no real tensor has it).
METADATA_TENSOR = "__metadata__"
METADATA_FINGERPRINT = "mws:metadata:safetensors:v1"
#: The index file of a sharded Hugging Face checkpoint.
INDEX_NAME = "model.safetensors.index.json"


def _plain_file_name(name: str) -> bool:
    """Whether ``name`` names an entry directly inside a directory: not empty, not
    ``.`` or ``..``, no path separator, no drive, no NUL."""
    seps = [os.sep] + ([os.altsep] if os.altsep else []) + ["/"]
    return (bool(name) and name not in (".", "..") and "\0" not in name and not any(c in name for c in seps)
            and not os.path.isabs(name) and not os.path.splitdrive(name)[0])


def _shard_in(directory: Path, path: Path) -> Path:
    """``path``, a shard found in (or named by the index of) checkpoint ``directory``,
    checked without opening it: named directly inside ``directory`` (the index's
    names are plain file names, checked when it is read) and a regular file after
    symbolic links. A symbolic link placed in the directory may point elsewhere: a
    Hugging Face cache snapshot links each shard into its ``blobs/``."""
    if path.parent != directory:
        raise SafetensorsError(f"{path}: not directly inside the checkpoint directory {directory}")
    _stat_regular(path, "a .safetensors shard")
    return path


def _read_index(p: Path) -> Dict[str, Any]:
    """The index ``p``, a regular file, checked before any shard is opened: its
    ``weight_map`` maps tensor names to file names (strings) directly inside its
    directory, its ``metadata`` (if any) is an object."""
    _stat_regular(p, "a safetensors index")
    with os.fdopen(_open_regular(p, "a safetensors index"), "rb") as f:
        raw = f.read(MAX_INDEX + 1)
    if len(raw) > MAX_INDEX:
        raise SafetensorsError(f"{p}: not a safetensors index (larger than {MAX_INDEX} bytes)")
    index = _parse_json(raw, f"{p}: the index")
    if not isinstance(index, dict):
        raise SafetensorsError(f"{p}: not a safetensors index (not a JSON object: {_json_kind(index)})")
    if "weight_map" not in index:
        raise SafetensorsError(f"{p}: not a safetensors index (no weight_map)")
    weight_map = index["weight_map"]
    if not isinstance(weight_map, dict):
        raise SafetensorsError(f"{p}: weight_map maps tensor names to file names (strings); it is "
                               f"{_json_kind(weight_map)}, not an object")
    for name, file in weight_map.items():
        if not isinstance(name, str) or not isinstance(file, str):
            raise SafetensorsError(f"{p}: weight_map maps tensor names to file names (strings); {name!r} maps to "
                                   f"{_json_kind(file)}")
        if not _plain_file_name(file):
            raise SafetensorsError(f"{p}: the index puts {name!r} in {file!r}, not a file name inside "
                                   f"{p.parent} (shards are named without a directory, '..' or a drive)")
    if not weight_map:
        raise SafetensorsError(f"{p}: the weight_map is empty: the checkpoint holds no tensor")
    if not isinstance(index.get("metadata", {}), dict):
        raise SafetensorsError(f"{p}: the index's metadata must be a JSON object, got "
                               f"{_json_kind(index['metadata'])}")
    return index


def _checkpoint_files(paths: Union[PathLike, Iterable[PathLike]]) -> Tuple[List[Path], Optional[Dict[str, Any]]]:
    """The ``.safetensors`` files of ``paths`` (files, directories, or a sharded
    checkpoint's index) and the index (``None`` without one). A directory holding an
    index is read through it. Every file is checked, none opened (only the index is
    read): a regular file (after symbolic links), and a shard found in a directory or
    named by an index is named directly inside that directory."""
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not given:
        raise SafetensorsError("no checkpoint path given (pass a .safetensors file, a directory or an index)")
    files: List[Path] = []
    index: Optional[Dict[str, Any]] = None
    for p in map(Path, given):
        try:
            mode = os.stat(p).st_mode
        except (OSError, ValueError):
            blocker = _not_a_directory(p.parent)
            raise SafetensorsError(f"{p}: no such file or directory" +
                                   (f" ({blocker} is a regular file, not a directory)" if blocker else "")) from None
        if stat.S_ISDIR(mode) and os.path.lexists(p / INDEX_NAME):
            p = p / INDEX_NAME
        if p.name.endswith(".index.json"):
            index = _read_index(p)
            files.extend(_shard_in(p.parent, p.parent / name) for name in sorted(set(index["weight_map"].values())))
            index["_dir"] = str(p.parent)
        elif stat.S_ISDIR(mode):
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise SafetensorsError(f"{p}: the directory holds no .safetensors file")
            files.extend(_shard_in(p, f) for f in found)
        elif stat.S_ISREG(mode):
            files.append(p)
        else:
            raise SafetensorsError(f"{p}: is {_file_kind(mode)}, not a regular file or a directory")
    return files, index


def import_safetensors(
    store: Any,
    paths: Union[PathLike, Iterable[PathLike]],
    *,
    resource_id: str,
    revision: str,
    weight_generation: int,
    names: Optional[Iterable[str]] = None,
    fingerprint: str = SAFETENSORS_FINGERPRINT,
    **save_kw: Any,
) -> StoredManifest:
    """Writes revision ``revision`` of ``resource_id`` from a ``.safetensors`` file, a
    sharded Hugging Face checkpoint (its directory, or its
    ``model.safetensors.index.json``: every shard named by the index's weight map,
    and every tensor checked to be in the shard the index names), or a list of files.

    Only regular files are read: every path (given, found in a directory, named by
    the index) is checked before any shard is opened, and each is opened without
    blocking and checked again on the open descriptor, so a FIFO, device or socket
    is refused (never read, never waited on). A shard found in a directory or named
    by an index is named directly inside that directory: the index's weight map must
    map tensor names to plain file names (a ``../`` or absolute name is refused when
    the index is read, before any shard is opened); a symbolic link placed there may
    point elsewhere (a Hugging Face cache snapshot links its shards into ``blobs/``). A checkpoint (or
    a ``names`` selection) that holds no tensor is refused before anything is
    written: ``__metadata__`` alone is no revision. Every malformed input raises
    :class:`SafetensorsError` naming the file (a non-string dtype, a ``__metadata__``
    that is not an object of strings, JSON nested too deeply, ...).

    Every tensor is stored whole (one fragment), read in place from the memory-mapped
    files (never copied in Python, never the model twice in memory); restore it into
    any layout with :func:`~mooncake_weight_store.state_dict.load_state_dict`. A 0-d
    tensor keeps its shape ``()``. The files' ``__metadata__`` is kept in the revision
    (as the tensor ``__metadata__``) for :func:`export_safetensors`. ``names`` selects
    tensors (default: all). A name in two files is an error. Further keywords go to
    :func:`~mooncake_weight_store.state_dict.save_state_dict` (``namespace``,
    ``created_at``, ...). Returns the committed manifest."""
    files, index = _checkpoint_files(paths)
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
        if index is not None:
            for name, file in index["weight_map"].items():
                if name not in where:
                    raise SafetensorsError(f"the index names {name!r} in {file}, which does not hold it")
                if where[name].name != file:
                    raise SafetensorsError(f"the index names {name!r} in {file}, it is in {where[name].name}")
        wanted = set(names) if names is not None else None
        if wanted is not None:
            missing = sorted(wanted - set(where))
            if missing:
                raise SafetensorsError(f"not in the files: {', '.join(missing)}")
        if not any(wanted is None or name in wanted for name in where):
            what = (f"{Path(index['_dir']) / INDEX_NAME}" if index is not None
                    else ", ".join(map(str, files[:3])) + (f" and {len(files) - 3} more" if len(files) > 3 else ""))
            if wanted is not None and where:
                raise SafetensorsError(f"{what}: the selection names=[] holds no tensor (nothing to import as "
                                       f"revision {revision!r} of {resource_id!r})")
            raise SafetensorsError(f"{what}: the checkpoint holds no tensor (nothing to import as revision "
                                   f"{revision!r} of {resource_id!r}; __metadata__ alone is not a revision)")
        for sf in opened:
            for name in sf.tensors:
                if wanted is None or name in wanted:
                    views[name] = sf.view(name)
        meta = {"metadata": _common_metadata([sf.metadata for sf in opened]),
                "files": {sf.path.name: sf.metadata for sf in opened}}
        if index is not None:
            meta["index_metadata"] = index.get("metadata", {})
        state_dict: Dict[str, object] = dict(views)
        if any(sf.metadata for sf in opened) or index is not None:
            import numpy as np

            try:
                kept = json.dumps(meta, sort_keys=True).encode("utf-8")
            except RecursionError:
                raise SafetensorsError(f"{index['_dir'] if index is not None else files[0]}: the metadata is "
                                       "nested too deeply to keep") from None
            state_dict[METADATA_TENSOR] = np.frombuffer(kept, dtype=np.uint8).copy()
        fingerprints = {METADATA_TENSOR: METADATA_FINGERPRINT} if METADATA_TENSOR in state_dict else None
        return save_state_dict(store, state_dict, resource_id=resource_id, revision=revision,
                               weight_generation=weight_generation, fingerprint=fingerprint,
                               fingerprints=fingerprints, **save_kw)
    finally:
        for v in views.values():
            v.release()
        for sf in opened:
            sf.close()


def _common_metadata(maps: Sequence[Mapping[str, str]]) -> Dict[str, str]:
    """The metadata entries every file has with the same value."""
    if not maps:
        return {}
    common = dict(maps[0])
    for m in maps[1:]:
        common = {k: v for k, v in common.items() if m.get(k) == v}
    return common


@dataclass(frozen=True, eq=False)
class Layout:
    """One rank's shard: its :class:`~mooncake_weight_store.state_dict.Parallel`
    coordinates and the ``sharding`` (as for ``load_state_dict``)."""

    parallel: Parallel = Parallel()
    sharding: Sharding = None


#: The safetensors package's data order: by dtype (this rank first), then by name.
_SAFETENSORS_DTYPE_RANK = {code: i for i, code in enumerate(
    ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
     "F64", "I64", "U64"])}


def _temporary(path: Path) -> Path:
    """A hidden temporary name next to ``path`` (same directory, so a rename moves it
    into place atomically)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def _remove(paths: Iterable[Path]) -> None:
    """Removes what exists of ``paths`` (temporaries of a failed export)."""
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _fsync_dir(d: Path) -> None:
    """Makes the renames in directory ``d`` durable where the platform can."""
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - a file system without directory fsync
        pass
    finally:
        os.close(fd)


def _write_safetensors(store: Any, manifest: StoredManifest, tmp: Path, wanted: Sequence[str],
                       stored: Mapping[str, Mapping[str, Any]], lay: "Layout",
                       metadata: Optional[Mapping[str, str]]) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """Writes ``wanted`` of the revision to the new file ``tmp`` (a temporary name:
    the caller renames it into place) as the safetensors package does (data ordered
    by dtype, then name, so every tensor sits at a multiple of its item size; the
    header padded with spaces to 8 bytes), synced to disk; returns name -> (code,
    shape). The caller removes ``tmp`` when this raises."""
    items = []
    for n in wanted:
        d = stored[n]
        info = DTYPES.get(d["dtype"])
        if info is None or info.safetensors is None:
            raise SafetensorsError(f"tensor {n!r}: dtype {d['dtype']!r} has no safetensors code")
        _, local = _box_from_global(n, resolve_shard(lay.sharding, n), tuple(d["global_shape"]),
                                    lay.parallel.sizes, lay.parallel.rank)
        shape = () if is_scalar(d) and local == (1,) else local
        items.append((n, info, local, shape))
    items.sort(key=lambda it: (-_SAFETENSORS_DTYPE_RANK.get(it[1].safetensors or "", -1), it[0]))
    header: Dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    offset = 0
    entries: Dict[str, Any] = {}
    for n, info, local, shape in items:
        nbytes = math.prod(local) * info.itemsize
        entries[n] = {"dtype": info.safetensors, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header.update(entries)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    data_start = 8 + len(raw)
    total = data_start + offset
    with open(tmp, "xb+") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(total)
        f.flush()
        if offset:
            mm = mmap.mmap(f.fileno(), total, access=mmap.ACCESS_WRITE)
            ref = BufferRef(mm, writable=True)
            views: Dict[str, TensorView] = {}
            try:
                for n, _, local, _ in items:
                    views[n] = TensorView(address=ref.address + data_start + entries[n]["data_offsets"][0],
                                          shape=local, dtype=stored[n]["dtype"], readonly=False,
                                          source="safetensors")
                load_state_dict(store, manifest, into=views, sharding=lay.sharding, parallel=lay.parallel)
                mm.flush()
            finally:
                for v in views.values():
                    v.release()
                ref.release()
                mm.close()
        os.fsync(f.fileno())
    return {n: (entries[n]["dtype"], tuple(entries[n]["shape"])) for n, _, _, _ in items}


def _indexed_shards(directory: Path) -> Set[str]:
    """The shards the index in ``directory`` names (none when there is no readable
    index): plain ``.safetensors`` file names inside ``directory``, never a path."""
    try:
        weight_map = _read_index(directory / INDEX_NAME)["weight_map"]
    except SafetensorsError:
        return set()
    return {f for f in weight_map.values() if f.endswith(".safetensors")}


def _object(v: Any) -> Mapping[str, Any]:
    """``v`` when it is a JSON object, else an empty one."""
    return v if isinstance(v, dict) else {}


def _stored_metadata(store: Any, manifest: StoredManifest, stored: Mapping[str, Any]) -> Dict[str, Any]:
    """The checkpoint metadata an import kept in the revision (empty when none)."""
    if METADATA_TENSOR not in stored:
        return {}
    got = load_state_dict(store, manifest, names=[METADATA_TENSOR])[METADATA_TENSOR]
    try:
        meta = json.loads(bytes(got).decode("utf-8"))
        return meta if isinstance(meta, dict) else {}
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}


def _not_a_directory(p: Path) -> Optional[Path]:
    """``p`` or its nearest existing ancestor when that is not a directory."""
    for q in (p, *p.parents):
        if q.exists():
            return None if q.is_dir() else q
    return None


def _export_dir_error(given: Path, directory: Path, what: str) -> SafetensorsError:
    """Why ``directory`` cannot be the directory an export to ``given`` needs; the
    message starts with ``given``, the path the caller passed."""
    blocker = _not_a_directory(directory)
    where = "it" if directory == given else f"the directory {directory}"
    if blocker == directory:
        why = f"{where} is a regular file, not a directory"
    elif blocker is not None:
        why = f"{where} cannot exist: {blocker} is a regular file, not a directory"
    else:
        why = f"{where} does not exist (create it first)"
    return SafetensorsError(f"{given}: {why}; {what}")


def export_safetensors(
    store: Any,
    key: RevisionKey,
    path: PathLike,
    *,
    resource_id: Optional[str] = None,
    namespace: Optional[str] = None,
    layout: Optional[Layout] = None,
    names: Optional[Iterable[str]] = None,
    metadata: Optional[Mapping[str, str]] = None,
    max_shard_bytes: Optional[int] = None,
) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """Writes the revision ``key`` names (``names``: a subset) as safetensors:
    whole tensors, or with ``layout`` one rank's shards, written as the safetensors
    package writes them (data ordered by dtype then name, each tensor aligned to its
    item size; 0-d tensors with shape ``()``). ``metadata`` is the file's
    ``__metadata__`` (default: what :func:`import_safetensors` kept, if anything).

    ``path`` names a ``.safetensors`` file, or, with ``max_shard_bytes`` (or when
    ``path`` is a directory), a sharded Hugging Face checkpoint: the directory gets
    ``model-0000K-of-0000N.safetensors`` shards of at most ``max_shard_bytes`` of data
    each (a larger tensor gets a shard of its own) and ``model.safetensors.index.json``
    (``metadata.total_size`` and the ``weight_map``). One file is written at a time,
    from the store straight into the memory-mapped file (never the model twice in
    memory), each to a hidden temporary name in the same directory and synced. A
    single file is then renamed into place. A sharded export renames its files into
    place only once every shard and the index are written (the index last; the
    directory is synced): when any step fails, the temporaries are removed and an
    earlier export in the directory is left as it was, never a mix of two revisions
    (the directory needs room for both until then). After a successful sharded
    export, the shards the previous index named that the new one does not (regular
    ``.safetensors`` files of that directory) are removed. Returns name ->
    (safetensors dtype code, shape).

    ``key`` is what :func:`~mooncake_weight_store.state_dict.load_state_dict` takes:
    a manifest key, a :class:`~mooncake_weight_store.revisions.RevisionInfo`, a
    :class:`StoredManifest`, or ``"latest"`` with ``resource_id=`` (and
    ``namespace=``). A missing directory (the file's, or a sharded export's) is not
    created, and a regular file where a directory belongs is refused; both raise
    :class:`SafetensorsError` naming ``path`` before anything is read."""
    path = Path(path)
    lay = layout or Layout()
    if max_shard_bytes is not None or path.is_dir():
        if not path.is_dir():
            raise _export_dir_error(path, path, "a sharded export writes its shards into an existing directory")
    elif not path.parent.is_dir():
        raise _export_dir_error(path, path.parent, "the exported file is written there")
    manifest, own = _open_revision(store, key, _manifest_key(store, key, resource_id, namespace))
    try:
        stored = {t["tensor_id"]: t for t in manifest.wire()["tensors"]}
        wanted = sorted((n for n in stored if n != METADATA_TENSOR) if names is None else set(names))
        unknown = [n for n in wanted if n not in stored]
        if unknown:
            raise StateDictError(f"not in the revision: {', '.join(unknown)}")
        kept = _stored_metadata(store, manifest, stored) if metadata is None else {}
        meta = dict(metadata) if metadata is not None else dict(_object(kept.get("metadata")))
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise SafetensorsError("metadata must map strings to strings")
        sharded = max_shard_bytes is not None or path.is_dir()
        if not sharded:
            tmp = _temporary(path)
            try:
                out = _write_safetensors(store, manifest, tmp, wanted, stored, lay, meta)
                os.replace(tmp, path)
            finally:
                _remove([tmp])
            _fsync_dir(path.parent)
            return out
        limit = max_shard_bytes if max_shard_bytes is not None else 5 << 30
        if limit <= 0:
            raise SafetensorsError(f"max_shard_bytes must be positive, got {limit}")
        sizes = {}
        for n in wanted:
            d = stored[n]
            _, local = _box_from_global(n, resolve_shard(lay.sharding, n), tuple(d["global_shape"]),
                                        lay.parallel.sizes, lay.parallel.rank)
            sizes[n] = math.prod(local) * DTYPES[d["dtype"]].itemsize
        shards: List[List[str]] = [[]]
        used = 0
        for n in wanted:
            if shards[-1] and used + sizes[n] > limit:
                shards.append([])
                used = 0
            shards[-1].append(n)
            used += sizes[n]
        names_out = [f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)]
        for final in [path / n for n in names_out] + [path / INDEX_NAME]:
            if final.is_dir():  # a rename onto it would fail half way through
                raise SafetensorsError(f"{final}: is a directory; the sharded export to {path} writes a file there")
        previous = _indexed_shards(path)  # read before anything is written
        out: Dict[str, Tuple[str, Tuple[int, ...]]] = {}
        weight_map: Dict[str, str] = {}
        renames: List[Tuple[Path, Path]] = []
        try:
            # Every shard, then the index, under a temporary name; renamed into place
            # (the index last) only once all are written: a failure leaves the earlier
            # export as it was.
            for name, group in zip(names_out, shards):
                renames.append((_temporary(path / name), path / name))
                out.update(_write_safetensors(store, manifest, renames[-1][0], group, stored, lay, meta))
                weight_map.update({n: name for n in group})
            index_meta = dict(_object(kept.get("index_metadata")))
            index_meta["total_size"] = sum(sizes.values())
            index = {"metadata": index_meta, "weight_map": dict(sorted(weight_map.items()))}
            renames.append((_temporary(path / INDEX_NAME), path / INDEX_NAME))
            with open(renames[-1][0], "x", encoding="utf-8") as f:
                f.write(json.dumps(index, indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            for tmp, final in renames:
                os.replace(tmp, final)
        finally:
            _remove(tmp for tmp, _ in renames)
        _fsync_dir(path)
        stale = sorted(previous - set(weight_map.values()))
        for name in stale:  # shards of the earlier export that the new index does not name
            try:
                if stat.S_ISREG(os.lstat(path / name).st_mode):
                    (path / name).unlink()
            except OSError:  # pragma: no cover - left behind, but no index names it
                pass
        if stale:
            _fsync_dir(path)
        return out
    finally:
        if own:
            manifest.close()
