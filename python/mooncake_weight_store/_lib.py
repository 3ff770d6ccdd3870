"""Loading ``libmooncake_weight_store.so`` and declaring the C ABI for ctypes.

Library lookup order (first hit wins):

1. ``MWS_LIBRARY``: path to the shared library file, or to a directory containing it.
1b. The library packaged inside this package by the wheel build
   (``mooncake_weight_store/libmooncake_weight_store*.so``).
2. ``MWS_PREFIX`` (or ``CMAKE_INSTALL_PREFIX``): a CMake install prefix; the library is
   looked for in ``<prefix>/lib``, ``<prefix>/lib64`` and ``<prefix>/lib/<multiarch>``.
3. A repository build: ``target/release`` (then ``target/debug``) of a checkout found
   by walking up from this file and from the current directory.
4. The system loader (``libmooncake_weight_store.so.0``, ``LD_LIBRARY_PATH``,
   ``ldconfig``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import inspect
import os
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from types import TracebackType
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Type, TypeVar

from .errors import (ArgumentError, LibraryNotFoundError, MissingSymbolError, MwsError, OutOfRangeError, Status,
                     error_for_status)

LIB_NAME = "libmooncake_weight_store.so"
SONAME = "libmooncake_weight_store.so.0"

# --------------------------------------------------------------------------- structs


# --------------------------------------------------------------------------- integers
# ctypes silently wraps an out-of-range Python int into a C integer (-1 becomes
# 2**64 - 1 for a uint64_t). Every integer that crosses into the library is checked
# here instead: the C structs derive from ``CStruct`` (fields checked when set) and
# every function bound by ``LIB.fn`` checks its integer arguments.


def _int_range(ctype: Any) -> Optional[Tuple[int, int]]:
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
    rng = _int_range(ctype)
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


def _checked(name: str, f: Any) -> Any:
    """``f`` with its integer arguments range-checked against its argtypes, and its
    handle arguments held in use for the call: an :class:`OwnedHandle` (or a
    :func:`handle_array` of them) passed as an argument is replaced by its handle, and
    its :meth:`~OwnedHandle.close` waits until the call has returned."""
    ranges = [(i, t) for i, t in enumerate(f.argtypes or ()) if _int_range(t) is not None]

    def call_checked(*args: Any) -> Any:
        for i, t in ranges:
            if i < len(args):
                check_int(args[i], t, f"{name} argument {i + 1}")
        held: List[OwnedHandle] = []
        try:
            if any(isinstance(a, OwnedHandle) or hasattr(a, "_mws_owners") for a in args):
                args = tuple(_enter_arg(a, held) for a in args)
            return f(*args)
        finally:
            for h in reversed(held):
                h._leave()

    call_checked.__name__ = name
    return call_checked


def _enter_arg(a: Any, held: List["OwnedHandle"]) -> Any:
    """The C value of one argument: a handle object's handle (held in use), a handle
    array filled with its objects' handles (each held), anything else as it is."""
    if isinstance(a, OwnedHandle):
        h = a._enter()
        held.append(a)
        return h
    owners = getattr(a, "_mws_owners", None)
    if owners is not None:
        for i, o in enumerate(owners):
            if o is not None:
                a[i] = o._enter()
                held.append(o)
    return a


def handle_array(objects: Sequence[Optional["OwnedHandle"]]) -> Any:
    """A C array (``void **``) of the handles of ``objects`` (``None``: NULL) for one
    library call: passed to a function bound by ``LIB.fn``, each object is held in
    use for the call (its handle is written into the array then)."""
    arr = (c_void_p * max(len(objects), 1))()
    arr._mws_owners = list(objects)
    return arr


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


MWS_STORE_VTABLE_VERSION = 1
MWS_STAGING_OFF = 2**64 - 1
MWS_VERIFY_DEFAULT = 0
MWS_VERIFY_ON = 1
MWS_VERIFY_OFF = 2
MWS_GUARD_VTABLE_VERSION = 1
MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION = 1


class mws_store_options(CStruct):
    _fields_ = [
        ("key_prefix", c_char_p),
        ("max_range_bytes", c_uint64),
        ("max_ranges_per_request", c_uint64),
        ("max_region_segments", c_uint64),
        ("copy_hook", c_void_p),
        ("copy_hook_ctx", c_void_p),
        ("staging_bytes", c_uint64),
        ("max_metadata_bytes", c_uint64),
        ("verify_integrity", c_uint32),
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


MWS_TRANSFER_ENGINE_VTABLE_VERSION = 1
MWS_TRANSFER_READ = 0
MWS_TRANSFER_WRITE = 1

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
    # store
    "mws_store_open_memory": (c_int, [POINTER(mws_store_options), POINTER(_p)]),
    "mws_store_open_dir": (c_int, [c_char_p, POINTER(mws_store_options), POINTER(_p)]),
    "mws_store_from_vtable": (c_int, [POINTER(mws_store_vtable), c_void_p, POINTER(_p)]),
    "mws_store_from_vtable_with_options": (c_int, [POINTER(mws_store_vtable), c_void_p, POINTER(mws_store_options), POINTER(_p)]),
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
    # writer
    "mws_writer_new": (c_int, [_p, POINTER(mws_snapshot_descriptor), POINTER(mws_snapshot_adapter_vtable), c_void_p, POINTER(mws_upload_options), POINTER(_p)]),
    "mws_writer_write_tensor": (c_int, [_p, c_char_p, c_void_p, POINTER(_p)]),
    "mws_writer_commit": (c_int, [_p, POINTER(_p)]),
    "mws_writer_abort": (c_int, [_p]),
    "mws_writer_set_progress": (c_int, [_p, PROGRESS_FN, c_void_p]),
    "mws_writer_upload_plan": (c_int, [_p, POINTER(_p)]),
    "mws_writer_free": (None, [_p]),
}


def register_prototypes(protos: Dict[str, Tuple[Any, List[Any]]]) -> None:
    """Adds prototypes (used by modules that bind newer parts of the ABI)."""
    PROTOTYPES.update(protos)


# --------------------------------------------------------------------------- loading


def _candidate_paths() -> Iterable[str]:
    env = os.environ.get("MWS_LIBRARY")
    if env:
        p = Path(env)
        if p.is_dir():
            yield str(p / LIB_NAME)
            yield str(p / SONAME)
        else:
            yield str(p)
        return  # an explicit choice is never second-guessed
    yield from packaged_libraries()
    for var in ("MWS_PREFIX", "CMAKE_INSTALL_PREFIX"):
        prefix = os.environ.get(var)
        if prefix:
            for sub in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
                yield str(Path(prefix) / sub / LIB_NAME)
    seen = set()
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for d in (start, *start.parents):
            if d in seen:
                continue
            seen.add(d)
            if (d / "Cargo.toml").is_file():
                for profile in ("release", "debug"):
                    yield str(d / "target" / profile / LIB_NAME)
    yield SONAME
    found = ctypes.util.find_library("mooncake_weight_store")
    if found:
        yield found


def packaged_libraries() -> List[str]:
    """The shared library the wheel placed inside this package (setuptools-rust names
    it ``libmooncake_weight_store.abi3.so``), if any."""
    here = Path(__file__).resolve().parent
    return [str(p) for p in sorted(here.glob("libmooncake_weight_store*.so*"))]


class _Library:
    """The loaded library plus lazily bound, typed functions."""

    def __init__(self) -> None:
        self._cdll: Optional[ctypes.CDLL] = None
        self.path: str = ""
        self._funcs: Dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self) -> ctypes.CDLL:
        errors = []
        for cand in _candidate_paths():
            if os.sep in cand and not os.path.exists(cand):
                errors.append(f"{cand}: not found")
                continue
            try:
                cdll = ctypes.CDLL(cand)
            except OSError as e:
                errors.append(f"{cand}: {e}")
                continue
            self.path = cand
            return cdll
        raise LibraryNotFoundError(
            "cannot load libmooncake_weight_store (set MWS_LIBRARY to the .so, or MWS_PREFIX "
            "to a CMake install prefix; build it with `cargo build --release`). Tried: "
            + "; ".join(errors)
        )

    @property
    def cdll(self) -> ctypes.CDLL:
        if self._cdll is None:
            with self._lock:
                if self._cdll is None:
                    self._cdll = self._load()
        return self._cdll

    def has(self, name: str) -> bool:
        try:
            getattr(self.cdll, name)
            return True
        except AttributeError:
            return False

    def fn(self, name: str) -> Any:
        f = self._funcs.get(name)
        if f is not None:
            return f
        try:
            f = getattr(self.cdll, name)
        except AttributeError:
            raise MissingSymbolError(name, self.path) from None
        proto = PROTOTYPES.get(name)
        if proto is None:
            raise MissingSymbolError(name + " (no Python prototype)", self.path)
        f.restype, f.argtypes = proto
        f = _checked(name, f)
        self._funcs[name] = f
        return f

    def exported(self) -> List[str]:
        """Names of the prototyped functions the loaded library exports."""
        return sorted(n for n in PROTOTYPES if self.has(n))


LIB = _Library()


def last_error() -> str:
    raw = LIB.fn("mws_last_error_message")()
    return raw.decode("utf-8", "replace") if raw else ""


def status_name(status: int) -> str:
    raw = LIB.fn("mws_status_name")(int(status))
    return raw.decode() if raw else "MWS_UNKNOWN_STATUS"


def check(status: int) -> None:
    """Raises the matching :class:`MwsError` for a non-zero status (reads the last
    error on the calling thread, so call it right after the failed function)."""
    if status != Status.OK:
        msg = last_error()
        raise error_for_status(status, msg, status_name(status))


def call(name: str, *args: Any) -> None:
    """Calls a status-returning function and raises on failure."""
    check(LIB.fn(name)(*args))


def borrowed_str(name: str, handle: Any) -> str:
    """Calls a ``const char *f(handle, size_t *len)`` accessor and decodes the result
    (length-aware, so an interior NUL is kept)."""
    with handle._use() if isinstance(handle, OwnedHandle) else contextlib.nullcontext():
        n = c_size_t(0)
        ptr = LIB.fn(name)(handle, ctypes.byref(n))
        if not ptr:
            msg = last_error()
            raise error_for_status(Status.NULL_ARGUMENT, msg or f"{name} returned NULL")
        return ctypes.string_at(ptr, n.value).decode("utf-8")


_Self = TypeVar("_Self", bound="OwnedHandle")


class OwnedHandle:
    """A library handle this object owns: freed exactly once, by :meth:`close`, at
    the end of a ``with`` block, or when the object is collected.

    Every class that owns a library handle derives from this one; the lifecycle is
    written here only. Subclasses name their free function (``_FREE``) and what they
    are (``_WHAT``, for messages), and extend the lifecycle through these hooks
    instead of re-implementing it:

    * ``keep`` (constructor) / :meth:`_keep_alive`: Python objects the C object
      borrows from (bindings whose buffers a plan records, the engine of a loader,
      ...); referenced until the handle is freed, released right after the free;
    * :meth:`_on_exit`: what leaving a ``with`` block does before the free (commit
      or abort a writer, close a lease with a terminal state); ``_FREE_ON_EXIT =
      False`` keeps the handle after the block (a transaction stays readable);
    * :meth:`_after_free`: releases what the object owns beside the handle once the
      library no longer uses it (buffer exports, buried vtable bridges).

    Lifetimes and threads (the rule of every handle):

    * **No free under a running call.** A library call that takes this object (not
      its bare ``handle``) as an argument holds it in use until it returns;
      :meth:`close` from another thread waits for those calls, and a close from
      inside one of them (a callback on the same thread) is done when that call
      returns. No call starts once :meth:`close` was called (``ArgumentError``:
      "<what> is closed").
    * **No free under a borrower.** A handle kept by another (``keep``: the bindings
      of a prepared transfer, a plan's placements, ...) is lent to it: closing it
      refuses further calls at once, but the free (and :meth:`_after_free`, which
      releases buffer exports) waits until every handle that keeps it is freed.

    :meth:`close` is the public way to free (a subclass whose ``close`` means
    something else, e.g. closing a lease, frees with :meth:`_free`);
    ``__del__`` always frees with :meth:`_free` and never raises. A handle
    created in two steps (``__init__`` first, the library call later) starts as
    ``None`` and is set with :meth:`_adopt`.
    """

    _FREE = ""
    _WHAT = "handle"
    #: the word in "<what> is <gone>" once the handle was freed
    _GONE = "closed"
    _FREE_ON_EXIT = True
    #: public methods that run without holding the handle (close itself; calls that
    #: must reach a handle while another call runs, such as cancel)
    _UNHELD: Tuple[str, ...] = ("close",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every public method and property of a subclass holds the handle in use
        while it runs (see the class), so that what it reads from the handle after a
        library call (a report, a lent string) cannot be freed by a concurrent
        :meth:`close`."""
        super().__init_subclass__(**kwargs)
        for name, attr in list(vars(cls).items()):
            if name.startswith("_") or name in cls._UNHELD:
                continue
            if isinstance(attr, property) and attr.fget is not None:
                setattr(cls, name, property(_held(attr.fget), attr.fset, attr.fdel, attr.__doc__))
            elif inspect.isfunction(attr):
                setattr(cls, name, _held(attr))

    def __init__(self, handle: Optional[int] = None, keep: Iterable[object] = ()) -> None:
        self._h: Optional[int] = handle or None
        self._keep: List[object] = []
        self._cv = threading.Condition(threading.Lock())
        self._calls: Dict[int, int] = {}  # thread id -> calls of that thread holding the handle
        self._closing = False  # close() was called: no new call
        self._borrowers = 0  # handles keeping this one (see _keep_alive)
        self._waiting = 0  # closes waiting for the calls to return (they free it)
        self._keep_alive(*keep)

    def _adopt(self, handle: Optional[int]) -> None:
        """Takes ownership of ``handle`` (created after ``__init__``)."""
        self._h = handle or None

    def _keep_alive(self, *objects: object) -> None:
        """References ``objects`` until the handle is freed; a kept handle is lent to
        this one (its free waits for this one's)."""
        for o in objects:
            if isinstance(o, OwnedHandle):
                with o._cv:
                    o._borrowers += 1
        self._keep.extend(objects)

    @property
    def handle(self) -> int:
        """The raw handle (for code that calls the library itself: pass the object to
        a ``LIB.fn`` function instead, which holds it in use for the call)."""
        h = self._h
        if h is None or self._closing:
            raise ArgumentError(f"{self._WHAT} is {self._GONE}")
        return h

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        """Holds the handle in use for a block (its handle; ``ArgumentError`` when
        closed)."""
        h = self._enter()
        try:
            yield h
        finally:
            self._leave()

    def _enter(self) -> int:
        """Holds the handle in use by one call of this thread (see :meth:`_leave`)."""
        with self._cv:
            if self._h is None or self._closing:
                raise ArgumentError(f"{self._WHAT} is {self._GONE}")
            t = threading.get_ident()
            self._calls[t] = self._calls.get(t, 0) + 1
            return self._h

    def _leave(self) -> None:
        """Ends one call's use; the last one does a free that waited for it."""
        with self._cv:
            t = threading.get_ident()
            n = self._calls.get(t, 0) - 1
            if n > 0:
                self._calls[t] = n
            else:
                self._calls.pop(t, None)
            ready = (self._closing and not self._calls and not self._borrowers and not self._waiting
                     and self._h is not None)
            self._cv.notify_all()
        if ready:
            self._release()

    def _returned(self) -> None:
        """A handle that kept this one was freed; the last does a deferred free."""
        with self._cv:
            self._borrowers -= 1
            ready = (self._closing and not self._calls and not self._borrowers and not self._waiting
                     and self._h is not None)
        if ready:
            self._release()

    def _free(self) -> None:
        """Frees the handle once no call and no borrower uses it (once; later calls
        do nothing), then releases the kept objects and runs :meth:`_after_free`.
        Waits for the calls of other threads; from inside a call of this thread, or
        while borrowed, the free happens when the last of them ends."""
        with self._cv:
            if self._h is None:
                return
            self._closing = True
            if threading.get_ident() in self._calls or self._borrowers:
                return  # done by the last _leave / _returned
            self._waiting += 1
            try:
                while self._calls:
                    self._cv.wait()
            finally:
                self._waiting -= 1
            if self._borrowers:
                return  # lent while waiting: done by the last _returned
        self._release()

    def _release(self) -> None:
        """The free itself: at most once, with no call and no borrower left."""
        with self._cv:
            h, self._h = self._h, None
        if not h:
            return
        keep, self._keep = self._keep, []
        try:
            LIB.fn(self._FREE)(h)
        finally:
            try:
                self._after_free()
            finally:
                for o in keep:
                    if isinstance(o, OwnedHandle):
                        o._returned()

    def _after_free(self) -> None:
        """Hook: runs once, right after the handle was freed."""

    def _on_exit(self, exc_type: Any, exc: Any) -> None:
        """Hook: runs when a ``with`` block ends, before the free."""

    def close(self) -> None:
        """Frees the handle (idempotent; see the class for when the free happens)."""
        self._free()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        try:
            self._on_exit(exc_type, exc)
        finally:
            if self._FREE_ON_EXIT:
                self._free()

    def __del__(self) -> None:
        try:
            if getattr(self, "_cv", None) is not None:
                self._free()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def _s(self, name: str) -> str:
        return borrowed_str(name, self)


def _held(f: Any) -> Any:
    """``f`` (a method of an :class:`OwnedHandle`) holding its handle in use while it
    runs; on a closed handle it runs as it is (and fails where it needs the handle)."""

    @functools.wraps(f)
    def held(self: "OwnedHandle", *args: Any, **kwargs: Any) -> Any:
        try:
            self._enter()
        except ArgumentError:
            return f(self, *args, **kwargs)
        try:
            return f(self, *args, **kwargs)
        finally:
            self._leave()

    return held


def cstr(s: Optional[str], what: str = "string") -> Optional[bytes]:
    """Encodes a Python string for a ``const char *`` argument (NUL-terminated UTF-8).
    An interior NUL cannot be represented and is rejected here."""
    if s is None:
        return None
    if not isinstance(s, str):
        raise ArgumentError(f"{what} must be a str, not {type(s).__name__}")
    b = s.encode("utf-8", "surrogatepass")
    if b"\0" in b:
        raise ArgumentError(f"{what} must not contain a NUL character")
    return b


def u64_array(values: Sequence[int], what: str) -> Any:
    vals = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentError(f"{what} must contain integers")
        if v < 0 or v >= 1 << 64:
            raise ArgumentError(f"{what} values must fit in an unsigned 64-bit integer")
        vals.append(v)
    return (c_uint64 * len(vals))(*vals)


def version() -> str:
    """The loaded library's version string (``MAJOR.MINOR.PATCH``)."""
    return LIB.fn("mws_version")().decode()


def library_path() -> str:
    """The path the shared library was loaded from."""
    _ = LIB.cdll
    return LIB.path


__all__ = [
    "LIB",
    "check",
    "call",
    "borrowed_str",
    "cstr",
    "last_error",
    "status_name",
    "version",
    "library_path",
    "MwsError",
]
