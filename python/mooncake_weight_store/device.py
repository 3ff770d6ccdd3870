"""Device memory: copy hooks for the embedded stores, and a CUDA one through the
CUDA runtime (or driver) loaded with ctypes.

The embedded stores (memory, directory) cannot touch device memory themselves; a
store opened with a copy hook (``Store.memory(copy_hook=...)``,
``Store.directory(path, copy_hook=...)``) moves device bytes through it
(``mws_copy_hook_vtable``). A store without one refuses device fragments with
:class:`~mooncake_weight_store.errors.UnsupportedError` before any I/O.

* :class:`CopyHook`: subclass and implement :meth:`CopyHook.device_to_host` and
  :meth:`CopyHook.host_to_device` (addresses are integers). Exceptions are contained:
  the copy fails and the library call reports ``MWS_STORE``; the exception text is in
  :attr:`CopyHook.errors`. Callbacks must be thread-safe.
* :func:`cuda_copy_hook`: a :class:`CudaCopyHook` over ``cudaMemcpy`` (``libcudart``),
  or ``cuMemcpyDtoH``/``cuMemcpyHtoD`` (``libcuda``, primary context) when only the
  driver is present; :class:`DeviceUnavailableError` when neither loads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import threading
from ctypes import POINTER, c_int, c_uint64, c_void_p
from typing import Any, Dict, List, Optional

from .errors import ArgumentError
from . import _abi
from . import errors as _errors

__all__ = [
    "CopyHook",
    "CudaCopyHook",
    "DeviceUnavailableError",
    "cuda_copy_hook",
    "cuda_available",
    "cuda_pointer_device",
    "cuda_synchronize_stream",
]

class DeviceUnavailableError(_errors.LocalError, RuntimeError):
    """Device memory was given but no way to reach it exists (no CUDA runtime);
    status ``UNSUPPORTED``."""

    default_status = _errors.Status.UNSUPPORTED


class CudaError(_errors.LocalError, RuntimeError):
    """A CUDA runtime or driver call failed (status ``IO``; also a ``RuntimeError``)."""

    default_status = _errors.Status.IO


class CopyHook:
    """Device <-> host copies for the embedded stores. Subclass it.

    ``device_to_host(src_address, device_ordinal, dst_address, nbytes)`` copies device
    bytes into host memory; ``host_to_device(src_address, nbytes, dst_address,
    device_ordinal)`` the other way. Both must be thread-safe and raise on failure.
    """

    MAX_ERRORS = 64

    def __init__(self) -> None:
        self.errors: List[str] = []
        self.calls: Dict[str, int] = {"device_to_host": 0, "host_to_device": 0}
        self._lock = threading.Lock()

    def device_to_host(self, src_address: int, device_ordinal: int, dst_address: int, nbytes: int) -> None:
        raise NotImplementedError

    def host_to_device(self, src_address: int, nbytes: int, dst_address: int, device_ordinal: int) -> None:
        raise NotImplementedError

    # -- bridge ---------------------------------------------------------------------

    def _fail(self, op: str, e: BaseException) -> int:
        with self._lock:
            if len(self.errors) < self.MAX_ERRORS:
                self.errors.append(f"{op}: {type(e).__name__}: {e}")
        return -1

    def _d2h(self, ctx, src, ordinal, dst, n):  # type: ignore[no-untyped-def]
        try:
            with self._lock:
                self.calls["device_to_host"] += 1
            self.device_to_host(int(src), int(ordinal), int(dst or 0), int(n))
            return 0
        except BaseException as e:  # noqa: BLE001 - never unwind into C
            return self._fail("device_to_host", e)

    def _h2d(self, ctx, src, n, dst, ordinal):  # type: ignore[no-untyped-def]
        try:
            with self._lock:
                self.calls["host_to_device"] += 1
            self.host_to_device(int(src or 0), int(n), int(dst), int(ordinal))
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail("host_to_device", e)


# Hook bridges stay alive until the library calls `destroy` (the store owns the ctx).
_HOOKS: Dict[int, "_HookBridge"] = {}
_HOOKS_LOCK = threading.Lock()
_HOOK_GRAVEYARD: List["_HookBridge"] = []
_HOOK_IDS = itertools.count(1)


class _HookBridge:
    def __init__(self, hook: CopyHook) -> None:
        if not isinstance(hook, CopyHook):
            raise ArgumentError(f"copy_hook must be a CopyHook, not {type(hook).__name__}")
        self.hook = hook
        self.ctx_id = next(_HOOK_IDS)
        self.vtable = _abi.mws_copy_hook_vtable(
            size=ctypes.sizeof(_abi.mws_copy_hook_vtable),
            version=_abi.MWS_COPY_HOOK_VTABLE_VERSION,
            device_to_host=_abi.D2H_FN(hook._d2h),
            host_to_device=_abi.H2D_FN(hook._h2d),
            destroy=_abi.DESTROY_FN(self._destroy),
        )
        self.destroyed = threading.Event()

    def _destroy(self, ctx):  # type: ignore[no-untyped-def]
        self.destroyed.set()
        with _HOOKS_LOCK:  # the running thunk must outlive this call: bury, free later
            _HOOKS.pop(self.ctx_id, None)
            _HOOK_GRAVEYARD.append(self)


def _bury_hooks() -> None:
    with _HOOKS_LOCK:
        _HOOK_GRAVEYARD.clear()


def attach_copy_hook(options: Any, hook: CopyHook) -> _HookBridge:
    """Fills ``options.copy_hook``/``copy_hook_ctx`` (a ``mws_store_options``) with a
    bridge to ``hook``; the bridge lives until the store destroys it. Call
    :func:`detach_failed` if the store could not be opened."""
    _bury_hooks()
    bridge = _HookBridge(hook)
    with _HOOKS_LOCK:
        _HOOKS[bridge.ctx_id] = bridge
    options.copy_hook = ctypes.addressof(bridge.vtable)
    options.copy_hook_ctx = bridge.ctx_id
    return bridge


def detach_failed(bridge: _HookBridge) -> None:
    """Forgets a bridge whose store was never opened (the library did not take it)."""
    with _HOOKS_LOCK:
        _HOOKS.pop(bridge.ctx_id, None)


# --------------------------------------------------------------------------- CUDA

_CUDA_LOCK = threading.Lock()
_CUDA: Optional["_Cuda"] = None
_CUDA_ERROR: Optional[str] = None

_RUNTIME_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")
_DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")


class _Cuda:
    """cudaMemcpy through libcudart, else cuMemcpy through libcuda (primary context)."""

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
            rt.cudaSetDevice.argtypes, rt.cudaSetDevice.restype = [c_int], c_int
            rt.cudaGetDevice.argtypes, rt.cudaGetDevice.restype = [POINTER(c_int)], c_int
            rt.cudaMemcpy.argtypes, rt.cudaMemcpy.restype = [c_void_p, c_void_p, ctypes.c_size_t, c_int], c_int
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
        for fn, args in (("cuInit", [ctypes.c_uint]), ("cuDeviceGet", [POINTER(c_int), c_int]),
                         ("cuDevicePrimaryCtxRetain", [POINTER(c_void_p), c_int]),
                         ("cuCtxSetCurrent", [c_void_p]), ("cuCtxGetCurrent", [POINTER(c_void_p)]),
                         ("cuMemcpyDtoH_v2", [c_void_p, c_uint64, ctypes.c_size_t]),
                         ("cuMemcpyHtoD_v2", [c_uint64, c_void_p, ctypes.c_size_t]),
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
        self._ctx: Dict[int, int] = {}

    # -- errors -----------------------------------------------------------------------

    def _rt_check(self, rc: int, what: str) -> None:
        if rc != 0:
            assert self.rt is not None
            msg = self.rt.cudaGetErrorString(rc)
            raise CudaError(f"{what}: CUDA error {rc} ({msg.decode() if msg else '?'})")

    def _drv_check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise CudaError(f"{what}: CUDA driver error {rc}")

    def _drv_copy(self, fn: str, dst: int, src: int, n: int, ordinal: int) -> None:
        """A cuMemcpy in ``ordinal``'s primary context; the thread's context is restored."""
        assert self.drv is not None
        prev = c_void_p()
        self._drv_check(self.drv.cuCtxGetCurrent(ctypes.byref(prev)), "cuCtxGetCurrent")
        self._drv_context(ordinal)
        try:
            self._drv_check(getattr(self.drv, fn)(dst, src, n), fn)
        finally:
            self.drv.cuCtxSetCurrent(prev.value)

    def _drv_context(self, ordinal: int) -> None:
        assert self.drv is not None
        ctx = self._ctx.get(ordinal)
        if ctx is None:
            dev = c_int(0)
            self._drv_check(self.drv.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
            c = c_void_p()
            self._drv_check(self.drv.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev.value), "cuDevicePrimaryCtxRetain")
            ctx = self._ctx[ordinal] = int(c.value or 0)
        self._drv_check(self.drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    # -- copies ---------------------------------------------------------------------------

    def _rt_copy(self, dst: int, src: int, n: int, kind: int, ordinal: int, what: str) -> None:
        """cudaMemcpy on ``ordinal``; the calling thread's current device is restored."""
        assert self.rt is not None
        cur = c_int(0)
        self._rt_check(self.rt.cudaGetDevice(ctypes.byref(cur)), "cudaGetDevice")
        if cur.value != ordinal:
            self._rt_check(self.rt.cudaSetDevice(ordinal), "cudaSetDevice")
        try:
            self._rt_check(self.rt.cudaMemcpy(dst, src, n, kind), what)
        finally:
            if cur.value != ordinal:
                self.rt.cudaSetDevice(cur.value)

    def d2h(self, src: int, ordinal: int, dst: int, n: int) -> None:
        if self.rt is not None:
            self._rt_copy(dst, src, n, 2, ordinal, "cudaMemcpy(device->host)")
        else:
            self._drv_copy("cuMemcpyDtoH_v2", dst, src, n, ordinal)

    def h2d(self, src: int, n: int, dst: int, ordinal: int) -> None:
        if self.rt is not None:
            self._rt_copy(dst, src, n, 1, ordinal, "cudaMemcpy(host->device)")
        else:
            self._drv_copy("cuMemcpyHtoD_v2", dst, src, n, ordinal)

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


class CudaCopyHook(CopyHook):
    """Synchronous ``cudaMemcpy`` on the legacy default stream (or the driver's
    ``cuMemcpy*`` in the device's primary context)."""

    def __init__(self) -> None:
        super().__init__()
        self._cuda = _cuda()

    @property
    def library(self) -> str:
        return self._cuda.library

    def device_to_host(self, src_address: int, device_ordinal: int, dst_address: int, nbytes: int) -> None:
        self._cuda.d2h(src_address, device_ordinal, dst_address, nbytes)

    def host_to_device(self, src_address: int, nbytes: int, dst_address: int, device_ordinal: int) -> None:
        self._cuda.h2d(src_address, nbytes, dst_address, device_ordinal)


def cuda_copy_hook() -> CudaCopyHook:
    """A :class:`CudaCopyHook`; :class:`DeviceUnavailableError` (with what was tried)
    when no CUDA runtime or driver loads."""
    return CudaCopyHook()
