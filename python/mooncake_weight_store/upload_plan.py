"""Upload planning: placement + bindings -> stored manifest, keys, copy operations."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import List, Optional, Sequence, cast

from . import _abi, _lib
from ._lib import LIB, OwnedHandle, call, cstr
from .binding import Binding
from .manifest import ManifestWire
from .placement import Placement

__all__ = ["UploadOperation", "UploadPlan", "plan_upload"]


@dataclass(frozen=True)
class UploadOperation:
    """One copy of a runtime fragment into one stored object."""

    source_participant_id: str
    source_instance_id: str
    source_lease_id: str
    source_lease_generation: int
    source_fragment_id: str
    source_worker_id: str
    source_placement_fragment_id: str
    target_fragment_id: str
    object_key: str
    nbytes: int


class UploadPlan(OwnedHandle):
    """An immutable upload plan (``mws_upload_plan``); thread-safe."""

    _FREE = "mws_upload_plan_free"
    _WHAT = "upload plan"

    def __init__(self, handle: Optional[int]) -> None:
        super().__init__(handle)
        self._ops: Optional[List[UploadOperation]] = None

    @property
    def manifest_json(self) -> str:
        """The stored manifest JSON: the exact bytes stored at the manifest key."""
        return self._s("mws_upload_plan_manifest_json")

    @property
    def manifest_digest(self) -> str:
        """The manifest digest (SHA-256 hex of :attr:`manifest_json`)."""
        return self._s("mws_upload_plan_manifest_digest")

    @property
    def manifest_key(self) -> str:
        """The key the manifest is published at."""
        return self._s("mws_upload_plan_manifest_key")

    @property
    def group_id(self) -> str:
        """The group id of the revision (``<prefix>/<ns>/<resource>/<revision>/<generation>``)."""
        return self._s("mws_upload_plan_group_id")

    @property
    def control_key(self) -> str:
        """The key of the transaction's decision record."""
        return self._s("mws_upload_plan_control_key")

    @property
    def transaction_group_id(self) -> str:
        """The group id of the transaction (``<group>/transactions/<id>``)."""
        return self._s("mws_upload_plan_transaction_group_id")

    @property
    def transaction_id(self) -> str:
        """The transaction id (32 hex)."""
        return self._s("mws_upload_plan_transaction_id")

    @property
    def source_placement_id(self) -> str:
        """``placement_id`` of the placement the plan was made from."""
        return self._s("mws_upload_plan_source_placement_id")

    @property
    def source_placement_digest(self) -> str:
        """``digest`` of the placement the plan was made from."""
        return self._s("mws_upload_plan_source_placement_digest")

    @property
    def commit_record(self) -> str:
        """The decision record a commit of this plan writes."""
        return self._s("mws_upload_plan_commit_record")

    def to_json(self) -> str:
        """Transport JSON of the plan, for the processes of one job (it holds the
        source buffer addresses: never store it)."""
        return self._s("mws_upload_plan_to_json")

    @classmethod
    def from_json(cls, text: "str | bytes") -> "UploadPlan":
        """Decodes and re-validates a plan sent by :meth:`to_json`."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out = ctypes.c_void_p()
        call("mws_upload_plan_from_json", data, len(data), ctypes.byref(out))
        return cls(out.value)

    def manifest(self) -> ManifestWire:
        """The stored manifest the plan publishes, decoded (a new dict on every call)."""
        return cast(ManifestWire, json.loads(self.manifest_json))

    def operations(self) -> List[UploadOperation]:
        """The copy operations, in plan order."""
        if self._ops is None:
            n = int(LIB.fn("mws_upload_plan_operation_count")(self))
            ops = []
            for i in range(n):
                o = _abi.mws_upload_operation()
                call("mws_upload_plan_operation", self, i, ctypes.byref(o))
                d = lambda b: b.decode("utf-8")  # noqa: E731
                ops.append(
                    UploadOperation(
                        d(o.source_participant_id), d(o.source_instance_id), d(o.source_lease_id),
                        int(o.source_lease_generation), d(o.source_fragment_id), d(o.source_worker_id),
                        d(o.source_placement_fragment_id), d(o.target_fragment_id), d(o.object_key),
                        int(o.nbytes),
                    )
                )
            self._ops = ops
        return list(self._ops)

    def source_fragment_ids(self, participant_id: str, worker_id: Optional[str] = None) -> List[str]:
        """The runtime fragment ids an upload of ``participant_id`` (one worker of it
        when given) reads: what a source registration lease must cover."""
        return sorted({o.source_fragment_id for o in self.operations()
                       if o.source_participant_id == participant_id
                       and (worker_id is None or o.source_worker_id == worker_id)})

    @property
    def payload_keys(self) -> List[str]:
        return [o.object_key for o in self.operations()]

    def __len__(self) -> int:
        return int(LIB.fn("mws_upload_plan_operation_count")(self))

    def __repr__(self) -> str:
        if self._h is None:
            return "UploadPlan(<closed>)"
        return f"UploadPlan({self.manifest_key!r}, tx={self.transaction_id}, ops={len(self)})"


def plan_upload(
    placement: Placement,
    bindings: Sequence[Binding],
    *,
    namespace: Optional[str] = None,
    key_prefix: Optional[str] = None,
    transaction_id: Optional[str] = None,
    created_at: Optional[str] = None,
) -> UploadPlan:
    """Plans an upload (pure: no I/O, no buffer is read). Raises
    :class:`InvalidBindingError` / :class:`InvalidArgumentError`."""
    hs = _lib.handle_array(bindings)
    opts = _abi.mws_upload_options(
        store_namespace=cstr(namespace, "namespace"),
        key_prefix=cstr(key_prefix, "key_prefix"),
        transaction_id=cstr(transaction_id, "transaction_id"),
        created_at=cstr(created_at, "created_at"),
    )
    out = ctypes.c_void_p()
    call("mws_upload_plan_new", placement, hs, len(bindings), ctypes.byref(opts), ctypes.byref(out))
    return UploadPlan(out.value)
