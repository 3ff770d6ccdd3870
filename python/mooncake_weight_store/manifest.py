"""Stored manifests: the published description of one weight revision."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import List, Optional, Tuple, TypedDict, Union, cast

from .errors import ArgumentError, OutOfRangeError
from . import _abi
from ._lib import LIB, OwnedHandle, call

__all__ = ["StoredFragment", "StoredManifest", "ManifestWire", "TensorWire", "FragmentWire", "AxisWire"]


# -- the stored manifest JSON (`wire-format.md` §4.1), as ``json.loads`` returns it ----


class _AxisRequired(TypedDict):
    kind: str
    semantics: str


class AxisWire(_AxisRequired, total=False):
    """One parallel axis of a tensor: ``kind`` (``dp``/``pp``/``ep``/``tp``),
    ``semantics`` (``split``/``replicated``/``ownership``), ``dim`` (split only)."""

    dim: int


class TensorWire(TypedDict):
    """One tensor descriptor of a stored manifest."""

    tensor_id: str
    dtype: str
    itemsize: int
    global_shape: List[int]
    layout_fingerprint: str
    parallel_axes: List[AxisWire]
    shard_dims: List[int]
    layer_id: Optional[int]
    expert_id: Optional[int]


class FragmentWire(TypedDict):
    """One stored fragment of a stored manifest."""

    fragment_id: str
    tensor_id: str
    global_offset: List[int]
    local_shape: List[int]
    nbytes: int
    object_key: str
    object_offset: int
    aliases: List[str]


class ManifestWire(TypedDict):
    """A stored manifest's JSON document (:meth:`StoredManifest.wire`)."""

    namespace: str
    resource_id: str
    resource_kind: str
    revision: str
    weight_generation: int
    group_id: str
    manifest_key: str
    created_at: str
    tensors: List[TensorWire]
    fragments: List[FragmentWire]


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
    """An immutable stored manifest (``mws_stored_manifest``): the published
    description of one committed revision.

    Obtained from :meth:`Store.load_manifest`, :meth:`Store.commit`,
    :meth:`Writer.commit` or :meth:`from_json`. It owns its handle: free it with
    :meth:`close` or a ``with`` block (or let it be collected); a closed manifest
    raises :class:`~mooncake_weight_store.errors.ArgumentError` from every accessor.
    Thread-safe: every accessor may run on several threads at once. Accessors raise
    :class:`~mooncake_weight_store.errors.MwsError` subclasses only (a closed handle,
    an index out of range).
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

    def wire(self) -> ManifestWire:
        """The manifest's JSON document, decoded (a new dict on every call)."""
        return cast(ManifestWire, json.loads(self.to_json()))

    @property
    def digest(self) -> str:
        """``manifest_digest``: SHA-256 of the manifest JSON (64 lowercase hex)."""
        return self._s("mws_stored_manifest_digest")

    @property
    def key(self) -> str:
        """The key the manifest is stored at (what :meth:`Store.load_manifest` takes)."""
        return self._s("mws_stored_manifest_key")

    @property
    def group_id(self) -> str:
        """The group id of the revision (``<prefix>/<ns>/<resource>/<revision>/<generation>``)."""
        return self._s("mws_stored_manifest_group_id")

    @property
    def namespace(self) -> str:
        """The store namespace of the revision."""
        return self._s("mws_stored_manifest_namespace")

    @property
    def resource_id(self) -> str:
        """The resource id (the model)."""
        return self._s("mws_stored_manifest_resource_id")

    @property
    def revision(self) -> str:
        """The revision name."""
        return self._s("mws_stored_manifest_revision")

    @property
    def weight_generation(self) -> int:
        """The weight generation."""
        return int(LIB.fn("mws_stored_manifest_weight_generation")(self))

    @property
    def tensor_count(self) -> int:
        """Number of tensors."""
        return int(LIB.fn("mws_stored_manifest_tensor_count")(self))

    @property
    def fragment_count(self) -> int:
        """Number of stored fragments."""
        return int(LIB.fn("mws_stored_manifest_fragment_count")(self))

    @property
    def total_bytes(self) -> int:
        """Sum of the stored fragments' sizes in bytes."""
        return int(LIB.fn("mws_stored_manifest_total_bytes")(self))

    def fragment(self, index: int) -> StoredFragment:
        """Stored fragment ``index`` (manifest order). Raises
        :class:`~mooncake_weight_store.errors.OutOfRangeError` for a negative index,
        :class:`~mooncake_weight_store.errors.InvalidArgumentError` past the end."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise ArgumentError("index must be an int")
        if index < 0:
            raise OutOfRangeError(f"fragment index {index} is out of range")
        info = _abi.mws_stored_fragment_info()
        call("mws_stored_manifest_fragment", self, index, ctypes.byref(info))
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
        """Every stored fragment, in manifest order."""
        return [self.fragment(i) for i in range(self.fragment_count)]

    @property
    def object_keys(self) -> List[str]:
        """The distinct object keys holding the revision's bytes, sorted."""
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
