"""Stored manifests: the published description of one weight revision."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple, Union

from .errors import ArgumentError, OutOfRangeError
from . import _lib
from ._lib import LIB, OwnedHandle, call

__all__ = ["StoredFragment", "StoredManifest"]


@dataclass(frozen=True)
class StoredFragment:
    """One stored fragment (``mws_stored_fragment_info``)."""

    fragment_id: str
    tensor_id: str
    object_key: str
    object_offset: int
    nbytes: int
    global_offset: Tuple[int, ...]
    local_shape: Tuple[int, ...]


class StoredManifest(OwnedHandle):
    """An immutable stored manifest (``mws_stored_manifest``); thread-safe.

    Obtained from :meth:`Store.load_manifest`, :meth:`Store.commit`,
    :meth:`Writer.commit` or :meth:`from_json`.
    """

    _FREE = "mws_stored_manifest_free"
    _WHAT = "stored manifest"

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "StoredManifest":
        """Strictly decodes and validates manifest JSON (``wire-format.md`` §4.1)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out = ctypes.c_void_p()
        call("mws_stored_manifest_from_json", data, len(data), ctypes.byref(out))
        return cls(out.value)

    def to_json(self) -> str:
        """The manifest's exact JSON bytes (Profile U), as stored."""
        return self._s("mws_stored_manifest_to_json")

    def wire(self) -> Dict[str, Any]:
        return json.loads(self.to_json())

    digest = property(lambda self: self._s("mws_stored_manifest_digest"), doc="manifest_digest (hex64)")
    key = property(lambda self: self._s("mws_stored_manifest_key"), doc="the manifest key")
    group_id = property(lambda self: self._s("mws_stored_manifest_group_id"))
    namespace = property(lambda self: self._s("mws_stored_manifest_namespace"))
    resource_id = property(lambda self: self._s("mws_stored_manifest_resource_id"))
    revision = property(lambda self: self._s("mws_stored_manifest_revision"))

    @property
    def weight_generation(self) -> int:
        return int(LIB.fn("mws_stored_manifest_weight_generation")(self.handle))

    @property
    def tensor_count(self) -> int:
        return int(LIB.fn("mws_stored_manifest_tensor_count")(self.handle))

    @property
    def fragment_count(self) -> int:
        return int(LIB.fn("mws_stored_manifest_fragment_count")(self.handle))

    @property
    def total_bytes(self) -> int:
        return int(LIB.fn("mws_stored_manifest_total_bytes")(self.handle))

    def fragment(self, index: int) -> StoredFragment:
        if isinstance(index, bool) or not isinstance(index, int):
            raise ArgumentError("index must be an int")
        if index < 0:
            raise OutOfRangeError(index)
        info = _lib.mws_stored_fragment_info()
        call("mws_stored_manifest_fragment", self.handle, index, ctypes.byref(info))
        nd = info.ndim
        return StoredFragment(
            fragment_id=info.fragment_id.decode("utf-8"),
            tensor_id=info.tensor_id.decode("utf-8"),
            object_key=info.object_key.decode("utf-8"),
            object_offset=int(info.object_offset),
            nbytes=int(info.nbytes),
            global_offset=tuple(info.global_offset[k] for k in range(nd)),
            local_shape=tuple(info.local_shape[k] for k in range(nd)),
        )

    def fragments(self) -> List[StoredFragment]:
        return [self.fragment(i) for i in range(self.fragment_count)]

    @property
    def object_keys(self) -> List[str]:
        return sorted({f.object_key for f in self.fragments()})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredManifest):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        if self._h is None:
            return "StoredManifest(<closed>)"
        return f"StoredManifest({self.key!r}, fragments={self.fragment_count}, bytes={self.total_bytes})"
