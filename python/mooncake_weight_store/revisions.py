"""The committed revisions of a resource (``mws_revision_list``), read through
:meth:`Store.revisions <mooncake_weight_store.store.Store.revisions>` and
:meth:`Store.latest <mooncake_weight_store.store.Store.latest>`.

A revision is committed once its manifest is published at
``<key_prefix>/<namespace>/<resource_id>/<revision>/<generation>/manifest`` (segments
percent-encoded); the library finds those keys by listing the store, so no caller
builds a key by hand. The *newest* revision has the highest weight generation; among
equal generations the latest ``created_at`` wins, then the greatest revision name
(code-point order). Lists are ordered oldest first by that same rule.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, List, Optional

from . import _abi
from ._lib import LIB, OwnedHandle, call, cstr

__all__ = ["RevisionInfo", "DEFAULT_NAMESPACE"]

#: The namespace uploads use when none is given (``save_state_dict``, ``plan_upload``).
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class RevisionInfo:
    """One committed revision of a resource (``mws_revision_info``): an immutable
    value that owns nothing, safe to share between threads and to pickle.

    Pass it (or its :attr:`manifest_key`) to
    :func:`~mooncake_weight_store.state_dict.load_state_dict`,
    :func:`~mooncake_weight_store.safetensors_io.export_safetensors` or
    :meth:`Store.load_manifest <mooncake_weight_store.store.Store.load_manifest>`.
    """

    #: store namespace
    namespace: str
    #: resource id (the model)
    resource_id: str
    #: revision name
    revision: str
    #: weight generation
    weight_generation: int
    #: key of the published manifest
    manifest_key: str
    #: ``manifest_digest`` of the manifest (64 lowercase hex)
    manifest_digest: str
    #: the manifest's ``created_at``: when the upload was planned (UTC
    #: ``YYYY-MM-DDTHH:MM:SSZ`` from this library's planner; the store keeps no
    #: commit time, the commit follows this one)
    created_at: str


def _decode(raw: Optional[bytes]) -> str:
    return raw.decode("utf-8") if raw else ""


class _RevisionList(OwnedHandle):
    """An ``mws_revision_list`` while it is copied out (never handed to callers)."""

    _FREE = "mws_revision_list_free"
    _WHAT = "revision list"

    def items(self, namespace: str, resource_id: str) -> List[RevisionInfo]:
        items: List[RevisionInfo] = []
        for i in range(int(LIB.fn("mws_revision_list_count")(self))):
            info = _abi.mws_revision_info()
            call("mws_revision_list_get", self, i, ctypes.byref(info))
            items.append(RevisionInfo(namespace=namespace, resource_id=resource_id, revision=_decode(info.revision),
                                      weight_generation=int(info.weight_generation),
                                      manifest_key=_decode(info.manifest_key),
                                      manifest_digest=_decode(info.manifest_digest),
                                      created_at=_decode(info.created_at)))
        return items


def read_revisions(store_handle: Any, resource_id: str, namespace: Optional[str], latest: bool) -> List[RevisionInfo]:
    """Calls ``mws_revision_list_from_store`` (``latest``: ``_latest_from_store``)
    and copies the list out (the list handle is freed before returning)."""
    ns = DEFAULT_NAMESPACE if namespace is None else namespace
    fn = "mws_revision_list_latest_from_store" if latest else "mws_revision_list_from_store"
    out = ctypes.c_void_p()
    call(fn, store_handle, cstr(ns, "namespace"), cstr(resource_id, "resource_id"), ctypes.byref(out))
    with _RevisionList(out.value) as found:
        return found.items(ns, resource_id)
