"""Device memory: the library's device engines, and CUDA helpers loaded with ctypes.

Device bytes move only through a **device engine** (``mws_device_engine``;
docs/DEVICE-MEMORY.md): a store opened with one (``Store.memory(device_engine=...)``,
``Store.directory(path, device_engine=...)``, ``Store.from_backend(...,
device_engine=...)``) stages device sources and targets in host buffers of the engine,
in batches (the store itself sees host bytes only; restores are verified before a
byte reaches the device), and ``TransferEngine.local(device_engine=...)`` copies device
segments of live transfers through it. A store without one refuses device fragments
with :class:`~mooncake_weight_store.errors.UnsupportedError` before any I/O.

* :meth:`DeviceEngine.cuda`: CUDA's driver, opened by the library at run time, on a
  stream of yours (``stream=torch.cuda.current_stream().cuda_stream``) or its own;
  :meth:`DeviceEngine.for_torch` picks the current device and stream.
* :meth:`DeviceEngine.fenced`: a test device whose memory the host cannot touch (any
  host access crashes the process); :meth:`DeviceEngine.fenced_alloc` hands out its
  memory, :meth:`DeviceEngine.copy` moves bytes in and out.
* :func:`cuda_available`, :func:`cuda_pointer_device`, :func:`cuda_synchronize_stream`:
  what the tensor adapters ask of CUDA (``libcudart`` or ``libcuda`` through ctypes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from ctypes import POINTER, c_int, c_uint64, c_void_p
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import ArgumentError
from . import _abi
from . import errors as _errors
from ._lib import OwnedHandle, call

__all__ = [
    "DeviceEngine",
    "DeviceUnavailableError",
    "CudaError",
    "cuda_available",
    "cuda_pointer_device",
    "cuda_synchronize_stream",
]

#: Directions of :meth:`DeviceEngine.copy`.
HOST_TO_DEVICE = 1
DEVICE_TO_HOST = 2
DEVICE_TO_DEVICE = 3
_DIRECTIONS = {"h2d": HOST_TO_DEVICE, "d2h": DEVICE_TO_HOST, "d2d": DEVICE_TO_DEVICE,
               HOST_TO_DEVICE: HOST_TO_DEVICE, DEVICE_TO_HOST: DEVICE_TO_HOST, DEVICE_TO_DEVICE: DEVICE_TO_DEVICE}


class DeviceUnavailableError(_errors.LocalError, RuntimeError):
    """Device memory was given but no way to reach it exists (no CUDA runtime);
    status ``UNSUPPORTED``."""

    default_status = _errors.Status.UNSUPPORTED


class CudaError(_errors.LocalError, RuntimeError):
    """A CUDA runtime or driver call failed (status ``IO``; also a ``RuntimeError``)."""

    default_status = _errors.Status.IO


class DeviceEngine(OwnedHandle):
    """A device engine (``mws_device_engine``): moves batches of copies between host
    and device memory. Stores and transfer engines given one keep their own
    reference, so closing this object early is safe. Thread-safe.
    """

    _FREE = "mws_device_engine_free"
    _WHAT = "device engine"

    def __init__(self, handle: Optional[int], kind: str) -> None:
        super().__init__(handle)
        self.kind = kind

    @classmethod
    def cuda(cls, ordinal: int = 0, stream: Optional[int] = None) -> "DeviceEngine":
        """The CUDA engine of device ``ordinal`` (its primary context, the one torch
        uses), copying on ``stream`` (a ``CUstream`` / ``cudaStream_t`` as an integer,
        e.g. ``torch.cuda.current_stream().cuda_stream``; 0 = the legacy default
        stream; None = a stream of the engine's own). A batch runs after the work
        queued on that stream before the call, and is complete when the library call
        returns. An engine on a stream of its own is not ordered against work on
        other streams: synchronize them first, or use :meth:`for_torch`. Raises :class:`~mooncake_weight_store.errors.UnsupportedError` without
        an NVIDIA driver."""
        out = c_void_p()
        s = None if stream is None else ctypes.byref(c_uint64(int(stream)))
        call("mws_device_engine_new_cuda", int(ordinal), s, ctypes.byref(out))
        return cls(out.value, f"cuda:{int(ordinal)}")

    @classmethod
    def for_torch(cls, device: Any = None) -> "DeviceEngine":
        """The CUDA engine of a torch device (default: the current one), on torch's
        current stream of that device."""
        import torch  # noqa: PLC0415 - optional dependency

        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            raise ArgumentError(f"for_torch needs a CUDA device, not {dev}")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return cls.cuda(index, torch.cuda.current_stream(index).cuda_stream)

    @classmethod
    def fenced(cls, capacity: int, ordinal: int = 0) -> "DeviceEngine":
        """A fenced test device of ``capacity`` bytes: its memory faults on any host
        access; only this engine reaches it (:meth:`fenced_alloc`, :meth:`copy`)."""
        out = c_void_p()
        call("mws_device_engine_new_fenced", int(ordinal), int(capacity), ctypes.byref(out))
        return cls(out.value, f"fenced:{int(ordinal)}")

    def fenced_alloc(self, nbytes: int) -> int:
        """``nbytes`` of the fenced device's memory (256-byte aligned): its address."""
        out = c_uint64(0)
        call("mws_device_engine_fenced_alloc", self, int(nbytes), ctypes.byref(out))
        return int(out.value)

    def copy(self, ranges: Iterable[Tuple[int, int, int]], direction: Any, ordinal: int = 0) -> int:
        """Copies ``(source, target, nbytes)`` ranges (addresses as integers) in
        ``direction`` (``"h2d"``, ``"d2h"``, ``"d2d"``) on device ``ordinal``, as one
        batch, coalesced into 2-D copies; waits for it. Every range of one call must
        lie, on each side, in one allocation. Returns the number of copies made."""
        d = _DIRECTIONS.get(direction)
        if d is None:
            raise ArgumentError(f"direction must be 'h2d', 'd2h' or 'd2d', not {direction!r}")
        rs: Sequence[Tuple[int, int, int]] = list(ranges)
        arr = (_abi.mws_copy_range * max(len(rs), 1))()
        for k, (s, t, n) in enumerate(rs):
            arr[k].source, arr[k].target, arr[k].len = int(s), int(t), int(n)
        out = c_uint64(0)
        call("mws_device_engine_copy", self, int(ordinal), d, arr, len(rs), ctypes.byref(out))
        return int(out.value)

    def stats(self) -> Dict[str, int]:
        """Counters since the engine was made: batches, copies, driver_calls, bytes."""
        st = _abi.mws_device_stats()
        call("mws_device_engine_stats", self, ctypes.byref(st))
        return {"batches": st.batches, "copies": st.copies, "driver_calls": st.driver_calls, "bytes": st.bytes}

    def __repr__(self) -> str:
        return f"DeviceEngine({self.kind}{', closed' if self._h is None else ''})"


# --------------------------------------------------------------------------- CUDA

_CUDA_LOCK = threading.Lock()
_CUDA: Optional["_Cuda"] = None
_CUDA_ERROR: Optional[str] = None

_RUNTIME_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")
_DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")


class _Cuda:
    """What the tensor adapters ask of CUDA (a pointer's device, a stream's
    synchronization), through libcudart, else libcuda. Copies never go through here:
    they are the library's device engine's."""

    def __init__(self) -> None:
        errors: List[str] = []
        self.rt: Optional[ctypes.CDLL] = None
        self.drv: Optional[ctypes.CDLL] = None
        for name in _RUNTIME_NAMES + tuple(filter(None, [ctypes.util.find_library("cudart")])):
            try:
                self.rt = ctypes.CDLL(name)
                self.library = name
                break
            except OSError as e:
                errors.append(f"{name}: {e}")
        if self.rt is not None:
            rt = self.rt
            rt.cudaGetErrorString.argtypes, rt.cudaGetErrorString.restype = [c_int], ctypes.c_char_p
            rt.cudaStreamSynchronize.argtypes, rt.cudaStreamSynchronize.restype = [c_void_p], c_int
            rt.cudaPointerGetAttributes.argtypes = [c_void_p, c_void_p]
            rt.cudaPointerGetAttributes.restype = c_int
            rt.cudaGetDeviceCount.argtypes, rt.cudaGetDeviceCount.restype = [POINTER(c_int)], c_int
            # A runtime that loads is not yet a GPU: torch's pip wheels bring
            # libcudart to machines without a driver or a device.
            count = c_int(0)
            rc = rt.cudaGetDeviceCount(ctypes.byref(count))
            if rc == 0 and count.value > 0:
                return
            msg = rt.cudaGetErrorString(rc) if rc else b"no device"
            errors.append(f"{self.library}: cudaGetDeviceCount: {count.value if rc == 0 else rc} "
                          f"({msg.decode() if msg else '?'})")
            self.rt = None
        for name in _DRIVER_NAMES:
            try:
                self.drv = ctypes.CDLL(name)
                self.library = name
                break
            except OSError as e:
                errors.append(f"{name}: {e}")
        if self.drv is None:
            raise DeviceUnavailableError("no usable CUDA runtime or driver (one that loads and sees a device): "
                                         + "; ".join(errors))
        d = self.drv
        for fn, args in (("cuInit", [ctypes.c_uint]),
                         ("cuStreamSynchronize", [c_void_p]),
                         ("cuPointerGetAttribute", [c_void_p, c_int, c_uint64]),
                         ("cuDeviceGetCount", [POINTER(c_int)])):
            f = getattr(d, fn)
            f.argtypes, f.restype = args, c_int
        self._drv_check(d.cuInit(0), "cuInit")
        count = c_int(0)
        self._drv_check(d.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        if count.value < 1:
            raise DeviceUnavailableError(f"{self.library}: no CUDA device")

    # -- errors -----------------------------------------------------------------------

    def _rt_check(self, rc: int, what: str) -> None:
        if rc != 0:
            assert self.rt is not None
            msg = self.rt.cudaGetErrorString(rc)
            raise CudaError(f"{what}: CUDA error {rc} ({msg.decode() if msg else '?'})")

    def _drv_check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise CudaError(f"{what}: CUDA driver error {rc}")

    def synchronize_stream(self, stream: int) -> None:
        if self.rt is not None:
            self._rt_check(self.rt.cudaStreamSynchronize(stream or None), "cudaStreamSynchronize")
        else:
            self._drv_check(self.drv.cuStreamSynchronize(stream or None), "cuStreamSynchronize")  # type: ignore[union-attr]

    def pointer_device(self, address: int) -> int:
        if self.rt is not None:
            # cudaPointerAttributes (CUDA >= 10): type (int), device (int), ...
            attrs = (ctypes.c_int * 16)()
            self._rt_check(self.rt.cudaPointerGetAttributes(attrs, address), "cudaPointerGetAttributes")
            return int(attrs[1])
        out = c_int(0)
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
        self._drv_check(self.drv.cuPointerGetAttribute(ctypes.byref(out), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,  # type: ignore[union-attr]
                                                       address), "cuPointerGetAttribute")
        return int(out.value)


def _cuda() -> "_Cuda":
    global _CUDA, _CUDA_ERROR
    with _CUDA_LOCK:
        if _CUDA is not None:
            return _CUDA
        if _CUDA_ERROR is not None:
            raise DeviceUnavailableError(_CUDA_ERROR)
        try:
            _CUDA = _Cuda()
            return _CUDA
        except (DeviceUnavailableError, RuntimeError, AttributeError, OSError) as e:
            _CUDA_ERROR = (f"CUDA device memory needs the CUDA runtime (libcudart) or driver (libcuda), and "
                           f"neither is usable here: {e}")
            raise DeviceUnavailableError(_CUDA_ERROR) from None


def cuda_available() -> bool:
    """True when the CUDA runtime or driver loads and sees at least one device."""
    try:
        _cuda()
        return True
    except DeviceUnavailableError:
        return False


def cuda_pointer_device(address: int) -> int:
    """The CUDA device ordinal of device pointer ``address``
    (:class:`DeviceUnavailableError` without CUDA)."""
    return _cuda().pointer_device(address)


def cuda_synchronize_stream(stream: int) -> None:
    """Waits for CUDA stream ``stream`` (``__cuda_array_interface__`` v3 ``stream``)."""
    _cuda().synchronize_stream(stream)
