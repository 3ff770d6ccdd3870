"""Runtime bindings: one participant's live buffers for a placement."""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Dict, List, Optional, Sequence, Union

from .errors import ArgumentError
from . import _abi
from ._lib import LIB, OwnedHandle, call, cstr, u64_array
from .buffers import BufferRef
from .placement import FragmentInfo, Placement

__all__ = ["MemoryKind", "Binding"]


class MemoryKind(enum.IntEnum):
    """``mws_memory_kind``."""

    HOST = _abi.MWS_MEMORY_HOST
    DEVICE = _abi.MWS_MEMORY_DEVICE


BufferLike = Any  # an object exporting a C-contiguous buffer


class Binding(OwnedHandle):
    """A runtime binding (``mws_binding``) of one participant of ``placement``.

    Fragments are added with :meth:`add` (from a Python buffer object: ``bytearray``,
    ``numpy`` array, ``mmap``, ...) or :meth:`add_address` (a raw integer address).
    For buffers, the binding holds a buffer export until :meth:`close`, so the memory
    cannot move or be freed while the binding can be used for I/O. For raw addresses
    the caller keeps the memory valid.

    Not thread-safe for concurrent :meth:`add` calls; read-only use is thread-safe.
    """

    _FREE = "mws_binding_free"
    _WHAT = "binding"

    def __init__(
        self,
        placement: Placement,
        participant_id: str,
        *,
        instance_id: Optional[str] = None,
        lease_id: str = "lease-1",
        lease_generation: Optional[int] = None,
        worker_id: Optional[str] = None,
        endpoint: str = "localhost:0",
    ) -> None:
        super().__init__()
        self.placement = placement
        self.participant_id = participant_id
        self.instance_id = instance_id or participant_id
        self.lease_id = lease_id
        #: the lease generation: the runtime fence the owner moves with its lease (not the
        #: weight generation, which the placement carries; default: that one's value)
        self.lease_generation = placement.weight_generation if lease_generation is None else lease_generation
        self.worker_id = worker_id or participant_id
        self.endpoint = endpoint
        #: memory holds released once the binding is freed: the buffer exports of
        #: :meth:`add`, the tensor views of :meth:`_hold`
        self._refs: List[Any] = []
        self._infos: Dict[str, FragmentInfo] = {f.placement_fragment_id: f for f in placement.fragments()}
        self.buffers: Dict[str, Any] = {}  # placement_fragment_id -> buffer object (or address)
        self.addresses: Dict[str, int] = {}
        #: placement fragment id -> runtime fragment id
        self.fragment_ids: Dict[str, str] = {}
        opts = _abi.mws_binding_options(
            resource_id=cstr(placement.resource_id),
            revision=cstr(placement.revision),
            placement_id=cstr(placement.placement_id),
            placement_digest=cstr(placement.digest),
            participant_id=cstr(participant_id, "participant_id"),
            instance_id=cstr(self.instance_id, "instance_id"),
            lease_id=cstr(lease_id, "lease_id"),
            lease_generation=self.lease_generation,
        )
        out = ctypes.c_void_p()
        call("mws_binding_new", ctypes.byref(opts), ctypes.byref(out))
        self._adopt(out.value)

    def fragment_infos(self) -> List[FragmentInfo]:
        """The placement fragments of this participant."""
        return [f for f in self.placement.fragments() if f.participant_id == self.participant_id]

    def add(
        self,
        placement_fragment_id: str,
        buffer: BufferLike,
        *,
        fragment_id: Optional[str] = None,
        device: str = "cpu",
        writable: bool = True,
        **kw: Any,
    ) -> None:
        """Binds ``placement_fragment_id`` to the bytes of ``buffer`` (its whole
        C-contiguous buffer, canonical row-major layout). ``writable`` requires a
        writable buffer (needed for restore targets; pass False for a read-only source
        such as ``bytes``)."""
        ref = BufferRef(buffer, writable=writable)
        try:
            self.add_address(
                placement_fragment_id,
                ref.address,
                ref.nbytes,
                fragment_id=fragment_id,
                device=device,
                **kw,
            )
        except BaseException:
            ref.release()
            raise
        self._refs.append(ref)
        self.buffers[placement_fragment_id] = buffer

    def add_address(
        self,
        placement_fragment_id: str,
        address: int,
        nbytes: Optional[int] = None,
        *,
        fragment_id: Optional[str] = None,
        worker_id: Optional[str] = None,
        endpoint: Optional[str] = None,
        device: str = "cpu",
        itemsize: Optional[int] = None,
        local_shape: Optional[Sequence[int]] = None,
        strides_bytes: Optional[Sequence[int]] = None,
        storage_address: Optional[int] = None,
        storage_nbytes: Optional[int] = None,
        storage_offset_bytes: Optional[int] = None,
        memory_kind: Union[MemoryKind, int] = MemoryKind.HOST,
        device_ordinal: int = 0,
    ) -> None:
        """Binds ``placement_fragment_id`` to ``nbytes`` at a raw ``address``.

        Geometry defaults come from the placement fragment (shape, item size,
        canonical strides); the storage allocation defaults to the view itself.
        """
        info = self._infos.get(placement_fragment_id)
        if isinstance(address, bool) or not isinstance(address, int):
            raise ArgumentError("address must be an int")
        if address < 0 or address >= 1 << 64:
            raise ArgumentError("address must fit in an unsigned 64-bit integer")
        if nbytes is None:
            if info is None:
                raise ArgumentError(f"nbytes is required for unknown fragment {placement_fragment_id!r}")
            nbytes = info.nbytes
        shape = tuple(local_shape) if local_shape is not None else (info.local_shape if info else (nbytes,))
        isz = itemsize if itemsize is not None else (info.itemsize if info else 1)
        if strides_bytes is None:
            st: List[int] = [0] * len(shape)
            acc = isz
            for d in range(len(shape) - 1, -1, -1):
                st[d] = acc
                acc *= shape[d]
            strides_bytes = st
        if storage_address is None:
            storage_address = address - (storage_offset_bytes or 0)
        if storage_offset_bytes is None:
            storage_offset_bytes = address - storage_address
        if storage_nbytes is None:
            storage_nbytes = storage_offset_bytes + nbytes
        shape_arr = u64_array(shape, "local_shape")
        stride_arr = u64_array(strides_bytes, "strides_bytes")
        for name, v in (("nbytes", nbytes), ("itemsize", isz), ("storage_address", storage_address),
                        ("storage_nbytes", storage_nbytes), ("storage_offset_bytes", storage_offset_bytes),
                        ("memory_kind", memory_kind), ("device_ordinal", device_ordinal)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ArgumentError(f"{name} must be an int")
            if v < 0 or v >= 1 << 64:
                raise ArgumentError(f"{name} must fit in an unsigned 64-bit integer")
        if int(memory_kind) >= 1 << 32 or device_ordinal >= 1 << 32:
            raise ArgumentError("memory_kind and device_ordinal must fit in 32 bits")
        runtime_id = fragment_id or f"{self.instance_id}:{placement_fragment_id}"
        frag = _abi.mws_runtime_fragment(
            placement_fragment_id=cstr(placement_fragment_id, "placement_fragment_id"),
            fragment_id=cstr(runtime_id, "fragment_id"),
            address=address,
            nbytes=nbytes,
            worker_id=cstr(worker_id or self.worker_id, "worker_id"),
            endpoint=cstr(endpoint or self.endpoint, "endpoint"),
            device=cstr(device, "device"),
            itemsize=isz,
            local_shape=ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_uint64)),
            local_shape_len=len(shape),
            strides_bytes=ctypes.cast(stride_arr, ctypes.POINTER(ctypes.c_uint64)),
            strides_bytes_len=len(strides_bytes),
            storage_address=storage_address,
            storage_nbytes=storage_nbytes,
            storage_offset_bytes=storage_offset_bytes,
            memory_kind=int(memory_kind),
            device_ordinal=device_ordinal,
        )
        call("mws_binding_add_fragment", self, ctypes.byref(frag))
        self.addresses[placement_fragment_id] = address
        self.fragment_ids[placement_fragment_id] = runtime_id
        self.buffers.setdefault(placement_fragment_id, address)

    @property
    def fragment_count(self) -> int:
        return int(LIB.fn("mws_binding_fragment_count")(self))

    def __len__(self) -> int:
        return self.fragment_count

    def validate(self, placement: Optional[Placement] = None) -> None:
        """Checks the binding is complete and pairs with ``placement`` (default: its
        own). Raises :class:`InvalidBindingError` / :class:`InvalidArgumentError`."""
        call("mws_binding_validate", (placement or self.placement), self)

    def _hold(self, export: Any) -> None:
        """Keeps ``export`` (a :class:`~mooncake_weight_store.tensors.TensorView`, a
        :class:`BufferRef`: anything with ``release()``) until the binding is freed,
        then releases it, as the exports of :meth:`add`: a binding lent to a bound
        plan or a prepared transfer is freed only after them, so the memory its raw
        addresses name stays held while any of them can use it."""
        self._refs.append(export)

    def _after_free(self) -> None:
        """Releases the buffer exports (:meth:`close` frees the handle first)."""
        for r in self._refs:
            r.release()
        self._refs.clear()

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"{self.fragment_count} fragments"
        return f"Binding({self.participant_id!r}, {state})"
