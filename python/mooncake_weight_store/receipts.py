"""Upload receipts: proof that stored fragments were written and are visible."""

from __future__ import annotations

import ctypes
import json
from typing import TYPE_CHECKING, Iterable, List, TypedDict, Union, cast

from . import _lib
from ._lib import LIB, OwnedHandle, borrowed_str, call

if TYPE_CHECKING:  # pragma: no cover
    from .upload_plan import UploadPlan

__all__ = ["Receipts", "ReceiptWire"]


class _ReceiptRequired(TypedDict):
    fragment_id: str
    object_key: str
    worker_id: str


class ReceiptWire(_ReceiptRequired, total=False):
    """One receipt as :meth:`Receipts.items` returns it; ``block_crc32c`` (the
    CRC-32C of each 1 MiB block, 8 hex digits each) when the upload computed it."""

    block_crc32c: str


class Receipts(OwnedHandle):
    """An immutable receipt list (``mws_receipts``); thread-safe.

    Returned by :meth:`Store.upload` and :meth:`Writer.write_tensor`; JSON-transportable
    between the processes of a job (:meth:`to_json` / :meth:`from_json`).
    """

    _FREE = "mws_receipts_free"
    _WHAT = "receipts"

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "Receipts":
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out = ctypes.c_void_p()
        call("mws_receipts_from_json", data, len(data), ctypes.byref(out))
        return cls(out.value)

    @classmethod
    def concat(cls, parts: Iterable["Receipts"]) -> "Receipts":
        items = list(parts)
        arr = _lib.handle_array(items)
        out = ctypes.c_void_p()
        call("mws_receipts_concat", arr, len(items), ctypes.byref(out))
        return cls(out.value)

    @classmethod
    def for_plan(cls, plan: "UploadPlan") -> "Receipts":
        """The receipts of every operation of ``plan`` (to retry a commit after a
        coordinator crash)."""
        out = ctypes.c_void_p()
        call("mws_receipts_from_plan", plan, ctypes.byref(out))
        return cls(out.value)

    def to_json(self) -> str:
        return borrowed_str("mws_receipts_to_json", self)

    def items(self) -> List[ReceiptWire]:
        """The receipts as dicts (``fragment_id``, ``object_key``, ``worker_id``)."""
        doc = json.loads(self.to_json())
        return cast(List[ReceiptWire], list(doc["receipts"]) if isinstance(doc, dict) else list(doc))

    def __len__(self) -> int:
        return int(LIB.fn("mws_receipts_count")(self))


    def __repr__(self) -> str:
        return "Receipts(<closed>)" if self._h is None else f"Receipts({len(self)})"
