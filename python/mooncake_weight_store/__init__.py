"""mooncake_weight_store: Python binding (ctypes) of libmooncake_weight_store.

Snapshots sharded LLM weights into an object store and restores them into any other
parallel layout; wire-compatible with Mooncake's ``mooncake-reshard``.

The shared library is found through ``MWS_LIBRARY`` (file or directory), inside
this package (the wheel), ``MWS_PREFIX`` (a CMake install prefix), a repository's
``target/release``, or the system loader; see :mod:`mooncake_weight_store._lib`.

For trainers: :func:`save_state_dict` / :func:`load_state_dict` (sharding in TP/PP/
EP/DP terms, multi-rank through an :class:`Exchange`), :func:`import_safetensors` /
:func:`export_safetensors`, :func:`live_state_dict` / :func:`prepare_live_transfer`
(a state dict straight into live transfer, stepped per weight generation), and
:func:`tensor_view` (torch, numpy, DLPack, array interfaces, buffer protocol).
"""

from ._lib import library_path, version
from .binding import Binding, MemoryKind
from .buffers import BufferRef, HostBuffer
from . import errors as _errors
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
from .revisions import RevisionInfo
from .receipts import Receipts
from .store import (Decision, DictBackend, Guard, LeaseSide, PutItem, RangeItem, RecordType, RegistrationLease, Store,
                    TerminalState)
from .transaction import Transaction
from .upload_plan import UploadOperation, UploadPlan, plan_upload
from .transfer import (DeltaOutbox, DeltaPublisher, EngineResources, LeaseRotation, LiveReport, Loader, PreparedInfo,
                       PreparedTransfer, Sink, StepHandle, TargetOutcome, TransferEngine, TransferPlan, TransferStats)
from .notify import NotifyAcceptor, NotifyMismatch, NotifyOutcome, NotifyRouter
from .writer import Writer
from .logs import set_log_callback
from .progress import Progress, ProgressBar
from .tensors import (DTYPES, DType, NonContiguousError, TensorError, TensorView, UnsupportedDeviceError,
                      UnsupportedDTypeError, dtype_name, tensor_view)
from .device import CudaError, DeviceEngine, DeviceUnavailableError, cuda_available
from .exchange import Exchange, ExchangeTimeout, FileExchange, LocalExchange, ThreadExchange, TorchDistributedExchange
from .state_dict import (COLWISE, LATEST, REPLICATED, ROWWISE, Parallel, Shard, StateDictError, load_state_dict,
                         save_state_dict, split)
from .live_state_dict import (LiveStateDict, LiveStepReport, LiveTransfer, live_state_dict, plan_live_transfer,
                              prepare_live_transfer)
from .safetensors_io import (INDEX_NAME, METADATA_TENSOR, Layout, SafetensorsError, SafetensorsFile,
                             export_safetensors, import_safetensors)

__version__ = "0.3.0"

__all__ = [
    "set_log_callback",
    "Progress",
    "ProgressBar",
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
    "RevisionInfo",
    "Receipts",
    "Decision",
    "Guard",
    "TerminalState",
    "Transaction",
    "Writer",
    "RegistrationLease",
    "LeaseSide",
    # tensors, devices, state dicts, safetensors
    "DTYPES",
    "DType",
    "TensorView",
    "tensor_view",
    "dtype_name",
    "TensorError",
    "NonContiguousError",
    "UnsupportedDTypeError",
    "UnsupportedDeviceError",
    "DeviceEngine",
    "DeviceUnavailableError",
    "CudaError",
    "cuda_available",
    "Exchange",
    "ExchangeTimeout",
    "LocalExchange",
    "ThreadExchange",
    "FileExchange",
    "TorchDistributedExchange",
    "Parallel",
    "Shard",
    "split",
    "REPLICATED",
    "COLWISE",
    "ROWWISE",
    "StateDictError",
    "save_state_dict",
    "load_state_dict",
    "LATEST",
    "Layout",
    "SafetensorsError",
    "SafetensorsFile",
    "import_safetensors",
    "INDEX_NAME",
    "METADATA_TENSOR",
    "export_safetensors",
    # live transfer
    "TransferPlan",
    "TransferEngine",
    "TransferStats",
    "LiveReport",
    "TargetOutcome",
    "EngineResources",
    "NotifyAcceptor",
    "NotifyOutcome",
    "NotifyMismatch",
    "NotifyRouter",
    "Loader",
    "Sink",
    "PreparedTransfer",
    "StepHandle",
    "PreparedInfo",
    "LeaseRotation",
    # a state dict straight into live transfer
    "live_state_dict",
    "LiveStateDict",
    "plan_live_transfer",
    "prepare_live_transfer",
    "LiveTransfer",
    "LiveStepReport",
]

# Every error class (each an MwsError subclass) is exported by name.
__all__ += [_n for _n in _errors.__all__ if _n not in __all__]
