"""Tensor sources (DLPack, array interfaces, buffer protocol), dtype names, strides,
and the device path through a copy hook. numpy is required; torch is exercised by
the test at the end (the ``torch`` fixture: skipped without torch, a failure with
MWS_REQUIRE_TORCH=1; test_torch.py has the rest)."""

from __future__ import annotations

import array
import ctypes
import gc
import mmap
import sys

import numpy as np
import pytest

import mooncake_weight_store as mws
from mooncake_weight_store import (
    Binding,
    CopyHook,
    DeviceUnavailableError,
    MemoryKind,
    NonContiguousError,
    Parallel,
    StateDictError,
    Store,
    TensorError,
    TensorView,
    UnsupportedDTypeError,
    dtype_name,
    load_state_dict,
    save_state_dict,
    tensor_view,
)
from mooncake_weight_store.tensors import DTYPES

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with the test venv
    ml_dtypes = None


# -- dtype names -------------------------------------------------------------------------


@pytest.mark.parametrize("spelling,name", [
    ("bfloat16", "bfloat16"), ("torch.bfloat16", "bfloat16"), ("bf16", "bfloat16"), ("BF16", "bfloat16"),
    ("float8_e4m3fn", "float8_e4m3fn"), ("torch.float8_e4m3fn", "float8_e4m3fn"), ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"), ("float8_e5m2fnuz", "float8_e5m2fnuz"), ("half", "float16"),
    ("torch.float", "float32"), ("<f4", "float32"), ("|b1", "bool"), ("<u8", "uint64"), ("U8", "uint8"),
    ("I64", "int64"), ("float64", "float64"), ("complex64", "complex64"), ("torch.long", "int64"),
    ("jax.numpy.bfloat16", "bfloat16"),
])
def test_dtype_spellings(spelling, name):
    assert dtype_name(spelling) == name


def test_dtype_objects_and_refusals():
    assert dtype_name(np.float16) == "float16"
    assert dtype_name(np.dtype("int8")) == "int8"
    assert dtype_name(DTYPES["bfloat16"]) == "bfloat16"
    if ml_dtypes is not None:
        assert dtype_name(ml_dtypes.bfloat16) == "bfloat16"
        assert dtype_name(np.dtype(ml_dtypes.float8_e4m3fn)) == "float8_e4m3fn"
    for bad in ("float7", ">f4", "", "object", np.dtype("O")):
        with pytest.raises(UnsupportedDTypeError):
            dtype_name(bad)
    # every table entry has a consistent item size and DLPack width
    for d in DTYPES.values():
        assert d.dlpack is None or d.dlpack[1] == 8 * d.itemsize


# -- numpy through DLPack ------------------------------------------------------------------


def test_numpy_dlpack_address_shape_dtype_and_deleter():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    before = sys.getrefcount(a)
    v = tensor_view(a)
    assert v.source == "dlpack"
    assert v.address == a.ctypes.data and v.nbytes == a.nbytes and v.shape == (2, 3, 4)
    assert v.dtype == "float32" and v.itemsize == 4 and v.strides == (48, 16, 4)
    assert v.memory_kind == MemoryKind.HOST and v.device == "cpu" and not v.readonly
    assert sys.getrefcount(a) > before  # the DLPack manager holds the array
    v.release()
    gc.collect()
    assert sys.getrefcount(a) == before  # the deleter ran exactly once
    v.release()  # idempotent
    assert not v.held


def test_numpy_views_offsets_and_contiguity():
    a = np.arange(64, dtype=np.int16).reshape(8, 8)
    with tensor_view(a[2:5]) as v:  # contiguous row slice: offset address
        assert v.address == a.ctypes.data + 2 * 16 and v.shape == (3, 8)
    with tensor_view(a[3:4, :]) as v:  # a one-row slice: contiguous, offset
        assert v.address == a.ctypes.data + 3 * 16 and v.shape == (1, 8)
    for bad in (a.T, a[:, :4], a[::2], a[:, 1]):
        with pytest.raises(NonContiguousError) as ei:
            tensor_view(bad, name="w")
        msg = str(ei.value)
        assert "tensor 'w' is not C-contiguous" in msg and "ascontiguousarray" in msg and "strides" in msg
    b = a[::2]
    with tensor_view(np.ascontiguousarray(b)) as v:
        assert v.shape == (4, 8)


def test_non_contiguous_view_with_unit_dims_is_accepted():
    a = np.zeros((1, 6), dtype=np.float32)[:, :]
    weird = np.lib.stride_tricks.as_strided(a, shape=(1, 6), strides=(1000, 4))
    with tensor_view(weird) as v:
        assert v.strides == (24, 4)


def test_read_only_sources_and_writable_targets():
    a = np.ones(4, dtype=np.float64)
    a.flags.writeable = False
    with tensor_view(a) as v:
        assert v.readonly
    with pytest.raises(TensorError, match="read-only"):
        tensor_view(a, writable=True, name="t")
    with pytest.raises(TensorError, match="read-only"):
        tensor_view(b"abcd", writable=True)


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed")
@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_ml_dtypes_names(name):
    a = np.zeros((3, 2), dtype=getattr(ml_dtypes, name))
    with tensor_view(a) as v:
        assert v.dtype == name and v.nbytes == a.nbytes and v.address == a.ctypes.data


# -- array interfaces, buffer protocol, overrides -------------------------------------------


class _ArrayInterface:
    def __init__(self, a, **override):
        self.a = a
        self.__array_interface__ = dict(a.__array_interface__, **override)


def test_array_interface_source():
    a = np.arange(6, dtype=np.uint32).reshape(2, 3)
    with tensor_view(_ArrayInterface(a)) as v:
        assert v.source == "array_interface" and v.address == a.ctypes.data and v.dtype == "uint32"
    with pytest.raises(NonContiguousError):
        tensor_view(_ArrayInterface(a.T))
    with pytest.raises(UnsupportedDTypeError, match="big-endian"):
        tensor_view(_ArrayInterface(a, typestr=">u4"))
    with pytest.raises(TensorError, match="masked"):
        tensor_view(_ArrayInterface(a, mask=a))


def test_buffer_protocol_sources():
    with tensor_view(bytearray(10)) as v:
        assert (v.source, v.dtype, v.shape) == ("buffer", "uint8", (10,))
    with tensor_view(array.array("d", [1.0, 2.0, 3.0])) as v:
        assert (v.dtype, v.shape, v.nbytes) == ("float64", (3,), 24)
    c = (ctypes.c_int32 * 5)()
    with tensor_view(c) as v:
        assert v.dtype == "int32" and v.address == ctypes.addressof(c)
    with mmap.mmap(-1, 4096) as mm:
        with tensor_view(mm) as v:
            assert v.nbytes == 4096
    mv = memoryview(bytearray(64)).cast("H")[::2]
    with pytest.raises(NonContiguousError):
        tensor_view(mv)
    with pytest.raises(TypeError, match="not a tensor"):
        tensor_view(object())


def test_dtype_override_reinterprets_equal_item_sizes():
    raw = np.zeros((2, 4), dtype=np.uint16)  # bfloat16 bits held as uint16
    with tensor_view(raw, dtype="bf16") as v:
        assert v.dtype == "bfloat16" and v.shape == (2, 4)
    with pytest.raises(TensorError, match="item size"):
        tensor_view(raw, dtype="float32")


def test_tensor_view_passthrough():
    v = tensor_view(np.zeros(3))
    assert tensor_view(v) is v
    v.release()
    with pytest.raises(TensorError, match="released"):
        tensor_view(v)


# -- device memory through a copy hook -------------------------------------------------------


class HostMemcpyHook(CopyHook):
    """A test copy hook: 'device' memory is host memory here, moved with memmove."""

    def device_to_host(self, src_address, device_ordinal, dst_address, nbytes):
        assert device_ordinal == 3
        ctypes.memmove(dst_address, src_address, nbytes)

    def host_to_device(self, src_address, nbytes, dst_address, device_ordinal):
        assert device_ordinal == 3
        ctypes.memmove(dst_address, src_address, nbytes)


def _fake_device(a: np.ndarray, writable: bool = False) -> TensorView:
    return TensorView(address=a.ctypes.data, shape=a.shape, dtype=dtype_name(a.dtype), readonly=not writable,
                      source="test", obj=a, memory_kind=MemoryKind.DEVICE, device_ordinal=3)


def test_device_tensors_go_through_the_copy_hook(tmp_path):
    hook = HostMemcpyHook()
    src = {"w": np.arange(32, dtype=np.float32).reshape(8, 4), "b": np.arange(8, dtype=np.int64)}
    for store in (Store.memory(copy_hook=hook), Store.directory(tmp_path / "d", copy_hook=hook)):
        with store:
            m = save_state_dict(store, {k: _fake_device(v) for k, v in src.items()}, resource_id="r",
                                revision="v", generation=1)
            d2h = hook.calls["device_to_host"]
            assert d2h >= 2
            tgt = {"w": np.zeros((4, 4), np.float32), "b": np.zeros(8, np.int64)}
            load_state_dict(store, m.key, into={k: _fake_device(v, True) for k, v in tgt.items()},
                            sharding={"w": 0}, parallel=Parallel(tp_rank=1, tp_size=2))
            assert hook.calls["host_to_device"] >= 2 and hook.errors == []
            assert (tgt["w"] == src["w"][4:]).all() and (tgt["b"] == src["b"]).all()
            m.close()


def test_device_tensors_without_a_copy_hook_are_refused():
    with Store.memory() as store:
        with pytest.raises(StateDictError, match="no copy hook"):
            save_state_dict(store, {"w": _fake_device(np.zeros(4))}, resource_id="r", revision="v", generation=1)
        # the library refuses too, at the binding level, before any I/O
        b = mws.PlacementBuilder("r", "v", 1)
        b.add_participant("p", mws.Rank())
        b.add_tensor(mws.TensorSpec("w", (4,), "float64", 8))
        b.shard("w")
        p = b.build()
        a = np.zeros(4)
        bd = Binding(p, "p")
        bd.add_address("p/w#0", a.ctypes.data, 32, device="cuda:0", memory_kind=MemoryKind.DEVICE)
        plan = store.plan_upload(p, [bd])
        with pytest.raises(mws.UnsupportedError, match="device"):
            store.upload(plan, p, bd)
        assert store.exists(plan.manifest_key) is False


def test_failing_copy_hook_is_contained():
    class Broken(CopyHook):
        def device_to_host(self, *a):
            raise RuntimeError("DMA engine on fire")

    hook = Broken()
    with Store.memory(copy_hook=hook) as store:
        with pytest.raises(StateDictError, match="upload failed"):
            save_state_dict(store, {"w": _fake_device(np.zeros(4))}, resource_id="r", revision="v", generation=1)
    assert hook.errors and "DMA engine on fire" in hook.errors[0]


def test_cuda_hook_available_or_refused_clearly():
    if mws.cuda_available():
        assert isinstance(mws.cuda_copy_hook(), mws.CudaCopyHook)
    else:
        with pytest.raises(DeviceUnavailableError, match="CUDA"):
            mws.cuda_copy_hook()


def test_cuda_array_interface_without_cuda_is_refused_clearly():
    if mws.cuda_available():
        pytest.skip("a CUDA runtime is present: the refusal path does not apply")

    class FakeCuda:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0x7F0000000000, False),
                                    "version": 3, "strides": None, "stream": None}

    with pytest.raises(DeviceUnavailableError, match="CUDA"):
        tensor_view(FakeCuda())


# -- torch (the torch fixture) ----------------------------------------------------------------


def test_torch_tensors_through_dlpack(torch):
    w = torch.nn.Parameter(torch.arange(32, dtype=torch.bfloat16).reshape(8, 4))  # requires grad
    with tensor_view(w) as v:
        assert v.dtype == "bfloat16" and v.shape == (8, 4) and v.address == w.data_ptr()
        assert v.source in ("dlpack", "torch")
    with pytest.raises(NonContiguousError, match="contiguous"):
        tensor_view(w.detach().t())
    if hasattr(torch, "float8_e4m3fn"):
        with tensor_view(torch.zeros(4, dtype=torch.float8_e4m3fn)) as v:
            assert v.dtype == "float8_e4m3fn"
    with Store.memory() as store:
        sd = {"w": w, "n": torch.ones(8, dtype=torch.float32)}
        m = save_state_dict(store, sd, resource_id="t", revision="v", generation=1)
        # TP2 over dim 1 of an (8, 4) tensor: rank 1 holds columns 2..4, shape (8, 2)
        into = {"w": torch.zeros(8, 2, dtype=torch.bfloat16), "n": torch.zeros(8)}
        load_state_dict(store, m.key, into=into, sharding={"w": 1}, parallel=Parallel(tp_rank=1, tp_size=2))
        assert torch.equal(into["w"], w.detach()[:, 2:].contiguous())
        assert torch.equal(into["n"], sd["n"])
        with pytest.raises(StateDictError, match="target shape"):
            load_state_dict(store, m.key, into={"w": torch.zeros(4, 4, dtype=torch.bfloat16)}, sharding={"w": 1},
                            parallel=Parallel(tp_rank=1, tp_size=2))


class _FakeCudaRuntime:
    """Stands in for libcudart (the CUDA hook's control logic, without a GPU):
    'device' pointers are host pointers; records the calls."""

    def __init__(self, fail_copy: int = 0):
        self.current, self.log, self.fail_copy = 0, [], fail_copy

    def cudaGetDevice(self, p):
        p._obj.value = self.current
        return 0

    def cudaSetDevice(self, d):
        self.log.append(("set", d))
        self.current = d
        return 0

    def cudaMemcpy(self, dst, src, n, kind):
        self.log.append(("copy", self.current, kind))
        if self.fail_copy:
            return self.fail_copy
        ctypes.memmove(dst, src, n)
        return 0

    def cudaGetErrorString(self, rc):
        return b"an illegal memory access was encountered"


def _cuda_hook_over(rt):
    from mooncake_weight_store import device as dev

    c = object.__new__(dev._Cuda)
    c.rt, c.drv, c.library = rt, None, "fake-cudart"
    hook = object.__new__(dev.CudaCopyHook)
    CopyHook.__init__(hook)
    hook._cuda = c
    return hook


def test_cuda_copy_hook_selects_the_device_and_restores_the_callers():
    rt = _FakeCudaRuntime()
    hook = _cuda_hook_over(rt)
    src = np.arange(16, dtype=np.float32)
    with Store.memory(copy_hook=hook) as store:
        m = save_state_dict(store, {"w": _fake_device(src)}, resource_id="r", revision="v", generation=1)
        dst = np.zeros(16, np.float32)
        load_state_dict(store, m.key, into={"w": _fake_device(dst, True)})
    assert (dst == src).all() and hook.errors == []
    copies = [e for e in rt.log if e[0] == "copy"]
    assert {c[2] for c in copies} == {1, 2}  # host->device and device->host kinds
    assert all(c[1] == 3 for c in copies)  # on the tensors' device
    assert rt.current == 0  # the caller's current device is back
    assert ("set", 3) in rt.log and rt.log[-1] == ("set", 0)


def test_cuda_copy_hook_errors_name_the_cuda_error():
    rt = _FakeCudaRuntime(fail_copy=700)
    hook = _cuda_hook_over(rt)
    with Store.memory(copy_hook=hook) as store:
        with pytest.raises(StateDictError, match="upload failed"):
            save_state_dict(store, {"w": _fake_device(np.zeros(4))}, resource_id="r", revision="v", generation=1)
    assert any("CUDA error 700 (an illegal memory access" in e for e in hook.errors), hook.errors
    assert rt.current == 0


class _FakeLib:
    """A ctypes library stand-in: its functions take prototypes and return ``rcs``."""

    def __init__(self, rcs, count):
        for name in ("cudaSetDevice", "cudaGetDevice", "cudaMemcpy", "cudaGetErrorString", "cudaStreamSynchronize",
                     "cudaPointerGetAttributes", "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
                     "cuCtxSetCurrent", "cuCtxGetCurrent", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2",
                     "cuStreamSynchronize", "cuPointerGetAttribute"):
            setattr(self, name, self._fn(lambda *a, _n=name: rcs.get(_n, 0)))
        self.cudaGetErrorString = self._fn(lambda rc: b"CUDA driver version is insufficient")

        def get_count(p):
            p._obj.value = count
            return rcs.get("count", 0)

        self.cudaGetDeviceCount = self.cuDeviceGetCount = self._fn(get_count)

    @staticmethod
    def _fn(f):
        def fn(*a):
            return f(*a)
        return fn


@pytest.mark.parametrize("runtime,driver,usable", [
    ((0, 2), None, "runtime"),      # a runtime that sees two devices
    ((35, 0), None, None),          # torch's pip libcudart on a machine without a driver
    ((0, 0), None, None),           # a runtime that sees no device
    ((35, 0), (0, 1), "driver"),    # an unusable runtime, a driver with a device
    (None, (0, 0), None),           # a driver without a device
    (None, (100, 0), None),         # cuDeviceGetCount fails (CUDA_ERROR_NO_DEVICE)
])
def test_a_cuda_library_counts_only_when_it_sees_a_device(monkeypatch, runtime, driver, usable):
    from mooncake_weight_store import device as dev

    def cdll(name, *a, **kw):
        if "cudart" in name and runtime is not None:
            return _FakeLib({"count": runtime[0]}, runtime[1])
        if "libcuda." in name and driver is not None:
            return _FakeLib({"count": driver[0]}, driver[1])
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(dev.ctypes, "CDLL", cdll)
    monkeypatch.setattr(dev.ctypes.util, "find_library", lambda n: None)
    monkeypatch.setattr(dev, "_CUDA", None)  # the answer is cached per process: ask afresh
    monkeypatch.setattr(dev, "_CUDA_ERROR", None)
    assert mws.cuda_available() == (usable is not None)
    if usable is None:
        with pytest.raises(DeviceUnavailableError, match="CUDA"):
            mws.cuda_copy_hook()
    else:
        c = mws.cuda_copy_hook()._cuda
        assert (c.rt is not None, c.drv is not None) == (usable == "runtime", usable == "driver")


class _LegacyDLPack:
    """A producer from before DLPack 1.0: no max_version, a legacy 'dltensor' capsule."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        if "max_version" in kw:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_legacy_dlpack_capsule_is_consumed_and_freed():
    a = np.arange(10, dtype=np.int32)
    src = _LegacyDLPack(a)
    before = sys.getrefcount(a)
    v = tensor_view(src)
    assert v.source == "dlpack" and v.address == a.ctypes.data and v.dtype == "int32" and v.shape == (10,)
    assert sys.getrefcount(a) > before
    v.release()
    gc.collect()
    assert sys.getrefcount(a) == before
