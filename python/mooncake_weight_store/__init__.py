"""mooncake_weight_store: Python binding (ctypes) of libmooncake_weight_store.

Snapshots sharded LLM weights into an object store and restores them into any other
parallel layout; wire-compatible with Mooncake's ``mooncake-reshard``.

The shared library is found through ``MWS_LIBRARY`` (file or directory),
``MWS_PREFIX`` (a CMake install prefix), a repository's ``target/release``, or the
system loader; see :mod:`mooncake_weight_store._lib`.
"""

from ._lib import library_path, version
from .binding import Binding, MemoryKind
from .buffers import BufferRef, HostBuffer
from .errors import *  # noqa: F401,F403
from .errors import MwsError, Status
from .placement import (
    FragmentInfo,
    Ownership,
    Placement,
    PlacementBuilder,
    Rank,
    Replicated,
    Split,
    TensorSpec,
    canonical_json,
)
from .load import LoadPlan, LoadStats, PlanningLimits
from .manifest import StoredFragment, StoredManifest
from .receipts import Receipts
from .store import (Decision, DictBackend, Guard, LeaseSide, PutItem, RangeItem, RecordType, RegistrationLease, Store,
                    TerminalState)
from .transaction import Transaction
from .upload_plan import UploadOperation, UploadPlan, plan_upload
from .transfer import Loader, Sink, TransferEngine, TransferPlan, TransferStats
from .writer import Writer

__version__ = "0.1.0"

__all__ = [
    "library_path",
    "version",
    "Binding",
    "MemoryKind",
    "BufferRef",
    "HostBuffer",
    "MwsError",
    "Status",
    "FragmentInfo",
    "Ownership",
    "Placement",
    "PlacementBuilder",
    "Rank",
    "Replicated",
    "Split",
    "TensorSpec",
    "canonical_json",
    "DictBackend",
    "PutItem",
    "RangeItem",
    "RecordType",
    "Store",
    "UploadOperation",
    "UploadPlan",
    "plan_upload",
    "LoadPlan",
    "LoadStats",
    "PlanningLimits",
    "StoredFragment",
    "StoredManifest",
    "Receipts",
    "Decision",
    "Guard",
    "TerminalState",
    "Transaction",
    "Writer",
    "RegistrationLease",
    "LeaseSide",
    "TransferPlan",
    "TransferEngine",
    "TransferStats",
    "Loader",
    "Sink",
]
