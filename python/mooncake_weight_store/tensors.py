"""Tensors as frameworks hold them: DLPack, the array interfaces, the buffer protocol.

:func:`tensor_view` turns a framework tensor into a :class:`TensorView`: the address,
byte size, shape, byte strides, dtype name and device of its memory, plus a hold on
the memory (a DLPack managed tensor, a buffer export, or a reference to the owner)
that lasts until :meth:`TensorView.release`. Sources, tried in this order:

1. ``torch.Tensor`` (and ``nn.Parameter``): detached, then through ``__dlpack__``;
   torch's own accessors when its DLPack export refuses the dtype (older torch and
   float8); a lazily conjugated or negated view (torch's conjugate or negative bit,
   ``x.conj()``) is refused with :class:`TensorError` (its memory does not hold its
   values);
2. anything with ``__dlpack__`` (numpy >= 1.22, jax, cupy, ...): the capsule is
   consumed here with ctypes (``DLManagedTensorVersioned`` when the producer accepts
   ``max_version=(1, 0)``, else the legacy ``DLManagedTensor``), renamed ``used_*``
   and its deleter called on release;
3. ``__cuda_array_interface__`` (version 2 and 3; a given ``stream`` is synchronized
   through the CUDA runtime before use);
4. ``__array_interface__`` (version 3);
5. the buffer protocol (``bytearray``, ``mmap``, ``memoryview``, ``array.array``,
   ctypes arrays, ...).

Dtype names are spelled as the frameworks spell them (``bfloat16``,
``float8_e4m3fn``, ``torch.float16``, numpy's ``<f4``, safetensors' ``BF16``, ...)
and normalised to the names written into placements (the table :data:`DTYPES`;
the specification treats ``dtype`` as opaque, these are torch's spellings).

Only C-contiguous memory is accepted (a tensor's bytes must be its canonical
row-major layout); a non-contiguous view fails with :class:`NonContiguousError`
naming the shape and strides, before anything is bound. Dimensions of extent 1 may
have any stride. Device memory (CUDA) is reported as ``memory_kind=DEVICE`` with its
ordinal; stores reach it through a device engine (:mod:`mooncake_weight_store.device`).
"""

from __future__ import annotations

import ctypes
import math
import sys
from ctypes import POINTER, Structure, c_char_p, c_int32, c_int64, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .binding import MemoryKind
from .errors import ArgumentError, LocalError, Status
from .buffers import BufferRef

__all__ = [
    "DType",
    "DTYPES",
    "dtype_info",
    "dtype_name",
    "TensorError",
    "NonContiguousError",
    "UnsupportedDTypeError",
    "UnsupportedDeviceError",
    "TensorView",
    "tensor_view",
    "canonical_strides",
]


# --------------------------------------------------------------------------- errors


class TensorError(LocalError, ValueError):
    """A tensor source that cannot be used as it is (an :class:`MwsError` with status
    ``INVALID_ARGUMENT``, and a ``ValueError``)."""


class NonContiguousError(TensorError):
    """The tensor's memory is not its canonical C-contiguous (row-major) layout."""


class UnsupportedDTypeError(TensorError):
    """A dtype that has no name in :data:`DTYPES` (or no safetensors code), or whose
    bytes cannot be stored as they are (strings, objects); status ``UNSUPPORTED``."""

    default_status = Status.UNSUPPORTED


class UnsupportedDeviceError(TensorError):
    """Memory on a device this library cannot reach (not host, not CUDA); status
    ``UNSUPPORTED``."""

    default_status = Status.UNSUPPORTED


# --------------------------------------------------------------------------- dtypes


@dataclass(frozen=True)
class DType:
    """One element type: its placement name, item size, safetensors code, DLPack
    ``(code, bits)`` and numpy type name (``None`` where the format has none)."""

    name: str
    itemsize: int
    safetensors: Optional[str]
    dlpack: Optional[Tuple[int, int]]
    numpy: Optional[str]


# DLPack type codes (dlpack.h, 1.1).
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat, _kDLComplex, _kDLBool = 0, 1, 2, 4, 5, 6

DTYPES: Dict[str, DType] = {
    d.name: d
    for d in (
        DType("bool", 1, "BOOL", (_kDLBool, 8), "bool"),
        DType("uint8", 1, "U8", (_kDLUInt, 8), "uint8"),
        DType("int8", 1, "I8", (_kDLInt, 8), "int8"),
        DType("uint16", 2, "U16", (_kDLUInt, 16), "uint16"),
        DType("int16", 2, "I16", (_kDLInt, 16), "int16"),
        DType("uint32", 4, "U32", (_kDLUInt, 32), "uint32"),
        DType("int32", 4, "I32", (_kDLInt, 32), "int32"),
        DType("uint64", 8, "U64", (_kDLUInt, 64), "uint64"),
        DType("int64", 8, "I64", (_kDLInt, 64), "int64"),
        DType("float16", 2, "F16", (_kDLFloat, 16), "float16"),
        DType("bfloat16", 2, "BF16", (_kDLBfloat, 16), "bfloat16"),
        DType("float32", 4, "F32", (_kDLFloat, 32), "float32"),
        DType("float64", 8, "F64", (_kDLFloat, 64), "float64"),
        DType("complex64", 8, "C64", (_kDLComplex, 64), "complex64"),
        DType("complex128", 16, None, (_kDLComplex, 128), "complex128"),
        DType("float8_e4m3fn", 1, "F8_E4M3", (10, 8), "float8_e4m3fn"),
        DType("float8_e4m3fnuz", 1, None, (11, 8), "float8_e4m3fnuz"),
        DType("float8_e5m2", 1, "F8_E5M2", (12, 8), "float8_e5m2"),
        DType("float8_e5m2fnuz", 1, None, (13, 8), "float8_e5m2fnuz"),
        DType("float8_e8m0fnu", 1, "F8_E8M0", (14, 8), "float8_e8m0fnu"),
    )
}

_ALIASES: Dict[str, str] = {  # lower-case spellings (torch, jax, common shorthands)
    "half": "float16", "float": "float32", "double": "float64", "long": "int64", "int": "int32",
    "short": "int16", "byte": "uint8", "char": "int8", "cfloat": "complex64", "cdouble": "complex128",
    "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64", "f16": "float16",
    "f32": "float32", "f64": "float64", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
    "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "bool_": "bool",
}
# numpy typestr kinds + item size ("<f4", "|b1"; the byte-order character is checked apart)
_TYPESTR: Dict[str, str] = {
    "f2": "float16", "f4": "float32", "f8": "float64", "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64", "b1": "bool", "c8": "complex64",
    "c16": "complex128",
}
# safetensors codes (upper case, exact)
_SAFETENSORS: Dict[str, str] = {d.safetensors: d.name for d in DTYPES.values() if d.safetensors}
_DLPACK: Dict[Tuple[int, int], str] = {d.dlpack: d.name for d in DTYPES.values() if d.dlpack}
_BUFFER_FORMATS: Dict[str, str] = {
    "?": "bool", "b": "int8", "B": "uint8", "c": "uint8", "h": "int16", "H": "uint16", "i": "int32",
    "I": "uint32", "q": "int64", "Q": "uint64", "e": "float16", "f": "float32", "d": "float64",
    "Zf": "complex64", "Zd": "complex128",
}
if ctypes.sizeof(ctypes.c_long) == 8:
    _BUFFER_FORMATS.update({"l": "int64", "L": "uint64"})
else:  # pragma: no cover - LLP64 / 32-bit
    _BUFFER_FORMATS.update({"l": "int32", "L": "uint32"})


def _normalize_name(text: str) -> Optional[str]:
    s = text.strip()
    if s in _SAFETENSORS:
        return _SAFETENSORS[s]
    for prefix in ("torch.", "jax.numpy.", "jnp.", "numpy.", "np.", "ml_dtypes."):
        if s.startswith(prefix):
            s = s[len(prefix):]
    if s in DTYPES:
        return s
    low = s.lower()
    if low in DTYPES:
        return low
    if len(s) > 2 and s[0] in "<=|>":  # a numpy typestr: its kind letter is case-sensitive
        if s[0] == ">" and sys.byteorder == "little" and s[2:] not in ("1",):
            return None  # big-endian data: not this machine's layout
        return _TYPESTR.get(s[1:])  # "<U2" (unicode) is not "<u2" (uint16)
    return _ALIASES.get(low)


def dtype_name(dtype: Any) -> str:
    """The placement name of ``dtype``: a name string in any common spelling
    (``"bf16"``, ``"torch.bfloat16"``, ``"<f4"``, ``"F8_E4M3"``), a numpy or
    ml_dtypes dtype, a torch or jax dtype, or a :class:`DType`. Raises
    :class:`UnsupportedDTypeError`."""
    if isinstance(dtype, DType):
        return dtype.name
    candidates: List[str] = []
    if isinstance(dtype, str):
        candidates.append(dtype)
    else:
        name = getattr(dtype, "name", None)
        if isinstance(name, str):
            candidates.append(name)
        candidates.append(str(dtype))
        if isinstance(dtype, type):
            candidates.append(dtype.__name__)
    for c in candidates:
        n = _normalize_name(c)
        if n is not None:
            return n
    raise UnsupportedDTypeError(
        f"unsupported dtype {dtype!r}: supported are {', '.join(DTYPES)} (any common spelling)")


def dtype_info(dtype: Any) -> DType:
    """The :class:`DType` of ``dtype`` (see :func:`dtype_name`)."""
    return DTYPES[dtype_name(dtype)]


def canonical_strides(shape: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    """Row-major byte strides of ``shape``."""
    st = [0] * len(shape)
    acc = itemsize
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= max(int(shape[d]), 1)
    return tuple(st)


# --------------------------------------------------------------------------- view


class TensorView:
    """The memory of one tensor: ``address`` (first byte), ``nbytes``, ``shape``,
    ``strides`` (bytes, canonical), ``dtype`` (placement name), ``itemsize``,
    ``memory_kind`` (:class:`MemoryKind`), ``device_ordinal``, ``device`` (``"cpu"`` or
    ``"cuda:N"``), ``readonly`` and ``source`` (which protocol produced it).

    Holds the memory (DLPack managed tensor, buffer export, or the owner object)
    until :meth:`release`; a context manager. Not thread-safe; read-only use is.
    """

    __slots__ = ("address", "nbytes", "shape", "strides", "dtype", "itemsize", "memory_kind", "device_ordinal",
                 "readonly", "source", "obj", "_release", "_held")

    def __init__(self, *, address: int, shape: Sequence[int], dtype: str, readonly: bool, source: str,
                 obj: Any = None, memory_kind: MemoryKind = MemoryKind.HOST, device_ordinal: int = 0,
                 release: Optional[Callable[[], None]] = None) -> None:
        info = DTYPES[dtype]
        self.address = int(address)
        self.shape: Tuple[int, ...] = tuple(int(s) for s in shape)
        self.dtype = info.name
        self.itemsize = info.itemsize
        self.nbytes = math.prod(self.shape) * info.itemsize
        self.strides = canonical_strides(self.shape, info.itemsize)
        self.memory_kind = MemoryKind(memory_kind)
        self.device_ordinal = int(device_ordinal)
        self.readonly = bool(readonly)
        self.source = source
        self.obj = obj
        self._release = release
        self._held = True

    @property
    def device(self) -> str:
        return "cpu" if self.memory_kind == MemoryKind.HOST else f"cuda:{self.device_ordinal}"

    @property
    def is_device(self) -> bool:
        return self.memory_kind != MemoryKind.HOST

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        """Releases the hold on the memory (idempotent)."""
        if self._held:
            self._held = False
            rel, self._release = self._release, None
            self.obj = None
            if rel is not None:
                rel()

    def __enter__(self) -> "TensorView":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return (f"TensorView({self.dtype}{list(self.shape)}, {self.device}, {self.nbytes} bytes, "
                f"source={self.source}{', readonly' if self.readonly else ''}{'' if self._held else ', released'})")


def _what(name: Optional[str], obj: Any) -> str:
    return f"tensor {name!r}" if name else f"{type(obj).__module__}.{type(obj).__name__} object"


def _check_contiguous(shape: Sequence[int], strides_bytes: Optional[Sequence[int]], itemsize: int,
                      what: str) -> None:
    if strides_bytes is None:
        return
    if len(strides_bytes) != len(shape):
        raise TensorError(f"{what}: {len(strides_bytes)} strides for {len(shape)} dimensions")
    if any(int(s) == 0 for s in shape):
        return
    expected = canonical_strides(shape, itemsize)
    for d, (s, st, ex) in enumerate(zip(shape, strides_bytes, expected)):
        if int(s) > 1 and int(st) != ex:
            raise NonContiguousError(
                f"{what} is not C-contiguous: shape {tuple(int(x) for x in shape)}, byte strides "
                f"{tuple(int(x) for x in strides_bytes)}, expected {expected} (dimension {d}); pass a contiguous "
                f"copy (torch: .contiguous(), numpy: numpy.ascontiguousarray())")


def _resolve_dtype(obj: Any, proto_dtype: Optional[str], proto_itemsize: int, override: Optional[Any],
                   what: str) -> str:
    """The dtype of a source: the caller's override (a reinterpretation of equal item
    size), else the object's own ``dtype`` name when it names one of equal item size
    (``ml_dtypes`` bfloat16 shows up as ``V2`` in the array interface), else the
    protocol's."""
    if override is not None:
        name = dtype_name(override)
        if DTYPES[name].itemsize != proto_itemsize:
            raise TensorError(f"{what}: dtype {name} has item size {DTYPES[name].itemsize}, the memory has "
                              f"item size {proto_itemsize}; reinterpret only between equal item sizes")
        return name
    own = getattr(obj, "dtype", None)
    if own is not None:
        try:
            name = dtype_name(own)
            if DTYPES[name].itemsize == proto_itemsize:
                return name
        except UnsupportedDTypeError:
            pass
    if proto_dtype is None:
        raise UnsupportedDTypeError(f"{what}: unsupported dtype {own if own is not None else '?'} "
                                    f"(item size {proto_itemsize}); pass dtype= to name it")
    return proto_dtype


# --------------------------------------------------------------------------- DLPack


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", _DLDevice),
        ("ndim", c_int32),
        ("dtype", _DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class _DLManagedTensor(Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, c_void_p)
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class _DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class _DLManagedTensorVersioned(Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
        ("flags", c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DLPACK_FLAG_READ_ONLY = 1 << 0
_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm",
                 11: "ROCmHost", 12: "ExtDev", 13: "CUDAManaged", 14: "OneAPI", 15: "WebGPU", 16: "Hexagon",
                 17: "MAIA", 18: "Trn"}

# Capsule names: module constants, because PyCapsule_SetName keeps the pointer.
_NAME_LEGACY = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_USED_LEGACY = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int


def _dlpack_device(obj: Any) -> Optional[Tuple[int, int]]:
    f = getattr(obj, "__dlpack_device__", None)
    if not callable(f):
        return None
    dev = f()
    return int(dev[0]), int(dev[1])


def _take_capsule(capsule: Any) -> Tuple[int, bool]:
    """Consumes a DLPack capsule: returns (managed tensor address, versioned) and
    renames the capsule ``used_*`` so that its destructor leaves the tensor to us."""
    for name, used, versioned in ((_NAME_VERSIONED, _USED_VERSIONED, True), (_NAME_LEGACY, _USED_LEGACY, False)):
        if _api.PyCapsule_IsValid(capsule, name):
            ptr = _api.PyCapsule_GetPointer(capsule, name)
            if not ptr:
                raise TensorError("DLPack capsule holds a NULL tensor")
            if _api.PyCapsule_SetName(capsule, used) != 0:  # pragma: no cover - only on a bad capsule
                raise TensorError("cannot mark the DLPack capsule as consumed")
            return int(ptr), versioned
    raise TensorError(f"__dlpack__ returned {type(capsule).__name__}, not an unconsumed DLPack capsule")


def _from_dlpack(obj: Any, writable: bool, dtype: Optional[Any], what: str) -> TensorView:
    dev = _dlpack_device(obj)
    kwargs: Dict[str, Any] = {}
    if dev is not None and dev[0] in (_kDLCUDA, _kDLCUDAManaged):
        # 1 = the legacy default stream (DLPack's Python spec): the producer orders its
        # pending work before it. The device engine's copies are ordered after it when
        # they run on that stream or on the producer's current stream
        # (DeviceEngine.for_torch); an engine on a stream of its own is not ordered
        # against the producer (docs/DEVICE-MEMORY.md).
        kwargs["stream"] = 1
    try:
        capsule = obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer before DLPack 1.0 (no max_version)
        capsule = obj.__dlpack__(**kwargs)
    ptr, versioned = _take_capsule(capsule)
    if versioned:
        m = _DLManagedTensorVersioned.from_address(ptr)
        t = m.dl_tensor
        readonly = bool(m.flags & _DLPACK_FLAG_READ_ONLY)
        if m.version.major > 1:
            _call_deleter(m.deleter, ptr)
            raise TensorError(f"{what}: DLPack {m.version.major}.{m.version.minor} tensor (this library reads 1.x)")
    else:
        m = _DLManagedTensor.from_address(ptr)  # type: ignore[assignment]
        t = m.dl_tensor
        readonly = False  # legacy DLPack cannot say; producers refuse read-only exports
    deleter = m.deleter
    release = (lambda: _call_deleter(deleter, ptr))
    try:
        shape = tuple(int(t.shape[i]) for i in range(t.ndim)) if t.ndim else ()
        itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
        if t.dtype.lanes != 1:
            raise UnsupportedDTypeError(f"{what}: vector dtype (lanes={t.dtype.lanes}) is not supported")
        strides = (tuple(int(t.strides[i]) * itemsize for i in range(t.ndim)) if t.strides and t.ndim else None)
        _check_contiguous(shape, strides, itemsize, what)
        proto = _DLPACK.get((int(t.dtype.code), int(t.dtype.bits)))
        name = _resolve_dtype(obj, proto, itemsize, dtype, what)
        dt, did = int(t.device.device_type), int(t.device.device_id)
        if dt in (_kDLCPU, _kDLCUDAHost):
            kind, ordinal = MemoryKind.HOST, 0
        elif dt in (_kDLCUDA, _kDLCUDAManaged):
            kind, ordinal = MemoryKind.DEVICE, did
        else:
            raise UnsupportedDeviceError(f"{what} lives on a {_DEVICE_NAMES.get(dt, dt)} device; host (CPU) and "
                                         "CUDA memory are supported")
        if writable and readonly:
            raise TensorError(f"{what} is read-only (DLPack read-only flag); a restore target must be writable")
        address = (t.data or 0) + int(t.byte_offset)
        view = TensorView(address=address, shape=shape, dtype=name, readonly=readonly, source="dlpack", obj=obj,
                          memory_kind=kind, device_ordinal=ordinal, release=release)
    except BaseException:
        release()
        raise
    return view


def _call_deleter(deleter: Optional[int], ptr: int) -> None:
    if deleter:
        _DELETER(deleter)(ptr)


# --------------------------------------------------------------------------- array interfaces


#: Array-interface kinds whose bytes a tensor dtype can name ("V": raw, named by the
#: object's own dtype, e.g. ml_dtypes' bfloat16).
_NUMERIC_KINDS = frozenset("biufcV")
_KIND_NAMES = {"U": "unicode strings", "S": "byte strings", "O": "Python objects", "M": "datetimes",
               "m": "timedeltas"}


def _typestr_dtype(typestr: str, what: str) -> Tuple[Optional[str], int]:
    if not isinstance(typestr, str) or len(typestr) < 2:
        raise TensorError(f"{what}: malformed typestr {typestr!r}")
    order, kind, size = typestr[0], typestr[1], typestr[2:]
    if kind not in _NUMERIC_KINDS:
        # Strings ("U": UCS-4, the number counts characters; "S": bytes), objects,
        # dates: no tensor dtype names their bytes, so they are refused, never guessed.
        raise UnsupportedDTypeError(f"{what}: dtype {typestr!r} ({_KIND_NAMES.get(kind, 'kind ' + repr(kind))}) "
                                    "cannot be stored as a tensor; convert it to a numeric dtype first")
    if not size.isdigit():
        raise TensorError(f"{what}: malformed typestr {typestr!r}")
    itemsize = int(size)
    if order == ">" and itemsize > 1 and sys.byteorder == "little":
        raise UnsupportedDTypeError(f"{what}: big-endian data ({typestr}) is not supported; convert it to "
                                    "little-endian first")
    if kind == "V":
        return None, itemsize
    return _TYPESTR.get(f"{kind}{itemsize}"), itemsize


def _from_array_interface(obj: Any, iface: Dict[str, Any], writable: bool, dtype: Optional[Any], what: str,
                          cuda: bool) -> TensorView:
    if not isinstance(iface, dict):
        raise TensorError(f"{what}: the array interface is not a dict")
    shape = tuple(int(s) for s in iface.get("shape", ()))
    proto, itemsize = _typestr_dtype(iface.get("typestr", ""), what)
    if iface.get("mask") is not None:
        raise TensorError(f"{what}: masked arrays are not supported")
    data = iface.get("data")
    if data is None:
        raise TensorError(f"{what}: the array interface has no data pointer (a buffer-backed interface); "
                          "pass the array itself")
    if not isinstance(data, tuple) or len(data) != 2:
        raise TensorError(f"{what}: array interface 'data' must be (pointer, read_only)")
    address, readonly = int(data[0]), bool(data[1])
    address += int(iface.get("offset", 0) or 0)
    strides = iface.get("strides")
    _check_contiguous(shape, tuple(int(s) for s in strides) if strides is not None else None, itemsize, what)
    name = _resolve_dtype(obj, proto, itemsize, dtype, what)
    if writable and readonly:
        raise TensorError(f"{what} is read-only; a restore target must be writable")
    if cuda:
        from .device import cuda_pointer_device, cuda_synchronize_stream

        stream = iface.get("stream")
        if stream is not None and int(iface.get("version", 0)) >= 3:
            cuda_synchronize_stream(int(stream))
        ordinal = cuda_pointer_device(address) if address else 0
        return TensorView(address=address, shape=shape, dtype=name, readonly=readonly, obj=obj,
                          source="cuda_array_interface", memory_kind=MemoryKind.DEVICE, device_ordinal=ordinal)
    return TensorView(address=address, shape=shape, dtype=name, readonly=readonly, obj=obj, source="array_interface")


# --------------------------------------------------------------------------- buffer protocol


def _from_buffer(obj: Any, writable: bool, dtype: Optional[Any], what: str) -> TensorView:
    try:
        mv = memoryview(obj)
    except TypeError:
        raise ArgumentError(f"{what} is not a tensor: it has no __dlpack__, __cuda_array_interface__, "
                        "__array_interface__ or buffer protocol") from None
    with mv:
        fmt = mv.format or "B"
        shape = tuple(mv.shape or ())
        itemsize = mv.itemsize
        strides = tuple(mv.strides) if mv.strides is not None else None
        if mv.suboffsets:
            raise NonContiguousError(f"{what}: indirect (PIL-style) buffers are not supported")
        _check_contiguous(shape, strides, itemsize, what)
        if writable and mv.readonly:
            raise TensorError(f"{what} is read-only; a restore target must be writable")
        f = fmt[1:] if fmt[:1] in "@=<" else fmt
        if fmt[:1] in ">!" and itemsize > 1:
            raise UnsupportedDTypeError(f"{what}: big-endian buffer format {fmt!r} is not supported")
        proto = _BUFFER_FORMATS.get(f)
        readonly = mv.readonly
    name = _resolve_dtype(obj, proto, itemsize, dtype, what)
    ref = BufferRef(obj, writable=writable)
    return TensorView(address=ref.address, shape=shape, dtype=name, readonly=readonly, obj=obj, source="buffer",
                      release=ref.release)


# --------------------------------------------------------------------------- torch


def _is_torch(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    return (mod == "torch" or mod.startswith("torch.")) and hasattr(obj, "data_ptr")


def _from_torch_accessors(t: Any, writable: bool, dtype: Optional[Any], what: str) -> TensorView:
    itemsize = int(t.element_size())
    shape = tuple(int(s) for s in t.shape)
    _check_contiguous(shape, tuple(int(s) * itemsize for s in t.stride()), itemsize, what)
    proto = _normalize_name(str(t.dtype))
    name = _resolve_dtype(t, proto, itemsize, dtype, what)
    dev = t.device
    if dev.type == "cpu":
        kind, ordinal = MemoryKind.HOST, 0
    elif dev.type == "cuda":
        kind, ordinal = MemoryKind.DEVICE, int(dev.index or 0)
    else:
        raise UnsupportedDeviceError(f"{what} lives on torch device {dev}; cpu and cuda are supported")
    return TensorView(address=int(t.data_ptr()), shape=shape, dtype=name, readonly=False, obj=t, source="torch",
                      memory_kind=kind, device_ordinal=ordinal)


# --------------------------------------------------------------------------- entry point


def tensor_view(obj: Any, *, writable: bool = False, dtype: Optional[Any] = None,
                name: Optional[str] = None) -> TensorView:
    """The memory of tensor ``obj`` (see the module doc for the accepted sources).

    Args:
        writable: require writable memory (restore targets).
        dtype: name the element type (any spelling :func:`dtype_name` accepts) when
            the source cannot (raw bytes, ``uint16`` holding bfloat16): a
            reinterpretation between equal item sizes.
        name: the tensor's name, for messages.

    Raises :class:`NonContiguousError`, :class:`UnsupportedDTypeError`,
    :class:`UnsupportedDeviceError`, :class:`TensorError` (read-only target, malformed
    interface) or ``TypeError`` (not a tensor).
    """
    if isinstance(obj, TensorView):
        if writable and obj.readonly:
            raise TensorError(f"{_what(name, obj)} is read-only; a restore target must be writable")
        if not obj.held:
            raise TensorError(f"{_what(name, obj)} was released")
        return obj
    what = _what(name, obj)
    if _is_torch(obj):
        t = obj.detach() if getattr(obj, "requires_grad", False) else obj
        # A lazily conjugated or negated view shares its base's memory, whose bytes
        # are not the tensor's values: saving it would store the base's values,
        # restoring into it would show them conjugated/negated. (torch's DLPack export
        # refuses the conjugate bit but not the negative bit.)
        for flag, resolve in (("is_conj", "resolve_conj"), ("is_neg", "resolve_neg")):
            if callable(getattr(t, flag, None)) and getattr(t, flag)():
                raise TensorError(f"{what} has torch's {flag[3:]} bit set: its memory holds the "
                                  f"{'un-conjugated' if flag == 'is_conj' else 'un-negated'} values; pass "
                                  f"t.{resolve}() (a restore target must not be such a view)")
        try:
            return _from_dlpack(t, writable, dtype, what)
        except (NonContiguousError, UnsupportedDeviceError):
            raise
        except (BufferError, RuntimeError, TypeError, TensorError):
            return _from_torch_accessors(t, writable, dtype, what)
    errors: List[str] = []
    if callable(getattr(obj, "__dlpack__", None)):
        try:
            return _from_dlpack(obj, writable, dtype, what)
        except (NonContiguousError, UnsupportedDeviceError):
            raise
        except (BufferError, TypeError, RuntimeError, TensorError) as e:
            # e.g. numpy refuses DLPack for read-only arrays (legacy protocol) or for
            # dtypes DLPack has no code for (ml_dtypes); the array interface can say.
            errors.append(f"__dlpack__: {e}")
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_array_interface(obj, cai, writable, dtype, what, cuda=True)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return _from_array_interface(obj, ai, writable, dtype, what, cuda=False)
    try:
        return _from_buffer(obj, writable, dtype, what)
    except TypeError:
        if errors:
            raise TensorError(f"{what}: " + "; ".join(errors)) from None
        raise
