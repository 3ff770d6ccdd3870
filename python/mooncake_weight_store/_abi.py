"""The C ABI of ``libmooncake_weight_store`` as ctypes sees it, declared once: every
struct, callback type, constant and function prototype of
``include/mooncake_weight_store.h`` that Python binds lives in this module and in no
other (``python/tests/test_header_sync.py`` checks them against the header, field by
field and argument by argument, and fails on a declaration anywhere else in the
package).

Only declarations: loading the library, calling it and owning its handles are
:mod:`._lib`'s (which binds a function with its prototype from :data:`PROTOTYPES`).
The other modules take the structs, callback types and constants from here.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any, Dict, List, Optional, Tuple

from .errors import Status, error_for_status


# --------------------------------------------------------------------------- integers
# ctypes silently wraps an out-of-range Python int into a C integer (-1 becomes
# 2**64 - 1 for a uint64_t). Every integer that crosses into the library is checked
# here instead: the C structs derive from ``CStruct`` (fields checked when set) and
# every function bound by ``LIB.fn`` checks its integer arguments.


def int_range(ctype: Any) -> Optional[Tuple[int, int]]:
    """The value range of a ctypes integer type, ``None`` for any other type."""
    if not (isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData)) or \
            getattr(ctype, "_type_", "-") not in "bBhHiIlLqQ":
        return None
    bits = 8 * ctypes.sizeof(ctype)
    if ctype(-1).value < 0:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def check_int(value: Any, ctype: Any, what: str) -> None:
    """Raises :class:`InvalidArgumentError` when ``value`` is an int outside the range of
    the C integer type ``ctype`` (other values are left to ctypes)."""
    rng = int_range(ctype)
    if rng is None or isinstance(value, bool) or not isinstance(value, int):
        return
    lo, hi = rng
    if not lo <= value <= hi:
        raise error_for_status(Status.INVALID_ARGUMENT, f"{what} must be an integer in [{lo}, {hi}], got {value}",
                               "MWS_INVALID_ARGUMENT")


class CStruct(Structure):
    """A C struct of the library: integer fields are range-checked when set (in the
    constructor or by assignment) instead of wrapped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = [(f[0], f[1]) for f in self._fields_]
        for (name, ctype), value in zip(fields, args):
            check_int(value, ctype, f"{type(self).__name__}.{name}")
        types = dict(fields)
        for name, value in kwargs.items():
            if name in types:
                check_int(value, types[name], f"{type(self).__name__}.{name}")
        super().__init__(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        for f in self._fields_:
            if f[0] == name:
                check_int(value, f[1], f"{type(self).__name__}.{name}")
                break
        super().__setattr__(name, value)


# --------------------------------------------------------------------------- constants
# The header's ``#define MWS_*`` values and ``enum mws_*`` members that Python uses,
# under the header's names, in the header's order. The modules give them their Python
# form (``MemoryKind.HOST``, ``logs.INFO``, verdict names, ...) from these. The
# ``mws_status`` values are ``errors.Status`` (the error classes are keyed by them).

MWS_DEVICE_ENGINE_VTABLE_VERSION = 1
MWS_TRANSFER_ENGINE_VTABLE_VERSION = 1
#: ``direction`` of ``submit_with_ticket``: pull (``local`` are targets)
MWS_TRANSFER_READ = 0
#: push (``local`` are sources)
MWS_TRANSFER_WRITE = 1
MWS_GUARD_VTABLE_VERSION = 1
MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION = 1
MWS_STORE_VTABLE_VERSION = 1
#: ``record_type`` of the store vtable's puts
MWS_RECORD_PAYLOAD = 0
MWS_RECORD_METADATA = 1
#: log levels of ``mws_set_log_callback``
MWS_LOG_OFF = 0
MWS_LOG_ERROR = 1
MWS_LOG_WARN = 2
MWS_LOG_INFO = 3
MWS_LOG_DEBUG = 4
MWS_LOG_TRACE = 5
#: verdicts of ``mws_notify_acceptor_accept``
MWS_NOTIFY_ACCEPTED = 0
MWS_NOTIFY_MALFORMED = 1
MWS_NOTIFY_TRUNCATED = 2
MWS_NOTIFY_FORGED = 3
MWS_NOTIFY_REPLAYED = 4
MWS_NOTIFY_STALE = 5
MWS_NOTIFY_OTHER_PLAN = 6
MWS_NOTIFY_MISROUTED = 7
MWS_NOTIFY_TOO_MANY = 8
MWS_NOTIFY_UNVERIFIED = 9
MWS_NOTIFY_DELTA_BASE = 10
#: ``flags`` of ``mws_prepared_transfer_step_notified``
MWS_STEP_VERIFY_CONTENT = 1
#: ``mws_step_notify.flags``: a delta step
MWS_STEP_DELTA = 2
#: ``mws_store_options.staging_bytes``: no staging buffer
MWS_STAGING_OFF = 2**64 - 1
#: ``mws_store_options.verify_integrity``
MWS_VERIFY_DEFAULT = 0
MWS_VERIFY_ON = 1
MWS_VERIFY_OFF = 2
#: ``mws_store_options.write_integrity``
MWS_WRITE_INTEGRITY_DEFAULT = 0
MWS_WRITE_INTEGRITY_ON = 1
MWS_WRITE_INTEGRITY_OFF = 2
# enum mws_axis_kind
MWS_AXIS_DP = 0
MWS_AXIS_PP = 1
MWS_AXIS_EP = 2
MWS_AXIS_TP = 3
# enum mws_axis_semantics
MWS_AXIS_SPLIT = 0
MWS_AXIS_REPLICATED = 1
MWS_AXIS_OWNERSHIP = 2
# enum mws_decision
MWS_DECISION_NONE = 0
MWS_DECISION_COMMIT = 1
MWS_DECISION_ABORT = 2
# enum mws_guard_release
MWS_GUARD_NOT_PINNED = 0
MWS_GUARD_COMPLETED = 1
MWS_GUARD_FAILED_DRAINED = 2
MWS_GUARD_ABORTED = 3
MWS_GUARD_PENDING = 4
MWS_GUARD_RELEASE_FAILED = 5
# enum mws_lease_side
MWS_LEASE_SOURCE = 0
MWS_LEASE_TARGET = 1
# enum mws_memory_kind
MWS_MEMORY_HOST = 0
MWS_MEMORY_DEVICE = 1
# enum mws_progress_phase
MWS_PROGRESS_UPLOAD = 0
MWS_PROGRESS_RESTORE = 1
MWS_PROGRESS_TRANSFER = 2
MWS_PROGRESS_VERIFY = 3
# enum mws_source_routing
MWS_SOURCE_ROUTING_TARGET_DP = 0
MWS_SOURCE_ROUTING_SPREAD_TARGETS = 1
# enum mws_target_verdict
MWS_TARGET_UPDATED = 0
MWS_TARGET_UNCHANGED = 1
MWS_TARGET_TORN = 2
# enum mws_terminal_state
MWS_TERMINAL_ABORTED = 0
MWS_TERMINAL_COMPLETED = 1
MWS_TERMINAL_FAILED_DRAINED = 2
# enum mws_transaction_state
MWS_TRANSACTION_OPEN = 0
MWS_TRANSACTION_COMMITTED = 1
MWS_TRANSACTION_ABORTED = 2
# enum mws_transfer_side
MWS_SIDE_SOURCE = 0
MWS_SIDE_TARGET = 1


# --------------------------------------------------------------------------- structs and callback types


class mws_binding_options(CStruct):
    _fields_ = [
        ("resource_id", c_char_p),
        ("revision", c_char_p),
        ("placement_id", c_char_p),
        ("placement_digest", c_char_p),
        ("participant_id", c_char_p),
        ("instance_id", c_char_p),
        ("lease_id", c_char_p),
        ("lease_generation", c_uint64),
    ]


class mws_runtime_fragment(CStruct):
    _fields_ = [
        ("placement_fragment_id", c_char_p),
        ("fragment_id", c_char_p),
        ("address", c_void_p),
        ("nbytes", c_uint64),
        ("worker_id", c_char_p),
        ("endpoint", c_char_p),
        ("device", c_char_p),
        ("itemsize", c_uint64),
        ("local_shape", POINTER(c_uint64)),
        ("local_shape_len", c_size_t),
        ("strides_bytes", POINTER(c_uint64)),
        ("strides_bytes_len", c_size_t),
        ("storage_address", c_void_p),
        ("storage_nbytes", c_uint64),
        ("storage_offset_bytes", c_uint64),
        ("memory_kind", c_uint32),
        ("device_ordinal", c_uint32),
    ]


class mws_placement_fragment_info(CStruct):
    _fields_ = [
        ("placement_fragment_id", c_char_p),
        ("participant_id", c_char_p),
        ("tensor_id", c_char_p),
        ("ndim", c_size_t),
        ("global_offset", POINTER(c_uint64)),
        ("local_shape", POINTER(c_uint64)),
        ("nbytes", c_uint64),
        ("itemsize", c_uint64),
    ]


class mws_placement_builder_options(CStruct):
    _fields_ = [
        ("resource_id", c_char_p),
        ("revision", c_char_p),
        ("weight_generation", c_uint64),
        ("placement_set_id", c_char_p),
        ("tp_size", c_uint64),
        ("pp_size", c_uint64),
        ("ep_size", c_uint64),
        ("dp_size", c_uint64),
    ]


class mws_rank(CStruct):
    _fields_ = [("dp", c_uint64), ("pp", c_uint64), ("ep", c_uint64), ("tp", c_uint64)]


class mws_parallel_axis(CStruct):
    _fields_ = [("kind", c_uint32), ("semantics", c_uint32), ("dim", c_uint64)]


class mws_tensor_spec(CStruct):
    _fields_ = [
        ("tensor_id", c_char_p),
        ("global_shape", POINTER(c_uint64)),
        ("ndim", c_size_t),
        ("dtype", c_char_p),
        ("itemsize", c_uint64),
        ("layout_fingerprint", c_char_p),
        ("axes", POINTER(mws_parallel_axis)),
        ("axis_count", c_size_t),
        ("layer_id", POINTER(c_uint64)),
        ("expert_id", POINTER(c_uint64)),
    ]


class mws_fragment_spec(CStruct):
    _fields_ = [
        ("participant_id", c_char_p),
        ("tensor_id", c_char_p),
        ("global_offset", POINTER(c_uint64)),
        ("local_shape", POINTER(c_uint64)),
        ("ndim", c_size_t),
        ("pipeline_stage_id", POINTER(c_uint64)),
        ("aliases", POINTER(c_char_p)),
        ("alias_count", c_size_t),
        ("placement_fragment_id", c_char_p),
    ]


class mws_upload_options(CStruct):
    _fields_ = [
        ("store_namespace", c_char_p),
        ("key_prefix", c_char_p),
        ("transaction_id", c_char_p),
        ("created_at", c_char_p),
    ]


class mws_upload_operation(CStruct):
    _fields_ = [
        ("source_participant_id", c_char_p),
        ("source_instance_id", c_char_p),
        ("source_lease_id", c_char_p),
        ("source_lease_generation", c_uint64),
        ("source_fragment_id", c_char_p),
        ("source_worker_id", c_char_p),
        ("source_placement_fragment_id", c_char_p),
        ("target_fragment_id", c_char_p),
        ("object_key", c_char_p),
        ("nbytes", c_uint64),
    ]


# Store vtable (docs/STORE-VTABLE.md, version 1).


class mws_bytes(CStruct):
    _fields_ = [("ptr", c_void_p), ("len", c_size_t)]


class mws_put_item(CStruct):
    _fields_ = [
        ("key", mws_bytes),
        ("group_id", mws_bytes),
        ("address", c_uint64),
        ("len", c_uint64),
        ("memory_kind", c_uint32),
        ("device_ordinal", c_uint32),
    ]


class mws_range_item(CStruct):
    _fields_ = [
        ("key", mws_bytes),
        ("object_offset", c_uint64),
        ("dest_address", c_uint64),
        ("len", c_uint64),
        ("buffer_address", c_uint64),
        ("memory_kind", c_uint32),
        ("device_ordinal", c_uint32),
    ]


PUT_FN = CFUNCTYPE(c_int32, c_void_p, mws_bytes, c_void_p, c_uint64, mws_bytes, c_uint32)
GET_SIZE_FN = CFUNCTYPE(c_int64, c_void_p, mws_bytes)
GET_INTO_FN = CFUNCTYPE(c_int64, c_void_p, mws_bytes, c_void_p, c_uint64)
EXISTS_FN = CFUNCTYPE(c_int32, c_void_p, mws_bytes)
REMOVE_FN = CFUNCTYPE(c_int32, c_void_p, mws_bytes)
BATCH_PUT_FN = CFUNCTYPE(c_int32, c_void_p, POINTER(mws_put_item), c_size_t, c_uint32, POINTER(c_int32))
RANGES_FN = CFUNCTYPE(c_int32, c_void_p, POINTER(mws_range_item), c_size_t, POINTER(c_int64))
REGISTER_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64, c_uint64, c_uint32, c_uint32)
UNREGISTER_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64)
DESTROY_FN = CFUNCTYPE(None, c_void_p)
BATCH_EXISTS_FN = CFUNCTYPE(c_int32, c_void_p, POINTER(mws_bytes), c_size_t, POINTER(c_int32))
BATCH_GET_SIZE_FN = CFUNCTYPE(c_int32, c_void_p, POINTER(mws_bytes), c_size_t, POINTER(c_int64))
LIST_EMIT_FN = CFUNCTYPE(c_int32, c_void_p, mws_bytes, c_uint64)
LIST_FN = CFUNCTYPE(c_int32, c_void_p, mws_bytes, LIST_EMIT_FN, c_void_p)


class mws_store_cost(CStruct):
    _fields_ = [("per_request_ns", c_uint64), ("per_range_ns", c_uint64), ("bytes_per_second", c_uint64)]


GET_COST_FN = CFUNCTYPE(c_int32, c_void_p, POINTER(mws_store_cost))


class mws_store_vtable(CStruct):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("put", PUT_FN),
        ("upsert", PUT_FN),
        ("get_size", GET_SIZE_FN),
        ("get_into", GET_INTO_FN),
        ("exists", EXISTS_FN),
        ("remove", REMOVE_FN),
        ("batch_put_from", BATCH_PUT_FN),
        ("get_into_ranges", RANGES_FN),
        ("register_buffer", REGISTER_FN),
        ("unregister_buffer", UNREGISTER_FN),
        ("destroy", DESTROY_FN),
        ("batch_exists", BATCH_EXISTS_FN),
        ("list", LIST_FN),
        ("get_cost", GET_COST_FN),
        ("batch_get_size", BATCH_GET_SIZE_FN),
    ]


# Device engines (``mws_device_engine``; device.py): the ranges of
# ``mws_device_engine_copy`` and the counters of ``mws_device_engine_stats``.


class mws_copy_range(CStruct):
    _fields_ = [
        ("source", c_uint64),
        ("target", c_uint64),
        ("len", c_uint64),
    ]


class mws_copy_op(CStruct):
    _fields_ = [
        ("source", c_uint64),
        ("source_pitch", c_uint64),
        ("target", c_uint64),
        ("target_pitch", c_uint64),
        ("width", c_uint64),
        ("height", c_uint64),
    ]


DEVICE_SUBMIT_FN = CFUNCTYPE(c_int32, c_void_p, c_uint32, c_uint32, POINTER(mws_copy_op), c_size_t, POINTER(c_uint64))
DEVICE_WAIT_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64)
STAGING_ALLOC_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64, POINTER(c_void_p))
STAGING_FREE_FN = CFUNCTYPE(None, c_void_p, c_void_p, c_uint64)


class mws_device_engine_vtable(CStruct):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("submit", DEVICE_SUBMIT_FN),
        ("wait", DEVICE_WAIT_FN),
        ("staging_alloc", STAGING_ALLOC_FN),
        ("staging_free", STAGING_FREE_FN),
        ("destroy", DESTROY_FN),
    ]


class mws_device_stats(CStruct):
    _fields_ = [
        ("batches", c_uint64),
        ("copies", c_uint64),
        ("driver_calls", c_uint64),
        ("bytes", c_uint64),
    ]


class mws_store_options(CStruct):
    _fields_ = [
        ("key_prefix", c_char_p),
        ("max_range_bytes", c_uint64),
        ("max_ranges_per_request", c_uint64),
        ("max_region_segments", c_uint64),
        ("device_engine", c_void_p),
        ("staging_bytes", c_uint64),
        ("max_metadata_bytes", c_uint64),
        ("verify_integrity", c_uint32),
        ("write_integrity", c_uint32),
    ]


class mws_stored_fragment_info(CStruct):
    _fields_ = [
        ("fragment_id", c_char_p),
        ("tensor_id", c_char_p),
        ("object_key", c_char_p),
        ("object_offset", c_uint64),
        ("nbytes", c_uint64),
        ("ndim", c_size_t),
        ("global_offset", POINTER(c_uint64)),
        ("local_shape", POINTER(c_uint64)),
    ]


class mws_revision_info(CStruct):
    _fields_ = [
        ("revision", c_char_p),
        ("weight_generation", c_uint64),
        ("manifest_key", c_char_p),
        ("manifest_digest", c_char_p),
        ("created_at", c_char_p),
    ]


class mws_planning_limits(CStruct):
    _fields_ = [
        ("max_transfer_regions", c_uint64),
        ("max_segments_per_region", c_uint64),
        ("max_total_lowered_segments", c_uint64),
    ]


GUARD_ACQUIRE_FN = CFUNCTYPE(c_int32, c_void_p, c_char_p, c_char_p, POINTER(c_char_p), c_size_t,
                             POINTER(c_void_p), POINTER(c_uint64))
GUARD_RELEASE_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64, c_uint32)


class mws_guard_vtable(CStruct):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("acquire", GUARD_ACQUIRE_FN),
        ("release", GUARD_RELEASE_FN),
    ]


class mws_progress(CStruct):
    _fields_ = [
        ("phase", c_int),
        ("bytes_done", c_uint64),
        ("bytes_total", c_uint64),
        ("items_done", c_uint64),
        ("items_total", c_uint64),
    ]


PROGRESS_FN = CFUNCTYPE(None, c_void_p, POINTER(mws_progress))
#: the ``callback`` of ``mws_set_log_callback``: ``(ctx, level, target, message)``
LOG_FN = CFUNCTYPE(None, c_void_p, c_int32, c_char_p, c_char_p)


class mws_io_args(CStruct):
    _fields_ = [
        ("worker_id", c_char_p),
        ("transfer_id", c_char_p),
        ("guard", POINTER(mws_guard_vtable)),
        ("guard_ctx", c_void_p),
        ("lease", c_void_p),
        ("progress", PROGRESS_FN),
        ("progress_ctx", c_void_p),
    ]


class mws_load_stats(CStruct):
    _fields_ = [
        ("regions", c_uint64),
        ("ranges", c_uint64),
        ("requests", c_uint64),
        ("bytes", c_uint64),
        ("strided_regions", c_uint64),
        ("direct_regions", c_uint64),
        ("staged_regions", c_uint64),
        ("staged_bytes", c_uint64),
    ]


class mws_snapshot_descriptor(CStruct):
    _fields_ = [
        ("resource_id", c_char_p),
        ("revision", c_char_p),
        ("weight_generation", c_uint64),
        ("store_namespace", c_char_p),
    ]


EXPORT_SOURCE_FN = CFUNCTYPE(c_int32, c_void_p, POINTER(mws_snapshot_descriptor), POINTER(c_void_p),
                             POINTER(POINTER(c_void_p)), POINTER(c_size_t))
RESOLVE_IDS_FN = CFUNCTYPE(c_int32, c_void_p, c_char_p, c_void_p, POINTER(POINTER(c_char_p)), POINTER(c_size_t))


class mws_snapshot_adapter_vtable(CStruct):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("export_source", EXPORT_SOURCE_FN),
        ("resolve_fragment_ids", RESOLVE_IDS_FN),
        ("acquire_source", GUARD_ACQUIRE_FN),
        ("release_source", GUARD_RELEASE_FN),
    ]

# Transfer engine vtable (``mws_transfer_engine_vtable``, version 1): a caller's engine.

_U64P = POINTER(c_uint64)
ENGINE_ID_FN = CFUNCTYPE(c_uint64, c_void_p)
ENGINE_REGISTER_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64, c_uint64, c_int32)
ENGINE_UNREGISTER_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64)
ENGINE_BATCH_FN = CFUNCTYPE(c_int32, c_void_p, mws_bytes, _U64P, _U64P, _U64P, c_size_t)
ENGINE_SUBMIT_FN = CFUNCTYPE(c_int32, c_void_p, c_uint32, mws_bytes, _U64P, _U64P, _U64P, c_size_t, _U64P)
ENGINE_TICKET_STATUS_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64, POINTER(c_int32))
ENGINE_TICKET_DRAIN_FN = CFUNCTYPE(c_int32, c_void_p, c_uint64, c_uint64, POINTER(c_int32))
ENGINE_TICKET_RELEASE_FN = CFUNCTYPE(None, c_void_p, c_uint64)
ENGINE_SEND_NOTIFY_FN = CFUNCTYPE(c_int32, c_void_p, mws_bytes, mws_bytes, mws_bytes)


class mws_transfer_engine_vtable(CStruct):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("get_engine_id", ENGINE_ID_FN),
        ("register_memory", ENGINE_REGISTER_FN),
        ("unregister_memory", ENGINE_UNREGISTER_FN),
        ("batch_transfer_sync_write", ENGINE_BATCH_FN),
        ("batch_transfer_sync_read", ENGINE_BATCH_FN),
        ("submit_with_ticket", ENGINE_SUBMIT_FN),
        ("ticket_status", ENGINE_TICKET_STATUS_FN),
        ("ticket_drain", ENGINE_TICKET_DRAIN_FN),
        ("ticket_release", ENGINE_TICKET_RELEASE_FN),
        ("send_notify", ENGINE_SEND_NOTIFY_FN),
    ]


# Live transfer (transfer.py) and the notify hook (notify.py).


class mws_transfer_stats(CStruct):
    _fields_ = [("bytes", c_uint64), ("regions", c_uint64), ("operations", c_uint64), ("receipts", c_uint64),
                ("engine_operations", c_uint64)]


class mws_executor_limits(CStruct):
    _fields_ = [("max_batch_operations", c_uint64), ("max_region_segments", c_uint64),
                ("max_total_lowered_segments", c_uint64), ("max_completion_drain_attempts", c_uint32),
                ("completion_drain_timeout_ms", c_uint64), ("no_coalescing", c_uint32)]


class mws_live_args(CStruct):
    _fields_ = [("worker_id", c_char_p), ("transfer_id", c_char_p), ("local_pre_registered", c_int32),
                ("guard", c_void_p), ("guard_ctx", c_void_p)]


class mws_target_outcome(CStruct):
    _fields_ = [("participant_id", c_char_p), ("weight_generation", c_uint64), ("verdict", c_uint32)]


class mws_live_report(CStruct):
    _fields_ = [("submitted", c_uint32), ("guard_release", c_uint32), ("pending_transfer_id", c_char_p),
                ("n_targets", c_size_t), ("targets", POINTER(mws_target_outcome)), ("stats", mws_transfer_stats)]


class mws_lease_rotation(CStruct):
    _fields_ = [("instance_id", c_char_p), ("participant_id", c_char_p), ("lease_id", c_char_p),
                ("lease_generation", c_uint64)]


class mws_step_args(CStruct):
    _fields_ = [("weight_generation", c_uint64), ("leases", POINTER(mws_lease_rotation)), ("n_leases", c_size_t),
                ("transfer_id", c_char_p), ("revision", c_char_p)]


class mws_target_held(CStruct):
    _fields_ = [("participant_id", c_char_p), ("weight_generation", c_uint64)]


class mws_delta_inbox(CStruct):
    _fields_ = [("participant_id", c_char_p), ("address", c_uint64), ("capacity", c_uint64)]


class mws_delta_outbox(CStruct):
    _fields_ = [("participant_id", c_char_p), ("worker_id", c_char_p), ("address", c_uint64),
                ("capacity", c_uint64)]


class mws_delta_stats(CStruct):
    _fields_ = [("weight_generation", c_uint64), ("delta_targets", c_uint64), ("full_targets", c_uint64),
                ("wire_bytes", c_uint64), ("logical_bytes", c_uint64), ("changed_elements", c_uint64)]


class mws_step_notify(CStruct):
    _fields_ = [("key", c_void_p), ("key_len", c_size_t), ("flags", c_uint32),
                ("held", POINTER(mws_target_held)), ("n_held", c_size_t)]


#: ``mws_step_callback``: (user_data, status), once, on the library's step driver thread
STEP_CALLBACK_FN = CFUNCTYPE(None, c_void_p, c_int)


class mws_prepared_info(CStruct):
    _fields_ = [("empty", c_uint32), ("batches", c_uint64), ("pinned_bindings", c_uint64), ("bytes", c_uint64)]


class mws_engine_resources(CStruct):
    _fields_ = [("registrations_known", c_uint32), ("registered_regions", c_uint64), ("registered_bytes", c_uint64),
                ("pending_transfers", c_uint64), ("quarantined_registrations", c_uint64),
                ("pinned_tokens", c_uint64)]


class mws_notify_outcome(CStruct):
    _fields_ = [("verdict", c_uint32), ("weight_generation", c_uint64), ("incomplete", c_uint64)]


class mws_notify_mismatch(CStruct):
    _fields_ = [("source_participant", c_char_p), ("source_worker", c_char_p), ("fragment_id", c_char_p),
                ("operation", c_uint32), ("offset", c_uint64), ("bytes", c_uint64)]

# --------------------------------------------------------------------------- prototypes

_p = c_void_p  # opaque handle pointer
_sz = POINTER(c_size_t)

# name -> (restype, argtypes). Functions that the loaded library lacks are simply
# absent; calling them raises MissingSymbolError.
PROTOTYPES: Dict[str, Tuple[Any, List[Any]]] = {
    # boundary
    "mws_status_name": (c_char_p, [c_int]),
    "mws_last_error_message": (c_char_p, []),
    "mws_version": (c_char_p, []),
    "mws_test_panic": (c_int, []),
    # placement
    "mws_placement_from_json": (c_int, [c_char_p, c_size_t, POINTER(_p)]),
    "mws_placement_free": (None, [_p]),
    "mws_placement_to_json": (c_void_p, [_p, _sz]),
    "mws_placement_id": (c_void_p, [_p, _sz]),
    "mws_placement_digest": (c_void_p, [_p, _sz]),
    "mws_placement_topology_id": (c_void_p, [_p, _sz]),
    "mws_placement_resource_id": (c_void_p, [_p, _sz]),
    "mws_placement_revision": (c_void_p, [_p, _sz]),
    "mws_placement_weight_generation": (c_uint64, [_p]),
    "mws_placement_participant_count": (c_size_t, [_p]),
    "mws_placement_tensor_count": (c_size_t, [_p]),
    "mws_placement_fragment_count": (c_size_t, [_p]),
    "mws_placement_fragment": (c_int, [_p, c_size_t, POINTER(mws_placement_fragment_info)]),
    # placement builder
    "mws_placement_builder_new": (c_int, [POINTER(mws_placement_builder_options), POINTER(_p)]),
    "mws_placement_builder_add_participant": (c_int, [_p, c_char_p, POINTER(mws_rank)]),
    "mws_placement_builder_add_tensor": (c_int, [_p, POINTER(mws_tensor_spec)]),
    "mws_placement_builder_add_fragment": (c_int, [_p, POINTER(mws_fragment_spec), POINTER(c_void_p), _sz]),
    "mws_placement_builder_build": (c_int, [_p, POINTER(_p)]),
    "mws_placement_builder_free": (None, [_p]),
    # binding
    "mws_binding_new": (c_int, [POINTER(mws_binding_options), POINTER(_p)]),
    "mws_binding_add_fragment": (c_int, [_p, POINTER(mws_runtime_fragment)]),
    "mws_binding_fragment_count": (c_size_t, [_p]),
    "mws_binding_clone": (c_int, [_p, POINTER(_p)]),
    "mws_binding_validate": (c_int, [_p, _p]),
    "mws_binding_free": (None, [_p]),
    # upload plan
    "mws_upload_plan_new": (c_int, [_p, POINTER(_p), c_size_t, POINTER(mws_upload_options), POINTER(_p)]),
    "mws_upload_plan_free": (None, [_p]),
    "mws_upload_plan_manifest_json": (c_void_p, [_p, _sz]),
    "mws_upload_plan_manifest_digest": (c_void_p, [_p, _sz]),
    "mws_upload_plan_manifest_key": (c_void_p, [_p, _sz]),
    "mws_upload_plan_group_id": (c_void_p, [_p, _sz]),
    "mws_upload_plan_control_key": (c_void_p, [_p, _sz]),
    "mws_upload_plan_transaction_group_id": (c_void_p, [_p, _sz]),
    "mws_upload_plan_transaction_id": (c_void_p, [_p, _sz]),
    "mws_upload_plan_source_placement_id": (c_void_p, [_p, _sz]),
    "mws_upload_plan_source_placement_digest": (c_void_p, [_p, _sz]),
    "mws_upload_plan_commit_record": (c_void_p, [_p, _sz]),
    "mws_upload_plan_operation_count": (c_size_t, [_p]),
    "mws_upload_plan_operation": (c_int, [_p, c_size_t, POINTER(mws_upload_operation)]),
    "mws_upload_plan_to_json": (c_void_p, [_p, _sz]),
    "mws_upload_plan_from_json": (c_int, [c_char_p, c_size_t, POINTER(_p)]),
    # device engines
    "mws_device_engine_new_cuda": (c_int, [c_uint32, POINTER(c_uint64), POINTER(_p)]),
    "mws_device_engine_new_fenced": (c_int, [c_uint32, c_uint64, POINTER(_p)]),
    "mws_device_engine_from_vtable": (c_int, [POINTER(mws_device_engine_vtable), c_void_p, POINTER(_p)]),
    "mws_device_engine_fenced_alloc": (c_int, [_p, c_uint64, POINTER(c_uint64)]),
    "mws_device_engine_copy": (c_int, [_p, c_uint32, c_uint32, POINTER(mws_copy_range), c_size_t,
                                       POINTER(c_uint64)]),
    "mws_device_engine_stats": (c_int, [_p, POINTER(mws_device_stats)]),
    "mws_device_engine_free": (None, [_p]),
    # store
    "mws_store_open_memory": (c_int, [POINTER(mws_store_options), POINTER(_p)]),
    "mws_store_open_dir": (c_int, [c_char_p, POINTER(mws_store_options), POINTER(_p)]),
    "mws_store_from_vtable": (c_int, [POINTER(mws_store_vtable), c_void_p, POINTER(_p)]),
    "mws_store_from_vtable_with_options": (c_int, [POINTER(mws_store_vtable), c_void_p, POINTER(mws_store_options),
                                                   POINTER(_p)]),
    "mws_store_free": (None, [_p]),
    "mws_store_key_prefix": (c_void_p, [_p, _sz]),
    "mws_store_get": (c_int, [_p, c_char_p, c_void_p, c_size_t, _sz]),
    "mws_store_exists": (c_int, [_p, c_char_p, POINTER(c_int)]),
    "mws_store_put": (c_int, [_p, c_char_p, c_char_p, c_size_t, c_char_p]),
    "mws_store_upsert": (c_int, [_p, c_char_p, c_char_p, c_size_t, c_char_p]),
    "mws_store_remove": (c_int, [_p, c_char_p]),
    "mws_store_pending_registration_count": (c_size_t, [_p]),
    "mws_store_drain_pending_registrations": (c_int, [_p]),
    # registration leases
    "mws_registration_lease_new": (c_int, [_p, _p, POINTER(c_char_p), c_size_t, c_uint32, c_void_p, c_void_p,
                                           c_char_p, POINTER(_p)]),
    "mws_registration_lease_close": (c_int, [_p, c_uint32]),
    "mws_registration_lease_is_closed": (c_int, [_p]),
    "mws_registration_lease_free": (None, [_p]),
    # receipts
    "mws_receipts_free": (None, [_p]),
    "mws_receipts_count": (c_size_t, [_p]),
    "mws_receipts_to_json": (c_void_p, [_p, _sz]),
    "mws_receipts_from_json": (c_int, [c_char_p, c_size_t, POINTER(_p)]),
    "mws_receipts_concat": (c_int, [POINTER(_p), c_size_t, POINTER(_p)]),
    "mws_receipts_from_plan": (c_int, [_p, POINTER(_p)]),
    # transaction
    "mws_store_upload": (c_int, [_p, _p, _p, _p, POINTER(mws_io_args), POINTER(_p)]),
    "mws_store_commit": (c_int, [_p, _p, _p, POINTER(c_int), POINTER(_p)]),
    "mws_store_abort_upload": (c_int, [_p, _p, _p]),
    "mws_store_finalize_upload": (c_int, [_p, _p]),
    "mws_store_read_decision": (c_int, [_p, _p, POINTER(c_int)]),
    # transaction (protocol::Transaction)
    "mws_transaction_new": (c_int, [_p, _p, POINTER(_p)]),
    "mws_transaction_upload": (c_int, [_p, _p, _p, POINTER(mws_io_args)]),
    "mws_transaction_upload_many": (c_int, [_p, _p, POINTER(_p), c_size_t, POINTER(_p), POINTER(mws_io_args)]),
    "mws_transaction_receipts": (c_int, [_p, POINTER(_p)]),
    "mws_transaction_add_receipts": (c_int, [_p, _p]),
    "mws_transaction_commit": (c_int, [_p, POINTER(_p)]),
    "mws_transaction_commit_decision_may_exist": (c_int, [_p]),
    "mws_transaction_get_state": (c_int, [_p]),
    "mws_transaction_abort": (c_int, [_p]),
    "mws_transaction_finalize": (c_int, [_p]),
    "mws_transaction_free": (None, [_p]),
    # stored manifest
    "mws_stored_manifest_from_store": (c_int, [_p, c_char_p, POINTER(_p)]),
    "mws_stored_manifest_from_json": (c_int, [c_char_p, c_size_t, POINTER(_p)]),
    "mws_stored_manifest_free": (None, [_p]),
    "mws_stored_manifest_to_json": (c_void_p, [_p, _sz]),
    "mws_stored_manifest_digest": (c_void_p, [_p, _sz]),
    "mws_stored_manifest_key": (c_void_p, [_p, _sz]),
    "mws_stored_manifest_group_id": (c_void_p, [_p, _sz]),
    "mws_stored_manifest_namespace": (c_void_p, [_p, _sz]),
    "mws_stored_manifest_resource_id": (c_void_p, [_p, _sz]),
    "mws_stored_manifest_revision": (c_void_p, [_p, _sz]),
    "mws_stored_manifest_weight_generation": (c_uint64, [_p]),
    "mws_stored_manifest_tensor_count": (c_size_t, [_p]),
    "mws_stored_manifest_fragment_count": (c_size_t, [_p]),
    "mws_stored_manifest_total_bytes": (c_uint64, [_p]),
    "mws_stored_manifest_fragment": (c_int, [_p, c_size_t, POINTER(mws_stored_fragment_info)]),
    # revision lists
    "mws_revision_list_from_store": (c_int, [_p, c_char_p, c_char_p, POINTER(_p)]),
    "mws_revision_list_latest_from_store": (c_int, [_p, c_char_p, c_char_p, POINTER(_p)]),
    "mws_revision_list_free": (None, [_p]),
    "mws_revision_list_count": (c_size_t, [_p]),
    "mws_revision_list_get": (c_int, [_p, c_size_t, POINTER(mws_revision_info)]),
    # load
    "mws_load_plan_new": (c_int, [_p, _p, POINTER(_p), c_size_t, POINTER(mws_planning_limits), POINTER(_p)]),
    "mws_load_plan_free": (None, [_p]),
    "mws_load_plan_region_count": (c_size_t, [_p]),
    "mws_load_plan_total_bytes": (c_uint64, [_p]),
    "mws_load_plan_participant_count": (c_size_t, [_p]),
    "mws_load_plan_participant": (c_void_p, [_p, c_size_t, _sz]),
    "mws_store_load": (c_int, [_p, _p, _p, POINTER(mws_io_args), POINTER(mws_load_stats)]),
    "mws_store_load_many": (c_int, [_p, _p, POINTER(_p), c_size_t, POINTER(mws_io_args), POINTER(mws_load_stats)]),
    # writer
    "mws_writer_new": (c_int, [_p, POINTER(mws_snapshot_descriptor), POINTER(mws_snapshot_adapter_vtable), c_void_p,
                               POINTER(mws_upload_options), POINTER(_p)]),
    "mws_writer_write_tensor": (c_int, [_p, c_char_p, c_void_p, POINTER(_p)]),
    "mws_writer_commit": (c_int, [_p, POINTER(_p)]),
    "mws_writer_defer_uploads": (c_int, [_p, c_uint32]),
    "mws_writer_abort": (c_int, [_p]),
    "mws_writer_set_progress": (c_int, [_p, PROGRESS_FN, c_void_p]),
    "mws_writer_upload_plan": (c_int, [_p, POINTER(_p)]),
    "mws_writer_free": (None, [_p]),
    # logs
    "mws_set_log_callback": (c_int, [c_int32, LOG_FN, c_void_p]),
    # live transfer: plans
    "mws_transfer_plan_new": (c_int, [_p, _p, c_char_p, POINTER(mws_planning_limits), POINTER(_p)]),
    "mws_transfer_plan_new_routed": (c_int, [_p, _p, c_char_p, POINTER(mws_planning_limits), c_uint32, POINTER(_p)]),
    "mws_transfer_plan_bind": (c_int, [_p, POINTER(_p), c_size_t, POINTER(_p), c_size_t, POINTER(_p)]),
    "mws_transfer_plan_from_json": (c_int, [c_char_p, c_size_t, POINTER(_p)]),
    "mws_transfer_plan_to_json": (c_void_p, [_p, _sz]),
    "mws_transfer_plan_is_bound": (c_int32, [_p]),
    "mws_transfer_plan_region_count": (c_size_t, [_p]),
    "mws_transfer_plan_total_bytes": (c_uint64, [_p]),
    "mws_transfer_plan_executor_count": (c_size_t, [_p, c_uint32]),
    "mws_transfer_plan_free": (None, [_p]),
    # The plan's region, operation and executor views (mws_transfer_*_info) are declared
    # (every function of the header is) but not wrapped: their structs are not mirrored,
    # so they take a void *.
    "mws_transfer_plan_region": (c_int, [_p, c_size_t, c_void_p]),
    "mws_transfer_plan_operation": (c_int, [_p, c_size_t, c_void_p]),
    "mws_transfer_plan_executor": (c_int, [_p, c_uint32, c_size_t, c_void_p]),
    # live transfer: engines
    "mws_transfer_engine_new_local": (c_int, [POINTER(_p)]),
    "mws_transfer_engine_new_local_device": (c_int, [_p, POINTER(_p)]),
    "mws_transfer_engine_from_vtable": (c_int, [POINTER(mws_transfer_engine_vtable), c_void_p, POINTER(_p)]),
    "mws_transfer_engine_from_vtable_device": (c_int, [POINTER(mws_transfer_engine_vtable), c_void_p, _p,
                                                       POINTER(_p)]),
    "mws_transfer_engine_register_memory": (c_int, [_p, c_void_p, c_uint64, c_uint32, c_uint32]),
    "mws_transfer_engine_unregister_memory": (c_int, [_p, c_void_p]),
    "mws_transfer_engine_pending_count": (c_size_t, [_p]),
    "mws_transfer_engine_drain": (c_int, [_p, c_uint64, _sz]),
    "mws_transfer_engine_resources": (c_int, [_p, POINTER(mws_engine_resources)]),
    "mws_transfer_engine_free": (None, [_p]),
    # live transfer: loaders
    "mws_loader_new": (c_int, [_p, POINTER(mws_executor_limits), POINTER(_p)]),
    "mws_loader_set_progress": (c_int, [_p, PROGRESS_FN, c_void_p]),
    "mws_loader_cancel": (None, [_p]),
    "mws_loader_reset_cancel": (None, [_p]),
    "mws_loader_load_live": (c_int, [_p, _p, _p, POINTER(_p), c_size_t, _p, _p, POINTER(mws_live_args),
                                     POINTER(mws_transfer_stats)]),
    "mws_loader_prepare_live": (c_int, [_p, _p, _p, POINTER(_p), c_size_t, _p, _p, POINTER(mws_live_args),
                                        POINTER(_p)]),
    "mws_loader_prepare_stored": (c_int, [_p, _p, _p, _p, POINTER(mws_live_args), POINTER(_p)]),
    "mws_loader_load_stored": (c_int, [_p, _p, _p, _p, POINTER(mws_io_args), POINTER(mws_load_stats)]),
    "mws_loader_stats": (c_int, [_p, POINTER(mws_transfer_stats)]),
    "mws_loader_last_report": (c_int, [_p, POINTER(mws_live_report)]),
    "mws_loader_free": (None, [_p]),
    # live transfer: sinks
    "mws_sink_new": (c_int, [_p, POINTER(mws_executor_limits), POINTER(_p)]),
    "mws_sink_execute": (c_int, [_p, _p, _p, _p, _p, POINTER(_p), c_size_t, POINTER(mws_live_args),
                                 POINTER(mws_transfer_stats)]),
    "mws_sink_execute_notified": (c_int, [_p, c_void_p, c_size_t, _p, _p, _p, _p, POINTER(_p), c_size_t,
                                          POINTER(mws_live_args), POINTER(mws_transfer_stats)]),
    "mws_sink_prepare": (c_int, [_p, _p, _p, _p, _p, POINTER(_p), c_size_t, POINTER(mws_live_args), POINTER(_p)]),
    "mws_sink_set_progress": (c_int, [_p, PROGRESS_FN, c_void_p]),
    "mws_sink_cancel": (None, [_p]),
    "mws_sink_reset_cancel": (None, [_p]),
    "mws_sink_stats": (c_int, [_p, POINTER(mws_transfer_stats)]),
    "mws_sink_last_report": (c_int, [_p, POINTER(mws_live_report)]),
    "mws_sink_free": (None, [_p]),
    # live transfer: prepared transfers
    "mws_prepared_transfer_step": (c_int, [_p, POINTER(mws_step_args), POINTER(mws_transfer_stats)]),
    "mws_prepared_transfer_step_notified": (c_int, [_p, POINTER(mws_step_args), c_void_p, c_size_t, c_uint32,
                                                    POINTER(mws_transfer_stats)]),
    "mws_prepared_transfer_last_report": (c_int, [_p, POINTER(mws_live_report)]),
    "mws_prepared_transfer_info": (c_int, [_p, POINTER(mws_prepared_info)]),
    "mws_prepared_transfer_close": (c_int, [_p]),
    "mws_prepared_transfer_step_start": (c_int, [_p, POINTER(mws_step_args), POINTER(mws_step_notify),
                                                 STEP_CALLBACK_FN, c_void_p, POINTER(_p)]),
    "mws_step_handle_poll": (c_int, [_p, POINTER(c_uint32)]),
    "mws_sink_execute_start": (c_int, [_p, _p, _p, _p, _p, POINTER(_p), c_size_t, POINTER(mws_live_args),
                                       STEP_CALLBACK_FN, c_void_p, POINTER(_p)]),
    "mws_loader_load_live_start": (c_int, [_p, _p, _p, POINTER(_p), c_size_t, _p, _p, POINTER(mws_live_args),
                                           STEP_CALLBACK_FN, c_void_p, POINTER(_p)]),
    "mws_prepared_transfer_enable_delta": (c_int, [_p, POINTER(mws_delta_inbox), c_size_t]),
    "mws_prepared_transfer_step_delta": (c_int, [_p, POINTER(mws_step_args), c_void_p, c_size_t,
                                                 POINTER(mws_target_held), c_size_t, POINTER(mws_transfer_stats)]),
    "mws_prepared_transfer_delta_stats": (c_int, [_p, POINTER(mws_delta_stats)]),
    "mws_prepared_transfer_enable_delta_pull": (c_int, [_p, POINTER(mws_delta_outbox), c_size_t]),
    "mws_prepared_transfer_held_generation": (c_int, [_p, POINTER(c_uint64)]),
    "mws_delta_publisher_new": (c_int, [_p, c_char_p, c_char_p, _p, c_uint64, POINTER(_p)]),
    "mws_delta_min_outbox_capacity": (c_int, [_p, c_char_p, c_char_p, POINTER(c_uint64)]),
    "mws_delta_publisher_outbox": (c_int, [_p, POINTER(mws_delta_outbox)]),
    "mws_delta_publisher_publish": (c_int, [_p, c_uint64, POINTER(mws_delta_stats)]),
    "mws_delta_publisher_free": (None, [_p]),
    "mws_step_handle_wait": (c_int, [_p, c_uint64, POINTER(c_uint32), POINTER(mws_transfer_stats)]),
    "mws_step_handle_cancel": (c_int, [_p]),
    "mws_step_handle_report": (c_int, [_p, POINTER(mws_live_report)]),
    "mws_step_handle_free": (None, [_p]),
    "mws_prepared_transfer_free": (None, [_p]),
    # notify hook
    "mws_notify_name": (c_char_p, []),
    "mws_notify_acceptor_new": (c_int, [_p, c_char_p, c_void_p, c_size_t, POINTER(_p)]),
    "mws_notify_acceptor_accept": (c_int, [_p, c_void_p, c_size_t, POINTER(c_uint32), POINTER(mws_notify_outcome)]),
    "mws_notify_acceptor_outcome": (c_int, [_p, POINTER(mws_notify_outcome)]),
    "mws_notify_acceptor_free": (None, [_p]),
    "mws_notify_acceptor_verify_content": (c_int, [_p]),
    "mws_notify_acceptor_accept_deltas": (c_int, [_p, c_uint64, c_uint64]),
    "mws_notify_acceptor_use_device_engine": (c_int, [_p, _p]),
    "mws_notify_acceptor_held_generation": (c_int, [_p, POINTER(c_uint64)]),
    "mws_notify_acceptor_expect_generation": (c_int, [_p, c_uint64]),
    "mws_notify_acceptor_mismatch_count": (c_int, [_p, _sz]),
    "mws_notify_acceptor_mismatch": (c_int, [_p, c_size_t, POINTER(mws_notify_mismatch)]),
    "mws_notify_router_new": (c_int, [POINTER(_p)]),
    "mws_notify_router_add": (c_int, [_p, _p]),
    "mws_notify_router_remove": (c_int, [_p, _p, POINTER(c_uint32)]),
    "mws_notify_router_accept": (c_int, [_p, c_void_p, c_size_t, POINTER(c_uint32), POINTER(mws_notify_outcome),
                                         POINTER(_p)]),
    "mws_notify_router_free": (None, [_p]),
}

