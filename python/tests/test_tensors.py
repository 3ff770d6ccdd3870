"""Tensor sources (DLPack, array interfaces, buffer protocol), dtype names, strides,
and the device path through a device engine. numpy is required; torch is exercised by
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


# -- device memory through a device engine: the fenced device (any host access crashes) -----


def _on_device(engine: mws.DeviceEngine, a: np.ndarray, writable: bool = False) -> TensorView:
    """``a``'s bytes in fresh fenced device memory, as a device tensor view."""
    address = engine.fenced_alloc(a.nbytes)
    engine.copy([(a.ctypes.data, address, a.nbytes)], "h2d")
    return TensorView(address=address, shape=a.shape, dtype=dtype_name(a.dtype), readonly=not writable,
                      source="test", obj=engine, memory_kind=MemoryKind.DEVICE, device_ordinal=0)


def _from_device(engine: mws.DeviceEngine, v: TensorView, like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    engine.copy([(v.address, out.ctypes.data, out.nbytes)], "d2h")
    return out


@pytest.mark.parametrize("kind", ["memory", "directory", "backend"])
def test_device_tensors_go_through_the_device_engine(tmp_path, kind):
    engine = mws.DeviceEngine.fenced(64 << 20)
    store = {"memory": lambda: Store.memory(device_engine=engine),
             "directory": lambda: Store.directory(tmp_path / "d", device_engine=engine),
             "backend": lambda: Store.from_backend(mws.DictBackend(), device_engine=engine)}[kind]()
    rng = np.random.default_rng(7)
    src = {"w": rng.standard_normal((64, 48)).astype(np.float32), "b": np.arange(64, dtype=np.int64)}
    with store:
        assert store.device_engine is engine
        m = save_state_dict(store, {k: _on_device(engine, v) for k, v in src.items()}, resource_id="r",
                            revision="v", weight_generation=1)
        saved = engine.stats()
        assert saved["bytes"] >= sum(v.nbytes for v in src.values()), saved
        # Resharded restore (TP rank 1 of 2, column split) into device targets, verified.
        init = {"w": np.full((64, 24), 7, np.float32), "b": np.full(64, 7, np.int64)}
        tgt = {k: _on_device(engine, v, True) for k, v in init.items()}
        load_state_dict(store, m.key, into=tgt, sharding={"w": 1}, parallel=Parallel(tp_rank=1, tp_size=2))
        assert (_from_device(engine, tgt["w"], init["w"]) == src["w"][:, 24:]).all()
        assert (_from_device(engine, tgt["b"], init["b"]) == src["b"]).all()
        st = engine.stats()
        assert st["batches"] > saved["batches"] and st["driver_calls"] > saved["driver_calls"]
        m.close()
    engine.close()


def test_a_corrupt_payload_never_reaches_device_tensors():
    engine = mws.DeviceEngine.fenced(16 << 20)
    with Store.memory(device_engine=engine) as store:
        src = np.arange(1 << 16, dtype=np.float32)
        m = save_state_dict(store, {"w": _on_device(engine, src)}, resource_id="r", revision="v", weight_generation=1)
        payload = m.object_keys[0]
        data = bytearray(store.get(payload))
        data[1000] ^= 0x40
        store.upsert(payload, bytes(data))
        before = np.full(1 << 16, 3, np.float32)
        tgt = _on_device(engine, before, True)
        with pytest.raises(mws.IntegrityError):
            load_state_dict(store, m.key, into={"w": tgt})
        assert (_from_device(engine, tgt, before) == 3).all(), "the device target is untouched"
        m.close()


def test_device_tensors_without_a_device_engine_are_refused():
    engine = mws.DeviceEngine.fenced(1 << 20)
    with Store.memory() as store:
        with pytest.raises(StateDictError, match="no device engine"):
            save_state_dict(store, {"w": _on_device(engine, np.zeros(4))}, resource_id="r", revision="v",
                            weight_generation=1)
        # the library refuses too, at the binding level, before any I/O
        b = mws.PlacementBuilder("r", "v", 1)
        b.add_participant("p", mws.Rank())
        b.add_tensor(mws.TensorSpec("w", (4,), "float64", 8))
        b.shard("w")
        p = b.build()
        bd = Binding(p, "p")
        bd.add_address("p/w#0", engine.fenced_alloc(32), 32, device="cuda:0", memory_kind=MemoryKind.DEVICE)
        plan = store.plan_upload(p, [bd])
        with pytest.raises(mws.UnsupportedError, match="device"):
            store.upload(plan, p, bd)
        assert store.exists(plan.manifest_key) is False


def test_device_engine_arguments_are_checked():
    engine = mws.DeviceEngine.fenced(1 << 20)
    with pytest.raises(mws.ArgumentError, match="direction"):
        engine.copy([], "sideways")
    a = np.zeros(16, np.uint8)
    with pytest.raises(mws.MwsError):  # a host side naming device memory
        engine.copy([(a.ctypes.data, a.ctypes.data, 16)], "h2d")
    with pytest.raises(mws.ArgumentError, match="DeviceEngine"):
        Store.memory(device_engine=object())
    engine.close()
    with pytest.raises(mws.ArgumentError, match="closed"):
        engine.fenced_alloc(8)


def test_cuda_engine_available_or_refused_clearly():
    if mws.cuda_available():
        with mws.DeviceEngine.cuda(0) as e:
            assert e.stats()["batches"] == 0
    else:
        with pytest.raises(mws.UnsupportedError, match="CUDA"):
            mws.DeviceEngine.cuda(0)


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
        m = save_state_dict(store, sd, resource_id="t", revision="v", weight_generation=1)
        # TP2 over dim 1 of an (8, 4) tensor: rank 1 holds columns 2..4, shape (8, 2)
        into = {"w": torch.zeros(8, 2, dtype=torch.bfloat16), "n": torch.zeros(8)}
        load_state_dict(store, m.key, into=into, sharding={"w": 1}, parallel=Parallel(tp_rank=1, tp_size=2))
        assert torch.equal(into["w"], w.detach()[:, 2:].contiguous())
        assert torch.equal(into["n"], sd["n"])
        with pytest.raises(StateDictError, match="target shape"):
            load_state_dict(store, m.key, into={"w": torch.zeros(4, 4, dtype=torch.bfloat16)}, sharding={"w": 1},
                            parallel=Parallel(tp_rank=1, tp_size=2))


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
            dev._cuda()
    else:
        c = dev._cuda()
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
